//! Base layer: vocabulary with no knowledge of clusters or racks (names, sizes, cron
//! schedules, retry, secret material, logging, the shutdown token). Imports nothing else from the crate.

pub mod der;
pub mod kcron;
pub mod names;
pub mod retry;
pub mod secrets;
pub mod shutdown;
pub mod size;
pub mod telemetry;
