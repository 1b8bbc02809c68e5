//! A Job pod's container as an OCI runtime bundle of the product's image, for `runc`: the
//! pod runner's other way to run a Job pod (`oxide-sim --run-jobs-in-bundle`), used by
//! `.ci/image.sh` to run the CronJob's pods inside the image CI builds.
//!
//! The template is the image unpacked as a bundle (`umoci unpack`: `rootfs/` and a
//! `config.json` carrying the image's user, command, environment and working directory).
//! [`container_config`] turns it into one pod's container as a kubelet would set it up from
//! the pod's spec: the container's `command`/`args`, literal `env`, `POD_NAME`, the
//! `KUBERNETES_SERVICE_HOST`/`PORT` pair, the ServiceAccount's token, CA and namespace mounted
//! read-only at `/var/run/secrets/kubernetes.io/serviceaccount`, the security context's
//! user and group, `readOnlyRootFilesystem`, `allowPrivilegeEscalation: false`
//! (`noNewPrivileges`) and `capabilities.drop: [ALL]`, and the pod's name as hostname.
//!
//! Where it differs from a kubelet, and why:
//! - host network: the simulator's API server and Oxide API listen on loopback addresses of
//!   this machine, which a network namespace of the pod's own could not reach (a kubelet's
//!   pod network reaches the `kubernetes` Service through kube-proxy instead);
//! - no `process.rlimits`: setting them needs `CAP_SYS_RESOURCE`, which CI's sandbox lacks
//!   (the same reason `.ci/image.sh` uses runc and not podman, which always sets them);
//! - no seccomp profile (`RuntimeDefault`), no cgroup limits, no `/etc/hosts`,
//!   `/etc/resolv.conf` or `/dev/termination-log` mounts: the product reads none of them.

use std::path::Path;

use serde_json::{Value, json};

/// Where a kubelet mounts the ServiceAccount's token, CA and namespace.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The container's `config.json`: the template's with the pod's container applied (see the
/// module documentation). `rootfs` is the template's root filesystem (absolute), `sa_dir` the
/// host directory holding `token`, `ca.crt` and `namespace`, `env` the variables the kubelet
/// adds (`POD_NAME`, `KUBERNETES_SERVICE_*`), which win over the container's and the image's,
/// and `volumes` the host directories of the pod's Secret and `hostPath` volumes with where
/// they are mounted and whether read-only (bind mounts; Secret volumes always are).
pub fn container_config(
    template: &Value,
    pod: &Value,
    rootfs: &Path,
    sa_dir: &Path,
    env: &[(&str, String)],
    volumes: &[(std::path::PathBuf, String, bool)],
) -> Result<Value, String> {
    let container = &pod["spec"]["containers"][0];
    let mut config = template.clone();
    if !config["process"].is_object() {
        return Err("the bundle's config.json has no process".into());
    }

    // `command` replaces the image's entrypoint and cmd, `args` its cmd. The unpacked
    // bundle has only their concatenation, so `args` without `command` cannot be applied.
    let strings = |v: &Value| -> Vec<Value> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|a| a.is_string())
            .cloned()
            .collect()
    };
    let (command, args) = (strings(&container["command"]), strings(&container["args"]));
    match (command.is_empty(), args.is_empty()) {
        (false, _) => config["process"]["args"] = Value::Array([command, args].concat()),
        (true, true) => {}
        (true, false) => {
            return Err(
                "args without command: the bundle does not tell the image's \
                        entrypoint from its cmd"
                    .into(),
            );
        }
    }
    if strings(&config["process"]["args"]).is_empty() {
        return Err("neither the container nor the image names a command".into());
    }

    let mut vars: Vec<(String, String)> = strings(&config["process"]["env"])
        .iter()
        .filter_map(|v| v.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let mut set = |k: &str, v: &str| match vars.iter_mut().find(|(n, _)| n == k) {
        Some(slot) => slot.1 = v.to_owned(),
        None => vars.push((k.to_owned(), v.to_owned())),
    };
    for e in container["env"].as_array().into_iter().flatten() {
        if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
            set(k, v);
        }
    }
    for (k, v) in env {
        set(k, v);
    }
    config["process"]["env"] = vars
        .iter()
        .map(|(k, v)| Value::String(format!("{k}={v}")))
        .collect();

    // The container's security context wins over the pod's, both over the image's user.
    let pod_sc = &pod["spec"]["securityContext"];
    let sc = &container["securityContext"];
    let pick = |field: &str| sc[field].as_u64().or_else(|| pod_sc[field].as_u64());
    if let Some(uid) = pick("runAsUser") {
        config["process"]["user"]["uid"] = json!(uid);
    }
    if let Some(gid) = pick("runAsGroup") {
        config["process"]["user"]["gid"] = json!(gid);
    }
    let non_root = sc["runAsNonRoot"]
        .as_bool()
        .or_else(|| pod_sc["runAsNonRoot"].as_bool())
        .unwrap_or(false);
    if non_root && config["process"]["user"]["uid"].as_u64().unwrap_or(0) == 0 {
        // The kubelet's CreateContainerConfigError.
        return Err("container has runAsNonRoot and image will run as root".into());
    }
    config["root"] = json!({
        "path": rootfs,
        "readonly": sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
    });
    if sc["allowPrivilegeEscalation"] == json!(false) {
        config["process"]["noNewPrivileges"] = json!(true);
    }
    let drops_all = sc["capabilities"]["drop"]
        .as_array()
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if drops_all {
        config["process"]["capabilities"] = json!({
            "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
        });
    }
    config["process"]["terminal"] = json!(false);
    if let Some(process) = config["process"].as_object_mut() {
        process.remove("rlimits");
    }
    if let Some(namespaces) = config["linux"]["namespaces"].as_array_mut() {
        namespaces.retain(|n| n["type"] != "network");
    }
    // A hostname needs a UTS namespace of the container's own (runc refuses it otherwise).
    let uts = config["linux"]["namespaces"]
        .as_array()
        .is_some_and(|n| n.iter().any(|n| n["type"] == "uts"));
    if let (true, Some(name)) = (uts, pod["metadata"]["name"].as_str()) {
        config["hostname"] = json!(name);
    }
    let mount = json!({
        "destination": SERVICE_ACCOUNT_DIR,
        "type": "bind",
        "source": sa_dir,
        "options": ["rbind", "ro"],
    });
    match config["mounts"].as_array_mut() {
        Some(mounts) => mounts.push(mount),
        None => config["mounts"] = json!([mount]),
    }
    for (source, destination, read_only) in volumes {
        let mount = json!({
            "destination": destination,
            "type": "bind",
            "source": source,
            "options": ["rbind", if *read_only { "ro" } else { "rw" }],
        });
        if let Some(mounts) = config["mounts"].as_array_mut() {
            mounts.push(mount);
        }
    }
    Ok(config)
}

/// The files of a `secret` volume as the kubelet writes them (kubernetes@v1.33.4
/// pkg/volume/secret/secret.go MakePayload): the listed `items` (every key without a list),
/// each with its item's `mode`, else the volume's `defaultMode`, else 0644; a listed key the
/// Secret lacks (or a missing Secret) fails the mount unless the volume is `optional`, which
/// leaves it out. `(relative path, bytes, mode)`; `secret` is the Secret as read (None: absent).
pub fn secret_volume_files(
    volume: &Value,
    secret: Option<&Value>,
) -> Result<Vec<(String, Vec<u8>, u32)>, String> {
    use base64::Engine as _;
    let source = &volume["secret"];
    let name = source["secretName"].as_str().unwrap_or_default();
    let optional = source["optional"].as_bool().unwrap_or(false);
    let default_mode = source["defaultMode"]
        .as_u64()
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(0o644);
    let Some(secret) = secret else {
        return if optional {
            Ok(Vec::new())
        } else {
            Err(format!("secret \"{name}\" not found"))
        };
    };
    let data = secret["data"].as_object().cloned().unwrap_or_default();
    let decode = |key: &str| -> Option<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(data.get(key)?.as_str()?)
            .ok()
    };
    let mut out = Vec::new();
    match source["items"].as_array() {
        Some(items) => {
            for item in items {
                let key = item["key"].as_str().unwrap_or_default();
                let path = item["path"].as_str().unwrap_or(key).to_owned();
                let mode = item["mode"]
                    .as_u64()
                    .and_then(|m| u32::try_from(m).ok())
                    .unwrap_or(default_mode);
                match decode(key) {
                    Some(bytes) => out.push((path, bytes, mode)),
                    None if optional => {}
                    None => return Err(format!("references non-existent secret key: {key}")),
                }
            }
        }
        None => {
            for key in data.keys() {
                if let Some(bytes) = decode(key) {
                    out.push((key.clone(), bytes, default_mode));
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> Value {
        json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": true,
                "user": {"uid": 65532, "gid": 65532},
                "args": ["/usr/local/bin/reconcile-once", "--help"],
                "env": ["PATH=/usr/local/bin:/usr/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"],
                "cwd": "/home/nonroot",
                "capabilities": {"bounding": ["CAP_KILL"], "permitted": ["CAP_KILL"]},
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            },
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "uts"}]},
        })
    }

    fn pod(container: Value) -> Value {
        json!({
            "metadata": {"name": "oxide-controller-123-abcde", "namespace": "kube-system"},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000},
                "containers": [container],
            },
        })
    }

    fn config(container: Value) -> Result<Value, String> {
        container_config(
            &template(),
            &pod(container),
            Path::new("/b/rootfs"),
            Path::new("/w/sa"),
            &[("POD_NAME", "oxide-controller-123-abcde".into())],
            &[],
        )
    }

    #[test]
    fn a_secret_volume_holds_its_items_with_their_modes_and_skips_missing_keys_only_if_optional() {
        let secret = json!({"data": {"a": "QQ==", "b": "Qg==", "c": "Qw=="}});
        let volume = |optional: bool| {
            json!({"name": "v", "secret": {"secretName": "s", "optional": optional, "defaultMode": 288,
                "items": [{"key": "a", "path": "a"}, {"key": "b", "path": "bee", "mode": 256},
                    {"key": "missing", "path": "m"}]}})
        };
        assert_eq!(
            secret_volume_files(&volume(true), Some(&secret)).unwrap(),
            vec![
                ("a".to_owned(), b"A".to_vec(), 0o440),
                ("bee".to_owned(), b"B".to_vec(), 0o400)
            ],
            "only the listed keys, never c"
        );
        assert_eq!(
            secret_volume_files(&volume(false), Some(&secret)).unwrap_err(),
            "references non-existent secret key: missing"
        );
        assert_eq!(secret_volume_files(&volume(true), None).unwrap(), vec![]);
        assert!(secret_volume_files(&volume(false), None).is_err());
        let all = json!({"secret": {"secretName": "s"}});
        assert_eq!(secret_volume_files(&all, Some(&secret)).unwrap().len(), 3);
    }

    #[test]
    fn the_pods_command_env_and_security_context_make_the_process() {
        let c = config(json!({
            "command": ["/usr/local/bin/reconcile-once"],
            "env": [
                {"name": "OXIDE_CONTROLLER_LOG_FORMAT", "value": "json"},
                {"name": "PATH", "value": "/usr/local/bin"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "securityContext": {
                "runAsUser": 65532, "readOnlyRootFilesystem": true,
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            },
        }))
        .unwrap();
        let p = &c["process"];
        assert_eq!(p["args"], json!(["/usr/local/bin/reconcile-once"]));
        assert_eq!(
            p["env"],
            json!([
                "PATH=/usr/local/bin",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                "OXIDE_CONTROLLER_LOG_FORMAT=json",
                "POD_NAME=oxide-controller-123-abcde",
            ])
        );
        // The container's runAsUser, the pod's runAsGroup.
        assert_eq!(p["user"], json!({"uid": 65532, "gid": 1000}));
        assert_eq!(p["noNewPrivileges"], true);
        assert_eq!(p["capabilities"]["bounding"], json!([]));
        assert_eq!(p["terminal"], false);
        assert!(p.get("rlimits").is_none());
        assert_eq!(p["cwd"], "/home/nonroot");
        assert_eq!(c["root"], json!({"path": "/b/rootfs", "readonly": true}));
        assert_eq!(c["hostname"], "oxide-controller-123-abcde");
        assert_eq!(
            c["linux"]["namespaces"],
            json!([{"type": "pid"}, {"type": "uts"}])
        );
        assert_eq!(
            c["mounts"][1],
            json!({"destination": SERVICE_ACCOUNT_DIR, "type": "bind", "source": "/w/sa",
                "options": ["rbind", "ro"]})
        );
    }

    #[test]
    fn command_and_args_replace_the_images_and_neither_keeps_it() {
        let c = config(json!({"command": ["/usr/local/bin/scale"], "args": ["serve"]})).unwrap();
        assert_eq!(
            c["process"]["args"],
            json!(["/usr/local/bin/scale", "serve"])
        );
        let c = config(json!({})).unwrap();
        assert_eq!(
            c["process"]["args"],
            json!(["/usr/local/bin/reconcile-once", "--help"])
        );
        assert_eq!(c["process"]["user"], json!({"uid": 1000, "gid": 1000}));
        assert_eq!(c["root"]["readonly"], false);
        assert!(config(json!({"args": ["serve"]})).is_err());
    }

    #[test]
    fn volumes_are_bind_mounts_read_only_only_when_asked() {
        let c = container_config(
            &template(),
            &pod(json!({"command": ["/usr/local/bin/reconcile-once"]})),
            Path::new("/b/rootfs"),
            Path::new("/w/sa"),
            &[],
            &[
                ("/w/secret".into(), "/etc/creds".into(), true),
                ("/sim/vm/snapshots".into(), "/var/snapshots".into(), true),
                ("/sim/vm/scratch".into(), "/scratch".into(), false),
            ],
        )
        .unwrap();
        let mounts = c["mounts"].as_array().unwrap();
        let find = |at: &str| {
            mounts
                .iter()
                .find(|m| m["destination"] == at)
                .cloned()
                .unwrap_or_else(|| panic!("no mount at {at}: {mounts:?}"))
        };
        assert_eq!(
            find("/var/snapshots"),
            json!({"destination": "/var/snapshots", "type": "bind",
                "source": "/sim/vm/snapshots", "options": ["rbind", "ro"]})
        );
        assert_eq!(find("/scratch")["options"], json!(["rbind", "rw"]));
        assert_eq!(find("/etc/creds")["options"], json!(["rbind", "ro"]));
    }

    #[test]
    fn run_as_non_root_refuses_a_root_user() {
        let err = config(json!({"securityContext": {"runAsUser": 0}})).unwrap_err();
        assert!(err.contains("runAsNonRoot"), "{err}");
    }
}
