//! A TCP stream, plain or TLS, shared by a reader task and a writer task on one core.

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// The connection underneath: plain TCP, or TLS over it (encrypted in user space by rustls).
#[derive(Debug)]
enum Inner {
    Plain(TcpStream),
    Tls(Box<futures_rustls::server::TlsStream<TcpStream>>),
    /// The load generator's side of a TLS connection.
    TlsClient(Box<futures_rustls::client::TlsStream<TcpStream>>),
}

/// One whole connection, cloned into the task that reads it and the task that writes it (the
/// broker's connections, the load generator's producers). Polls never overlap (one thread, and a
/// poll never awaits), so a `RefCell` borrow per poll is enough.
#[derive(Debug, Clone)]
pub struct SharedStream(Rc<RefCell<Inner>>);

impl SharedStream {
    pub fn new(stream: TcpStream) -> SharedStream {
        SharedStream(Rc::new(RefCell::new(Inner::Plain(stream))))
    }

    /// A connection whose TLS handshake is done.
    pub fn tls(stream: futures_rustls::server::TlsStream<TcpStream>) -> SharedStream {
        SharedStream(Rc::new(RefCell::new(Inner::Tls(Box::new(stream)))))
    }

    /// A client connection whose TLS handshake is done (the load generator's).
    pub fn tls_client(stream: futures_rustls::client::TlsStream<TcpStream>) -> SharedStream {
        SharedStream(Rc::new(RefCell::new(Inner::TlsClient(Box::new(stream)))))
    }

    /// Whether bytes written go through TLS: then nothing may be written to the socket directly
    /// (`as_raw_fd` is for shutting it down only).
    pub fn is_tls(&self) -> bool {
        !matches!(&*self.0.borrow(), Inner::Plain(_))
    }
}

impl AsRawFd for SharedStream {
    fn as_raw_fd(&self) -> RawFd {
        match &*self.0.borrow() {
            Inner::Plain(s) => s.as_raw_fd(),
            Inner::Tls(s) => s.get_ref().0.as_raw_fd(),
            Inner::TlsClient(s) => s.get_ref().0.as_raw_fd(),
        }
    }
}

impl AsyncRead for SharedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(s) => Pin::new(s).poll_read(cx, buf),
            // Most clients close without TLS's close_notify: that is an end of stream like any
            // other (Kafka's framing, not TLS, tells a whole request from a cut one).
            Inner::Tls(s) => match Pin::new(&mut **s).poll_read(cx, buf) {
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    Poll::Ready(Ok(0))
                }
                other => other,
            },
            Inner::TlsClient(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for SharedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Inner::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Inner::TlsClient(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(s) => Pin::new(s).poll_flush(cx),
            Inner::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
            Inner::TlsClient(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(s) => Pin::new(s).poll_close(cx),
            Inner::Tls(s) => Pin::new(&mut **s).poll_close(cx),
            Inner::TlsClient(s) => Pin::new(&mut **s).poll_close(cx),
        }
    }
}
