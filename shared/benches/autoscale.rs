//! Benchmark of the pure autoscaling planner: 10,000 pods on 500 nodes (plus pending pods and
//! a tail of lightly used nodes, so scale-up packing and the scale-down move simulation both
//! run). Prints figures; the target is at most 50 ms per plan.

use std::collections::BTreeMap;
use std::time::Instant;

use chrono::Utc;
use oxide_controller::domain::autoscale::{
    AutoscaleSpec, AutoscaleState, DEFAULT_MAX_PODS, NodeView, Outcome, PodView, PoolView,
    Resources, plan,
};

fn main() {
    let pools: Vec<PoolView> = ["a", "b"]
        .iter()
        .map(|name| PoolView {
            name: (*name).into(),
            count: 250,
            min: 1,
            max: 1000,
            cpus: 8,
            memory: 32 << 30,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            autoscale: Some(AutoscaleSpec::default()),
        })
        .collect();
    let nodes: Vec<NodeView> = (0..500)
        .map(|i| {
            let p = &pools[i % 2];
            NodeView {
                name: format!("{}-{i:04}", p.name),
                pool: Some(p.name.clone()),
                allocatable: p.allocatable(),
                max_pods: DEFAULT_MAX_PODS,
                ..NodeView::default()
            }
        })
        .collect();
    let pod = |name: String, cpu_milli: u64, node: Option<&str>| PodView {
        namespace: "default".into(),
        name,
        requests: Resources {
            cpu_milli,
            memory: 256 << 20,
        },
        node: node.map(Into::into),
        unschedulable: node.is_none(),
        controller_kind: Some("ReplicaSet".into()),
        ..PodView::default()
    };
    let mut pods = Vec::with_capacity(10_000);
    for (i, n) in nodes.iter().enumerate() {
        // 450 busy nodes with 21 pods, 50 light ones with 7 (candidates for scale-down).
        let (k, cpu) = if i < 450 { (21, 300) } else { (7, 100) };
        pods.extend((0..k).map(|j| pod(format!("p-{i}-{j}"), cpu, Some(&n.name))));
    }
    pods.extend((0..200).map(|j| pod(format!("pending-{j}"), 500, None)));
    assert_eq!(pods.len(), 10_000);

    let now = Utc::now();
    let (out, figures) = measure(&pools, &nodes, &pods, &AutoscaleState::default(), now);
    println!(
        "autoscale plan, {} pods on {} nodes: {figures}; {} decision(s), {} unneeded node(s)",
        pods.len(),
        nodes.len(),
        out.decisions.len(),
        out.state.unneeded_since.len()
    );
    for d in &out.decisions {
        println!("  {} {} -> {}: {}", d.pool, d.from, d.to, d.reason);
    }

    // The same cluster without pending pods, the light nodes unneeded for an hour: the
    // scale-down path, removals simulated one after another across both pools.
    pods.retain(|p| !p.unschedulable);
    let mut prev = AutoscaleState::default();
    for n in &nodes[450..] {
        prev.unneeded_since
            .insert(n.name.clone(), now - chrono::Duration::hours(1));
    }
    let (out, figures) = measure(&pools, &nodes, &pods, &prev, now);
    println!(
        "autoscale plan, scale-down, {} pods on {} nodes: {figures}; removes {:?}",
        pods.len(),
        nodes.len(),
        out.decisions
            .iter()
            .filter_map(|d| d.remove_node.as_deref())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        out.decisions.len(),
        2,
        "one node per pool: {:?}",
        out.decisions
    );
}

/// Plans repeatedly (twenty times; three with `OXIDE_BENCH_SHORT=1`, as CI runs it) and says
/// how long a plan took.
fn measure(
    pools: &[PoolView],
    nodes: &[NodeView],
    pods: &[PodView],
    prev: &AutoscaleState,
    now: chrono::DateTime<Utc>,
) -> (Outcome, String) {
    let runs = if std::env::var_os("OXIDE_BENCH_SHORT").is_some() {
        3
    } else {
        20
    };
    let mut out = plan(pools, nodes, pods, prev, now);
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        out = plan(pools, nodes, pods, prev, now);
        times.push(t.elapsed());
    }
    times.sort();
    let figures = format!(
        "min {:?}, median {:?}, max {:?} over {} runs (target <= 50 ms)",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1],
        times.len()
    );
    (out, figures)
}
