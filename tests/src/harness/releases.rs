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
        .and_then(|(version, file)| {
            let arch = file.strip_prefix("sha256sum-")?.strip_suffix(".txt")?;
            (matches!(arch, "amd64" | "arm64")
                && crate::guest::k3s_release_exists(version, configured))
            .then_some((version, arch))
        })
        .filter(|_| matches!(*req.method(), http::Method::GET | http::Method::HEAD));
    let (status, body) = match found {
        Some((version, arch)) => (200, hash_file(version, arch)),
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

/// A release's `sha256sum-<arch>.txt` as k3s's release workflow assembles it: the air-gap
/// image tarballs' `.sha256sum` files, then the binary's (`sha256sum dist/artifacts/k3s |
/// sed 's|dist/artifacts/||'`), one `<sha256>  <file>` line each. The simulator holds none of
/// these files: the amd64 binary's digest is its stand-in
/// ([`crate::guest::k3s_binary_sha256`], the one a guest's download of it has), the others
/// the same kind of stand-in of their own names.
pub fn hash_file(version: &str, arch: &str) -> String {
    use sha2::Digest as _;
    let stand_in = |file: &str| -> String {
        sha2::Sha256::digest(format!("{file} {version}").as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let mut out = String::new();
    for ext in ["tar.gz", "tar", "tar.zst"] {
        let file = format!("k3s-airgap-images-{arch}.{ext}");
        out.push_str(&format!("{}  {file}\n", stand_in(&file)));
    }
    let binary = if arch == "amd64" {
        crate::guest::k3s_binary_sha256(version)
    } else {
        stand_in(&format!("k3s-{arch}"))
    };
    let name = if arch == "amd64" {
        "k3s".to_owned()
    } else {
        format!("k3s-{arch}")
    };
    out.push_str(&format!("{binary}  {name}\n"));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// install.sh's `download_hash` reads the line ending in ` k3s` (amd64) among the
    /// air-gap tarballs' lines; it is the digest a guest's download of the binary has.
    #[test]
    fn the_hash_file_lists_the_air_gap_tarballs_then_the_binary() {
        let text = hash_file("v1.34.1+k3s1", "amd64");
        let names: Vec<&str> = text
            .lines()
            .map(|l| l.split_once("  ").unwrap().1)
            .collect();
        assert_eq!(
            names,
            [
                "k3s-airgap-images-amd64.tar.gz",
                "k3s-airgap-images-amd64.tar",
                "k3s-airgap-images-amd64.tar.zst",
                "k3s"
            ]
        );
        let k3s = text.lines().find_map(|l| l.strip_suffix("  k3s")).unwrap();
        assert_eq!(k3s, crate::guest::k3s_binary_sha256("v1.34.1+k3s1"));
        let other = text.lines().next().unwrap().split_once("  ").unwrap().0;
        assert_ne!(other, k3s);
        assert!(hash_file("v1.34.1+k3s1", "arm64").ends_with("  k3s-arm64\n"));
    }
}
