//! Whether a k3s release is where the nodes' installer will fetch it: `GET` of the release's
//! hash file, `<release_url>/download/<version>/sha256sum-amd64.txt`, the first thing
//! install.sh downloads (its `download_hash`, which fails the install with "Download failed"
//! when the file is not there). Used by the upgrade pre-flight.

use std::time::Duration;

/// The hash file install.sh fetches first for `version` (amd64: the rack's architecture).
pub fn hash_url(release_url: &str, version: &str) -> String {
    format!(
        "{}/download/{version}/sha256sum-amd64.txt",
        release_url.trim_end_matches('/')
    )
}

/// `Ok` when `url` answers 2xx (after redirects, as GitHub's asset links redirect); else why
/// not (`HTTP 404`, or the connection's error).
pub async fn reachable(url: &str) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .user_agent(concat!("oxide-controller/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| e.to_string())?;
    let answer = client.get(url).send().await.map_err(|e| {
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg = format!("{msg}: {s}");
            source = s.source();
        }
        msg
    })?;
    if answer.status().is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}", answer.status().as_u16()))
    }
}
