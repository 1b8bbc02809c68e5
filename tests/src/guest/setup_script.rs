//! What the node setup script runcmd runs does in the guest: its steps read from the script
//! in `write_files` (`step NAME` lines), which k3s role and version its k3s step selects, the
//! SMBIOS provider-ID drop-in, `tailscale up` against the simulated tailnet, and the failure
//! marker a failed step prints.

use std::collections::BTreeMap;

use super::k3s_config::Role;

/// The first word of an env assignment's value (`INSTALL_K3S_EXEC='server --foo'` → server).
fn env_value<'a>(cmd: &'a str, var: &str) -> Option<&'a str> {
    let idx = cmd.find(&format!("{var}="))?;
    let rest = &cmd[idx + var.len() + 1..];
    let rest = rest.trim_start_matches(['\'', '"']);
    rest.split(|c: char| c.is_whitespace() || c == '\'' || c == '"')
        .next()
}

/// The single-quoted arguments of a line (`data_disk 'a' 'b'` → [a, b]).
fn quoted_args(line: &str) -> Vec<&str> {
    line.split('\'').skip(1).step_by(2).collect()
}

/// One step of the node setup script, as its `step NAME` line and body say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetupStep {
    /// `data_disk 'SERIAL' 'MOUNT' 'UNIT'`: needs an NVMe disk with that serial.
    DataDisk { serial: String },
    /// Writes `kubelet-arg+: [provider-id=<prefix><SMBIOS uuid>]`.
    ProviderId { prefix: String },
    /// Downloads and runs Tailscale's installer (`url`), or enables the image's tailscaled.
    TailscaleInstall {
        url: Option<String>,
        /// `check_sha256 FILE 'HEX'`: the file and the digest its download is checked against.
        sha256: Option<(String, String)>,
    },
    /// `tailscale up` (the line is read by [`crate::tailscale::parse_runcmd`]).
    TailscaleUp,
    /// Adds the tailnet IPv4 address to `tls-san`; fails without one.
    TailscaleSan,
    /// Downloads k3s's installer from `url` and runs it with `INSTALL_K3S_EXEC`/`_VERSION`;
    /// it starts k3s and waits on the start job unless `INSTALL_K3S_SKIP_START=true`.
    K3sInstall {
        /// The download of the file the step runs with `sh`.
        url: Option<String>,
        /// As for [`SetupStep::TailscaleInstall`], of that file.
        sha256: Option<(String, String)>,
        /// A k3s binary the step downloads and installs as `/usr/local/bin/k3s` itself.
        binary: Option<K3sBinaryInstall>,
        /// `INSTALL_K3S_SKIP_DOWNLOAD=true` (or `binary`): install.sh downloads no binary and
        /// uses the one at `/usr/local/bin/k3s`, which must be there and executable.
        skip_download: bool,
        role: Option<Role>,
        version: Option<String>,
        starts: bool,
    },
    /// `restore_etcd 'SERIAL' 'DIR'`: the product's restore from a backup disk: `tar -xf` of
    /// the NVMe disk with that serial into `dir`, `sha256sum -c etcd-snapshot.sha256` there,
    /// then `k3s server --cluster-reset --cluster-reset-restore-path=DIR/etcd-snapshot`.
    EtcdRestore { serial: String, dir: String },
    /// Pre-installed: the image's `k3s --version` must be `expected`.
    K3sVersion { expected: String },
    /// Starts the unit: `systemctl enable --now k3s|k3s-agent` (waits on the start job), or
    /// the product's `start_k3s UNIT SECONDS` (starts it without waiting on the job, then
    /// polls until it is active, at most `wait`).
    K3sStart {
        role: Option<Role>,
        wait: Option<std::time::Duration>,
    },
    /// `drill_report SECONDS KIND...` (a restore drill's server, after k3s started): k3s's
    /// own `kubectl` (the admin's `/etc/rancher/k3s/k3s.yaml`) polls `/readyz` for at most
    /// `wait`, then lists each kind in all namespaces and the script prints
    /// `oxide-controller: drill: restored objects=N` to stderr (the serial console).
    DrillReport {
        wait: std::time::Duration,
        kinds: Vec<String>,
    },
    /// A step this model does not know: the guest fails it (the real one would do something
    /// the simulator cannot vouch for).
    Unknown,
}

impl SetupStep {
    /// The name the script gives the step.
    pub fn name(&self) -> &'static str {
        match self {
            SetupStep::DataDisk { .. } => "data-disk",
            SetupStep::ProviderId { .. } => "provider-id",
            SetupStep::TailscaleInstall { .. } => "tailscale-install",
            SetupStep::TailscaleUp => "tailscale-up",
            SetupStep::TailscaleSan => "tailscale-san",
            SetupStep::K3sInstall { .. } => "k3s-install",
            SetupStep::EtcdRestore { .. } => "etcd-restore",
            SetupStep::K3sVersion { .. } => "k3s-version",
            SetupStep::K3sStart { .. } => "k3s-start",
            SetupStep::DrillReport { .. } => "drill-report",
            SetupStep::Unknown => "unknown",
        }
    }
}

/// A k3s binary a `k3s-install` step installs itself: `download FILE 'URL'`, then (or not)
/// `check_sha256 FILE 'HEX'`, then `install … FILE /usr/local/bin/k3s`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct K3sBinaryInstall {
    pub url: String,
    /// The release the URL names (`…/download/<release>/k3s`, `%2B` read as `+`), if any.
    pub release: Option<String>,
    /// The check of FILE before the `install` line: (file, digest).
    pub sha256: Option<(String, String)>,
}

/// Where install.sh looks for the binary it uses with `INSTALL_K3S_SKIP_DOWNLOAD` (its
/// `BIN_DIR` default, `/usr/local/bin`).
pub const K3S_BIN_PATH: &str = "/usr/local/bin/k3s";

/// The sha256 of release `version`'s amd64 k3s binary in the simulator: a **stand-in**, the
/// sha256 of the text `k3s <version>`. The simulator holds no binaries, and no digest of a
/// real release's binary can be cited offline (tests/FIDELITY.md "k3s binary digests"). The
/// simulated GitHub's `sha256sum-amd64.txt` lists it for `k3s` (`harness::releases`).
pub fn k3s_binary_sha256(version: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(format!("k3s {version}").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The release a binary URL names: `<base>/download/<release>/k3s`.
fn release_of_binary_url(url: &str) -> Option<String> {
    let rest = url.strip_suffix("/k3s")?;
    let (_, release) = rest.rsplit_once("/download/")?;
    let release = release.replace("%2B", "+").replace("%2b", "+");
    (!release.is_empty() && !release.contains('/')).then_some(release)
}

/// The setup script `runcmd` runs: a written file (`write_files`, `#!/bin/sh`) named as the
/// first word of a runcmd entry. Its steps are its `step NAME` lines, each with the lines up
/// to the next; what a step does is read only from its own lines. runcmd lines that are not
/// such a script are not modelled: they start nothing.
pub(super) fn parse_setup(
    commands: &[String],
    files: &BTreeMap<String, Vec<u8>>,
) -> Vec<(SetupStep, Vec<String>)> {
    let Some(script) = commands.iter().find_map(|cmd| {
        let mut words = cmd.split_whitespace();
        let first = match words.next()? {
            "sh" => words.next()?,
            w => w,
        };
        let text = std::str::from_utf8(files.get(first)?).ok()?;
        text.starts_with("#!/bin/sh").then_some(text)
    }) else {
        return Vec::new();
    };
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    for line in script.lines() {
        if let Some(name) = line.strip_prefix("step ") {
            steps.push((name.trim().to_owned(), Vec::new()));
        } else if let Some((_, body)) = steps.last_mut() {
            body.push(line.to_owned());
        }
    }
    steps
        .into_iter()
        .map(|(name, body)| (read_step(&name, &body), body))
        .collect()
}

fn read_step(name: &str, body: &[String]) -> SetupStep {
    let find = |pred: &dyn Fn(&str) -> bool| body.iter().find(|l| pred(l)).map(String::as_str);
    let download = find(&|l| l.starts_with("download "))
        .and_then(|l| quoted_args(l).first().map(|u| u.to_string()));
    let sha256 = find(&|l| l.starts_with("check_sha256 ")).and_then(|l| {
        let file = l.split_whitespace().nth(1)?;
        Some((file.to_owned(), quoted_args(l).first()?.to_string()))
    });
    let systemctl_role = || {
        let words: Vec<&str> = find(&|l| l.starts_with("systemctl enable"))?
            .split_whitespace()
            .collect();
        match words.last().copied() {
            Some("k3s" | "k3s.service") => Some(Role::Server),
            Some("k3s-agent" | "k3s-agent.service") => Some(Role::Agent),
            _ => None,
        }
    };
    match name {
        "data-disk" => match find(&|l| l.starts_with("data_disk ")).map(quoted_args) {
            Some(args) if !args.is_empty() => SetupStep::DataDisk {
                serial: args[0].to_owned(),
            },
            _ => SetupStep::Unknown,
        },
        "etcd-restore" => match find(&|l| l.starts_with("restore_etcd ")).map(quoted_args) {
            Some(args) if args.len() == 2 && !args[0].is_empty() && args[1].starts_with('/') => {
                SetupStep::EtcdRestore {
                    serial: args[0].to_owned(),
                    dir: args[1].trim_end_matches('/').to_owned(),
                }
            }
            _ => SetupStep::Unknown,
        },
        "drill-report" => {
            let words: Vec<&str> = find(&|l| l.starts_with("drill_report "))
                .map(|l| l.split_whitespace().skip(1).collect())
                .unwrap_or_default();
            match words.split_first() {
                Some((secs, kinds)) if !kinds.is_empty() => match secs.parse::<u64>() {
                    Ok(secs) => SetupStep::DrillReport {
                        wait: std::time::Duration::from_secs(secs),
                        kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
                    },
                    Err(_) => SetupStep::Unknown,
                },
                _ => SetupStep::Unknown,
            }
        }
        "provider-id" => find(&|l| l.contains("product_uuid")).map_or(SetupStep::Unknown, |_| {
            let prefix = body.iter().find_map(|l| {
                let rest = &l[l.find("provider-id=")? + "provider-id=".len()..];
                Some(rest[..rest.find('%')?].to_owned())
            });
            prefix.map_or(SetupStep::Unknown, |prefix| SetupStep::ProviderId {
                prefix,
            })
        }),
        "tailscale-install" => {
            if download.is_some() {
                SetupStep::TailscaleInstall {
                    url: download,
                    sha256,
                }
            } else if find(&|l| l.trim() == "systemctl enable --now tailscaled").is_some() {
                SetupStep::TailscaleInstall {
                    url: None,
                    sha256: None,
                }
            } else {
                SetupStep::Unknown
            }
        }
        "tailscale-up" => SetupStep::TailscaleUp,
        "tailscale-san" => SetupStep::TailscaleSan,
        "k3s-install" => {
            let run = find(&|l| l.contains("INSTALL_K3S_"));
            // Each `download FILE 'URL'` and `check_sha256 FILE 'HEX'`, by line.
            let downloads: Vec<(usize, &str, String)> = body
                .iter()
                .enumerate()
                .filter_map(|(i, l)| {
                    let file = l.strip_prefix("download ")?.split_whitespace().next()?;
                    Some((i, file, quoted_args(l).first()?.to_string()))
                })
                .collect();
            let checks: Vec<(usize, &str, String)> = body
                .iter()
                .enumerate()
                .filter_map(|(i, l)| {
                    let file = l.strip_prefix("check_sha256 ")?.split_whitespace().next()?;
                    Some((i, file, quoted_args(l).first()?.to_string()))
                })
                .collect();
            // What `file` was downloaded from and checked against before line `at`.
            let fetched = |file: &str, at: usize| {
                let url = downloads
                    .iter()
                    .rfind(|(i, f, _)| *i < at && *f == file)
                    .map(|(_, _, u)| u.clone());
                let sha256 = checks
                    .iter()
                    .rfind(|(i, f, _)| *i < at && *f == file)
                    .map(|(_, f, d)| ((*f).to_owned(), d.clone()));
                (url, sha256)
            };
            let run_at = body
                .iter()
                .position(|l| l.contains("INSTALL_K3S_"))
                .unwrap_or(body.len());
            let (url, sha256) = run
                .and_then(|l| l.split_whitespace().last())
                .map_or((None, None), |file| fetched(file, run_at));
            // `install [-m MODE -o USER -g GROUP] FILE /usr/local/bin/k3s` before install.sh.
            let binary = body[..run_at].iter().enumerate().find_map(|(i, l)| {
                let words: Vec<&str> = l.split_whitespace().collect();
                if words.first() != Some(&"install") || words.last() != Some(&K3S_BIN_PATH) {
                    return None;
                }
                let file = words.get(words.len().checked_sub(2)?)?;
                let (url, sha256) = fetched(file, i);
                let url = url?;
                Some(K3sBinaryInstall {
                    release: release_of_binary_url(&url),
                    url,
                    sha256,
                })
            });
            SetupStep::K3sInstall {
                url,
                sha256,
                binary,
                skip_download: matches!(
                    run.and_then(|l| env_value(l, "INSTALL_K3S_SKIP_DOWNLOAD")),
                    Some("true" | "binary")
                ),
                role: run
                    .and_then(|l| env_value(l, "INSTALL_K3S_EXEC"))
                    .and_then(|w| match w {
                        "server" => Some(Role::Server),
                        "agent" => Some(Role::Agent),
                        _ => None,
                    }),
                version: run
                    .and_then(|l| env_value(l, "INSTALL_K3S_VERSION"))
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned),
                starts: run.and_then(|l| env_value(l, "INSTALL_K3S_SKIP_START")) != Some("true"),
            }
        }
        "k3s-version" => body
            .iter()
            .find_map(|l| {
                let rest = &l[l.find("\"$have\" = '")? + "\"$have\" = '".len()..];
                Some(rest[..rest.find('\'')?].to_owned())
            })
            .map_or(SetupStep::Unknown, |expected| SetupStep::K3sVersion {
                expected,
            }),
        "k3s-start" => match find(&|l| l.starts_with("start_k3s ")) {
            // `start_k3s 'UNIT' SECONDS`: the head's function (the stub-execution test runs it).
            Some(line) => {
                let args: Vec<&str> = line.split_whitespace().skip(1).collect();
                let role = match args.first().map(|u| u.trim_matches('\'')) {
                    Some("k3s") => Some(Role::Server),
                    Some("k3s-agent") => Some(Role::Agent),
                    _ => None,
                };
                match (role, args.get(1).and_then(|s| s.parse::<u64>().ok())) {
                    (Some(role), Some(secs)) => SetupStep::K3sStart {
                        role: Some(role),
                        wait: Some(std::time::Duration::from_secs(secs)),
                    },
                    _ => SetupStep::Unknown,
                }
            }
            None => SetupStep::K3sStart {
                role: systemctl_role(),
                wait: None,
            },
        },
        _ => SetupStep::Unknown,
    }
}

/// The k3s role the setup's last step starts, if any.
pub(super) fn setup_role(steps: &[(SetupStep, Vec<String>)]) -> Option<Role> {
    steps.iter().find_map(|(s, _)| match s {
        SetupStep::K3sInstall { role, .. } | SetupStep::K3sStart { role, .. } => *role,
        _ => None,
    })
}

/// The console line the script prints when `step` fails (stderr, which cloud-init's output
/// redirection sends to the serial console).
pub(super) fn failure_marker(step: &str, reason: &str) -> String {
    format!("oxide-controller: node-setup failed: {step}: {reason}\n")
}

/// Directory of scripts cloud-init's `scripts_per_boot` module runs on every boot (in
/// cloud-final, before `scripts_user`).
pub(super) const PER_BOOT_DIR: &str = "/var/lib/cloud/scripts/per-boot/";

/// The logger tag of a per-boot script in the user-data that prints the host key
/// fingerprints between cloud-init's markers (`ssh-keygen -l` piped into `logger -s -t TAG`),
/// if there is one. The simulator cannot run shell: the stub-execution test runs the script
/// for real; here its effect is applied on every boot.
pub(super) fn per_boot_host_key_tag(files: &BTreeMap<String, Vec<u8>>) -> Option<&'static str> {
    files.iter().find_map(|(path, content)| {
        let script = std::str::from_utf8(content).ok()?;
        let runs = path
            .strip_prefix(PER_BOOT_DIR)
            .is_some_and(|f| !f.is_empty() && !f.contains('/'));
        (runs
            && script.contains("ssh-keygen -l")
            && script.contains("-----BEGIN SSH HOST KEY FINGERPRINTS-----")
            && script.contains("logger -s -p user.info -t oxide-controller"))
        .then_some("oxide-controller")
    })
}

/// How a `tailscale up` ended.
pub(super) enum UpEnd {
    /// On the tailnet; the VM has its tailnet address.
    Joined,
    /// Exited non-zero with this reason (what the script's `fail` says).
    Failed(String),
    /// Still waiting, and will be for ever: no `--timeout`.
    Waits,
}

/// Where the product's setup script keeps the step it last started (`done` at the end); the
/// file is on the VM's disk, so later boots see it.
pub(super) const SETUP_STATE_PATH: &str = "/var/lib/oxide-controller/node-setup.state";

/// Whether the setup script's `step` writes the step's name to [`SETUP_STATE_PATH`] before
/// the step runs (and the script writes `done` after the last one).
pub(super) fn records_setup_state(files: &BTreeMap<String, Vec<u8>>) -> bool {
    let writes = format!("echo \"$1\" > {SETUP_STATE_PATH}");
    let done = format!("echo 'done' > {SETUP_STATE_PATH}");
    files.values().any(|c| {
        std::str::from_utf8(c)
            .is_ok_and(|t| t.starts_with("#!/bin/sh") && t.contains(&writes) && t.contains(&done))
    })
}

/// What the per-boot script does about a setup an earlier boot left unfinished: when
/// [`SETUP_STATE_PATH`] names a step (not `done`) and `unit` is not enabled, it prints the
/// failure marker with that step and `reason`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct UnfinishedSetupCheck {
    pub unit: String,
    pub reason: String,
}

/// The per-boot script's unfinished-setup check, if it has one (read from its lines: the
/// state file, `systemctl is-enabled --quiet UNIT`, and the marker with its reason).
pub(super) fn per_boot_setup_check(
    files: &BTreeMap<String, Vec<u8>>,
) -> Option<UnfinishedSetupCheck> {
    files.iter().find_map(|(path, content)| {
        let runs = path
            .strip_prefix(PER_BOOT_DIR)
            .is_some_and(|f| !f.is_empty() && !f.contains('/'));
        let script = std::str::from_utf8(content).ok().filter(|_| runs)?;
        if !script.contains(&format!("cat {SETUP_STATE_PATH}")) {
            return None;
        }
        let unit = script
            .split("systemctl is-enabled --quiet ")
            .nth(1)?
            .split_whitespace()
            .next()?
            .trim_end_matches(".service")
            .to_owned();
        let reason = script
            .split("node-setup failed: $state: ")
            .nth(1)?
            .split('"')
            .next()?
            .to_owned();
        Some(UnfinishedSetupCheck { unit, reason })
    })
}

/// The k3s releases the simulator's GitHub has: the product's default, the ones the tests
/// install, and the simulator's configured version (see [`k3s_release_exists`]). Any other
/// `INSTALL_K3S_VERSION` is a release that does not exist. v1.33.7+k3s3 is the first v1.33
/// release with etcd v3.5.26, the step before etcd 3.6 (k3s-io/k3s#13493; tests/FIDELITY.md
/// "etcd versions").
pub const K3S_RELEASES: [&str; 5] = [
    "v1.33.4+k3s1",
    "v1.33.1+k3s1",
    "v1.30.0+k3s1",
    "v1.33.7+k3s3",
    "v1.34.1+k3s1",
];

/// Whether install.sh finds release `version` (one of [`K3S_RELEASES`] or `configured`).
pub fn k3s_release_exists(version: &str, configured: &str) -> bool {
    version == configured || K3S_RELEASES.contains(&version)
}

/// What install.sh prints before it exits 1 for a release that does not exist: its
/// `download_hash` fetches `sha256sum-<arch>.txt` of the release with `curl -sfL` (exit 22 on
/// the 404) and `download` then calls `fatal 'Download failed'`.
pub fn missing_release_lines(version: &str) -> String {
    format!(
        "[INFO]  Using {version} as release\n[INFO]  Downloading hash https://github.com/k3s-io/k3s/releases/download/{version}/sha256sum-amd64.txt\n[ERROR]  Download failed\n"
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn files(script: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(
            "/usr/local/sbin/oxide-node-setup".to_owned(),
            script.as_bytes().to_vec(),
        )])
    }

    /// A pinned binary: the step's own download, check and `install` to /usr/local/bin/k3s,
    /// then install.sh with `INSTALL_K3S_SKIP_DOWNLOAD`; the installer is the file `sh` runs.
    #[test]
    fn a_k3s_install_step_reads_the_binary_it_installs_and_the_installer_it_runs() {
        let script = "#!/bin/sh\nstep k3s-install\ndownload /run/k 'https://r/k3s-io/k3s/releases/download/v1.33.4%2Bk3s1/k3s'\ncheck_sha256 /run/k 'ab'\ninstall -m 0755 -o root -g root /run/k /usr/local/bin/k3s\ndownload /run/i.sh 'https://mirror/install.sh'\ncheck_sha256 /run/i.sh 'cd'\nretry 3 env INSTALL_K3S_SKIP_START=true INSTALL_K3S_SKIP_DOWNLOAD=true INSTALL_K3S_EXEC='agent' sh /run/i.sh\n";
        let steps = parse_setup(
            &["/usr/local/sbin/oxide-node-setup".to_owned()],
            &files(script),
        );
        assert_eq!(
            steps[0].0,
            SetupStep::K3sInstall {
                url: Some("https://mirror/install.sh".into()),
                sha256: Some(("/run/i.sh".into(), "cd".into())),
                binary: Some(K3sBinaryInstall {
                    url: "https://r/k3s-io/k3s/releases/download/v1.33.4%2Bk3s1/k3s".into(),
                    release: Some("v1.33.4+k3s1".into()),
                    sha256: Some(("/run/k".into(), "ab".into())),
                }),
                skip_download: true,
                role: Some(Role::Agent),
                version: None,
                starts: false,
            }
        );
        // A check after the `install` line checks nothing that was installed.
        let late = script.replace(
            "check_sha256 /run/k 'ab'\ninstall -m 0755 -o root -g root /run/k /usr/local/bin/k3s\n",
            "install -m 0755 -o root -g root /run/k /usr/local/bin/k3s\ncheck_sha256 /run/k 'ab'\n",
        );
        match &parse_setup(
            &["/usr/local/sbin/oxide-node-setup".to_owned()],
            &files(&late),
        )[0]
        .0
        {
            SetupStep::K3sInstall { binary, .. } => {
                assert_eq!(binary.as_ref().and_then(|b| b.sha256.clone()), None);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            k3s_binary_sha256("v1.33.4+k3s1"),
            "bc06053404894ff2daa1e3868cf51c8510000ffdd586cc596fade52d1d0f5d18"
        );
    }

    #[test]
    fn steps_come_from_the_script_runcmd_runs_and_nothing_else() {
        let script = "#!/bin/sh\nset -eu\nstep data-disk\ndata_disk 'data-x' '/var/lib/rancher' 'k3s-agent.service'\nstep provider-id\nuuid=\"$(tr '[:upper:]' '[:lower:]' < /sys/class/dmi/id/product_uuid)\"\nprintf 'kubelet-arg+:\\n  - provider-id=oxide://%s\\n' \"$uuid\" > /x\nstep k3s-install\ndownload /run/k.sh 'https://mirror.example/k3s'\nINSTALL_K3S_VERSION='v1.33.4+k3s1' INSTALL_K3S_EXEC='agent' sh /run/k.sh\n";
        let steps = parse_setup(&["/usr/local/sbin/oxide-node-setup".into()], &files(script));
        let kinds: Vec<SetupStep> = steps.into_iter().map(|(s, _)| s).collect();
        assert_eq!(
            kinds,
            [
                SetupStep::DataDisk {
                    serial: "data-x".into()
                },
                SetupStep::ProviderId {
                    prefix: "oxide://".into()
                },
                SetupStep::K3sInstall {
                    url: Some("https://mirror.example/k3s".into()),
                    sha256: None,
                    binary: None,
                    skip_download: false,
                    role: Some(Role::Agent),
                    version: Some("v1.33.4+k3s1".into()),
                    starts: true,
                },
            ]
        );
        // A runcmd line that mentions the installer is not a script the guest runs.
        let plain = parse_setup(
            &["curl -sfL https://get.k3s.io | INSTALL_K3S_EXEC='server' sh -".into()],
            &files(script),
        );
        assert!(plain.is_empty());
        // Pre-installed: the version check and the unit.
        let pre = "#!/bin/sh\nstep k3s-version\n[ \"$have\" = 'v1.33.4+k3s1' ] || fail \"x\"\nstep k3s-start\nsystemctl enable --now k3s\n";
        let steps = parse_setup(&["/usr/local/sbin/oxide-node-setup".into()], &files(pre));
        assert_eq!(setup_role(&steps), Some(Role::Server));
        assert_eq!(
            steps[0].0,
            SetupStep::K3sVersion {
                expected: "v1.33.4+k3s1".into()
            }
        );
        assert_eq!(
            steps[1].0,
            SetupStep::K3sStart {
                role: Some(Role::Server),
                wait: None
            }
        );
        // A restore between the install and the start; a restore step without its line (or
        // with a relative directory) is a step the model does not know.
        let restore = "#!/bin/sh\nstep k3s-install\nINSTALL_K3S_SKIP_START=true INSTALL_K3S_EXEC='server' sh /run/k.sh\nstep etcd-restore\nrestore_etcd 'backup-1' '/var/lib/rancher/k3s/server/db/restore'\nstep k3s-start\nstart_k3s 'k3s' 600\nstep etcd-restore\necho restore\nstep etcd-restore\nrestore_etcd 'backup-1' 'restore'\n";
        let steps = parse_setup(
            &["/usr/local/sbin/oxide-node-setup".into()],
            &files(restore),
        );
        assert_eq!(
            steps[1].0,
            SetupStep::EtcdRestore {
                serial: "backup-1".into(),
                dir: "/var/lib/rancher/k3s/server/db/restore".into()
            }
        );
        assert_eq!(steps[1].0.name(), "etcd-restore");
        assert_eq!(steps[3].0, SetupStep::Unknown);
        assert_eq!(steps[4].0, SetupStep::Unknown);
        // A restore drill's server reports after k3s started; a report without its kinds (or
        // its wait) is a step the model does not know.
        let drill = "#!/bin/sh\nstep k3s-start\nstart_k3s 'k3s' 300\nstep drill-report\ndrill_report 300 namespaces configmaps\nstep drill-report\ndrill_report 300\nstep drill-report\ndrill_report soon namespaces\n";
        let steps = parse_setup(&["/usr/local/sbin/oxide-node-setup".into()], &files(drill));
        assert_eq!(
            steps[1].0,
            SetupStep::DrillReport {
                wait: std::time::Duration::from_secs(300),
                kinds: vec!["namespaces".into(), "configmaps".into()],
            }
        );
        assert_eq!(steps[1].0.name(), "drill-report");
        assert_eq!(steps[2].0, SetupStep::Unknown);
        assert_eq!(steps[3].0, SetupStep::Unknown);
        // The product's: install without starting, then start and poll.
        let polled = "#!/bin/sh\nstep k3s-install\ndownload /run/k.sh 'https://get.k3s.io'\nINSTALL_K3S_SKIP_START=true INSTALL_K3S_VERSION='v1.33.4+k3s1' INSTALL_K3S_EXEC='agent' sh /run/k.sh\nstep k3s-start\nstart_k3s 'k3s-agent' 30\n";
        let steps = parse_setup(&["/usr/local/sbin/oxide-node-setup".into()], &files(polled));
        assert!(matches!(
            steps[0].0,
            SetupStep::K3sInstall { starts: false, .. }
        ));
        assert_eq!(
            steps[1].0,
            SetupStep::K3sStart {
                role: Some(Role::Agent),
                wait: Some(std::time::Duration::from_secs(30))
            }
        );
    }
}
