//! Snapshots and disks from snapshots on the simulated rack, driven through `OxideSim::handle`:
//! `POST /v1/snapshots` (VMM or pantry, nexus's refusals, the storage quota), the snapshot
//! outliving its disk, the bulk-import path finalized into a snapshot, and disks made from a
//! snapshot carrying its bytes into a guest. Rules and sources: `tests/FIDELITY.md`,
//! "Snapshots and disks from snapshots".
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod oxide_common;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::StatusCode;
use oxide_common::{Api, Resp};
use serde_json::{Value, json};
use uuid::Uuid;

const GIB: u64 = 1 << 30;

fn assert_refused(r: &Resp, status: StatusCode, code: &str, message: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    assert_eq!(r.code(), Some(code), "{}", r.body);
    assert_eq!(r.message(), message, "{}", r.body);
}

fn created(r: Resp) -> Resp {
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r
}

fn no_content(r: &Resp) {
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
}

fn snapshot_body(name: &str, disk: &str) -> Value {
    json!({"name": name, "description": format!("of {disk}"), "disk": disk})
}

/// A `size`-byte import disk `name` in project `p` with `data` written at `offset`, left in
/// `import_ready` (bulk writes stopped, not finalized).
async fn imported(api: &Api, name: &str, size: u64, block: u32, writes: &[(u64, &[u8])]) {
    created(
        api.post(
            "/v1/disks?project=p",
            json!({"name": name, "description": "", "size": size,
                "disk_backend": {"type": "distributed",
                    "disk_source": {"type": "importing_blocks", "block_size": block}}}),
        )
        .await,
    );
    no_content(
        &api.post_empty(&format!("/v1/disks/{name}/bulk-write-start?project=p"))
            .await,
    );
    for (offset, data) in writes {
        no_content(
            &api.post(
                &format!("/v1/disks/{name}/bulk-write?project=p"),
                json!({"offset": offset, "base64_encoded_data": STANDARD.encode(data)}),
            )
            .await,
        );
    }
    no_content(
        &api.post_empty(&format!("/v1/disks/{name}/bulk-write-stop?project=p"))
            .await,
    );
}

async fn finalize(api: &Api, disk: &str, snapshot: Option<&str>) -> Resp {
    api.post(
        &format!("/v1/disks/{disk}/finalize?project=p"),
        json!({"snapshot_name": snapshot}),
    )
    .await
}

async fn disk_state(api: &Api, name: &str) -> String {
    let r = api.get(&format!("/v1/disks/{name}?project=p")).await;
    r.body["state"]["state"].as_str().unwrap_or("").to_owned()
}

fn ids(list: &Resp) -> Vec<String> {
    list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}

fn page(byte: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| byte.wrapping_add(i as u8)).collect()
}

/// Detached disks go through the pantry, disks of a running instance through its VMM, disks of
/// a stopped instance through the pantry while attached: all three are snapshotted, the answer
/// is the `ready` snapshot, listed and viewable; a disk in any other state is the saga's 503.
#[tokio::test]
async fn snapshots_of_detached_and_attached_disks_are_ready_and_listed() {
    let api = Api::new();
    api.project("p").await;
    imported(&api, "data", GIB, 512, &[(0, &page(1, 4096))]).await;

    // Import states are refused by the pantry path with a 503 to retry.
    let r = api
        .post("/v1/snapshots?project=p", snapshot_body("early", "data"))
        .await;
    assert_refused(
        &r,
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceNotAvailable",
        "Service Unavailable",
    );
    no_content(&finalize(&api, "data", None).await);

    let snap = created(
        api.post("/v1/snapshots?project=p", snapshot_body("detached", "data"))
            .await,
    );
    let disk = api.get("/v1/disks/data?project=p").await;
    assert_eq!(snap.str("state"), "ready");
    assert_eq!(snap.str("disk_id"), disk.str("id"));
    assert_eq!(snap.str("project_id"), disk.str("project_id"));
    assert_eq!(snap.str("description"), "of data");
    assert_eq!(snap.body["size"], json!(GIB));
    // The pantry gives the disk back: detached again once the saga is done.
    assert_eq!(disk_state(&api, "data").await, "detached");

    // Attached to a running instance: through its VMM.
    created(
        api.instance(
            "p",
            "vm",
            json!({"disks": [{"type": "attach", "name": "data"}]}),
        )
        .await,
    );
    api.wait_state("p", "vm", "running").await;
    let running = created(
        api.post("/v1/snapshots?project=p", snapshot_body("running", "data"))
            .await,
    );
    assert_eq!(running.str("state"), "ready");
    // Attached to a stopped instance (no VMM): the pantry, the disk staying attached.
    assert_eq!(
        api.post_empty("/v1/instances/vm/stop?project=p")
            .await
            .status,
        StatusCode::ACCEPTED
    );
    api.wait_state("p", "vm", "stopped").await;
    let by_id = json!({"name": "stopped", "description": "", "disk": disk.str("id")});
    created(api.post("/v1/snapshots?project=p", by_id).await);
    assert_eq!(disk_state(&api, "data").await, "attached");

    let list = api.get("/v1/snapshots?project=p").await;
    assert_eq!(ids(&list), ["detached", "running", "stopped"]);
    let view = api.get("/v1/snapshots/running?project=p").await;
    assert_eq!(view.status, StatusCode::OK);
    assert_eq!(view.str("id"), running.str("id"));

    // A faulted disk cannot be put into maintenance by the pantry path either.
    created(
        api.post(
            "/v1/disks?project=p",
            json!({"name": "broken", "description": "", "size": GIB,
                "disk_backend": {"type": "distributed",
                    "disk_source": {"type": "blank", "block_size": 512}}}),
        )
        .await,
    );
    let broken = api.get("/v1/disks/broken?project=p").await;
    api.sim
        .set_disk_faulted(broken.str("id").parse::<Uuid>().unwrap());
    let r = api
        .post(
            "/v1/snapshots?project=p",
            snapshot_body("of-broken", "broken"),
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
}

/// nexus's refusals before the saga (local and read-only disks, a disk of another project) and
/// in it (a name the project already has), each with its error body; none leaves a snapshot.
#[tokio::test]
async fn snapshot_refusals_use_nexus_words() {
    let api = Api::new();
    api.project("p").await;
    api.project("q").await;
    created(
        api.post(
            "/v1/disks?project=p",
            json!({"name": "local", "description": "", "size": GIB,
                "disk_backend": {"type": "local"}}),
        )
        .await,
    );
    let r = api
        .post("/v1/snapshots?project=p", snapshot_body("s", "local"))
        .await;
    assert_refused(
        &r,
        StatusCode::BAD_REQUEST,
        "InvalidRequest",
        "can't create a snapshot of a local storage disk",
    );

    imported(&api, "base", GIB, 512, &[]).await;
    no_content(&finalize(&api, "base", Some("base-snap")).await);
    let snap = api.get("/v1/snapshots/base-snap?project=p").await;
    created(
        api.post(
            "/v1/disks?project=p",
            json!({"name": "ro", "description": "", "size": GIB,
                "disk_backend": {"type": "distributed", "disk_source":
                    {"type": "snapshot", "snapshot_id": snap.str("id"), "read_only": true}}}),
        )
        .await,
    );
    let r = api
        .post("/v1/snapshots?project=p", snapshot_body("s", "ro"))
        .await;
    assert_refused(
        &r,
        StatusCode::BAD_REQUEST,
        "InvalidRequest",
        "can't create a snapshot of a read-only disk",
    );

    // A disk of project p named by id while creating in project q.
    let base = api.get("/v1/disks/base?project=p").await;
    let r = api
        .post(
            "/v1/snapshots?project=q",
            json!({"name": "s", "description": "", "disk": base.str("id")}),
        )
        .await;
    assert_refused(
        &r,
        StatusCode::BAD_REQUEST,
        "InvalidRequest",
        "can't create a snapshot of a disk in a different project",
    );
    // By name, the disk is looked up in the project of the request.
    let r = api
        .post("/v1/snapshots?project=q", snapshot_body("s", "base"))
        .await;
    assert_refused(
        &r,
        StatusCode::NOT_FOUND,
        "ObjectNotFound",
        "not found: disk with name \"base\"",
    );

    let r = api
        .post(
            "/v1/snapshots?project=p",
            snapshot_body("base-snap", "base"),
        )
        .await;
    assert_refused(
        &r,
        StatusCode::BAD_REQUEST,
        "ObjectAlreadyExists",
        "already exists: snapshot \"base-snap\"",
    );
    // The same name in another project is fine (names are unique per project).
    created(
        api.post(
            "/v1/disks?project=q",
            json!({"name": "base", "description": "", "size": GIB,
                "disk_backend": {"type": "distributed",
                    "disk_source": {"type": "blank", "block_size": 512}}}),
        )
        .await,
    );
    created(
        api.post(
            "/v1/snapshots?project=q",
            snapshot_body("base-snap", "base"),
        )
        .await,
    );
    // `project` is required.
    let r = api.post("/v1/snapshots", snapshot_body("x", "base")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let names: Vec<String> = api.sim.dump()["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["base-snap", "base-snap"]);
}

/// Every disk and snapshot is charged its full size against the silo's storage quota, however
/// little was written; past it, disk and snapshot creates (also through finalize and instance
/// create) answer nexus's 507; deleting a disk gives its size back, its snapshots keep theirs.
#[tokio::test]
async fn the_storage_quota_charges_disks_and_snapshots_at_their_full_size() {
    let api = Api::new();
    api.project("p").await;
    api.faults.update(|f| f.silo_storage_quota = Some(3 * GIB));
    let full = "Insufficient capacity: Storage Limit Exceeded: Not enough storage to complete \
                request. Either remove unneeded disks and snapshots to free up resources or \
                contact the rack operator to request a capacity increase.";

    imported(&api, "img", GIB, 512, &[(0, &page(3, 512))]).await;
    assert_eq!(api.sim.storage_provisioned(), GIB);
    no_content(&finalize(&api, "img", Some("bk-1")).await);
    assert_eq!(api.sim.storage_provisioned(), 2 * GIB);
    created(
        api.post("/v1/snapshots?project=p", snapshot_body("bk-2", "img"))
            .await,
    );
    assert_eq!(api.sim.storage_provisioned(), 3 * GIB);

    let r = api
        .post("/v1/snapshots?project=p", snapshot_body("bk-3", "img"))
        .await;
    assert_refused(
        &r,
        StatusCode::INSUFFICIENT_STORAGE,
        "InsufficientCapacity",
        full,
    );
    let blank = json!({"name": "more", "description": "", "size": GIB,
        "disk_backend": {"type": "distributed", "disk_source": {"type": "blank", "block_size": 512}}});
    let r = api.post("/v1/disks?project=p", blank.clone()).await;
    assert_refused(
        &r,
        StatusCode::INSUFFICIENT_STORAGE,
        "InsufficientCapacity",
        full,
    );
    let snap = api.get("/v1/snapshots/bk-1?project=p").await;
    let from_snap = json!({"type": "create", "name": "restore", "description": "", "size": GIB,
        "disk_backend": {"type": "distributed",
            "disk_source": {"type": "snapshot", "snapshot_id": snap.str("id")}}});
    let r = api
        .instance("p", "vm", json!({"disks": [from_snap], "start": false}))
        .await;
    assert_refused(
        &r,
        StatusCode::INSUFFICIENT_STORAGE,
        "InsufficientCapacity",
        full,
    );
    assert_eq!(
        api.get("/v1/instances?project=p").await.body["items"],
        json!([])
    );

    // The disk goes, its snapshots stay charged: room for exactly one more GiB.
    no_content(&api.delete("/v1/disks/img?project=p").await);
    assert_eq!(api.sim.storage_provisioned(), 2 * GIB);
    created(
        api.instance("p", "vm", json!({"disks": [from_snap], "start": false}))
            .await,
    );
    assert_eq!(api.sim.storage_provisioned(), 3 * GIB);
    // A finalize with a snapshot name is charged like a snapshot create: refused, and the disk
    // stays import_ready (nothing finalized).
    api.faults.update(|f| f.silo_storage_quota = Some(5 * GIB));
    imported(&api, "img-2", GIB, 512, &[]).await;
    created(api.post("/v1/disks?project=p", blank).await);
    let r = finalize(&api, "img-2", Some("bk-4")).await;
    assert_refused(
        &r,
        StatusCode::INSUFFICIENT_STORAGE,
        "InsufficientCapacity",
        full,
    );
    assert_eq!(disk_state(&api, "img-2").await, "import_ready");
    no_content(&api.delete("/v1/snapshots/bk-2?project=p").await);
    no_content(&finalize(&api, "img-2", Some("bk-4")).await);
    assert_eq!(api.sim.storage_provisioned(), 5 * GIB);
}

/// The backup path the product uses: import bytes, finalize into a snapshot, delete the disk;
/// the snapshot stays listed, and a disk made from it later, in a disk create or as an
/// instance's data disk, has the imported bytes where the guest reads them (by NVMe serial).
/// Deleting the snapshot leaves the disks made from it as they are.
#[tokio::test]
async fn a_finalized_snapshot_outlives_its_disk_and_restores_its_bytes() {
    let api = Api::new();
    api.project("p").await;
    let head = page(7, 4096);
    let tail = page(200, 8192);
    let tail_at = 2 * GIB - 64 * 1024;
    imported(
        &api,
        "etcdbk",
        2 * GIB,
        4096,
        &[(0, &head), (tail_at, &tail)],
    )
    .await;
    no_content(&finalize(&api, "etcdbk", Some("etcdbk-1")).await);
    let disk = api.get("/v1/disks/etcdbk?project=p").await;
    let snap = api.get("/v1/snapshots/etcdbk-1?project=p").await;
    assert_eq!(snap.status, StatusCode::OK, "{}", snap.body);
    assert_eq!(snap.str("state"), "ready");
    assert_eq!(snap.str("disk_id"), disk.str("id"));
    // omicron's finalize saga names the disk by id in the snapshot's description.
    assert_eq!(
        snap.str("description"),
        format!("snapshot of finalized disk {}", disk.str("id"))
    );
    no_content(&api.delete("/v1/disks/etcdbk?project=p").await);
    assert_eq!(ids(&api.get("/v1/snapshots?project=p").await), ["etcdbk-1"]);
    let snap_id = snap.str("id").to_owned();

    // Smaller than the snapshot: refused with nexus's words.
    let disk_from = |name: &str, size: u64| {
        json!({"name": name, "description": "", "size": size,
            "disk_backend": {"type": "distributed",
                "disk_source": {"type": "snapshot", "snapshot_id": snap_id}}})
    };
    let r = api
        .post("/v1/disks?project=p", disk_from("small", GIB))
        .await;
    assert_refused(
        &r,
        StatusCode::BAD_REQUEST,
        "InvalidRequest",
        &format!(
            "disk size {GIB} must be greater than or equal to snapshot size {}",
            2 * GIB
        ),
    );
    // A disk create: the snapshot's block size and bytes, zeros elsewhere, room beyond.
    let restored = created(
        api.post("/v1/disks?project=p", disk_from("restored", 3 * GIB))
            .await,
    );
    assert_eq!(restored.body["block_size"], json!(4096));
    assert_eq!(restored.str("snapshot_id"), snap_id);
    let rid: Uuid = restored.str("id").parse().unwrap();
    assert_eq!(api.sim.read_disk(rid, 0, head.len()).unwrap(), head);
    assert_eq!(api.sim.read_disk(rid, tail_at, tail.len()).unwrap(), tail);
    assert_eq!(api.sim.read_disk(rid, 4096, 4096).unwrap(), vec![0u8; 4096]);

    // An instance's data disk from the snapshot: the guest finds it by serial and reads it.
    let data = json!({"type": "create", "name": "restore-data", "description": "", "size": 2 * GIB,
        "disk_backend": {"type": "distributed",
            "disk_source": {"type": "snapshot", "snapshot_id": snap_id, "read_only": true}}});
    let vm = created(api.instance("p", "cp", json!({"disks": [data]})).await);
    api.wait_state("p", "cp", "running").await;
    let vm_id: Uuid = vm.str("id").parse().unwrap();
    let running = api.sim.running_instance(vm_id).unwrap();
    assert_eq!(running.disk_serials, ["restore-data"]);
    assert_eq!(
        api.sim
            .read_attached_disk(vm_id, "restore-data", 0, head.len())
            .unwrap(),
        head
    );
    assert_eq!(
        api.sim
            .read_attached_disk(vm_id, "restore-data", tail_at, tail.len())
            .unwrap(),
        tail
    );
    assert!(
        api.sim
            .read_attached_disk(vm_id, "restore-data", 2 * GIB - 512, 1024)
            .is_none(),
        "no read past the disk's end"
    );

    // The snapshot can go while disks made from it live on, with their bytes.
    no_content(&api.delete("/v1/snapshots/etcdbk-1?project=p").await);
    assert_eq!(
        api.get("/v1/snapshots/etcdbk-1?project=p").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.sim.read_disk(rid, 0, head.len()).unwrap(), head);
    assert_eq!(
        api.sim
            .read_attached_disk(vm_id, "restore-data", 0, head.len())
            .unwrap(),
        head
    );
}
