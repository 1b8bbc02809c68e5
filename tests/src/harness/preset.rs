//! Presets: a simulator that starts with a running, joined cluster built exactly as the
//! product builds one — through the product's own Oxide adapter over the simulator's HTTP API,
//! with the product's instance names, descriptions (spec hash) and cloud-init — plus its
//! Secret and ConfigMap in `kube-system/oxide-controller` (written by the product's state
//! store through the cluster's API) and a kubeconfig file like the one bootstrap writes.
//!
//! What a preset does not do: install the in-cluster pieces (CronJob, webhook) or run a first
//! reconcile; tests that need them run the product's bootstrap or reconcile themselves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_controller::base::retry::Backoff;
use oxide_controller::base::secrets::webhook::WebhookTokens;
use oxide_controller::base::secrets::{ClusterSecrets, random_token};
use oxide_controller::domain::spec::{ClusterSpec, Role, SCHEMA_VERSION};
use oxide_controller::ports::rack::Rack as _;
use oxide_controller::ports::rack::RackError;
use oxide_controller::ports::state::{StateError, StateStore as _};
use oxide_controller::render::cloud_init::MemberInput;
use oxide_controller::render::members::new_instance;
use oxide_controller::{base::names, ports::state};
use serde_json::Value;

use crate::harness::handle::SimHandle;

/// Name of the preset cluster (instance name prefix, kubeconfig context).
pub const CLUSTER: &str = "sim";
/// Oxide project of the preset cluster.
pub const PROJECT: &str = "sim";
/// Silo image the preset's VMs boot from.
pub const IMAGE: &str = "ubuntu-2404";
/// How long the preset waits for its VMs to become Ready Nodes.
const READY_DEADLINE: Duration = Duration::from_secs(120);

/// A preset the simulator starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Preset {
    /// `cluster:<control-plane count>:<worker count>`.
    Cluster {
        /// Number of control-plane VMs (odd).
        control_plane: u32,
        /// Number of worker VMs.
        workers: u32,
    },
}

/// Why a preset string or a preset build failed.
#[derive(Debug, thiserror::Error)]
pub enum PresetError {
    /// The `--preset` value does not parse.
    #[error("invalid preset '{0}': expected cluster:<control-plane>:<workers>, e.g. cluster:3:5")]
    Syntax(String),
    /// Counts outside what a cluster can have.
    #[error("invalid preset '{value}': {reason}")]
    Counts {
        /// The value given.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The product refused the spec it would build from.
    #[error("the preset's cluster spec is invalid: {0}")]
    Spec(String),
    /// The product could not render a member.
    #[error("cannot build instance {name}: {message}")]
    Member {
        /// Instance name.
        name: String,
        /// What went wrong.
        message: String,
    },
    /// A call to the simulated rack failed.
    #[error("{step} failed")]
    Rack {
        /// What the preset was doing.
        step: String,
        /// The cause.
        #[source]
        source: RackError,
    },
    /// The VMs did not all become Ready Nodes in time.
    #[error("the preset cluster was not Ready after {seconds}s (missing: {missing})")]
    NotReady {
        /// How long it waited.
        seconds: u64,
        /// Nodes still not Ready.
        missing: String,
    },
    /// The cluster's API could not be reached through the kubeconfig.
    #[error("cannot reach the preset cluster's API")]
    Kube(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The product's state store failed.
    #[error("cannot write the Secret and ConfigMap")]
    State(#[source] StateError),
    /// The kubeconfig could not be written.
    #[error("cannot write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl FromStr for Preset {
    type Err = PresetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let ["cluster", cp, workers] = parts.as_slice() else {
            return Err(PresetError::Syntax(s.to_string()));
        };
        let control_plane: u32 = cp.parse().map_err(|_| PresetError::Syntax(s.to_string()))?;
        let workers: u32 = workers
            .parse()
            .map_err(|_| PresetError::Syntax(s.to_string()))?;
        let bad = |reason| PresetError::Counts {
            value: s.to_string(),
            reason,
        };
        if control_plane == 0 || control_plane.is_multiple_of(2) {
            return Err(bad("the control-plane count must be odd (1, 3, 5, ...)"));
        }
        if control_plane > 7 || workers > 200 {
            return Err(bad("at most 7 control-plane and 200 worker VMs"));
        }
        Ok(Preset::Cluster {
            control_plane,
            workers,
        })
    }
}

/// What a built preset hands back.
#[derive(Clone, Debug)]
pub struct BuiltPreset {
    /// The Oxide project holding the cluster.
    pub project: String,
    /// The kubeconfig file (server = the API floating IP, names = the cluster name).
    pub kubeconfig: PathBuf,
    /// Instance (= node) names, control plane first.
    pub members: Vec<String>,
}

fn rack_err(step: impl Into<String>) -> impl FnOnce(RackError) -> PresetError {
    let step = step.into();
    move |source| PresetError::Rack { step, source }
}

/// The secrets bootstrap generates before creating any VM.
fn generate_secrets(sim: &SimHandle) -> ClusterSecrets {
    let mut rng = rand::rng();
    let key = russh::keys::PrivateKey::random(&mut rng, russh::keys::Algorithm::Ed25519);
    // Only the public half reaches the cluster (the private one stays on the laptop).
    let public = key
        .ok()
        .and_then(|key| key.public_key().to_openssh().ok())
        .unwrap_or_default();
    ClusterSecrets {
        oxide_host: sim.oxide_host.clone(),
        oxide_token: sim.oxide_token.clone(),
        oxide_project: PROJECT.to_string(),
        oxide_cluster: CLUSTER.to_string(),
        k3s_token: random_token(&mut rng, 32),
        k3s_agent_token: random_token(&mut rng, 32),
        ssh_public_key: public,
        user_ssh_public_key: None,
        tailscale_auth_key: None,
        // As bootstrap leaves it when the user has one token: the run infers it.
        oxide_token_id: None,
    }
}

/// The webhook's tokens, as bootstrap generates them.
fn generate_webhook_tokens() -> WebhookTokens {
    let mut rng = rand::rng();
    WebhookTokens {
        token: random_token(&mut rng, 32),
        read_token: Some(random_token(&mut rng, 32)),
    }
}

/// Name of the webhook's CA file the preset writes beside its kubeconfig (bootstrap writes
/// `<state dir>/<cluster>-webhook-ca.pem`).
pub const WEBHOOK_CA_FILE: &str = "webhook-ca.pem";

/// Builds the preset cluster on a started simulator, writing the kubeconfig into `dir`.
pub async fn build(
    sim: &SimHandle,
    preset: &Preset,
    dir: &Path,
) -> Result<BuiltPreset, PresetError> {
    let Preset::Cluster {
        control_plane,
        workers,
    } = *preset;
    let mut spec = ClusterSpec::new(CLUSTER, PROJECT, IMAGE, control_plane, workers);
    // Where the upgrade pre-flight looks for a release: the simulator's stand-in for GitHub.
    spec.k3s.release_url.clone_from(&sim.release_url);
    // The preset installs no backup CronJob (bootstrap does): its spec takes no in-cluster
    // backups either, as `bootstrap --backup-schedule off` writes it. A roll of its servers
    // then goes on without waiting for a backup (`domain::backup::roll`).
    spec.backup.schedule = None;
    spec.validate()
        .map_err(|e| PresetError::Spec(e.to_string()))?;
    let secrets = generate_secrets(sim);
    // The webhook's serving pair, as bootstrap makes it; its CA beside the kubeconfig.
    let (tls, ca) = oxide_controller::adapters::webhook_tls::generate(
        CLUSTER,
        oxide_controller::ports::cluster::NAMESPACE,
    )
    .map_err(|e| PresetError::Spec(format!("webhook TLS: {e}")))?;
    write_private(&dir.join(WEBHOOK_CA_FILE), &tls.ca_pem)?;

    sim.oxide().seed_project(PROJECT);
    sim.oxide()
        .seed_silo_image(IMAGE, "ubuntu", "24.04", 2 << 30);
    let rack = OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        PROJECT,
        RackOptions::default(),
    )
    .map_err(rack_err("connecting to the simulated rack"))?;
    let image = rack
        .find_image(IMAGE)
        .await
        .map_err(rack_err("finding the image"))?
        .ok_or_else(|| PresetError::Spec(format!("image {IMAGE} was not seeded")))?;
    // What bootstrap does in its project step: without this rule the VPC firewall drops
    // the API on the floating IP.
    let anywhere = oxide_controller::domain::firewall::parse_sources(
        oxide_controller::domain::firewall::DEFAULT_API_ALLOW,
    )
    .map_err(PresetError::Spec)?;
    let fip_name = names::api_floating_ip_name(CLUSTER);
    let fip = rack
        .create_floating_ip(
            &fip_name,
            &format!("oxide-controller cluster={CLUSTER} Kubernetes API"),
            None,
        )
        .await
        .map_err(rack_err("creating the API floating IP"))?;

    // Names first (the RNG is not Send, so never across an await).
    let mut members: Vec<(Role, String)> = {
        let mut rng = rand::rng();
        spec.pools()
            .flat_map(|(role, pool)| {
                (0..pool.count)
                    .map(|_| {
                        let suffix = names::random_suffix(&mut rng);
                        (role, names::instance_name(CLUSTER, &pool.name, &suffix))
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    members.sort_by_key(|(role, _)| *role != Role::ControlPlane);
    let servers: Vec<String> = members
        .iter()
        .filter(|(role, _)| *role == Role::ControlPlane)
        .map(|(_, n)| n.clone())
        .collect();
    rack.ensure_firewall_rules(&[oxide_controller::domain::firewall::api_rule(
        CLUSTER, anywhere, &servers,
    )])
    .await
    .map_err(rack_err("opening the Kubernetes API in the VPC firewall"))?;

    let create = |role: Role, name: String, cluster_init: bool| {
        let spec = &spec;
        let secrets = &secrets;
        let rack = &rack;
        async move {
            let pool = match role {
                Role::ControlPlane => &spec.control_plane,
                Role::Worker => spec
                    .default_worker_pool()
                    .ok_or_else(|| PresetError::Spec("the spec has no worker pool".to_string()))?,
            };
            let new = new_instance(&MemberInput {
                spec,
                secrets,
                role,
                pool,
                name: &name,
                image_id: image.id,
                api_address: fip.ip,
                join_address: fip.ip,
                cluster_init,
                ca_hash: None,
                restore: None,
                drill: false,
            })
            .map_err(|message| PresetError::Member {
                name: name.clone(),
                message,
            })?;
            // As the product does before a create (apply, bootstrap): the pool's group (the
            // servers always have one) must exist for the instance to join it.
            if let Some(group) = &new.anti_affinity_group {
                rack.ensure_anti_affinity_group(group)
                    .await
                    .map_err(rack_err(format!("creating anti-affinity group {group}")))?;
            }
            rack.create_instance(&new)
                .await
                .map_err(rack_err(format!("creating instance {name}")))?;
            Ok::<(), PresetError>(())
        }
    };

    // Bootstrap order: the first server creates the cluster and gets the floating IP; every
    // other member joins through the floating IP.
    let Some((first_role, first)) = members.first().cloned() else {
        return Err(PresetError::Spec("a cluster needs a control plane".into()));
    };
    create(first_role, first.clone(), true).await?;
    rack.attach_floating_ip_retrying(
        &fip_name,
        &first,
        Backoff {
            first: Duration::from_millis(50),
            max: Duration::from_secs(1),
            attempts: 200,
        },
    )
    .await
    .map_err(rack_err(format!("attaching {fip_name} to {first}")))?;
    futures::future::try_join_all(
        members
            .iter()
            .skip(1)
            .map(|(role, name)| create(*role, name.clone(), false)),
    )
    .await?;

    let names: Vec<String> = members.into_iter().map(|(_, n)| n).collect();
    wait_ready(sim, &names).await?;

    // The Secret and ConfigMap, written by the product's own store through the cluster API.
    let server = format!("https://{}", std::net::SocketAddr::new(fip.ip, 6443));
    let admin = sim
        .kube()
        .admin_kubeconfig(&server)
        .ok_or_else(|| PresetError::Spec("the cluster's API did not start".into()))?;
    let kubeconfig = renamed_kubeconfig(&admin, CLUSTER);
    let client = kube_client(&kubeconfig).await?;
    let store = oxide_controller::adapters::kube_store::KubeStateStore::new(
        client,
        oxide_controller::ports::cluster::NAMESPACE,
    );
    let mut config = BTreeMap::new();
    config.insert(state::keys::SPEC.to_string(), spec.to_yaml());
    config.insert(
        state::keys::SCHEMA_VERSION.to_string(),
        SCHEMA_VERSION.to_string(),
    );
    // As bootstrap stores it: members reconcile adds join with `K10<hash>::` tokens.
    if let Ok(hash) = oxide_controller::adapters::kubeconfig::k3s_ca_hash(&kubeconfig) {
        config.insert(state::keys::K3S_CA_HASH.to_string(), hash);
    }
    store
        .ensure_state(&secrets, config)
        .await
        .map_err(PresetError::State)?;
    store
        .ensure_webhook_tokens(&generate_webhook_tokens())
        .await
        .map_err(PresetError::State)?;
    store
        .ensure_webhook_tls(&tls, &ca)
        .await
        .map_err(PresetError::State)?;

    let path = dir.join("kubeconfig");
    write_private(&path, &kubeconfig)?;
    tracing::info!(
        cluster = CLUSTER,
        members = names.len(),
        kubeconfig = %path.display(),
        "preset cluster ready"
    );
    Ok(BuiltPreset {
        project: PROJECT.to_string(),
        kubeconfig: path,
        members: names,
    })
}

async fn wait_ready(sim: &SimHandle, names: &[String]) -> Result<(), PresetError> {
    let started = tokio::time::Instant::now();
    loop {
        let kube = sim.kube();
        let mut missing: Vec<&str> = Vec::new();
        for n in names {
            if !kube.node_ready(n).await {
                missing.push(n);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if started.elapsed() > READY_DEADLINE {
            return Err(PresetError::NotReady {
                seconds: READY_DEADLINE.as_secs(),
                missing: missing.join(", "),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// k3s names everything in its kubeconfig `default`; bootstrap renames cluster, user and
/// context to the cluster name so the file merges cleanly with others.
fn renamed_kubeconfig(k3s_kubeconfig: &str, name: &str) -> String {
    let Ok(mut doc) = serde_saphyr::from_str::<Value>(k3s_kubeconfig) else {
        return k3s_kubeconfig.to_string();
    };
    for list in ["clusters", "users", "contexts"] {
        if let Some(items) = doc[list].as_array_mut() {
            for item in items {
                item["name"] = Value::from(name);
            }
        }
    }
    if let Some(contexts) = doc["contexts"].as_array_mut() {
        for ctx in contexts {
            ctx["context"]["cluster"] = Value::from(name);
            ctx["context"]["user"] = Value::from(name);
        }
    }
    doc["current-context"] = Value::from(name);
    serde_saphyr::to_string(&doc).unwrap_or_else(|_| k3s_kubeconfig.to_string())
}

async fn kube_client(kubeconfig: &str) -> Result<kube::Client, PresetError> {
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| PresetError::Kube(Box::new(e)))?;
    let config =
        kube::Config::from_custom_kubeconfig(parsed, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| PresetError::Kube(Box::new(e)))?;
    oxide_controller::adapters::kubeclient::client_from_config(config)
        .map_err(|e| PresetError::Kube(Box::new(e)))
}

fn write_private(path: &Path, contents: &str) -> Result<(), PresetError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| PresetError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_refuse_even_control_planes() {
        assert_eq!(
            "cluster:3:5".parse::<Preset>().unwrap(),
            Preset::Cluster {
                control_plane: 3,
                workers: 5
            }
        );
        for bad in [
            "cluster:2:1",
            "cluster:0:1",
            "cluster:3",
            "nodes:1:1",
            "cluster:a:1",
        ] {
            assert!(bad.parse::<Preset>().is_err(), "{bad}");
        }
    }

    #[test]
    fn kubeconfig_names_become_the_cluster_name() {
        let k3s = "apiVersion: v1\nclusters:\n- cluster:\n    server: https://127.0.0.1:6443\n  name: default\ncontexts:\n- context:\n    cluster: default\n    user: default\n  name: default\ncurrent-context: default\nkind: Config\nusers:\n- name: default\n  user:\n    token: x\n";
        let renamed = renamed_kubeconfig(k3s, "demo");
        let doc: Value = serde_saphyr::from_str(&renamed).unwrap();
        assert_eq!(doc["current-context"], "demo");
        assert_eq!(doc["contexts"][0]["context"]["cluster"], "demo");
        assert_eq!(doc["users"][0]["name"], "demo");
        assert_eq!(
            doc["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443"
        );
    }
}
