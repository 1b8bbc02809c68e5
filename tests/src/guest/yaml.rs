//! What the guest's parsers share: YAML read as cloud-init and k3s read it, and the error a
//! rejected user-data (or k3s config) gives on the serial console.

use serde_json::Value;

use super::paths::K3S_CONFIG_PATH;

/// Why cloud-init (or k3s reading its config) rejected the user-data. Messages are printed on
/// the serial console, so they never quote the user-data itself.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UserDataError {
    /// More than 32 KiB.
    #[error("user-data is {0} bytes, over the 32768-byte limit; ignoring it")]
    TooLarge(usize),
    /// Not valid UTF-8.
    #[error("user-data is not valid UTF-8 text; ignoring it")]
    NotUtf8,
    /// Begins with none of cloud-init's known prefixes (`text/x-not-multipart`): cloud-init
    /// warns and does nothing with it.
    #[error(
        "Unhandled non-multipart (text/x-not-multipart) userdata: user-data does not start with '#cloud-config'; ignoring it"
    )]
    NoHeader,
    /// A `#!` script (`text/x-shellscript`): cloud-init runs it once, in the final stage
    /// (`scripts_user`). The simulator runs no shell, so nothing the script does happens here.
    #[error(
        "simulator: user-data is a shell script (text/x-shellscript), which cloud-init runs in scripts_user; the simulator runs no shell, so none of its effects happen"
    )]
    ShellScript,
    /// Another content type cloud-init handles (`#include`, `#cloud-boothook`, …) that the
    /// simulator does not model.
    #[error(
        "simulator: user-data of type {0} is handled by cloud-init but not modelled by the simulator"
    )]
    Unmodelled(&'static str),
    /// Not parseable YAML.
    #[error("Failed loading yaml blob. Invalid format at line {line} column {column}")]
    Yaml {
        /// 1-based line.
        line: u64,
        /// 1-based column.
        column: u64,
    },
    /// YAML, but not a mapping at the top level.
    #[error("cloud-config was not a dictionary; ignoring it")]
    NotMapping,
    /// `write_files` malformed.
    #[error("Invalid cloud-config provided: write_files: {0}")]
    WriteFiles(String),
    /// `users` or `ssh_authorized_keys` malformed.
    #[error("Invalid cloud-config provided: {0}")]
    Schema(String),
    /// The k3s config file malformed (k3s refuses to start).
    #[error("level=fatal msg=\"Error: failed to parse {path}: {reason}\"", path = K3S_CONFIG_PATH)]
    K3sConfig {
        /// What is wrong (never quotes values).
        reason: String,
    },
}

/// Parses YAML into JSON values; errors carry only a position (the snippet would quote secrets).
pub(crate) fn parse_yaml(text: &str) -> Result<Value, (u64, u64)> {
    match serde_saphyr::from_str::<Value>(text) {
        Ok(value) => Ok(value),
        Err(err) => {
            let loc = err.location();
            Err(loc.map(|l| (l.line(), l.column())).unwrap_or((0, 0)))
        }
    }
}
