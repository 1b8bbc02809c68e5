//! Benchmark (prints, never asserts): the in-cluster backup's peak memory (audit 4 finding 8).
//! The Job (`reconcile-once backup`) hashes k3s's snapshot file in 1 MiB reads, then streams
//! the archive (head, the file, tail) into the bulk writes; nothing holds the whole snapshot.
//! Here: `open_snapshot` + `upload` of snapshot files of growing size into the in-memory rack,
//! each in a process of its own (this binary again, `--one MIB`), whose peak resident memory
//! (`VmHWM` of /proc/self/status) it prints. The files are sparse with 16 MiB of random data
//! (the fake rack keeps what is written and skips zeros, so what it stores stays the same while
//! the file grows). Last, for contrast, the smallest file read whole and archived as the Job did
//! before (two copies at once), also in a process of its own.
//!
//! Run: `cargo bench -p oxide-controller --bench backup_memory`; `OXIDE_BENCH_SHORT=1` (CI)
//! shrinks the files 8x.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Seek as _, SeekFrom, Write as _};
use std::path::Path;
use std::time::Instant;

use chrono::{SubsecRound as _, Utc};
use oxide_controller::domain::backup::{self, Manifest, Retention};
use oxide_controller::workflows::backup::{open_snapshot, upload};

const MIB: u64 = 1 << 20;

/// Peak resident memory of this process so far, in MiB.
fn peak_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// A sparse file of `size` bytes with 16 one-MiB extents of pseudo-random bytes spread over it.
fn snapshot_file(path: &Path, size: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..16 {
        let data: Vec<u8> = (0..MIB / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        f.seek(SeekFrom::Start((size / 16) * i)).unwrap();
        f.write_all(&data).unwrap();
    }
}

fn manifest(bytes: u64, sha256: String, i: u32) -> Manifest {
    Manifest {
        format: backup::FORMAT,
        cluster: "bench".into(),
        k3s_version: "v1.33.4+k3s1".into(),
        time: Utc::now().trunc_subsecs(0) + chrono::Duration::seconds(i64::from(i)),
        k3s_snapshot: format!("etcd-snapshot-bench-cp-a-{i}"),
        taken_on: "bench-cp-a".into(),
        sha256,
        bytes,
        token: backup::token_fingerprint("t"),
        objects: None,
        image: None,
        spec: String::new(),
        servers: vec![],
    }
}

/// One backup of a `mib` MiB snapshot in this process; prints its figures.
fn one(mib: u64, old_path: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("etcd-snapshot-{mib}"));
    snapshot_file(&path, mib * MIB);
    let before = peak_mib();
    if old_path {
        // The Job before: the file read whole, then archived (a second copy).
        let data = std::fs::read(&path).unwrap();
        let m = manifest(data.len() as u64, String::new(), 0);
        let archive = backup::archive(&m, &data);
        println!(
            "backup_memory: old path (read whole, then archived), {mib} MiB snapshot: peak RSS {:.0} MiB (was {before:.0} MiB before; {} + {} bytes held at once)",
            peak_mib(),
            data.len(),
            archive.len()
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let world = oxide_controller::fake::FakeWorld::new(Utc::now());
    let rack = world.rack();
    let started = Instant::now();
    let stats = rt.block_on(async {
        let (reader, bytes, sha256) = open_snapshot(&path).await.unwrap();
        let m = manifest(bytes, sha256, 0);
        upload(&rack, &m, reader, Retention::default())
            .await
            .unwrap()
            .stats
    });
    println!(
        "backup_memory: streamed, {mib} MiB snapshot ({} archive bytes, {:.2} s): peak RSS {:.0} MiB (was {before:.0} MiB before)",
        stats.source_bytes,
        started.elapsed().as_secs_f64(),
        peak_mib()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--one") {
        let mib: u64 = args[at + 1].parse().unwrap();
        one(mib, args.iter().any(|a| a == "--old"));
        return;
    }
    let short = std::env::var_os("OXIDE_BENCH_SHORT").is_some();
    let sizes_mib: Vec<u64> = if short {
        vec![32, 128, 256]
    } else {
        vec![256, 1024, 2048]
    };
    let me = std::env::current_exe().unwrap();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(&me)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{}", String::from_utf8_lossy(&out.stdout));
    };
    for mib in &sizes_mib {
        run(&["--one", &mib.to_string()]);
    }
    run(&["--one", &sizes_mib[0].to_string(), "--old"]);
}
