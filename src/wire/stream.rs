//! A TCP stream, plain or TLS, shared by a reader task and a writer task on one core.

use super::ktls::{self, RecordBudget};
use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
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
    /// take writes of shared buffers on the descriptor ([`SharedStream::send_now`]).
    pub fn encrypts_in_user_space(&self) -> bool {
        matches!(&*self.0.borrow(), Inner::Tls(_) | Inner::TlsClient(_))
    }

    /// One non-blocking `sendmsg` of `chunks` (up to `IOV_MAX` of them) on the descriptor, for a
    /// plain or kernel-TLS stream: the bytes the socket took, 0 if it would block. Kernel TLS counts
    /// them against its keys' budget (and refuses once it is spent).
    pub fn send_now(&self, chunks: &[Bytes]) -> io::Result<usize> {
        debug_assert!(!self.encrypts_in_user_space());
        self.may_send()?;
        match send_vectored(self.as_raw_fd(), chunks) {
            Ok(n) => {
                if let Inner::Kernel(_, budget) = &mut *self.0.borrow_mut() {
                    budget.spend(n);
                }
                Ok(n)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether more may be written: an error once kernel TLS's keys may encrypt no more.
    /// Writes chunks (a response, frames) with as few system calls as it can: first one non-blocking
    /// `sendmsg` over all of them (a fetch response is a header, shared record parts and a trailer:
    /// written one by one, each would be a system call of its own), then glommio's writes, which wait
    /// for the socket, for whatever it did not take at once.
    pub async fn write_chunks(&mut self, chunks: &[Bytes]) -> io::Result<()> {
        let out = self;
        if out.encrypts_in_user_space() {
            // Encrypted in user space: each chunk is copied into TLS records.
            for c in chunks {
                out.write_all(c).await?;
            }
            return out.flush().await;
        }
        let mut sent = if chunks.len() > 1 {
            out.send_now(chunks)?
        } else {
            0
        };
        for c in chunks {
            if sent >= c.len() {
                sent -= c.len();
                continue;
            }
            out.write_all(&c[sent..]).await?;
            sent = 0;
        }
        Ok(())
    }

    /// Writes chunks as [`SharedStream::write_chunks`] does; returns whether the socket was full
    /// (a first non-blocking send did not take everything: the peer reads slower than this
    /// writes). Always `false` where encryption is in user space.
    pub async fn write_chunks_full(&mut self, chunks: &[Bytes]) -> io::Result<bool> {
        if self.encrypts_in_user_space() {
            self.write_chunks(chunks).await?;
            return Ok(false);
        }
        let total: usize = chunks.iter().map(Bytes::len).sum();
        let mut sent = self.send_now(chunks)?;
        let full = sent < total;
        for c in chunks {
            if sent >= c.len() {
                sent -= c.len();
                continue;
            }
            self.write_all(&c[sent..]).await?;
            sent = 0;
        }
        Ok(full)
    }

    fn may_send(&self) -> io::Result<()> {
        match &*self.0.borrow() {
            Inner::Kernel(_, budget) => budget.check(),
            _ => Ok(()),
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

/// One non-blocking `sendmsg` of up to `IOV_MAX` chunks; the bytes the socket took.
fn send_vectored(fd: RawFd, chunks: &[Bytes]) -> io::Result<usize> {
    const IOV_MAX: usize = 1024;
    // A response is a handful of chunks: their iovecs fit on the stack.
    const ON_STACK: usize = 16;
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let n = chunks.len().min(IOV_MAX);
    let mut stack = [empty; ON_STACK];
    let mut heap = Vec::new();
    let iov: &mut [libc::iovec] = if n <= ON_STACK {
        &mut stack[..n]
    } else {
        heap.resize(n, empty);
        &mut heap
    };
    for (v, c) in iov.iter_mut().zip(chunks) {
        v.iov_base = c.as_ptr() as *mut libc::c_void;
        v.iov_len = c.len();
    }
    // SAFETY: an all-zero msghdr is valid (no address, no control data); its iovecs point into
    // `chunks`, which outlive the call, and the kernel only reads them.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
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
            // A vectored sendmsg of one byte: two more records.
            assert_eq!(
                s.send_now(&[Bytes::from_static(&[7]), Bytes::new()])
                    .unwrap(),
                1
            );
            assert!(s.may_send().is_ok());
            s.write_all(&[7u8; 1]).await.unwrap();
            assert!(s.may_send().is_err());
            let refused = s.write_all(&[7u8; 1]).await.unwrap_err();
            assert!(refused.to_string().contains("record limit"), "{refused}");
            assert!(s.send_now(&[Bytes::from_static(&[7])]).is_err());
            s.close().await.unwrap();
            // Only what the budget allowed reached the client, then the close_notify alert's two
            // bytes (sent as a TLS alert record where the kernel holds the keys; plain here).
            let got = client.await;
            assert_eq!(got.len(), (16 << 10) + 1 + 1 + 2);
            assert_eq!(&got[got.len() - 2..], &[1, 0]);
        });
    }
}
