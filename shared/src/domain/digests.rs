//! The node software the controller knows by digest (issue 34 §7, audit security M5).
//!
//! Every new VM in `k3s.install: script` mode downloads k3s's `install.sh` and runs it as
//! root. Unless the spec names an installer and its digest itself, the VM fetches a copy of
//! `install.sh` named by its k3s-io/k3s commit (the file at a commit never changes) and
//! checks it with `sha256sum -c` against the digest in this table before running it.
//!
//! Each entry says where its digest comes from. A digest enters this table only when it was
//! computed from the file's bytes; a k3s version newer than every entry covers has no known
//! installer, and a spec asking for it must give `k3s.installer_sha256` itself (the spec
//! validation refuses it otherwise, naming that field).
//!
//! install.sh installs whatever `INSTALL_K3S_VERSION` says (it downloads that release's
//! binary and `sha256sum-<arch>.txt` from `k3s.release_url`), so one installer serves every
//! release up to the newest minor it was shipped with: the one `get.k3s.io` serves is used
//! for old releases the same way.
//!
//! Tailscale's installer (`tailscale.installer_url`, run as root on every server of a
//! Tailscale cluster in `k3s.install: script` mode) is pinned the same way
//! ([`TAILSCALE_INSTALLER`], audit security-2 N12): the file at a tailscale/tailscale commit
//! and its sha256, instead of whatever `https://tailscale.com/install.sh` serves today.
//!
//! Pure: no I/O.

/// One `install.sh` the controller knows by digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownInstaller {
    /// The k3s-io/k3s commit the file is taken at.
    pub commit: &'static str,
    /// sha256 of the file (lower-case hex).
    pub sha256: &'static str,
    /// The newest k3s minor (`1.34`) this installer is used for; every older release is
    /// installed by it too.
    pub newest_minor: (u64, u64),
    /// How the digest was obtained.
    pub source: &'static str,
}

impl KnownInstaller {
    /// Where nodes download it: the file at its commit.
    pub fn url(&self) -> String {
        format!(
            "https://raw.githubusercontent.com/k3s-io/k3s/{}/install.sh",
            self.commit
        )
    }
}

/// The k3s installers the controller knows, oldest first.
pub const K3S_INSTALLERS: &[KnownInstaller] = &[KnownInstaller {
    commit: "0136cf258954a458da1404858396342724b93d24",
    sha256: "40b487f0d8ef4f5d1bf422e7bb6228cc7789c40ecc66c5ab067d396bbee9816e",
    newest_minor: (1, 34),
    source: "sha256 of k3s-io/k3s@0136cf258954a458da1404858396342724b93d24:install.sh (36,455 bytes), \
             computed from the code index's stored copy of that file; the same digest is pinned as \
             install.sh of the v1.34.8+k3s1, v1.34.9+k3s1 and v1.34.11+k3s1 tags by independent projects \
             (docs/DESIGN-NOTES.md, \"Pinned node software\")",
}];

/// Tailscale's installer the controller knows by digest: `scripts/installer.sh` of
/// tailscale/tailscale (what `https://tailscale.com/install.sh` serves), at a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownTailscaleInstaller {
    /// The tailscale/tailscale commit the file is taken at.
    pub commit: &'static str,
    /// sha256 of the file (lower-case hex).
    pub sha256: &'static str,
    /// How the digest was obtained.
    pub source: &'static str,
}

impl KnownTailscaleInstaller {
    /// Where nodes download it: the file at its commit.
    pub fn url(&self) -> String {
        format!(
            "https://raw.githubusercontent.com/tailscale/tailscale/{}/scripts/installer.sh",
            self.commit
        )
    }
}

/// The Tailscale installer nodes run unless the spec names one with its digest.
pub const TAILSCALE_INSTALLER: KnownTailscaleInstaller = KnownTailscaleInstaller {
    commit: "de9ec7ee25627e0e518f53c710a3fc3d947c86c1",
    sha256: "805e85ed6f6f81a7ea2e70d52d47e7d5290863299e5c922b2787d71aa312f22e",
    source: "sha256 of tailscale/tailscale@de9ec7ee25627e0e518f53c710a3fc3d947c86c1:scripts/installer.sh \
             (20,301 bytes; last changed by 11a6255b22a3071bb63992ee8f7fbedd6d50f4d1, whose copy has the \
             same digest), computed from the repository snapshot the fetch tool brought here",
};

/// The installer the controller knows for k3s `version`: the oldest entry whose newest minor
/// is not older than the version's. None for a version newer than every entry, or one that
/// does not parse.
pub fn k3s_installer(version: &str) -> Option<&'static KnownInstaller> {
    let minor = major_minor(version)?;
    K3S_INSTALLERS.iter().find(|k| minor <= k.newest_minor)
}

/// `(1, 34)` of `v1.34.1+k3s1` (the spec's validation checks the rest of a version).
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.strip_prefix('v')?.splitn(3, '.');
    let mut num = || -> Option<u64> {
        let p = parts.next()?;
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse().ok())
            .flatten()
    };
    let (major, minor) = (num()?, num()?);
    parts.next()?;
    Some((major, minor))
}

/// The newest minor any known installer covers, for messages.
pub fn newest_known_minor() -> (u64, u64) {
    K3S_INSTALLERS
        .iter()
        .map(|k| k.newest_minor)
        .max()
        .unwrap_or((0, 0))
}

/// The URL of install.sh at the k3s-io/k3s tag of `version` (`+` escaped): the installer a
/// spec's own `k3s.installer_sha256` is taken of when the spec names no `installer_url`.
pub fn k3s_tag_installer_url(version: &str) -> String {
    format!(
        "https://raw.githubusercontent.com/k3s-io/k3s/{}/install.sh",
        version.replace('+', "%2B")
    )
}

/// Where a node downloads the amd64 k3s binary of `version` from `release_url` (install.sh's
/// `GITHUB_URL`): install.sh's own `BIN_URL=${GITHUB_URL}/download/${VERSION_K3S}/k3s${SUFFIX}`
/// (k3s-io/k3s@0136cf25:`install.sh:535`; `SUFFIX` is empty on amd64, `:306-309`), the version as it is (`+` is a literal in a URL path, and it is
/// the path the upgrade pre-flight asks for the release's hash file).
pub fn k3s_binary_url(release_url: &str, version: &str) -> String {
    format!(
        "{}/download/{version}/k3s",
        release_url.trim_end_matches('/')
    )
}

/// A container image reference the manifests may name (`--controller-image`,
/// `--oxide-ccm-image`): not empty, no white space or control characters, and, when it names a
/// digest (`name@digest`, the way to pin an image so a re-pushed tag cannot change what runs,
/// audit security-2 N12), that digest is `sha256:` and 64 lower-case hex digits after a
/// non-empty name. `Err` says what to give.
pub fn check_image_reference(image: &str) -> Result<(), String> {
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{image:?} is not an image reference"));
    }
    let Some((name, digest)) = image.rsplit_once('@') else {
        return Ok(());
    };
    let hex = digest.strip_prefix("sha256:").unwrap_or_default();
    let ok = !name.is_empty()
        && !name.contains('@')
        && hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{image:?}: an image by digest is NAME@sha256:<64 lower-case hex digits> (the digest `crane digest` or `docker buildx imagetools inspect` prints for the image)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tailscale_installer_is_a_commit_and_a_sha256_with_a_source() {
        let t = TAILSCALE_INSTALLER;
        assert_eq!(t.commit.len(), 40, "{t:?}");
        assert!(t.commit.bytes().all(|b| b.is_ascii_hexdigit()), "{t:?}");
        assert_eq!(t.sha256.len(), 64, "{t:?}");
        assert!(
            t.sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{t:?}"
        );
        assert!(t.source.contains(t.commit), "{t:?}");
        assert_eq!(
            t.url(),
            format!(
                "https://raw.githubusercontent.com/tailscale/tailscale/{}/scripts/installer.sh",
                t.commit
            )
        );
    }

    /// Audit security-2 N12: an image by digest is taken in its one valid form, and a
    /// malformed digest is refused saying what to give.
    #[test]
    fn an_image_by_digest_needs_a_whole_sha256() {
        let d = "0123456789abcdef".repeat(4);
        for ok in [
            "ghcr.io/aifoundry-org/oxide-controller:0.1.0".to_owned(),
            format!("ghcr.io/aifoundry-org/oxide-controller@sha256:{d}"),
            format!("registry.example:5000/ccm:0.8.0@sha256:{d}"),
        ] {
            assert_eq!(check_image_reference(&ok), Ok(()), "{ok}");
        }
        for bad in [
            format!("ghcr.io/x/y@sha256:{}", &d[..63]),
            format!("ghcr.io/x/y@sha256:{}", d.to_uppercase()),
            format!("ghcr.io/x/y@sha512:{d}"),
            format!("ghcr.io/x/y@{d}"),
            format!("@sha256:{d}"),
            format!("a@b@sha256:{d}"),
        ] {
            let e = check_image_reference(&bad).expect_err(&bad);
            assert!(e.contains("NAME@sha256:<64 lower-case hex digits>"), "{e}");
        }
        for bad in ["", "a b", "a\tb"] {
            assert!(check_image_reference(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn each_known_installer_is_a_commit_and_a_sha256_with_a_source() {
        for k in K3S_INSTALLERS {
            assert_eq!(k.commit.len(), 40, "{k:?}");
            assert!(k.commit.bytes().all(|b| b.is_ascii_hexdigit()), "{k:?}");
            assert_eq!(k.sha256.len(), 64, "{k:?}");
            assert!(
                k.sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{k:?}"
            );
            assert!(k.source.contains(k.commit), "{k:?}");
            assert!(k.url().ends_with(&format!("/{}/install.sh", k.commit)));
        }
        assert!(
            K3S_INSTALLERS
                .windows(2)
                .all(|w| w[0].newest_minor < w[1].newest_minor)
        );
    }

    #[test]
    fn versions_up_to_the_newest_known_minor_have_an_installer_and_newer_ones_none() {
        for (version, known) in [
            ("v1.33.4+k3s1", true),
            ("v1.29.0+k3s1", true),
            ("v1.34.11+k3s1", true),
            ("v1.34.99-rc1+k3s2", true),
            ("v1.35.0+k3s1", false),
            ("v2.0.0+k3s1", false),
            ("latest", false),
            ("v1.34", false),
            ("v1.x.0+k3s1", false),
        ] {
            assert_eq!(k3s_installer(version).is_some(), known, "{version}");
        }
        assert_eq!(
            k3s_installer("v1.33.4+k3s1").map(|k| k.sha256),
            Some("40b487f0d8ef4f5d1bf422e7bb6228cc7789c40ecc66c5ab067d396bbee9816e")
        );
        assert_eq!(newest_known_minor(), (1, 34));
        assert_eq!(
            k3s_tag_installer_url("v1.35.0+k3s1"),
            "https://raw.githubusercontent.com/k3s-io/k3s/v1.35.0%2Bk3s1/install.sh"
        );
    }
}
