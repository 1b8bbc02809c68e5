//! Shared harness for the Oxide API tests: a simulator with fast timings, a JSON client over
//! `OxideSim::handle`, and a `RackEvents` recorder.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use oxide_sim::oxide::{
    AddressPool, Faults, OxideSim, OxideSimConfig, RackEvents, RunningInstance, Timings,
};
use serde_json::{Value, json};
use uuid::Uuid;

pub const TOKEN: &str = "test-token-0123456789";

/// What the simulator told `RackEvents`, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    Running(String),
    Halted(Uuid),
    Deleted(Uuid),
    Fip(IpAddr, Option<Uuid>),
}

#[derive(Default)]
pub struct Recorder(pub Mutex<Vec<Seen>>);

impl RackEvents for Recorder {
    fn instance_running(&self, inst: &RunningInstance) {
        self.0
            .lock()
            .unwrap()
            .push(Seen::Running(inst.name.clone()));
    }
    fn instance_halted(&self, id: Uuid) {
        self.0.lock().unwrap().push(Seen::Halted(id));
    }
    fn instance_deleted(&self, id: Uuid) {
        self.0.lock().unwrap().push(Seen::Deleted(id));
    }
    fn floating_ip_changed(&self, ip: IpAddr, instance: Option<Uuid>) {
        self.0.lock().unwrap().push(Seen::Fip(ip, instance));
    }
}

pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Resp {
    pub fn code(&self) -> Option<&str> {
        self.body.get("error_code").and_then(Value::as_str)
    }
    pub fn message(&self) -> &str {
        self.body
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
    pub fn str(&self, key: &str) -> &str {
        self.body.get(key).and_then(Value::as_str).unwrap_or("")
    }
}

pub struct Api {
    pub sim: OxideSim,
    pub events: Arc<Recorder>,
    pub faults: Faults,
    pub pool: AddressPool,
}

pub fn timings() -> Timings {
    Timings {
        create_to_starting: Duration::ZERO,
        // Wide enough that a loaded machine still observes the transient states the tests
        // act in (attach during `starting`, start during `stopping`).
        starting_to_running: Duration::from_millis(250),
        stopping_to_stopped: Duration::from_millis(250),
        rebooting: Duration::from_millis(250),
        ..Timings::default()
    }
}

impl Api {
    pub fn new() -> Self {
        Self::with_timings(timings())
    }

    pub fn with_timings(timings: Timings) -> Self {
        let events = Arc::new(Recorder::default());
        let faults = Faults::default();
        let pool = AddressPool::random();
        let sim = OxideSim::new(
            OxideSimConfig {
                token: TOKEN.into(),
                timings,
                faults: faults.clone(),
                addresses: pool.clone(),
            },
            events.clone(),
        );
        Self {
            sim,
            events,
            faults,
            pool,
        }
    }

    pub async fn raw(&self, req: Request<Bytes>) -> Resp {
        let resp = self.sim.handle(req).await;
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = if resp.body().is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(resp.body()).expect("response body is JSON")
        };
        Resp {
            status,
            headers,
            body,
        }
    }

    pub async fn call(&self, method: Method, uri: &str, body: Option<Value>) -> Resp {
        let mut b = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("api-version", "2026091500.0.0");
        let bytes = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(&v).unwrap())
            }
            None => Bytes::new(),
        };
        self.raw(b.body(bytes).unwrap()).await
    }

    pub async fn get(&self, uri: &str) -> Resp {
        self.call(Method::GET, uri, None).await
    }
    pub async fn post(&self, uri: &str, body: Value) -> Resp {
        self.call(Method::POST, uri, Some(body)).await
    }
    pub async fn post_empty(&self, uri: &str) -> Resp {
        self.call(Method::POST, uri, None).await
    }
    pub async fn delete(&self, uri: &str) -> Resp {
        self.call(Method::DELETE, uri, None).await
    }

    pub async fn project(&self, name: &str) -> Uuid {
        let r = self
            .post("/v1/projects", json!({"name": name, "description": ""}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        r.str("id").parse().unwrap()
    }

    /// Creates an instance from `extra` merged over a minimal valid body.
    pub async fn instance(&self, project: &str, name: &str, extra: Value) -> Resp {
        let mut body = json!({
            "name": name,
            "description": "test",
            "hostname": name,
            "ncpus": 2,
            "memory": 4u64 << 30,
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        self.post(&format!("/v1/instances?project={project}"), body)
            .await
    }

    pub async fn state(&self, project: &str, name: &str) -> String {
        let r = self
            .get(&format!("/v1/instances/{name}?project={project}"))
            .await;
        r.str("run_state").to_owned()
    }

    /// Polls until the instance reaches `state` (panics after 5 s).
    pub async fn wait_state(&self, project: &str, name: &str, state: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let now = self.state(project, name).await;
            if now == state {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} stuck in {now}, wanted {state}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.events.0.lock().unwrap().clone()
    }
}
