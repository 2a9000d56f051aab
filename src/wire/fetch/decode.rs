//! The client side of FetchResponse, for a consumer that must not copy or decode records: a
//! [`FrameReader`] (a small reusable receive buffer that response frames stream through) and
//! [`read_fetch_response`], which walks a FetchResponse (v4 to v12) field by field and hands each
//! record batch's header to a [`BatchVisitor`].

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt};
use shards::batch::{BatchHeader, HEADER_LEN};
use std::io;

fn other(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// A reusable receive buffer. Response frames stream through it: the parser asks for a few bytes at a
/// time ([`fill`](Self::fill)) and skips record bytes it does not look at, so memory per connection
/// stays at the buffer's size however large the responses are.
#[derive(Debug)]
pub struct FrameReader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl FrameReader {
    pub fn new(capacity: usize) -> FrameReader {
        FrameReader {
            buf: vec![0u8; capacity.max(256)].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// The bytes received and not consumed yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Makes at least `n` (at most the capacity) bytes available in [`buffered`](Self::buffered).
    pub async fn fill<S: AsyncRead + Unpin>(&mut self, s: &mut S, n: usize) -> io::Result<()> {
        debug_assert!(n <= self.buf.len());
        while self.end - self.start < n {
            if self.buf.len() - self.start < n {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let got = s.read(&mut self.buf[self.end..]).await?;
            if got == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.end += got;
        }
        Ok(())
    }

    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.end - self.start);
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Consumes `n` bytes, receiving them first where needed.
    pub async fn skip<S: AsyncRead + Unpin>(&mut self, s: &mut S, mut n: usize) -> io::Result<()> {
        loop {
            let have = self.end - self.start;
            if have >= n {
                self.consume(n);
                return Ok(());
            }
            n -= have;
            self.start = 0;
            self.end = 0;
            let got = s.read(&mut self.buf[..]).await?;
            if got == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.end = got;
        }
    }

    /// Consumes `n` bytes into `out` (cleared first).
    pub async fn copy_to<S: AsyncRead + Unpin>(
        &mut self,
        s: &mut S,
        out: &mut Vec<u8>,
        mut n: usize,
    ) -> io::Result<()> {
        out.clear();
        loop {
            let have = (self.end - self.start).min(n);
            out.extend_from_slice(&self.buf[self.start..self.start + have]);
            self.consume(have);
            n -= have;
            if n == 0 {
                return Ok(());
            }
            let got = s.read(&mut self.buf[..]).await?;
            if got == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.start = 0;
            self.end = got;
        }
    }

    /// Reads one whole frame (without its size prefix) into its own buffer: for small responses.
    pub async fn read_frame<S: AsyncRead + Unpin>(
        &mut self,
        s: &mut S,
        limit: usize,
    ) -> io::Result<Bytes> {
        self.fill(s, 4).await?;
        let n = i32::from_be_bytes(self.buffered()[..4].try_into().expect("4 bytes"));
        if n < 4 || n as usize > limit {
            return Err(other(format!("response frame of {n} bytes")));
        }
        self.consume(4);
        let mut out = Vec::with_capacity(n as usize);
        self.copy_to(s, &mut out, n as usize).await?;
        Ok(Bytes::from(out))
    }
}

/// Reads a frame's fields in order, keeping count of what is left of the frame.
struct Cursor<'a, S> {
    r: &'a mut FrameReader,
    s: &'a mut S,
    left: usize,
    flexible: bool,
}

impl<S: AsyncRead + Unpin> Cursor<'_, S> {
    async fn take<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        if self.left < N {
            return Err(other("fetch response: field runs past the frame"));
        }
        self.r.fill(self.s, N).await?;
        let v: [u8; N] = self.r.buffered()[..N].try_into().expect("N bytes");
        self.r.consume(N);
        self.left -= N;
        Ok(v)
    }
    async fn i16(&mut self) -> io::Result<i16> {
        Ok(i16::from_be_bytes(self.take().await?))
    }
    async fn i32(&mut self) -> io::Result<i32> {
        Ok(i32::from_be_bytes(self.take().await?))
    }
    async fn i64(&mut self) -> io::Result<i64> {
        Ok(i64::from_be_bytes(self.take().await?))
    }
    async fn uvarint(&mut self) -> io::Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let [b] = self.take::<1>().await?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(other("fetch response: varint too long"))
    }
    async fn skip(&mut self, n: usize) -> io::Result<()> {
        if self.left < n {
            return Err(other("fetch response: field runs past the frame"));
        }
        self.r.skip(self.s, n).await?;
        self.left -= n;
        Ok(())
    }
    /// An array's length; `None` for a null array.
    async fn array_len(&mut self) -> io::Result<Option<usize>> {
        if self.flexible {
            Ok(self.uvarint().await?.checked_sub(1).map(|n| n as usize))
        } else {
            let n = self.i32().await?;
            Ok((n >= 0).then_some(n as usize))
        }
    }
    async fn skip_string(&mut self) -> io::Result<()> {
        let n = if self.flexible {
            self.uvarint().await?.saturating_sub(1) as usize
        } else {
            self.i16().await?.max(0) as usize
        };
        self.skip(n).await
    }
    /// Length of a nullable bytes field (records); `None` for null.
    async fn bytes_len(&mut self) -> io::Result<Option<usize>> {
        if self.flexible {
            Ok(self.uvarint().await?.checked_sub(1).map(|n| n as usize))
        } else {
            let n = self.i32().await?;
            Ok((n >= 0).then_some(n as usize))
        }
    }
    async fn skip_tags(&mut self) -> io::Result<()> {
        if !self.flexible {
            return Ok(());
        }
        let n = self.uvarint().await?;
        for _ in 0..n {
            let _tag = self.uvarint().await?;
            let size = self.uvarint().await? as usize;
            self.skip(size).await?;
        }
        Ok(())
    }
}

/// How many bytes of each batch a visitor sees without asking for the whole batch: the header and
/// the start of the first record (enough for the timestamp the producers embed in its value).
pub const BATCH_PEEK: usize = HEADER_LEN + 64;

/// What the consumer does with each record batch of a fetch response.
pub trait BatchVisitor {
    /// A complete batch: its header and its first bytes (up to [`BATCH_PEEK`]). Returns true to be
    /// handed the whole batch next, in [`whole_batch`](Self::whole_batch).
    fn batch(&mut self, header: &BatchHeader, head: &[u8]) -> bool;
    /// The whole batch, when [`batch`](Self::batch) asked for it.
    fn whole_batch(&mut self, header: &BatchHeader, batch: &[u8]);
}

/// The per-response facts the consumer needs besides the batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchOutcome {
    /// The first non-zero error code (top level or partition), or 0.
    pub error_code: i16,
    /// The high watermark of the last partition in the response (-1 if none).
    pub high_watermark: i64,
    /// The last partition's preferred read replica (KIP-392, v11+): the broker the client should
    /// fetch that partition from instead; -1 for none (and before v11).
    pub preferred_read_replica: i32,
}

/// Reads one FetchResponse (v4 to v12) from `s`, handing every complete batch to `visitor`. The
/// records are never copied out of the receive buffer unless the visitor asks for a whole batch.
pub async fn read_fetch_response<S: AsyncRead + Unpin, V: BatchVisitor>(
    r: &mut FrameReader,
    s: &mut S,
    version: i16,
    correlation: i32,
    visitor: &mut V,
    scratch: &mut Vec<u8>,
) -> io::Result<FetchOutcome> {
    r.fill(s, 4).await?;
    let size = i32::from_be_bytes(r.buffered()[..4].try_into().expect("4 bytes"));
    if size < 4 {
        return Err(other(format!("fetch response frame of {size} bytes")));
    }
    r.consume(4);
    let mut c = Cursor {
        r,
        s,
        left: size as usize,
        flexible: version >= 12,
    };
    let corr = c.i32().await?;
    if corr != correlation {
        return Err(other(format!(
            "fetch: correlation id {corr} answered where {correlation} was expected"
        )));
    }
    c.skip_tags().await?; // response header v1
    let mut out = FetchOutcome {
        high_watermark: -1,
        preferred_read_replica: -1,
        ..FetchOutcome::default()
    };
    let _throttle = c.i32().await?;
    if version >= 7 {
        let e = c.i16().await?;
        if out.error_code == 0 {
            out.error_code = e;
        }
        let _session = c.i32().await?;
    }
    for _ in 0..c.array_len().await?.unwrap_or(0) {
        c.skip_string().await?; // topic
        for _ in 0..c.array_len().await?.unwrap_or(0) {
            let _partition = c.i32().await?;
            let e = c.i16().await?;
            if out.error_code == 0 {
                out.error_code = e;
            }
            out.high_watermark = c.i64().await?;
            let _last_stable = c.i64().await?;
            if version >= 5 {
                let _log_start = c.i64().await?;
            }
            for _ in 0..c.array_len().await?.unwrap_or(0) {
                c.skip(16).await?; // producer id, first offset
                c.skip_tags().await?;
            }
            out.preferred_read_replica = if version >= 11 { c.i32().await? } else { -1 };
            if let Some(len) = c.bytes_len().await? {
                walk_batches(&mut c, len, visitor, scratch).await?;
            }
            c.skip_tags().await?;
        }
        c.skip_tags().await?;
    }
    c.skip_tags().await?;
    let left = c.left;
    c.skip(left).await?; // fields of later versions, if any
    Ok(out)
}

/// Walks `len` bytes of record batches; a partial batch at the end is skipped, not visited.
async fn walk_batches<S: AsyncRead + Unpin, V: BatchVisitor>(
    c: &mut Cursor<'_, S>,
    len: usize,
    visitor: &mut V,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    if len > c.left {
        return Err(other("fetch response: records run past the frame"));
    }
    let mut left = len;
    while left > 0 {
        if left < HEADER_LEN {
            return c.skip(left).await;
        }
        c.r.fill(c.s, left.min(BATCH_PEEK)).await?;
        let head = c.r.buffered();
        let total = shards::batch::peek_total_len(head).unwrap_or(0);
        if total > left || total < HEADER_LEN {
            // Cut by the broker's size limits (KIP-74 lets it), or not a batch we understand.
            return c.skip(left).await;
        }
        let header = BatchHeader::parse(head).map_err(|e| other(e.to_string()))?;
        let want_whole = visitor.batch(&header, &head[..total.min(BATCH_PEEK)]);
        if want_whole {
            c.r.copy_to(c.s, scratch, total).await?;
            c.left -= total;
            visitor.whole_batch(&header, scratch);
        } else {
            c.skip(total).await?;
        }
        left -= total;
    }
    Ok(())
}
