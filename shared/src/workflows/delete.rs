//! `bootstrap delete`: remove a cluster from the rack with one command, leaving nothing of it
//! behind and touching nothing else.
//!
//! The flow, each step idempotent and logged with a stable `step=<name>` field:
//!
//! 1. `validate` — names, paths, credentials, the resume file, and the confirmation mode,
//!    before any request (no terminal and no `--yes`: refused, exit 2);
//! 2. `observe` — the cluster's API when it answers (spec, LoadBalancer Services) and every
//!    object of the project; [`owned::inventory`] decides what is the cluster's and why;
//! 3. `confirm` — the person types the cluster name (skipped with `--yes`); `--dry-run`
//!    stops here, having made no mutating request;
//! 4. `quiesce` — when the API answers: the reconcile Lease, the CronJob suspended, the
//!    webhook scaled to zero ([`in_cluster`]), then the project is observed again so a VM a
//!    last reconcile made is not missed;
//! 5. `instances` — each instance stopped, awaited, deleted, then its disks, with bounded
//!    concurrency (each instance runs its own chain, so one slow stop holds up nobody);
//! 6. `leftovers` — orphaned disks, floating IPs, snapshots then import disks, anti-affinity
//!    groups, images (`--delete-images`), the project (`--delete-project`);
//! 7. `local` — the kubeconfig context bootstrap wrote, then the resume file: last, because a
//!    re-run after a kill needs them to find the project and the API.
//!
//! Crash safety: nothing is remembered between runs; every run observes afresh, "not found"
//! counts as done, and the local files go only after the rack holds nothing of the cluster.

pub mod in_cluster;
pub mod owned;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt as _;
use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::adapters::credentials::{self, CredentialSources};
use crate::adapters::kubeconfig::{self, RemoveOutcome};
use crate::adapters::resume::{self, ResumeState};
use crate::base::names;
use crate::domain::model::InstanceState;
use crate::domain::spec::ClusterSpec;
use crate::ports::rack::{Rack, RackError};
use crate::workflows::error::{self, message};

pub use crate::workflows::error::WorkflowError as DeleteError;
pub use in_cluster::{InCluster, KubeInCluster};
pub use owned::{Inventory, Item, Kept, Kind, ObservedProject, Scope};

/// Default number of instances removed at once.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// How the person confirms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    /// `--yes`: no question.
    Yes,
    /// Ask on the terminal; refuse without one.
    Ask,
}

/// Everything `bootstrap delete` is told, unchecked.
#[derive(Debug, Clone)]
pub struct DeleteInput {
    pub credential_sources: CredentialSources,
    pub cluster: String,
    /// Default: the resume file's project, else the cluster name.
    pub project: Option<String>,
    /// Default `~/.kube/<cluster>.yaml`.
    pub kubeconfig: Option<PathBuf>,
    /// Default `~/.config/oxide-controller`.
    pub state_dir: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub dry_run: bool,
    pub confirm: Confirm,
    pub delete_images: bool,
    /// Also delete the cluster's backups (kept by default).
    pub delete_backups: bool,
    pub delete_project: bool,
    pub concurrency: usize,
    /// How long to wait for instances to stop and disks to detach (per run).
    pub timeout: Duration,
    /// Lease holder identity (stable per machine, so a re-run takes over its own Lease).
    pub holder: String,
    pub json_logs: bool,
}

/// Rack errors: bad credentials are the person's to fix (exit 2); the rest is worth a
/// re-run (exit 1).
fn rack_failed(step: &'static str, e: RackError) -> DeleteError {
    match e {
        RackError::Unauthorized { .. } => DeleteError::needs_person(step, e),
        _ => DeleteError::step(step, e),
    }
}

/// Knobs of the removal itself (tests and benchmarks shorten them).
#[derive(Debug, Clone, Copy)]
pub struct RemoveOptions {
    pub concurrency: usize,
    /// Pause between looks at an instance that is stopping or a disk that is detaching.
    pub poll: Duration,
    /// Give up waiting after this long (the run fails; a re-run continues).
    pub timeout: Duration,
}

impl Default for RemoveOptions {
    fn default() -> Self {
        RemoveOptions {
            concurrency: DEFAULT_CONCURRENCY,
            poll: Duration::from_millis(500),
            timeout: Duration::from_secs(600),
        }
    }
}

/// One object's fate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Deleted,
    /// Someone (an earlier run, Oxide itself) removed it first.
    AlreadyGone,
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct DeleteSummary {
    pub cluster: String,
    pub project: String,
    pub dry_run: bool,
    /// The inventory the run acted on (the dry run's list).
    pub inventory: Inventory,
    pub removed: Vec<(Item, Outcome)>,
    /// In-cluster steps taken (or, dry, that would be taken).
    pub in_cluster: Vec<String>,
    /// Local files changed (or, dry, that would be).
    pub local: Vec<String>,
    /// Nothing of the cluster was found anywhere.
    pub already_gone: bool,
    #[serde(skip)]
    pub elapsed: Duration,
}

impl DeleteSummary {
    /// The text printed on stdout at the end.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let (c, p) = (&self.cluster, &self.project);
        if self.already_gone {
            let _ = writeln!(
                s,
                "Cluster {c} is already gone: nothing of it is left in project {p}."
            );
            render_kept(&mut s, &self.inventory);
            return s;
        }
        if self.dry_run {
            let _ = writeln!(
                s,
                "Dry run: would delete {} object(s) of cluster {c} in project {p}:",
                self.inventory.items.len()
            );
            for i in &self.inventory.items {
                let _ = writeln!(s, "  {}", item_line(i));
            }
            for l in &self.in_cluster {
                let _ = writeln!(s, "  would: {l}");
            }
            for l in &self.local {
                let _ = writeln!(s, "  would: {l}");
            }
        } else {
            let deleted = self
                .removed
                .iter()
                .filter(|(_, o)| *o == Outcome::Deleted)
                .count();
            let _ = writeln!(
                s,
                "Deleted cluster {c} from project {p} after {}s: {deleted} object(s) removed, {} already gone.",
                self.elapsed.as_secs(),
                self.removed.len() - deleted
            );
            let mut by_kind: BTreeMap<Kind, usize> = BTreeMap::new();
            for (i, _) in &self.removed {
                *by_kind.entry(i.kind).or_default() += 1;
            }
            for (k, n) in by_kind {
                let _ = writeln!(s, "  {:<20} {n}", k.label());
            }
            for l in self.in_cluster.iter().chain(&self.local) {
                let _ = writeln!(s, "  {l}");
            }
        }
        render_kept(&mut s, &self.inventory);
        s
    }
}

fn item_line(i: &Item) -> String {
    let name = if i.kind == Kind::Project {
        "(the project)"
    } else {
        i.name.as_str()
    };
    format!("{:<20} {:<40} {}", i.kind.label(), name, i.reason)
}

fn render_kept(s: &mut String, inv: &Inventory) {
    use std::fmt::Write as _;
    if inv.kept.is_empty() {
        return;
    }
    let _ = writeln!(s, "Kept (not this cluster's, or not asked for):");
    for k in &inv.kept {
        let name = if k.kind == Kind::Project {
            "(the project)"
        } else {
            k.name.as_str()
        };
        let _ = writeln!(s, "  {:<20} {:<40} {}", k.kind.label(), name, k.why);
    }
}

/// Checked input.
struct Validated {
    project: String,
    host: String,
    token: String,
    kubeconfig: PathBuf,
    resume_path: PathBuf,
    resume: Option<ResumeState>,
}

fn validate(input: &DeleteInput) -> Result<Validated, DeleteError> {
    names::validate_name("cluster name", &input.cluster)
        .map_err(|e| DeleteError::input("--cluster", e))?;
    if !(1..=64).contains(&input.concurrency) {
        return Err(DeleteError::input(
            "--concurrency",
            message(format!("{} is outside 1..=64", input.concurrency)),
        ));
    }
    if input.timeout.is_zero() {
        return Err(DeleteError::input(
            "--timeout",
            message("must be at least 1 second"),
        ));
    }
    if !input.dry_run && input.confirm == Confirm::Ask && !std::io::stdin().is_terminal() {
        return Err(DeleteError::inputs(message(
            "refusing to delete without a terminal to confirm on: pass --yes (or --dry-run to only list)",
        )));
    }
    let paths = crate::workflows::local::local_paths(
        &input.cluster,
        input.state_dir.as_deref(),
        input.kubeconfig.as_deref(),
        input.home.as_deref(),
    )?;
    let resume_path = paths.resume;
    let resume =
        resume::load_for_cluster(&resume_path, &input.cluster).map_err(DeleteError::inputs)?;
    let project = match (&input.project, &resume) {
        (Some(p), Some(r)) if *p != r.project => {
            return Err(DeleteError::inputs(message(format!(
                "--project {p}: the resume file {} says cluster {} lives in project {}; pass --project {} (or none)",
                resume_path.display(),
                input.cluster,
                r.project,
                r.project
            ))));
        }
        (Some(p), _) => p.clone(),
        (None, Some(r)) => r.project.clone(),
        (None, None) => input.cluster.clone(),
    };
    names::validate_name("project name", &project)
        .map_err(|e| DeleteError::input("--project", e))?;
    let kubeconfig = paths.kubeconfig;
    let creds = credentials::resolve(&input.credential_sources).map_err(DeleteError::inputs)?;
    Ok(Validated {
        project,
        host: creds.host.clone(),
        token: creds.token.expose().to_owned(),
        kubeconfig,
        resume_path,
        resume,
    })
}

/// The ports a delete uses, handed in by the binary (the live one is
/// [`crate::workflows::live::LiveConnect`]).
pub trait Connect: Send + Sync {
    type Rack: Rack;
    type InCluster: InCluster;
    /// The rack, for `project`, with these credentials (no I/O).
    fn rack(&self, host: &str, token: &str, project: &str) -> Result<Self::Rack, RackError>;
    /// The cluster's API through context `cluster` of the kubeconfig at `kubeconfig`, when it
    /// answers; `Err` says why not (the delete then works from Oxide alone).
    fn in_cluster(
        &self,
        kubeconfig: &std::path::Path,
        cluster: &str,
    ) -> impl std::future::Future<Output = Result<Self::InCluster, String>> + Send;
}

/// Runs the whole flow on the ports `connect` opens. See the module docs.
pub async fn run<C: Connect>(
    input: DeleteInput,
    connect: &C,
) -> Result<DeleteSummary, DeleteError> {
    let started = Instant::now();
    info!(step = "validate", cluster = %input.cluster, "validating the input");
    let v = validate(&input)?;
    let rack = connect
        .rack(&v.host, &v.token, &v.project)
        .map_err(DeleteError::inputs)?;

    info!(step = "observe", kubeconfig = %v.kubeconfig.display(), "looking for the cluster's API");
    let api = match connect.in_cluster(&v.kubeconfig, &input.cluster).await {
        Ok(api) => Some(api),
        Err(why) => {
            info!(step = "observe", %why, "working from Oxide alone");
            None
        }
    };
    let resume_spec = v
        .resume
        .as_ref()
        .and_then(|r| r.spec.as_deref())
        .and_then(|t| ClusterSpec::from_yaml(t).ok());
    let opts = RemoveOptions {
        concurrency: input.concurrency,
        timeout: input.timeout,
        ..RemoveOptions::default()
    };
    let local = LocalFiles {
        kubeconfig: v.kubeconfig.clone(),
        resume: v.resume_path.clone(),
    };
    let params = Params {
        cluster: &input.cluster,
        project: &v.project,
        dry_run: input.dry_run,
        confirm: input.confirm,
        delete_images: input.delete_images,
        delete_backups: input.delete_backups,
        delete_project: input.delete_project,
        holder: &input.holder,
        tty: !input.json_logs && std::io::stderr().is_terminal(),
    };
    let mut summary = run_with(&rack, api.as_ref(), resume_spec, &params, &opts, &local).await?;
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// The local files bootstrap wrote for the cluster.
#[derive(Debug, Clone)]
pub struct LocalFiles {
    pub kubeconfig: PathBuf,
    pub resume: PathBuf,
}

/// The decisions of one run, checked.
#[derive(Debug, Clone)]
pub struct Params<'a> {
    pub cluster: &'a str,
    pub project: &'a str,
    pub dry_run: bool,
    pub confirm: Confirm,
    pub delete_images: bool,
    pub delete_backups: bool,
    pub delete_project: bool,
    pub holder: &'a str,
    /// Draw progress in place on stderr (else log lines).
    pub tty: bool,
}

/// Observes and decides: the inventory of the cluster in the project.
pub async fn observe<R: Rack, K: InCluster>(
    rack: &R,
    api: Option<&K>,
    resume_spec: Option<ClusterSpec>,
    p: &Params<'_>,
) -> Result<Inventory, DeleteError> {
    let step = "observe";
    let mut spec = None;
    let mut ccm = BTreeSet::new();
    if let Some(api) = api {
        match api.spec().await {
            Ok(s) => spec = s,
            Err(e) => warn!(step, error = %e, "cannot read the spec from the cluster"),
        }
        match api.load_balancers().await {
            Ok(lbs) => {
                ccm = lbs
                    .iter()
                    .map(|(ns, name)| owned::ccm_floating_ip_name(p.cluster, ns, name))
                    .collect()
            }
            Err(e) => {
                warn!(step, error = %e, "cannot list the LoadBalancer Services; CCM addresses are told by name")
            }
        }
    }
    let spec = spec.or(resume_spec);
    let spec_groups = spec.as_ref().map(ClusterSpec::anti_affinity_groups);
    let scope = Scope {
        cluster: p.cluster.to_owned(),
        spec_groups,
        ccm_floating_ips: ccm,
        delete_images: p.delete_images,
        delete_backups: p.delete_backups,
        delete_project: p.delete_project,
    };
    let obs = observe_project(rack, &scope).await?;
    Ok(owned::inventory(&scope, &obs))
}

/// Reads every object of the project (read-only).
pub async fn observe_project<R: Rack>(
    rack: &R,
    scope: &Scope,
) -> Result<ObservedProject, DeleteError> {
    read_project(rack, scope)
        .await
        .map_err(|e| rack_failed("observe", e))
}

/// [`observe_project`] with the rack's own error.
async fn read_project<R: Rack>(rack: &R, scope: &Scope) -> Result<ObservedProject, RackError> {
    if !rack.project_exists().await? {
        return Ok(ObservedProject::default());
    }
    // A 404 on the rules: VPC `default` is gone (a user removed it, or an earlier run got
    // that far deleting the project). The project is still ours to finish, so it has no rules
    // rather than failing the whole observation.
    let rules = async {
        match rack.list_firewall_rules().await {
            Err(RackError::NotFound { .. }) => Ok(Vec::new()),
            other => other,
        }
    };
    let (instances, disks, floating_ips, images, snapshots, groups, rules) = futures::try_join!(
        rack.list_instances(""),
        rack.list_disks(),
        rack.list_floating_ips(),
        rack.list_project_images(),
        rack.list_snapshots(),
        rack.list_anti_affinity_groups(),
        rules,
    )?;
    // VPCs, their subnets and affinity groups matter only to whether the project may go:
    // nexus refuses to delete a project holding a VPC or an affinity group, and a VPC holding
    // a subnet.
    let (vpcs, subnets, affinity_groups) = if scope.delete_project {
        let vpcs = rack.list_vpcs().await?;
        let subnets = if vpcs.iter().any(|v| v == names::DEFAULT_VPC) {
            match rack.list_default_vpc_subnets().await {
                Err(RackError::NotFound { .. }) => Vec::new(),
                other => other?,
            }
        } else {
            Vec::new()
        };
        (vpcs, subnets, rack.list_affinity_groups().await?)
    } else {
        Default::default()
    };
    let mut group_members = BTreeMap::new();
    if let Some(wanted) = &scope.spec_groups {
        for g in groups.iter().filter(|g| wanted.contains(&g.name)) {
            match rack.anti_affinity_group_members(&g.name).await {
                Ok(m) => {
                    group_members.insert(g.name.clone(), m);
                }
                Err(RackError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(ObservedProject {
        exists: true,
        instances,
        disks,
        floating_ips,
        images,
        snapshots,
        groups,
        group_members,
        vpcs,
        subnets,
        affinity_groups,
        firewall_rules: Some(rules),
    })
}

/// The whole flow after validation, over any [`Rack`] and [`InCluster`] (tests use fakes).
pub async fn run_with<R: Rack, K: InCluster>(
    rack: &R,
    api: Option<&K>,
    resume_spec: Option<ClusterSpec>,
    p: &Params<'_>,
    opts: &RemoveOptions,
    local: &LocalFiles,
) -> Result<DeleteSummary, DeleteError> {
    let mut inv = observe(rack, api, resume_spec.clone(), p).await?;
    info!(
        step = "observe",
        objects = inv.items.len(),
        kept = inv.kept.len(),
        api = api.is_some(),
        "inventory made"
    );
    let local_lines = local_changes(local, p.cluster, true)?;
    let in_cluster_plan: Vec<String> = if api.is_some() {
        vec![
            "take the reconcile Lease and suspend CronJob oxide-controller-jobs/oxide-controller"
                .to_owned(),
            format!(
                "scale Deployment kube-system/{} to zero",
                in_cluster::WEBHOOK_DEPLOYMENT
            ),
        ]
    } else {
        Vec::new()
    };
    let mut summary = DeleteSummary {
        cluster: p.cluster.to_owned(),
        project: p.project.to_owned(),
        dry_run: p.dry_run,
        inventory: inv.clone(),
        removed: Vec::new(),
        in_cluster: in_cluster_plan,
        local: local_lines,
        already_gone: false,
        elapsed: Duration::ZERO,
    };
    if inv.is_empty() && api.is_none() {
        // Only local files may be left; removing them finishes an interrupted run.
        summary.in_cluster.clear();
        if summary.local.is_empty() {
            summary.already_gone = true;
            return Ok(summary);
        }
        if !p.dry_run {
            summary.local = local_changes(local, p.cluster, false)?;
        }
        return Ok(summary);
    }
    if p.dry_run {
        return Ok(summary);
    }
    if p.confirm == Confirm::Ask {
        confirm(p.cluster, &inv).await?;
    }
    if let Some(api) = api {
        info!(
            step = "quiesce",
            "stopping the in-cluster pieces that could create VMs"
        );
        summary.in_cluster = api
            .quiesce(p.holder, Duration::from_secs(300))
            .await
            .map_err(|m| DeleteError::step("quiesce", message(m)))?;
        for l in &summary.in_cluster {
            info!(step = "quiesce", "{l}");
        }
        // Look again: a reconcile that ran until we took the Lease may have made a VM.
        inv = observe(rack, Some(api), resume_spec, p).await?;
        summary.inventory = inv.clone();
    }
    let progress = Progress::new(p.tty, inv.items.len());
    let removed = remove_all(rack, &inv, opts, &progress).await;
    progress.finish();
    let (ok, failed): (Vec<_>, Vec<_>) = removed.into_iter().partition(|r| r.is_ok());
    summary.removed = ok.into_iter().filter_map(Result::ok).collect();
    if let Some(Err((item, e))) = failed.into_iter().next() {
        return Err(DeleteError::step(
            "remove",
            error::context(
                format!(
                    "{} {} (re-run delete to continue)",
                    item.kind.label(),
                    item.name
                ),
                e,
            ),
        ));
    }
    summary.local = local_changes(local, p.cluster, false)?;
    info!(
        step = "summary",
        removed = summary.removed.len(),
        "cluster deleted"
    );
    Ok(summary)
}

/// Asks the person to type the cluster name (stderr for the question, stdin for the answer).
async fn confirm(cluster: &str, inv: &Inventory) -> Result<(), DeleteError> {
    let mut text = format!(
        "This deletes {} object(s) of cluster {cluster}:\n",
        inv.items.len()
    );
    for i in &inv.items {
        text.push_str(&format!("  {}\n", item_line(i)));
    }
    text.push_str(&format!("Type the cluster name ({cluster}) to delete it: "));
    let answer = tokio::task::spawn_blocking(move || {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(text.as_bytes());
        let _ = err.flush();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| DeleteError::step("confirm", e))?
    .map_err(|e| DeleteError::step("confirm", e))?;
    if answer.trim() == cluster {
        Ok(())
    } else {
        Err(DeleteError::Declined)
    }
}

/// The kubeconfig context and the resume file: what would change (`dry`) or what did.
fn local_changes(local: &LocalFiles, cluster: &str, dry: bool) -> Result<Vec<String>, DeleteError> {
    let mut out = Vec::new();
    let k = local.kubeconfig.display();
    let verb = if dry { "remove" } else { "removed" };
    match kubeconfig::remove_context(&local.kubeconfig, cluster, dry) {
        Ok(RemoveOutcome::ContextRemoved) => {
            out.push(format!("{verb} context {cluster} from kubeconfig {k}"))
        }
        Ok(RemoveOutcome::FileRemoved) => out.push(format!("{verb} kubeconfig {k}")),
        Ok(RemoveOutcome::NoFile | RemoveOutcome::NoContext) => {}
        Err(e) => warn!(step = "local", error = %e, "leaving the kubeconfig alone"),
    }
    if local.resume.exists() {
        if !dry {
            std::fs::remove_file(&local.resume).map_err(|e| {
                DeleteError::step(
                    "local",
                    error::context(format!("removing {}", local.resume.display()), e),
                )
            })?;
        }
        out.push(format!("{verb} resume file {}", local.resume.display()));
    }
    Ok(out)
}

type Removal = Result<(Item, Outcome), (Item, RackError)>;

/// Removes everything in `inv`: instances (each with its disks) with bounded concurrency,
/// then the rest in dependency order. Keeps going past failures so one stuck object does not
/// hold up the others; the caller reports the first failure.
pub async fn remove_all<R: Rack>(
    rack: &R,
    inv: &Inventory,
    opts: &RemoveOptions,
    progress: &Progress,
) -> Vec<Removal> {
    let deadline = Instant::now() + opts.timeout;
    let mut disks_of: BTreeMap<&str, Vec<&Item>> = BTreeMap::new();
    for d in inv.of_kind(Kind::Disk) {
        if let Some(i) = &d.instance {
            disks_of.entry(i.as_str()).or_default().push(d);
        }
    }
    let mut out: Vec<Removal> = futures::stream::iter(inv.of_kind(Kind::Instance))
        .map(|item| {
            let disks = disks_of.remove(item.name.as_str()).unwrap_or_default();
            let state = inv.instance_states.get(&item.name);
            remove_instance(rack, item, state, disks, opts, deadline, progress)
        })
        .buffer_unordered(opts.concurrency.max(1))
        .flat_map(futures::stream::iter)
        .collect()
        .await;
    let instance_failed = out.iter().any(|r| r.is_err());
    // The rest, in order; the loose disks and the addresses in parallel within a kind.
    let loose_disks: Vec<&Item> = inv
        .of_kind(Kind::Disk)
        .filter(|d| d.instance.is_none())
        .collect();
    for kind in [
        Kind::Disk,
        Kind::FloatingIp,
        Kind::Snapshot,
        Kind::ImportDisk,
        Kind::AntiAffinityGroup,
        Kind::FirewallRule,
        Kind::Image,
        Kind::Project,
    ] {
        let items: Vec<&Item> = match kind {
            Kind::Disk => loose_disks.clone(),
            _ => inv.of_kind(kind).collect(),
        };
        // A project with our VMs still in it cannot go, and trying would only add noise.
        if kind == Kind::Project && (instance_failed || out.iter().any(|r| r.is_err())) {
            continue;
        }
        // Firewall rules one at a time: each removal rewrites the whole list, and two at once
        // would each write back the rule the other removed.
        let concurrency = match kind {
            Kind::FirewallRule => 1,
            _ => opts.concurrency.max(1),
        };
        let done: Vec<Removal> = futures::stream::iter(items)
            .map(|item| remove_other(rack, item, opts, deadline, progress))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        out.extend(done);
    }
    out
}

/// Stop → stopped → delete → its disks, for one instance. Starts from the instance's state
/// as observed now, so a re-run after a kill picks up wherever the last run got.
async fn remove_instance<R: Rack>(
    rack: &R,
    item: &Item,
    observed: Option<&InstanceState>,
    disks: Vec<&Item>,
    opts: &RemoveOptions,
    deadline: Instant,
    progress: &Progress,
) -> Vec<Removal> {
    let name = item.name.as_str();
    let mut out = Vec::new();
    // An instance observed running is stopped at once, without looking again (the look after
    // the stop is the first one that matters); anything else starts with a look.
    let mut stop_sent = false;
    let first = match observed {
        Some(s) if owned::needs_stop(s) => Some(rack.stop_instance(name).await),
        _ => None,
    };
    let first = match first {
        None => None,
        Some(Ok(())) => {
            stop_sent = true;
            tokio::time::sleep(opts.poll).await;
            None
        }
        Some(Err(RackError::NotFound { .. })) => Some(Ok(Outcome::AlreadyGone)),
        // Refused in this state, a transient error: the loop looks and decides.
        Some(Err(RackError::Invalid { .. } | RackError::Conflict { .. })) => None,
        Some(Err(e)) if e.is_retryable() => None,
        Some(Err(e)) => Some(Err(e)),
    };
    let outcome = if let Some(o) = first {
        o
    } else {
        loop {
            let state = match rack.get_instance(name).await {
                Ok(Some(i)) => i.state,
                Ok(None) => break Ok(Outcome::AlreadyGone),
                Err(e) if e.is_retryable() => InstanceState::Other("unknown".into()),
                Err(e) => break Err(e),
            };
            if state.is_deletable() {
                match rack.delete_instance(name).await {
                    Ok(()) => break Ok(Outcome::Deleted),
                    Err(RackError::NotFound { .. }) => break Ok(Outcome::AlreadyGone),
                    // Started again behind our back (e.g. Oxide's auto-restart): stop it again.
                    Err(RackError::Invalid { .. } | RackError::Conflict { .. }) => {
                        stop_sent = false
                    }
                    Err(e) if e.is_retryable() => {}
                    Err(e) => break Err(e),
                }
            } else if owned::needs_stop(&state) && !stop_sent {
                match rack.stop_instance(name).await {
                    Ok(()) => stop_sent = true,
                    Err(RackError::NotFound { .. }) => break Ok(Outcome::AlreadyGone),
                    Err(e) if e.is_retryable() => {}
                    // Refused in this state (e.g. still creating): look again later.
                    Err(RackError::Invalid { .. } | RackError::Conflict { .. }) => {}
                    Err(e) => break Err(e),
                }
                continue;
            } else if matches!(state, InstanceState::Running | InstanceState::Starting) {
                // Stop sent, yet running: it may have been lost; send it again next time.
                stop_sent = false;
            }
            if Instant::now() >= deadline {
                break Err(RackError::Timeout {
                    what: format!("instance {name} to stop (state {state:?})"),
                    seconds: opts.timeout.as_secs(),
                });
            }
            tokio::time::sleep(opts.poll).await;
        }
    };
    match outcome {
        Ok(o) => {
            progress.removed(item, &o);
            out.push(Ok((item.clone(), o)));
        }
        Err(e) => {
            out.push(Err((item.clone(), e)));
            return out;
        }
    }
    let disks = futures::future::join_all(
        disks
            .into_iter()
            .map(|d| remove_other(rack, d, opts, deadline, progress)),
    )
    .await;
    out.extend(disks);
    out
}

/// Deletes one non-instance object, retrying while Oxide says it is still busy (a disk
/// detaching from a just-deleted instance, a floating IP still attached).
async fn remove_other<R: Rack>(
    rack: &R,
    item: &Item,
    opts: &RemoveOptions,
    deadline: Instant,
    progress: &Progress,
) -> Removal {
    loop {
        let r = match item.kind {
            Kind::Disk => rack.delete_disk(&item.name).await,
            Kind::ImportDisk => rack.delete_import_disk(&item.name).await,
            Kind::FloatingIp => delete_floating_ip(rack, &item.name).await,
            Kind::Snapshot => rack.delete_snapshot(&item.name).await,
            Kind::AntiAffinityGroup => rack.delete_anti_affinity_group(&item.name).await,
            Kind::Image => rack.delete_image(&item.name).await,
            Kind::Project => delete_project_if_empty(rack).await,
            Kind::FirewallRule => match rack.remove_firewall_rule(&item.name).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(RackError::NotFound {
                    what: format!("firewall rule {}", item.name),
                }),
                Err(e) => Err(e),
            },
            // Instances go through `remove_instance`.
            Kind::Instance => Ok(()),
        };
        let outcome = match r {
            Ok(()) => Outcome::Deleted,
            Err(RackError::NotFound { .. }) => Outcome::AlreadyGone,
            Err(e) => {
                let busy = e.is_retryable()
                    || (matches!(e, RackError::Invalid { .. } | RackError::Conflict { .. })
                        && item.kind != Kind::Project);
                if !busy || Instant::now() >= deadline {
                    return Err((item.clone(), e));
                }
                tokio::time::sleep(opts.poll).await;
                continue;
            }
        };
        progress.removed(item, &outcome);
        return Ok((item.clone(), outcome));
    }
}

/// Deletes the project if it holds nothing nexus would refuse over, nor a firewall rule the
/// VPC's deletion would take with it. Looks again first: the inventory is minutes old by now,
/// and the rack deletes subnet `default` and VPC `default` before it refuses the project, so a
/// refusal there would leave someone's project without its network.
async fn delete_project_if_empty<R: Rack>(rack: &R) -> Result<(), RackError> {
    let scope = Scope {
        delete_project: true,
        ..Scope::default()
    };
    let obs = read_project(rack, &scope).await?;
    if !obs.exists {
        return Err(RackError::NotFound {
            what: "project".into(),
        });
    }
    let left = owned::leftovers(&obs, &Inventory::default());
    if !left.is_empty() {
        return Err(RackError::Invalid {
            what: "project".into(),
            message: format!(
                "kept, nothing of it deleted: it now holds {} (made while this run removed the cluster)",
                left.join(", ")
            ),
        });
    }
    rack.delete_project().await
}

/// Detaches the address when something still holds it (deleting an instance detaches its
/// floating IPs, but a CCM address may sit on a VM we do not own), then deletes it.
async fn delete_floating_ip<R: Rack>(rack: &R, name: &str) -> Result<(), RackError> {
    if let Some(f) = rack.get_floating_ip(name).await?
        && f.instance_id.is_some()
    {
        rack.detach_floating_ip(name).await?;
    }
    rack.delete_floating_ip(name).await
}

/// Progress: redrawn in place on a terminal, a log line per object otherwise.
#[derive(Debug)]
pub struct Progress {
    tty: bool,
    total: usize,
    done: Mutex<usize>,
}

impl Progress {
    pub fn new(tty: bool, total: usize) -> Progress {
        Progress {
            tty,
            total,
            done: Mutex::new(0),
        }
    }

    fn removed(&self, item: &Item, outcome: &Outcome) {
        let done = {
            let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
            *d += 1;
            *d
        };
        let left = self.total.saturating_sub(done);
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r\x1b[2Kdeleting: {done}/{} done, {left} left (last: {} {})",
                self.total,
                item.kind.label(),
                item.name
            );
            let _ = err.flush();
        } else {
            info!(step = "remove", kind = item.kind.label(), name = %item.name, ?outcome, left, "removed");
        }
    }

    fn finish(&self) {
        if self.tty {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err);
        }
    }
}
