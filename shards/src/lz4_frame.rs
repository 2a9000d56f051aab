//! A decoder of LZ4 frames (Kafka's lz4 codec) that allocates nothing per batch.
//!
//! `lz4_flex`'s `FrameDecoder` allocates and zero-fills two buffers of the frame's maximum block
//! size for every frame it decodes (192 KiB for linked 64 KiB blocks, past glibc's `mmap`
//! threshold), so decoding a 16 KiB batch would cost a map, page faults, a 192 KiB `memset` and an
//! unmap, more than the decompression itself. This decoder decodes one block at a time with
//! `lz4_flex`'s block functions into a buffer taken from a small per-thread pool, initialised once
//! and kept.
//!
//! The frame format (lz4's `lz4_Frame_format.md`): magic, a descriptor (flags, maximum block size,
//! optional content size, a header checksum), blocks (a length, the high bit for a stored block, the
//! data, an optional checksum), an end mark and an optional content checksum. Every checksum the
//! frame carries is checked; dictionaries, legacy and skippable frames are refused. Frames may
//! follow one another: their contents are concatenated.

use std::cell::RefCell;
use std::io::{self, Read};

const MAGIC: u32 = 0x184D_2204;
/// How far back a linked block's matches may reach into the previous blocks' output.
const WINDOW: usize = 64 << 10;
/// Block buffers kept per thread for reuse.
const POOL_BUFFERS: usize = 4;
/// Block buffers larger than this (frames with 4 MiB blocks) are freed, not kept.
const POOL_MAX_BYTES: usize = (1 << 20) + WINDOW;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

fn xxh32(data: &[u8]) -> u32 {
    twox_hash::XxHash32::oneshot(0, data)
}

/// The current frame's settings and progress.
struct Frame {
    max_block: usize,
    linked: bool,
    block_checksums: bool,
    content: Option<twox_hash::XxHash32>,
    content_size: Option<u64>,
    produced: u64,
}

/// Reads the decompressed content of the LZ4 frames in `input`.
pub(crate) struct Lz4FrameReader<'a> {
    input: &'a [u8],
    /// Decoded bytes: for a linked frame the previous output it may refer to (`..start` of the last
    /// block), then the last block's output, `start..end`, of which `..pos` has been read.
    buf: Vec<u8>,
    start: usize,
    pos: usize,
    end: usize,
    frame: Option<Frame>,
}

impl<'a> Lz4FrameReader<'a> {
    pub(crate) fn new(input: &'a [u8]) -> Self {
        let buf = POOL.with(|p| p.borrow_mut().pop()).unwrap_or_default();
        Self {
            input,
            buf,
            start: 0,
            pos: 0,
            end: 0,
            frame: None,
        }
    }

    /// Appends the whole decompressed content to `out`, failing once it would pass `limit` bytes.
    pub(crate) fn read_all(&mut self, out: &mut Vec<u8>, limit: usize) -> io::Result<()> {
        loop {
            if self.pos == self.end && !self.next_block()? {
                return Ok(());
            }
            let n = self.end - self.pos;
            if out.len() + n > limit {
                return Err(invalid("decompressed records exceed the limit"));
            }
            out.extend_from_slice(&self.buf[self.pos..self.end]);
            self.pos = self.end;
        }
    }

    fn take(&mut self, n: usize, what: &str) -> io::Result<&'a [u8]> {
        if self.input.len() < n {
            return Err(invalid(format!("lz4 frame truncated in its {what}")));
        }
        let (head, rest) = self.input.split_at(n);
        self.input = rest;
        Ok(head)
    }

    fn take_u32(&mut self, what: &str) -> io::Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    /// Parses a frame header.
    fn start_frame(&mut self) -> io::Result<()> {
        let magic = self.take_u32("magic number")?;
        if magic != MAGIC {
            return Err(invalid(format!(
                "not an lz4 frame (magic number {magic:#010x})"
            )));
        }
        let descriptor = self.input;
        let fb = self.take(2, "descriptor")?;
        let (flg, bd) = (fb[0], fb[1]);
        if flg >> 6 != 1 {
            return Err(invalid(format!("lz4 frame version {}", flg >> 6)));
        }
        if flg & 0b10 != 0 || bd & 0b1000_1111 != 0 {
            return Err(invalid("lz4 frame descriptor has reserved bits set"));
        }
        if flg & 1 != 0 {
            return Err(invalid("lz4 frames with a dictionary are not supported"));
        }
        let max_block = match (bd >> 4) & 0b111 {
            4 => 64 << 10,
            5 => 256 << 10,
            6 => 1 << 20,
            7 => 4 << 20,
            b => return Err(invalid(format!("lz4 block size code {b}"))),
        };
        let content_size = if flg & 0b1000 != 0 {
            let b = self.take(8, "content size")?;
            Some(u64::from_le_bytes(b.try_into().expect("8 bytes")))
        } else {
            None
        };
        let described = descriptor.len() - self.input.len();
        let hc = self.take(1, "header checksum")?[0];
        if (xxh32(&descriptor[..described]) >> 8) as u8 != hc {
            return Err(invalid("lz4 frame header checksum mismatch"));
        }
        self.frame = Some(Frame {
            max_block,
            linked: flg & 0b10_0000 == 0,
            block_checksums: flg & 0b1_0000 != 0,
            content: (flg & 0b100 != 0).then(|| twox_hash::XxHash32::with_seed(0)),
            content_size,
            produced: 0,
        });
        self.start = 0;
        self.pos = 0;
        self.end = 0;
        Ok(())
    }

    /// Ends the current frame at its end mark: checks its content checksum and size.
    fn end_frame(&mut self) -> io::Result<()> {
        let f = self.frame.take().expect("in a frame");
        if let Some(h) = f.content {
            let want = self.take_u32("content checksum")?;
            if h.finish_32() != want {
                return Err(invalid("lz4 content checksum mismatch"));
            }
        }
        if f.content_size.is_some_and(|s| s != f.produced) {
            return Err(invalid("lz4 frame content size mismatch"));
        }
        Ok(())
    }

    /// Decodes the next non-empty block into `buf[start..end]`; false at the end of the input.
    fn next_block(&mut self) -> io::Result<bool> {
        loop {
            if self.frame.is_none() {
                if self.input.is_empty() {
                    return Ok(false);
                }
                self.start_frame()?;
            }
            let word = self.take_u32("block size")?;
            if word == 0 {
                self.end_frame()?;
                continue;
            }
            let (stored, len) = (word & 0x8000_0000 != 0, (word & 0x7FFF_FFFF) as usize);
            let f = self.frame.as_ref().expect("in a frame");
            let (max_block, linked, checked) = (f.max_block, f.linked, f.block_checksums);
            if len > max_block {
                return Err(invalid(format!(
                    "lz4 block of {len} bytes, past the frame's {max_block}"
                )));
            }
            let data = self.take(len, "block")?;
            if checked && self.take_u32("block checksum")? != xxh32(data) {
                return Err(invalid("lz4 block checksum mismatch"));
            }
            // A linked block may refer to the last WINDOW bytes of output: keep them in front.
            let keep = if linked {
                let keep = self.end.min(WINDOW);
                self.buf.copy_within(self.end - keep..self.end, 0);
                keep
            } else {
                0
            };
            if self.buf.len() < keep + max_block {
                self.buf.resize(keep + max_block, 0);
            }
            let (dict, out) = self.buf.split_at_mut(keep);
            let out = &mut out[..max_block];
            let n = if stored {
                out[..len].copy_from_slice(data);
                len
            } else if keep > 0 {
                lz4_flex::block::decompress_into_with_dict(data, out, dict)
                    .map_err(|e| invalid(format!("lz4 block: {e}")))?
            } else {
                lz4_flex::block::decompress_into(data, out)
                    .map_err(|e| invalid(format!("lz4 block: {e}")))?
            };
            let f = self.frame.as_mut().expect("in a frame");
            if let Some(h) = f.content.as_mut() {
                std::hash::Hasher::write(h, &out[..n]);
            }
            f.produced += n as u64;
            (self.start, self.pos, self.end) = (keep, keep, keep + n);
            if n > 0 {
                return Ok(true);
            }
        }
    }
}

impl Read for Lz4FrameReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.pos == self.end && !self.next_block()? {
            return Ok(0);
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for Lz4FrameReader<'_> {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() == 0 || buf.capacity() > POOL_MAX_BYTES {
            return;
        }
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOL_BUFFERS {
                p.push(buf);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lz4_flex::frame::{BlockMode, BlockSize, FrameEncoder, FrameInfo};
    use std::io::Write;

    /// Compressible but not trivially: repeated words with a counter.
    fn content(n: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let mut i = 0u64;
        while v.len() < n {
            v.extend_from_slice(format!("record-{} value {} ", i % 977, i * 31).as_bytes());
            i += 1;
        }
        v.truncate(n);
        v
    }

    fn encode(data: &[u8], info: FrameInfo) -> Vec<u8> {
        let mut e = FrameEncoder::with_frame_info(info, Vec::new());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn decode(frame: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        Lz4FrameReader::new(frame).read_all(&mut out, usize::MAX)?;
        Ok(out)
    }

    fn infos() -> Vec<FrameInfo> {
        let mut all = Vec::new();
        for mode in [BlockMode::Independent, BlockMode::Linked] {
            for size in [BlockSize::Max64KB, BlockSize::Max256KB] {
                for (block_checksums, content_checksum) in [(false, false), (true, true)] {
                    let mut i = FrameInfo::new()
                        .block_mode(mode)
                        .block_size(size)
                        .block_checksums(block_checksums)
                        .content_checksum(content_checksum);
                    if content_checksum {
                        i = i.content_size(None);
                    }
                    all.push(i);
                }
            }
        }
        all
    }

    #[test]
    fn decodes_what_lz4_flex_encodes_in_every_mode() {
        for n in [0, 1, 100, 16 << 10, (64 << 10) + 7, 700 << 10] {
            let data = content(n);
            for info in infos() {
                let frame = encode(&data, info.clone());
                assert_eq!(decode(&frame).unwrap(), data, "{n} bytes, {info:?}");
                // Through Read with a small buffer, as the produce path's record walker reads.
                let mut r = Lz4FrameReader::new(&frame);
                let mut got = Vec::new();
                let mut chunk = [0u8; 33];
                loop {
                    let k = r.read(&mut chunk).unwrap();
                    if k == 0 {
                        break;
                    }
                    got.extend_from_slice(&chunk[..k]);
                }
                assert_eq!(got, data, "{n} bytes through Read, {info:?}");
            }
        }
    }

    #[test]
    fn stored_blocks_content_size_and_concatenated_frames() {
        // Random bytes do not compress: lz4_flex stores such blocks uncompressed.
        let noise: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let info = FrameInfo::new().content_size(Some(noise.len() as u64));
        let frame = encode(&noise, info);
        assert_eq!(decode(&frame).unwrap(), noise);
        let text = content(5_000);
        let mut two = frame.clone();
        two.extend_from_slice(&encode(&text, FrameInfo::new()));
        let mut want = noise.clone();
        want.extend_from_slice(&text);
        assert_eq!(decode(&two).unwrap(), want);
    }

    #[test]
    fn damage_and_limits_are_errors_not_panics() {
        let data = content(200 << 10);
        let info = FrameInfo::new()
            .block_checksums(true)
            .content_checksum(true)
            .block_mode(BlockMode::Linked);
        let frame = encode(&data, info);
        // Every truncation is an error (or, cut at the end mark's content checksum, still one).
        for cut in [0, 3, 5, 7, 12, frame.len() / 2, frame.len() - 1] {
            assert!(decode(&frame[..cut]).is_err() || cut == 0, "cut at {cut}");
        }
        // Every flipped byte is caught by a checksum or the block decoder.
        for at in (0..frame.len()).step_by(997) {
            let mut bad = frame.clone();
            bad[at] ^= 0x40;
            assert!(decode(&bad).is_err(), "flip at {at}");
        }
        // A block longer than the frame's maximum.
        let mut big = encode(b"x", FrameInfo::new());
        big[7..11].copy_from_slice(&(1u32 << 20).to_le_bytes());
        let e = decode(&big).unwrap_err().to_string();
        assert!(e.contains("past the frame's"), "{e}");
        // The limit.
        let mut out = Vec::new();
        let e = Lz4FrameReader::new(&frame)
            .read_all(&mut out, 1000)
            .unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        // Not a frame at all.
        assert!(decode(b"hello world").is_err());
    }

    /// The block decoder is `lz4_flex`'s fast one (`unsafe` inside, with its `checked-decode`
    /// bounds checks): damaged blocks must reach it and come back as errors or garbage, never as
    /// a panic or a write out of bounds (run this test under valgrind to see the latter). Frames
    /// without checksums, so nothing stops the damage before the decoder; linked blocks, so
    /// matches reach back into the previous block's output.
    #[test]
    fn damaged_blocks_reach_the_decoder_and_fail_cleanly() {
        let data = content(160 << 10);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut failed, mut decoded) = (0, 0);
        for mode in [BlockMode::Independent, BlockMode::Linked] {
            let frame = encode(&data, FrameInfo::new().block_mode(mode));
            for round in 0..800 {
                let mut bad = frame.clone();
                // Past the 7-byte header, so the damage lands in blocks and their lengths.
                let at = 7 + (next() as usize) % (bad.len() - 7);
                match round % 4 {
                    0 => bad[at] ^= 1 << (next() % 8),
                    1 => bad[at] = 0xff,
                    2 => bad[at..].iter_mut().take(8).for_each(|b| *b = 0),
                    _ => bad.truncate(at),
                }
                match decode(&bad) {
                    Err(_) => failed += 1,
                    // Garbage is possible without checksums; more output than the frame's blocks
                    // can hold is not.
                    Ok(out) => {
                        assert!(out.len() <= data.len() + (64 << 10), "round {round}");
                        decoded += 1;
                    }
                }
            }
        }
        assert!(
            failed > 400,
            "{failed} of {} damaged frames refused",
            failed + decoded
        );
    }

    #[test]
    fn block_buffers_are_reused() {
        let frame = encode(&content(30_000), FrameInfo::new());
        POOL.with(|p| p.borrow_mut().clear());
        decode(&frame).unwrap();
        let kept = POOL.with(|p| p.borrow().iter().map(|b| b.as_ptr()).collect::<Vec<_>>());
        assert_eq!(kept.len(), 1);
        let mut r = Lz4FrameReader::new(&frame);
        assert_eq!(r.buf.as_ptr(), kept[0], "the pooled buffer is taken again");
        let mut out = Vec::new();
        r.read_all(&mut out, usize::MAX).unwrap();
    }
}
