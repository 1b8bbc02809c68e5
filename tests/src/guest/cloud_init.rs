//! cloud-init's reading of the user-data: the 32 KiB limit, the `#cloud-config` header, YAML,
//! `write_files` (shape and encodings), SSH keys from `users` and `ssh_authorized_keys`, and
//! the `runcmd` list. What the commands do is `setup_script`'s business.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

use super::k3s_config::{
    K3S_CONFIG_DROPIN_DIR, K3S_CONFIG_PATH, K3sConfig, Role, merge_k3s_config, validate_k3s_config,
};
use super::setup_script::{SetupStep, parse_setup, setup_role};
use super::yaml::{UserDataError, parse_yaml};

/// Largest user-data cloud-init accepts here (the Oxide API limit, decoded).
pub const MAX_USER_DATA: usize = 32 * 1024;

/// An SSH key cloud-init installs, with the user it is installed for (`None`: the image's
/// default user, whose name the simulator cannot know, so any user name but root matches;
/// root has these keys only behind the `disable_root` forced command).
#[derive(Clone, Debug)]
pub struct AuthorizedKey {
    /// Account the key is installed for.
    pub user: Option<String>,
    /// The key.
    pub key: russh::keys::PublicKey,
}

/// What cloud-init made of the user-data. Debug leaves file contents out.
#[derive(Clone, Default)]
pub struct UserData {
    /// The steps of the setup script runcmd runs, each with its lines, in order.
    pub setup: Vec<(SetupStep, Vec<String>)>,
    /// Role selected by the setup script's k3s step (None: no k3s step).
    pub role: Option<Role>,
    /// `INSTALL_K3S_VERSION` from the install step.
    pub install_version: Option<String>,
    /// The k3s config file, when written.
    pub k3s: Option<K3sConfig>,
    /// SSH keys from `users[].ssh_authorized_keys` and top-level `ssh_authorized_keys`.
    pub authorized_keys: Vec<AuthorizedKey>,
    /// Whether there is a default user: the image's `users: [default]` applies unless the
    /// user-data sets `users`, which then needs a `default` entry (or the legacy `user:` key).
    /// Without one, the keys meant for the default user (the instance's API keys and the
    /// top-level `ssh_authorized_keys`) go only to root, behind the `disable_root` refusal.
    pub default_user: bool,
    /// Files from `write_files` (decoded), by path.
    pub files: BTreeMap<String, Vec<u8>>,
    /// A `runcmd` step writes a k3s drop-in `kubelet-arg+: [provider-id=<prefix><uuid>]` from
    /// the SMBIOS system UUID (`/sys/class/dmi/id/product_uuid`), which Oxide sets to the
    /// instance ID. The simulator cannot run shell, so it recognises that step and applies
    /// its effect with the instance ID.
    pub smbios_provider_id_prefix: Option<String>,
    /// The `tailscale up` step (and whether a k3s SAN drop-in follows it), if any.
    pub tailscale: Option<crate::tailscale::TailscaleUp>,
    /// `bootcmd` entries (argv entries joined with spaces): run on every boot, in the init
    /// stage, before `write_files` (`cc_bootcmd.py`, `cloud.cfg.tmpl`).
    pub bootcmd: Vec<String>,
}

impl std::fmt::Debug for UserData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserData")
            .field("role", &self.role)
            .field("install_version", &self.install_version)
            .field("k3s", &self.k3s)
            .field("authorized_keys", &self.authorized_keys.len())
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field("smbios_provider_id_prefix", &self.smbios_provider_id_prefix)
            .field("tailscale", &self.tailscale)
            .field("bootcmd", &self.bootcmd)
            .finish()
    }
}

/// cloud-init's content type for user-data that is not MIME multipart, by how it begins
/// (`INCLUSION_TYPES_MAP`, cloud-init@04eacd0 `cloudinit/handlers/__init__.py:41-58`).
const INCLUSION_TYPES: [(&str, &str); 12] = [
    ("#include", "text/x-include-url"),
    ("#include-once", "text/x-include-once-url"),
    ("#!", "text/x-shellscript"),
    ("#cloud-config", "text/cloud-config"),
    ("#part-handler", "text/part-handler"),
    ("#cloud-boothook", "text/cloud-boothook"),
    ("#cloud-config-archive", "text/cloud-config-archive"),
    ("#cloud-config-jsonp", "text/cloud-config-jsonp"),
    ("## template: jinja", "text/jinja2"),
    ("text/x-shellscript-per-boot", "text/x-shellscript-per-boot"),
    (
        "text/x-shellscript-per-instance",
        "text/x-shellscript-per-instance",
    ),
    ("text/x-shellscript-per-once", "text/x-shellscript-per-once"),
];

/// The type of user-data that begins with none of the prefixes (`NOT_MULTIPART_TYPE`).
const NOT_MULTIPART: &str = "text/x-not-multipart";

/// cloud-init's `type_from_starts_with`: lower-cased, leading whitespace stripped, the longest
/// matching prefix wins (`INCLUSION_SRCH`; cloud-init@04eacd0
/// `cloudinit/handlers/__init__.py:60-63,291-300`).
fn content_type(text: &str) -> &'static str {
    let lower = text.to_lowercase();
    let lower = lower.trim_start();
    let mut prefixes = INCLUSION_TYPES;
    prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
    prefixes
        .iter()
        .find(|(prefix, _)| lower.starts_with(prefix))
        .map_or(NOT_MULTIPART, |(_, ty)| ty)
}

/// Validates and parses user-data the way cloud-init and k3s read it.
pub fn parse_user_data(bytes: &[u8]) -> Result<UserData, UserDataError> {
    if bytes.len() > MAX_USER_DATA {
        return Err(UserDataError::TooLarge(bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| UserDataError::NotUtf8)?;
    match content_type(text) {
        "text/cloud-config" => {}
        "text/x-shellscript" => return Err(UserDataError::ShellScript),
        NOT_MULTIPART => return Err(UserDataError::NoHeader),
        other => return Err(UserDataError::Unmodelled(other)),
    }
    let doc = parse_yaml(text).map_err(|(line, column)| UserDataError::Yaml { line, column })?;
    let Value::Object(map) = doc else {
        return Err(UserDataError::NotMapping);
    };

    let mut out = UserData::default();
    if let Some(files) = map.get("write_files") {
        out.files = parse_write_files(files)?;
    }
    let dropins: Vec<&Vec<u8>> = out
        .files
        .iter()
        .filter(|(path, _)| {
            path.strip_prefix(K3S_CONFIG_DROPIN_DIR)
                .is_some_and(|f| !f.contains('/') && (f.ends_with(".yaml") || f.ends_with(".yml")))
        })
        .map(|(_, content)| content)
        .collect();
    if out.files.contains_key(K3S_CONFIG_PATH) || !dropins.is_empty() {
        let mut cfg = K3sConfig::default();
        if let Some(content) = out.files.get(K3S_CONFIG_PATH) {
            merge_k3s_config(&mut cfg, content)?;
        }
        for content in dropins {
            merge_k3s_config(&mut cfg, content)?;
        }
        validate_k3s_config(&cfg)?;
        out.k3s = Some(cfg);
    }
    out.authorized_keys = parse_authorized_keys(&map)?;
    out.default_user = has_default_user(&map);
    if let Some(bootcmd) = map.get("bootcmd") {
        out.bootcmd = command_lines("bootcmd", bootcmd)?;
    }
    if let Some(runcmd) = map.get("runcmd") {
        let commands = command_lines("runcmd", runcmd)?;
        out.setup = parse_setup(&commands, &out.files);
        out.role = setup_role(&out.setup);
        for (step, lines) in &out.setup {
            match step {
                // With INSTALL_K3S_SKIP_DOWNLOAD install.sh reads no version: k3s is the
                // binary the step installed.
                SetupStep::K3sInstall {
                    version,
                    binary,
                    skip_download,
                    ..
                } => {
                    out.install_version = if *skip_download {
                        binary.as_ref().and_then(|b| b.release.clone())
                    } else {
                        version.clone()
                    };
                }
                SetupStep::ProviderId { prefix } => {
                    out.smbios_provider_id_prefix = Some(prefix.clone());
                }
                SetupStep::TailscaleUp => {
                    out.tailscale = crate::tailscale::parse_runcmd(lines, &out.files);
                }
                SetupStep::TailscaleSan => {
                    if let Some(up) = &mut out.tailscale {
                        up.san_drop_in = true;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

fn parse_write_files(value: &Value) -> Result<BTreeMap<String, Vec<u8>>, UserDataError> {
    let bad = |msg: String| UserDataError::WriteFiles(msg);
    let Value::Array(entries) = value else {
        return Err(bad("must be a list".into()));
    };
    let mut files = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let Value::Object(entry) = entry else {
            return Err(bad(format!("entry {i} is not a mapping")));
        };
        let path = match entry.get("path") {
            Some(Value::String(p)) if p.starts_with('/') => p.clone(),
            Some(Value::String(_)) => return Err(bad(format!("entry {i}: path is not absolute"))),
            Some(_) => return Err(bad(format!("entry {i}: path is not a string"))),
            None => return Err(bad(format!("entry {i}: 'path' is a required property"))),
        };
        let content = match entry.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(format!("entry {i} ({path}): content is not a string"))),
        };
        let encoding = match entry.get("encoding") {
            None | Some(Value::Null) => "text/plain".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(format!("entry {i} ({path}): encoding is not a string"))),
        };
        let data = match encoding.as_str() {
            "text/plain" => content.into_bytes(),
            "b64" | "base64" => {
                let compact: String = content.split_whitespace().collect();
                base64::engine::general_purpose::STANDARD
                    .decode(compact.as_bytes())
                    .map_err(|_| bad(format!("entry {i} ({path}): content is not valid base64")))?
            }
            "gz" | "gzip" | "gz+b64" | "gz+base64" | "gzip+b64" | "gzip+base64" => {
                return Err(bad(format!(
                    "entry {i} ({path}): gzip encoding is not supported by the simulator"
                )));
            }
            other => {
                return Err(bad(format!(
                    "entry {i} ({path}): unknown encoding '{other}'"
                )));
            }
        };
        match entry.get("permissions") {
            None | Some(Value::Null) => {}
            Some(Value::String(p))
                if !p.is_empty() && p.len() <= 5 && p.chars().all(|c| c.is_digit(8)) => {}
            Some(Value::Number(_)) => {}
            Some(_) => {
                return Err(bad(format!(
                    "entry {i} ({path}): permissions must be an octal string like '0600'"
                )));
            }
        }
        for key in ["owner"] {
            if let Some(v) = entry.get(key)
                && !v.is_string()
            {
                return Err(bad(format!("entry {i} ({path}): {key} is not a string")));
            }
        }
        for key in ["append", "defer"] {
            if let Some(v) = entry.get(key)
                && !v.is_boolean()
            {
                return Err(bad(format!("entry {i} ({path}): {key} is not a boolean")));
            }
        }
        let append = entry
            .get("append")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if append {
            files.entry(path).or_insert_with(Vec::new).extend(data);
        } else {
            files.insert(path, data);
        }
    }
    Ok(files)
}

/// Whether cloud-init ends up with a default user. The user-data's `users` replaces the
/// image's `users: [default]` (cloud-init@04eacd0 `config/cloud.cfg.tmpl:40-46`); `default`
/// names the default user in a list, a comma-separated string or a mapping, and a legacy
/// `user:` adds it (`cloudinit/distros/ug_util.py:167-240` `normalize_users_groups`, `:74-119`
/// `_normalize_users`).
fn has_default_user(map: &serde_json::Map<String, Value>) -> bool {
    let named = |s: &str| s.split(',').any(|u| u.trim() == "default");
    if map
        .get("user")
        .is_some_and(|u| !u.is_null() && u.as_str() != Some(""))
    {
        return true;
    }
    match map.get("users") {
        None => true,
        Some(Value::Array(users)) => users.iter().any(|u| match u {
            Value::String(s) => named(s),
            Value::Array(list) => list.iter().any(|v| v.as_str().is_some_and(named)),
            Value::Object(m) => m.get("name").is_none_or(|n| n.as_str() == Some("default")),
            _ => false,
        }),
        Some(Value::String(s)) => named(s),
        Some(Value::Object(m)) => m.contains_key("default"),
        Some(_) => false,
    }
}

fn parse_authorized_keys(
    map: &serde_json::Map<String, Value>,
) -> Result<Vec<AuthorizedKey>, UserDataError> {
    let mut keys = Vec::new();
    let mut add = |user: Option<String>, list: &Value, ctx: &str| -> Result<(), UserDataError> {
        let Value::Array(items) = list else {
            return Err(UserDataError::Schema(format!(
                "{ctx}: ssh_authorized_keys must be a list"
            )));
        };
        for item in items {
            let Value::String(line) = item else {
                return Err(UserDataError::Schema(format!(
                    "{ctx}: ssh_authorized_keys entries must be strings"
                )));
            };
            // sshd skips lines it cannot parse; so does the simulator.
            if let Some(key) = parse_public_key(line) {
                keys.push(AuthorizedKey {
                    user: user.clone(),
                    key,
                });
            }
        }
        Ok(())
    };
    if let Some(list) = map.get("ssh_authorized_keys") {
        add(None, list, "ssh_authorized_keys")?;
    }
    match map.get("users") {
        None | Some(Value::Null) => {}
        Some(Value::Array(users)) => {
            for user in users {
                match user {
                    Value::String(_) => {} // "default"
                    Value::Object(u) => {
                        let name = match u.get("name") {
                            Some(Value::String(n)) => n.clone(),
                            _ => {
                                return Err(UserDataError::Schema(
                                    "users: every user needs a string 'name'".into(),
                                ));
                            }
                        };
                        if let Some(list) = u.get("ssh_authorized_keys") {
                            add(Some(name), list, "users")?;
                        }
                    }
                    _ => {
                        return Err(UserDataError::Schema(
                            "users: entries must be mappings or 'default'".into(),
                        ));
                    }
                }
            }
        }
        Some(_) => return Err(UserDataError::Schema("users must be a list".into())),
    }
    Ok(keys)
}

/// Parses an OpenSSH public key line, skipping leading authorized_keys options.
pub fn parse_public_key(line: &str) -> Option<russh::keys::PublicKey> {
    let line = line.trim();
    if let Ok(key) = russh::keys::PublicKey::from_openssh(line) {
        return Some(key);
    }
    let start = line.find("ssh-").or_else(|| line.find("ecdsa-"))?;
    russh::keys::PublicKey::from_openssh(&line[start..]).ok()
}

fn command_lines(key: &str, value: &Value) -> Result<Vec<String>, UserDataError> {
    let Value::Array(items) = value else {
        return Err(UserDataError::Schema(format!("{key} must be a list")));
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Ok(s.clone()),
            Value::Array(argv) => Ok(argv
                .iter()
                .map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" ")),
            _ => Err(UserDataError::Schema(format!(
                "{key} entries must be strings or lists"
            ))),
        })
        .collect()
}

/// Whether a `bootcmd` entry runs a per-boot script the user-data writes (on a boot where
/// `write_files` already ran: the first boot's bootcmd comes before it).
pub(super) fn bootcmd_runs_per_boot(ud: &UserData) -> bool {
    ud.bootcmd.iter().any(|line| {
        ud.files
            .keys()
            .filter(|p| p.starts_with(super::setup_script::PER_BOOT_DIR))
            .any(|p| line.contains(p.as_str()))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(super) mod tests {
    use super::*;

    /// Parses `body` under a `#cloud-config` header.
    /// A setup script entry for `write_files` that installs a k3s server, v1.33.1+k3s1.
    pub(in crate::guest) const SETUP: &str = "  - path: /usr/local/sbin/oxide-node-setup\n    permissions: '0755'\n    content: |\n      #!/bin/sh\n      step k3s-install\n      download /run/oxide-controller/k3s-install.sh 'https://get.k3s.io'\n      INSTALL_K3S_VERSION='v1.33.1+k3s1' INSTALL_K3S_EXEC='server' sh /run/oxide-controller/k3s-install.sh\n";

    pub(in crate::guest) fn ud(body: &str) -> Result<UserData, UserDataError> {
        parse_user_data(format!("#cloud-config\n{body}").as_bytes())
    }

    #[test]
    fn user_data_is_classified_with_cloud_inits_prefix_table() {
        // No known prefix: cloud-init warns and ignores it.
        assert_eq!(
            parse_user_data(b"token: x\n").unwrap_err(),
            UserDataError::NoHeader
        );
        // `#!` is a script cloud-init runs, not user-data it ignores.
        assert_eq!(
            parse_user_data(b"#!/bin/sh\necho hi\n").unwrap_err(),
            UserDataError::ShellScript
        );
        assert_eq!(content_type("#!/bin/sh\n"), "text/x-shellscript");
        // Longest prefix first, case-insensitive, after leading whitespace.
        assert_eq!(
            content_type("#cloud-config-archive\n"),
            "text/cloud-config-archive"
        );
        assert_eq!(content_type("#include-once\nx"), "text/x-include-once-url");
        assert_eq!(content_type("\n  #Cloud-Config\n"), "text/cloud-config");
        assert_eq!(
            parse_user_data(b"#cloud-boothook\necho hi\n").unwrap_err(),
            UserDataError::Unmodelled("text/cloud-boothook")
        );
        let parsed = parse_user_data(b"\n#Cloud-Config\nhostname: a\n").unwrap();
        assert!(parsed.default_user);
    }

    #[test]
    fn a_users_list_without_default_leaves_no_default_user() {
        assert!(ud("hostname: a\n").unwrap().default_user);
        assert!(ud("users: [default]\n").unwrap().default_user);
        assert!(
            ud("users:\n  - default\n  - name: ubuntu\n")
                .unwrap()
                .default_user
        );
        assert!(!ud("users:\n  - name: ubuntu\n").unwrap().default_user);
        assert!(!ud("users: []\n").unwrap().default_user);
        assert!(
            ud("user: admin\nusers:\n  - name: ubuntu\n")
                .unwrap()
                .default_user
        );
    }

    #[test]
    fn user_data_over_32_kib_is_refused() {
        let big = format!("#cloud-config\n# {}\n", "x".repeat(MAX_USER_DATA));
        assert!(matches!(
            parse_user_data(big.as_bytes()),
            Err(UserDataError::TooLarge(_))
        ));
    }

    #[test]
    fn user_data_must_be_a_mapping() {
        assert_eq!(ud("- a\n- b\n").unwrap_err(), UserDataError::NotMapping);
    }

    #[test]
    fn k3s_config_is_read_from_write_files_plain_and_base64() {
        let config = "token: s3cret\ncluster-init: true\ntls-san: [10.0.0.1]\nnode-label: [\"a=b\"]\nnode-taint: [\"k=v:NoSchedule\"]\nkubelet-arg: [\"provider-id=oxide://x\"]\n";
        let b64 = base64::engine::general_purpose::STANDARD.encode(config);
        for entry in [
            format!(
                "  - path: /etc/rancher/k3s/config.yaml\n    content: |\n{}",
                config
                    .lines()
                    .map(|l| format!("      {l}\n"))
                    .collect::<String>()
            ),
            format!(
                "  - path: /etc/rancher/k3s/config.yaml\n    encoding: b64\n    content: {b64}\n"
            ),
        ] {
            let parsed = ud(&format!(
                "write_files:\n{entry}{SETUP}runcmd:\n  - [/usr/local/sbin/oxide-node-setup]\n"
            ))
            .unwrap();
            let k3s = parsed.k3s.unwrap();
            assert_eq!(k3s.token.as_deref(), Some("s3cret"));
            assert!(k3s.cluster_init);
            assert_eq!(k3s.tls_san, ["10.0.0.1"]);
            assert_eq!(parsed.role, Some(Role::Server));
            assert_eq!(parsed.install_version.as_deref(), Some("v1.33.1+k3s1"));
        }
    }

    #[test]
    fn malformed_taints_and_write_files_are_refused() {
        let err = ud("write_files:\n  - content: x\n").unwrap_err();
        assert!(matches!(err, UserDataError::WriteFiles(_)));
        let err = ud("write_files:\n  - path: /etc/rancher/k3s/config.yaml\n    content: \"node-taint: [\\\"k=v:Sometimes\\\"]\"\n").unwrap_err();
        assert!(matches!(err, UserDataError::K3sConfig { .. }));
    }
}
