//! A TCP stream shared by a reader task and a writer task on one core.

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// One whole connection, cloned into the task that reads it and the task that writes it (the
/// broker's connections, the load generator's producers). Polls never overlap (one thread, and a
/// poll never awaits), so a `RefCell` borrow per poll is enough.
#[derive(Debug, Clone)]
pub struct SharedStream(Rc<RefCell<TcpStream>>);

impl SharedStream {
    pub fn new(stream: TcpStream) -> SharedStream {
        SharedStream(Rc::new(RefCell::new(stream)))
    }
}

impl AsRawFd for SharedStream {
    fn as_raw_fd(&self) -> RawFd {
        self.0.borrow().as_raw_fd()
    }
}

impl AsyncRead for SharedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for SharedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}
