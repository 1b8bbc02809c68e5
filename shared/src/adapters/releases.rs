//! Whether a k3s release is where the nodes' installer will fetch it: `GET` of the release's
//! hash file, `<release_url>/download/<version>/sha256sum-amd64.txt`, the first thing
//! install.sh downloads (its `download_hash`, which fails the install with "Download failed"
//! when the file is not there). Used by the upgrade pre-flight, which also compares the
//! digest the file lists for `k3s` with a pinned one (`k3s.binary_sha256`).

use std::time::Duration;

/// The hash file install.sh fetches first for `version` (amd64: the rack's architecture).
pub fn hash_url(release_url: &str, version: &str) -> String {
    format!(
        "{}/download/{version}/sha256sum-amd64.txt",
        release_url.trim_end_matches('/')
    )
}

/// The most of a hash file read: k3s's lists a few files (about 600 bytes); a mirror that
/// answers with something much larger is not serving one.
const MAX_HASH_FILE: usize = 64 * 1024;

/// The text at `url` when it answers 2xx (after redirects, as GitHub's asset links redirect);
/// else why not (`HTTP 404`, the connection's error, or a body over 64 KiB).
pub async fn hash_file(url: &str) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .user_agent(concat!("oxide-controller/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| e.to_string())?;
    let mut answer = client.get(url).send().await.map_err(|e| chain(&e))?;
    if !answer.status().is_success() {
        return Err(format!("HTTP {}", answer.status().as_u16()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| chain(&e))? {
        if body.len() + chunk.len() > MAX_HASH_FILE {
            return Err(format!(
                "more than {} KiB: not a hash file",
                MAX_HASH_FILE / 1024
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// An error with its sources, `a: b: c`.
fn chain(e: &reqwest::Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg = format!("{msg}: {s}");
        source = s.source();
    }
    msg
}
