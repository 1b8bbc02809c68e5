//! [`ImageStore`] for [`OxideRack`]: the disk bulk-import, snapshot and image calls of the
//! `oxide` SDK, in the rack's project, with errors classified like every other rack call.
//! The import protocol itself (order, chunking, cleanup) lives in [`crate::adapters::image`].

use base64::Engine as _;
use bytes::Bytes;
use oxide::prelude::*;
use oxide::types;

use super::{OxideRack, classify};
use crate::adapters::image::{ImageStore, ImportDisk, ImportDiskState, NewImage, Snapshot};
use crate::domain::model::Image;
use crate::ports::rack::RackError;

fn invalid(what: &str, e: impl std::fmt::Display) -> RackError {
    RackError::Invalid {
        what: what.to_owned(),
        message: e.to_string(),
    }
}

fn state_from(s: types::DiskState) -> ImportDiskState {
    use types::DiskState as S;
    match s {
        S::Creating => ImportDiskState::Creating,
        S::ImportReady => ImportDiskState::ImportReady,
        S::ImportingFromBulkWrites => ImportDiskState::ImportingFromBulkWrites,
        S::ImportingFromUrl => ImportDiskState::ImportingFromUrl,
        S::Finalizing => ImportDiskState::Finalizing,
        S::Detached => ImportDiskState::Detached,
        S::Faulted => ImportDiskState::Faulted,
        S::Maintenance => ImportDiskState::Other("maintenance".into()),
        S::Attaching(_) => ImportDiskState::Other("attaching".into()),
        S::Attached(_) => ImportDiskState::Other("attached".into()),
        S::Detaching(_) => ImportDiskState::Other("detaching".into()),
        S::Destroyed => ImportDiskState::Other("destroyed".into()),
    }
}

impl OxideRack {
    fn err(&self, what: &str, e: oxide::Error<types::Error>) -> RackError {
        classify(what, e, self.options().request_timeout)
    }
}

impl ImageStore for OxideRack {
    async fn find_image(&self, name: &str) -> Result<Option<Image>, RackError> {
        crate::ports::rack::Rack::find_image(self, name).await
    }

    async fn import_disk(&self, name: &str) -> Result<Option<ImportDisk>, RackError> {
        let what = format!("disk {name}");
        match self
            .client()
            .disk_view()
            .project(self.project())
            .disk(name)
            .send()
            .await
        {
            Ok(rv) => {
                let d = rv.into_inner();
                Ok(Some(ImportDisk {
                    name: d.name.to_string(),
                    state: state_from(d.state),
                    size: d.size.0,
                    block_size: u64::try_from(*d.block_size).unwrap_or(0),
                }))
            }
            Err(e) => match self.err(&what, e) {
                RackError::NotFound { .. } => Ok(None),
                other => Err(other),
            },
        }
    }

    async fn create_import_disk(
        &self,
        name: &str,
        description: &str,
        size: u64,
        block_size: u64,
    ) -> Result<(), RackError> {
        let what = format!("disk {name}");
        let block_size = i64::try_from(block_size)
            .map_err(|e| invalid(&what, e))
            .and_then(|b| types::BlockSize::try_from(b).map_err(|e| invalid(&what, e)))?;
        let body = types::DiskCreate {
            description: description.to_owned(),
            disk_backend: types::DiskBackend::Distributed(types::DiskSource::ImportingBlocks {
                block_size,
            }),
            name: types::Name::try_from(name).map_err(|e| invalid(&what, e))?,
            size: types::ByteCount(size),
        };
        self.client()
            .disk_create()
            .project(self.project())
            .body(body)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.err(&what, e))
    }

    async fn bulk_write_start(&self, disk: &str) -> Result<(), RackError> {
        let what = format!("bulk import into disk {disk}");
        self.client()
            .disk_bulk_write_import_start()
            .project(self.project())
            .disk(disk)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.err(&what, e))
    }

    async fn bulk_write(&self, disk: &str, offset: u64, data: Bytes) -> Result<(), RackError> {
        let what = format!("bulk write at offset {offset} of disk {disk}");
        let body = types::ImportBlocksBulkWrite {
            base64_encoded_data: base64::engine::general_purpose::STANDARD.encode(&data),
            offset,
        };
        self.client()
            .disk_bulk_write_import()
            .project(self.project())
            .disk(disk)
            .body(body)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.err(&what, e))
    }

    async fn bulk_write_stop(&self, disk: &str) -> Result<(), RackError> {
        let what = format!("bulk import into disk {disk}");
        self.client()
            .disk_bulk_write_import_stop()
            .project(self.project())
            .disk(disk)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.err(&what, e))
    }

    async fn finalize_import(&self, disk: &str, snapshot: Option<&str>) -> Result<(), RackError> {
        let what = format!("finalizing disk {disk}");
        let snapshot_name = snapshot
            .map(|s| types::Name::try_from(s).map_err(|e| invalid(&what, e)))
            .transpose()?;
        self.client()
            .disk_finalize_import()
            .project(self.project())
            .disk(disk)
            .body(types::FinalizeDisk { snapshot_name })
            .send()
            .await
            .map(drop)
            .map_err(|e| self.err(&what, e))
    }

    async fn create_snapshot(
        &self,
        name: &str,
        description: &str,
        disk: &str,
    ) -> Result<(), RackError> {
        let what = format!("snapshot {name} of disk {disk}");
        let body = types::SnapshotCreate {
            description: description.to_owned(),
            disk: types::NameOrId::Name(
                types::Name::try_from(disk).map_err(|e| invalid(&what, e))?,
            ),
            name: types::Name::try_from(name).map_err(|e| invalid(&what, e))?,
        };
        self.client()
            .snapshot_create()
            .project(self.project())
            .body(body)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.err(&what, e))
    }

    async fn snapshot(&self, name: &str) -> Result<Option<Snapshot>, RackError> {
        let what = format!("snapshot {name}");
        match self
            .client()
            .snapshot_view()
            .project(self.project())
            .snapshot(name)
            .send()
            .await
        {
            Ok(rv) => {
                let s = rv.into_inner();
                Ok(Some(Snapshot {
                    id: s.id,
                    name: s.name.to_string(),
                    size: s.size.0,
                }))
            }
            Err(e) => match self.err(&what, e) {
                RackError::NotFound { .. } => Ok(None),
                other => Err(other),
            },
        }
    }

    async fn delete_snapshot(&self, name: &str) -> Result<(), RackError> {
        let what = format!("snapshot {name}");
        self.client()
            .snapshot_delete()
            .project(self.project())
            .snapshot(name)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.err(&what, e))
    }

    async fn delete_disk(&self, name: &str) -> Result<(), RackError> {
        crate::ports::rack::Rack::delete_disk(self, name).await
    }

    async fn create_image(&self, image: &NewImage) -> Result<Image, RackError> {
        let what = format!("image {}", image.name);
        let body = types::ImageCreate {
            description: image.description.clone(),
            name: types::Name::try_from(image.name.as_str()).map_err(|e| invalid(&what, e))?,
            os: image.os.clone(),
            source: types::ImageSource::Snapshot(image.snapshot_id),
            version: image.version.clone(),
        };
        let created = self
            .client()
            .image_create()
            .project(self.project())
            .body(body)
            .send()
            .await
            .map_err(|e| self.err(&what, e))?
            .into_inner();
        Ok(Image {
            id: created.id,
            name: created.name.to_string(),
            description: created.description,
            size: crate::base::size::ByteSize(created.size.0),
            block_size: u64::try_from(*created.block_size).unwrap_or(0),
            silo_scoped: created.project_id.is_none(),
        })
    }
}
