//! An append-only memory chunk whose written prefix is handed out as `Bytes` while the writer keeps
//! appending behind it. This is what lets a tail-cache read of many batches be one slice (one
//! reference count) instead of one per batch, and lets every consumer share the producer's copy.

use bytes::Bytes;
use std::ptr::NonNull;
use std::sync::Arc;

/// The allocation. It is never resized or moved, so slices into it stay valid while it lives.
struct Buf {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: a `Buf` is only written through the one `ChunkWriter` that owns the region past `len`, and only
// read through `ChunkView`s of regions below the `len` at the time each view was made. Written regions
// are never written again, so a view's bytes are immutable for its whole life wherever it is sent.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `cap` came from a `Vec<u8>` that was forgotten in `ChunkWriter::new`.
        unsafe { drop(Vec::from_raw_parts(self.ptr.as_ptr(), 0, self.cap)) };
    }
}

/// The single writer of a chunk.
pub(crate) struct ChunkWriter {
    buf: Arc<Buf>,
    len: usize,
}

impl std::fmt::Debug for ChunkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkWriter")
            .field("len", &self.len)
            .field("cap", &self.buf.cap)
            .finish()
    }
}

impl ChunkWriter {
    pub(crate) fn new(cap: usize) -> Self {
        let mut v = std::mem::ManuallyDrop::new(Vec::<u8>::with_capacity(cap.max(1)));
        let cap = v.capacity();
        let ptr = NonNull::new(v.as_mut_ptr()).expect("Vec pointer is never null");
        Self {
            buf: Arc::new(Buf { ptr, cap }),
            len: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.buf.cap
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.cap - self.len
    }

    /// Appends `data` and returns where it starts. Panics if it does not fit (callers check `remaining`).
    pub(crate) fn push(&mut self, data: &[u8]) -> usize {
        assert!(data.len() <= self.remaining(), "chunk overflow");
        let at = self.len;
        // SAFETY: `at + data.len() <= cap`, the region is past every view (views end at or before `len`),
        // and `data` cannot alias it because the region was never handed out.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.buf.ptr.as_ptr().add(at), data.len());
        }
        self.len += data.len();
        at
    }

    /// Appends `data`, then lets `fix` rewrite the fresh copy (offsets, timestamps) before anyone can see it.
    pub(crate) fn push_with(&mut self, data: &[u8], fix: impl FnOnce(&mut [u8])) -> usize {
        let at = self.push(data);
        // SAFETY: `at..at + len` was just written and no view of it exists yet (views are only made by
        // `view`, which takes `&self`, and this method holds `&mut self`).
        let fresh =
            unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.as_ptr().add(at), data.len()) };
        fix(fresh);
        at
    }

    /// The same allocation as an empty writer, when no view of it is left: nobody can then read
    /// the bytes the next appends overwrite. `None` while any view (any `Bytes` made from one) lives.
    pub(crate) fn recycle(self) -> Option<ChunkWriter> {
        let mut buf = self.buf;
        Arc::get_mut(&mut buf)?;
        Some(ChunkWriter { buf, len: 0 })
    }

    /// Shares `start..end` of the written prefix.
    pub(crate) fn view(&self, start: usize, end: usize) -> Bytes {
        assert!(
            start <= end && end <= self.len,
            "view past the written prefix"
        );
        if start == end {
            return Bytes::new();
        }
        Bytes::from_owner(ChunkView {
            buf: self.buf.clone(),
            start,
            end,
        })
    }
}

struct ChunkView {
    buf: Arc<Buf>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for ChunkView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start..end` was written before the view was made and is never written again.
        unsafe {
            std::slice::from_raw_parts(self.buf.ptr.as_ptr().add(self.start), self.end - self.start)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_survive_later_appends_and_the_writer() {
        let mut w = ChunkWriter::new(64);
        w.push(b"hello ");
        let a = w.view(0, 6);
        w.push(b"world");
        let b = w.view(0, 11);
        drop(w);
        assert_eq!(&a[..], b"hello ");
        assert_eq!(&b[..], b"hello world");
        assert_eq!(&b.slice(6..)[..], b"world");
    }

    #[test]
    fn only_a_chunk_nobody_views_is_recycled() {
        let mut w = ChunkWriter::new(64);
        w.push(b"hello");
        let held = w.view(0, 5);
        assert!(w.recycle().is_none(), "a view is alive");

        let mut w = ChunkWriter::new(64);
        w.push(b"hello");
        let at = w.view(0, 5).as_ptr();
        let mut again = w.recycle().expect("no view is left");
        assert_eq!((again.len(), again.capacity()), (0, 64));
        again.push(b"world");
        assert_eq!(again.view(0, 5).as_ptr(), at, "the same memory");
        assert_eq!(&again.view(0, 5)[..], b"world");
        assert_eq!(&held[..], b"hello");
    }

    #[test]
    #[should_panic(expected = "chunk overflow")]
    fn overflow_is_refused() {
        let mut w = ChunkWriter::new(4);
        w.push(&[0; 5]);
    }
}
