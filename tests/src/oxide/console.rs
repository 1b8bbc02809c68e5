//! An instance's serial console history as propolis-server keeps and serves it
//! (`propolis bin/propolis-server/src/lib/serial/history_buffer.rs`): the first 1 MiB and the
//! most recent 1 MiB of output, absolute offsets counted from the start of the VMM, and reads
//! that go FORWARD from the requested offset for at most `max_bytes` (16 KiB when the request
//! does not say). Nexus forwards `max_bytes` only when the client gave it
//! (`omicron nexus/src/app/instance.rs`, `instance_serial_console_data`), so a client that
//! asks for `most_recent=256KiB` without `max_bytes` gets the 16 KiB that start 256 KiB back.
//!
//! A new VMM (every start) begins with an empty history; `lifecycle` replaces the buffer.

use std::collections::VecDeque;

/// Size of each of the two retained windows (propolis `TTY_BUFFER_SIZE`).
pub const HISTORY_WINDOW: usize = 1024 * 1024;
/// Bytes returned when the request has no `max_bytes` (propolis `DEFAULT_MAX_LENGTH`).
pub const DEFAULT_MAX_BYTES: usize = 16 * 1024;

/// Where a read starts.
#[derive(Clone, Copy, Debug)]
pub enum Offset {
    /// Absolute byte index since the VMM started.
    FromStart(u64),
    /// Bytes back from the most recent output.
    MostRecent(u64),
}

/// The requested start is in the part of the history propolis no longer keeps (between the
/// first and the last MiB).
#[derive(Debug, PartialEq, Eq)]
pub struct ExpiredRange {
    /// The requested absolute offset.
    pub from_start: u64,
    /// Bytes kept from the beginning.
    pub beginning: usize,
    /// Bytes kept from the end.
    pub rolling: usize,
    /// Bytes written since the VMM started.
    pub total: u64,
}

impl std::fmt::Display for ExpiredRange {
    /// propolis's message for `Error::ExpiredRange`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Requested byte offset {} (-{}) is no longer cached: Only have first {} + most recent {} saved out of a total {} of output",
            self.from_start,
            self.total.saturating_sub(self.from_start),
            self.beginning,
            self.rolling,
            self.total
        )
    }
}

/// The history of one VMM's serial console.
#[derive(Clone, Debug)]
pub struct Console {
    beginning: Vec<u8>,
    rolling: VecDeque<u8>,
    total: u64,
    window: usize,
}

impl Default for Console {
    fn default() -> Self {
        Self::with_window(HISTORY_WINDOW)
    }
}

impl Console {
    /// A history keeping `window` bytes at each end (tests use small windows).
    pub fn with_window(window: usize) -> Self {
        Console {
            beginning: Vec::new(),
            rolling: VecDeque::new(),
            total: 0,
            window,
        }
    }

    /// Feeds console output: the rolling window keeps the last `window` bytes, and what
    /// falls out of it fills the beginning window until that is full (propolis `consume`).
    pub fn append(&mut self, data: &[u8]) {
        self.rolling.extend(data.iter().copied());
        if self.rolling.len() > self.window {
            let to_drain = self.rolling.len() - self.window;
            let to_capture = self.window - self.beginning.len();
            let drained: Vec<u8> = self.rolling.drain(..to_drain).take(to_capture).collect();
            self.beginning.extend(drained);
        }
        self.total = self
            .total
            .saturating_add(u64::try_from(data.len()).unwrap_or(u64::MAX));
    }

    /// Up to `max_bytes` (default 16 KiB) from `offset` onwards, and the absolute offset just
    /// past the last byte returned (propolis `contents_vec`). An offset past the end reads
    /// from the end (nothing); `MostRecent` beyond the start reads from the start. A read that
    /// starts in the first MiB stops at its end, as propolis's does.
    pub fn read(
        &self,
        offset: Offset,
        max_bytes: Option<u64>,
    ) -> Result<(Vec<u8>, u64), ExpiredRange> {
        let total = self.total;
        let (from_start, from_end) = match offset {
            Offset::FromStart(o) if o < total => (o, total - o),
            Offset::FromStart(_) => (total, 0),
            Offset::MostRecent(o) if o < total => (total - o, o),
            Offset::MostRecent(_) => (0, total),
        };
        let take = max_bytes
            .map(|m| usize::try_from(m).unwrap_or(usize::MAX))
            .unwrap_or(DEFAULT_MAX_BYTES);
        let skip = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let kept = (self.beginning.len() + self.rolling.len()) as u64;
        let data: Vec<u8> = if total == kept {
            self.beginning
                .iter()
                .chain(self.rolling.iter())
                .skip(skip(from_start))
                .take(take)
                .copied()
                .collect()
        } else if from_start < self.beginning.len() as u64 {
            self.beginning
                .iter()
                .skip(skip(from_start))
                .take(take)
                .copied()
                .collect()
        } else if from_end <= self.rolling.len() as u64 {
            self.rolling
                .iter()
                .skip(self.rolling.len() - skip(from_end))
                .take(take)
                .copied()
                .collect()
        } else {
            return Err(ExpiredRange {
                from_start,
                beginning: self.beginning.len(),
                rolling: self.rolling.len(),
                total,
            });
        };
        let end = from_start + data.len() as u64;
        Ok((data, end))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn text(c: &Console, o: Offset, max: Option<u64>) -> (String, u64) {
        let (d, end) = c.read(o, max).unwrap();
        (String::from_utf8(d).unwrap(), end)
    }

    #[test]
    fn reads_go_forward_from_the_offset_and_default_to_16_kib() {
        let mut c = Console::default();
        assert_eq!(text(&c, Offset::FromStart(0), None), (String::new(), 0));
        c.append(&vec![b'a'; 40 * 1024]);
        c.append(b"tail");
        // most_recent larger than the history: from the start, 16 KiB of it.
        let (d, end) = c.read(Offset::MostRecent(256 * 1024), None).unwrap();
        assert_eq!(d.len(), DEFAULT_MAX_BYTES);
        assert!(d.iter().all(|b| *b == b'a'));
        assert_eq!(end, DEFAULT_MAX_BYTES as u64);
        // With max_bytes the tail is there.
        let (d, end) = c.read(Offset::MostRecent(10), Some(10)).unwrap();
        assert!(d.ends_with(b"tail"));
        assert_eq!(end, c.total);
        // Past the end: nothing, ending at the end.
        assert_eq!(
            text(&c, Offset::FromStart(1 << 30), Some(5)),
            (String::new(), c.total)
        );
    }

    #[test]
    fn the_first_and_the_last_window_are_kept_and_the_middle_expires() {
        let mut c = Console::with_window(16);
        c.append(b"0123456789abcdef"); // beginning
        c.append(b"GHIJKLMNOPQRSTUV"); // fills rolling
        c.append(b"wxyz"); // pushes GHIJ out of rolling; the beginning is full, so they are gone
        assert_eq!(c.total, 36);
        assert_eq!(
            text(&c, Offset::FromStart(0), Some(100)),
            ("0123456789abcdef".to_string(), 16)
        );
        assert_eq!(
            text(&c, Offset::MostRecent(16), Some(100)),
            ("KLMNOPQRSTUVwxyz".to_string(), 36)
        );
        let err = c.read(Offset::FromStart(17), None).unwrap_err();
        assert_eq!(err.from_start, 17);
        assert!(err.to_string().contains("no longer cached"), "{err}");
    }
}
