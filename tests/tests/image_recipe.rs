//! The image has two recipes: the `Dockerfile`, for users with Docker, and `.ci/image.sh`,
//! which CI builds with buildah (no Docker engine) and runs under runc against the simulator.
//! These tests hold the two in step: the same binaries, built the same way, installed in the
//! same directory, the same user and the same default command, on the same base (distroless
//! `cc-debian12`, which the script rebuilds from Debian's packages); and both hold every
//! program the manifests of `k8s-cronjobs/` run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

/// What both recipes must agree on.
#[derive(Debug, PartialEq, Eq)]
struct Recipe {
    /// The release binaries built and installed, in the order given.
    binaries: Vec<String>,
    /// Where they are installed.
    bin_dir: String,
    /// The image's `uid:gid`.
    user: String,
    /// The image's default command (no entrypoint).
    cmd: Vec<String>,
}

/// The release build both recipes run, with a `-p` per binary after it.
const BUILD: &str = "cargo build --release --locked --bins";
/// The base both build on: the Dockerfile pulls it, the script makes it from its packages.
const BASE: &str = "gcr.io/distroless/cc-debian12";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace root")
        .to_path_buf()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn json_strings(text: &str, what: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(text.trim())
        .map_err(|e| format!("{what} {text:?} is not a JSON list: {e}"))
}

/// The Dockerfile's recipe: the `-p` of its `cargo build`, the `target/release/` files it
/// installs (the same list), the destination of the final stage's `COPY`, `USER`, `CMD`.
fn dockerfile_recipe(text: &str) -> Result<Recipe, String> {
    // Continuation lines joined: the build is one RUN.
    let joined = text.replace("\\\n", " ");
    let build = joined
        .lines()
        .find_map(|l| l.split_once(BUILD).map(|(_, rest)| rest.to_owned()))
        .ok_or(format!("no `{BUILD}` in the Dockerfile"))?;
    let words: Vec<&str> = build.split_whitespace().collect();
    let binaries: Vec<String> = words
        .windows(2)
        .take_while(|w| w[0] != "&&")
        .filter(|w| w[0] == "-p")
        .map(|w| w[1].to_owned())
        .collect();
    let installed: Vec<String> = words
        .iter()
        .filter_map(|w| w.strip_prefix("target/release/"))
        .map(str::to_owned)
        .collect();
    if installed != binaries {
        return Err(format!(
            "the Dockerfile builds {binaries:?} but installs {installed:?}"
        ));
    }
    let last_stage = joined
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .ok_or("no FROM")?;
    let base = last_stage.split_whitespace().next().unwrap_or_default();
    if base.split(':').next() != Some(BASE) {
        return Err(format!("the final stage is FROM {base}, not {BASE}"));
    }
    let instruction = |name: &str| {
        last_stage
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .ok_or(format!("no {name}in the Dockerfile's final stage"))
    };
    let copy = instruction("COPY --from=build /out/ ")?;
    Ok(Recipe {
        binaries,
        bin_dir: copy.trim_end_matches('/').to_owned(),
        user: instruction("USER ")?.to_owned(),
        cmd: json_strings(instruction("CMD ")?, "CMD")?,
    })
}

/// The script's recipe: its `IMAGE_*` variables, checked to be what its build, install and
/// `buildah config` lines use.
fn script_recipe(text: &str) -> Result<Recipe, String> {
    let var = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .map(|v| v.trim().trim_matches('\'').to_owned())
            .ok_or(format!("no {name}= in the script"))
    };
    let binaries = var("IMAGE_BINARIES")?;
    let binaries = binaries
        .strip_prefix('(')
        .and_then(|b| b.strip_suffix(')'))
        .ok_or(format!("IMAGE_BINARIES={binaries} is not a bash array"))?;
    for used in [
        r#"for b in "${IMAGE_BINARIES[@]}"; do packages+=(-p "$b"); done"#,
        &format!(r#"{BUILD} "${{packages[@]}}""#),
        r#"for b in "${IMAGE_BINARIES[@]}"; do install -m 0755 "${CARGO_TARGET_DIR:-target}/release/$b" "$mnt$IMAGE_BIN_DIR/"; done"#,
        r#"buildah config --user "$IMAGE_USER""#,
        r#"--cmd "$IMAGE_CMD""#,
    ] {
        if !text.contains(used) {
            return Err(format!("the script no longer has `{used}`"));
        }
    }
    if text.contains("--entrypoint") {
        return Err("the script sets an entrypoint; the Dockerfile has none".into());
    }
    Ok(Recipe {
        binaries: binaries.split_whitespace().map(str::to_owned).collect(),
        bin_dir: var("IMAGE_BIN_DIR")?,
        user: var("IMAGE_USER")?,
        cmd: json_strings(&var("IMAGE_CMD")?, "IMAGE_CMD")?,
    })
}

#[test]
fn the_ci_image_is_built_as_the_dockerfile_builds_it() {
    let docker = dockerfile_recipe(&read("Dockerfile")).unwrap();
    let ci = script_recipe(&read(".ci/image.sh")).unwrap();
    assert_eq!(docker, ci, "Dockerfile (left) and .ci/image.sh (right)");
    assert_eq!(docker.binaries, ["bootstrap", "reconcile-once", "scale"]);
    assert_eq!(docker.user, "65532:65532", "distroless's nonroot user");
}

#[test]
fn the_script_builds_distroless_cc_from_its_packages() {
    let script = read(".ci/image.sh");
    let debs = script
        .lines()
        .find_map(|l| l.strip_prefix("BASE_DEBS=("))
        .and_then(|l| l.strip_suffix(')'))
        .expect("BASE_DEBS=( ... ) on one line");
    let debs: Vec<&str> = debs.split_whitespace().collect();
    // GoogleContainerTools/distroless: static (base-files, netbase, tzdata, media-types),
    // base debian12 (libc6, libssl3), cc debian12 (libgomp1, libstdc++6, libgcc-s1,
    // gcc-12-base).
    for deb in [
        "base-files",
        "netbase",
        "tzdata",
        "media-types",
        "libc6",
        "libssl3",
        "libgcc-s1",
        "libgomp1",
        "libstdc++6",
        "gcc-12-base",
    ] {
        assert!(debs.contains(&deb), "BASE_DEBS lacks {deb}");
    }
    assert!(script.contains("/etc/ssl/certs/ca-certificates.crt"));
    assert!(script.contains("nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin"));
}

#[test]
fn a_change_to_one_recipe_alone_is_caught() {
    let dockerfile = read("Dockerfile");
    let script = read(".ci/image.sh");
    let ci = script_recipe(&script).unwrap();
    let changed_docker = [
        ("USER 65532:65532", "USER 1000:1000"),
        ("-p scale", "-p scalex"),
        ("target/release/scale", "target/release/other"),
        (
            "COPY --from=build /out/ /usr/local/bin/",
            "COPY --from=build /out/ /usr/bin/",
        ),
        ("\"--help\"]", "\"--version\"]"),
        (
            "FROM gcr.io/distroless/cc-debian12",
            "FROM gcr.io/distroless/static-debian12",
        ),
    ];
    for (from, to) in changed_docker {
        assert!(dockerfile.contains(from), "the Dockerfile has {from}");
        let changed = dockerfile.replacen(from, to, 1);
        assert!(
            dockerfile_recipe(&changed).is_ok_and(|r| r != ci)
                || dockerfile_recipe(&changed).is_err(),
            "Dockerfile {from} -> {to} went unnoticed"
        );
    }
    let docker = dockerfile_recipe(&dockerfile).unwrap();
    let changed_script = [
        ("IMAGE_USER=65532:65532", "IMAGE_USER=65532:0"),
        (" scale)", ")"),
        ("IMAGE_BIN_DIR=/usr/local/bin", "IMAGE_BIN_DIR=/usr/bin"),
        ("\"--help\"]'", "\"--version\"]'"),
        (r#"--user "$IMAGE_USER""#, "--user 0"),
        (r#"--cmd "$IMAGE_CMD""#, "--cmd '[]'"),
        (r#""$mnt$IMAGE_BIN_DIR/""#, r#""$mnt/usr/bin/""#),
        ("--cmd", "--entrypoint '[\"/usr/local/bin/scale\"]' --cmd"),
    ];
    for (from, to) in changed_script {
        assert!(script.contains(from), "the script has {from}");
        let changed = script.replacen(from, to, 1);
        assert!(
            script_recipe(&changed).is_err() || script_recipe(&changed).unwrap() != docker,
            "script {from} -> {to} went unnoticed"
        );
    }
}

#[test]
fn every_program_the_manifests_run_is_in_the_image() {
    let recipe = dockerfile_recipe(&read("Dockerfile")).unwrap();
    let mut commands = 0;
    for entry in fs::read_dir(repo_root().join("k8s-cronjobs")).unwrap() {
        let text = fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let Some(list) = line.trim().strip_prefix("command: ") else {
                continue;
            };
            let command = json_strings(list, "command").unwrap();
            let (dir, program) = command[0].rsplit_once('/').unwrap();
            assert_eq!(dir, recipe.bin_dir, "{line}");
            assert!(
                recipe.binaries.iter().any(|b| b == program),
                "{program} is not in the image"
            );
            commands += 1;
        }
    }
    assert_eq!(commands, 3, "the two CronJobs' and the webhook's");
}

/// Audit security-2 N12: every base the Dockerfile builds from is named by digest (a tag may be
/// moved to other bytes; `NAME:TAG@sha256:<64 hex>` pulls the digest's).
#[test]
fn every_base_is_pinned_by_digest() {
    fn unpinned(dockerfile: &str) -> Vec<String> {
        dockerfile
            .lines()
            .filter_map(|l| l.strip_prefix("FROM "))
            .filter_map(|rest| rest.split_whitespace().next())
            .filter(|image| {
                !image.split_once("@sha256:").is_some_and(|(_, d)| {
                    d.len() == 64
                        && d.bytes()
                            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                })
            })
            .map(str::to_owned)
            .collect()
    }
    let dockerfile = read("Dockerfile");
    assert_eq!(dockerfile.matches("\nFROM ").count(), 2, "two stages");
    assert_eq!(unpinned(&dockerfile), Vec::<String>::new());
    // The check sees a base by tag alone.
    let by_tag = dockerfile.replacen(
        "FROM gcr.io/distroless/cc-debian12:nonroot@sha256:",
        "FROM gcr.io/distroless/cc-debian12:nonroot #",
        1,
    );
    assert_eq!(unpinned(&by_tag), ["gcr.io/distroless/cc-debian12:nonroot"]);
}
