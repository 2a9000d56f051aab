//! A one-shot value from one task to another on the same core: an appended batch's result from the
//! log's writer task to the appender, a group state machine's answer to the handler waiting for it.
//! Single-threaded (`Rc<RefCell<..>>`), and it works without an executor, so a state machine that
//! sends can be unit-tested synchronously. (The coalescer's in-flight read is the other kind: one
//! value cloned to many waiters.)

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Debug)]
struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The sender is gone: no value will come.
    closed: bool,
}

/// The state machine's end.
#[derive(Debug)]
pub struct Sender<T>(Rc<RefCell<Slot<T>>>);

/// The handler's end: a future of the answer, `None` if the sender was dropped without one.
#[derive(Debug)]
pub struct Receiver<T>(Rc<RefCell<Slot<T>>>);

pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Rc::new(RefCell::new(Slot {
        value: None,
        waker: None,
        closed: false,
    }));
    (Sender(slot.clone()), Receiver(slot))
}

impl<T> Sender<T> {
    pub fn send(self, value: T) {
        let waker = {
            let mut s = self.0.borrow_mut();
            s.value = Some(value);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.0.borrow_mut();
            s.closed = true;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The answer if it has arrived (tests, and handlers that answer at once).
    pub fn try_take(&self) -> Option<T> {
        self.0.borrow_mut().value.take()
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.0.borrow_mut();
        if let Some(v) = s.value.take() {
            return Poll::Ready(Some(v));
        }
        if s.closed {
            return Poll::Ready(None);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_values_arrive_and_dropped_senders_close() {
        let (tx, rx) = channel();
        assert_eq!(rx.try_take(), None);
        tx.send(7);
        assert_eq!(futures_lite::future::block_on(rx), Some(7));
        let (tx, rx) = channel::<i32>();
        drop(tx);
        assert_eq!(futures_lite::future::block_on(rx), None);
    }
}
