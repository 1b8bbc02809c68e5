//! The functions' workflows: observe → plan → apply → save. Each binary calls one of these.

pub mod backup;
pub mod bootstrap;
pub mod delete;
pub mod drill;
pub mod error;
pub mod live;
pub mod local;
pub mod reconcile;
pub mod retire;
pub mod scale;
pub mod status;
pub mod upgrade;
