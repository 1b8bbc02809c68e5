//! Boot images: find one by name, or make it by streaming a source (a local file or an
//! http(s) URL) into a new disk through the Oxide bulk-import API, then snapshot → image.
//!
//! This module owns the import protocol (create an `importing_blocks` disk → start bulk
//! writes → parallel writes → stop → finalize with a snapshot → image from the snapshot →
//! delete the temporary disk and snapshot), the chunking (all-zero runs are never sent), the
//! size arithmetic (data rounded up to the block size, the disk to whole GiB) and the cleanup
//! of a failed or interrupted import. The Oxide calls sit behind the narrow [`ImageStore`]
//! trait: [`crate::adapters::oxide_rack::images`] implements it for the SDK adapter, [`fake`] in memory.
//!
//! Not here: deciding *which* image a pool uses (the spec), and drawing progress on a terminal
//! (the caller passes an [`UploadProgress`]).
//!
//! Crash safety: the temporary disk and snapshot have names derived from the image name
//! ([`temp_names`]), so a run killed mid-import leaves objects the next run finds and removes
//! before it starts over (or, when the image got made after all, simply removes).

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use sha2::{Digest as _, Sha256};
use tracing::{info, warn};

use crate::base::retry::{self, Backoff};
use crate::base::size::GIB;
use crate::domain::model::Image;
use crate::ports::rack::RackError;

/// Smallest chunk read from the source per step (one zero-detection granule).
pub const MIN_CHUNK: usize = GRANULE;
/// Largest bulk write a rack accepts (decoded bytes): nexus hands the data to the Crucible
/// pantry, which refuses more than its `MAX_CHUNK_SIZE` of 512 KiB with a 400 (see
/// `tests/FIDELITY.md`). The SDK's own importer writes 512 KiB chunks too.
pub const MAX_CHUNK: usize = 512 * 1024;
/// Default chunk: the largest write, so request overhead is as small as the rack allows;
/// throughput comes from [`DEFAULT_PARALLELISM`] writes in flight.
pub const DEFAULT_CHUNK: usize = MAX_CHUNK;
/// First bytes of every qcow2 file (`QFI\xfb`, the format's magic number).
pub const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";
/// Granularity of zero detection inside a chunk. A multiple of every Oxide block size.
pub const GRANULE: usize = 64 * 1024;
/// Block size of the disks we import into (the SDK helper's default, accepted everywhere).
pub const DEFAULT_BLOCK_SIZE: u64 = 512;
/// Largest disk Oxide creates.
pub const MAX_DISK_BYTES: u64 = 1023 * GIB;
/// Default number of bulk writes in flight.
pub const DEFAULT_PARALLELISM: usize = 8;

/// What went wrong finding or making an image. [`ImageError::is_config`] tells a mistake in
/// the input (exit 2) from trouble worth retrying.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Not found and nothing to make it from.
    #[error(
        "image {name:?} is neither in the project nor in the silo; pass --image-source (a file or an http(s) URL) to upload it, or name an existing image"
    )]
    NotFound { name: String },
    /// The source string is neither a URL nor a usable path.
    #[error("image source {source_text:?}: {message}")]
    BadSource {
        source_text: String,
        message: String,
    },
    /// A local file could not be read.
    #[error("cannot read image source {}: {message}", path.display())]
    Unreadable { path: PathBuf, message: String },
    /// The URL answered with an error status.
    #[error("image source {url} answered HTTP {status}")]
    HttpStatus { url: String, status: u16 },
    /// The URL could not be fetched at all.
    #[error("cannot fetch image source {url}: {message}")]
    Fetch { url: String, message: String },
    /// The URL does not say how large it is, so the disk cannot be sized.
    #[error(
        "image source {url} does not report its size (no Content-Length); download it and pass the file instead"
    )]
    UnknownSize { url: String },
    /// Empty or too large for one Oxide disk.
    #[error(
        "image source {source_text} is {size} bytes; an Oxide image must be 1 byte to 1023 GiB"
    )]
    BadSize { source_text: String, size: u64 },
    /// The source delivered a different number of bytes than announced.
    #[error("image source {source_text} ended after {got} bytes, but announced {expected}")]
    ShortRead {
        source_text: String,
        got: u64,
        expected: u64,
    },
    /// An Oxide call failed during `step` (the cause is the source: print with its chain).
    #[error("{step} failed")]
    Rack {
        step: String,
        #[source]
        source: RackError,
    },
    /// The bytes read from the source do not have the sha256 given for it; nothing of them
    /// became an image.
    #[error(
        "image source {source_text} has sha256 {actual}, not the expected {expected}; nothing was imported (check the source, or the digest you gave)"
    )]
    DigestMismatch {
        source_text: String,
        expected: String,
        actual: String,
    },
    /// The import failed and so did the cleanup; both are reported.
    #[error("{error}; cleaning up the temporary disk {disk} also failed: {cleanup}")]
    CleanupFailed {
        error: Box<ImageError>,
        disk: String,
        cleanup: String,
    },
}

impl ImageError {
    /// A mistake in the input: the person must change something (exit 2).
    pub fn is_config(&self) -> bool {
        match self {
            ImageError::NotFound { .. }
            | ImageError::BadSource { .. }
            | ImageError::Unreadable { .. }
            | ImageError::UnknownSize { .. }
            | ImageError::BadSize { .. }
            | ImageError::DigestMismatch { .. } => true,
            ImageError::HttpStatus { status, .. } => {
                (400..500).contains(status) && *status != 429 && *status != 408
            }
            ImageError::Rack { source, .. } => matches!(source, RackError::Unauthorized { .. }),
            ImageError::Fetch { .. }
            | ImageError::ShortRead { .. }
            | ImageError::CleanupFailed { .. } => false,
        }
    }
}

fn rack(step: impl Into<String>) -> impl FnOnce(RackError) -> ImageError {
    let step = step.into();
    move |source| ImageError::Rack { step, source }
}

/// States of a disk during an import (the subset of Oxide disk states that matter here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportDiskState {
    Creating,
    ImportReady,
    ImportingFromBulkWrites,
    ImportingFromUrl,
    Finalizing,
    Detached,
    Faulted,
    /// Attached or anything else: not ours to touch.
    Other(String),
}

/// A disk as the import sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportDisk {
    pub name: String,
    pub state: ImportDiskState,
    pub size: u64,
    pub block_size: u64,
}

/// A snapshot as the import sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub id: uuid::Uuid,
    pub name: String,
    pub size: u64,
}

/// A project image to create from a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewImage {
    pub name: String,
    pub description: String,
    pub os: String,
    pub version: String,
    pub snapshot_id: uuid::Uuid,
}

/// The Oxide calls an image import needs, in the project the implementation works in.
/// Errors are classified [`RackError`]s (404 → `NotFound`, a 400 `ObjectAlreadyExists` →
/// `AlreadyExists`, 503 → `Unavailable`, ...).
pub trait ImageStore: Send + Sync {
    /// An image by name: the project's first, then the silo's.
    fn find_image(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Image>, RackError>> + Send;
    /// A disk by name, `None` when it does not exist.
    fn import_disk(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<ImportDisk>, RackError>> + Send;
    /// Creates a disk in state `import_ready` (source `importing_blocks`).
    fn create_import_disk(
        &self,
        name: &str,
        description: &str,
        size: u64,
        block_size: u64,
    ) -> impl Future<Output = Result<(), RackError>> + Send;
    /// `import_ready` → `importing_from_bulk_writes`.
    fn bulk_write_start(&self, disk: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Writes `data` at `offset` (both multiples of the block size, `data` ≤ [`MAX_CHUNK`]).
    fn bulk_write(
        &self,
        disk: &str,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<(), RackError>> + Send;
    /// `importing_from_bulk_writes` → `import_ready`.
    fn bulk_write_stop(&self, disk: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// `import_ready` → `detached`, taking a snapshot named `snapshot` when given.
    fn finalize_import(
        &self,
        disk: &str,
        snapshot: Option<&str>,
    ) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Takes snapshot `name` with `description` of the detached disk `disk` (`POST
    /// /v1/snapshots`; nexus reads a detached disk through the pantry). A snapshot finalize
    /// makes cannot carry a description; a backup's must ([`crate::domain::backup`]).
    fn create_snapshot(
        &self,
        name: &str,
        description: &str,
        disk: &str,
    ) -> impl Future<Output = Result<(), RackError>> + Send;
    /// A snapshot by name, `None` when it does not exist.
    fn snapshot(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Snapshot>, RackError>> + Send;
    fn delete_snapshot(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    fn delete_disk(&self, name: &str) -> impl Future<Output = Result<(), RackError>> + Send;
    /// Creates a project image from a snapshot.
    fn create_image(
        &self,
        image: &NewImage,
    ) -> impl Future<Output = Result<Image, RackError>> + Send;
}

/// Where image bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    File(PathBuf),
    Url(reqwest::Url),
}

impl std::fmt::Display for ImageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageSource::File(p) => write!(f, "{}", p.display()),
            ImageSource::Url(u) => write!(f, "{}", redact_url(u)),
        }
    }
}

/// A URL without user info or query (either may carry a token, e.g. a pre-signed URL).
fn redact_url(u: &reqwest::Url) -> String {
    let mut shown = u.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    if shown.query().is_some() {
        shown.set_query(Some("…"));
    }
    shown.to_string()
}

impl ImageSource {
    /// `http://…`/`https://…` is a URL, `file://…` or anything else a local path.
    pub fn parse(text: &str) -> Result<ImageSource, ImageError> {
        let bad = |message: &str| ImageError::BadSource {
            source_text: text.to_owned(),
            message: message.to_owned(),
        };
        let t = text.trim();
        if t.is_empty() {
            return Err(bad("is empty"));
        }
        let lower = t.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            let url = reqwest::Url::parse(t).map_err(|e| bad(&format!("not a valid URL: {e}")))?;
            if url.host_str().is_none() {
                return Err(bad("the URL has no host"));
            }
            return Ok(ImageSource::Url(url));
        }
        if let Some(path) = t.strip_prefix("file://") {
            return Ok(ImageSource::File(PathBuf::from(path)));
        }
        if lower.contains("://") {
            return Err(bad("only http://, https:// and local files are supported"));
        }
        Ok(ImageSource::File(PathBuf::from(t)))
    }

    /// Checks that the source can be read and returns its size in bytes, without reading it:
    /// a file's metadata, or a URL's `HEAD` answer (a `GET` whose body is dropped when the
    /// server does not do `HEAD`).
    pub async fn probe(&self, http: &reqwest::Client) -> Result<u64, ImageError> {
        let size = match self {
            ImageSource::File(path) => {
                let unreadable = |message: String| ImageError::Unreadable {
                    path: path.clone(),
                    message,
                };
                let meta = tokio::fs::metadata(path)
                    .await
                    .map_err(|e| unreadable(e.to_string()))?;
                if !meta.is_file() {
                    return Err(unreadable("not a regular file".into()));
                }
                // Opening proves read permission; metadata alone does not.
                tokio::fs::File::open(path)
                    .await
                    .map_err(|e| unreadable(e.to_string()))?;
                meta.len()
            }
            ImageSource::Url(url) => {
                let head = http
                    .head(url.clone())
                    .send()
                    .await
                    .map_err(|e| fetch_error(url, &e))?;
                let resp = if matches!(head.status().as_u16(), 405 | 501) {
                    http.get(url.clone())
                        .send()
                        .await
                        .map_err(|e| fetch_error(url, &e))?
                } else {
                    head
                };
                check_status(url, &resp)?;
                header_length(&resp).ok_or_else(|| ImageError::UnknownSize {
                    url: redact_url(url),
                })?
            }
        };
        check_size(&self.to_string(), size)?;
        self.check_not_qcow2(http).await?;
        Ok(size)
    }

    /// Refuses a qcow2 file or URL: bulk import writes bytes verbatim, so a qcow2 would make
    /// a disk that never boots (the VM runs, no Node ever joins). Reads the first bytes only.
    async fn check_not_qcow2(&self, http: &reqwest::Client) -> Result<(), ImageError> {
        let (mut reader, _) = self.open(http).await?;
        let head = reader
            .read_chunk(QCOW2_MAGIC.len())
            .await
            .unwrap_or_default();
        if head[..] == QCOW2_MAGIC[..] {
            return Err(ImageError::BadSource {
                source_text: self.to_string(),
                message: "is a qcow2 image, but images are uploaded as raw disk bytes; convert it first with `qemu-img convert -f qcow2 -O raw in.img out.raw` and pass the .raw file".to_owned(),
            });
        }
        Ok(())
    }

    /// Opens the source for reading from the start; returns the reader and the size.
    pub async fn open(&self, http: &reqwest::Client) -> Result<(SourceReader, u64), ImageError> {
        match self {
            ImageSource::File(path) => {
                let unreadable = |e: std::io::Error| ImageError::Unreadable {
                    path: path.clone(),
                    message: e.to_string(),
                };
                let file = tokio::fs::File::open(path).await.map_err(unreadable)?;
                let size = file.metadata().await.map_err(unreadable)?.len();
                check_size(&self.to_string(), size)?;
                Ok((SourceReader::File(Some(file.into_std().await)), size))
            }
            ImageSource::Url(url) => {
                let resp = http
                    .get(url.clone())
                    .send()
                    .await
                    .map_err(|e| fetch_error(url, &e))?;
                check_status(url, &resp)?;
                let size = header_length(&resp).ok_or_else(|| ImageError::UnknownSize {
                    url: redact_url(url),
                })?;
                check_size(&self.to_string(), size)?;
                Ok((
                    SourceReader::Http {
                        resp: Box::new(resp),
                        pending: Bytes::new(),
                        url: redact_url(url),
                    },
                    size,
                ))
            }
        }
    }
}

fn fetch_error(url: &reqwest::Url, e: &reqwest::Error) -> ImageError {
    // reqwest's Display includes the URL (maybe with a query token): keep only the kind.
    let message = if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        "request failed".to_owned()
    };
    ImageError::Fetch {
        url: redact_url(url),
        message,
    }
}

fn check_status(url: &reqwest::Url, resp: &reqwest::Response) -> Result<(), ImageError> {
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(ImageError::HttpStatus {
            url: redact_url(url),
            status: resp.status().as_u16(),
        })
    }
}

/// The `Content-Length` header itself: `Response::content_length` is the body's size hint,
/// which is 0 for a HEAD answer.
fn header_length(resp: &reqwest::Response) -> Option<u64> {
    resp.headers()
        .get(reqwest::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn check_size(source_text: &str, size: u64) -> Result<(), ImageError> {
    if size == 0 || size > MAX_DISK_BYTES {
        return Err(ImageError::BadSize {
            source_text: source_text.to_owned(),
            size,
        });
    }
    Ok(())
}

/// Sequential reader over an open source.
pub enum SourceReader {
    /// A local file, read on the blocking pool. `None` only while a read is in flight (the
    /// file travels to the blocking thread and back).
    File(Option<std::fs::File>),
    Http {
        resp: Box<reqwest::Response>,
        /// Bytes received but not yet handed out.
        pending: Bytes,
        url: String,
    },
    /// In-memory bytes (tests and benchmarks).
    Memory { data: Bytes, pos: usize },
    /// Sources read one after the other as one (a backup's archive: its head in memory, the
    /// snapshot file, its tail), each until it ends.
    Chain(std::collections::VecDeque<SourceReader>),
}

impl std::fmt::Debug for SourceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceReader::File(_) => f.write_str("SourceReader::File"),
            SourceReader::Http { url, .. } => write!(f, "SourceReader::Http({url})"),
            SourceReader::Memory { data, .. } => {
                write!(f, "SourceReader::Memory({} bytes)", data.len())
            }
            SourceReader::Chain(parts) => {
                f.debug_tuple("SourceReader::Chain").field(parts).finish()
            }
        }
    }
}

impl SourceReader {
    /// The next `want` bytes; fewer only at the end. Each byte is copied once, from the page
    /// cache or the socket into the returned buffer: the buffer is neither zero-filled first
    /// nor copied again on its way into the bulk writes (the upload's memory bandwidth goes
    /// to base64 and HTTP, see `cargo bench -p bootstrap --bench upload`).
    pub async fn read_chunk(&mut self, want: usize) -> Result<Bytes, String> {
        match self {
            SourceReader::File(slot) => {
                let file = slot.take().ok_or("an earlier read of the file failed")?;
                let (file, got) = tokio::task::spawn_blocking(move || {
                    use std::io::Read as _;
                    let mut buf = Vec::with_capacity(want);
                    // `read_to_end` on a `File` reads into the spare capacity directly.
                    let got = (&file).take(want as u64).read_to_end(&mut buf).map(|_| buf);
                    (file, got)
                })
                .await
                .map_err(|e| format!("the reading thread failed: {e}"))?;
                *slot = Some(file);
                got.map(Bytes::from).map_err(|e| e.to_string())
            }
            SourceReader::Http { resp, pending, .. } => {
                // Whole chunks straight from the socket's buffers when they are big enough.
                if pending.len() >= want {
                    return Ok(pending.split_to(want));
                }
                let mut buf = Vec::with_capacity(want);
                while buf.len() < want {
                    if pending.is_empty() {
                        match resp.chunk().await {
                            Ok(Some(b)) => *pending = b,
                            Ok(None) => break,
                            Err(e) => {
                                return Err(if e.is_timeout() {
                                    "timed out".into()
                                } else {
                                    "the download broke off".into()
                                });
                            }
                        }
                        continue;
                    }
                    let take = (want - buf.len()).min(pending.len());
                    buf.extend_from_slice(&pending.split_to(take));
                }
                Ok(Bytes::from(buf))
            }
            SourceReader::Memory { data, pos } => {
                let take = want.min(data.len() - *pos);
                let out = data.slice(*pos..*pos + take);
                *pos += take;
                Ok(out)
            }
            SourceReader::Chain(parts) => {
                // A whole chunk of one part goes out as it came (no copy); a chunk across two
                // parts is joined.
                let mut joined: Option<Vec<u8>> = None;
                let mut got = 0;
                while got < want {
                    let Some(part) = parts.front_mut() else {
                        break;
                    };
                    let asked = want - got;
                    let chunk = Box::pin(part.read_chunk(asked)).await?;
                    if chunk.len() < asked {
                        parts.pop_front();
                    }
                    if chunk.is_empty() {
                        continue;
                    }
                    got += chunk.len();
                    match &mut joined {
                        None if got == want => return Ok(chunk),
                        None => joined = Some(chunk.to_vec()),
                        Some(buf) => buf.extend_from_slice(&chunk),
                    }
                }
                Ok(joined.map(Bytes::from).unwrap_or_default())
            }
        }
    }
}

/// Import tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadOptions {
    /// Bulk writes in flight at once (1..=64).
    pub parallelism: usize,
    /// Bytes read from the source per step and the largest single write (64..=512 KiB).
    pub chunk_size: usize,
    /// Block size of the import disk (512, 2048 or 4096).
    pub block_size: u64,
    /// Skip all-zero runs (a fresh disk reads as zeros). Off only to measure raw ingest.
    pub skip_zeros: bool,
    /// Retry policy of each bulk write (they are idempotent) and of the other calls.
    pub retry: Backoff,
}

impl Default for UploadOptions {
    fn default() -> Self {
        UploadOptions {
            parallelism: DEFAULT_PARALLELISM,
            chunk_size: DEFAULT_CHUNK,
            block_size: DEFAULT_BLOCK_SIZE,
            skip_zeros: true,
            retry: Backoff::default(),
        }
    }
}

impl UploadOptions {
    /// Clamped to the API's limits, the chunk a multiple of the granule.
    pub fn normalized(self) -> UploadOptions {
        let block_size = match self.block_size {
            512 | 2048 | 4096 => self.block_size,
            _ => DEFAULT_BLOCK_SIZE,
        };
        let chunk = self.chunk_size.clamp(MIN_CHUNK, MAX_CHUNK);
        UploadOptions {
            parallelism: self.parallelism.clamp(1, 64),
            chunk_size: chunk - chunk % GRANULE,
            block_size,
            ..self
        }
    }
}

/// Progress of an upload, for a bar or for log lines.
pub trait UploadProgress: Send + Sync {
    /// The upload of `total` source bytes starts.
    fn start(&self, _total: u64) {}
    /// `bytes` more source bytes are done (written, or skipped as zeros).
    fn advance(&self, _bytes: u64) {}
    /// All bytes are written (finalize and image creation follow).
    fn finish(&self) {}
}

/// No progress reporting.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;
impl UploadProgress for NoProgress {}

/// Sizes of an import: data written up to `extent` (the source rounded up to the block
/// size), into a disk of `disk_size` (`extent` rounded up to whole GiB, as Oxide requires).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportSizes {
    pub source: u64,
    pub extent: u64,
    pub disk_size: u64,
}

/// The sizes for a source of `source` bytes with `block_size`-byte blocks.
pub fn import_sizes(source: u64, block_size: u64) -> ImportSizes {
    let extent = source.div_ceil(block_size) * block_size;
    let disk_size = extent.div_ceil(GIB).max(1) * GIB;
    ImportSizes {
        source,
        extent,
        disk_size,
    }
}

/// What an upload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UploadStats {
    /// Source bytes read.
    pub source_bytes: u64,
    /// Bytes sent in bulk writes (including the zero padding of the last block).
    pub written_bytes: u64,
    /// Bytes not sent because they were zero.
    pub skipped_bytes: u64,
    /// Bulk write calls made (first attempts).
    pub writes: u64,
    pub elapsed: Duration,
    /// sha256 of the source bytes read (without the padding of the last block).
    pub sha256: [u8; 32],
}

/// Lower-case hex of a digest.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A granule of zeros to compare against.
static ZEROS: [u8; GRANULE] = [0; GRANULE];

/// The runs of non-zero granules in `chunk` (whose first byte is at `offset`), each at most
/// `max` bytes: `(offset, bytes)` pairs to write. With `skip_zeros` off, `chunk` itself split
/// at `max`. `chunk.len()` must be a multiple of the block size.
pub fn nonzero_runs(chunk: &Bytes, offset: u64, max: usize, skip_zeros: bool) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let mut push = |start: usize, end: usize| {
        let mut s = start;
        while s < end {
            let e = (s + max).min(end);
            out.push((offset + s as u64, chunk.slice(s..e)));
            s = e;
        }
    };
    if !skip_zeros {
        push(0, chunk.len());
        return out;
    }
    let mut run: Option<usize> = None;
    let mut pos = 0;
    while pos < chunk.len() {
        let end = (pos + GRANULE).min(chunk.len());
        // Slice equality is a memcmp: fast even in unoptimized builds.
        let zero = chunk[pos..end] == ZEROS[..end - pos];
        match (zero, run) {
            (false, None) => run = Some(pos),
            (true, Some(start)) => {
                push(start, pos);
                run = None;
            }
            _ => {}
        }
        pos = end;
    }
    if let Some(start) = run {
        push(start, chunk.len());
    }
    out
}

/// Streams `reader` (announced as `size` bytes) into the disk `disk`, which must be in state
/// `importing_from_bulk_writes` and at least `size` rounded up to the block size large. Up to
/// `opts.parallelism` writes are in flight; each is retried on retryable errors (writes are
/// idempotent). The first failure stops the upload and is returned.
pub async fn upload<S: ImageStore>(
    store: &S,
    disk: &str,
    reader: &mut SourceReader,
    size: u64,
    source_text: &str,
    opts: &UploadOptions,
    progress: &dyn UploadProgress,
) -> Result<UploadStats, ImageError> {
    let opts = opts.normalized();
    let started = Instant::now();
    let block = usize::try_from(opts.block_size).unwrap_or(512);
    progress.start(size);

    // Reading is sequential; the writes of each chunk go out as soon as it is read. The
    // reader and its buffer travel through the unfold state; totals and a read failure are
    // kept beside it (never locked across an await).
    let totals = std::sync::Mutex::new(UploadStats::default());
    let read_failure: std::sync::Mutex<Option<ImageError>> = std::sync::Mutex::new(None);
    let hasher = std::sync::Mutex::new(Sha256::new());
    let chunk_size = opts.chunk_size;
    let skip_zeros = opts.skip_zeros;
    let (totals_ref, failure_ref, hasher_ref) = (&totals, &read_failure, &hasher);
    let start = (reader, 0u64, false);
    let chunks = futures::stream::unfold(start, move |(reader, offset, done)| async move {
        // Never read past the announced size: the disk was sized for it.
        let want = usize::try_from(size.saturating_sub(offset))
            .unwrap_or(usize::MAX)
            .min(chunk_size);
        if done || want == 0 {
            return None;
        }
        let chunk = match reader.read_chunk(want).await {
            Ok(chunk) => chunk,
            Err(message) => {
                *lock(failure_ref) = Some(ImageError::Fetch {
                    url: source_text.to_owned(),
                    message,
                });
                return None;
            }
        };
        let n = chunk.len();
        if n == 0 {
            return None;
        }
        lock(hasher_ref).update(&chunk);
        // The last block is padded with zeros: writes must be whole blocks.
        let padded = n.div_ceil(block) * block;
        let chunk = pad_with_zeros(chunk, padded);
        let runs = nonzero_runs(&chunk, offset, chunk_size, skip_zeros);
        let sent: u64 = runs.iter().map(|(_, b)| b.len() as u64).sum();
        {
            let mut t = lock(totals_ref);
            t.source_bytes += n as u64;
            t.written_bytes += sent;
            t.skipped_bytes += (padded as u64).saturating_sub(sent);
            t.writes += runs.len() as u64;
        }
        // Skipped bytes are done at once; written ones when their write completes.
        progress.advance((n as u64).saturating_sub(sent));
        let last = n < want;
        Some((
            futures::stream::iter(runs),
            (reader, offset + n as u64, last),
        ))
    })
    .flatten();

    let result = write_runs(store, disk, chunks, &opts, progress).await;
    result?;
    if let Some(e) = lock(&read_failure).take() {
        return Err(e);
    }
    let stats = *lock(&totals);
    if stats.source_bytes != size {
        return Err(ImageError::ShortRead {
            source_text: source_text.to_owned(),
            got: stats.source_bytes,
            expected: size,
        });
    }
    progress.finish();
    let digest = lock(&hasher).clone().finalize();
    Ok(UploadStats {
        elapsed: started.elapsed(),
        sha256: digest.into(),
        ..stats
    })
}

/// `chunk` padded with zeros to `padded` bytes (the chunk itself when it is that long).
fn pad_with_zeros(chunk: Bytes, padded: usize) -> Bytes {
    if padded == chunk.len() {
        return chunk;
    }
    let mut v = Vec::with_capacity(padded);
    v.extend_from_slice(&chunk);
    v.resize(padded, 0);
    Bytes::from(v)
}

/// Writes each `(offset, bytes)` run into disk `disk`, up to `opts.parallelism` at once, each
/// retried on retryable errors; progress advances as each one completes. The first failure
/// is returned.
async fn write_runs<S: ImageStore>(
    store: &S,
    disk: &str,
    runs: impl futures::Stream<Item = (u64, Bytes)>,
    opts: &UploadOptions,
    progress: &dyn UploadProgress,
) -> Result<(), ImageError> {
    runs.map(|(offset, data)| {
        let len = data.len() as u64;
        async move {
            retry::retry(opts.retry, RackError::is_retryable, || {
                store.bulk_write(disk, offset, data.clone())
            })
            .await
            .map_err(rack(format!(
                "writing {len} bytes at offset {offset} of disk {disk}"
            )))?;
            Ok::<u64, ImageError>(len)
        }
    })
    .buffer_unordered(opts.parallelism)
    .try_for_each(|len| async move {
        progress.advance(len);
        Ok(())
    })
    .await
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Names of the temporary disk and snapshot of an import of image `image`. Derived from the
/// image name (not random) so a re-run after a crash finds what the crashed run left. They do
/// not start with `boot-`/`data-`, so the reconcile planner never takes them for member disks.
pub fn temp_names(image: &str, cluster: Option<&str>) -> (String, String) {
    // The cluster is part of the name: two clusters of one project uploading an image of the
    // same name at once must not remove each other's import as a "leftover" (audit
    // oxide-api-2 F6). The second to finish finds the first's image and takes it.
    let mut hash = Sha256::new();
    hash.update(image.as_bytes());
    if let Some(c) = cluster {
        hash.update([0]);
        hash.update(c.as_bytes());
    }
    let digest = hash.finalize();
    let hex: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    (
        format!("oxide-controller-import-{hex}"),
        format!("oxide-controller-import-{hex}"),
    )
}

/// Description of the temporary import disk: names the image and, when known, the cluster the
/// upload is for (`cluster=<c>`), which is how `bootstrap delete` knows a leftover is its own.
pub fn import_disk_description(image: &str, cluster: Option<&str>) -> String {
    match cluster {
        Some(c) => format!("oxide-controller: temporary import of image {image} cluster={c}"),
        None => format!("oxide-controller: temporary import of image {image}"),
    }
}

/// The cluster a temporary import disk was made for, from its description.
pub fn import_disk_cluster(description: &str) -> Option<&str> {
    description
        .strip_prefix("oxide-controller: temporary import of image ")?
        .split_whitespace()
        .find_map(|w| w.strip_prefix("cluster="))
}

/// What [`ensure_image`] is asked for.
#[derive(Debug, Clone)]
pub struct ImageRequest {
    /// Image name (looked up in the project, then the silo; created in the project).
    pub name: String,
    /// Where to get the bytes if the image does not exist.
    pub source: Option<ImageSource>,
    /// The sha256 (hex) the source's bytes must have (`--image-source-sha256`): checked as
    /// they stream, before the import disk is finalized; a mismatch imports nothing.
    pub sha256: Option<String>,
    /// `os` field of a created image.
    pub os: String,
    /// `version` field of a created image.
    pub version: String,
    /// The cluster an upload is for, recorded in the created image's description
    /// ([`crate::base::names::uploaded_image_description`]) so `bootstrap delete --delete-images`
    /// removes only images it uploaded for that cluster.
    pub cluster: Option<String>,
}

/// How [`ensure_image`] got its image.
#[derive(Debug, Clone, PartialEq)]
pub enum EnsuredImage {
    /// It existed.
    Found(Image),
    /// It was uploaded now.
    Uploaded {
        image: Image,
        sizes: ImportSizes,
        stats: UploadStats,
    },
}

impl EnsuredImage {
    pub fn image(&self) -> &Image {
        match self {
            EnsuredImage::Found(i) | EnsuredImage::Uploaded { image: i, .. } => i,
        }
    }
}

/// Finds the image `req.name`, or makes it from `req.source`.
///
/// When a source is given, leftovers of an earlier, interrupted import of the same image
/// (the [`temp_names`] disk and snapshot) are removed first, whether or not the image exists
/// by now. A failed import removes its temporary disk and snapshot before returning.
pub async fn ensure_image<S: ImageStore>(
    store: &S,
    req: &ImageRequest,
    http: &reqwest::Client,
    opts: &UploadOptions,
    progress: &dyn UploadProgress,
) -> Result<EnsuredImage, ImageError> {
    let opts = opts.normalized();
    let (disk, snapshot) = temp_names(&req.name, req.cluster.as_deref());
    let found = retry::retry(opts.retry, RackError::is_retryable, || {
        store.find_image(&req.name)
    })
    .await
    .map_err(rack(format!("looking up image {}", req.name)))?;
    if req.source.is_some() {
        remove_leftovers(store, &disk, &snapshot, &opts).await?;
    }
    if let Some(image) = found {
        return Ok(EnsuredImage::Found(image));
    }
    let Some(source) = &req.source else {
        return Err(ImageError::NotFound {
            name: req.name.clone(),
        });
    };
    let (mut reader, size) = source.open(http).await?;
    let sizes = import_sizes(size, opts.block_size);
    info!(
        image = %req.name,
        source = %source,
        source_bytes = size,
        disk_bytes = sizes.disk_size,
        parallelism = opts.parallelism,
        "uploading image"
    );
    let description = import_disk_description(&req.name, req.cluster.as_deref());
    match retry::retry(opts.retry, RackError::is_retryable, || {
        store.create_import_disk(&disk, &description, sizes.disk_size, opts.block_size)
    })
    .await
    {
        // Leftovers were removed above, so this is our own try whose answer got lost.
        Ok(()) | Err(RackError::AlreadyExists { .. }) => {}
        Err(e) => return Err(rack(format!("creating the import disk {disk}"))(e)),
    }

    let imported = import_into(
        store,
        req,
        &disk,
        &snapshot,
        &mut reader,
        size,
        &source.to_string(),
        &opts,
        progress,
    )
    .await;
    match imported {
        Ok((image, stats)) => {
            // The image stands on its own now; the scaffolding goes. A failure here is only
            // a leftover the next run with this --image-source removes.
            if let Err(e) = remove_leftovers(store, &disk, &snapshot, &opts).await {
                warn!(error = %e, disk = %disk, "the image exists, but removing the temporary disk and snapshot failed");
            }
            Ok(EnsuredImage::Uploaded {
                image,
                sizes,
                stats,
            })
        }
        Err(e) => match remove_leftovers(store, &disk, &snapshot, &opts).await {
            Ok(()) => Err(e),
            Err(cleanup) => Err(ImageError::CleanupFailed {
                error: Box::new(e),
                disk,
                cleanup: cleanup.to_string(),
            }),
        },
    }
}

#[allow(clippy::too_many_arguments)]
async fn import_into<S: ImageStore>(
    store: &S,
    req: &ImageRequest,
    disk: &str,
    snapshot: &str,
    reader: &mut SourceReader,
    size: u64,
    source_text: &str,
    opts: &UploadOptions,
    progress: &dyn UploadProgress,
) -> Result<(Image, UploadStats), ImageError> {
    let again = |e: &RackError| e.is_retryable();
    retry::retry(opts.retry, again, || store.bulk_write_start(disk))
        .await
        .map_err(rack(format!("starting the bulk import into disk {disk}")))?;
    let stats = upload(store, disk, reader, size, source_text, opts, progress).await?;
    // Checked before the disk is finalized: a mismatch leaves only the temporary disk, which
    // the caller removes.
    if let Some(expected) = &req.sha256 {
        let actual = hex(&stats.sha256);
        if !actual.eq_ignore_ascii_case(expected) {
            return Err(ImageError::DigestMismatch {
                source_text: source_text.to_owned(),
                expected: expected.to_ascii_lowercase(),
                actual,
            });
        }
    }
    retry::retry(opts.retry, again, || store.bulk_write_stop(disk))
        .await
        .map_err(rack(format!("stopping the bulk import into disk {disk}")))?;
    retry::retry(opts.retry, again, || {
        store.finalize_import(disk, Some(snapshot))
    })
    .await
    .map_err(rack(format!("finalizing disk {disk}")))?;
    let snap = retry::retry(opts.retry, again, || store.snapshot(snapshot))
        .await
        .map_err(rack(format!("reading snapshot {snapshot}")))?
        .ok_or_else(|| ImageError::Rack {
            step: format!("reading snapshot {snapshot}"),
            source: RackError::NotFound {
                what: format!("snapshot {snapshot} (finalize did not make it)"),
            },
        })?;
    let new = NewImage {
        name: req.name.clone(),
        description: crate::base::names::uploaded_image_description(
            req.cluster.as_deref(),
            truncate(source_text, 200),
        ),
        os: req.os.clone(),
        version: req.version.clone(),
        snapshot_id: snap.id,
    };
    let image = match store.create_image(&new).await {
        Ok(image) => image,
        // A lost answer to an earlier try, or someone else's upload: take the image by name.
        Err(RackError::AlreadyExists { .. }) => store
            .find_image(&req.name)
            .await
            .map_err(rack(format!("looking up image {}", req.name)))?
            .ok_or_else(|| ImageError::Rack {
                step: format!("creating image {}", req.name),
                source: RackError::Conflict {
                    what: format!("image {}", req.name),
                    message: "it exists but cannot be found by name".into(),
                },
            })?,
        Err(e) => {
            return Err(rack(format!(
                "creating image {} from snapshot {snapshot}",
                req.name
            ))(e));
        }
    };
    Ok((image, stats))
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Removes the temporary snapshot and disk of an import, walking the disk out of whatever
/// import state it is in first (bulk writes → stop; import ready → finalize; creating or
/// finalizing → wait). Absent objects are fine.
pub async fn remove_leftovers<S: ImageStore>(
    store: &S,
    disk: &str,
    snapshot: &str,
    opts: &UploadOptions,
) -> Result<(), ImageError> {
    let again = |e: &RackError| e.is_retryable();
    if retry::retry(opts.retry, again, || store.snapshot(snapshot))
        .await
        .map_err(rack(format!("reading snapshot {snapshot}")))?
        .is_some()
    {
        info!(
            snapshot,
            "removing the temporary snapshot of an image import"
        );
        match retry::retry(opts.retry, again, || store.delete_snapshot(snapshot)).await {
            Ok(()) | Err(RackError::NotFound { .. }) => {}
            Err(e) => return Err(rack(format!("deleting snapshot {snapshot}"))(e)),
        }
    }
    release_import_disk(store, disk, opts.retry).await
}

/// Deletes an import disk whatever step of the import it stopped at. Nexus deletes only
/// `detached` or `faulted` disks (omicron `nexus/src/app/sagas/disk_delete.rs`); a killed
/// upload leaves one `importing_from_bulk_writes` or `import_ready`, which only stop and then
/// finalize (no snapshot) bring to `detached` — the SDK's own importer cleans up the same way.
pub async fn release_import_disk<S: ImageStore>(
    store: &S,
    disk: &str,
    backoff: retry::Backoff,
) -> Result<(), ImageError> {
    let again = |e: &RackError| e.is_retryable();
    // A disk walks through at most stop → finalize → delete; the bound guards against a disk
    // that stays busy (creating/finalizing on a slow rack).
    for attempt in 0..40 {
        let Some(d) = retry::retry(backoff, again, || store.import_disk(disk))
            .await
            .map_err(rack(format!("reading disk {disk}")))?
        else {
            return Ok(());
        };
        if attempt == 0 {
            info!(disk, state = ?d.state, "removing the temporary disk of an image import");
        }
        let step = match d.state {
            ImportDiskState::ImportingFromBulkWrites => store.bulk_write_stop(disk).await,
            ImportDiskState::ImportReady => store.finalize_import(disk, None).await,
            ImportDiskState::Detached | ImportDiskState::Faulted => {
                match store.delete_disk(disk).await {
                    Err(RackError::NotFound { .. }) => Ok(()),
                    other => other,
                }
            }
            ImportDiskState::Creating
            | ImportDiskState::Finalizing
            | ImportDiskState::ImportingFromUrl => {
                tokio::time::sleep(Duration::from_millis(250)).await;
                Ok(())
            }
            ImportDiskState::Other(state) => {
                return Err(ImageError::Rack {
                    step: format!("removing disk {disk}"),
                    source: RackError::Conflict {
                        what: format!("disk {disk}"),
                        message: format!("it is {state}; detach it and delete it by hand"),
                    },
                });
            }
        };
        match step {
            Ok(()) => {}
            // Someone moved it meanwhile (a concurrent cleanup): look again.
            Err(
                RackError::Invalid { .. } | RackError::Conflict { .. } | RackError::NotFound { .. },
            ) => {}
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => return Err(rack(format!("removing disk {disk}"))(e)),
        }
    }
    Err(ImageError::Rack {
        step: format!("removing disk {disk}"),
        source: RackError::Timeout {
            what: format!("disk {disk} to become deletable"),
            seconds: 10,
        },
    })
}

pub mod fake {
    //! [`MemoryImageStore`]: an in-memory [`ImageStore`] that enforces the import state
    //! machine the way the API does (out-of-order steps fail, writes must be block-aligned,
    //! ≤ 512 KiB and inside the disk), records every call, and can be told to fail.

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex, MutexGuard};

    use bytes::Bytes;
    use uuid::Uuid;

    use super::{ImageStore, ImportDisk, ImportDiskState, MAX_CHUNK, NewImage, Snapshot};
    use crate::base::size::ByteSize;
    use crate::domain::model::Image;
    use crate::ports::rack::RackError;

    /// A disk's contents: offset → block-aligned bytes written there.
    #[derive(Debug, Clone, Default)]
    pub struct FakeDisk {
        pub state: Option<ImportDiskState>,
        pub size: u64,
        pub block_size: u64,
        pub writes: BTreeMap<u64, Bytes>,
    }

    /// Everything the fake holds.
    #[derive(Debug, Default)]
    pub struct MemoryState {
        pub images: Vec<Image>,
        pub disks: BTreeMap<String, FakeDisk>,
        pub snapshots: BTreeMap<String, (Snapshot, BTreeMap<u64, Bytes>)>,
        /// Descriptions of the snapshots `create_snapshot` took.
        pub descriptions: BTreeMap<String, String>,
        /// Every call, e.g. `"write 0+524288"`, `"create-disk oxide-controller-import-…"`.
        pub calls: Vec<String>,
        /// The n-th bulk write (0-based) fails with a non-retryable error.
        pub fail_write: Option<usize>,
        /// Bulk writes fail with a 503 this many times before succeeding.
        pub transient_write_failures: usize,
        /// `create_image` fails (non-retryable).
        pub fail_create_image: bool,
        /// Bulk writes that reached the store (after transient failures).
        pub bulk_writes: usize,
        /// Bulk writes in progress now, and the most there ever were at once.
        pub in_flight: usize,
        pub max_in_flight: usize,
        /// The first bulk write waits (up to 2 s) until a second one is in flight, so a test
        /// of parallel uploads sees the overlap however loaded the machine is; a sequential
        /// uploader still shows none.
        pub hold_first_write: bool,
        /// Bulk writes started so far.
        pub writes_started: usize,
    }

    /// Cheap to clone; clones share one store.
    #[derive(Debug, Clone, Default)]
    pub struct MemoryImageStore(pub Arc<Mutex<MemoryState>>);

    fn invalid(what: &str, message: &str) -> RackError {
        RackError::Invalid {
            what: what.to_owned(),
            message: message.to_owned(),
        }
    }

    impl MemoryImageStore {
        pub fn new() -> Self {
            Self::default()
        }

        pub fn lock(&self) -> MutexGuard<'_, MemoryState> {
            self.0.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Adds an existing image.
        pub fn add_image(&self, name: &str, silo: bool) -> Image {
            let image = Image {
                id: Uuid::new_v4(),
                name: name.to_owned(),
                description: String::new(),
                size: ByteSize::gib(1),
                block_size: 512,
                silo_scoped: silo,
            };
            self.lock().images.push(image.clone());
            image
        }

        /// The bytes of snapshot `name` (or of the image made from it) from 0 to `len`.
        pub fn snapshot_bytes(&self, name: &str, len: usize) -> Option<Vec<u8>> {
            let s = self.lock();
            let (_, writes) = s.snapshots.get(name)?;
            Some(flatten(writes, len))
        }
    }

    /// The written bytes laid out from 0 to `len` (zeros where nothing was written).
    pub fn flatten(writes: &BTreeMap<u64, Bytes>, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        for (off, data) in writes {
            let off = usize::try_from(*off).unwrap_or(usize::MAX);
            if off >= len {
                continue;
            }
            let n = data.len().min(len - off);
            out[off..off + n].copy_from_slice(&data[..n]);
        }
        out
    }

    impl ImageStore for MemoryImageStore {
        async fn find_image(&self, name: &str) -> Result<Option<Image>, RackError> {
            let s = self.lock();
            let project = s.images.iter().find(|i| i.name == name && !i.silo_scoped);
            let silo = s.images.iter().find(|i| i.name == name && i.silo_scoped);
            Ok(project.or(silo).cloned())
        }

        async fn import_disk(&self, name: &str) -> Result<Option<ImportDisk>, RackError> {
            Ok(self.lock().disks.get(name).map(|d| ImportDisk {
                name: name.to_owned(),
                state: d.state.clone().unwrap_or(ImportDiskState::Detached),
                size: d.size,
                block_size: d.block_size,
            }))
        }

        async fn create_import_disk(
            &self,
            name: &str,
            _description: &str,
            size: u64,
            block_size: u64,
        ) -> Result<(), RackError> {
            let mut s = self.lock();
            s.calls.push(format!("create-disk {name} {size}"));
            if s.disks.contains_key(name) {
                return Err(RackError::AlreadyExists {
                    what: format!("disk {name}"),
                });
            }
            if size == 0
                || !size.is_multiple_of(crate::base::size::GIB)
                || !size.is_multiple_of(block_size)
            {
                return Err(invalid(name, "size must be a whole number of GiB"));
            }
            s.disks.insert(
                name.to_owned(),
                FakeDisk {
                    state: Some(ImportDiskState::ImportReady),
                    size,
                    block_size,
                    writes: BTreeMap::new(),
                },
            );
            Ok(())
        }

        async fn bulk_write_start(&self, disk: &str) -> Result<(), RackError> {
            let mut s = self.lock();
            s.calls.push(format!("start {disk}"));
            let d = s
                .disks
                .get_mut(disk)
                .ok_or_else(|| RackError::NotFound { what: disk.into() })?;
            if d.state != Some(ImportDiskState::ImportReady) {
                return Err(invalid(disk, "not import_ready"));
            }
            d.state = Some(ImportDiskState::ImportingFromBulkWrites);
            Ok(())
        }

        async fn bulk_write(&self, disk: &str, offset: u64, data: Bytes) -> Result<(), RackError> {
            let hold = {
                let mut s = self.lock();
                s.in_flight += 1;
                s.max_in_flight = s.max_in_flight.max(s.in_flight);
                s.writes_started += 1;
                s.hold_first_write && s.writes_started == 1
            };
            if hold {
                let until = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
                while self.lock().in_flight < 2 && tokio::time::Instant::now() < until {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            // Let other writes interleave, as on a real network.
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            let mut s = self.lock();
            s.in_flight -= 1;
            if s.transient_write_failures > 0 {
                s.transient_write_failures -= 1;
                return Err(RackError::Unavailable {
                    what: disk.into(),
                    status: 503,
                    message: "try again".into(),
                });
            }
            let n = s.bulk_writes;
            s.bulk_writes += 1;
            s.calls.push(format!("write {offset}+{}", data.len()));
            if s.fail_write == Some(n) {
                return Err(invalid(disk, "injected write failure"));
            }
            let d = s
                .disks
                .get_mut(disk)
                .ok_or_else(|| RackError::NotFound { what: disk.into() })?;
            if d.state != Some(ImportDiskState::ImportingFromBulkWrites) {
                return Err(invalid(disk, "not importing from bulk writes"));
            }
            let len = data.len() as u64;
            if data.is_empty()
                || data.len() > MAX_CHUNK
                || !offset.is_multiple_of(d.block_size)
                || !len.is_multiple_of(d.block_size)
                || offset + len > d.size
            {
                return Err(invalid(disk, &format!("bad write {offset}+{len}")));
            }
            d.writes.insert(offset, data);
            Ok(())
        }

        async fn bulk_write_stop(&self, disk: &str) -> Result<(), RackError> {
            let mut s = self.lock();
            s.calls.push(format!("stop {disk}"));
            let d = s
                .disks
                .get_mut(disk)
                .ok_or_else(|| RackError::NotFound { what: disk.into() })?;
            if d.state != Some(ImportDiskState::ImportingFromBulkWrites) {
                return Err(invalid(disk, "not importing from bulk writes"));
            }
            d.state = Some(ImportDiskState::ImportReady);
            Ok(())
        }

        async fn finalize_import(
            &self,
            disk: &str,
            snapshot: Option<&str>,
        ) -> Result<(), RackError> {
            let mut s = self.lock();
            s.calls
                .push(format!("finalize {disk} {}", snapshot.unwrap_or("-")));
            let d = s
                .disks
                .get_mut(disk)
                .ok_or_else(|| RackError::NotFound { what: disk.into() })?;
            if d.state != Some(ImportDiskState::ImportReady) {
                return Err(invalid(disk, "not import_ready"));
            }
            d.state = Some(ImportDiskState::Detached);
            let (size, writes) = (d.size, d.writes.clone());
            if let Some(name) = snapshot {
                if s.snapshots.contains_key(name) {
                    return Err(RackError::AlreadyExists {
                        what: format!("snapshot {name}"),
                    });
                }
                let snap = Snapshot {
                    id: Uuid::new_v4(),
                    name: name.to_owned(),
                    size,
                };
                s.snapshots.insert(name.to_owned(), (snap, writes));
            }
            Ok(())
        }

        async fn create_snapshot(
            &self,
            name: &str,
            description: &str,
            disk: &str,
        ) -> Result<(), RackError> {
            let mut s = self.lock();
            s.calls.push(format!("create-snapshot {name} of {disk}"));
            let d = s
                .disks
                .get(disk)
                .ok_or_else(|| RackError::NotFound { what: disk.into() })?;
            if d.state != Some(ImportDiskState::Detached) {
                return Err(invalid(disk, "not detached"));
            }
            if s.snapshots.contains_key(name) {
                return Err(RackError::AlreadyExists {
                    what: format!("snapshot {name}"),
                });
            }
            let snap = Snapshot {
                id: Uuid::new_v4(),
                name: name.to_owned(),
                size: d.size,
            };
            let writes = d.writes.clone();
            s.snapshots.insert(name.to_owned(), (snap, writes));
            s.descriptions
                .insert(name.to_owned(), description.to_owned());
            Ok(())
        }

        async fn snapshot(&self, name: &str) -> Result<Option<Snapshot>, RackError> {
            Ok(self.lock().snapshots.get(name).map(|(s, _)| s.clone()))
        }

        async fn delete_snapshot(&self, name: &str) -> Result<(), RackError> {
            let mut s = self.lock();
            s.calls.push(format!("delete-snapshot {name}"));
            s.snapshots
                .remove(name)
                .map(drop)
                .ok_or_else(|| RackError::NotFound { what: name.into() })
        }

        async fn delete_disk(&self, name: &str) -> Result<(), RackError> {
            let mut s = self.lock();
            s.calls.push(format!("delete-disk {name}"));
            match s.disks.get(name).and_then(|d| d.state.clone()) {
                None => Err(RackError::NotFound { what: name.into() }),
                Some(ImportDiskState::Detached | ImportDiskState::Faulted) => {
                    s.disks.remove(name);
                    Ok(())
                }
                Some(other) => Err(invalid(
                    name,
                    &format!("cannot delete a disk in state {other:?}"),
                )),
            }
        }

        async fn create_image(&self, image: &NewImage) -> Result<Image, RackError> {
            let mut s = self.lock();
            s.calls.push(format!("create-image {}", image.name));
            if s.fail_create_image {
                return Err(invalid(&image.name, "injected image failure"));
            }
            let Some((snap, _)) = s
                .snapshots
                .values()
                .find(|(snap, _)| snap.id == image.snapshot_id)
            else {
                return Err(RackError::NotFound {
                    what: "snapshot".into(),
                });
            };
            if s.images
                .iter()
                .any(|i| i.name == image.name && !i.silo_scoped)
            {
                return Err(RackError::AlreadyExists {
                    what: image.name.clone(),
                });
            }
            let created = Image {
                id: Uuid::new_v4(),
                name: image.name.clone(),
                description: image.description.clone(),
                size: ByteSize(snap.size),
                block_size: 512,
                silo_scoped: false,
            };
            s.images.push(created.clone());
            Ok(created)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_as_urls_or_paths() {
        assert!(matches!(
            ImageSource::parse("https://example.com/a.raw"),
            Ok(ImageSource::Url(_))
        ));
        assert!(matches!(
            ImageSource::parse("HTTP://example.com/a.raw"),
            Ok(ImageSource::Url(_))
        ));
        assert_eq!(
            ImageSource::parse("file:///tmp/a.raw").unwrap(),
            ImageSource::File("/tmp/a.raw".into())
        );
        assert_eq!(
            ImageSource::parse("./a.raw").unwrap(),
            ImageSource::File("./a.raw".into())
        );
        assert!(ImageSource::parse("s3://bucket/a.raw").is_err());
        assert!(ImageSource::parse("  ").is_err());
    }

    #[test]
    fn urls_are_shown_without_credentials_or_query() {
        let src = ImageSource::parse("https://user:pw@example.com/a.raw?X-Sig=secret").unwrap();
        let shown = src.to_string();
        assert!(
            !shown.contains("pw") && !shown.contains("secret"),
            "{shown}"
        );
        assert!(shown.contains("example.com/a.raw"), "{shown}");
    }

    #[test]
    fn sizes_round_to_blocks_then_to_whole_gib() {
        assert_eq!(
            import_sizes(1000, 512),
            ImportSizes {
                source: 1000,
                extent: 1024,
                disk_size: GIB
            }
        );
        assert_eq!(import_sizes(GIB, 512).disk_size, GIB);
        assert_eq!(
            import_sizes(GIB + 1, 512),
            ImportSizes {
                source: GIB + 1,
                extent: GIB + 512,
                disk_size: 2 * GIB
            }
        );
        assert_eq!(import_sizes(4097, 4096).extent, 8192);
    }

    #[test]
    fn zero_granules_are_not_written_and_runs_respect_the_maximum() {
        let mut data = vec![0u8; 4 * GRANULE];
        data[1] = 1; // granule 0
        data[2 * GRANULE + 5] = 1; // granule 2
        data[3 * GRANULE] = 1; // granule 3
        let chunk = Bytes::from(data);
        let runs = nonzero_runs(&chunk, 1 << 20, MAX_CHUNK, true);
        let shape: Vec<(u64, usize)> = runs.iter().map(|(o, b)| (*o, b.len())).collect();
        assert_eq!(
            shape,
            vec![
                (1 << 20, GRANULE),
                ((1 << 20) + 2 * GRANULE as u64, 2 * GRANULE)
            ]
        );
        let split = nonzero_runs(&chunk, 0, GRANULE, false);
        assert_eq!(
            split.len(),
            4,
            "without skipping, everything is written in max-sized pieces"
        );
        assert!(nonzero_runs(&Bytes::from(vec![0u8; GRANULE]), 0, MAX_CHUNK, true).is_empty());
    }

    #[test]
    fn options_are_clamped_to_the_api_limits() {
        let o = UploadOptions {
            parallelism: 0,
            chunk_size: 100,
            block_size: 1000,
            ..UploadOptions::default()
        }
        .normalized();
        assert_eq!(
            (o.parallelism, o.chunk_size, o.block_size),
            (1, MIN_CHUNK, 512)
        );
        let o = UploadOptions {
            chunk_size: 100 << 20,
            ..UploadOptions::default()
        }
        .normalized();
        assert_eq!(o.chunk_size, MAX_CHUNK);
    }

    #[test]
    fn temp_names_are_valid_stable_and_not_member_disks() {
        let (d, s) = temp_names("ubuntu-2404", None);
        assert_eq!(temp_names("ubuntu-2404", None), (d.clone(), s.clone()));
        assert_ne!(temp_names("debian-13", None).0, d);
        // Per cluster: another cluster's concurrent upload of the same image is not ours.
        let a = temp_names("ubuntu-2404", Some("prod")).0;
        assert_ne!(a, d);
        assert_ne!(a, temp_names("ubuntu-2404", Some("staging")).0);
        assert_eq!(a, temp_names("ubuntu-2404", Some("prod")).0);
        crate::base::names::validate_name("disk", &d).unwrap();
        crate::base::names::validate_name("snapshot", &s).unwrap();
        assert_eq!(crate::base::names::disk_owner(&d), None);
    }
}
