//! `KubeStateStore` against a real kube-apiserver (through the simulator's front proxy, which
//! counts requests) over HTTPS: optimistic concurrency on the
//! ConfigMap (one of two racing writers wins, the other gets `Conflict`; a thousand
//! read-increment-write loops lose no update), `ensure_state` filling in without
//! overwriting, and the errors a caller acts on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::SubsecRound as _;
use std::sync::atomic::{AtomicU64, Ordering};

use oxide_controller::adapters::kube_store::KubeStateStore;
use oxide_controller::adapters::kubeclient;
use oxide_controller::base::secrets::webhook::{AUTH_SECRET, WebhookTokens};
use oxide_controller::base::secrets::{ClusterSecrets, keys as secret_keys};
use oxide_controller::ports::cluster::{NAMESPACE, OBJECT_NAME};
use oxide_controller::ports::state::{StateError, StateStore, keys};
use oxide_sim::control_plane::proxy::LocalApi;
use serde_json::{Value, json};

/// A real apiserver (no controllers needed here) behind a front proxy on loopback, and a
/// kubeconfig file for it, as `--kubeconfig` would name it.
struct Env {
    api: LocalApi,
    dir: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        let api = LocalApi::apiserver_only().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("admin.yaml"), api.admin_kubeconfig()).unwrap();
        Env { api, dir }
    }

    async fn get(&self, kind: &str) -> Value {
        self.api
            .control_plane
            .get("v1", kind, Some(NAMESPACE), OBJECT_NAME)
            .await
            .unwrap()
            .unwrap()
    }

    async fn patch(&self, kind: &str, patch: Value) {
        self.api
            .control_plane
            .merge_patch("v1", kind, Some(NAMESPACE), OBJECT_NAME, &patch)
            .await
            .unwrap();
    }

    /// A fresh client (its own connection pool, like a separate process).
    async fn client(&self) -> kube::Client {
        kubeclient::client(Some(&self.dir.path().join("admin.yaml")), None)
            .await
            .unwrap()
    }

    async fn store(&self) -> KubeStateStore {
        KubeStateStore::new(self.client().await, NAMESPACE)
    }
}

fn secrets() -> ClusterSecrets {
    ClusterSecrets {
        oxide_host: "https://rack.example".into(),
        oxide_token: "oxide-token-1".into(),
        oxide_project: "proj".into(),
        oxide_cluster: "demo".into(),
        k3s_token: "k3s-token-1".into(),
        k3s_agent_token: "agent-token-1".into(),
        ssh_public_key: "ssh-ed25519 AAAA1".into(),
        user_ssh_public_key: Some("ssh-ed25519 USER1".into()),
        tailscale_auth_key: None,
        oxide_token_id: Some("5a1e0000-0000-4000-8000-0000000000a1".into()),
    }
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn of_two_writers_with_the_same_resource_version_exactly_one_wins_every_round() {
    let env = Env::start().await;
    let (a, b) = (env.store().await, env.store().await);
    a.ensure_state(&secrets(), config(&[(keys::SCHEMA_VERSION, "1")]))
        .await
        .unwrap();

    let mut wins = (0, 0);
    for round in 0..50 {
        let (seen_a, seen_b) = (
            a.read_config().await.unwrap(),
            b.read_config().await.unwrap(),
        );
        assert_eq!(
            seen_a.resource_version, seen_b.resource_version,
            "round {round}"
        );
        let data_a = config(&[("writer", "a"), ("round", &round.to_string())]);
        let data_b = config(&[("writer", "b"), ("round", &round.to_string())]);
        let (ra, rb) = tokio::join!(
            a.replace_config(&seen_a.resource_version, data_a.clone()),
            b.replace_config(&seen_b.resource_version, data_b.clone()),
        );
        let after = a.read_config().await.unwrap();
        match (ra, rb) {
            (Ok(rv), Err(StateError::Conflict { what })) => {
                wins.0 += 1;
                assert_eq!(
                    (after.resource_version, after.data),
                    (rv, data_a),
                    "round {round}"
                );
                assert!(
                    what.contains("ConfigMap kube-system/oxide-controller"),
                    "{what}"
                );
            }
            (Err(StateError::Conflict { .. }), Ok(rv)) => {
                wins.1 += 1;
                assert_eq!(
                    (after.resource_version, after.data),
                    (rv, data_b),
                    "round {round}"
                );
            }
            other => {
                panic!("round {round}: expected exactly one winner and one Conflict, got {other:?}")
            }
        }
    }
    assert_eq!(wins.0 + wins.1, 50);
}

#[tokio::test]
async fn a_thousand_concurrent_increments_with_re_read_and_retry_lose_nothing() {
    let env = Env::start().await;
    let stores: Vec<Arc<KubeStateStore>> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(Arc::new(env.store().await));
        }
        v
    };
    stores[0]
        .ensure_state(&secrets(), config(&[("counter", "0")]))
        .await
        .unwrap();

    // Bounded in-flight work keeps the contention (and the run time) sane while still
    // racing plenty: every increment competes with up to 24 others.
    let gate = Arc::new(tokio::sync::Semaphore::new(24));
    let conflicts = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let store = stores[i % stores.len()].clone();
        let (gate, conflicts) = (gate.clone(), conflicts.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            loop {
                let seen = store.read_config().await.unwrap();
                let n: u64 = seen.data["counter"].parse().unwrap();
                let mut data = seen.data.clone();
                data.insert("counter".into(), (n + 1).to_string());
                match store.replace_config(&seen.resource_version, data).await {
                    Ok(_) => return,
                    Err(e) if e.is_conflict() => {
                        conflicts.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                    }
                    Err(e) => panic!("increment {i}: {e:#?}"),
                }
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let end = stores[0].read_config().await.unwrap();
    assert_eq!(end.data["counter"], "1000");
    // The writers really raced: without conflicts this test would prove nothing.
    assert!(conflicts.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn ensure_state_creates_both_objects_then_fills_missing_keys_without_overwriting() {
    let env = Env::start().await;
    let store = env.store().await;
    assert!(matches!(
        store.read_config().await,
        Err(StateError::NotFound { .. })
    ));
    assert!(matches!(
        store.read_secrets().await,
        Err(StateError::NotFound { .. })
    ));

    let first = secrets();
    store
        .ensure_state(
            &first,
            config(&[(keys::SPEC, "pools: {}\n"), (keys::SCHEMA_VERSION, "1")]),
        )
        .await
        .unwrap();
    assert_eq!(store.read_secrets().await.unwrap(), first);
    let cfg = store.read_config().await.unwrap();
    assert_eq!(cfg.spec_yaml(), Some("pools: {}\n"));
    for kind in ["Secret", "ConfigMap"] {
        let obj = env.get(kind).await;
        assert_eq!(
            obj["metadata"]["labels"]["app.kubernetes.io/name"], "oxide-controller",
            "{kind}"
        );
    }

    // Someone deletes one Secret key and one ConfigMap key; the status key was written by
    // reconcile meanwhile. An older controller left its SSH private key in the Secret.
    env.patch(
        "Secret",
        json!({"data": {
            secret_keys::K3S_AGENT_TOKEN: null,
            secret_keys::RETIRED_SSH_PRIVATE_KEY: b64("-----BEGIN OPENSSH PRIVATE KEY-----"),
        }}),
    )
    .await;
    let mut data = cfg.data.clone();
    data.remove(keys::SCHEMA_VERSION);
    data.insert(keys::STATUS.into(), "{\"ok\":true}".into());
    store
        .replace_config(&cfg.resource_version, data)
        .await
        .unwrap();

    // A second bootstrap with different values only fills the holes.
    let before = chrono::Utc::now();
    let second = ClusterSecrets {
        oxide_token: "oxide-token-2".into(),
        k3s_token: "k3s-token-2".into(),
        k3s_agent_token: "agent-token-2".into(),
        tailscale_auth_key: Some("ts-2".into()),
        ..secrets()
    };
    store
        .ensure_state(
            &second,
            config(&[
                (keys::SPEC, "pools: {changed: 1}\n"),
                (keys::SCHEMA_VERSION, "2"),
                (keys::STATUS, "{}"),
            ]),
        )
        .await
        .unwrap();
    let got = store.read_secrets().await.unwrap();
    assert_eq!(
        got.oxide_token, "oxide-token-1",
        "present values are never overwritten"
    );
    assert_eq!(got.k3s_token, "k3s-token-1");
    assert_eq!(
        got.k3s_agent_token, "agent-token-2",
        "a missing key is filled in"
    );
    assert_eq!(got.tailscale_auth_key.as_deref(), Some("ts-2"));
    let data = &env.get("Secret").await["data"];
    assert!(
        data.get(secret_keys::RETIRED_SSH_PRIVATE_KEY).is_none(),
        "the SSH private key an older version wrote is removed: {data}"
    );
    let cfg = store.read_config().await.unwrap();
    // Audit security-2 N1: when, for the backups (none of an etcd snapshot older than that).
    let removed_at = |cfg: &oxide_controller::ports::state::ConfigSnapshot| {
        let v = &cfg.data[keys::RETIRED_KEYS_REMOVED_AT];
        chrono::DateTime::parse_from_rfc3339(v)
            .unwrap_or_else(|e| panic!("{v:?}: {e}"))
            .with_timezone(&chrono::Utc)
    };
    let at = removed_at(&cfg);
    let after = chrono::Utc::now();
    assert!(
        at >= after.trunc_subsecs(0) && at >= before && at <= after + chrono::Duration::seconds(1),
        "{before} <= {at} ~ {after}"
    );
    assert_eq!(cfg.spec_yaml(), Some("pools: {}\n"));
    assert_eq!(cfg.status_json(), Some("{\"ok\":true}"));
    assert_eq!(
        cfg.data.get(keys::SCHEMA_VERSION).map(String::as_str),
        Some("2")
    );

    // Nothing missing: no write at all.
    env.api.proxy.reset_counters();
    store
        .ensure_state(&second, config(&[(keys::SCHEMA_VERSION, "3")]))
        .await
        .unwrap();
    let writes: u64 = env
        .api
        .proxy
        .counters()
        .iter()
        .filter(|(k, _)| !k.starts_with("GET "))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(writes, 0, "{:?}", env.api.proxy.counters());
    assert_eq!(removed_at(&store.read_config().await.unwrap()), at);

    // A run cut short after it began the removal (the record says `removing`): the next one,
    // finding no retired key left, records the time then.
    let cfg = store.read_config().await.unwrap();
    let mut data = cfg.data.clone();
    data.insert(keys::RETIRED_KEYS_REMOVED_AT.into(), "removing".into());
    store
        .replace_config(&cfg.resource_version, data)
        .await
        .unwrap();
    store.ensure_state(&second, config(&[])).await.unwrap();
    assert!(removed_at(&store.read_config().await.unwrap()) >= at);
}

/// Audit H1: the webhook's tokens live in Secret `oxide-controller-webhook-auth`, never in the
/// state Secret (which the reconcile account reads whole). An older cluster's tokens, kept in
/// the state Secret and perhaps rotated by hand, are the ones in force: bootstrap moves them
/// (never the resume file's over them) and removes them from the state Secret; a later run
/// writes nothing; a restore's rewrite replaces them and removes a backup's moved keys too.
#[tokio::test]
async fn the_webhooks_tokens_move_out_of_the_state_secret_keeping_those_in_force() {
    let env = Env::start().await;
    let store = env.store().await;
    store
        .ensure_state(&secrets(), config(&[(keys::SCHEMA_VERSION, "1")]))
        .await
        .unwrap();
    assert_eq!(store.read_webhook_tokens().await.unwrap(), None);
    // What an older controller left, its write token rotated by hand since.
    let moved = |token: &str, read: &str| {
        json!({"data": {
            secret_keys::WEBHOOK_TOKEN: b64(token),
            secret_keys::WEBHOOK_READ_TOKEN: b64(read),
        }})
    };
    env.patch("Secret", moved("hook-rotated-by-hand", "read-1"))
        .await;
    let resume_file = WebhookTokens {
        token: "hook-from-the-resume-file".into(),
        read_token: Some("read-from-the-resume-file".into()),
    };
    let in_force = WebhookTokens {
        token: "hook-rotated-by-hand".into(),
        read_token: Some("read-1".into()),
    };
    assert_eq!(
        store.ensure_webhook_tokens(&resume_file).await.unwrap(),
        in_force
    );
    assert_eq!(
        store.read_webhook_tokens().await.unwrap(),
        Some(in_force.clone())
    );
    let state = &env.get("Secret").await["data"];
    for key in secret_keys::MOVED_TO_WEBHOOK_AUTH {
        assert!(state.get(*key).is_none(), "{key} is still in {state}");
    }
    assert_eq!(
        store.read_secrets().await.unwrap(),
        secrets(),
        "nothing else changed"
    );
    let auth = env
        .api
        .control_plane
        .get("v1", "Secret", Some(NAMESPACE), AUTH_SECRET)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        auth["metadata"]["labels"]["app.kubernetes.io/name"], "oxide-controller",
        "{auth}"
    );

    // A later run (another resume file's tokens): nothing written, the tokens stay.
    env.api.proxy.reset_counters();
    store
        .ensure_state(&secrets(), config(&[(keys::SCHEMA_VERSION, "1")]))
        .await
        .unwrap();
    assert_eq!(
        store.ensure_webhook_tokens(&resume_file).await.unwrap(),
        in_force
    );
    let writes: Vec<_> = env
        .api
        .proxy
        .counters()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("GET "))
        .collect();
    assert!(writes.is_empty(), "{writes:?}");

    // A restore of a backup from before the move: both keys back in the state Secret. The
    // rewrite sets new tokens and removes them, and says they were there.
    env.patch("Secret", moved("hook-of-the-backup", "read-of-the-backup"))
        .await;
    let new = WebhookTokens {
        token: "hook-new".into(),
        read_token: Some("read-new".into()),
    };
    assert!(store.replace_webhook_tokens(&new).await.unwrap());
    assert_eq!(
        store.read_webhook_tokens().await.unwrap(),
        Some(new.clone())
    );
    let state = &env.get("Secret").await["data"];
    for key in secret_keys::MOVED_TO_WEBHOOK_AUTH {
        assert!(state.get(*key).is_none(), "{key} is still in {state}");
    }
    assert!(!store.replace_webhook_tokens(&new).await.unwrap());

    // A new cluster: the resume file's tokens.
    let fresh = Env::start().await;
    let store = fresh.store().await;
    store
        .ensure_state(&secrets(), config(&[(keys::SCHEMA_VERSION, "1")]))
        .await
        .unwrap();
    assert_eq!(
        store.ensure_webhook_tokens(&resume_file).await.unwrap(),
        resume_file
    );
    assert!(
        fresh.get("Secret").await["data"]
            .get(secret_keys::WEBHOOK_TOKEN)
            .is_none()
    );
}

#[tokio::test]
async fn concurrent_bootstraps_both_succeed_and_agree() {
    let env = Env::start().await;
    let (a, b) = (env.store().await, env.store().await);
    let (mine, other) = (
        secrets(),
        ClusterSecrets {
            k3s_token: "k3s-token-other".into(),
            ..secrets()
        },
    );
    let (ra, rb) = tokio::join!(
        a.ensure_state(&mine, config(&[("from", "a"), ("a-only", "1")])),
        b.ensure_state(&other, config(&[("from", "b"), ("b-only", "1")])),
    );
    ra.unwrap();
    rb.unwrap();
    let cfg = a.read_config().await.unwrap();
    // Whoever created it first set `from`; the other only added its missing key.
    assert!(cfg.data["from"] == "a" || cfg.data["from"] == "b");
    assert_eq!(
        (cfg.data.get("a-only"), cfg.data.get("b-only")),
        (Some(&"1".to_string()), Some(&"1".to_string()))
    );
    let token = a.read_secrets().await.unwrap().k3s_token;
    assert!(token == "k3s-token-1" || token == "k3s-token-other");
}

#[tokio::test]
async fn replace_with_a_stale_version_conflicts_and_keeps_annotations_of_the_version_read() {
    let env = Env::start().await;
    let store = env.store().await;
    store
        .ensure_state(&secrets(), config(&[("k", "0")]))
        .await
        .unwrap();
    env.patch(
        "ConfigMap",
        json!({"metadata": {"annotations": {"example.com/owner": "platform-team"}}}),
    )
    .await;

    let seen = store.read_config().await.unwrap();
    let rv = store
        .replace_config(&seen.resource_version, config(&[("k", "1")]))
        .await
        .unwrap();
    assert_ne!(rv, seen.resource_version);
    let stored = env.get("ConfigMap").await;
    assert_eq!(
        stored["metadata"]["annotations"]["example.com/owner"],
        "platform-team"
    );
    assert_eq!(
        stored["metadata"]["labels"]["app.kubernetes.io/name"],
        "oxide-controller"
    );
    assert_eq!(stored["data"], json!({"k": "1"}));

    let stale = store
        .replace_config(&seen.resource_version, config(&[("k", "2")]))
        .await;
    assert!(
        matches!(stale, Err(StateError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(store.read_config().await.unwrap().data["k"], "1");
}

#[tokio::test]
async fn a_secret_missing_a_required_key_is_malformed_and_names_the_key() {
    let env = Env::start().await;
    let store = env.store().await;
    env.api.control_plane
        .apply(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": OBJECT_NAME, "namespace": NAMESPACE},
            "data": {"oxide-host": b64("https://rack"), "oxide-token": b64("t"), "oxide-project": b64("p")}}))
        .await
        .unwrap();
    match store.read_secrets().await {
        Err(StateError::Malformed { what, message }) => {
            assert!(
                what.contains("Secret kube-system/oxide-controller"),
                "{what}"
            );
            assert!(message.contains("k3s-token"), "{message}");
            // The values present must not leak into the error.
            assert!(
                !message.contains("https://rack") && !message.contains("\"t\""),
                "{message}"
            );
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[tokio::test]
async fn a_service_account_without_rbac_is_forbidden() {
    let env = Env::start().await;
    env.store()
        .await
        .ensure_state(&secrets(), config(&[("k", "v")]))
        .await
        .unwrap();
    let path = env.dir.path().join("sa.yaml");
    std::fs::write(
        &path,
        env.api
            .control_plane
            .service_account_kubeconfig(&env.api.url, NAMESPACE, "nobody")
            .await
            .unwrap(),
    )
    .unwrap();
    let store = KubeStateStore::new(
        kubeclient::client(Some(&path), None).await.unwrap(),
        NAMESPACE,
    );
    match store.read_config().await {
        Err(StateError::Forbidden { what, message }) => {
            assert!(what.contains("ConfigMap"), "{what}");
            assert!(message.contains("forbidden"), "{message}");
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
}

/// Host key pins in the Secret: added per instance, never replaced (a changed key is for a
/// person to check), and what other runs stored comes back.
#[tokio::test]
async fn host_key_pins_are_added_to_the_secret_and_never_replaced() {
    let env = Env::start().await;
    let store = env.store().await;
    let pins = |pairs: &[(&str, &str)]| -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(i, fp)| (i.to_string(), vec![fp.to_string()]))
            .collect()
    };
    assert!(matches!(
        store
            .merge_host_key_pins(&pins(&[("a", "SHA256:a1")]))
            .await,
        Err(StateError::NotFound { .. })
    ));
    store
        .ensure_state(&secrets(), BTreeMap::new())
        .await
        .unwrap();
    let first = store
        .merge_host_key_pins(&pins(&[("a", "SHA256:a1")]))
        .await
        .unwrap();
    assert_eq!(first, pins(&[("a", "SHA256:a1")]));
    let second = store
        .merge_host_key_pins(&pins(&[("a", "SHA256:other"), ("b", "SHA256:b1")]))
        .await
        .unwrap();
    assert_eq!(second, pins(&[("a", "SHA256:a1"), ("b", "SHA256:b1")]));
    // Another run with nothing new reads what is stored; the required keys are untouched.
    let other = env.store().await;
    assert_eq!(
        other.merge_host_key_pins(&BTreeMap::new()).await.unwrap(),
        second
    );
    assert_eq!(other.read_secrets().await.unwrap(), secrets());
    let secret = env.get("Secret").await;
    assert!(secret["data"][keys::HOST_KEY_PINS].is_string(), "{secret}");
}
