//! The command line itself, without a rack: `delete` is a subcommand with its own help and
//! flags; help exits 0 and bad arguments exit 2 with one line, under the subcommand as
//! without it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_bootstrap");

fn run(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("HOME", dir.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_lists_the_delete_subcommand() {
    let out = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    assert!(
        help.contains("Commands:") && help.contains("delete"),
        "{help}"
    );
    assert!(help.contains("--control-planes"), "{help}");
}

#[test]
fn delete_help_shows_the_delete_flags_only() {
    let out = run(&["delete", "--help"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    assert!(help.contains("Usage: bootstrap delete"), "{help}");
    for flag in [
        "--cluster",
        "--dry-run",
        "--yes",
        "--delete-images",
        "--oxide-host",
    ] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
    assert!(!help.contains("--control-planes"), "{help}");
}

/// Exit 2 and one line naming the problem on stderr.
fn refused(args: &[&str], needle: &str) {
    let out = run(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
    assert!(lines[0].contains(needle), "{args:?}: {stderr}");
}

#[test]
fn bad_arguments_exit_2_with_one_line_under_delete_as_without_it() {
    refused(&["delete", "--cluster", "demo", "--bogus"], "--bogus");
    refused(&["delete"], "required");
    refused(
        &["delete", "--cluster", "demo", "--timeout", "soon"],
        "--timeout",
    );
    // Create flags belong to no subcommand.
    refused(
        &["delete", "--cluster", "demo", "--workers", "2"],
        "--workers",
    );
    refused(
        &["--cluster", "demo", "--image", "noble", "delete"],
        "delete",
    );
    refused(&["--cluster", "demo", "--bogus"], "--bogus");
}

/// Audit L4: a secret given literally on the command line is warned about, naming the flag
/// and the safer forms, before anything else runs; its value is never echoed.
#[test]
fn a_literal_secret_flag_is_warned_about_without_its_value() {
    let out = run(&["delete", "--oxide-token", "oxide-token-s3cr3t", "--bogus"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("warning: --oxide-token")
            && stderr.contains("--oxide-token file:PATH")
            && stderr.contains("OXIDE_TOKEN"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cr3t"), "{stderr}");
    let out = run(&["delete", "--oxide-token", "file:/dev/null", "--bogus"]);
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
}
