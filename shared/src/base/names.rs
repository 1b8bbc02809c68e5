//! Naming and identity: Oxide name rules, the instance/disk/floating-IP naming scheme, the
//! namespace and name of what we own in the cluster, and the
//! instance `description` tag that carries cluster, pool and spec hash.
//!
//! Everything here is pure. Nothing here talks to the rack; callers pass randomness in.

use std::fmt;

use rand::RngExt;

/// Longest Oxide name.
/// Namespace of the state (Secret, ConfigMap), the Lease, the Events and the webhook.
pub const NAMESPACE: &str = "kube-system";
/// Namespace of the reconcile CronJob and its Jobs (issue 34 §2): Pod Security `restricted`
/// enforced, and no account to run as but the reconcile one, so that whoever may create a Job
/// there gains nothing beyond it (in kube-system, any of its accounts).
pub const JOBS_NAMESPACE: &str = "oxide-controller-jobs";
/// Name of the Secret, ConfigMap, Lease and CronJob.
pub const OBJECT_NAME: &str = "oxide-controller";
/// Fixed name of the on-demand reconcile Job: a burst of triggers collapses into one run.
pub const ON_DEMAND_JOB: &str = "oxide-controller-now";
/// The reconcile Jobs' ServiceAccount (in [`JOBS_NAMESPACE`]).
pub const RECONCILE_ACCOUNT: &str = "oxide-controller-reconcile";
/// The webhook's ServiceAccount (in [`NAMESPACE`]).
pub const WEBHOOK_ACCOUNT: &str = "oxide-controller-webhook";

pub const MAX_NAME_LEN: usize = 63;
/// Length of the random suffix in instance names.
pub const SUFFIX_LEN: usize = 5;
/// Disk names prefix the instance name with `boot-`/`data-`, so instance names must leave room.
pub const MAX_INSTANCE_NAME_LEN: usize = MAX_NAME_LEN - "boot-".len();
/// Prefix of every description we write; anything else is not ours.
pub const DESCRIPTION_TAG: &str = "oxide-controller";

/// Why a string is not a valid Oxide name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} is empty")]
    Empty { what: &'static str },
    #[error("{what} {name:?} is {len} characters long; at most {max} are allowed")]
    TooLong {
        what: &'static str,
        name: String,
        len: usize,
        max: usize,
    },
    #[error(
        "{what} {name:?} must start with a lowercase letter and contain only lowercase letters, digits and '-'"
    )]
    BadCharacters { what: &'static str, name: String },
    #[error("{what} {name:?} must not end with '-'")]
    TrailingDash { what: &'static str, name: String },
    #[error("{what} {name:?} looks like a UUID, which Oxide does not accept as a name")]
    LooksLikeUuid { what: &'static str, name: String },
}

/// Checks the Oxide name rules: 1–63 chars, `[a-z]` first, then `[a-z0-9-]`, no trailing `-`,
/// not a UUID. `what` names the thing in the error ("cluster name", "pool name", ...).
pub fn validate_name(what: &'static str, name: &str) -> Result<(), NameError> {
    validate_name_max(what, name, MAX_NAME_LEN)
}

/// Like [`validate_name`] with a tighter length limit.
pub fn validate_name_max(what: &'static str, name: &str, max: usize) -> Result<(), NameError> {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err(NameError::Empty { what });
    };
    let len = name.chars().count();
    if len > max {
        return Err(NameError::TooLong {
            what,
            name: name.to_owned(),
            len,
            max,
        });
    }
    if !first.is_ascii_lowercase()
        || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(NameError::BadCharacters {
            what,
            name: name.to_owned(),
        });
    }
    if name.ends_with('-') {
        return Err(NameError::TrailingDash {
            what,
            name: name.to_owned(),
        });
    }
    if uuid::Uuid::parse_str(name).is_ok() {
        return Err(NameError::LooksLikeUuid {
            what,
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// `<cluster>-<pool>-`: every instance of a pool starts with this.
pub fn instance_prefix(cluster: &str, pool: &str) -> String {
    format!("{cluster}-{pool}-")
}

/// `<cluster>-`: every instance of the cluster starts with this.
pub fn cluster_prefix(cluster: &str) -> String {
    format!("{cluster}-")
}

/// Instance name = hostname = node name: `<cluster>-<pool>-<suffix>`.
pub fn instance_name(cluster: &str, pool: &str, suffix: &str) -> String {
    format!("{cluster}-{pool}-{suffix}")
}

/// Draws a random `[a-z0-9]{5}` suffix from the caller's RNG (the planner stays RNG-free; the
/// caller draws suffixes and hands them in).
pub fn random_suffix(rng: &mut impl rand::Rng) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..SUFFIX_LEN)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Boot disk of an instance. The distinguishing part comes first because the first 20 bytes
/// of a disk name become its NVMe serial.
pub fn boot_disk_name(instance: &str) -> String {
    format!("boot-{instance}")
}

/// Optional data disk of an instance.
pub fn data_disk_name(instance: &str) -> String {
    format!("data-{instance}")
}

/// If `disk` is named for an instance (boot or data disk), that instance's name.
pub fn disk_owner(disk: &str) -> Option<&str> {
    disk.strip_prefix("boot-")
        .or_else(|| disk.strip_prefix("data-"))
}

/// The API floating IP, found by exact name (never by prefix: the Oxide CCM creates floating
/// IPs in the same project).
pub fn api_floating_ip_name(cluster: &str) -> String {
    format!("{cluster}-apiserver")
}

/// Description of the API floating IP, written the same by bootstrap and by reconcile's repair,
/// so `bootstrap delete` recognises the address whoever created it.
pub fn api_floating_ip_description(cluster: &str) -> String {
    format!("oxide-controller cluster={cluster} Kubernetes API")
}

/// Description reconcile wrote before it used [`api_floating_ip_description`]; `bootstrap delete`
/// still recognises it (with the exact `<cluster>-apiserver` name) so those addresses are not leaked.
pub const LEGACY_RECONCILE_API_FIP_DESCRIPTION: &str = "oxide-controller API address";

/// Description of the anti-affinity groups we create.
pub const ANTI_AFFINITY_GROUP_DESCRIPTION: &str =
    "oxide-controller: spread pool members across sleds";
/// The control plane's anti-affinity group when the spec names none: `<cluster>-<pool>`, the
/// servers' name prefix (a valid name whenever their instance names are).
pub fn default_control_plane_group(cluster: &str, control_plane_pool: &str) -> String {
    format!("{cluster}-{control_plane_pool}")
}
/// Name of the VPC (and of its subnet) Oxide creates with a project.
pub const DEFAULT_VPC: &str = "default";

/// What the description of an image bootstrap uploaded starts with.
const UPLOADED_IMAGE: &str = "uploaded by oxide-controller";

/// Description of an image bootstrap uploaded for `cluster` from `source`:
/// `uploaded by oxide-controller cluster=<c> from <source>`. The cluster mark is what lets
/// `bootstrap delete --delete-images` tell its own uploads from anyone else's image.
pub fn uploaded_image_description(cluster: Option<&str>, source: &str) -> String {
    match cluster {
        Some(c) => format!("{UPLOADED_IMAGE} cluster={c} from {source}"),
        None => format!("{UPLOADED_IMAGE} from {source}"),
    }
}

/// The cluster an image was uploaded for, read back from its description.
pub fn uploaded_image_cluster(description: &str) -> Option<&str> {
    let rest = description
        .strip_prefix(UPLOADED_IMAGE)?
        .strip_prefix(" cluster=")?;
    rest.split_whitespace().next()
}

/// The tag we put in an instance's `description`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceTag {
    pub cluster: String,
    pub pool: String,
    pub spec_hash: String,
}

impl fmt::Display for InstanceTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{DESCRIPTION_TAG} cluster={} pool={} spec={}",
            self.cluster, self.pool, self.spec_hash
        )
    }
}

impl InstanceTag {
    /// Parses a description written by [`InstanceTag`]'s `Display`; `None` for anything else
    /// (an instance someone else made, or one whose description was edited).
    pub fn parse(description: &str) -> Option<InstanceTag> {
        let mut words = description.split_whitespace();
        if words.next()? != DESCRIPTION_TAG {
            return None;
        }
        let (mut cluster, mut pool, mut spec) = (None, None, None);
        for word in words {
            let (k, v) = word.split_once('=')?;
            match k {
                "cluster" => cluster = Some(v.to_owned()),
                "pool" => pool = Some(v.to_owned()),
                "spec" => spec = Some(v.to_owned()),
                _ => {}
            }
        }
        Some(InstanceTag {
            cluster: cluster?,
            pool: pool?,
            spec_hash: spec?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_pass() {
        for n in ["a", "demo", "demo-cluster-1", &"a".repeat(63)] {
            assert_eq!(validate_name("name", n), Ok(()), "{n}");
        }
    }

    #[test]
    fn invalid_names_say_why() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("Demo", "lowercase"),
            ("1demo", "lowercase letter"),
            ("demo-", "end with"),
            ("de_mo", "lowercase"),
            ("123e4567-e89b-12d3-a456-426614174000", "start with"),
            ("d23e4567-e89b-12d3-a456-426614174000", "UUID"),
        ];
        for (name, needle) in cases {
            let err = validate_name("cluster name", name)
                .expect_err(name)
                .to_string();
            assert!(err.contains(needle), "{name}: {err}");
        }
        let long = "a".repeat(64);
        assert!(matches!(
            validate_name("n", &long),
            Err(NameError::TooLong { len: 64, .. })
        ));
    }

    #[test]
    fn tag_round_trips_and_rejects_foreign_descriptions() {
        let tag = InstanceTag {
            cluster: "demo".into(),
            pool: "workers".into(),
            spec_hash: "abc123".into(),
        };
        assert_eq!(InstanceTag::parse(&tag.to_string()), Some(tag));
        assert_eq!(InstanceTag::parse("my own vm"), None);
        assert_eq!(InstanceTag::parse("oxide-controller cluster=demo"), None);
    }

    #[test]
    fn uploaded_image_marks_name_exactly_one_cluster() {
        let d = uploaded_image_description(Some("prod"), "https://x/noble.raw");
        assert_eq!(uploaded_image_cluster(&d), Some("prod"));
        assert_eq!(
            uploaded_image_cluster(&uploaded_image_description(Some("prod-2"), "f")),
            Some("prod-2")
        );
        assert_eq!(
            uploaded_image_cluster(&uploaded_image_description(None, "f")),
            None
        );
        assert_eq!(uploaded_image_cluster("Ubuntu 24.04 cluster=prod"), None);
    }

    #[test]
    fn disk_names_map_back_to_their_instance() {
        let i = instance_name("demo", "workers", "ab1c2");
        assert_eq!(disk_owner(&boot_disk_name(&i)), Some(i.as_str()));
        assert_eq!(disk_owner(&data_disk_name(&i)), Some(i.as_str()));
        assert_eq!(disk_owner("scratch"), None);
    }

    #[test]
    fn random_suffixes_are_valid_name_tails() {
        let mut rng = rand::rng();
        for _ in 0..100 {
            let s = random_suffix(&mut rng);
            assert_eq!(s.len(), SUFFIX_LEN);
            assert!(
                s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            );
        }
    }
}
