//! One client connection: frames are read and handled concurrently (pipelining), and responses are
//! written strictly in request order by a writer task that awaits each handler in turn.

use crate::core_state::Core;
use crate::kafka::handlers::{self, Reply};
use crate::metrics::add;
use crate::wire::frame::{read_frame, FrameError};
use crate::wire::header::{self, HeaderError};
use crate::wire::SharedStream;
use bytes::Bytes;
use futures_lite::AsyncWriteExt;
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::task::JoinHandle;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::rc::Rc;

/// Requests handled at once on one connection before reading waits for responses to drain.
const MAX_IN_FLIGHT: usize = 64;

pub async fn serve(core: Rc<Core>, stream: TcpStream) {
    let peer: Rc<str> = stream
        .peer_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string().into());
    let _ = stream.set_nodelay(true);
    add(&core.metrics.connections_open, 1);
    add(&core.metrics.connections_total, 1);
    let mut reader = SharedStream::new(stream);
    let (tx, rx) = local_channel::new_bounded::<JoinHandle<Reply>>(MAX_IN_FLIGHT);
    let writer = glommio::spawn_local(write_responses(core.clone(), reader.clone(), rx));
    let limit = core.config.max_request_bytes;
    loop {
        let frame = futures_lite::future::or(
            async { Some(read_frame(&mut reader, limit).await) },
            async {
                core.shutdown.wait_for(1).await;
                None
            },
        )
        .await;
        let frame = match frame {
            None | Some(Err(FrameError::Eof)) => break,
            Some(Err(e)) => {
                log::warn!("closing connection from {peer}: {e}");
                add(&core.metrics.protocol_errors, 1);
                break;
            }
            Some(Ok(f)) => f,
        };
        add(&core.metrics.bytes_in, frame.len() as u64 + 4);
        let req = match header::parse(frame) {
            Ok(r) => r,
            Err(HeaderError::UnknownApi {
                api_key,
                correlation_id,
            }) => {
                log::warn!("closing connection from {peer}: unknown API key {api_key} (correlation id {correlation_id})");
                add(&core.metrics.protocol_errors, 1);
                break;
            }
            Err(HeaderError::Malformed(why)) => {
                log::warn!("closing connection from {peer}: malformed request header: {why}");
                add(&core.metrics.protocol_errors, 1);
                break;
            }
        };
        core.metrics.request(req.api_key);
        // Detached: a request, once read, is handled to the end even if the connection goes away
        // (as in Kafka); only its answer is dropped. A handler cancelled half-way could leave
        // state behind (a group deletion between its steps, a commit written but not applied).
        let task = glommio::spawn_local(handlers::handle_guarded(core.clone(), req, peer.clone()))
            .detach();
        if tx.send(task).await.is_err() {
            break; // the writer stopped: the connection is going away
        }
    }
    drop(tx);
    writer.await;
    core.metrics
        .connections_open
        .set(core.metrics.connections_open.get().saturating_sub(1));
}

async fn write_responses(
    core: Rc<Core>,
    mut out: SharedStream,
    rx: local_channel::LocalReceiver<JoinHandle<Reply>>,
) {
    while let Some(task) = rx.recv().await {
        match task.await {
            Some(Reply::None) => {}
            // A handler that did not finish closes the connection too (a panic is caught in
            // `handle_guarded` and answers `Close`).
            Some(Reply::Close) | None => break,
            Some(Reply::Frame(chunks) | Reply::Fetch(chunks, _)) => {
                if write_chunks(&mut out, &chunks).await.is_err() {
                    return;
                }
                let n: usize = chunks.iter().map(Bytes::len).sum();
                add(&core.metrics.bytes_out, n as u64);
            }
        }
    }
    let _ = out.flush().await;
    let _ = out.close().await;
}

/// Writes a response's chunks with as few system calls as it can: first one non-blocking
/// `sendmsg` over all of them (a fetch response is a header, shared record parts and a trailer:
/// written one by one, each would be a system call of its own), then glommio's writes, which wait
/// for the socket, for whatever it did not take at once.
async fn write_chunks(out: &mut SharedStream, chunks: &[Bytes]) -> io::Result<()> {
    let mut sent = 0;
    if chunks.len() > 1 {
        let fd = out.as_raw_fd();
        match send_vectored(fd, chunks) {
            Ok(n) => sent = n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
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
