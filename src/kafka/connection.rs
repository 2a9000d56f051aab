//! One client connection: frames are read and handled concurrently (pipelining), and each handler
//! writes its own response once every earlier response on the connection is written (responses go
//! out strictly in request order). A handler runs in the task queue of its kind of work (produce,
//! fetch, the rest: [`crate::cores::TaskQueues`]), and so does the write of its response, which
//! for a fetch is most of its cost: a core flooded with fetches keeps serving its producers.

use super::authenticate::authenticate;
use super::requests::{next_request, Responses, MAX_IN_FLIGHT};
use super::session::Session;
use crate::auth::Principal;
use crate::cores::Core;
use crate::kafka::handlers;
use crate::metrics::add;
use crate::wire::frame::FrameReader;
use crate::wire::SharedStream;
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use kafka_protocol::messages::ApiKey;
use std::io;
use std::rc::Rc;

/// Serves one connection accepted on listener `listener` (index in `core.cluster.listeners`).
pub async fn serve(core: Rc<Core>, stream: TcpStream, listener: usize) {
    let protocol = core.cluster.listeners[listener].protocol;
    let addr = stream.peer_addr().ok();
    let peer: Rc<str> = addr.map_or_else(|| "?".into(), |a| a.to_string().into());
    let _ = stream.set_nodelay(true);
    let tls = if protocol.tls() {
        core.security.tls.as_ref()
    } else {
        None
    };
    let (mut reader, certificate_principal) = match tls {
        None => (SharedStream::new(stream), None),
        Some(Err(why)) => {
            log::error!(
                "refusing the connection from {peer}: TLS is configured but unusable: {why}"
            );
            return;
        }
        Some(Ok(tls)) => match tls_handshake(&core, tls, stream).await {
            Ok(accepted) => accepted,
            Err(e) => {
                let hint = crate::auth::tls::handshake_hint(&e);
                log::warn!("TLS handshake with {peer} failed: {e}{hint}");
                add(&core.metrics.tls_handshake_failures, 1);
                return;
            }
        },
    };
    add(&core.metrics.connections_open, 1);
    add(&core.metrics.connections_total, 1);
    let responses = Rc::new(Responses::new(reader.clone()));
    let mut frames = FrameReader::new();
    let mut seq: i64 = 0;
    // Who the client is: authenticated first where the listener asks for it.
    let principal = if protocol.sasl() {
        authenticate(
            &core,
            &mut reader,
            &mut frames,
            &responses,
            &peer,
            addr.map(|a| a.ip()),
            &mut seq,
        )
        .await
    } else {
        // mTLS: the verified certificate's subject; else anonymous.
        Some(certificate_principal.map_or(Principal::Anonymous, Principal::User))
    };
    if let Some(principal) = principal {
        let session = Rc::new(Session::new(
            peer.clone(),
            principal,
            addr.map(|a| a.ip()),
            listener,
        ));
        serve_requests(
            &core,
            &session,
            &mut reader,
            &mut frames,
            &responses,
            &mut seq,
        )
        .await;
    }
    // Every response already asked for goes out before the connection closes.
    responses.written.wait_for(seq).await;
    let mut out = responses.out.clone();
    let _ = out.flush().await;
    let _ = out.close().await;
    core.metrics
        .connections_open
        .set(core.metrics.connections_open.get().saturating_sub(1));
}

/// The TLS handshake of a new connection ([`crate::auth::tls::accept`]), counted by how the
/// connection is encrypted.
async fn tls_handshake(
    core: &Core,
    tls: &std::sync::Arc<futures_rustls::rustls::ServerConfig>,
    stream: TcpStream,
) -> io::Result<(SharedStream, Option<String>)> {
    let accepted =
        crate::auth::tls::accept(tls, stream, &core.security.kernel_tls, core.id()).await?;
    let counter = if accepted.kernel {
        &core.metrics.tls_kernel_connections
    } else {
        &core.metrics.tls_user_space_connections
    };
    add(counter, 1);
    Ok((accepted.stream, accepted.principal))
}

/// Reads and handles the requests of an authenticated connection until it closes, the client
/// goes away or the server stops; `seq` counts the requests read.
async fn serve_requests(
    core: &Rc<Core>,
    session: &Rc<Session>,
    reader: &mut SharedStream,
    frames: &mut FrameReader,
    responses: &Rc<Responses>,
    seq: &mut i64,
) {
    let limit = core.config().max_request_bytes;
    let peer = &session.peer;
    let mut fetched = false;
    loop {
        // Bounded pipelining: wait for the oldest responses to go out.
        responses.written.wait_for(*seq - MAX_IN_FLIGHT + 1).await;
        if responses.closed.get() {
            break;
        }
        let Some(req) =
            next_request(core, reader, frames, limit, peer, std::future::pending()).await
        else {
            break;
        };
        if !fetched && req.api_key == ApiKey::Fetch as i16 {
            fetched = true;
            add(&core.metrics.fetch_connections, 1);
        }
        let queue = core.queues().for_api(req.api_key);
        let (api_key, read_at) = (req.api_key, std::time::Instant::now());
        // Detached: a request, once read, is handled to the end even if the connection goes away
        // (as in Kafka); only its answer is dropped. A handler cancelled half-way could leave
        // state behind (a group deletion between its steps, a commit written but not applied).
        let task = {
            let (core, responses, session) = (core.clone(), responses.clone(), session.clone());
            let seq = *seq;
            async move {
                let reply = handlers::handle_guarded(core.clone(), req, session).await;
                responses.write_in_turn(&core, seq, reply).await;
                core.metrics.duration(api_key, read_at.elapsed());
            }
        };
        match glommio::spawn_local_into(task, queue) {
            Ok(t) => t.detach(),
            Err(e) => {
                log::error!("closing connection from {peer}: cannot start a handler: {e}");
                break;
            }
        };
        *seq += 1;
        responses.read.set(*seq);
    }
    if fetched {
        let open = &core.metrics.fetch_connections;
        open.set(open.get().saturating_sub(1));
        core.replicas.connection_closed(session.id);
    }
}
