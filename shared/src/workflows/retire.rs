//! Instances taken out for good, shared by `bootstrap recover` (fencing the servers that are
//! not the survivor, retiring workers) and the restore drills' cleanup
//! ([`crate::workflows::drill`]): stop, wait until stopped, delete with the disks.

use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use crate::base::names;
use crate::domain::model::InstanceState;
use crate::ports::rack::{Rack, RackError};
use crate::workflows::error::{self, WorkflowError, message};

/// How often instance states are read while waiting.
pub const POLL: Duration = Duration::from_millis(500);

fn rack_failed(step: &'static str, e: RackError) -> WorkflowError {
    WorkflowError::step(step, error::context("the Oxide API", e))
}

/// Stops every instance in `others` and waits until none runs (or `deadline`).
pub async fn fence<R: Rack>(
    rack: &R,
    others: &[String],
    deadline: Instant,
) -> Result<(), WorkflowError> {
    for name in others {
        info!(step = "fence", instance = %name, "stopping the server");
        match rack.stop_instance(name).await {
            // Already stopping or stopped, or gone meanwhile: what we wanted.
            Ok(()) | Err(RackError::Conflict { .. } | RackError::NotFound { .. }) => {}
            Err(e) => return Err(rack_failed("fence", e)),
        }
    }
    for name in others {
        wait_state(rack, name, "fence", deadline, |s| {
            matches!(
                s,
                None | Some(InstanceState::Stopped | InstanceState::Failed)
            )
        })
        .await?;
    }
    Ok(())
}

/// Polls `name`'s state until `done` says so, or fails at `deadline`.
pub async fn wait_state<R: Rack>(
    rack: &R,
    name: &str,
    step: &'static str,
    deadline: Instant,
    done: impl Fn(Option<InstanceState>) -> bool,
) -> Result<(), WorkflowError> {
    loop {
        let state = rack
            .get_instance(name)
            .await
            .map_err(|e| rack_failed(step, e))?
            .map(|i| i.state);
        if done(state.clone()) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(WorkflowError::step(
                step,
                message(format!(
                    "{name} is still {state:?}; run the command again to keep waiting"
                )),
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Deletes the instances in `others` and their boot and data disks (each gone already is fine).
pub async fn delete<R: Rack>(rack: &R, others: &[String]) -> Result<(), WorkflowError> {
    for name in others {
        info!(step = "delete", instance = %name, "deleting the server and its disks");
        match rack.delete_instance(name).await {
            Ok(()) | Err(RackError::NotFound { .. }) => {}
            Err(e) => return Err(rack_failed("delete", e)),
        }
        for disk in [names::boot_disk_name(name), names::data_disk_name(name)] {
            // A disk detaches from its deleted instance a moment later.
            let deleted = crate::base::retry::retry(
                crate::base::retry::Backoff::default(),
                |e: &RackError| e.is_retryable() || matches!(e, RackError::Conflict { .. }),
                || rack.delete_disk(&disk),
            )
            .await;
            match deleted {
                Ok(()) | Err(RackError::NotFound { .. }) => {}
                Err(e) => return Err(rack_failed("delete", e)),
            }
        }
    }
    Ok(())
}
