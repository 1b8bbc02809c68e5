//! Domain layer: pure rules over plain types. The cluster spec and its validation, the
//! observed model, the planner and the autoscaler, the firewall rule's shape, status
//! building. No I/O, no SDK types; imports only [`crate::base`].

pub mod authorized_keys;
pub mod autoscale;
pub mod backup;
pub mod certificates;
pub mod digests;
pub mod firewall;
pub mod maintenance;
pub mod model;
pub mod operator_credential;
pub mod oxide_token;
pub mod plan;
pub mod spec;
pub mod status;
pub mod status_view;
pub mod upgrade;
