//! What a person watching bootstrap sees while it waits: a progress bar for image uploads and
//! a spinner for waits, redrawn in place on a terminal; on anything else (CI, a pipe, JSON
//! logs) periodic log lines instead, so logs stay line-oriented. Only presentation lives here.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::info;

use crate::adapters::image::UploadProgress;

/// How often a terminal line is redrawn.
const REDRAW: Duration = Duration::from_millis(100);
/// How often a log line is written when there is no terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);
const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// Whether to draw in place: stderr is a terminal and logs are not JSON.
pub fn interactive(json_logs: bool) -> bool {
    !json_logs && std::io::stderr().is_terminal()
}

fn draw(line: &str) {
    let mut err = std::io::stderr().lock();
    // Carriage return + clear line: redraw in place.
    let _ = write!(err, "\r\x1b[2K{line}");
    let _ = err.flush();
}

fn end_line() {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err);
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Upload progress of one image.
#[derive(Debug)]
pub struct UploadBar {
    image: String,
    tty: bool,
    total: AtomicU64,
    done: AtomicU64,
    started: Mutex<Instant>,
    last: Mutex<Instant>,
}

impl UploadBar {
    pub fn new(image: &str, tty: bool) -> Self {
        let now = Instant::now();
        UploadBar {
            image: image.to_owned(),
            tty,
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
            started: Mutex::new(now),
            last: Mutex::new(now),
        }
    }

    fn rate(&self, done: u64) -> f64 {
        let secs = self
            .started
            .lock()
            .map(|s| s.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        if secs > 0.0 { mib(done) / secs } else { 0.0 }
    }

    fn report(&self, force: bool) {
        let now = Instant::now();
        let every = if self.tty { REDRAW } else { LOG_EVERY };
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if !force && now.duration_since(*last) < every {
                return;
            }
            *last = now;
        }
        let (done, total) = (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed).max(1),
        );
        let pct = (done.min(total) * 100 / total) as usize;
        let rate = self.rate(done);
        if self.tty {
            let filled = pct * 30 / 100;
            draw(&format!(
                "uploading {} [{}{}] {pct:>3}% {:.0}/{:.0} MiB {rate:.1} MiB/s",
                self.image,
                "#".repeat(filled),
                " ".repeat(30 - filled),
                mib(done),
                mib(total)
            ));
        } else {
            info!(step = "image", image = %self.image, done_bytes = done, total_bytes = total, percent = pct, mib_per_s = format!("{rate:.1}"), "uploading");
        }
    }
}

impl UploadProgress for UploadBar {
    fn start(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.report(true);
    }

    fn advance(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
        self.report(false);
    }

    fn finish(&self) {
        self.report(true);
        if self.tty {
            end_line();
        }
    }
}

/// A wait with a deadline: a spinner on a terminal, a log line every few seconds otherwise.
#[derive(Debug)]
pub struct Spinner {
    step: &'static str,
    what: String,
    tty: bool,
    started: Instant,
    last: Instant,
    frame: usize,
}

impl Spinner {
    pub fn new(step: &'static str, what: impl Into<String>, tty: bool) -> Self {
        let now = Instant::now();
        Spinner {
            step,
            what: what.into(),
            tty,
            started: now,
            // Far enough back that the first tick reports.
            last: now.checked_sub(LOG_EVERY).unwrap_or(now),
            frame: 0,
        }
    }

    /// Called on every poll; `detail` says what the last attempt saw.
    pub fn tick(&mut self, detail: &str) {
        let now = Instant::now();
        let elapsed = self.started.elapsed().as_secs();
        if self.tty {
            if now.duration_since(self.last) >= REDRAW {
                self.last = now;
                self.frame = (self.frame + 1) % SPINNER.len();
                draw(&format!(
                    "{} {} ({elapsed}s) {detail}",
                    SPINNER[self.frame], self.what
                ));
            }
        } else if now.duration_since(self.last) >= LOG_EVERY {
            self.last = now;
            info!(
                step = self.step,
                elapsed_s = elapsed,
                detail,
                "{}",
                self.what
            );
        }
    }

    /// Ends the wait.
    pub fn done(self) {
        if self.tty {
            draw("");
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r");
            let _ = err.flush();
        }
    }
}
