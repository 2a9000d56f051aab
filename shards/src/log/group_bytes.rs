//! The bytes of one write of grouped appends: each append's batches as the producer sent them, with
//! the base offset the log gives each (and, in a LogAppendTime log, the append time).
//!
//! A Direct I/O write copies them into its DMA buffer ([`GroupBytes::fill`]). A page cache write
//! hands them to the kernel as they are ([`GroupBytes::write_at`]): one `pwritev` whose slices are,
//! for each batch, the 8 bytes of its new base offset and then the rest of the batch where it lies
//! in the request, so the only copy is the kernel's into the page cache. Stamping the append time
//! changes a batch's CRC, so a LogAppendTime group is first put together in one buffer.

use crate::batch::{self, BatchHeader};
use std::io::{self, IoSlice};
use std::os::fd::RawFd;

/// Slices handed to one `pwritev` at most (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// One write's appends, in order: each is its bytes and the headers of its batches, whose base
/// offsets are the final ones.
#[derive(Debug)]
pub(crate) struct GroupBytes<'a> {
    pub(crate) parts: Vec<(&'a [u8], &'a [BatchHeader])>,
    /// The append time to stamp every batch with (a LogAppendTime log), if any.
    pub(crate) stamp: Option<i64>,
}

impl GroupBytes<'_> {
    /// Bytes in all.
    pub(crate) fn len(&self) -> usize {
        self.parts.iter().map(|(b, _)| b.len()).sum()
    }

    /// Copies the batches into `data` (exactly [`Self::len`] bytes) with their offsets put in.
    pub(crate) fn fill(&self, data: &mut [u8]) {
        let mut at = 0;
        for (blob, headers) in &self.parts {
            data[at..at + blob.len()].copy_from_slice(blob);
            for h in *headers {
                batch::set_base_offset(&mut data[at..], h.base_offset);
                if let Some(now) = self.stamp {
                    batch::stamp_log_append_time(&mut data[at..], now);
                }
                at += h.total_len();
            }
        }
    }

    /// The bytes from `from` to the end, as written (for the partial block a Direct I/O writer
    /// rewrites next: a few KiB at most, so only those are copied).
    pub(crate) fn suffix(&self, from: usize) -> Vec<u8> {
        let len = self.len();
        let mut out = Vec::with_capacity(len.saturating_sub(from));
        if self.stamp.is_some() {
            // Stamping rewrites the CRC, which covers the whole batch.
            let mut all = vec![0; len];
            self.fill(&mut all);
            out.extend_from_slice(&all[from.min(len)..]);
            return out;
        }
        let mut at = 0;
        for (blob, headers) in &self.parts {
            let mut in_blob = 0;
            for h in *headers {
                let end = at + h.total_len();
                if end > from {
                    // The batch from its `skip`th byte, with the base offset in its first 8.
                    let skip = from.saturating_sub(at);
                    let here = out.len();
                    out.extend_from_slice(&blob[in_blob + skip..in_blob + h.total_len()]);
                    let offset = h.base_offset.to_be_bytes();
                    for b in skip..8 {
                        out[here + b - skip] = offset[b];
                    }
                }
                in_blob += h.total_len();
                at = end;
            }
        }
        out
    }

    /// Writes the group at `pos` of `fd` through the page cache (see the module's documentation).
    pub(crate) fn write_at(&self, fd: RawFd, pos: u64) -> io::Result<()> {
        if self.stamp.is_some() {
            let mut all = vec![0; self.len()];
            self.fill(&mut all);
            return pwritev_all(fd, &mut [IoSlice::new(&all)], pos);
        }
        let offsets: Vec<[u8; 8]> = self
            .parts
            .iter()
            .flat_map(|(_, headers)| headers.iter().map(|h| h.base_offset.to_be_bytes()))
            .collect();
        let mut slices = Vec::with_capacity(offsets.len() * 2);
        let mut offset = offsets.iter();
        for (blob, headers) in &self.parts {
            let mut at = 0;
            for h in *headers {
                let end = at + h.total_len();
                slices.push(IoSlice::new(offset.next().expect("one per batch")));
                slices.push(IoSlice::new(&blob[at + 8..end]));
                at = end;
            }
        }
        pwritev_all(fd, &mut slices, pos)
    }
}

/// `pwritev` until every slice is written (a short write goes on where it stopped).
fn pwritev_all(fd: RawFd, mut slices: &mut [IoSlice<'_>], mut pos: u64) -> io::Result<()> {
    while !slices.is_empty() {
        let count = slices.len().min(IOV_MAX);
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix, and the slices outlive the call.
        let n = unsafe {
            libc::pwritev(
                fd,
                slices.as_ptr() as *const libc::iovec,
                count as libc::c_int,
                pos as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the file took no bytes",
            ));
        }
        pos += n as u64;
        IoSlice::advance_slices(&mut slices, n as usize);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchBuilder;
    use std::os::fd::AsRawFd;

    fn batch(values: &[&[u8]]) -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        for v in values {
            b.push(1_000, None, Some(v), &[]);
        }
        b.finish(0)
    }

    #[test]
    fn a_page_cache_write_holds_what_a_fill_makes() {
        let one = batch(&[b"a", b"bb"]);
        let two = [batch(&[b"ccc"]), batch(&[b"dddd", b"e"])].concat();
        let mut h1 = vec![BatchHeader::parse(&one).unwrap()];
        let first_of_two = BatchHeader::parse(&two).unwrap();
        let second_of_two = BatchHeader::parse(&two[first_of_two.total_len()..]).unwrap();
        let mut h2 = vec![first_of_two, second_of_two];
        h1[0].base_offset = 40;
        h2[0].base_offset = 42;
        h2[1].base_offset = 43;
        for stamp in [None, Some(1_700_000_000_000)] {
            let group = GroupBytes {
                parts: vec![(&one, &h1), (&two, &h2)],
                stamp,
            };
            let mut filled = vec![0; group.len()];
            group.fill(&mut filled);
            let file = tempfile::tempfile().unwrap();
            std::os::unix::fs::FileExt::write_at(&file, b"head", 0).unwrap();
            group.write_at(file.as_raw_fd(), 4).unwrap();
            let mut written = vec![0; 4 + group.len()];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut written, 0).unwrap();
            assert_eq!(&written[..4], b"head");
            assert_eq!(written[4..], filled[..]);
            let offsets: Vec<i64> = [0, one.len(), one.len() + first_of_two.total_len()]
                .iter()
                .map(|&at| BatchHeader::parse(&filled[at..]).unwrap().base_offset)
                .collect();
            assert_eq!(offsets, [40, 42, 43]);
            for from in [
                0,
                3,
                8,
                one.len() - 1,
                one.len() + 5,
                filled.len() - 9,
                filled.len(),
            ] {
                assert_eq!(group.suffix(from), filled[from..], "from {from}");
            }
        }
    }
}
