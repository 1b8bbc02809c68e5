//! The scale webhook end to end over HTTP: the real host (`webhook::host::serve`) on
//! 127.0.0.1, the real Kubernetes adapters, and a real kube-apiserver (oxide-sim's) holding the
//! Secret, ConfigMap, CronJob and Jobs. One test runs on a preset cluster (VMs, k3s, state
//! written by the product, exactly as after bootstrap); the load tests use a bare apiserver seeded
//! with the product's `KubeStateStore::ensure_state`, which starts in milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use oxide_controller::adapters::kube_cluster::KubeCluster;
use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::base::secrets::ClusterSecrets;
use oxide_controller::base::secrets::webhook::WebhookTokens;
use oxide_controller::domain::spec::ClusterSpec;
use oxide_controller::ports::cluster::{JOBS_NAMESPACE, NAMESPACE, OBJECT_NAME, ON_DEMAND_JOB};
use oxide_controller::ports::state::{ConfigSnapshot, SCALE_OBJECT, StateStore, keys};
use oxide_controller::webhook::host::{self, HostOptions};
use oxide_controller::webhook::{Deps, WebhookConfig};
use oxide_sim::control_plane::proxy::LocalApi;
use oxide_sim::guest::cluster_api::{BlockingKube, KubeView};
use oxide_sim::harness::preset::Preset;
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::{Value, json};

/// reqwest without its `json` feature (not enabled in the workspace).
trait JsonBody {
    fn json_body(self, v: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, v: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(v.to_string())
    }
}

async fn json_of(r: reqwest::Response) -> Value {
    let text = r.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A running webhook host and the shutdown switch for it.
struct Webhook {
    base: String,
    deps: Arc<Deps<KubeStateStore, KubeCluster>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Webhook {
    /// Serves the webhook for the cluster behind `kubeconfig` on a free loopback port.
    async fn start(kubeconfig: &Path) -> Webhook {
        let client = oxide_controller::adapters::kubeclient::client(Some(kubeconfig), None)
            .await
            .unwrap();
        let deps = Arc::new(Deps::new(
            KubeStateStore::new(client.clone(), NAMESPACE),
            KubeCluster::new(client, NAMESPACE),
            WebhookConfig::default(),
        ));
        let listener = host::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(host::serve(
            listener,
            deps.clone(),
            HostOptions::default(),
            async {
                let _ = stopped.await;
            },
        ));
        Webhook {
            base,
            deps,
            stop: Some(stop),
            task,
        }
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Where the cluster's objects can be inspected directly.
struct Cluster {
    kube: BlockingKube,
    kubeconfig: PathBuf,
    token: String,
    _keep: Box<dyn std::any::Any + Send>,
}

impl Cluster {
    /// A preset `cluster:1:1` simulator: one server, one worker, state written by the product.
    async fn preset() -> Cluster {
        let sim: SimHandle = Sim::start(SimOptions {
            ssh_port: 2222,
            preset: Some(Preset::Cluster {
                control_plane: 1,
                workers: 1,
            }),
            ..SimOptions::default()
        })
        .await
        .expect("preset builds");
        let kubeconfig = sim.kubeconfig.clone().unwrap();
        let kube = BlockingKube(sim.kube());
        let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
            .await
            .unwrap();
        let token = KubeStateStore::new(client, NAMESPACE)
            .read_webhook_tokens()
            .await
            .unwrap()
            .expect("the preset made Secret oxide-controller-webhook-auth")
            .token;
        let c = Cluster {
            kube,
            kubeconfig,
            token,
            _keep: Box::new(sim),
        };
        c.add_cronjob();
        c
    }

    /// A bare apiserver seeded the way bootstrap seeds it: 2 workers in [0, `max`].
    async fn bare(max: u32) -> Cluster {
        let local = std::sync::Arc::new(LocalApi::apiserver_only().await.unwrap());
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, local.admin_kubeconfig()).unwrap();
        let client = oxide_controller::adapters::kubeclient::client(Some(&kubeconfig), None)
            .await
            .unwrap();
        let mut spec = ClusterSpec::new("demo", "demo", "ubuntu-2404", 1, 2);
        spec.worker_pools[0].max = max;
        // The administrator lets the webhook raise bounds up to the pool's first max.
        spec.webhook = Some(oxide_controller::domain::spec::WebhookSpec { ceiling: max });
        let token = "e2e-webhook-token-7c41".to_owned();
        let store = KubeStateStore::new(client, NAMESPACE);
        store
            .ensure_state(
                &ClusterSecrets::default(),
                BTreeMap::from([(keys::SPEC.to_owned(), spec.to_yaml())]),
            )
            .await
            .unwrap();
        store
            .ensure_webhook_tokens(&WebhookTokens {
                token: token.clone(),
                read_token: None,
            })
            .await
            .unwrap();
        let c = Cluster {
            kube: BlockingKube(KubeView::Local(local.clone())),
            kubeconfig,
            token,
            _keep: Box::new((local, dir)),
        };
        c.add_cronjob();
        c
    }

    fn add_cronjob(&self) {
        self.kube
            .apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBS_NAMESPACE}}))
            .unwrap();
        self.kube
            .apply(json!({"apiVersion": "batch/v1", "kind": "CronJob",
                "metadata": {"name": OBJECT_NAME, "namespace": JOBS_NAMESPACE},
                "spec": {"schedule": "*/5 * * * *", "concurrencyPolicy": "Forbid", "jobTemplate": {"spec": {
                    "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "serviceAccountName": OBJECT_NAME,
                    "containers": [{"name": "reconcile", "image": "oxide-controller:test", "args": ["reconcile-once"]}]}}}}}}))
            .unwrap();
    }

    fn configmap(&self) -> Value {
        self.kube
            .get("v1", "ConfigMap", Some(NAMESPACE), OBJECT_NAME)
            .unwrap()
    }

    /// ConfigMap `oxide-controller-scale`, where the webhook writes (audit security-2 N4).
    fn scale_object(&self) -> Value {
        self.kube
            .get("v1", "ConfigMap", Some(NAMESPACE), SCALE_OBJECT)
            .unwrap()
    }

    /// The versions of both objects the webhook reads: unchanged means nothing was written.
    fn resource_version(&self) -> String {
        let rv = |o: Value| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        format!("{}/{}", rv(self.configmap()), rv(self.scale_object()))
    }

    /// The spec in effect: `spec.yaml` with the webhook's counts.
    fn spec(&self) -> ClusterSpec {
        let snapshot = |cm: Value| ConfigSnapshot {
            resource_version: String::new(),
            data: serde_json::from_value(cm["data"].clone()).unwrap_or_default(),
        };
        let config = snapshot(self.configmap());
        let scale = snapshot(self.scale_object());
        let base = ClusterSpec::from_yaml(config.spec_yaml().unwrap()).unwrap();
        oxide_controller::workflows::scale::effective(base, Some(&scale), &config).spec
    }

    fn workers(&self) -> u32 {
        self.spec().worker_pools[0].count
    }

    fn jobs(&self) -> Vec<Value> {
        self.kube.list("batch/v1", "Job", Some(JOBS_NAMESPACE))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_preset_cluster_every_verb_changes_the_configmap_and_bad_tokens_change_nothing() {
    let cluster = Cluster::preset().await;
    let hook = Webhook::start(&cluster.kubeconfig).await;
    let http = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", hook.base);
    let token = cluster.token.as_str();
    assert_eq!(cluster.workers(), 1);

    // GET: the ancestor's bare count, or JSON on request.
    let r = http
        .get(url("/nodes/workers"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (200, "1".to_owned())
    );
    let r = http
        .get(url("/nodes/workers"))
        .bearer_auth(token)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(r).await,
        json!({"pool": "workers", "count": 1, "min": 0, "max": 100})
    );

    // PUT, PATCH and the legacy POST each land in spec.yaml.
    let r = http
        .put(url("/nodes/workers"))
        .bearer_auth(token)
        .json_body(&json!({"count": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = json_of(r).await;
    assert_eq!(
        (
            body["previous"].as_u64(),
            body["count"].as_u64(),
            body["reconcile"].as_str()
        ),
        (Some(1), Some(3), Some("triggered"))
    );
    assert_eq!(cluster.workers(), 3);
    let job = cluster
        .kube
        .get("batch/v1", "Job", Some(JOBS_NAMESPACE), ON_DEMAND_JOB)
        .expect("a reconcile Job");
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["args"][0],
        "reconcile-once"
    );

    let r = http
        .patch(url("/nodes/workers"))
        .bearer_auth(token)
        .json_body(&json!({"delta": -1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(cluster.workers(), 2);

    let r = http
        .post(url("/nodes/workers/modify"))
        .bearer_auth(token)
        .header("content-type", "application/text")
        .body("4")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "the ancestor's success status");
    assert_eq!(r.text().await.unwrap(), "Worker count changed from 2 to 4");
    assert_eq!(cluster.workers(), 4);
    let r = http
        .get(url("/nodes/workers"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "4");

    // The same under /pools/{pool}; the control plane keeps an odd count.
    let r = http
        .patch(url("/pools/workers"))
        .bearer_auth(token)
        .json_body(&json!({"delta": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .put(url("/pools/control-plane"))
        .bearer_auth(token)
        .json_body(&json!({"count": 2}))
        .send()
        .await
        .unwrap();
    // The webhook's token cannot change the control plane (issue 34 §5).
    assert_eq!(r.status(), 403);
    let r = http
        .get(url("/pools/gpu"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("pools are: control-plane, workers")
    );
    assert_eq!(
        (cluster.workers(), cluster.spec().control_plane.count),
        (5, 1)
    );

    // Only one Job for all of that: the later changes found it pending.
    assert_eq!(cluster.jobs().len(), 1);
    let r = http
        .post(url("/reconcile"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), json_of(r).await["reconcile"].clone()),
        (202, json!("pending"))
    );

    // Status before any reconcile run; health without a token.
    let r = http
        .get(url("/status"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        http.get(url("/healthz")).send().await.unwrap().status(),
        200
    );
    assert_eq!(http.get(url("/readyz")).send().await.unwrap().status(), 200);

    // Missing, empty, wrong or query-string tokens: 401 on every write, nothing written.
    let rv = cluster.resource_version();
    let wrong = format!("{token}0");
    for (auth, query) in [
        (None, String::new()),
        (Some(String::new()), String::new()),
        (Some(wrong.clone()), String::new()),
        (None, format!("?token={token}")),
        (None, format!("?access_token={token}")),
        (Some(token.to_owned()), format!("?access_token={token}")),
    ] {
        let calls = [
            http.put(url(&format!("/nodes/workers{query}")))
                .json_body(&json!({"count": 9})),
            http.patch(url(&format!("/nodes/workers{query}")))
                .json_body(&json!({"delta": 1})),
            http.post(url(&format!("/nodes/workers/modify{query}")))
                .body("9"),
            http.post(url(&format!("/reconcile{query}"))),
        ];
        for call in calls {
            let call = match &auth {
                Some(t) => call.header("authorization", format!("Bearer {t}")),
                None => call,
            };
            let r = call.send().await.unwrap();
            assert_eq!(
                r.status(),
                401,
                "auth {:?} query {query:?}",
                auth.as_ref().map(|a| a.len())
            );
            assert!(
                r.headers()["www-authenticate"]
                    .to_str()
                    .unwrap()
                    .starts_with("Bearer")
            );
            assert!(!r.text().await.unwrap().contains(token));
        }
    }
    assert_eq!(cluster.resource_version(), rv, "no write got through");
    assert_eq!(cluster.workers(), 5);

    let metrics = http
        .get(url("/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains(r#"oxide_controller_webhook_requests_total{route="/nodes/workers/modify",method="POST",status="401"} 6"#), "{metrics}");
    assert!(
        metrics
            .contains(r#"oxide_controller_webhook_reconcile_triggers_total{result="created"} 1"#),
        "{metrics}"
    );
    hook.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_posts_leaves_at_most_one_pending_reconcile_job() {
    let cluster = Cluster::bare(200).await;
    let hook = Webhook::start(&cluster.kubeconfig).await;
    let http = reqwest::Client::new();
    let url = format!("{}/nodes/workers/modify", hook.base);
    let calls = (1..=100).map(|n| {
        let req = http
            .post(&url)
            .bearer_auth(&cluster.token)
            .body(n.to_string());
        async move { req.send().await.unwrap().status().as_u16() }
    });
    let statuses = futures::future::join_all(calls).await;
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
    let jobs = cluster.jobs();
    assert_eq!(
        jobs.len(),
        1,
        "one pending reconcile Job for the whole burst"
    );
    assert_eq!(jobs[0]["metadata"]["name"], ON_DEMAND_JOB);
    assert!((1..=100).contains(&cluster.workers()));
    hook.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_patches_raise_the_count_by_exactly_500_without_a_5xx() {
    let cluster = Cluster::bare(1000).await;
    // Two hosts on one ConfigMap, as two webhook replicas would be: within a host writes
    // queue; between hosts they race and 409s must be re-read and re-applied.
    let hooks = [
        Webhook::start(&cluster.kubeconfig).await,
        Webhook::start(&cluster.kubeconfig).await,
    ];
    let http = reqwest::Client::new();
    let calls = (0..500).map(|i| {
        let req = http
            .patch(format!("{}/nodes/workers", hooks[i % 2].base))
            .bearer_auth(&cluster.token)
            .json_body(&json!({"delta": 1}));
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    });
    let results = futures::future::join_all(calls).await;
    let failures: Vec<_> = results.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failures.is_empty(),
        "{} failed, e.g. {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(cluster.workers(), 502);
    assert_eq!(cluster.jobs().len(), 1);
    let conflicts: u64 = hooks
        .iter()
        .map(|h| {
            let text = h.deps.metrics.render();
            let line = text
                .lines()
                .find(|l| l.starts_with("oxide_controller_webhook_state_conflicts_total "))
                .unwrap();
            line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
        })
        .sum();
    let writes: u64 = hooks.iter().map(|h| h.deps.metrics.writes()).sum();
    eprintln!(
        "500 concurrent PATCHes over two hosts: {writes} ConfigMap writes, {conflicts} conflicts re-read and re-applied"
    );
    // Group commit: changes queued behind a write go together in the next one, so the burst
    // costs far fewer writes than changes (one per change without it).
    assert!(writes <= 250, "500 changes took {writes} ConfigMap writes");
    for h in hooks {
        h.shutdown().await;
    }
}

/// Manual and automatic together, over HTTP against the apiserver: enabling autoscaling with
/// `PUT /pools/{pool}/autoscale` writes the ConfigMap and starts a Job; a count change on the
/// pool is then a 409 naming the bounds endpoint and writes nothing; the endpoint refuses
/// callers without the token; two webhook processes changing the bounds at once lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounds_endpoint_owns_an_autoscaling_pools_count() {
    let cluster = Cluster::bare(10).await;
    let hook = Webhook::start(&cluster.kubeconfig).await;
    let other = Webhook::start(&cluster.kubeconfig).await;
    let http = reqwest::Client::new();
    let token = cluster.token.as_str();
    let bounds = |base: &str| format!("{base}/pools/workers/autoscale");

    // Unauthenticated: 401, nothing written.
    let rv = cluster.resource_version();
    for r in [
        http.get(bounds(&hook.base)).send().await.unwrap(),
        http.put(bounds(&hook.base))
            .bearer_auth("wrong")
            .json_body(&json!({"enabled": true}))
            .send()
            .await
            .unwrap(),
    ] {
        assert_eq!(r.status(), 401);
    }
    assert_eq!(cluster.resource_version(), rv);

    // PUT: the spec changes and a reconcile Job is created.
    let r = http
        .put(bounds(&hook.base))
        .bearer_auth(token)
        .json_body(&json!({"enabled": true, "min": 1, "max": 6}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(json_of(r).await["reconcile"], "triggered");
    let p = cluster.spec().worker_pools[0].clone();
    assert_eq!((p.min, p.max, p.count), (1, 6, 2));
    assert!(p.autoscale.is_some_and(|a| a.enabled));
    assert_eq!(cluster.jobs().len(), 1);
    let r = http
        .get(bounds(&hook.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(r).await,
        json!({"pool": "workers", "count": 2, "min": 1, "max": 6, "enabled": true})
    );

    // A count change is refused with the documented body; nothing is written or started.
    let rv = cluster.resource_version();
    let r = http
        .patch(format!("{}/nodes/workers", hook.base))
        .bearer_auth(token)
        .json_body(&json!({"delta": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let body = json_of(r).await;
    assert_eq!(
        (
            &body["error"],
            &body["pool"],
            &body["min"],
            &body["max"],
            &body["bounds"]
        ),
        (
            &json!("autoscaling"),
            &json!("workers"),
            &json!(1),
            &json!(6),
            &json!("/pools/workers/autoscale")
        ),
        "{body}"
    );
    assert_eq!(cluster.resource_version(), rv);
    assert_eq!(cluster.jobs().len(), 1);
    assert_eq!(cluster.workers(), 2);

    // Bad input names the field.
    let r = http
        .put(bounds(&hook.base))
        .bearer_auth(token)
        .json_body(&json!({"min": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(json_of(r).await["field"], "min");
    assert_eq!(cluster.resource_version(), rv);

    // Two processes, concurrent writers of different fields: both changes survive.
    for round in 0..5u32 {
        let (a, b) = tokio::join!(
            http.put(bounds(&hook.base))
                .bearer_auth(token)
                .json_body(&json!({"min": 2 + round % 2}))
                .send(),
            http.put(bounds(&other.base))
                .bearer_auth(token)
                .json_body(&json!({"max": 8 + round % 2}))
                .send(),
        );
        assert_eq!(
            (a.unwrap().status().as_u16(), b.unwrap().status().as_u16()),
            (200, 200)
        );
        let p = &cluster.spec().worker_pools[0];
        assert_eq!(
            (p.min, p.max),
            (2 + round % 2, 8 + round % 2),
            "round {round}"
        );
    }
    hook.shutdown().await;
    other.shutdown().await;
}
