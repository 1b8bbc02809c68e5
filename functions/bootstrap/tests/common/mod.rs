//! Shared set-up of the bootstrap end-to-end tests: an in-process `oxide-sim` with a seeded
//! silo image, a temporary HOME/state dir/kubeconfig, and the real `bootstrap` binary.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use oxide_sim::control_plane::ControlPlaneOptions;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, BufReader};

pub const BIN: &str = env!("CARGO_BIN_EXE_bootstrap");

/// `cargo build --bins -p bootstrap -p reconcile-once -p scale --profile dev` into the target
/// directory the tests run from (a no-op when fresh); returns the directory of the binaries.
pub fn workspace_binaries() -> PathBuf {
    let bin_dir = Path::new(BIN).parent().unwrap().to_path_buf();
    let target = bin_dir.parent().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
        .args(["build", "--locked", "--bins", "--profile", "dev"])
        .args(["-p", "bootstrap", "-p", "reconcile-once", "-p", "scale"])
        .current_dir(&repo)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin_dir
}

pub const IMAGE: &str = "ubuntu-2404";
pub const SSH_PORT: u16 = 2222;

/// A simulator plus a scratch directory for one bootstrap user.
pub struct Env {
    pub sim: SimHandle,
    pub dir: tempfile::TempDir,
}

pub async fn env() -> Env {
    env_with(SimOptions::default()).await
}

/// [`env`] with a simulator started from `opts` (its SSH port set as in every test).
pub async fn env_with(opts: SimOptions) -> Env {
    let sim = Sim::start(SimOptions {
        ssh_port: SSH_PORT,
        // The clusters bootstrap makes run a real control plane (oxide_sim::control_plane).
        kubernetes: ControlPlaneOptions::default(),
        ..opts
    })
    .await
    .unwrap_or_else(|e| panic!("simulator: {e:#}"));
    sim.oxide()
        .seed_silo_image(IMAGE, "ubuntu", "24.04", 2 << 30);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), format!("{}\n", sim.oxide_token)).unwrap();
    Env { sim, dir }
}

impl Env {
    /// The product's Oxide adapter for `project` on this simulator, with the token the
    /// laptop's commands use (the token file: a test may rotate it).
    pub fn rack(&self, project: &str) -> oxide_controller::adapters::oxide_rack::OxideRack {
        oxide_controller::adapters::oxide_rack::OxideRack::connect(
            &self.sim.oxide_host,
            self.oxide_token().trim(),
            project,
            oxide_controller::adapters::oxide_rack::RackOptions::default(),
        )
        .unwrap()
    }

    /// The token in the file the laptop's commands read (`--oxide-token file:`).
    pub fn oxide_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("token")).unwrap()
    }

    /// Rotates the rack's token (the old one is refused from now on) and the laptop's file.
    pub fn rotate_oxide_token(&self, token: &str) {
        self.sim.oxide().rotate_token(token);
        std::fs::write(self.dir.path().join("token"), format!("{token}\n")).unwrap();
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("demo.kubeconfig")
    }

    /// The command line of a normal run for cluster `demo`, plus `extra` (later flags win).
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        let token = format!("file:{}", self.dir.path().join("token").display());
        let mut a: Vec<String> = [
            "--oxide-host",
            &self.sim.oxide_host,
            "--oxide-token",
            &token,
            "--cluster",
            "demo",
            "--image",
            IMAGE,
            "--control-planes",
            "3",
            "--workers",
            "2",
            "--ssh-port",
            "2222",
            "--state-dir",
            &self.state_dir().display().to_string(),
            "--kubeconfig",
            &self.kubeconfig().display().to_string(),
            "--log-format",
            "json",
            "--wait",
            "120",
            "--api-timeout",
            "60",
            // No in-cluster backups unless a test asks for them: the default hourly schedule
            // would make every test that runs across the hour back itself up (k3s on each
            // server, and the backup Job where the simulator runs Jobs).
            "--backup-schedule",
            "off",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    /// The command line of `bootstrap SUB` (`delete`, `recover`, `backup`) for `cluster` (its
    /// project has the same name by default), with this user's token, state dir and
    /// kubeconfig and JSON logs, plus `extra`.
    pub fn sub_args(&self, sub: &str, cluster: &str, extra: &[&str]) -> Vec<String> {
        let token = format!("file:{}", self.dir.path().join("token").display());
        let mut a: Vec<String> = [
            sub,
            "--oxide-host",
            &self.sim.oxide_host,
            "--oxide-token",
            &token,
            "--cluster",
            cluster,
            "--state-dir",
            &self.state_dir().display().to_string(),
            "--kubeconfig",
            &self.kubeconfig().display().to_string(),
            "--log-format",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    /// The command line of `bootstrap delete` for `cluster`, plus `extra`.
    pub fn delete_args(&self, cluster: &str, extra: &[&str]) -> Vec<String> {
        let mut with_timeout = vec!["--timeout", "120"];
        with_timeout.extend_from_slice(extra);
        self.sub_args("delete", cluster, &with_timeout)
    }

    /// Runs `bootstrap delete` for `cluster` with `extra` (within 300 s).
    pub async fn delete(&self, cluster: &str, extra: &[&str]) -> Output {
        tokio::time::timeout(
            Duration::from_secs(300),
            self.command(&self.delete_args(cluster, extra)).output(),
        )
        .await
        .expect("delete finished within 300 s")
        .unwrap()
    }

    pub fn command(&self, args: &[String]) -> tokio::process::Command {
        std::fs::create_dir_all(self.home()).unwrap();
        let mut c = tokio::process::Command::new(BIN);
        c.args(args)
            .env("HOME", self.home())
            .env("RUST_LOG", "info")
            .env_remove("OXIDE_HOST")
            .env_remove("OXIDE_TOKEN")
            .env_remove("OXIDE_PROFILE")
            .env_remove("OXIDE_CONFIG_DIR")
            .env_remove("OXIDE_CONTROLLER_KUBECONFIG")
            .env_remove("OXIDE_CONTROLLER_STATE_DIR")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    pub async fn run(&self, extra: &[&str]) -> Output {
        tokio::time::timeout(
            Duration::from_secs(300),
            self.command(&self.args(extra)).output(),
        )
        .await
        .expect("bootstrap finished within 300 s")
        .unwrap()
    }

    /// Runs and requires success, returning stdout.
    pub async fn run_ok(&self, extra: &[&str]) -> String {
        let out = self.run(extra).await;
        assert!(
            out.status.success(),
            "bootstrap failed: {:?}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts bootstrap and SIGKILLs it when stderr shows the `n`-th distinct `step` value
    /// (1-based). Returns the steps seen, or all of them if it finished first.
    pub async fn run_killed_at_step(&self, n: usize) -> Vec<String> {
        self.run_killed_at_step_with(n, &self.args(&[])).await
    }

    /// [`Env::run_killed_at_step`] with a full command line.
    pub async fn run_killed_at_step_with(&self, n: usize, args: &[String]) -> Vec<String> {
        let mut child = self
            .command(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let mut seen: Vec<String> = Vec::new();
        let read = async {
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some(step) = v["step"].as_str()
                    && !seen.iter().any(|s| s == step)
                {
                    seen.push(step.to_owned());
                    if seen.len() == n {
                        return true;
                    }
                }
            }
            false
        };
        let hit = tokio::time::timeout(Duration::from_secs(300), read)
            .await
            .expect("step reached in time");
        if hit {
            child.start_kill().unwrap();
        }
        let _ = child.wait().await;
        seen
    }

    /// Starts bootstrap with `args` and SIGKILLs it as soon as the simulator has served
    /// `route` (a counter key like `"POST /v1/instances"`) at least `times` times. Returns
    /// whether it was killed (false: it finished first).
    pub async fn run_killed_after_route(&self, args: &[String], route: &str, times: u64) -> bool {
        self.sim.oxide().reset_counters();
        let mut child = self
            .command(args)
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        loop {
            if self.sim.oxide().counters().get(route).copied().unwrap_or(0) >= times {
                child.start_kill().unwrap();
                let _ = child.wait().await;
                return true;
            }
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "bootstrap ran for 300 s"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }

    pub fn dump(&self) -> Value {
        self.sim.oxide().dump()
    }

    /// Names of the dump's `kind` objects ("instances", "disks", "snapshots", "floating_ips", ...).
    pub fn names(&self, kind: &str) -> Vec<String> {
        self.dump()[kind]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|o| o["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Ready Node names starting with `prefix`.
    pub async fn ready_nodes(&self, prefix: &str) -> BTreeSet<String> {
        self.sim.kube().ready_nodes(prefix).await
    }

    /// Counters of requests that create something on the rack.
    pub fn create_calls(&self) -> Vec<(String, u64)> {
        self.sim
            .oxide()
            .counters()
            .into_iter()
            .filter(|(k, n)| *n > 0 && is_create(k))
            .collect()
    }

    /// Counters of every mutating request (anything but GET).
    pub fn mutating_calls(&self) -> Vec<(String, u64)> {
        self.sim
            .oxide()
            .counters()
            .into_iter()
            .filter(|(k, n)| *n > 0 && !k.starts_with("GET "))
            .collect()
    }

    /// The mutating Oxide requests made while `f` ran: what `f` returned, and each request
    /// whose counter grew.
    pub async fn mutating_during<T, F: std::future::Future<Output = T>>(
        &self,
        f: F,
    ) -> (T, Vec<(String, u64)>) {
        let before = self.mutating_calls();
        let out = f.await;
        let made = self
            .mutating_calls()
            .into_iter()
            .filter(|(k, n)| before.iter().find(|(b, _)| b == k).map_or(0, |(_, m)| *m) < *n)
            .collect();
        (out, made)
    }
}

/// `POST` to a collection (`/v1/instances`, `/v1/disks`, ...) creates; `POST …/attach`,
/// `…/start` and friends act on something that exists.
pub fn is_create(key: &str) -> bool {
    let Some(path) = key.strip_prefix("POST ") else {
        return false;
    };
    matches!(
        path,
        "/v1/projects"
            | "/v1/instances"
            | "/v1/disks"
            | "/v1/floating-ips"
            | "/v1/images"
            | "/v1/snapshots"
            | "/v1/anti-affinity-groups"
    )
}

/// JSON log lines of a run's stderr.
pub fn log_lines(stderr: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A kube client from a kubeconfig file (context = its current one).
pub async fn kube_client(path: &Path, context: &str) -> kube::Client {
    oxide_controller::adapters::kubeclient::client(Some(path), Some(context))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A tiny HTTP/1.1 server on loopback serving `files` (path → bytes) to GET and HEAD and 404
/// for anything else. Returns the base URL. Runs until the runtime ends.
pub async fn serve_files(files: Vec<(&'static str, Vec<u8>)>) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let files = std::sync::Arc::new(files);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let files = files.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&req).into_owned();
                let mut first = head.lines().next().unwrap_or_default().split_whitespace();
                let (method, path) = (
                    first.next().unwrap_or_default(),
                    first.next().unwrap_or_default(),
                );
                let found = files.iter().find(|(p, _)| *p == path);
                let reply = match found {
                    Some((_, body)) => {
                        let mut r = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        if method != "HEAD" {
                            r.extend_from_slice(body);
                        }
                        r
                    }
                    None => {
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_vec()
                    }
                };
                let _ = sock.write_all(&reply).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

/// A small raw "disk image": data at the start, in the middle and at the end, zeros between,
/// and a length that is not a whole number of blocks.
pub fn sample_image(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    let fill = |b: &mut [u8], seed: u8| {
        b.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = seed.wrapping_add(i as u8) | 1)
    };
    fill(&mut bytes[..8192], 3);
    let mid = len / 2;
    fill(&mut bytes[mid..mid + 4096], 7);
    fill(&mut bytes[len - 100..], 11);
    bytes
}

/// What a test that gives up on a cluster prints: each instance (name, state, id) and where
/// each floating IP is attached, from the simulated rack (no HTTP: a test that cannot reach
/// the cluster's API can still see why).
pub fn rack_summary(env: &Env) -> String {
    let dump = env.sim.oxide().dump();
    let mut out = String::from("instances:");
    for i in dump["instances"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  {} {} {}",
            i["name"].as_str().unwrap_or("?"),
            i["state"].as_str().unwrap_or("?"),
            i["id"].as_str().unwrap_or("?")
        ));
    }
    out.push_str("\nfloating IPs:");
    for f in dump["floating_ips"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  {f}"));
    }
    out
}

/// The lines of a `--log-format json` run worth keeping for a post-mortem: warnings, errors
/// and the actions it applied.
pub fn notable_lines(stderr: &[u8]) -> impl Iterator<Item = String> + '_ {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\"") || l.contains("\"action\""))
        .map(str::to_owned)
        .collect::<Vec<_>>()
        .into_iter()
}
