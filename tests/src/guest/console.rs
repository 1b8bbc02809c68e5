//! The serial console as the guest writes it: kernel-style timestamped lines and k3s's log
//! format. What the Oxide API serves from it is `oxide`'s business; this is only the writer.

use std::time::Instant;

use uuid::Uuid;

use super::Inner;

impl Inner {
    pub(super) fn console(&self, id: Uuid, text: &str) {
        if let Some(oxide) = self.oxide.get() {
            oxide.append_console(id, text.as_bytes());
        }
    }

    /// Console line with a kernel-style timestamp since boot.
    pub(super) fn log(&self, id: Uuid, started: Instant, line: &str) {
        let t = started.elapsed();
        self.console(
            id,
            &format!("[{:>5}.{:06}] {line}\n", t.as_secs(), t.subsec_micros()),
        );
    }

    pub(super) fn k3s_log(&self, id: Uuid, started: Instant, level: &str, msg: &str) {
        let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ");
        self.log(
            id,
            started,
            &format!("k3s[1402]: time=\"{now}\" level={level} msg=\"{msg}\""),
        );
    }
}
