//! Benchmark (prints, never asserts): image upload throughput through the product's
//! `ensure_image` against an in-process `oxide-sim` at parallelism 1, 4 and 8, for a 1 GiB
//! sparse file and a 256 MiB random file, next to the simulator's raw ingest rate measured in
//! the same run (direct 512 KiB bulk writes from memory, the rack's largest, no file, no zero
//! detection, at the same parallelism); then the
//! wall time of the real `bootstrap` binary with default simulator timings.
//!
//! Run: `cargo bench -p bootstrap --bench upload` (optimized), or in the dev profile with
//! `cargo test -p bootstrap --bench upload` (what the numbers in the report were taken with
//! when release builds were not allowed). `OXIDE_BENCH_SHORT=1` (CI) shrinks the files 8x.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Seek as _, SeekFrom, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use oxide_controller::adapters::image::{
    self, EnsuredImage, ImageRequest, ImageSource, ImageStore as _, NoProgress, UploadOptions,
};
use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_sim::{Sim, SimOptions};

const MIB: u64 = 1 << 20;

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A sparse file of `size` bytes with `data` bytes of random content in 1 MiB extents spread
/// over it (like a freshly built OS image: a few dense regions, mostly unallocated).
fn sparse_file(path: &Path, size: u64, data: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let extents = data / MIB;
    for i in 0..extents {
        let off = (size / extents) * i;
        f.seek(SeekFrom::Start(off)).unwrap();
        f.write_all(&pseudo_random(MIB as usize, i + 1)).unwrap();
    }
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let quick = std::env::var_os("OXIDE_BENCH_SHORT").is_some();
    let scale = if quick { 8 } else { 1 };
    let dir = tempfile::tempdir().unwrap();
    let sparse = dir.path().join("sparse.raw");
    let random = dir.path().join("random.raw");
    let sparse_size = 1024 * MIB / scale;
    let random_size = 256 * MIB / scale;
    sparse_file(&sparse, sparse_size, 64 * MIB / scale);
    std::fs::write(&random, pseudo_random(random_size as usize, 99)).unwrap();

    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    sim.oxide().seed_project("bench");
    let rack = OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        "bench",
        RackOptions::default(),
    )
    .unwrap();
    let http = reqwest::Client::new();

    println!(
        "image upload into oxide-sim (in-process, loopback HTTP), {} build",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!();

    // Raw ingest: 512 KiB bulk writes (the pantry's limit) of random bytes straight from
    // memory, no zero detection.
    let raw_bytes = random_size;
    let write = image::MAX_CHUNK as u64;
    let chunk = Bytes::from(pseudo_random(image::MAX_CHUNK, 5));
    let mut raw_rates = Vec::new();
    for parallel in [1usize, 4, 8] {
        let disk = format!("raw-{parallel}");
        rack.create_import_disk(
            &disk,
            "bench",
            raw_bytes.div_ceil(1 << 30).max(1) << 30,
            512,
        )
        .await
        .unwrap();
        rack.bulk_write_start(&disk).await.unwrap();
        let n = (raw_bytes / write) as usize;
        let started = Instant::now();
        futures::stream::iter(0..n)
            .for_each_concurrent(parallel, |i| {
                let (rack, disk, chunk) = (&rack, &disk, chunk.clone());
                async move {
                    rack.bulk_write(disk, i as u64 * write, chunk)
                        .await
                        .unwrap()
                }
            })
            .await;
        let took = started.elapsed();
        raw_rates.push((parallel, mb_s(raw_bytes, took)));
        println!(
            "simulator raw ingest, parallelism {parallel}: {:>7.1} MB/s  ({} MiB in {:.2}s, 512 KiB writes from memory)",
            mb_s(raw_bytes, took),
            raw_bytes / MIB,
            took.as_secs_f64()
        );
        rack.bulk_write_stop(&disk).await.unwrap();
        rack.finalize_import(&disk, None).await.unwrap();
        oxide_controller::ports::rack::Rack::delete_disk(&rack, &disk)
            .await
            .unwrap();
    }
    println!();
    println!(
        "{:<28} {:>11} {:>13} {:>13} {:>10} {:>8} {:>9}",
        "source", "parallelism", "source MB/s", "written MB/s", "written", "seconds", "% of raw"
    );
    for (label, path, size) in [
        ("1 GiB sparse (64 MiB data)", &sparse, sparse_size),
        ("256 MiB random", &random, random_size),
    ] {
        for parallel in [1usize, 4, 8] {
            let name = format!(
                "bench-{}-{parallel}",
                if path == &sparse { "sparse" } else { "random" }
            );
            let req = ImageRequest {
                name,
                source: Some(ImageSource::File(path.to_path_buf())),
                sha256: None,
                os: "linux".into(),
                version: "bench".into(),
                cluster: None,
            };
            let opts = UploadOptions {
                parallelism: parallel,
                ..UploadOptions::default()
            };
            let started = Instant::now();
            let got = image::ensure_image(&rack, &req, &http, &opts, &NoProgress)
                .await
                .unwrap();
            let took = started.elapsed();
            let EnsuredImage::Uploaded { stats, .. } = got else {
                panic!("expected an upload")
            };
            let raw = raw_rates
                .iter()
                .find(|(p, _)| *p == parallel)
                .map_or(f64::NAN, |(_, r)| *r);
            println!(
                "{:<28} {:>11} {:>13.1} {:>13.1} {:>6} MiB {:>8.2} {:>8.0}%",
                if scale == 1 {
                    label.to_owned()
                } else {
                    format!("{label} /{scale}")
                },
                parallel,
                mb_s(size, took),
                mb_s(stats.written_bytes, took),
                stats.written_bytes / MIB,
                took.as_secs_f64(),
                100.0 * mb_s(stats.written_bytes, took) / raw
            );
        }
    }
    drop(rack);
    sim.shutdown();

    println!();
    for (cp, workers) in [(3u32, 1u32), (3, 5)] {
        let took = bootstrap_wall_time(cp, workers).await;
        println!(
            "bootstrap wall time, default simulator timings, {cp} control-plane + {workers} workers: {:.2}s",
            took.as_secs_f64()
        );
    }
}

/// Runs the real binary against a fresh simulator to a converged cluster.
async fn bootstrap_wall_time(cp: u32, workers: u32) -> Duration {
    let sim = Sim::start(SimOptions {
        ssh_port: 2222,
        ..SimOptions::default()
    })
    .await
    .unwrap();
    sim.oxide()
        .seed_silo_image("ubuntu-2404", "ubuntu", "24.04", 2 << 30);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, &sim.oxide_token).unwrap();
    let started = Instant::now();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bootstrap"))
        .args(["--oxide-host", &sim.oxide_host])
        .arg("--oxide-token")
        .arg(format!("file:{}", token.display()))
        .args([
            "--cluster",
            "bench",
            "--image",
            "ubuntu-2404",
            "--ssh-port",
            "2222",
            "--log-format",
            "json",
        ])
        .args([
            "--control-planes",
            &cp.to_string(),
            "--workers",
            &workers.to_string(),
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .arg("--kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .env("HOME", dir.path())
        .env_remove("OXIDE_HOST")
        .env_remove("OXIDE_TOKEN")
        .env_remove("OXIDE_PROFILE")
        .output()
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sim.shutdown();
    took
}
