//! One client connection: frames are read and handled concurrently (pipelining), and responses are
//! written strictly in request order by a writer task that awaits each handler in turn.

use crate::core::Core;
use crate::kafka::frame::{read_frame, FrameError};
use crate::kafka::handlers::{self, Reply};
use crate::kafka::header::{self, HeaderError};
use crate::metrics::add;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::Task;
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// Requests handled at once on one connection before reading waits for responses to drain.
const MAX_IN_FLIGHT: usize = 64;

pub async fn serve(core: Rc<Core>, stream: TcpStream) {
    let peer: Rc<str> = stream
        .peer_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string().into());
    let _ = stream.set_nodelay(true);
    add(&core.metrics.connections_open, 1);
    add(&core.metrics.connections_total, 1);
    let stream = Rc::new(RefCell::new(stream));
    let mut reader = Half(stream.clone());
    let (tx, rx) = local_channel::new_bounded::<Task<Reply>>(MAX_IN_FLIGHT);
    let writer = glommio::spawn_local(write_responses(core.clone(), Half(stream), rx));
    let limit = core.args.max_request_bytes;
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
        let task = glommio::spawn_local(handlers::handle(core.clone(), req, peer.clone()));
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
    mut out: Half,
    rx: local_channel::LocalReceiver<Task<Reply>>,
) {
    while let Some(task) = rx.recv().await {
        match task.await {
            Reply::None => {}
            Reply::Close => break,
            Reply::Frame(chunks) | Reply::Fetch(chunks, _) => {
                let mut n = 0;
                for c in &chunks {
                    if out.write_all(c).await.is_err() {
                        return;
                    }
                    n += c.len();
                }
                add(&core.metrics.bytes_out, n as u64);
            }
        }
    }
    let _ = out.flush().await;
    let _ = out.close().await;
}

/// One direction of a connection shared by a reader and a writer task (the server's connections, the
/// load generator's producers). Polls never overlap (one thread, and a poll never awaits), so a
/// `RefCell` borrow per poll is enough.
#[derive(Debug, Clone)]
pub struct Half(pub Rc<RefCell<TcpStream>>);

impl AsyncRead for Half {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Half {
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
