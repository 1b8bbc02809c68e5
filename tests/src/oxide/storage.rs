//! Disk, snapshot and image routes, including the bulk-import flow
//! (`importing_blocks` → start → writes → stop → finalize [+ snapshot] → image from snapshot).
//!
//! Disk contents are kept sparse: 64 KiB pages holding at least one non-zero byte. A disk's
//! size is never allocated, so a 1 TiB disk costs nothing until written.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::StatusCode;
use oxide::types;
use uuid::Uuid;

use super::error::ApiError;
use super::handler::{Ctx, Reply, body_name};
use super::names::Ref;
use super::pagination::ListParams;
use super::store::{
    self, Blocks, DISK, Disk, DiskState, IMAGE, Image, RunState, SNAPSHOT, Snapshot, Store, Times,
};

const GIB: u64 = 1 << 30;
const MAX_DISK: u64 = 1023 * GIB;
/// nexus's cap for `disk_backend: local` (10 PiB).
const MAX_LOCAL_DISK: u64 = 10 * (1 << 50);
/// Largest decoded bulk write: the Crucible pantry's `MAX_CHUNK_SIZE`, which nexus's write
/// goes through (see `tests/FIDELITY.md`).
pub const MAX_BULK_WRITE: usize = 512 * 1024;
/// Granularity of stored disk contents (a multiple of every block size).
const PAGE: u64 = 64 * 1024;

/// The only block size seeds use.
pub fn block_size_512() -> types::BlockSize {
    match types::BlockSize::try_from(512i64) {
        Ok(b) => b,
        // 512 is one of the three values the SDK type admits; this arm cannot run.
        Err(_) => unreachable!("512 is a valid block size"),
    }
}

fn bs(b: &types::BlockSize) -> u64 {
    u64::try_from(**b).unwrap_or(512)
}

/// A validated disk to be created.
#[derive(Debug)]
pub struct DiskPlan {
    pub name: types::Name,
    pub description: String,
    pub size: u64,
    pub block_size: types::BlockSize,
    pub state: DiskState,
    pub image_id: Option<Uuid>,
    pub snapshot_id: Option<Uuid>,
    pub read_only: bool,
    pub data: Blocks,
    /// `disk_backend: local`: a sled's local storage, 4096-byte blocks, no import.
    pub local: bool,
}

/// Validates disk-create parameters like nexus (`validate_disk_create_params`) and checks
/// the name is free in the project.
pub fn plan_disk(
    store: &Store,
    pid: Uuid,
    name: &types::Name,
    description: &str,
    size: u64,
    backend: &types::DiskBackend,
) -> Result<DiskPlan, ApiError> {
    let source = match backend {
        types::DiskBackend::Distributed(source) => Some(source),
        types::DiskBackend::Local => None,
    };
    let mut plan = DiskPlan {
        name: name.clone(),
        description: description.to_owned(),
        size,
        block_size: block_size_512(),
        state: DiskState::Detached,
        image_id: None,
        snapshot_id: None,
        read_only: false,
        data: Arc::default(),
        local: source.is_none(),
    };
    if plan.local {
        // nexus: "All LocalStorage disks have a 4k block size".
        plan.block_size = types::BlockSize::try_from(4096).map_err(|_| ApiError::internal())?;
    }
    if let Some(source) = source {
        match source {
            types::DiskSource::Blank { block_size } => plan.block_size = block_size.clone(),
            types::DiskSource::ImportingBlocks { block_size } => {
                plan.block_size = block_size.clone();
                plan.state = DiskState::ImportReady;
            }
            types::DiskSource::Snapshot {
                read_only,
                snapshot_id,
            } => {
                let snap = store
                    .snapshots
                    .get(snapshot_id)
                    .ok_or_else(|| ApiError::not_found_by_id("snapshot", snapshot_id))?;
                if snap.project_id != pid {
                    return Err(ApiError::invalid_request(
                        "snapshot does not belong to this project",
                    ));
                }
                // Read-only disks share the snapshot's regions: exactly its size.
                if *read_only && snap.size != size {
                    return Err(ApiError::invalid_request(format!(
                        "read-only disk size {size} must be equal to source snapshot size {}",
                        snap.size
                    )));
                }
                if snap.size > size {
                    return Err(ApiError::invalid_request(format!(
                        "disk size {size} must be greater than or equal to snapshot size {}",
                        snap.size
                    )));
                }
                plan.block_size = snap.block_size.clone();
                plan.snapshot_id = Some(snap.id);
                plan.read_only = *read_only;
                plan.data = snap.data.clone();
            }
            types::DiskSource::Image {
                image_id,
                read_only,
            } => {
                let image = store
                    .images
                    .get(image_id)
                    .ok_or_else(|| ApiError::not_found_by_id("image", image_id))?;
                if image.project_id.is_some_and(|p| p != pid) {
                    return Err(ApiError::invalid_request(
                        "image does not belong to this project",
                    ));
                }
                if *read_only && image.size != size {
                    return Err(ApiError::invalid_request(format!(
                        "read-only disk size {size} must be equal to source image size {}",
                        image.size
                    )));
                }
                if image.size > size {
                    return Err(ApiError::invalid_request(format!(
                        "disk size {size} must be greater than or equal to image size {}",
                        image.size
                    )));
                }
                plan.block_size = image.block_size.clone();
                plan.image_id = Some(image.id);
                plan.read_only = *read_only;
                plan.data = image.data.clone();
            }
        }
    }
    let block = bs(&plan.block_size);
    if block == 0 || !size.is_multiple_of(block) {
        return Err(ApiError::invalid_value(
            "size and block_size",
            format!("total size must be a multiple of block size {block}"),
        ));
    }
    if size < GIB {
        return Err(ApiError::invalid_value(
            "size",
            "total size must be at least 1 GiB",
        ));
    }
    if !size.is_multiple_of(GIB) {
        return Err(ApiError::invalid_value(
            "size",
            "total size must be a multiple of 1 GiB",
        ));
    }
    if plan.local {
        // nexus caps local disks at 10 PiB (no sled's zpool comes near), not at 1023 GiB.
        if size > MAX_LOCAL_DISK {
            return Err(ApiError::invalid_value(
                "size",
                "requested size over 10 PiB",
            ));
        }
    } else if size > MAX_DISK {
        return Err(ApiError::invalid_value(
            "size",
            "total size must be less than 1023 GiB",
        ));
    }
    if store::find_by_name(&store.disks, Some(pid), name.as_str()).is_some() {
        return Err(ApiError::already_exists("disk", name.as_str()));
    }
    Ok(plan)
}

/// Stores a planned disk in `state` (its planned state unless attaching).
pub fn insert_disk(store: &mut Store, pid: Uuid, plan: DiskPlan, attached: DiskState) -> Uuid {
    let id = Uuid::new_v4();
    let state = match attached {
        DiskState::Attached(_) => attached,
        _ => plan.state,
    };
    store.disks.insert(
        id,
        Disk {
            id,
            project_id: pid,
            name: plan.name,
            description: plan.description,
            size: plan.size,
            block_size: plan.block_size,
            state,
            image_id: plan.image_id,
            snapshot_id: plan.snapshot_id,
            read_only: plan.read_only,
            data: plan.data,
            local: plan.local,
            times: Times::now(),
        },
    );
    id
}

fn select_disk(cx: &Ctx<'_>) -> Result<Uuid, ApiError> {
    store::select(cx.store, &cx.store.disks, DISK, cx.param(0), cx.project())
}

fn disk_mut<'s>(store: &'s mut Store, id: &Uuid) -> Result<&'s mut Disk, ApiError> {
    store.disks.get_mut(id).ok_or_else(ApiError::internal)
}

pub fn disk_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("disks", cx.query)?;
    let pid = cx.store.project_param(lp.required_project()?)?;
    let items = cx
        .store
        .disks
        .values()
        .filter(|d| d.project_id == pid)
        .map(|d| (d.name.to_string(), d.id, d.view()))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

pub fn disk_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let project = cx.required_project()?.to_owned();
    let body: types::DiskCreate = cx.create_body()?;
    body_name(&body.name)?;
    let pid = cx.store.project_param(&project)?;
    let plan = plan_disk(
        cx.store,
        pid,
        &body.name,
        &body.description,
        body.size.0,
        &body.disk_backend,
    )?;
    check_storage_quota(cx, plan.size)?;
    let id = insert_disk(cx.store, pid, plan, DiskState::Detached);
    let view = disk_mut(cx.store, &id)?.view();
    Reply::json(StatusCode::CREATED, &view)
}

pub fn disk_view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_disk(cx)?;
    let view = disk_mut(cx.store, &id)?.view();
    Reply::json(StatusCode::OK, &view)
}

pub fn disk_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_disk(cx)?;
    let state = disk_mut(cx.store, &id)?.state;
    if !matches!(state, DiskState::Detached | DiskState::Faulted) {
        return Err(ApiError::invalid_request(format!(
            "disk cannot be deleted in state \"{}\"",
            state.label()
        )));
    }
    cx.store.disks.remove(&id);
    Reply::no_content()
}

pub fn bulk_write_start(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_disk(cx)?;
    let disk = disk_mut(cx.store, &id)?;
    refuse_local_import(disk)?;
    if disk.state != DiskState::ImportReady {
        return Err(ApiError::invalid_request(format!(
            "cannot set disk in state {} to \"importing_from_bulk_writes\"",
            disk.state.debug_name()
        )));
    }
    disk.state = DiskState::ImportingFromBulkWrites;
    disk.times.modified = chrono::Utc::now();
    Reply::no_content()
}

pub fn bulk_write_stop(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_disk(cx)?;
    let disk = disk_mut(cx.store, &id)?;
    refuse_local_import(disk)?;
    if disk.state != DiskState::ImportingFromBulkWrites {
        return Err(ApiError::invalid_request(format!(
            "cannot set disk in state {} to \"import_ready\"",
            disk.state.debug_name()
        )));
    }
    disk.state = DiskState::ImportReady;
    disk.times.modified = chrono::Utc::now();
    Reply::no_content()
}

pub fn bulk_write(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let body: types::ImportBlocksBulkWrite = cx.body()?;
    let id = select_disk(cx)?;
    let disk = disk_mut(cx.store, &id)?;
    refuse_local_import(disk)?;
    if disk.state != DiskState::ImportingFromBulkWrites {
        return Err(ApiError::invalid_request(format!(
            "cannot import blocks with a bulk write for disk in state {}",
            disk.state.debug_name()
        )));
    }
    let data = STANDARD
        .decode(body.base64_encoded_data.as_bytes())
        .map_err(|e| ApiError::invalid_request(format!("error base64 decoding data: {e}")))?;
    cx.store.bulk_writes.record(data.len(), MAX_BULK_WRITE);
    if data.len() > MAX_BULK_WRITE {
        // The pantry's `crucible_bail!(InvalidNumberOfBlocks, ...)`, a 400 that nexus
        // passes on as `InvalidRequest` with the pantry's message.
        return Err(ApiError::invalid_request(format!(
            "Invalid number of blocks: data len {} over max chunk size {MAX_BULK_WRITE}!",
            data.len()
        )));
    }
    let disk = disk_mut(cx.store, &id)?;
    let block = bs(&disk.block_size);
    let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
    if block == 0 || !body.offset.is_multiple_of(block) {
        return Err(ApiError::invalid_request(format!(
            "offset {} is not a multiple of the block size {block}",
            body.offset
        )));
    }
    if !len.is_multiple_of(block) {
        return Err(ApiError::invalid_request(format!(
            "data length {len} is not a multiple of the block size {block}"
        )));
    }
    match body.offset.checked_add(len) {
        Some(end) if end <= disk.size => {}
        _ => {
            return Err(ApiError::invalid_request(format!(
                "write of {len} bytes at offset {} goes past the end of the disk ({} bytes)",
                body.offset, disk.size
            )));
        }
    }
    write_sparse(Arc::make_mut(&mut disk.data), body.offset, &data);
    Ok(Reply {
        status: StatusCode::NO_CONTENT,
        body: bytes::Bytes::new(),
    })
}

/// `len` bytes of `data` (a disk's, snapshot's or image's contents) from `offset`.
pub fn read(data: &Blocks, offset: u64, len: usize) -> Vec<u8> {
    store::read_blocks(data, PAGE, offset, len)
}

/// Writes `data` at `offset` into `pages` (a disk's, snapshot's or image's contents).
pub fn write_at(pages: &mut BTreeMap<u64, Vec<u8>>, offset: u64, data: &[u8]) {
    write_sparse(pages, offset, data);
}

/// Writes `data` at `offset` into 64 KiB pages, dropping pages that end up all zero.
fn write_sparse(pages: &mut BTreeMap<u64, Vec<u8>>, offset: u64, data: &[u8]) {
    let mut pos = 0usize;
    while pos < data.len() {
        let abs = offset + pos as u64;
        let page_start = abs - abs % PAGE;
        let in_page = usize::try_from(abs - page_start).unwrap_or(0);
        let n = (data.len() - pos).min(PAGE as usize - in_page);
        let chunk = &data[pos..pos + n];
        let page = pages.get_mut(&page_start);
        match page {
            Some(buf) => buf[in_page..in_page + n].copy_from_slice(chunk),
            None if chunk.iter().all(|b| *b == 0) => {}
            None => {
                let mut buf = vec![0u8; PAGE as usize];
                buf[in_page..in_page + n].copy_from_slice(chunk);
                pages.insert(page_start, buf);
            }
        }
        if pages
            .get(&page_start)
            .is_some_and(|buf| buf.iter().all(|b| *b == 0))
        {
            pages.remove(&page_start);
        }
        pos += n;
    }
}

pub fn finalize(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let body: types::FinalizeDisk = cx.body()?;
    if let Some(n) = &body.snapshot_name {
        body_name(n)?;
    }
    let id = select_disk(cx)?;
    let disk = cx.store.disks.get(&id).ok_or_else(ApiError::internal)?;
    if disk.state != DiskState::ImportReady {
        return Err(ApiError::invalid_request(format!(
            "disk is in state {} and cannot be finalized; it must be import_ready",
            disk.state.label()
        )));
    }
    let pid = disk.project_id;
    let size = disk.size;
    if let Some(n) = &body.snapshot_name {
        // The finalize saga runs the snapshot-create saga on the pantry with the disk
        // `finalizing` (accepted there): the same name and quota checks as `POST /v1/snapshots`.
        if store::find_by_name(&cx.store.snapshots, Some(pid), n.as_str()).is_some() {
            return Err(ApiError::already_exists("snapshot", n.as_str()));
        }
        check_storage_quota(cx, size)?;
    }
    let disk = cx.store.disks.get(&id).ok_or_else(ApiError::internal)?;
    let snapshot = body.snapshot_name.map(|name| Snapshot {
        id: Uuid::new_v4(),
        project_id: pid,
        name,
        // omicron `nexus/src/app/sagas/finalize_disk.rs`: the disk's id, not its name.
        description: format!("snapshot of finalized disk {id}"),
        disk_id: id,
        size: disk.size,
        block_size: disk.block_size.clone(),
        data: disk.data.clone(),
        times: Times::now(),
    });
    if let Some(s) = snapshot {
        cx.store.snapshots.insert(s.id, s);
    }
    let disk = disk_mut(cx.store, &id)?;
    disk.state = DiskState::Detached;
    disk.times.modified = chrono::Utc::now();
    Reply::no_content()
}

/// nexus's storage quota check (`virtual_provisioning_collection_insert_storage`): charging
/// `add` bytes must keep the silo within [`FaultSpec::silo_storage_quota`].
///
/// [`FaultSpec::silo_storage_quota`]: super::faults::FaultSpec::silo_storage_quota
pub fn check_storage_quota(cx: &Ctx<'_>, add: u64) -> Result<(), ApiError> {
    match cx
        .env
        .faults
        .storage_refusal(cx.store.storage_provisioned(), add)
    {
        Some(message) => Err(ApiError::insufficient_capacity(message)),
        None => Ok(()),
    }
}

/// POST /v1/snapshots?project=: nexus's `snapshot_create` (omicron `nexus/src/app/snapshot.rs`)
/// and its saga (`nexus/src/app/sagas/snapshot_create.rs`), answered once the saga is done, so
/// the snapshot is already `ready`. The snapshot's contents are the disk's at this moment.
pub fn snapshot_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let project = cx.required_project()?.to_owned();
    let body: types::SnapshotCreate = cx.create_body()?;
    body_name(&body.name)?;
    let pid = cx.store.project_param(&project)?;
    let disk_id = match super::names::body_ref(&body.disk).map_err(ApiError::bad_body)? {
        Ref::Id(id) => cx
            .store
            .disks
            .contains_key(&id)
            .then_some(id)
            .ok_or_else(|| ApiError::not_found_by_id(DISK.resource, &id))?,
        Ref::Name(n) => store::find_by_name(&cx.store.disks, Some(pid), &n)
            .ok_or_else(|| ApiError::not_found_by_name(DISK.resource, &n))?,
    };
    let disk = cx
        .store
        .disks
        .get(&disk_id)
        .ok_or_else(ApiError::internal)?;
    if disk.project_id != pid {
        return Err(ApiError::invalid_request(
            "can't create a snapshot of a disk in a different project",
        ));
    }
    if disk.local {
        return Err(ApiError::invalid_request(
            "can't create a snapshot of a local storage disk",
        ));
    }
    if disk.read_only {
        return Err(ApiError::invalid_request(
            "can't create a snapshot of a read-only disk",
        ));
    }
    // The saga: the snapshot record (name unique in the project), the space accounting, then
    // the snapshot itself through the attached instance's VMM or else through the pantry.
    if store::find_by_name(&cx.store.snapshots, Some(pid), body.name.as_str()).is_some() {
        return Err(ApiError::already_exists(
            SNAPSHOT.resource,
            body.name.as_str(),
        ));
    }
    let (size, state) = (disk.size, disk.state);
    check_storage_quota(cx, size)?;
    let has_vmm = match state {
        DiskState::Attached(i) => cx.store.instances.get(&i).is_some_and(|inst| {
            matches!(
                inst.state,
                RunState::Starting | RunState::Running | RunState::Stopping | RunState::Rebooting
            )
        }),
        _ => false,
    };
    // The pantry takes a detached disk (into `maintenance` for the saga's length) or one
    // attached to an instance without a VMM; any other state is a 503 to retry.
    if !has_vmm && !matches!(state, DiskState::Detached | DiskState::Attached(_)) {
        tracing::info!(disk = %disk_id, state = state.debug_name(), "snapshot: disk is in state");
        return Err(ApiError::unavailable());
    }
    let disk = cx
        .store
        .disks
        .get(&disk_id)
        .ok_or_else(ApiError::internal)?;
    let snapshot = Snapshot {
        id: Uuid::new_v4(),
        project_id: pid,
        name: body.name,
        description: body.description,
        disk_id,
        size,
        block_size: disk.block_size.clone(),
        data: disk.data.clone(),
        times: Times::now(),
    };
    let view = snapshot.view();
    cx.store.snapshots.insert(snapshot.id, snapshot);
    Reply::json(StatusCode::CREATED, &view)
}

pub fn snapshot_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("snapshots", cx.query)?;
    let pid = cx.store.project_param(lp.required_project()?)?;
    let items = cx
        .store
        .snapshots
        .values()
        .filter(|s| s.project_id == pid)
        .map(|s| (s.name.to_string(), s.id, s.view()))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

fn select_snapshot(cx: &Ctx<'_>) -> Result<Uuid, ApiError> {
    store::select(
        cx.store,
        &cx.store.snapshots,
        SNAPSHOT,
        cx.param(0),
        cx.project(),
    )
}

pub fn snapshot_view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_snapshot(cx)?;
    let view = cx
        .store
        .snapshots
        .get(&id)
        .map(Snapshot::view)
        .ok_or_else(ApiError::internal)?;
    Reply::json(StatusCode::OK, &view)
}

pub fn snapshot_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let id = select_snapshot(cx)?;
    cx.store.snapshots.remove(&id);
    Reply::no_content()
}

pub fn image_list(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let lp = ListParams::parse("images", cx.query)?;
    // With `project`: that project's images only; without: silo images only.
    let scope = lp
        .project
        .as_deref()
        .map(|p| cx.store.project_param(p))
        .transpose()?;
    let items = cx
        .store
        .images
        .values()
        .filter(|i| i.project_id == scope)
        .map(|i| (i.name.to_string(), i.id, i.view()))
        .collect();
    Reply::json(StatusCode::OK, &lp.page(items))
}

pub fn image_create(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let scope = cx.project().map(str::to_owned);
    let body: types::ImageCreate = cx.create_body()?;
    body_name(&body.name)?;
    let pid = scope
        .as_deref()
        .map(|p| cx.store.project_param(p))
        .transpose()?;
    let types::ImageSource::Snapshot(snap_id) = body.source;
    let snap = cx
        .store
        .snapshots
        .get(&snap_id)
        .ok_or_else(|| ApiError::not_found_by_id("snapshot", &snap_id))?;
    if pid.is_some_and(|p| p != snap.project_id) {
        return Err(ApiError::invalid_request(
            "snapshot does not belong to this project",
        ));
    }
    if store::find_by_name(&cx.store.images, pid, body.name.as_str()).is_some() {
        return Err(ApiError::already_exists("image", body.name.as_str()));
    }
    let image = Image {
        id: Uuid::new_v4(),
        project_id: pid,
        name: body.name,
        description: body.description,
        os: body.os,
        version: body.version,
        size: snap.size,
        block_size: snap.block_size.clone(),
        data: snap.data.clone(),
        times: Times::now(),
    };
    let view = image.view();
    cx.store.images.insert(image.id, image);
    Reply::json(StatusCode::CREATED, &view)
}

pub fn image_view(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let r = store::path_ref(cx.param(0))?;
    let project = cx.project().map(store::query_ref).transpose()?;
    let id = match (&r, &project) {
        // Unlike other resources, an image name without a project names a silo image.
        (Ref::Name(n), None) => store::find_by_name(&cx.store.images, None, n)
            .ok_or_else(|| ApiError::not_found_by_name(IMAGE.resource, n))?,
        _ => store::select_ref(cx.store, &cx.store.images, IMAGE, &r, project.as_ref())?,
    };
    let view = cx
        .store
        .images
        .get(&id)
        .map(Image::view)
        .ok_or_else(ApiError::internal)?;
    Reply::json(StatusCode::OK, &view)
}

/// DELETE /v1/images/{image}: a project image (name + project, or id) goes at once. Disks
/// made from it stay (omicron `nexus/external-api/src/lib.rs` image_delete: "Any instances in
/// the project using the image will continue to run").
pub fn image_delete(cx: &mut Ctx<'_>) -> Result<Reply, ApiError> {
    let r = store::path_ref(cx.param(0))?;
    let project = cx.project().map(store::query_ref).transpose()?;
    let id = match (&r, &project) {
        (Ref::Name(n), None) => store::find_by_name(&cx.store.images, None, n)
            .ok_or_else(|| ApiError::not_found_by_name(IMAGE.resource, n))?,
        _ => store::select_ref(cx.store, &cx.store.images, IMAGE, &r, project.as_ref())?,
    };
    cx.store.images.remove(&id);
    Reply::no_content()
}

/// nexus refuses any bulk import into a local disk with an internal error ("cannot import to
/// local storage disk <id>", hidden behind a 500).
fn refuse_local_import(disk: &store::Disk) -> Result<(), ApiError> {
    if disk.local {
        tracing::info!(disk = %disk.id, "cannot import to local storage disk");
        return Err(ApiError::internal());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn sparse_writes_keep_only_non_zero_pages() {
        let mut pages = BTreeMap::new();
        write_sparse(&mut pages, 0, &vec![0u8; 3 * PAGE as usize]);
        assert!(pages.is_empty());
        write_sparse(&mut pages, PAGE - 512, &[7u8; 1024]);
        assert_eq!(pages.keys().copied().collect::<Vec<_>>(), vec![0, PAGE]);
        assert_eq!(pages[&0][PAGE as usize - 1], 7);
        assert_eq!(pages[&PAGE][511], 7);
        assert_eq!(pages[&PAGE][512], 0);
        // Overwriting with zeros frees the pages again.
        write_sparse(&mut pages, PAGE - 512, &[0u8; 1024]);
        assert!(pages.is_empty());
    }
}
