//! A TCP stream, plain or TLS, shared by a reader task and a writer task on one core.

use super::ktls::{self, RecordBudget};
use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// The connection underneath: plain TCP, TLS encrypted by the kernel, or TLS encrypted in user
/// space by rustls.
#[derive(Debug)]
enum Inner {
    Plain(TcpStream),
    /// TLS whose records the kernel encrypts and decrypts (kTLS): plaintext on this side of the
    /// socket, with the records its keys may still send.
    Kernel(TcpStream, RecordBudget),
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

    /// A connection whose TLS keys the kernel holds (`wire::ktls::offload`).
    pub fn kernel_tls(stream: TcpStream, budget: RecordBudget) -> SharedStream {
        SharedStream(Rc::new(RefCell::new(Inner::Kernel(stream, budget))))
    }

    /// A client connection whose TLS handshake is done (the load generator's).
    pub fn tls_client(stream: futures_rustls::client::TlsStream<TcpStream>) -> SharedStream {
        SharedStream(Rc::new(RefCell::new(Inner::TlsClient(Box::new(stream)))))
    }

    /// Whether bytes written are encrypted in user space (rustls): then nothing may be written to
    /// the socket directly (`as_raw_fd` is for shutting it down only). Plain TCP and kernel TLS
    /// take writes of shared buffers on the descriptor, followed by [`SharedStream::sent`].
    pub fn encrypts_in_user_space(&self) -> bool {
        matches!(&*self.0.borrow(), Inner::Tls(_) | Inner::TlsClient(_))
    }

    /// Whether more may be written: an error once kernel TLS's keys may encrypt no more.
    pub fn may_send(&self) -> io::Result<()> {
        match &*self.0.borrow() {
            Inner::Kernel(_, budget) => budget.check(),
            _ => Ok(()),
        }
    }

    /// Counts `n` bytes written to the descriptor directly.
    pub fn sent(&self, n: usize) {
        if let Inner::Kernel(_, budget) = &mut *self.0.borrow_mut() {
            budget.spend(n);
        }
    }
}

impl AsRawFd for SharedStream {
    fn as_raw_fd(&self) -> RawFd {
        match &*self.0.borrow() {
            Inner::Plain(s) | Inner::Kernel(s, _) => s.as_raw_fd(),
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
            // The kernel fails a plain read at a TLS control record (the client's close_notify or
            // another alert, a key update): the connection ends there.
            Inner::Kernel(s, _) => match Pin::new(s).poll_read(cx, buf) {
                Poll::Ready(Err(e)) if e.raw_os_error() == Some(libc::EIO) => Poll::Ready(Ok(0)),
                other => other,
            },
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
            Inner::Kernel(s, budget) => {
                budget.check()?;
                let written = Pin::new(s).poll_write(cx, buf);
                if let Poll::Ready(Ok(n)) = written {
                    budget.spend(n);
                }
                written
            }
            Inner::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
            Inner::TlsClient(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(s) | Inner::Kernel(s, _) => Pin::new(s).poll_flush(cx),
            Inner::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
            Inner::TlsClient(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut *self.0.borrow_mut() {
            Inner::Plain(s) => Pin::new(s).poll_close(cx),
            Inner::Kernel(s, _) => {
                ktls::close_notify(s.as_raw_fd());
                Pin::new(s).poll_close(cx)
            }
            Inner::Tls(s) => Pin::new(&mut **s).poll_close(cx),
            Inner::TlsClient(s) => Pin::new(&mut **s).poll_close(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    use glommio::net::TcpListener;

    /// A kernel-TLS stream (here over plain TCP: the kernel's part cannot run on every machine)
    /// writes to its descriptor like plain TCP, counts its records and refuses to write once
    /// its keys' budget is spent, so the connection closes before the cipher's limit.
    #[test]
    fn a_kernel_tls_stream_stops_writing_when_its_keys_budget_is_spent() {
        let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .unwrap();
        ex.run(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = glommio::spawn_local(async move {
                let mut c = TcpStream::connect(addr).await.unwrap();
                let mut got = Vec::new();
                c.read_to_end(&mut got).await.unwrap();
                got
            });
            let server = listener.accept().await.unwrap();
            // Five records: a 16 KiB write counts two (one more for a record it may close
            // early), a byte counts two.
            let mut s = SharedStream::kernel_tls(server, RecordBudget::records(5));
            assert!(!s.encrypts_in_user_space());
            s.write_all(&[7u8; 16 << 10]).await.unwrap();
            assert!(s.may_send().is_ok());
            s.sent(1); // a vectored sendmsg of one byte, counted by its caller
            assert!(s.may_send().is_ok());
            s.write_all(&[7u8; 1]).await.unwrap();
            assert!(s.may_send().is_err());
            let refused = s.write_all(&[7u8; 1]).await.unwrap_err();
            assert!(refused.to_string().contains("record limit"), "{refused}");
            s.close().await.unwrap();
            // Only what the budget allowed reached the client, then the close_notify alert's two
            // bytes (sent as a TLS alert record where the kernel holds the keys; plain here).
            let got = client.await;
            assert_eq!(got.len(), (16 << 10) + 1 + 2);
            assert_eq!(&got[got.len() - 2..], &[1, 0]);
        });
    }
}
