//! One core's life on its executor: open its partitions, groups and transactions, start its
//! background tasks and its receive loop, accept connections until the stop, then drain and close.
//! In edge mode core 0 also mirrors the upstream's topics into the table.

use super::DRAIN;
use crate::admin::{serve_admin, AdminInbox};
use crate::control;
use crate::control::TopicChange;
use crate::cores::mesh::{CoreMsg, Mesh};
use crate::cores::receive::spawn_receivers;
use crate::cores::replica_link::{send_replica_messages, tick_replicas};
use crate::cores::{config::BrokerConfig, Core, Listener};
use crate::edge::mirror::TopicMirror;
use crate::kafka::connection;
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::net::TcpListener;
use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A segment file unused for this long is closed, whatever the open files budget.
const IDLE_FILES: Duration = Duration::from_secs(30);

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_core(
    id: usize,
    config: BrokerConfig,
    listeners: Vec<Listener>,
    fds: Vec<RawFd>,
    http: Option<(
        RawFd,
        crate::http::HttpConfig,
        std::sync::Arc<crate::http::spread::Spread>,
    )>,
    admin_inbox: Option<AdminInbox>,
    mesh: MeshBuilder<CoreMsg, glommio::channels::channel_mesh::Full>,
    stop: Arc<AtomicBool>,
    table: crate::table::TopicTable,
) {
    let cores = listeners[0].ports.len();
    let (senders, receivers) = if cores > 1 {
        let (s, r) = mesh.join().await.expect("joining the core mesh");
        (Some(s), Some(r))
    } else {
        (None, None)
    };
    let core = Rc::new(Core::new(
        id,
        Rc::new(config),
        listeners,
        Mesh::new(senders),
    ));
    if let Some(r) = receivers {
        spawn_receivers(&core, r, control::decide);
    }
    if let Some(budget) = core.config().max_open_files_per_core {
        shards::set_open_files_limit(budget - u64::from(id == 0)); // core 0's covers the LOCK
    }
    // Connections are served while the partitions open: a request waits for those it needs,
    // which are opened first (see `Core::wait_opening`).
    let opening = glommio::spawn_local({
        let core = core.clone();
        async move { open_core(&core, table).await }
    });
    let accepts = spawn_accepts(&core, fds);
    opening.await;
    // The admin API (and /metrics) answers once this core holds what it owns.
    let admin = admin_inbox.map(|inbox| glommio::spawn_local(serve_admin(core.clone(), inbox)));
    // Streams to browsers start once every partition is open (a stream asks for its topic's).
    let streams = http.map(|(fd, config, spread)| {
        // SAFETY: as for the Kafka listeners.
        let listener = unsafe { TcpListener::from_raw_fd(fd) };
        glommio::spawn_local(crate::http::serve(core.clone(), listener, config, spread))
    });
    // Compacted topics' partitions on this core are compacted in the background from now on.
    shards::compactor::start();
    shards::log::open_files::close_idle_files(IDLE_FILES);
    let ticker = glommio::spawn_local({
        let core = core.clone();
        async move { core.groups().run_ticker(core.shutdown()).await }
    });
    let replica_ticker = glommio::spawn_local(tick_replicas(core.clone()));
    let txn_ticker =
        glommio::spawn_local(crate::cores::transaction_markers::run_ticker(core.clone()));
    let lag_rounds = glommio::spawn_local(crate::cores::group_lag::run(core.clone()));
    // Latency-sensitive: a write's hand-overs leave before the owner's fetch work goes on.
    match glommio::spawn_local_into(send_replica_messages(core.clone()), core.queues().other) {
        Ok(task) => {
            task.detach();
        }
        Err(e) => log::error!("core {id}: read replica hand-overs cannot be sent: {e}"),
    }
    let sampler = glommio::spawn_local(crate::cores::load::run_sampler(
        core.reads.load.clone(),
        core.shutdown().clone(),
    ));
    let mirror =
        (id == 0 && core.is_edge()).then(|| glommio::spawn_local(mirror_upstream(core.clone())));
    while !stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
    log::info!("core {id}: stopping");
    core.shutdown().advance(1);
    core.groups().stop();
    ticker.await;
    replica_ticker.await;
    txn_ticker.await;
    lag_rounds.await;
    sampler.await;
    for a in accepts {
        a.await;
    }
    if let Some(s) = streams {
        s.await;
    }
    if let Some(a) = admin {
        a.await;
    }
    if let Some(m) = mirror {
        m.await;
    }
    close_core(&core).await;
    log::info!("core {id}: stopped");
}

/// Accepts Kafka connections on each of `fds` (listening sockets this process owns, handed over
/// by `Server::start`) until the core stops.
fn spawn_accepts(core: &Rc<Core>, fds: Vec<RawFd>) -> Vec<glommio::Task<()>> {
    fds.into_iter()
        .enumerate()
        .map(|(k, fd)| {
            // SAFETY: as above.
            let listener = unsafe { TcpListener::from_raw_fd(fd) };
            glommio::spawn_local(accept_until_shutdown(core.clone(), listener, k))
        })
        .collect()
}

/// Opens what a core holds at start: the partitions of `table` it owns, its groups' offsets and
/// its transaction log; then marks it opened.
pub(super) async fn open_core(core: &Core, table: crate::table::TopicTable) {
    let id = core.id();
    core.apply_table(table).await;
    if let Err(e) = core
        .groups()
        .load(&core.config().data_dir, core.reads.tail_cache.clone())
        .await
    {
        // Without its offsets the core must not coordinate groups (it would answer as if none
        // were committed); it answers COORDINATOR_LOAD_IN_PROGRESS instead.
        log::error!("core {id}: cannot load committed offsets: {e}");
    }
    if let Err(e) = core
        .transactions()
        .load(&core.config().data_dir, core.reads.tail_cache.clone())
        .await
    {
        // Without its log the core must not coordinate transactions; it answers
        // COORDINATOR_LOAD_IN_PROGRESS instead.
        log::error!("core {id}: cannot load the transaction log: {e}");
    }
    // What the other cores ask of this core's partitions, groups and transactions (markers
    // first) waited for this.
    core.mark_opened();
}

/// Lets open connections finish (up to [`DRAIN`]), then closes the partitions, groups and
/// transactions cleanly.
pub(super) async fn close_core(core: &Core) {
    let deadline = Instant::now() + DRAIN;
    while core.metrics.connections_open.get() > 0 && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    core.close_partitions().await;
    core.groups().close().await;
    core.transactions().close().await;
}

/// Accepts Kafka connections until the core stops, serving each in its own task.
pub(super) async fn accept_until_shutdown(core: Rc<Core>, listener: TcpListener, index: usize) {
    while let Some(accepted) = core.until_stopping(listener.accept()).await {
        match accepted {
            Ok(stream) => {
                let serve = connection::serve(core.clone(), stream, index);
                match glommio::spawn_local_into(serve, core.queues().readers) {
                    Ok(task) => {
                        task.detach();
                    }
                    Err(e) => log::error!("core {}: cannot serve a connection: {e}", core.id()),
                }
            }
            Err(e) => {
                log::warn!("core {}: kafka accept failed: {e}", core.id());
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
/// Edge mode, on core 0: mirrors the upstream's topics (as [`TopicMirror`] reads them, every
/// `--edge-metadata-refresh-ms`) into the topic table, so Metadata at the edge lists them, each
/// partition led by one of the edge's cores, until the server stops.
async fn mirror_upstream(core: Rc<Core>) {
    let Some(edge) = core.upstream().cloned() else {
        return;
    };
    let mut mirror = TopicMirror::default();
    while !core.is_shutting_down() {
        let current: BTreeMap<String, (i32, [u8; 16])> = core
            .topics()
            .topics
            .iter()
            .map(|(n, m)| (n.clone(), (m.partitions, m.id)))
            .collect();
        if let Some(topics) = mirror.next(&edge, &current).await {
            control::change_topics(&core, TopicChange::Mirror { topics }).await;
        }
        core.pause(edge.config.metadata_refresh).await;
    }
}
