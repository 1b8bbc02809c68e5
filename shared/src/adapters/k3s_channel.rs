//! [`ReleaseChannels`] over HTTP, as system-upgrade-controller resolves a Plan's channel
//! (`pkg/upgrade/plan/plan.go` `ResolveChannel`): one `GET <base>/<channel>` that does not
//! follow redirects; the channel server (rancher/channelserver) answers `302 Found` with
//! `Location: <redirectBase><release>` (k3s's: `https://github.com/k3s-io/k3s/releases/tag/
//! v1.33.5+k3s1`), and the release is the last segment of that path. Only the channel server
//! is asked: a mirror's redirect target need not be reachable from here.

use std::time::Duration;

use futures::future::BoxFuture;

use crate::ports::channel::{ChannelError, ReleaseChannels};

/// The real channel client.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpChannels;

/// The URL asked for `channel` at `base`.
pub fn channel_url(base: &str, channel: &str) -> String {
    format!("{}/{channel}", base.trim_end_matches('/'))
}

impl ReleaseChannels for HttpChannels {
    fn latest<'a>(
        &'a self,
        base: &'a str,
        channel: &'a str,
    ) -> BoxFuture<'a, Result<String, ChannelError>> {
        Box::pin(resolve(channel_url(base, channel)))
    }
}

async fn resolve(url: String) -> Result<String, ChannelError> {
    let unreachable = |e: &dyn std::error::Error| {
        let mut message = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            message = format!("{message}: {s}");
            source = s.source();
        }
        ChannelError::Unreachable {
            url: url.clone(),
            message,
        }
    };
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(20))
        .user_agent(concat!("oxide-controller/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| unreachable(&e))?;
    let answer = client.get(&url).send().await.map_err(|e| unreachable(&e))?;
    if answer.status() != reqwest::StatusCode::FOUND {
        return Err(ChannelError::Status {
            url,
            status: answer.status().as_u16(),
        });
    }
    let location = answer
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let release = answer
        .url()
        .join(&location)
        .ok()
        .and_then(|u| {
            u.path_segments()?
                .rev()
                .find(|s| !s.is_empty())
                .map(percent_decode)
        })
        .filter(|r| !r.is_empty());
    release.ok_or(ChannelError::Location { url, location })
}

/// `%2B` → `+` and so on (Go's `url.URL.Path` is decoded; `reqwest::Url` keeps the escapes).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_in_the_release_are_decoded() {
        assert_eq!(percent_decode("v1.33.5%2Bk3s1"), "v1.33.5+k3s1");
        assert_eq!(percent_decode("v1.33.5+k3s1"), "v1.33.5+k3s1");
        assert_eq!(percent_decode("100%"), "100%");
    }

    #[test]
    fn the_channel_is_a_path_segment_below_the_base() {
        assert_eq!(
            channel_url("https://update.k3s.io/v1-release/channels/", "v1.33"),
            "https://update.k3s.io/v1-release/channels/v1.33"
        );
    }
}
