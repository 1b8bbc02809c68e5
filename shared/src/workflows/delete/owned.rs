//! What a cluster owns in its project, decided from one observation — pure, no I/O.
//!
//! Ownership is exact, never a name prefix alone: cluster `prod` must not touch cluster
//! `prod-2`'s `prod-2-workers-x`. The rules, each object with the reason it counts as owned:
//!
//! - instances whose description tag ([`InstanceTag`]) names the cluster, and its restore
//!   drills' servers ([`drill::server_description`]: a drill under way or left behind);
//! - disks attached to such an instance, named `boot-`/`data-` for one, or (orphans) carrying
//!   the cluster's tag in their own description (member disks are created with the
//!   instance's description, the drills' servers' theirs);
//! - the floating IP `<cluster>-apiserver` when its description is ours for this cluster
//!   (bootstrap and reconcile's repair write the same one; the text an older reconcile wrote is
//!   recognised too), and `<cluster>-drill-apiserver` with its drill's description;
//! - the Oxide CCM's floating IPs (description "Managed by oxide-cloud-controller-manager.",
//!   named `<cluster>-<namespace>-<service>`): the exact names computed from the cluster's
//!   LoadBalancer Services when its API answers, else by name prefix claimed by the longest
//!   cluster name known in the project (so `prod-2-default-web` stays `prod-2`'s);
//! - anti-affinity groups named in the spec, with our description, whose members are all
//!   the cluster's own instances (Oxide drops memberships on group delete, so a group another
//!   cluster's VMs still use is kept);
//! - temporary image-import disks marked with the cluster, and snapshots taken of them;
//! - with `--delete-images`, project images marked as uploaded for the cluster;
//! - with `--delete-backups`, the cluster's backups (snapshots whose description tags them
//!   for it, [`crate::domain::backup::BackupTag`]); without it they stay, each with a note;
//! - with `--delete-project`, the project, only when nothing else is left in it.
//!
//! Everything of the cluster's name that is *not* taken gets a note saying why it stays.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use uuid::Uuid;

use crate::adapters::image::import_disk_cluster;
use crate::base::names::{self, InstanceTag};
use crate::domain::backup::drill;
use crate::domain::model::{
    AntiAffinityGroup, Disk, DiskState, FloatingIp, Image, Instance, InstanceState, Snapshot,
};

/// Description the Oxide CCM gives the floating IPs it creates
/// (oxide-cloud-controller-manager `internal/provider/load_balancer.go`, `createFloatingIP`).
pub const CCM_FLOATING_IP_DESCRIPTION: &str = "Managed by oxide-cloud-controller-manager.";
use crate::base::names::{ANTI_AFFINITY_GROUP_DESCRIPTION as GROUP_DESCRIPTION, DEFAULT_VPC};

/// Kinds of object, in the order they are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Instance,
    Disk,
    FloatingIp,
    Snapshot,
    ImportDisk,
    AntiAffinityGroup,
    FirewallRule,
    Image,
    Project,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Instance => "instance",
            Kind::Disk => "disk",
            Kind::FloatingIp => "floating IP",
            Kind::Snapshot => "snapshot",
            Kind::ImportDisk => "import disk",
            Kind::AntiAffinityGroup => "anti-affinity group",
            Kind::FirewallRule => "firewall rule",
            Kind::Image => "image",
            Kind::Project => "project",
        }
    }
}

/// One object to delete and why it is the cluster's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Item {
    pub kind: Kind,
    pub name: String,
    pub reason: String,
    /// For disks: the instance they belong to (deleted right after it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

/// Something that looks related but stays, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kept {
    pub kind: Kind,
    pub name: String,
    pub why: String,
}

/// One observation of the project (all pages of everything).
#[derive(Debug, Clone, Default)]
pub struct ObservedProject {
    pub exists: bool,
    pub instances: Vec<Instance>,
    pub disks: Vec<Disk>,
    pub floating_ips: Vec<FloatingIp>,
    /// Project images only.
    pub images: Vec<Image>,
    pub snapshots: Vec<Snapshot>,
    pub groups: Vec<AntiAffinityGroup>,
    /// Members of the groups that are candidates (named in the spec, ours by description).
    pub group_members: BTreeMap<String, Vec<String>>,
    pub vpcs: Vec<String>,
    /// Subnets of VPC `default` (read only with `--delete-project`).
    pub subnets: Vec<String>,
    /// Affinity groups (read only with `--delete-project`; oxide-controller makes none).
    pub affinity_groups: Vec<String>,
    /// Names of the default VPC's firewall rules; `None` while they cannot be read (the
    /// project is then never deleted: removing the VPC would take someone's rules with it).
    pub firewall_rules: Option<Vec<String>>,
}

/// The rules Oxide gives every new project's default VPC (omicron `nexus/defaults`): they go
/// with the VPC and are nobody's to keep.
pub const DEFAULT_FIREWALL_RULES: [&str; 3] = ["allow-internal-inbound", "allow-ssh", "allow-icmp"];

/// What the caller knows beyond the project.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub cluster: String,
    /// Anti-affinity groups the spec names; `None` when the spec is unknown.
    pub spec_groups: Option<BTreeSet<String>>,
    /// Exact CCM floating-IP names from the cluster's LoadBalancer Services (API answered).
    pub ccm_floating_ips: BTreeSet<String>,
    pub delete_images: bool,
    /// Also the cluster's backups (snapshots tagged `oxide-controller backup cluster=<c>`).
    pub delete_backups: bool,
    pub delete_project: bool,
}

/// The decision: what goes (in removal order) and what stays.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Inventory {
    pub items: Vec<Item>,
    pub kept: Vec<Kept>,
    /// The observed state of each instance item (where removing it starts).
    #[serde(skip)]
    pub instance_states: BTreeMap<String, InstanceState>,
}

impl Inventory {
    /// Nothing of the cluster is left on the rack.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(move |i| i.kind == kind)
    }
}

/// The CCM's name for a LoadBalancer Service's floating IP (`GetLoadBalancerName`:
/// `<cluster>-<namespace>-<service>`, cut to 63 characters, trailing `-` trimmed).
pub fn ccm_floating_ip_name(cluster: &str, namespace: &str, service: &str) -> String {
    let mut name = format!("{cluster}-{namespace}-{service}");
    name.truncate(names::MAX_NAME_LEN);
    name.trim_end_matches('-').to_owned()
}

/// Cluster names that appear in the project: instance tags, `<c>-apiserver` floating IPs with
/// our description, image and import marks.
fn known_clusters(obs: &ObservedProject) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = obs
        .instances
        .iter()
        .filter_map(|i| InstanceTag::parse(&i.description).map(|t| t.cluster))
        .collect();
    for f in &obs.floating_ips {
        if let Some(c) = f.name.strip_suffix("-apiserver")
            && api_fip_description_cluster(&f.description) == Some(c)
        {
            out.insert(c.to_owned());
        }
    }
    out.extend(
        obs.images
            .iter()
            .filter_map(|i| names::uploaded_image_cluster(&i.description).map(str::to_owned)),
    );
    out
}

/// `oxide-controller cluster=<c> ...` (bootstrap's API floating IP) → `c`.
fn api_fip_description_cluster(description: &str) -> Option<&str> {
    description
        .strip_prefix("oxide-controller cluster=")?
        .split_whitespace()
        .next()
}

/// Decides what the cluster owns. See the module docs for the rules.
pub fn inventory(scope: &Scope, obs: &ObservedProject) -> Inventory {
    let cluster = scope.cluster.as_str();
    let prefix = names::cluster_prefix(cluster);
    let mut inv = Inventory::default();
    if !obs.exists {
        return inv;
    }
    let ours = take_instances(cluster, &prefix, obs, &mut inv);
    let our_names: BTreeSet<&str> = ours.values().map(|i| i.name.as_str()).collect();
    let import_disks = take_disks(cluster, &prefix, obs, &ours, &our_names, &mut inv);
    take_import_snapshots(cluster, obs, &import_disks, &mut inv);
    take_backups(scope, obs, &mut inv);
    take_floating_ips(scope, &prefix, obs, &ours, &mut inv);
    take_anti_affinity_groups(scope, obs, &our_names, &mut inv);
    take_api_firewall_rule(cluster, obs, &mut inv);
    take_images(scope, obs, &mut inv);
    if scope.delete_project {
        take_project(obs, &mut inv);
    }
    inv.items
        .sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    inv
}

impl Inventory {
    /// Notes something of the cluster's name that stays, and why.
    fn keep(&mut self, kind: Kind, name: &str, why: String) {
        self.kept.push(Kept {
            kind,
            name: name.to_owned(),
            why,
        })
    }
}

/// Instances tagged for the cluster; returns them by id.
fn take_instances<'o>(
    cluster: &str,
    prefix: &str,
    obs: &'o ObservedProject,
    inv: &mut Inventory,
) -> BTreeMap<Uuid, &'o Instance> {
    let mut ours: BTreeMap<Uuid, &Instance> = BTreeMap::new();
    for i in &obs.instances {
        match InstanceTag::parse(&i.description) {
            Some(t) if t.cluster == cluster => {
                ours.insert(i.id, i);
                inv.instance_states.insert(i.name.clone(), i.state.clone());
                inv.items.push(Item {
                    kind: Kind::Instance,
                    name: i.name.clone(),
                    reason: format!("tagged cluster={cluster} pool={}", t.pool),
                    instance: None,
                });
            }
            None if drill::server_of(&i.description) == Some(cluster) => {
                ours.insert(i.id, i);
                inv.instance_states.insert(i.name.clone(), i.state.clone());
                inv.items.push(Item {
                    kind: Kind::Instance,
                    name: i.name.clone(),
                    reason: format!("a restore drill's server of cluster {cluster}"),
                    instance: None,
                });
            }
            Some(t) if i.name.starts_with(prefix) => inv.keep(
                Kind::Instance,
                &i.name,
                format!("tagged for cluster {}", t.cluster),
            ),
            None if i.name.starts_with(prefix) => inv.keep(
                Kind::Instance,
                &i.name,
                "no oxide-controller tag in its description".into(),
            ),
            _ => {}
        }
    }
    ours
}

/// Disks: member disks, orphans with our tag, import leftovers with our mark. Returns the
/// ids of the import disks taken.
fn take_disks(
    cluster: &str,
    prefix: &str,
    obs: &ObservedProject,
    ours: &BTreeMap<Uuid, &Instance>,
    our_names: &BTreeSet<&str>,
    inv: &mut Inventory,
) -> BTreeSet<Uuid> {
    let mut import_disks: BTreeSet<Uuid> = BTreeSet::new();
    for d in &obs.disks {
        let attached_to = match d.state {
            DiskState::Attached(id) => ours.get(&id).map(|i| i.name.clone()),
            _ => None,
        };
        let named_for = names::disk_owner(&d.name)
            .filter(|o| our_names.contains(o))
            .map(str::to_owned);
        let tag = InstanceTag::parse(&d.description).filter(|t| t.cluster == cluster);
        // Attached to a cluster VM but neither its boot/data disk nor tagged for the cluster:
        // a volume someone attached by hand. Deleting the VM detaches it; it stays.
        if let (Some(inst), None, None) = (&attached_to, &named_for, &tag) {
            inv.keep(
                Kind::Disk,
                &d.name,
                format!(
                    "attached to instance {inst} but not one of its disks (attached by hand?); it is detached when the instance goes"
                ),
            );
            continue;
        }
        if let Some(inst) = attached_to.clone().or(named_for.clone()) {
            let how = if attached_to.is_some() {
                "attached to"
            } else {
                "named for"
            };
            inv.items.push(Item {
                kind: Kind::Disk,
                name: d.name.clone(),
                reason: format!("{how} instance {inst}"),
                instance: Some(inst),
            });
        } else if let Some(t) = tag {
            inv.items.push(Item {
                kind: Kind::Disk,
                name: d.name.clone(),
                reason: format!(
                    "orphaned member disk tagged cluster={cluster} pool={}",
                    t.pool
                ),
                instance: None,
            });
        } else if drill::server_of(&d.description) == Some(cluster) {
            inv.items.push(Item {
                kind: Kind::Disk,
                name: d.name.clone(),
                reason: format!("orphaned disk of a restore drill's server of cluster {cluster}"),
                instance: None,
            });
        } else if import_disk_cluster(&d.description) == Some(cluster) {
            import_disks.insert(d.id);
            inv.items.push(Item {
                kind: Kind::ImportDisk,
                name: d.name.clone(),
                reason: format!("leftover image import marked cluster={cluster}"),
                instance: None,
            });
        } else if names::disk_owner(&d.name).is_some_and(|o| o.starts_with(prefix)) {
            inv.keep(
                Kind::Disk,
                &d.name,
                "neither attached to nor tagged for this cluster".into(),
            );
        }
    }
    import_disks
}

/// Snapshots taken of the cluster's import disks.
fn take_import_snapshots(
    cluster: &str,
    obs: &ObservedProject,
    import_disks: &BTreeSet<Uuid>,
    inv: &mut Inventory,
) {
    for s in &obs.snapshots {
        if import_disks.contains(&s.disk_id) {
            inv.items.push(Item {
                kind: Kind::Snapshot,
                name: s.name.clone(),
                reason: format!("taken of this cluster's import disk (cluster={cluster})"),
                instance: None,
            });
        }
    }
}

/// The cluster's backups (their description's tag names it): taken with `--delete-backups`,
/// else kept with a note. A backup is what brings the cluster back after this very delete.
fn take_backups(scope: &Scope, obs: &ObservedProject, inv: &mut Inventory) {
    let backups = crate::domain::backup::of_cluster(
        &scope.cluster,
        obs.snapshots
            .iter()
            .map(|s| (s.name.as_str(), s.description.as_str())),
    );
    for b in backups {
        if scope.delete_backups {
            inv.items.push(Item {
                kind: Kind::Snapshot,
                name: b.name,
                reason: format!(
                    "a backup of cluster {} taken {}",
                    scope.cluster,
                    b.tag
                        .time
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                instance: None,
            });
        } else {
            inv.keep(
                Kind::Snapshot,
                &b.name,
                format!(
                    "a backup of this cluster taken {} (bootstrap recover --backup restores it); pass --delete-backups to remove it",
                    b.tag.time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            );
        }
    }
}

/// Floating IPs: the API address by its exact name, then the Oxide CCM's.
fn take_floating_ips(
    scope: &Scope,
    prefix: &str,
    obs: &ObservedProject,
    ours: &BTreeMap<Uuid, &Instance>,
    inv: &mut Inventory,
) {
    let cluster = scope.cluster.as_str();
    let api = names::api_floating_ip_name(cluster);
    let clusters = known_clusters(obs);
    let drill_api = names::api_floating_ip_name(&format!("{cluster}-drill"));
    for f in &obs.floating_ips {
        if f.name == api {
            take_api_floating_ip(cluster, f, inv);
            continue;
        }
        if f.name == drill_api && f.description == drill::address_description(cluster) {
            inv.items.push(Item {
                kind: Kind::FloatingIp,
                name: f.name.clone(),
                reason: "the address of the cluster's restore drill".into(),
                instance: None,
            });
            continue;
        }
        if f.description != CCM_FLOATING_IP_DESCRIPTION || !f.name.starts_with(prefix) {
            continue;
        }
        let on_foreign = f.instance_id.is_some_and(|id| !ours.contains_key(&id))
            && f.instance_id
                .is_some_and(|id| obs.instances.iter().any(|i| i.id == id));
        let claimed_by = clusters
            .iter()
            .filter(|c| c.len() > cluster.len() && f.name.starts_with(&names::cluster_prefix(c)))
            .max_by_key(|c| c.len());
        if scope.ccm_floating_ips.contains(&f.name) {
            inv.items.push(Item {
                kind: Kind::FloatingIp,
                name: f.name.clone(),
                reason: "the Oxide CCM's address of one of the cluster's LoadBalancer Services"
                    .into(),
                instance: None,
            });
        } else if let Some(other) = claimed_by {
            inv.keep(
                Kind::FloatingIp,
                &f.name,
                format!("an Oxide CCM address of cluster {other}"),
            );
        } else if on_foreign {
            inv.keep(
                Kind::FloatingIp,
                &f.name,
                "an Oxide CCM address attached to a VM of another cluster".into(),
            );
        } else {
            inv.items.push(Item {
                kind: Kind::FloatingIp,
                name: f.name.clone(),
                reason: format!(
                    "made by the Oxide CCM and named {prefix}… (no other cluster in the project claims it)"
                ),
                instance: None,
            });
        }
    }
}

/// The floating IP named `<cluster>-apiserver`: taken when its description is ours.
fn take_api_floating_ip(cluster: &str, f: &FloatingIp, inv: &mut Inventory) {
    if api_fip_description_cluster(&f.description) == Some(cluster)
        || f.description == names::LEGACY_RECONCILE_API_FIP_DESCRIPTION
    {
        inv.items.push(Item {
            kind: Kind::FloatingIp,
            name: f.name.clone(),
            reason: "the cluster's API address, made by bootstrap or reconcile".into(),
            instance: None,
        });
    } else {
        inv.keep(
            Kind::FloatingIp,
            &f.name,
            "has the API address's name but not bootstrap's description".into(),
        );
    }
}

/// Anti-affinity groups named in the spec, ours by description, holding only our VMs.
fn take_anti_affinity_groups(
    scope: &Scope,
    obs: &ObservedProject,
    our_names: &BTreeSet<&str>,
    inv: &mut Inventory,
) {
    let Some(spec_groups) = &scope.spec_groups else {
        for g in obs
            .groups
            .iter()
            .filter(|g| g.description == GROUP_DESCRIPTION)
        {
            inv.keep(
                Kind::AntiAffinityGroup,
                &g.name,
                "the cluster's spec is unknown (no API, no spec in the resume file), so it cannot be told whose group this is".into(),
            );
        }
        return;
    };
    for g in obs.groups.iter().filter(|g| spec_groups.contains(&g.name)) {
        if g.description != GROUP_DESCRIPTION {
            inv.keep(
                Kind::AntiAffinityGroup,
                &g.name,
                "named in the spec but not created by oxide-controller".into(),
            );
            continue;
        }
        let foreign: Vec<&String> = obs
            .group_members
            .get(&g.name)
            .into_iter()
            .flatten()
            .filter(|m| !our_names.contains(m.as_str()))
            .collect();
        if foreign.is_empty() {
            inv.items.push(Item {
                kind: Kind::AntiAffinityGroup,
                name: g.name.clone(),
                reason: "named in the cluster's spec, made by oxide-controller".into(),
                instance: None,
            });
        } else {
            inv.keep(
                Kind::AntiAffinityGroup,
                &g.name,
                format!(
                    "still holds VMs of others: {}",
                    foreign
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }
}

/// The firewall rules bootstrap and reconcile make for the cluster, by their exact names:
/// the API rule, the SSH rules and the member rules. nexus's defaults were never changed
/// (ours narrow them from ahead), so removing ours restores what they admit.
fn take_api_firewall_rule(cluster: &str, obs: &ObservedProject, inv: &mut Inventory) {
    let api = crate::domain::firewall::api_rule_name(cluster);
    for rule in crate::domain::firewall::owned_rule_names(cluster) {
        if obs.firewall_rules.iter().flatten().any(|r| *r == rule) {
            let reason = if rule == api {
                "bootstrap's Kubernetes API rule for this cluster"
            } else {
                "bootstrap's SSH or member rule for this cluster"
            };
            inv.items.push(Item {
                kind: Kind::FirewallRule,
                name: rule,
                reason: reason.into(),
                instance: None,
            });
        }
    }
}

/// Images marked as uploaded for the cluster. One another cluster in the project found by
/// name (and never marked) may still be what its members boot from: its replacements would
/// need it. Runs after the disks are decided.
fn take_images(scope: &Scope, obs: &ObservedProject, inv: &mut Inventory) {
    let cluster = scope.cluster.as_str();
    let going: BTreeSet<String> = inv
        .items
        .iter()
        .filter(|it| it.kind == Kind::Disk)
        .map(|it| it.name.clone())
        .collect();
    for i in &obs.images {
        if names::uploaded_image_cluster(&i.description) != Some(cluster) {
            continue;
        }
        let still_used = obs
            .disks
            .iter()
            .find(|d| d.image_id == Some(i.id) && !going.contains(&d.name));
        if let (true, Some(d)) = (scope.delete_images, still_used) {
            inv.keep(
                Kind::Image,
                &i.name,
                format!(
                    "disk {} (not this cluster's) was created from it; whatever boots from it may need it again",
                    d.name
                ),
            );
        } else if scope.delete_images {
            inv.items.push(Item {
                kind: Kind::Image,
                name: i.name.clone(),
                reason: format!("uploaded by bootstrap for cluster {cluster}"),
                instance: None,
            });
        } else {
            inv.keep(
                Kind::Image,
                &i.name,
                "uploaded for this cluster; pass --delete-images to remove it".into(),
            );
        }
    }
}

/// With `--delete-project`: the project, when nothing else is left in it. Runs last.
fn take_project(obs: &ObservedProject, inv: &mut Inventory) {
    let left = leftovers(obs, inv);
    if left.is_empty() {
        inv.items.push(Item {
            kind: Kind::Project,
            name: String::new(),
            reason: "--delete-project, and nothing else is left in it".into(),
            instance: None,
        });
    } else {
        inv.keep(
            Kind::Project,
            "",
            format!("it still holds {}", left.join(", ")),
        );
    }
}

/// What would remain in the project after every item is gone.
pub(crate) fn leftovers(obs: &ObservedProject, inv: &Inventory) -> Vec<String> {
    let taken: BTreeSet<(Kind, &str)> = inv
        .items
        .iter()
        .map(|i| {
            let k = if i.kind == Kind::ImportDisk {
                Kind::Disk
            } else {
                i.kind
            };
            (k, i.name.as_str())
        })
        .collect();
    let mut left = Vec::new();
    let mut note = |kind: Kind, name: &str| {
        if !taken.contains(&(kind, name)) {
            left.push(format!("{} {name}", kind.label()));
        }
    };
    obs.instances
        .iter()
        .for_each(|i| note(Kind::Instance, &i.name));
    obs.disks.iter().for_each(|d| note(Kind::Disk, &d.name));
    obs.floating_ips
        .iter()
        .for_each(|f| note(Kind::FloatingIp, &f.name));
    obs.snapshots
        .iter()
        .for_each(|s| note(Kind::Snapshot, &s.name));
    obs.groups
        .iter()
        .for_each(|g| note(Kind::AntiAffinityGroup, &g.name));
    obs.images.iter().for_each(|i| note(Kind::Image, &i.name));
    for g in &obs.affinity_groups {
        left.push(format!("affinity group {g}"));
    }
    for v in obs.vpcs.iter().filter(|v| v.as_str() != DEFAULT_VPC) {
        left.push(format!("VPC {v}"));
    }
    for n in obs.subnets.iter().filter(|n| n.as_str() != DEFAULT_VPC) {
        left.push(format!("subnet {n} of VPC {DEFAULT_VPC}"));
    }
    match &obs.firewall_rules {
        Some(rules) => left.extend(
            rules
                .iter()
                .filter(|r| !DEFAULT_FIREWALL_RULES.contains(&r.as_str()))
                .filter(|r| !taken.contains(&(Kind::FirewallRule, r.as_str())))
                .map(|r| format!("firewall rule {r}")),
        ),
        None => left.push("firewall rules that could not be read".into()),
    }
    left
}

/// Whether an instance must be stopped before Oxide deletes it, and whether asking is
/// allowed now (stop is refused while `creating`).
pub fn needs_stop(state: &InstanceState) -> bool {
    !state.is_deletable() && !matches!(state, InstanceState::Stopping | InstanceState::Creating)
}
