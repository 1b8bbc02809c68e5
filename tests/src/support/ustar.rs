//! POSIX ustar archives, as far as the simulator needs them: writing one (what a backup disk's
//! bytes are, see `tests/FIDELITY.md` "k3s restore from a snapshot") and reading one the way
//! GNU `tar -xf` reads a block device: 512-byte headers, each with its checksum, a regular
//! file's contents after its header padded to whole blocks, the archive ending at a zero block.
//! No crate: the format is a page of POSIX (pax, "ustar Interchange Format").

/// tar's block size.
pub const BLOCK: usize = 512;

/// What `tar -xf` prints before it exits 2 when the first header is not one.
pub const NOT_A_TAR: &str = "tar: This does not look like a tar archive\ntar: Exiting with failure status due to previous errors\n";

/// A ustar archive of regular files `(name, contents)` (mode 0600, owner root, mtime 0), in
/// order, ended by two zero blocks. Names must fit ustar's 100-byte name field.
pub fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in files {
        out.extend_from_slice(&header(name, data.len() as u64));
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(BLOCK), 0);
    }
    out.resize(out.len() + 2 * BLOCK, 0);
    out
}

fn octal(field: &mut [u8], value: u64) {
    // Zero-padded octal digits, then NUL (the field's last byte).
    let last = field.len() - 1;
    let digits = format!("{value:0last$o}");
    field[..last].copy_from_slice(digits.as_bytes());
    field[last] = 0;
}

fn header(name: &str, size: u64) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let n = name.as_bytes();
    h[..n.len().min(100)].copy_from_slice(&n[..n.len().min(100)]);
    octal(&mut h[100..108], 0o600);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // The checksum is taken with its own field as spaces: six octal digits, NUL, space.
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    let digits = format!("{sum:06o}");
    h[148..154].copy_from_slice(digits.as_bytes());
    h[154] = 0;
    h[155] = b' ';
    h
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let text: String = field
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(text, 8).ok()
}

/// Whether a header block's checksum is right (the unsigned sum of its bytes with the checksum
/// field counted as spaces, as tar checks it).
fn checksum_ok(h: &[u8]) -> bool {
    let Some(want) = parse_octal(&h[148..156]) else {
        return false;
    };
    let sum: u64 = h
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(*b)
            }
        })
        .sum();
    sum == want
}

/// The regular files of the archive `read(offset, len)` returns the bytes of (a disk read from
/// its start; `None` past its end), in order, with their contents, as `tar -xf` extracts them.
/// Ends at the first zero block (or at the end of the bytes). Err is what tar prints: a first
/// header that is not one is "not a tar archive"; a later bad header or a file cut short is
/// tar's error for that.
pub fn read_files(
    mut read: impl FnMut(u64, usize) -> Option<Vec<u8>>,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    loop {
        let Some(h) = read(offset, BLOCK) else {
            return Ok(out);
        };
        if h.iter().all(|b| *b == 0) {
            return Ok(out);
        }
        if !checksum_ok(&h) {
            return Err(if offset == 0 {
                NOT_A_TAR.to_owned()
            } else {
                "tar: Skipping to next header\ntar: Exiting with failure status due to previous errors\n".to_owned()
            });
        }
        let name: String = String::from_utf8_lossy(&h[..100])
            .trim_end_matches('\0')
            .to_owned();
        let prefix = String::from_utf8_lossy(&h[345..500])
            .trim_end_matches('\0')
            .to_owned();
        let name = if prefix.is_empty() || &h[257..262] != b"ustar" {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let size = parse_octal(&h[124..136]).unwrap_or(0);
        let data_at = offset + BLOCK as u64;
        let kind = h[156];
        // Regular files ('0' or NUL) carry contents; others (directories, links) carry none
        // here that the restore reads.
        let len = usize::try_from(size).map_err(|_| format!("tar: {name}: too large"))?;
        if kind == b'0' || kind == 0 {
            let data = read(data_at, len).ok_or_else(|| {
                "tar: Unexpected EOF in archive\ntar: Error is not recoverable: exiting now\n"
                    .to_owned()
            })?;
            out.push((name, data));
        }
        offset = data_at + (len.next_multiple_of(BLOCK)) as u64;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn from(bytes: &[u8]) -> impl FnMut(u64, usize) -> Option<Vec<u8>> + '_ {
        |off, len| {
            let off = usize::try_from(off).ok()?;
            bytes.get(off..off.checked_add(len)?).map(<[u8]>::to_vec)
        }
    }

    #[test]
    fn an_archive_reads_back_and_a_disk_of_zeros_after_it_ends_it() {
        let big = vec![7u8; 1300];
        let mut disk = archive(&[("manifest.json", b"{}"), ("etcd-snapshot", &big)]);
        assert_eq!(disk.len() % BLOCK, 0);
        disk.resize(disk.len() + 64 * BLOCK, 0);
        let files = read_files(from(&disk)).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0], ("manifest.json".to_owned(), b"{}".to_vec()));
        assert_eq!(files[1].1, big);
    }

    #[test]
    fn a_bad_header_is_tars_error_and_zeros_are_an_empty_archive() {
        let mut disk = archive(&[("a", b"x")]);
        disk[0] ^= 1;
        assert_eq!(read_files(from(&disk)).unwrap_err(), NOT_A_TAR);
        assert!(read_files(from(&[0u8; 4096])).unwrap().is_empty());
        let cut = archive(&[("a", &[1u8; 2000])]);
        assert!(
            read_files(from(&cut[..1024]))
                .unwrap_err()
                .contains("Unexpected EOF")
        );
    }
}
