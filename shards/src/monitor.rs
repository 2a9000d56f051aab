//! The offset monitor: tasks wait for a watermark to reach an offset, ordered by that offset, and are
//! woken when it does. One mechanism for group commit (wait until durable), long polling (wait until the
//! high watermark passes a fetch offset) and tail readers.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Default)]
struct State {
    value: Cell<i64>,
    closed: Cell<bool>,
    next_id: Cell<u64>,
    /// Waiters by (target, id): waking is a split at the new value.
    waiters: RefCell<BTreeMap<(i64, u64), Waker>>,
}

/// A watermark that only moves forward, with waiters. Cheap to clone (`Rc`).
#[derive(Debug, Clone, Default)]
pub struct OffsetMonitor {
    state: Rc<State>,
}

impl OffsetMonitor {
    pub fn new(value: i64) -> Self {
        let m = Self::default();
        m.state.value.set(value);
        m
    }

    pub fn value(&self) -> i64 {
        self.state.value.get()
    }

    /// Moves the watermark to `value` (ignored if lower) and wakes every waiter it reaches.
    pub fn advance(&self, value: i64) {
        if value <= self.state.value.get() {
            return;
        }
        self.state.value.set(value);
        let woken = {
            let mut w = self.state.waiters.borrow_mut();
            let rest = w.split_off(&(value + 1, 0));
            std::mem::replace(&mut *w, rest)
        };
        woken.into_values().for_each(Waker::wake);
    }

    /// Wakes everyone; waits resolve to `false` from now on.
    pub fn close(&self) {
        self.state.closed.set(true);
        let woken = std::mem::take(&mut *self.state.waiters.borrow_mut());
        woken.into_values().for_each(Waker::wake);
    }

    pub fn is_closed(&self) -> bool {
        self.state.closed.get()
    }

    /// Number of tasks waiting (metrics, tests).
    pub fn waiters(&self) -> usize {
        self.state.waiters.borrow().len()
    }

    /// `work`'s output, or `None` if the watermark reaches `target` (or the monitor is closed)
    /// first: work that a stop (a shutdown monitor moving to 1) must cut short.
    pub async fn unless_reached<T>(&self, target: i64, work: impl Future<Output = T>) -> Option<T> {
        futures_lite::future::or(async { Some(work.await) }, async {
            self.wait_for(target).await;
            None
        })
        .await
    }

    /// Resolves to `true` once the watermark is at least `target`, or `false` if the monitor is closed
    /// first. Dropping the future removes the waiter.
    pub fn wait_for(&self, target: i64) -> WaitFor {
        WaitFor {
            state: self.state.clone(),
            target,
            id: None,
        }
    }
}

/// Future of [`OffsetMonitor::wait_for`].
#[derive(Debug)]
pub struct WaitFor {
    state: Rc<State>,
    target: i64,
    id: Option<u64>,
}

impl Future for WaitFor {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        if self.state.value.get() >= self.target {
            return Poll::Ready(true);
        }
        if self.state.closed.get() {
            return Poll::Ready(false);
        }
        let state = self.state.clone();
        let id = *self.id.get_or_insert_with(|| {
            let id = state.next_id.get();
            state.next_id.set(id + 1);
            id
        });
        self.state
            .waiters
            .borrow_mut()
            .insert((self.target, id), cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for WaitFor {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.state.waiters.borrow_mut().remove(&(self.target, id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future;

    #[test]
    fn waiters_wake_in_offset_order_and_only_when_reached() {
        let m = OffsetMonitor::new(0);
        let mut a = Box::pin(m.wait_for(5));
        let mut b = Box::pin(m.wait_for(10));
        assert_eq!(future::block_on(future::poll_once(&mut a)), None);
        assert_eq!(future::block_on(future::poll_once(&mut b)), None);
        assert_eq!(m.waiters(), 2);
        m.advance(7);
        assert_eq!(future::block_on(future::poll_once(&mut a)), Some(true));
        assert_eq!(future::block_on(future::poll_once(&mut b)), None);
        drop(b);
        assert_eq!(m.waiters(), 0);
        m.advance(3); // never backwards
        assert_eq!(m.value(), 7);
        let mut c = Box::pin(m.wait_for(100));
        assert_eq!(future::block_on(future::poll_once(&mut c)), None);
        m.close();
        assert_eq!(future::block_on(future::poll_once(&mut c)), Some(false));
    }
}
