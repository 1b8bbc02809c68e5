//! Bootstrap against the in-memory fakes (`fake::connect::FakeConnect`), killed right after
//! each of its named steps and run again on the same world with the same resume directory
//! (DESIGN.md "Bootstrap flow": "Re-running bootstrap on an existing cluster adopts it and
//! only repairs what is missing").
//!
//! The kill: the first log line of step N+1 (every step logs `step=<name>` before it does
//! anything) panics inside the test's tracing layer, which unwinds the workflow right there,
//! as a process killed between the two steps would stop. The re-run must succeed, ask the
//! fakes to create nothing a clean run would not have (every create request counts, refused
//! or not: a re-run that stopped looking for what exists asks again), keep the keys and
//! tokens of the resume file, and leave the world as one clean run leaves it.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::FutureExt as _;
use oxide_controller::adapters::credentials::{CredentialFlags, CredentialSources};
use oxide_controller::adapters::resume::{self, ResumeState};
use oxide_controller::base::names;
use oxide_controller::base::size::ByteSize;
use oxide_controller::domain::spec::{ExternalIpMode, K3sInstall};
use oxide_controller::fake::FakeWorld;
use oxide_controller::fake::connect::FakeConnect;
use oxide_controller::workflows::bootstrap::{
    self, BootstrapError, BootstrapInput, PoolInput, STEPS, Summary, TailscaleFlags,
};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

const CLUSTER: &str = "demo";
const IMAGE: &str = "ubuntu-2404";
/// What the kill's panic message starts with (the panic hook keeps these quiet).
const KILLED: &str = "killed by the test after step ";

/// Panics at the first event of step `at`: the run dies right after the step before it.
struct KillAt {
    at: &'static str,
    after: &'static str,
}

impl<S: tracing::Subscriber> Layer<S> for KillAt {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut step = StepField(None);
        event.record(&mut step);
        if step.0.as_deref() == Some(self.at) {
            panic!("{KILLED}{}", self.after);
        }
    }
}

/// The `step` field of an event.
struct StepField(Option<String>);

impl Visit for StepField {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "step" {
            self.0 = Some(value.to_owned());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "step" {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

/// Keeps the kills' panics off stderr; any other panic is reported as usual.
fn quiet_kills() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or_default();
        if !message.starts_with(KILLED) {
            default(info);
        }
    }));
}

/// A fresh rack: no project yet, nothing in it.
fn world() -> FakeWorld {
    let w = FakeWorld::new(chrono::Utc::now());
    w.with(|s| s.project_deleted = true);
    w
}

/// The files one person's machine holds: home, kubeconfig, resume directory, image file.
struct Laptop {
    dir: tempfile::TempDir,
}

impl Laptop {
    fn new() -> Laptop {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        // 1 MiB of non-zero bytes: a real upload, with bulk writes.
        let bytes: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251 + 1) as u8).collect();
        std::fs::write(dir.path().join("image.raw"), bytes)
            .unwrap_or_else(|e| panic!("image file: {e}"));
        Laptop { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn resume_path(&self) -> PathBuf {
        resume::resume_path(&self.path().join("state"), CLUSTER)
    }

    fn resume(&self) -> Option<ResumeState> {
        resume::load(&self.resume_path(), CLUSTER, CLUSTER)
            .unwrap_or_else(|e| panic!("resume file: {e}"))
    }

    fn input(&self) -> BootstrapInput {
        let pool = PoolInput {
            cpus: 2,
            memory: ByteSize::gib(4),
            boot_disk: ByteSize::gib(20),
            data_disk: None,
        };
        BootstrapInput {
            credential_sources: CredentialSources {
                flags: CredentialFlags {
                    host: Some("http://127.0.0.1:1".into()),
                    token: Some("oxide-token-for-the-fakes".into()),
                    profile: None,
                },
                env_host: None,
                env_token: None,
                env_profile: None,
                config_dir: None,
            },
            cluster: CLUSTER.into(),
            project: None,
            control_planes: 1,
            dedicated_servers: Some(false),
            workers: 2,
            control_plane: pool,
            worker: pool,
            image: IMAGE.into(),
            image_source: Some(self.path().join("image.raw").display().to_string()),
            worker_image: None,
            worker_image_source: None,
            worker_image_source_sha256: None,
            image_source_sha256: None,
            k3s_installer_url: None,
            k3s_installer_sha256: None,
            k3s_binary_sha256: None,
            external_ip: ExternalIpMode::Ephemeral,
            ip_pool: None,
            user_ssh_public_key: None,
            k3s_version: "v1.33.4+k3s1".into(),
            k3s_install: K3sInstall::Script,
            kubeconfig: Some(self.path().join("kubeconfig.yaml")),
            kubeconfig_overwrite: false,
            kubeconfig_merge: false,
            schedule: "*/5 * * * *".into(),
            backup_schedule: Some("0 * * * *".into()),
            controller_image: "registry.example/oxide-controller:test".into(),
            dev_build_profile: None,
            oxide_ccm: false,
            oxide_ccm_image: None,
            ssh_user: "ubuntu".into(),
            ssh_port: 22,
            upload_parallelism: 4,
            state_dir: Some(self.path().join("state")),
            wait: Duration::ZERO,
            api_timeout: Duration::from_secs(30),
            api_allow: oxide_controller::domain::firewall::DEFAULT_API_ALLOW.into(),
            ssh_allow: None,
            holder: "bootstrap-test".into(),
            shutdown: oxide_controller::base::shutdown::Shutdown::new(),
            home: Some(self.path().to_path_buf()),
            json_logs: true,
            tailscale: TailscaleFlags::default(),
        }
    }
}

/// One bootstrap run on `world`; `kill` = `(after, at)` kills it when step `at` begins.
/// `None` when it was killed.
async fn run(
    world: &FakeWorld,
    laptop: &Laptop,
    kill: Option<(&'static str, &'static str)>,
) -> Option<Result<Summary, BootstrapError>> {
    // The rack moves instances along (starting → running, kubelets join) while bootstrap waits.
    let clock = world.clone();
    let ticker = tokio::spawn(async move {
        loop {
            clock.tick(0);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let connect = FakeConnect::new(world.clone());
    let input = laptop.input();
    let out = match kill {
        None => Some(bootstrap::run(input, &connect).await),
        Some((after, at)) => {
            let subscriber = tracing_subscriber::registry().with(KillAt { at, after });
            let _guard = tracing::subscriber::set_default(subscriber);
            AssertUnwindSafe(bootstrap::run(input, &connect))
                .catch_unwind()
                .await
                .ok()
        }
    };
    ticker.abort();
    out
}

/// What a world holds after bootstrap, and what bootstrap asked the fakes to create.
#[derive(Debug, PartialEq, Eq)]
struct Made {
    /// Create requests by kind (random instance suffixes dropped), made or refused.
    create_requests: BTreeMap<String, usize>,
    /// Floating IP attachments made.
    attachments: usize,
    /// Instances per pool.
    instances: BTreeMap<String, usize>,
    floating_ips: BTreeSet<String>,
    project_images: Vec<String>,
    firewall_rules: Vec<String>,
    applied: BTreeSet<String>,
    secret: bool,
    config_keys: BTreeSet<String>,
}

fn pool_of(instance: &str) -> String {
    instance
        .rsplit_once('-')
        .map_or(instance, |(pool, _)| pool)
        .to_owned()
}

fn made(world: &FakeWorld) -> Made {
    world.with(|s| {
        let mut create_requests = BTreeMap::new();
        for call in &s.create_calls {
            let kind = match call.strip_prefix("create-instance ") {
                Some(name) => format!("create-instance {}-*", pool_of(name)),
                None => call.clone(),
            };
            *create_requests.entry(kind).or_default() += 1;
        }
        let mut instances = BTreeMap::new();
        for name in s.instances.keys() {
            *instances.entry(pool_of(name)).or_default() += 1;
        }
        Made {
            create_requests,
            attachments: s.log.iter().filter(|l| l.starts_with("attach-fip")).count(),
            instances,
            floating_ips: s.floating_ips.keys().cloned().collect(),
            project_images: s
                .images
                .iter()
                .filter(|i| !i.silo_scoped)
                .map(|i| i.name.clone())
                .collect(),
            firewall_rules: s.firewall_rules.iter().map(|r| r.name.clone()).collect(),
            applied: s.applied.clone(),
            secret: s.secrets.is_some(),
            config_keys: s.config.data.keys().cloned().collect(),
        }
    })
}

/// The keys, tokens and first server's name of a resume file.
fn identity(r: &ResumeState) -> [String; 6] {
    [
        r.first_control_plane.clone(),
        r.ssh_private_key.clone(),
        r.ssh_public_key.clone(),
        r.k3s_token.clone(),
        r.k3s_agent_token.clone(),
        r.webhook_token.clone(),
    ]
}

/// Checks a finished world: the first control plane is the resume file's and holds the API
/// address, the Secret holds the resume file's tokens, and everything matches `clean`.
fn check_world(world: &FakeWorld, laptop: &Laptop, clean: &Made) -> Result<(), String> {
    let now = made(world);
    if &now != clean {
        return Err(format!(
            "the world differs from a clean run's:\n  clean: {clean:?}\n  now:   {now:?}"
        ));
    }
    let r = laptop.resume().ok_or("no resume file")?;
    let first = world.with(|s| s.instances.get(&r.first_control_plane).map(|i| i.id));
    let first = first.ok_or_else(|| format!("no instance {}", r.first_control_plane))?;
    let fip = world.with(|s| {
        s.floating_ips
            .get(&names::api_floating_ip_name(CLUSTER))
            .and_then(|f| f.instance_id)
    });
    if fip != Some(first) {
        return Err("the API floating IP is not on the first control plane".into());
    }
    let secret_token = world.with(|s| s.secrets.as_ref().map(|x| x.k3s_token.clone()));
    if secret_token.as_deref() != Some(r.k3s_token.as_str()) {
        return Err("the Secret's k3s token is not the resume file's".into());
    }
    Ok(())
}

/// Kills a run right after `step` (when the step after it begins), re-runs, and checks.
async fn killed_after(
    step: &'static str,
    next: Option<&'static str>,
    clean: &Made,
) -> Result<(), String> {
    let world = world();
    let laptop = Laptop::new();
    let first = run(&world, &laptop, next.map(|at| (step, at))).await;
    match (&first, next) {
        (Some(Err(e)), _) => {
            return Err(format!("the first run failed instead of being killed: {e}"));
        }
        (Some(Ok(_)), Some(at)) => {
            return Err(format!("the first run finished; step {at} never began"));
        }
        _ => {}
    }
    let before = laptop.resume().map(|r| identity(&r));
    let second = run(&world, &laptop, None).await;
    match second {
        Some(Ok(_)) => {}
        Some(Err(e)) => return Err(format!("the re-run failed: {e}")),
        None => return Err("the re-run was killed".into()),
    }
    let after = laptop.resume().map(|r| identity(&r));
    if before.is_some() && before != after {
        return Err("the re-run changed the keys or tokens of the resume file".into());
    }
    check_world(&world, &laptop, clean)
}

#[tokio::test]
async fn a_run_killed_after_any_step_is_finished_by_a_rerun_that_adopts_what_exists() {
    quiet_kills();
    let clean_world = world();
    let clean_laptop = Laptop::new();
    match run(&clean_world, &clean_laptop, None).await {
        Some(Ok(_)) => {}
        other => panic!("a clean run on the fakes failed: {other:?}"),
    }
    let clean = made(&clean_world);
    // The clean run made everything once.
    for kind in [
        "create-project",
        "create-fip demo-apiserver",
        "create-instance demo-control-plane-*",
        "create-image ubuntu-2404",
        "create-secret",
        "create-configmap",
        "create-webhook-auth",
    ] {
        assert_eq!(
            clean.create_requests.get(kind),
            Some(&1),
            "{kind}: {clean:?}"
        );
    }
    // The API rule, the two SSH rules and the two member rules.
    assert_eq!(
        clean.firewall_rules,
        [
            "demo-k8s-api",
            "demo-ssh",
            "demo-ssh-deny",
            "demo-members",
            "demo-isolate"
        ],
        "{clean:?}"
    );
    assert!(!clean.applied.is_empty(), "{clean:?}");
    check_world(&clean_world, &clean_laptop, &clean).unwrap_or_else(|e| panic!("{e}"));

    let mut failures = Vec::new();
    for (i, step) in STEPS.iter().enumerate() {
        let next = STEPS.get(i + 1).copied();
        match killed_after(step, next, &clean).await {
            Ok(()) => eprintln!("killed after step {step}: the re-run adopted everything"),
            Err(why) => failures.push(format!("killed after step {step}: {why}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Audit security-2 H2's rest, in this test because bootstrap's log callsites must not be
    // first hit by another test's thread (tracing caches their interest without this test's
    // thread-local subscriber, and the kills above would never see their step begin).
    oxide_token_id_recorded_only_when_known(&clean_world).await;
}

/// Bootstrap records which of the user's tokens the cluster holds (Secret key
/// `oxide-token-id`), so every run can watch its end; with two tokens and no profile to say
/// which, it records none rather than a guess (the run then says so).
async fn oxide_token_id_recorded_only_when_known(clean_world: &FakeWorld) {
    use oxide_controller::domain::oxide_token::AccessToken;
    let only = clean_world.with(|s| s.access_tokens[0].id.clone());
    assert_eq!(
        clean_world.with(|s| s.secrets.as_ref().and_then(|x| x.oxide_token_id.clone())),
        Some(only),
        "the user's only token"
    );
    let w = world();
    let laptop = Laptop::new();
    w.with(|s| {
        s.access_tokens.push(AccessToken {
            id: "5a1e0000-0000-4000-8000-0000000000c3".into(),
            expires_at: Some(chrono::Utc::now() + chrono::Duration::days(10)),
        });
    });
    match run(&w, &laptop, None).await {
        Some(Ok(_)) => {}
        other => panic!("bootstrap on the fakes failed: {other:?}"),
    }
    let recorded = w.with(|s| s.secrets.as_ref().map(|x| x.oxide_token_id.clone()));
    assert_eq!(recorded, Some(None), "two tokens, no profile: no guess");
}

/// Audit security-2 N6: a `recover --backup` that died after the restore and before it
/// rewrote the restored Secret leaves `restore_pending` in the resume file; the next `recover`
/// finds the API ready (rung 0) and finishes it: the laptop's Oxide token back in the Secret,
/// new webhook tokens (in the resume file too), the mark gone, and stdout saying so.
#[tokio::test]
async fn a_restore_that_died_before_rewriting_the_secret_is_finished_by_the_next_recover() {
    use oxide_controller::workflows::bootstrap::recover::{self, RecoverInput, Rung};
    let world = world();
    let laptop = Laptop::new();
    match run(&world, &laptop, None).await {
        Some(Ok(_)) => {}
        other => panic!("a clean run on the fakes failed: {other:?}"),
    }
    // What the restore brought back: the backup's values, and the mark it left.
    world.with(|s| {
        let secrets = s.secrets.as_mut().unwrap_or_else(|| panic!("no Secret"));
        secrets.oxide_token = "the-backups-oxide-token".into();
        secrets.oxide_token_id = Some("the-backups-token-id".into());
        let tokens = s
            .webhook_tokens
            .as_mut()
            .unwrap_or_else(|| panic!("no tokens"));
        tokens.token = "the-backups-webhook-token".into();
    });
    let mut r = laptop.resume().unwrap_or_else(|| panic!("no resume file"));
    r.restore_pending = Some("demo-etcd-20260101-000000".into());
    resume::save(&laptop.resume_path(), &r).unwrap_or_else(|e| panic!("{e}"));

    let b = laptop.input();
    let input = RecoverInput {
        credential_sources: b.credential_sources,
        cluster: CLUSTER.into(),
        project: None,
        kubeconfig: b.kubeconfig,
        state_dir: b.state_dir,
        home: b.home,
        dry_run: false,
        yes: false,
        backup: None,
        verify: false,
        api_timeout: Duration::from_secs(30),
        wait: Duration::ZERO,
        holder: "recover-test".into(),
        shutdown: oxide_controller::base::shutdown::Shutdown::new(),
    };
    let summary = recover::run(input, &FakeConnect::new(world.clone()))
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(summary.rung, Rung::Healthy);
    let out = summary.render();
    for needle in [
        "an earlier restore had not rewritten the Secret",
        "the backup's Oxide token differed from the one this run used: replaced",
        "webhook tokens replaced",
    ] {
        assert!(out.contains(needle), "{needle:?}: {out}");
    }
    let secrets = world
        .with(|s| s.secrets.clone())
        .unwrap_or_else(|| panic!("no Secret"));
    let tokens = world
        .with(|s| s.webhook_tokens.clone())
        .unwrap_or_else(|| panic!("no webhook tokens"));
    assert_eq!(secrets.oxide_token, "oxide-token-for-the-fakes");
    // The backup's token id does not stay beside the laptop's token (whose id the flags do
    // not say: none, and the reconcile tells the user's only token).
    assert_eq!(secrets.oxide_token_id, None);
    assert_ne!(tokens.token, "the-backups-webhook-token");
    assert_ne!(tokens.token, r.webhook_token);
    let after = laptop.resume().unwrap_or_else(|| panic!("no resume file"));
    assert_eq!(after.restore_pending, None);
    assert_eq!(after.webhook_token, tokens.token);
    assert_eq!(after.webhook_read_token, tokens.read_token);
    for value in [&tokens.token, &secrets.oxide_token] {
        assert!(!out.contains(value.as_str()), "a value on stdout: {out}");
    }
}
