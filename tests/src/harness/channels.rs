//! The simulator's stand-in for k3s's channel server (`https://update.k3s.io/v1-release/
//! channels`, rancher/channelserver serving k3s's channel config), on the same loopback
//! listener as [`crate::harness::releases`]. Its base URL is
//! [`crate::harness::handle::SimHandle::channel_url`]; a test moves a channel with
//! [`Channels::set`].
//!
//! What it answers, as channelserver does (tests/FIDELITY.md "k3s channel server"):
//! - `GET <base>/<channel>`: `302 Found`, `Location: <redirectBase><release>`
//!   (`Channel.ByID` → `Config.Redirect`, `http.Redirect(.., http.StatusFound)`); the
//!   redirect base is the simulator's release downloads' `tag/` (k3s's config redirects to
//!   its GitHub releases' tags);
//! - `GET <base>/<channel>` for a channel it does not have: 404 (the empty store's
//!   `validation.NotFound`);
//! - `GET <base>`: the JSON collection of rancher/apiserver (`type: collection`,
//!   `resourceType: channels`, `data`: one object per channel with `id`, `type: channel`,
//!   `links.self`, `name`, `latest`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// The path of the base URL, k3s's (`/v1-release/channels`).
pub const PREFIX: &str = "/v1-release/channels";

/// The channels and the release each names; shared by the server and the tests.
#[derive(Debug, Clone)]
pub struct Channels {
    inner: Arc<Mutex<BTreeMap<String, String>>>,
    asked: Arc<AtomicU64>,
}

impl Channels {
    /// k3s's channel names over the releases the simulator's downloads have
    /// ([`crate::guest::K3S_RELEASES`]): each `vMAJOR.MINOR` names the newest release of its
    /// minor, `latest` the newest of all, `stable` the newest of the minor below it (k3s's
    /// `stable` trails `latest`; **guess**: which minor is stable is k3s's decision, pinned in
    /// its config, not derived).
    pub fn new() -> Channels {
        let parse = |r: &str| oxide_controller::domain::spec::upgrade::K3sVersion::parse(r);
        let mut releases: Vec<_> = crate::guest::K3S_RELEASES
            .iter()
            .filter_map(|r| parse(r).map(|v| (v, (*r).to_owned())))
            .collect();
        releases.sort();
        let mut map = BTreeMap::new();
        for (v, r) in &releases {
            map.insert(format!("v{}.{}", v.major, v.minor), r.clone());
        }
        if let Some((newest, r)) = releases.last() {
            map.insert("latest".into(), r.clone());
            if let Some((_, s)) = releases
                .iter()
                .rev()
                .find(|(v, _)| (v.major, v.minor) < (newest.major, newest.minor))
            {
                map.insert("stable".into(), s.clone());
            }
        }
        Channels {
            inner: Arc::new(Mutex::new(map)),
            asked: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Points `channel` at `release` (a test moving a channel, as k3s's maintainers do when
    /// they publish one).
    pub fn set(&self, channel: &str, release: &str) {
        self.lock().insert(channel.to_owned(), release.to_owned());
    }

    /// The release `channel` names now.
    pub fn get(&self, channel: &str) -> Option<String> {
        self.lock().get(channel).cloned()
    }

    /// Requests answered so far (any path under [`PREFIX`]).
    pub fn asked(&self) -> u64 {
        self.asked.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers one request whose path starts with [`PREFIX`]; `release_url` is the
    /// simulator's release downloads (the redirect base is its `tag/`).
    pub fn handle(&self, req: &http::Request<Bytes>, release_url: &str) -> http::Response<Bytes> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let host = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1");
        let base = format!("http://{host}{PREFIX}");
        let rest = req
            .uri()
            .path()
            .strip_prefix(PREFIX)
            .unwrap_or_default()
            .trim_matches('/');
        if *req.method() != http::Method::GET {
            return json(405, &error(405, "MethodNotAllowed", "method not allowed"));
        }
        if rest.is_empty() {
            let data: Vec<serde_json::Value> = self
                .lock()
                .iter()
                .map(|(name, latest)| {
                    serde_json::json!({
                        "id": name,
                        "type": "channel",
                        "links": {"self": format!("{base}/{name}")},
                        "name": name,
                        "latest": latest,
                    })
                })
                .collect();
            return json(
                200,
                &serde_json::json!({
                    "type": "collection",
                    "links": {"self": base},
                    "actions": {},
                    "resourceType": "channels",
                    "data": data,
                }),
            );
        }
        match self.get(rest) {
            Some(release) => http::Response::builder()
                .status(302)
                .header(
                    http::header::LOCATION,
                    format!("{}/tag/{release}", release_url.trim_end_matches('/')),
                )
                .header("content-type", "text/html; charset=utf-8")
                .body(Bytes::from(format!(
                    "<a href=\"{}/tag/{release}\">Found</a>.\n\n",
                    release_url.trim_end_matches('/')
                )))
                .unwrap_or_default(),
            None => json(404, &error(404, "NotFound", rest)),
        }
    }
}

impl Default for Channels {
    fn default() -> Self {
        Channels::new()
    }
}

/// rancher/apiserver's error object.
fn error(status: u16, code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"type": "error", "status": status, "code": code, "message": message})
}

fn json(status: u16, v: &serde_json::Value) -> http::Response<Bytes> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Bytes::from(v.to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn get(c: &Channels, path: &str) -> http::Response<Bytes> {
        let req = http::Request::get(path)
            .header("host", "127.0.0.1:9")
            .body(Bytes::new())
            .unwrap();
        c.handle(&req, "http://127.0.0.1:9/k3s-io/k3s/releases")
    }

    #[test]
    fn a_channel_redirects_to_its_releases_tag_and_moves_when_set() {
        let c = Channels::new();
        let r = get(&c, "/v1-release/channels/v1.33");
        assert_eq!(r.status(), 302);
        assert_eq!(
            r.headers()["location"],
            "http://127.0.0.1:9/k3s-io/k3s/releases/tag/v1.33.7+k3s3"
        );
        c.set("v1.33", "v1.33.4+k3s1");
        let r = get(&c, "/v1-release/channels/v1.33");
        assert!(
            r.headers()["location"]
                .to_str()
                .unwrap()
                .ends_with("/tag/v1.33.4+k3s1")
        );
        assert_eq!(get(&c, "/v1-release/channels/v1.99").status(), 404);
        assert_eq!(c.asked(), 3);
    }

    #[test]
    fn the_listing_has_latest_per_channel() {
        let c = Channels::new();
        let r = get(&c, "/v1-release/channels");
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["type"], "collection");
        assert_eq!(v["resourceType"], "channels");
        let latest = |id: &str| {
            v["data"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["id"] == id)
                .map(|c| c["latest"].as_str().unwrap().to_owned())
        };
        assert_eq!(latest("latest").as_deref(), Some("v1.34.1+k3s1"));
        assert_eq!(latest("stable").as_deref(), Some("v1.33.7+k3s3"));
        assert_eq!(latest("v1.30").as_deref(), Some("v1.30.0+k3s1"));
    }
}
