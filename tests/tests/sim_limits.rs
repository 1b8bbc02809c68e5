//! The rack's size limits over real HTTP: request-body caps (dropshot's 400 above nexus's
//! 1 MiB default and the bulk-write route's 8 MiB), and the product's image upload staying
//! under the pantry's 512 KiB per write, counted by the simulator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use oxide_controller::adapters::image::{
    self, EnsuredImage, ImageRequest, ImageSource, NoProgress, UploadOptions,
};
use oxide_controller::adapters::oxide_rack::{OxideRack, RackOptions};
use oxide_sim::support::net::{MAX_BULK_WRITE_BODY, MAX_REQUEST_BODY};
use oxide_sim::{Sim, SimHandle, SimOptions};
use serde_json::Value;

async fn start() -> SimHandle {
    Sim::start(SimOptions {
        ssh_port: 2222,
        ..SimOptions::default()
    })
    .await
    .expect("simulator starts")
}

async fn post(sim: &SimHandle, path: &str, body: Vec<u8>) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}{path}", sim.oxide_host))
        .bearer_auth(&sim.oxide_token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn bodies_over_1_mib_and_bulk_writes_over_8_mib_get_dropshots_400() {
    let sim = start().await;
    sim.oxide().seed_project("p");
    // Any route: one byte over 1 MiB is refused before the handler parses anything.
    let (status, body) = post(&sim, "/v1/projects", vec![b' '; MAX_REQUEST_BODY + 1]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error_code"].is_null(), "{body}");
    assert_eq!(
        body["message"],
        format!("request body exceeded maximum size of {MAX_REQUEST_BODY} bytes")
    );
    // Bulk write: 2 MiB of body gets past the cap (and fails later, on the missing disk) ...
    let path = "/v1/disks/nothing/bulk-write?project=p";
    let (status, body) = post(&sim, path, vec![b' '; 2 * MAX_REQUEST_BODY]).await;
    assert_ne!(
        body["message"],
        format!("request body exceeded maximum size of {MAX_BULK_WRITE_BODY} bytes"),
        "{status} {body}"
    );
    // ... 8 MiB + 1 does not.
    let (status, body) = post(&sim, path, vec![b' '; MAX_BULK_WRITE_BODY + 1]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["message"],
        format!("request body exceeded maximum size of {MAX_BULK_WRITE_BODY} bytes")
    );
    sim.shutdown();
}

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

#[tokio::test]
async fn uploading_256_mib_of_random_data_makes_no_write_over_512_kib() {
    const SIZE: usize = 256 << 20;
    let sim = start().await;
    sim.oxide().seed_project("p");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("random.raw");
    std::fs::write(&path, pseudo_random(SIZE, 7)).unwrap();
    let rack = OxideRack::connect(
        &sim.oxide_host,
        &sim.oxide_token,
        "p",
        RackOptions {
            request_timeout: Duration::from_secs(60),
            ..RackOptions::default()
        },
    )
    .unwrap();
    let req = ImageRequest {
        name: "random".into(),
        source: Some(ImageSource::File(path)),
        sha256: None,
        os: "linux".into(),
        version: "test".into(),
        cluster: None,
    };
    let got = image::ensure_image(
        &rack,
        &req,
        &reqwest::Client::new(),
        &UploadOptions::default(),
        &NoProgress,
    )
    .await
    .expect("the upload succeeds on the strict simulator");
    let EnsuredImage::Uploaded { stats, .. } = got else {
        panic!("expected an upload")
    };
    assert_eq!(stats.written_bytes, SIZE as u64);
    let counted = sim.oxide().bulk_write_stats();
    assert_eq!(counted.over_limit, 0, "{counted:?}");
    assert_eq!(counted.max_decoded_bytes, 512 * 1024, "{counted:?}");
    assert_eq!(counted.writes, (SIZE / (512 * 1024)) as u64, "{counted:?}");
    drop(rack);
    sim.shutdown();
}
