//! The simulator's stand-in for GitHub's k3s release downloads
//! (`https://github.com/k3s-io/k3s/releases`, install.sh's `GITHUB_URL`): the hash file
//! `download/<release>/sha256sum-<arch>.txt` of each release the simulated guests can install
//! ([`crate::guest::k3s_release_exists`]), 404 for any other, as GitHub answers
//! an asset of a release that does not exist. What the product's upgrade pre-flight asks
//! before the first member of a new version. Served on loopback; its base URL is
//! [`crate::harness::handle::SimHandle::release_url`].

use bytes::Bytes;

/// The path prefix of the base URL (GitHub's `/<owner>/<repo>/releases`).
pub const PREFIX: &str = "/k3s-io/k3s/releases";

/// Answers one request: `GET`/`HEAD` of a release's hash file.
pub fn handle(req: &http::Request<Bytes>, configured: &str) -> http::Response<Bytes> {
    let found = req
        .uri()
        .path()
        .strip_prefix(PREFIX)
        .and_then(|p| p.strip_prefix("/download/"))
        .and_then(|p| p.split_once('/'))
        .filter(|(version, file)| {
            matches!(*file, "sha256sum-amd64.txt" | "sha256sum-arm64.txt")
                && crate::guest::k3s_release_exists(version, configured)
        })
        .filter(|_| matches!(*req.method(), http::Method::GET | http::Method::HEAD));
    let (status, body) = match found {
        // One line per asset, `<sha256>  <file>`; the simulator holds no binaries, so the
        // digest is its stand-in for the release's binary, the one a guest's download of it
        // has ([`crate::guest::k3s_binary_sha256`]).
        Some((version, _)) => (
            200,
            format!("{}  k3s\n", crate::guest::k3s_binary_sha256(version)),
        ),
        None => (404, "Not Found".to_owned()),
    };
    http::Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(if *req.method() == http::Method::HEAD {
            Bytes::new()
        } else {
            Bytes::from(body)
        })
        .unwrap_or_default()
}
