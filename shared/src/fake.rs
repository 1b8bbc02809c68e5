//! In-memory fakes of [`Rack`], [`Cluster`] and [`StateStore`] over one shared [`FakeWorld`],
//! for workflow tests and property tests. Not a simulator: time moves only when a test calls
//! [`FakeWorld::tick`], which moves instances through their lifecycle and lets kubelets join.
//! The Oxide rules that matter to the planner (delete only when stopped/failed, attach 503 in
//! transient states, names unique, deleting an instance detaches its disks) hold here too.
//! [`connect`] hands all of it to the bootstrap workflow.

pub mod connect;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::base::names;
use crate::base::secrets::ClusterSecrets;
use crate::domain::firewall::{OwnedRule, RuleChange};
use crate::domain::model::{
    AntiAffinityGroup, Disk, DiskState, ExternalIp, ExternalIpKind, FloatingIp, Image, Instance,
    InstanceState, NewInstance, Node, NodeReadiness, PodRef, Snapshot,
};
use crate::ports::cluster::{Cluster, ClusterError, EventType, Eviction, JobTrigger, LeaseOutcome};
use crate::ports::rack::{Rack, RackError};
use crate::ports::state::{ConfigSnapshot, StateError, StateStore};

/// A pod in the fake cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakePod {
    pub pod: PodRef,
    pub node: String,
    /// Evictions refused (as a PDB would) while this is true.
    pub protected: bool,
    /// Evictions refused outright with this message (several budgets: HTTP 500).
    pub refused: Option<String>,
    /// A finalizer that never clears: eviction marks the pod deleted, but it stays.
    pub finalizer: bool,
}

/// Everything the fakes share.
#[derive(Debug, Default)]
pub struct WorldState {
    pub now: DateTime<Utc>,
    pub instances: BTreeMap<String, Instance>,
    /// user-data of each instance, to check what members were told.
    pub user_data: BTreeMap<String, Vec<u8>>,
    pub disks: BTreeMap<String, Disk>,
    pub floating_ips: BTreeMap<String, FloatingIp>,
    pub images: Vec<Image>,
    pub nodes: BTreeMap<String, Node>,
    pub pods: Vec<FakePod>,
    /// What `list_pods` answers (the autoscaler's view; drain uses `pods`).
    pub workload_pods: Vec<crate::domain::model::Pod>,
    /// What `list_pdbs` answers.
    pub pdbs: Vec<crate::domain::model::DisruptionBudget>,
    /// What `list_pvs` answers.
    pub pvs: Vec<crate::domain::model::PersistentVolume>,
    /// How often `list_pods`, `list_pdbs` and `list_pvs` were called.
    pub pod_lists: usize,
    pub pdb_lists: usize,
    pub pv_lists: usize,
    /// Instance names whose kubelet never joins.
    pub never_join: BTreeSet<String>,
    /// Nodes whose deletion k3s's finalizers hold: a delete leaves them (Terminating) until
    /// the name leaves this set (a running server's handlers ran) and they are deleted again.
    pub held_nodes: BTreeSet<String>,
    pub lease: Option<(String, DateTime<Utc>)>,
    /// The next this many Lease renewals fail as if the API were unavailable.
    pub renew_failures: u32,
    /// The next this many Lease releases fail as if the API were unavailable.
    pub release_failures: u32,
    pub events: Vec<(EventType, String, String)>,
    /// k3s's certificate monitor Events a test put there.
    pub certificate_events: Vec<crate::domain::certificates::MonitorEvent>,
    pub jobs: BTreeSet<String>,
    pub cronjob: bool,
    pub config: ConfigSnapshot,
    /// ConfigMap `oxide-controller-scale` (the webhook's counts); `None`: it does not exist.
    pub scale: Option<ConfigSnapshot>,
    /// ConfigMap `oxide-controller-backup` (`backup.json`); `None`: it does not exist.
    pub backups: Option<ConfigSnapshot>,
    pub secrets: Option<ClusterSecrets>,
    /// Secret `oxide-controller-webhook-tls` (resourceVersion, pair) and
    /// `oxide-controller-webhook-ca`.
    pub webhook_tls: Option<(u64, crate::base::secrets::webhook::WebhookTls)>,
    pub webhook_ca: Option<crate::base::secrets::webhook::WebhookCa>,
    /// Secret `oxide-controller-webhook-auth` (the webhook's tokens).
    pub webhook_tokens: Option<crate::base::secrets::webhook::WebhookTokens>,
    /// Reading that Secret is refused (403), as for an account without `get` on it.
    pub webhook_tokens_forbidden: bool,
    /// Calls that change something, in order, e.g. "create demo-workers-abcde".
    pub log: Vec<String>,
    /// The most instances each pool-prefix ever had at once (for surge checks).
    pub peak_instances: usize,
    /// Project snapshots by name.
    pub snapshots: BTreeMap<String, Snapshot>,
    /// Anti-affinity groups by name, with their member instance names.
    pub groups: BTreeMap<String, (AntiAffinityGroup, BTreeSet<String>)>,
    /// VPC names (a project starts with `default`).
    pub vpcs: Vec<String>,
    /// Subnets of VPC `default` (a project starts with `default`).
    pub subnets: Vec<String>,
    /// Affinity groups (a user's; oxide-controller makes none).
    pub affinity_groups: Vec<String>,
    /// The project was deleted.
    pub project_deleted: bool,
    /// Mutating rack calls still allowed; at zero every further one fails as if the process
    /// had died right there (crash tests). `None`: unlimited.
    pub mutation_budget: Option<usize>,
    /// Firewall rules oxide-controller ensured (the rack's own defaults are not modelled).
    pub firewall_rules: Vec<OwnedRule>,
    /// Prefix length of the project's default subnet (`None`: not modelled, no check).
    pub subnet_prefix: Option<u8>,
    /// What `GET /v1/me/access-tokens` lists (counted in `reads` as `access-tokens`).
    pub access_tokens: Vec<crate::domain::oxide_token::AccessToken>,
    /// While set, every instance create is refused with a 400 carrying this message (e.g.
    /// nexus's for a full subnet), and counted in `refused_creates`.
    pub refuse_creates: Option<String>,
    pub refused_creates: usize,
    /// While set, attaching a floating IP to any instance but this one is refused with a 400
    /// (the rack's answer to a move it will not make).
    pub attach_only_to: Option<String>,
    /// The Secret's host key pins (instance → fingerprints).
    pub host_key_pins: BTreeMap<String, Vec<String>>,
    /// Every request to create something, made or refused, in order ("create-instance
    /// NAME", "create-fip NAME", "create-project", "create-secret", "create-configmap"):
    /// a re-run that adopts what exists asks for nothing here.
    pub create_calls: Vec<String>,
    /// The image imports behind [`crate::adapters::image::ImageStore`] for [`FakeRack`]; the images
    /// they make land in `images` too.
    pub image_store: crate::adapters::image::fake::MemoryImageStore,
    /// Objects the fake manifest applier applied ([`crate::render::manifests::Manifest::describe`]).
    pub applied: BTreeSet<String>,
    /// What `etcd_members` answers: `None` is k3s's own bookkeeping (one voting member
    /// `<node>-<8 hex>` per server Node, as k3s adds a member when a server joins and removes
    /// it when its Node is deleted); `Some(Ok(list))` a list a test set; `Some(Err(why))` a
    /// supervisor that does not answer.
    pub etcd_members: Option<Result<Vec<crate::domain::model::EtcdMember>, String>>,
    /// The server token `etcd_members` was last asked with.
    pub etcd_token_seen: Option<String>,
    /// How often each read that the reconcile makes once per run was asked for
    /// ("list-nodes", "default-subnet-prefix"): a run that asks twice is caught here.
    pub reads: BTreeMap<&'static str, usize>,
    next_ip: u8,
    rv: u64,
}

/// Handle on the shared world; clone freely.
#[derive(Debug, Clone, Default)]
pub struct FakeWorld(Arc<Mutex<WorldState>>);

impl FakeWorld {
    pub fn new(now: DateTime<Utc>) -> FakeWorld {
        let w = FakeWorld::default();
        w.with(|s| {
            s.now = now;
            s.cronjob = true;
            s.vpcs = vec!["default".to_owned()];
            s.subnets = vec!["default".to_owned()];
            // A user with one token that never expires, as after `oxide auth login`.
            s.access_tokens = vec![crate::domain::oxide_token::AccessToken {
                id: "5a1e0000-0000-4000-8000-000000000001".to_owned(),
                expires_at: None,
            }];
        });
        w
    }

    pub fn lock(&self) -> MutexGuard<'_, WorldState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut WorldState) -> T) -> T {
        f(&mut self.lock())
    }

    /// Advances time by `secs` and moves the world along: starting → running, stopping →
    /// stopped, running members' kubelets join (Ready Nodes), halted ones go NotReady.
    pub fn tick(&self, secs: i64) {
        self.with(|s| {
            s.now += chrono::Duration::seconds(secs);
            let now = s.now;
            let mut joins = Vec::new();
            for inst in s.instances.values_mut() {
                match inst.state {
                    InstanceState::Creating
                    | InstanceState::Starting
                    | InstanceState::Rebooting => {
                        inst.state = InstanceState::Running;
                        inst.time_state_updated = now;
                    }
                    InstanceState::Stopping => {
                        inst.state = InstanceState::Stopped;
                        inst.time_state_updated = now;
                    }
                    _ => {}
                }
                if inst.state == InstanceState::Running && !s.never_join.contains(&inst.name) {
                    joins.push(inst.name.clone());
                }
            }
            for name in joins {
                let node = s.nodes.entry(name.clone()).or_insert_with(|| Node {
                    name: name.clone(),
                    provider_id: None,
                    labels: BTreeMap::new(),
                    annotations: BTreeMap::new(),
                    readiness: NodeReadiness::Ready,
                    unschedulable: false,
                    created: now,
                    taints: Vec::new(),
                    allocatable: Default::default(),
                    kubelet_version: None,
                    deleting_since: None,
                });
                node.readiness = NodeReadiness::Ready;
            }
            let running: BTreeSet<String> = s
                .instances
                .values()
                .filter(|i| i.state == InstanceState::Running)
                .map(|i| i.name.clone())
                .collect();
            for node in s.nodes.values_mut() {
                if !running.contains(&node.name) && node.readiness == NodeReadiness::Ready {
                    node.readiness = NodeReadiness::NotReady { since: now };
                }
            }
        });
    }

    /// Adds a silo image.
    pub fn add_image(&self, name: &str) -> Uuid {
        let id = Uuid::new_v4();
        self.with(|s| {
            s.images.push(Image {
                id,
                name: name.to_owned(),
                description: String::new(),
                size: crate::base::size::ByteSize::gib(2),
                block_size: 512,
                silo_scoped: true,
            })
        });
        id
    }

    pub fn rack(&self) -> FakeRack {
        FakeRack(self.clone())
    }
    pub fn cluster(&self) -> FakeCluster {
        FakeCluster(self.clone())
    }
    pub fn state(&self) -> FakeState {
        FakeState(self.clone())
    }
}

/// The `SHA256:` fingerprint of the fake host key of instance `name` (stable per name).
pub fn host_fingerprint(name: &str) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("fake host key of {name}").as_bytes());
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// The fingerprint block cloud-init prints on the console of instance `name`.
fn console_fingerprints(name: &str) -> String {
    let fp = host_fingerprint(name);
    format!(
        "<14>Nov 22 20:13:34 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----\n\
         <14>Nov 22 20:13:34 cloud-init: 256 {fp} root@{name} (ED25519)\n\
         <14>Nov 22 20:13:34 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----\n"
    )
}

fn not_found(what: impl Into<String>) -> RackError {
    RackError::NotFound { what: what.into() }
}

/// [`Rack`] over the fake world.
#[derive(Debug, Clone)]
pub struct FakeRack(pub FakeWorld);

impl Rack for FakeRack {
    /// A deleted project (`project_deleted`) is created again.
    async fn ensure_project(&self) -> Result<(), RackError> {
        self.0.with(|s| {
            if s.project_deleted {
                s.project_deleted = false;
                s.create_calls.push("create-project".to_owned());
                s.log.push("create-project".to_owned());
            }
        });
        Ok(())
    }

    async fn list_instances(&self, prefix: &str) -> Result<Vec<Instance>, RackError> {
        Ok(self.0.with(|s| {
            s.instances
                .values()
                .filter(|i| i.name.starts_with(prefix))
                .cloned()
                .collect()
        }))
    }

    async fn get_instance(&self, name: &str) -> Result<Option<Instance>, RackError> {
        Ok(self.0.with(|s| s.instances.get(name).cloned()))
    }

    async fn instance_private_ip(&self, name: &str) -> Result<Option<IpAddr>, RackError> {
        // A stable address in the default VPC subnet (172.30.0.0/22), derived from the id.
        Ok(self.0.with(|s| {
            s.instances.get(name).map(|i| {
                let b = i.id.as_bytes();
                IpAddr::V4(Ipv4Addr::new(172, 30, b[0] & 3, b[1].max(5)))
            })
        }))
    }

    async fn create_instance(&self, new: &NewInstance) -> Result<Instance, RackError> {
        self.0.with(|s| {
            s.create_calls.push(format!("create-instance {}", new.name));
            if let Some(message) = s.refuse_creates.clone() {
                s.refused_creates += 1;
                return Err(RackError::Invalid {
                    what: format!("instance {}", new.name),
                    message,
                });
            }
            if s.instances.contains_key(&new.name) {
                return Err(RackError::AlreadyExists {
                    what: format!("instance {}", new.name),
                });
            }
            let disks = std::iter::once(&new.boot_disk).chain(new.data_disk.as_ref());
            if let Some(d) = disks.clone().find(|d| s.disks.contains_key(&d.name)) {
                return Err(RackError::AlreadyExists {
                    what: format!("disk {}", d.name),
                });
            }
            let id = Uuid::new_v4();
            for d in disks {
                s.disks.insert(
                    d.name.clone(),
                    Disk {
                        id: Uuid::new_v4(),
                        name: d.name.clone(),
                        description: new.description.clone(),
                        state: DiskState::Attached(id),
                        size: d.size,
                        time_created: s.now,
                        image_id: None,
                    },
                );
            }
            let inst = Instance {
                id,
                name: new.name.clone(),
                description: new.description.clone(),
                hostname: new.hostname.clone(),
                state: InstanceState::Starting,
                ncpus: new.ncpus,
                memory: new.memory,
                time_created: s.now,
                time_state_updated: s.now,
            };
            s.instances.insert(new.name.clone(), inst.clone());
            s.user_data.insert(new.name.clone(), new.user_data.clone());
            s.log.push(format!("create {}", new.name));
            let pool_prefix = new
                .name
                .rsplit_once('-')
                .map(|(p, _)| p.to_owned())
                .unwrap_or_default();
            let in_pool = s
                .instances
                .keys()
                .filter(|n| n.starts_with(&pool_prefix))
                .count();
            s.peak_instances = s.peak_instances.max(in_pool);
            Ok(inst)
        })
    }

    async fn start_instance(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            let i = s
                .instances
                .get_mut(name)
                .ok_or_else(|| not_found(format!("instance {name}")))?;
            match i.state {
                InstanceState::Stopped | InstanceState::Failed => i.state = InstanceState::Starting,
                InstanceState::Stopping => {
                    return Err(RackError::Conflict {
                        what: format!("instance {name}"),
                        message: "stopping".into(),
                    });
                }
                _ => {}
            }
            s.log.push(format!("start {name}"));
            Ok(())
        })
    }

    async fn reboot_instance(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            let i = s
                .instances
                .get_mut(name)
                .ok_or_else(|| not_found(format!("instance {name}")))?;
            if i.state != InstanceState::Running {
                // nexus: only a running VMM reboots.
                return Err(RackError::Conflict {
                    what: format!("instance {name}"),
                    message: format!("cannot reboot an instance in state {:?}", i.state),
                });
            }
            i.state = InstanceState::Rebooting;
            s.log.push(format!("reboot {name}"));
            Ok(())
        })
    }

    async fn stop_instance(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "stop")?;
            let i = s
                .instances
                .get_mut(name)
                .ok_or_else(|| not_found(format!("instance {name}")))?;
            match i.state {
                InstanceState::Failed => i.state = InstanceState::Stopped,
                InstanceState::Stopped | InstanceState::Stopping => {}
                _ => i.state = InstanceState::Stopping,
            }
            s.log.push(format!("stop {name}"));
            Ok(())
        })
    }

    async fn delete_instance(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "delete")?;
            let i = s
                .instances
                .get(name)
                .ok_or_else(|| not_found(format!("instance {name}")))?;
            if !i.state.is_deletable() {
                return Err(RackError::Invalid {
                    what: format!("instance {name}"),
                    message: "instance is running or has not yet fully stopped".into(),
                });
            }
            let id = i.id;
            s.instances.remove(name);
            for d in s.disks.values_mut() {
                if d.state == DiskState::Attached(id) {
                    d.state = DiskState::Detached;
                }
            }
            for f in s.floating_ips.values_mut() {
                if f.instance_id == Some(id) {
                    f.instance_id = None;
                }
            }
            s.log.push(format!("delete {name}"));
            Ok(())
        })
    }

    async fn instance_external_ips(&self, name: &str) -> Result<Vec<ExternalIp>, RackError> {
        self.0.with(|s| {
            let i = s
                .instances
                .get(name)
                .ok_or_else(|| not_found(format!("instance {name}")))?;
            Ok(s.floating_ips
                .values()
                .filter(|f| f.instance_id == Some(i.id))
                .map(|f| ExternalIp {
                    ip: f.ip,
                    kind: ExternalIpKind::Floating,
                })
                .collect())
        })
    }

    /// Empty until the instance runs; then cloud-init's host key fingerprint block with
    /// [`host_fingerprint`] of the instance.
    async fn serial_console(&self, name: &str) -> Result<Vec<u8>, RackError> {
        self.0.with(|s| {
            s.instances
                .get(name)
                .map(|i| match i.state {
                    InstanceState::Running => console_fingerprints(name).into_bytes(),
                    _ => Vec::new(),
                })
                .ok_or_else(|| not_found(format!("instance {name}")))
        })
    }

    async fn list_disks(&self) -> Result<Vec<Disk>, RackError> {
        Ok(self.0.with(|s| s.disks.values().cloned().collect()))
    }

    async fn delete_disk(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "delete-disk")?;
            let d = s
                .disks
                .get(name)
                .ok_or_else(|| not_found(format!("disk {name}")))?;
            if !matches!(d.state, DiskState::Detached | DiskState::Faulted) {
                return Err(RackError::Invalid {
                    what: format!("disk {name}"),
                    message: "disk is attached".into(),
                });
            }
            s.disks.remove(name);
            s.log.push(format!("delete-disk {name}"));
            Ok(())
        })
    }

    async fn list_floating_ips(&self) -> Result<Vec<FloatingIp>, RackError> {
        Ok(self.0.with(|s| s.floating_ips.values().cloned().collect()))
    }

    async fn my_access_tokens(
        &self,
    ) -> Result<Vec<crate::domain::oxide_token::AccessToken>, RackError> {
        Ok(self.0.with(|s| {
            *s.reads.entry("access-tokens").or_default() += 1;
            s.access_tokens.clone()
        }))
    }

    async fn default_subnet_prefix(&self) -> Result<Option<u8>, RackError> {
        Ok(self.0.with(|s| {
            *s.reads.entry("default-subnet-prefix").or_default() += 1;
            s.subnet_prefix
        }))
    }

    async fn get_floating_ip(&self, name: &str) -> Result<Option<FloatingIp>, RackError> {
        Ok(self.0.with(|s| s.floating_ips.get(name).cloned()))
    }

    async fn create_floating_ip(
        &self,
        name: &str,
        description: &str,
        _pool: Option<&str>,
    ) -> Result<FloatingIp, RackError> {
        self.0.with(|s| {
            s.create_calls.push(format!("create-fip {name}"));
            if s.floating_ips.contains_key(name) {
                return Err(RackError::AlreadyExists {
                    what: format!("floating IP {name}"),
                });
            }
            s.next_ip = s.next_ip.wrapping_add(1);
            let fip = FloatingIp {
                id: Uuid::new_v4(),
                name: name.to_owned(),
                description: description.to_owned(),
                ip: IpAddr::V4(Ipv4Addr::new(127, 100, 0, s.next_ip)),
                instance_id: None,
            };
            s.floating_ips.insert(name.to_owned(), fip.clone());
            s.log.push(format!("create-fip {name}"));
            Ok(fip)
        })
    }

    async fn attach_floating_ip(&self, fip: &str, instance: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            if s.attach_only_to
                .as_deref()
                .is_some_and(|only| only != instance)
            {
                return Err(RackError::Invalid {
                    what: format!("floating IP {fip}"),
                    message: format!("refused: not {instance}"),
                });
            }
            let i = s
                .instances
                .get(instance)
                .ok_or_else(|| not_found(format!("instance {instance}")))?;
            let id = i.id;
            if i.state.is_transient() {
                return Err(RackError::Unavailable {
                    what: format!("floating IP {fip}"),
                    status: 503,
                    message: "can't attach in transient state".into(),
                });
            }
            let f = s
                .floating_ips
                .get_mut(fip)
                .ok_or_else(|| not_found(format!("floating IP {fip}")))?;
            match f.instance_id {
                Some(other) if other != id => {
                    return Err(RackError::Invalid {
                        what: format!("floating IP {fip}"),
                        message: "already attached".into(),
                    });
                }
                _ => f.instance_id = Some(id),
            }
            s.log.push(format!("attach-fip {fip} {instance}"));
            Ok(())
        })
    }

    async fn detach_floating_ip(&self, fip: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "detach-fip")?;
            let f = s
                .floating_ips
                .get_mut(fip)
                .ok_or_else(|| not_found(format!("floating IP {fip}")))?;
            f.instance_id = None;
            s.log.push(format!("detach-fip {fip}"));
            Ok(())
        })
    }

    async fn find_image(&self, name: &str) -> Result<Option<Image>, RackError> {
        Ok(self
            .0
            .with(|s| s.images.iter().find(|i| i.name == name).cloned()))
    }

    async fn ensure_anti_affinity_group(&self, _name: &str) -> Result<(), RackError> {
        Ok(())
    }

    // ---- deleting a cluster ----

    async fn project_exists(&self) -> Result<bool, RackError> {
        Ok(self.0.with(|s| !s.project_deleted))
    }

    async fn delete_floating_ip(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "delete-fip")?;
            let f = s
                .floating_ips
                .get(name)
                .ok_or_else(|| not_found(format!("floating IP {name}")))?;
            if f.instance_id.is_some() {
                return Err(RackError::Invalid {
                    what: format!("floating IP {name}"),
                    message: "floating IP cannot be deleted while attached to an instance".into(),
                });
            }
            s.floating_ips.remove(name);
            s.log.push(format!("delete-fip {name}"));
            Ok(())
        })
    }

    async fn list_project_images(&self) -> Result<Vec<Image>, RackError> {
        Ok(self.0.with(|s| {
            s.images
                .iter()
                .filter(|i| !i.silo_scoped)
                .cloned()
                .collect()
        }))
    }

    async fn delete_image(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "delete-image")?;
            let at = s
                .images
                .iter()
                .position(|i| i.name == name && !i.silo_scoped)
                .ok_or_else(|| not_found(format!("image {name}")))?;
            s.images.remove(at);
            s.log.push(format!("delete-image {name}"));
            Ok(())
        })
    }

    async fn list_snapshots(&self) -> Result<Vec<Snapshot>, RackError> {
        Ok(self.0.with(|s| s.snapshots.values().cloned().collect()))
    }

    async fn delete_snapshot(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "delete-snapshot")?;
            s.snapshots
                .remove(name)
                .ok_or_else(|| not_found(format!("snapshot {name}")))?;
            s.log.push(format!("delete-snapshot {name}"));
            Ok(())
        })
    }

    async fn list_anti_affinity_groups(&self) -> Result<Vec<AntiAffinityGroup>, RackError> {
        Ok(self
            .0
            .with(|s| s.groups.values().map(|(g, _)| g.clone()).collect()))
    }

    async fn anti_affinity_group_members(&self, group: &str) -> Result<Vec<String>, RackError> {
        self.0.with(|s| {
            let (_, members) = s
                .groups
                .get(group)
                .ok_or_else(|| not_found(format!("anti-affinity group {group}")))?;
            // Deleted instances leave their groups.
            Ok(members
                .iter()
                .filter(|m| s.instances.contains_key(*m))
                .cloned()
                .collect())
        })
    }

    async fn delete_anti_affinity_group(&self, name: &str) -> Result<(), RackError> {
        self.0.with(|s| {
            budget(s, "delete-group")?;
            s.groups
                .remove(name)
                .ok_or_else(|| not_found(format!("anti-affinity group {name}")))?;
            s.log.push(format!("delete-group {name}"));
            Ok(())
        })
    }

    async fn list_vpcs(&self) -> Result<Vec<String>, RackError> {
        Ok(self.0.with(|s| s.vpcs.clone()))
    }

    async fn list_affinity_groups(&self) -> Result<Vec<String>, RackError> {
        Ok(self.0.with(|s| s.affinity_groups.clone()))
    }

    async fn list_default_vpc_subnets(&self) -> Result<Vec<String>, RackError> {
        self.0.with(|s| {
            if s.vpcs.iter().any(|v| v == "default") {
                Ok(s.subnets.clone())
            } else {
                Err(not_found("VPC default".to_owned()))
            }
        })
    }

    /// Three calls, as `OxideRack`'s: subnet `default`, VPC `default` (its firewall rules go
    /// with it), then the project, each refused on its own as nexus refuses it, so a refusal
    /// half-way leaves what a rack would.
    async fn delete_project(&self) -> Result<(), RackError> {
        let refused = |what: &str, message: &str| RackError::Invalid {
            what: what.into(),
            message: message.into(),
        };
        self.0.with(|s| {
            if s.subnets.iter().any(|n| n == "default") {
                budget(s, "delete-subnet")?;
                if !s.instances.is_empty() {
                    return Err(refused(
                        "subnet default",
                        "VPC Subnet cannot be deleted while network interfaces in the subnet exist",
                    ));
                }
                s.subnets.retain(|n| n != "default");
                s.log.push("delete-subnet default".to_owned());
            }
            if s.vpcs.iter().any(|v| v == "default") {
                budget(s, "delete-vpc")?;
                if !s.subnets.is_empty() {
                    return Err(refused(
                        "VPC default",
                        "VPC cannot be deleted while VPC Subnets exist",
                    ));
                }
                s.vpcs.retain(|v| v != "default");
                s.firewall_rules.clear();
                s.log.push("delete-vpc default".to_owned());
            }
            budget(s, "delete-project")?;
            let busy = !s.instances.is_empty()
                || !s.disks.is_empty()
                || !s.floating_ips.is_empty()
                || s.images.iter().any(|i| !i.silo_scoped)
                || !s.snapshots.is_empty()
                || !s.vpcs.is_empty()
                || !s.affinity_groups.is_empty()
                || !s.groups.is_empty();
            if busy {
                return Err(refused(
                    "project",
                    "project to be deleted contains resources",
                ));
            }
            s.project_deleted = true;
            s.log.push("delete-project".to_owned());
            Ok(())
        })
    }

    async fn remove_firewall_rule(&self, name: &str) -> Result<bool, RackError> {
        self.0.with(|s| {
            if !s.firewall_rules.iter().any(|r| r.name == name) {
                return Ok(false);
            }
            budget(s, "remove-firewall-rule")?;
            s.firewall_rules.retain(|r| r.name != name);
            s.log.push(format!("remove-firewall-rule {name}"));
            Ok(true)
        })
    }

    async fn list_firewall_rules(&self) -> Result<Vec<String>, RackError> {
        self.0.with(|s| {
            if !s.vpcs.iter().any(|v| v == "default") {
                return Err(not_found("VPC default".to_owned()));
            }
            Ok(s.firewall_rules.iter().map(|r| r.name.clone()).collect())
        })
    }

    async fn ensure_firewall_rules(&self, rules: &[OwnedRule]) -> Result<RuleChange, RackError> {
        Ok(self.0.with(|s| {
            let mut change = None;
            for rule in rules {
                let kept = rule.hosts == crate::domain::firewall::RuleHosts::Kept;
                match s.firewall_rules.iter_mut().find(|r| r.name == rule.name) {
                    Some(r) => {
                        let mut rule = rule.clone();
                        if kept {
                            rule.hosts = r.hosts.clone();
                        }
                        if *r == rule {
                            continue;
                        }
                        *r = rule;
                        change.get_or_insert(RuleChange::Updated);
                    }
                    // Only retargeted: never made without its sources.
                    None if kept => continue,
                    None => {
                        s.firewall_rules.push(rule.clone());
                        change = Some(RuleChange::Created);
                    }
                }
                s.log.push(format!("firewall-rule {}", rule.name));
            }
            change.unwrap_or(RuleChange::Unchanged)
        }))
    }
}

/// Takes one mutating call from the crash budget; past the budget the call fails as a dead
/// process would leave it: not made.
fn budget(s: &mut WorldState, call: &str) -> Result<(), RackError> {
    match &mut s.mutation_budget {
        // Not retryable: the "process" is gone, nothing after this point may reach the rack.
        Some(0) => {
            return Err(RackError::Unexpected {
                what: call.to_owned(),
                message: "simulated crash".into(),
            });
        }
        Some(n) => *n -= 1,
        None => {}
    }
    Ok(())
}

/// [`Cluster`] over the fake world.
#[derive(Debug, Clone)]
pub struct FakeCluster(pub FakeWorld);

impl FakeCluster {
    /// Changes a Node (NotFound if there is none) and logs `<verb> <node>`.
    fn edit_node(
        &self,
        node: &str,
        verb: &str,
        change: impl FnOnce(&mut Node),
    ) -> Result<(), ClusterError> {
        self.0.with(|s| {
            let n = s
                .nodes
                .get_mut(node)
                .ok_or_else(|| ClusterError::NotFound {
                    what: format!("node {node}"),
                })?;
            change(n);
            s.log.push(format!("{verb} {node}"));
            Ok(())
        })
    }
}

impl Cluster for FakeCluster {
    async fn list_nodes(&self) -> Result<Vec<Node>, ClusterError> {
        Ok(self.0.with(|s| {
            *s.reads.entry("list-nodes").or_default() += 1;
            s.nodes.values().cloned().collect()
        }))
    }

    async fn cordon(&self, node: &str) -> Result<(), ClusterError> {
        self.edit_node(node, "cordon", |n| n.unschedulable = true)
    }

    async fn mark_removing(&self, node: &str, reason: &str) -> Result<(), ClusterError> {
        self.edit_node(node, "mark-removing", |n| {
            n.unschedulable = true;
            n.annotations.insert(
                crate::domain::plan::REMOVING_ANNOTATION.to_owned(),
                reason.to_owned(),
            );
        })
    }

    async fn mark_restarted(
        &self,
        node: &str,
        at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), ClusterError> {
        self.edit_node(node, "mark-restarted", |n| {
            n.annotations.insert(
                crate::domain::model::RESTARTED_ANNOTATION.to_owned(),
                at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            );
        })
    }

    async fn certificate_events(
        &self,
    ) -> Result<Vec<crate::domain::certificates::MonitorEvent>, ClusterError> {
        Ok(self.0.with(|s| {
            *s.reads.entry("list-certificate-events").or_default() += 1;
            s.certificate_events.clone()
        }))
    }

    async fn mark_certificate_restart(
        &self,
        node: &str,
        value: &str,
        unschedulable: Option<bool>,
    ) -> Result<(), ClusterError> {
        self.edit_node(node, "mark-certificate-restart", |n| {
            n.annotations.insert(
                crate::domain::certificates::RESTART_ANNOTATION.to_owned(),
                value.to_owned(),
            );
            if let Some(u) = unschedulable {
                n.unschedulable = u;
            }
        })
    }

    async fn cancel_removal(&self, node: &str) -> Result<(), ClusterError> {
        self.edit_node(node, "cancel-removal", |n| {
            n.unschedulable = false;
            n.annotations
                .remove(crate::domain::plan::REMOVING_ANNOTATION);
        })
    }

    async fn delete_node(&self, node: &str) -> Result<(), ClusterError> {
        self.0.with(|s| {
            if s.held_nodes.contains(node) {
                s.log.push(format!("delete-node {node} (held)"));
                return Ok(());
            }
            s.nodes.remove(node);
            s.pods.retain(|p| p.node != node);
            s.log.push(format!("delete-node {node}"));
            Ok(())
        })
    }

    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodRef>, ClusterError> {
        Ok(self.0.with(|s| {
            s.pods
                .iter()
                .filter(|p| p.node == node)
                .map(|p| p.pod.clone())
                .collect()
        }))
    }

    async fn list_pods(&self) -> Result<Vec<crate::domain::model::Pod>, ClusterError> {
        Ok(self.0.with(|s| {
            s.pod_lists += 1;
            s.workload_pods.clone()
        }))
    }

    async fn list_pvs(&self) -> Result<Vec<crate::domain::model::PersistentVolume>, ClusterError> {
        Ok(self.0.with(|s| {
            s.pv_lists += 1;
            s.pvs.clone()
        }))
    }

    async fn list_pdbs(&self) -> Result<Vec<crate::domain::model::DisruptionBudget>, ClusterError> {
        Ok(self.0.with(|s| {
            s.pdb_lists += 1;
            s.pdbs.clone()
        }))
    }

    async fn evict(&self, pod: &PodRef) -> Result<Eviction, ClusterError> {
        Ok(self.0.with(|s| {
            match s
                .pods
                .iter()
                .position(|p| p.pod.namespace == pod.namespace && p.pod.name == pod.name)
            {
                None => Eviction::Gone,
                Some(i) if s.pods[i].protected => Eviction::BlockedByBudget,
                Some(i) if s.pods[i].refused.is_some() => {
                    Eviction::Refused(s.pods[i].refused.clone().unwrap_or_default())
                }
                Some(i) if s.pods[i].finalizer => {
                    let now = s.now;
                    s.pods[i].pod.deleting_at.get_or_insert(now);
                    s.log.push(format!("evict {}/{}", pod.namespace, pod.name));
                    Eviction::Evicted
                }
                Some(i) => {
                    s.pods.remove(i);
                    s.log.push(format!("evict {}/{}", pod.namespace, pod.name));
                    Eviction::Evicted
                }
            }
        }))
    }

    async fn delete_pod(&self, pod: &PodRef) -> Result<(), ClusterError> {
        self.0.with(|s| {
            s.pods
                .retain(|p| !(p.pod.namespace == pod.namespace && p.pod.name == pod.name));
            s.log
                .push(format!("delete-pod {}/{}", pod.namespace, pod.name));
            Ok(())
        })
    }

    async fn acquire_lease(
        &self,
        holder: &str,
        duration: Duration,
    ) -> Result<LeaseOutcome, ClusterError> {
        Ok(self.0.with(|s| {
            let until = s.now + chrono::Duration::from_std(duration).unwrap_or_default();
            match &s.lease {
                Some((h, exp)) if h != holder && *exp > s.now => LeaseOutcome::HeldBy {
                    holder: h.clone(),
                    until: Some(*exp),
                },
                _ => {
                    s.lease = Some((holder.to_owned(), until));
                    LeaseOutcome::Acquired
                }
            }
        }))
    }

    async fn lease_holder(&self) -> Result<Option<String>, ClusterError> {
        Ok(self.0.with(|s| match &s.lease {
            Some((h, exp)) if *exp > s.now && !h.is_empty() => Some(h.clone()),
            _ => None,
        }))
    }

    async fn renew_lease(&self, holder: &str, duration: Duration) -> Result<(), ClusterError> {
        self.0.with(|s| match &s.lease {
            _ if s.renew_failures > 0 => {
                s.renew_failures -= 1;
                Err(ClusterError::Unavailable {
                    what: "lease".into(),
                    message: "injected".into(),
                })
            }
            Some((h, _)) if h == holder => {
                s.lease = Some((
                    holder.to_owned(),
                    s.now + chrono::Duration::from_std(duration).unwrap_or_default(),
                ));
                Ok(())
            }
            _ => Err(ClusterError::Conflict {
                what: "lease".into(),
            }),
        })
    }

    async fn release_lease(&self, holder: &str) -> Result<(), ClusterError> {
        self.0.with(|s| {
            if s.release_failures > 0 {
                s.release_failures -= 1;
                return Err(ClusterError::Unavailable {
                    what: "lease".into(),
                    message: "injected".into(),
                });
            }
            if s.lease.as_ref().is_some_and(|(h, _)| h == holder) {
                s.lease = None;
            }
            Ok(())
        })
    }

    async fn record_event(
        &self,
        kind: EventType,
        reason: &str,
        message: &str,
    ) -> Result<(), ClusterError> {
        self.0
            .with(|s| s.events.push((kind, reason.to_owned(), message.to_owned())));
        Ok(())
    }

    async fn trigger_reconcile_job(&self) -> Result<JobTrigger, ClusterError> {
        Ok(self.0.with(|s| {
            if !s.cronjob {
                JobTrigger::NoCronJob
            } else if !s
                .jobs
                .insert(crate::ports::cluster::ON_DEMAND_JOB.to_owned())
            {
                JobTrigger::AlreadyPending
            } else {
                JobTrigger::Created
            }
        }))
    }

    async fn etcd_members(
        &self,
        server_token: &str,
    ) -> Result<Vec<crate::domain::model::EtcdMember>, ClusterError> {
        self.0.with(|s| {
            s.etcd_token_seen = Some(server_token.to_owned());
            match &s.etcd_members {
                Some(Ok(list)) => Ok(list.clone()),
                Some(Err(why)) => Err(ClusterError::Unavailable {
                    what: "GET /db/info".into(),
                    message: why.clone(),
                }),
                None => Ok(fake_etcd_members(s)),
            }
        })
    }
}

/// An empty `oxide-controller-scale` at resourceVersion `rv`, as bootstrap creates it.
pub fn empty_scale(rv: u64) -> ConfigSnapshot {
    ConfigSnapshot {
        resource_version: rv.to_string(),
        data: BTreeMap::from([(
            crate::domain::spec::scale::KEY.to_owned(),
            crate::domain::spec::scale::ScaleOverrides::default().to_json(),
        )]),
    }
}

/// k3s's own member list over the fake world: one voting member `<node>-<8 hex>` per server
/// Node (a Node labelled control-plane, or whose instance is tagged for the spec's
/// control-plane pool).
fn fake_etcd_members(s: &WorldState) -> Vec<crate::domain::model::EtcdMember> {
    let cp_pool = s
        .config
        .spec_yaml()
        .and_then(|y| crate::domain::spec::ClusterSpec::from_yaml(y).ok())
        .map(|spec| spec.control_plane.name);
    let is_server = |n: &Node| {
        n.labels
            .contains_key(crate::domain::plan::CONTROL_PLANE_LABEL)
            || s.instances.get(&n.name).is_some_and(|i| {
                crate::base::names::InstanceTag::parse(&i.description)
                    .is_some_and(|t| Some(&t.pool) == cp_pool.as_ref())
            })
    };
    s.nodes
        .values()
        .filter(|n| is_server(n))
        .zip(1u64..)
        .map(|(n, id)| crate::domain::model::EtcdMember {
            id,
            name: format!("{}-{:08x}", n.name, id),
            peer_urls: vec![format!("https://{}:2380", n.name)],
            client_urls: vec![format!("https://{}:2379", n.name)],
            is_learner: false,
        })
        .collect()
}

/// [`StateStore`] over the fake world, with resourceVersion conflicts like the real thing.
#[derive(Debug, Clone)]
pub struct FakeState(pub FakeWorld);

impl StateStore for FakeState {
    async fn read_config(&self) -> Result<ConfigSnapshot, StateError> {
        self.0.with(|s| {
            if s.config.resource_version.is_empty() {
                Err(StateError::NotFound {
                    what: "ConfigMap kube-system/oxide-controller".into(),
                })
            } else {
                Ok(s.config.clone())
            }
        })
    }

    async fn replace_config(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.0.with(|s| {
            if s.config.resource_version != rv {
                return Err(StateError::Conflict {
                    what: "ConfigMap kube-system/oxide-controller".into(),
                });
            }
            s.rv += 1;
            s.config = ConfigSnapshot {
                resource_version: s.rv.to_string(),
                data,
            };
            Ok(s.config.resource_version.clone())
        })
    }

    async fn read_secrets(&self) -> Result<ClusterSecrets, StateError> {
        self.0.with(|s| {
            s.secrets.clone().ok_or(StateError::NotFound {
                what: "Secret kube-system/oxide-controller".into(),
            })
        })
    }

    async fn ensure_state(
        &self,
        secrets: &ClusterSecrets,
        config: BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        self.0.with(|s| {
            if s.secrets.is_none() {
                s.secrets = Some(secrets.clone());
                s.create_calls.push("create-secret".to_owned());
            }
            if s.config.resource_version.is_empty() {
                s.create_calls.push("create-configmap".to_owned());
                s.rv += 1;
                s.config = ConfigSnapshot {
                    resource_version: s.rv.to_string(),
                    data: config,
                };
            } else {
                for (k, v) in config {
                    s.config.data.entry(k).or_insert(v);
                }
            }
            if s.scale.is_none() {
                s.create_calls.push("create-scale-configmap".to_owned());
                s.rv += 1;
                s.scale = Some(empty_scale(s.rv));
            }
            if s.backups.is_none() {
                s.create_calls.push("create-backup-configmap".to_owned());
                s.rv += 1;
                s.backups = Some(ConfigSnapshot {
                    resource_version: s.rv.to_string(),
                    data: BTreeMap::new(),
                });
            }
            Ok(())
        })
    }

    async fn read_backups(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        self.0.with(|s| {
            *s.reads.entry("get-backups").or_default() += 1;
            Ok(s.backups.clone())
        })
    }

    async fn replace_backups(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.0.with(|s| {
            let what = "ConfigMap kube-system/oxide-controller-backup";
            match &s.backups {
                None => return Err(StateError::NotFound { what: what.into() }),
                Some(now) if now.resource_version != rv => {
                    return Err(StateError::Conflict { what: what.into() });
                }
                Some(_) => {}
            }
            s.rv += 1;
            s.backups = Some(ConfigSnapshot {
                resource_version: s.rv.to_string(),
                data,
            });
            Ok(s.rv.to_string())
        })
    }

    async fn read_scale(&self) -> Result<Option<ConfigSnapshot>, StateError> {
        self.0.with(|s| {
            *s.reads.entry("get-scale").or_default() += 1;
            Ok(s.scale.clone())
        })
    }

    async fn replace_scale(
        &self,
        rv: &str,
        data: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        self.0.with(|s| {
            let what = "ConfigMap kube-system/oxide-controller-scale";
            match &s.scale {
                None => return Err(StateError::NotFound { what: what.into() }),
                Some(now) if now.resource_version != rv => {
                    return Err(StateError::Conflict { what: what.into() });
                }
                Some(_) => {}
            }
            s.rv += 1;
            s.scale = Some(ConfigSnapshot {
                resource_version: s.rv.to_string(),
                data,
            });
            Ok(s.rv.to_string())
        })
    }

    async fn set_ssh_public_key(&self, line: &str) -> Result<(), StateError> {
        self.0.with(|s| match s.secrets.as_mut() {
            Some(secrets) => {
                secrets.ssh_public_key = line.to_owned();
                Ok(())
            }
            None => Err(StateError::NotFound {
                what: "Secret kube-system/oxide-controller".into(),
            }),
        })
    }

    async fn rewrite_secret_keys(
        &self,
        set: &BTreeMap<String, Vec<u8>>,
    ) -> Result<crate::ports::state::SecretRewrite, StateError> {
        self.0.with(|s| {
            let what = || "Secret kube-system/oxide-controller".to_owned();
            let mut map = s
                .secrets
                .as_ref()
                .ok_or(StateError::NotFound { what: what() })?
                .to_map();
            let mut done = crate::ports::state::SecretRewrite::default();
            for (k, v) in set {
                if map.get(k) != Some(v) {
                    map.insert(k.clone(), v.clone());
                    done.changed.push(k.clone());
                }
            }
            // The fake keeps typed values only: it never holds a retired key.
            s.secrets =
                Some(
                    ClusterSecrets::from_map(&map).map_err(|e| StateError::Malformed {
                        what: what(),
                        message: e.to_string(),
                    })?,
                );
            Ok(done)
        })
    }

    async fn merge_host_key_pins(
        &self,
        pins: &BTreeMap<String, Vec<String>>,
    ) -> Result<BTreeMap<String, Vec<String>>, StateError> {
        self.0.with(|s| {
            if s.secrets.is_none() {
                return Err(StateError::NotFound {
                    what: "Secret kube-system/oxide-controller".into(),
                });
            }
            for (instance, fps) in pins {
                s.host_key_pins
                    .entry(instance.clone())
                    .or_insert_with(|| fps.clone());
            }
            Ok(s.host_key_pins.clone())
        })
    }

    async fn read_webhook_tls(
        &self,
    ) -> Result<Option<(String, crate::base::secrets::webhook::WebhookTls)>, StateError> {
        self.0.with(|s| {
            *s.reads.entry("get-webhook-tls").or_default() += 1;
            Ok(s.webhook_tls.clone().map(|(rv, t)| (rv.to_string(), t)))
        })
    }

    async fn read_webhook_ca(
        &self,
    ) -> Result<Option<crate::base::secrets::webhook::WebhookCa>, StateError> {
        self.0.with(|s| {
            *s.reads.entry("get-webhook-ca").or_default() += 1;
            Ok(s.webhook_ca.clone())
        })
    }

    async fn replace_webhook_tls(
        &self,
        resource_version: &str,
        tls: &crate::base::secrets::webhook::WebhookTls,
    ) -> Result<(), StateError> {
        self.0.with(|s| match &s.webhook_tls {
            Some((rv, _)) if rv.to_string() == resource_version => {
                s.rv += 1;
                s.webhook_tls = Some((s.rv, tls.clone()));
                s.log.push("replace-webhook-tls".to_owned());
                Ok(())
            }
            Some(_) => Err(StateError::Conflict {
                what: "Secret kube-system/oxide-controller-webhook-tls".into(),
            }),
            None => Err(StateError::NotFound {
                what: "Secret kube-system/oxide-controller-webhook-tls".into(),
            }),
        })
    }

    async fn ensure_webhook_tls(
        &self,
        tls: &crate::base::secrets::webhook::WebhookTls,
        ca: &crate::base::secrets::webhook::WebhookCa,
    ) -> Result<(), StateError> {
        self.0.with(|s| {
            if s.webhook_tls.is_none() {
                s.rv += 1;
                s.webhook_tls = Some((s.rv, tls.clone()));
            }
            s.webhook_ca.get_or_insert_with(|| ca.clone());
            Ok(())
        })
    }

    async fn read_webhook_tokens(
        &self,
    ) -> Result<Option<crate::base::secrets::webhook::WebhookTokens>, StateError> {
        self.0.with(|s| {
            *s.reads.entry("get-webhook-auth").or_default() += 1;
            if s.webhook_tokens_forbidden {
                return Err(StateError::Forbidden {
                    what: "Secret kube-system/oxide-controller-webhook-auth".into(),
                    message: "injected".into(),
                });
            }
            Ok(s.webhook_tokens.clone())
        })
    }

    /// The fake keeps typed values only: its cluster Secret never holds a moved key, so there
    /// is nothing to migrate here (the real store's migration: `tests/tests/state_store.rs`).
    async fn ensure_webhook_tokens(
        &self,
        tokens: &crate::base::secrets::webhook::WebhookTokens,
    ) -> Result<crate::base::secrets::webhook::WebhookTokens, StateError> {
        self.0.with(|s| {
            if s.webhook_tokens.is_none() {
                s.create_calls.push("create-webhook-auth".to_owned());
            }
            Ok(s.webhook_tokens
                .get_or_insert_with(|| tokens.clone())
                .clone())
        })
    }

    async fn replace_webhook_tokens(
        &self,
        tokens: &crate::base::secrets::webhook::WebhookTokens,
    ) -> Result<bool, StateError> {
        self.0.with(|s| {
            s.webhook_tokens = Some(tokens.clone());
            s.log.push("replace-webhook-auth".to_owned());
            Ok(false)
        })
    }
}

/// Instance names in the world that belong to `pool` of `cluster`.
pub fn pool_members(world: &FakeWorld, cluster: &str, pool: &str) -> Vec<String> {
    let prefix = names::instance_prefix(cluster, pool);
    world.with(|s| {
        s.instances
            .keys()
            .filter(|n| n.starts_with(&prefix))
            .cloned()
            .collect()
    })
}
