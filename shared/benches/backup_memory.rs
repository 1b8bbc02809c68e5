//! Benchmark (prints, never asserts): the in-cluster backup's peak memory (audit 4 finding 8).
//! The Job (`reconcile-once backup`) hashes k3s's snapshot file in 1 MiB reads, then streams
//! the archive (head, the file, tail) into the bulk writes; nothing holds the whole snapshot.
//! Here: `open_snapshot` + `upload` of snapshot files of growing size into the in-memory rack,
//! the process's peak resident memory (`VmHWM` of /proc/self/status) printed after each. The
//! files are sparse with 16 MiB of random data (the fake rack keeps what is written and skips
//! zeros, so what it stores stays the same while the file grows). Last, for contrast, the
//! smallest file read whole and archived as the Job did before (two copies at once).
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

fn main() {
    let short = std::env::var_os("OXIDE_BENCH_SHORT").is_some();
    let sizes_mib: Vec<u64> = if short {
        vec![32, 128, 256]
    } else {
        vec![256, 1024, 2048]
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let world = oxide_controller::fake::FakeWorld::new(Utc::now());
    let rack = world.rack();
    println!(
        "backup_memory: peak RSS before any backup: {:.0} MiB",
        peak_mib()
    );
    for (i, mib) in sizes_mib.iter().enumerate() {
        let path = dir.path().join(format!("etcd-snapshot-{mib}"));
        snapshot_file(&path, mib * MIB);
        let started = Instant::now();
        let stats = rt.block_on(async {
            let (reader, bytes, sha256) = open_snapshot(&path).await.unwrap();
            let m = manifest(bytes, sha256, i as u32);
            upload(&rack, &m, reader, Retention::default())
                .await
                .unwrap()
                .stats
        });
        println!(
            "backup_memory: streamed a {mib} MiB snapshot ({} archive bytes) in {:.2} s; peak RSS so far {:.0} MiB",
            stats.source_bytes,
            started.elapsed().as_secs_f64(),
            peak_mib()
        );
        std::fs::remove_file(&path).unwrap();
    }
    // The old path, for contrast: the file read whole, then archived (a second copy).
    let mib = sizes_mib[0];
    let path = dir.path().join("etcd-snapshot-old");
    snapshot_file(&path, mib * MIB);
    let data = std::fs::read(&path).unwrap();
    let m = manifest(data.len() as u64, String::new(), 99);
    let archive = backup::archive(&m, &data);
    println!(
        "backup_memory: the old path (read whole, then archived) of the {mib} MiB snapshot: peak RSS {:.0} MiB ({} + {} bytes held at once)",
        peak_mib(),
        data.len(),
        archive.len()
    );
}
