//! Read-ahead for a segment read with Direct I/O.
//!
//! Direct I/O bypasses the page cache, and with it the kernel's read-ahead: a catch-up consumer
//! reading a segment from start to end would wait for the device on every fetch. So a big read
//! (a catch-up fetch, not a header walk) starts reading the next window in the background, and a
//! read that falls in a window being read waits for that one I/O instead of issuing its own. Each
//! read of a sequential stream tops the windows up to [`AHEAD`] bytes past it, so several reads are
//! in flight. At most [`WINDOWS`] windows per segment are kept.

use crate::error::Result;
use crate::monitor::OffsetMonitor;
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;

/// Bytes read ahead in one window.
pub(crate) const WINDOW_BYTES: usize = 2 << 20;
/// How far ahead of a sequential reader the windows reach.
const AHEAD: u64 = 8 << 20;
/// Reads at least this big are taken as a sequential stream and start read-ahead.
pub(crate) const STREAM_READ: usize = 256 << 10;
/// Windows kept per segment: the one being consumed and those ahead of it.
const WINDOWS: usize = (AHEAD as usize).div_ceil(WINDOW_BYTES) + 2;

struct Window {
    start: u64,
    len: usize,
    data: RefCell<Option<Result<Bytes>>>,
    /// Reaches 1 when `data` is set.
    done: OffsetMonitor,
}

#[derive(Default)]
pub(crate) struct ReadAhead {
    windows: RefCell<VecDeque<Rc<Window>>>,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.windows.borrow();
        f.debug_list()
            .entries(w.iter().map(|w| (w.start, w.len)))
            .finish()
    }
}

impl ReadAhead {
    /// The bytes at `at..` that a window holds (waiting for its read if needed), at most up to
    /// `end`; `None` when no window holds `at`. A failed window is dropped and its error returned.
    pub(crate) async fn get(&self, at: u64, end: u64) -> Option<Result<Bytes>> {
        let window = self
            .windows
            .borrow()
            .iter()
            .find(|w| at >= w.start && at < w.start + w.len as u64)
            .cloned()?;
        window.done.wait_for(1).await;
        let got = match &*window.data.borrow() {
            Some(Ok(b)) => {
                let from = (at - window.start) as usize;
                let to = (end.min(window.start + window.len as u64) - window.start) as usize;
                Ok(b.slice(from..to))
            }
            Some(Err(e)) => Err(e.clone()),
            None => return None,
        };
        if got.is_err() {
            self.windows
                .borrow_mut()
                .retain(|w| !Rc::ptr_eq(w, &window));
        }
        Some(got)
    }

    /// Where new windows should start after a read of `pos..end` (`from_windows`: some of it came
    /// from a window), so that the windows reach [`AHEAD`] bytes past `end` (several reads in
    /// flight: the device is faster at a queue depth above one). Only for a sequential reader: one
    /// served from the windows, or a big read.
    pub(crate) fn next_starts(&self, pos: u64, end: u64, from_windows: bool) -> Vec<u64> {
        if !from_windows && end - pos < STREAM_READ as u64 {
            return Vec::new();
        }
        // Where the windows' contiguous coverage from `pos` ends.
        let windows = self.windows.borrow();
        let mut at = pos;
        while let Some(w) = windows
            .iter()
            .find(|w| w.start <= at && at < w.start + w.len as u64)
        {
            at = w.start + w.len as u64;
        }
        let mut at = at.max(end);
        let mut starts = Vec::new();
        while at < end + AHEAD {
            starts.push(at);
            at += WINDOW_BYTES as u64;
        }
        starts
    }

    /// Keeps `data`, just read at `start`, as a finished window.
    pub(crate) fn keep(&self, start: u64, data: Bytes) {
        let window = Rc::new(Window {
            start,
            len: data.len(),
            data: RefCell::new(Some(Ok(data))),
            done: OffsetMonitor::new(1),
        });
        self.push(window);
    }

    fn push(&self, window: Rc<Window>) {
        let mut windows = self.windows.borrow_mut();
        if windows.len() == WINDOWS {
            windows.pop_front();
        }
        windows.push_back(window);
    }

    /// Starts reading `start..start + len` with `read` in the background, unless a window already
    /// starts there. The oldest window is dropped beyond [`WINDOWS`].
    pub(crate) fn start(
        &self,
        start: u64,
        len: usize,
        read: impl Future<Output = Result<Bytes>> + 'static,
    ) {
        if len == 0 || self.windows.borrow().iter().any(|w| w.start == start) {
            return;
        }
        let window = Rc::new(Window {
            start,
            len,
            data: RefCell::new(None),
            done: OffsetMonitor::new(0),
        });
        self.push(window.clone());
        glommio::spawn_local(async move {
            let data = read.await;
            *window.data.borrow_mut() = Some(data);
            window.done.advance(1);
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn kept(windows: &[(u64, usize)]) -> ReadAhead {
        let ra = ReadAhead::default();
        for &(start, len) in windows {
            ra.keep(start, Bytes::from(vec![(start / MIB) as u8; len]));
        }
        ra
    }

    #[test]
    fn only_a_sequential_reader_gets_windows_ahead() {
        // A header read that missed: no read-ahead.
        assert!(kept(&[]).next_starts(0, 64 << 10, false).is_empty());
        // A catch-up read of 1 MiB that missed (kept as a window): windows from its end to 8 MiB
        // past it, in 2 MiB steps.
        let ra = kept(&[(0, MIB as usize)]);
        assert_eq!(
            ra.next_starts(0, MIB, false),
            [MIB, 3 * MIB, 5 * MIB, 7 * MIB]
        );
    }

    #[test]
    fn windows_are_topped_up_from_the_end_of_their_coverage_not_restarted() {
        // The next fetch starts inside the last read, at the first batch it could not take whole,
        // and its end falls inside the window after: new windows continue where coverage ends.
        let ra = kept(&[(0, MIB as usize), (MIB, 2 * MIB as usize)]);
        let (pos, end) = (MIB - 16_195, 2 * MIB - 16_195);
        assert_eq!(
            ra.next_starts(pos, end, true),
            [3 * MIB, 5 * MIB, 7 * MIB, 9 * MIB]
        );
    }

    #[test]
    fn a_read_across_two_windows_is_served_from_both() {
        let ra = kept(&[(0, MIB as usize), (MIB, MIB as usize)]);
        let first = futures_lite::future::block_on(ra.get(MIB - 10, MIB + 10))
            .unwrap()
            .unwrap();
        assert_eq!(
            (first.len(), first[0]),
            (10, 0),
            "up to the first window's end"
        );
        let second = futures_lite::future::block_on(ra.get(MIB, MIB + 10))
            .unwrap()
            .unwrap();
        assert_eq!((second.len(), second[0]), (10, 1));
        assert!(futures_lite::future::block_on(ra.get(2 * MIB, 2 * MIB + 1)).is_none());
    }
}
