//! The front end's one seam to edge mode (`shoal edge`): every question a handler or a session
//! asks of the upstream goes through here, and each answers "not at the edge" in `shoal serve`
//! (where [`Core::upstream`] is `None`).

use crate::cores::Core;
use crate::edge::groups::Client;
use crate::edge::read::EdgeRead;
use crate::wire::fetch::encode::PartitionResult;
use crate::wire::header::Request;
use shards::partition::Partition;
use shards::{Log, SharedRead};
use std::rc::Rc;
use std::time::Instant;

/// A connection's own connections to upstream group coordinators (edge mode forwards group
/// requests upstream).
pub type Forwarder = crate::edge::forward::Forwarder;

/// What edge mode answers itself: a whole frame, or close the connection.
pub use crate::edge::groups::Answer;
/// What a connection may do, as edge mode asks the front end's authorizer.
pub use crate::edge::groups::Rights;

/// Edge mode answers the requests it forwards upstream (groups, coordinators) itself: the
/// answer (`Err`: the request could not be decoded), or `None` for a request the local handlers
/// serve (always `None` in `shoal serve`).
pub async fn answer(
    core: &Core,
    req: &Request,
    peer: &str,
    rights: &dyn Rights,
    forwarder: &Forwarder,
) -> Option<Result<Answer, String>> {
    let edge = core.upstream()?;
    let client = Client {
        peer,
        rights,
        forwarder,
    };
    Box::pin(edge.answer(req, &client)).await
}

/// Why a produce to `topic` is refused at the edge (it is read-only), or `None` in `shoal serve`.
pub fn refuses_produce(core: &Core, topic: &str, peer: &str) -> Option<String> {
    core.upstream().map(|e| e.refuse_produce(topic, peer))
}

/// ListOffsets at the edge: the upstream's answer for a partition (a view's offsets are its
/// source's), as (offset, timestamp) or an error code; `None` in `shoal serve`.
pub async fn list_offset(
    core: &Core,
    log: &Log,
    topic: &str,
    partition: i32,
    timestamp: i64,
    view: bool,
) -> Option<Result<(i64, i64), i16>> {
    let edge = core.upstream()?;
    Some(
        edge.list_offset(log, topic, partition, timestamp, view)
            .await,
    )
}

/// A fetch of a partition as edge mode is asked about it.
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    pub offset: i64,
    pub max_bytes: usize,
    pub obligatory: bool,
    pub read_committed: bool,
    pub deadline: Instant,
}

impl Wanted {
    fn of(self, part: &Partition) -> EdgeRead<'_> {
        EdgeRead {
            log: &part.log,
            topic: &part.topic,
            partition: part.index,
            offset: self.offset,
            max_bytes: self.max_bytes,
            obligatory: self.obligatory,
            deadline: self.deadline,
            read_committed: self.read_committed,
        }
    }
}

/// Edge mode's upstream, for a partition this core owns (a read replica's owner keeps the feed).
fn upstream_of<'a>(core: &'a Core, part: &Partition) -> Option<&'a Rc<crate::edge::EdgeCore>> {
    core.upstream().filter(|_| !part.log.is_replica())
}

/// Keeps the partition's upstream feed going for a fetch served from elsewhere (a view).
pub fn keep_fed(core: &Core, part: &Partition, wanted: Wanted) {
    if let Some(edge) = upstream_of(core, part) {
        edge.keep_fed(wanted.of(part));
    }
}

/// Reads through to the upstream where the edge does not hold what is asked: the read's outcome,
/// or `None` where the local log serves it (always in `shoal serve`).
pub async fn read_through(
    core: &Core,
    part: &Partition,
    wanted: Wanted,
) -> Option<shards::Result<Option<Rc<SharedRead>>>> {
    let edge = upstream_of(core, part)?;
    edge.read(&core.reads.coalescer, wanted.of(part)).await
}

/// A result read at the edge carries the upstream's watermarks (see
/// [`crate::edge::EdgeCore::upstream_watermarks`]).
pub fn upstream_watermarks(
    core: &Core,
    part: &Partition,
    result: &mut PartitionResult,
    read: &SharedRead,
) {
    if let Some(edge) = upstream_of(core, part) {
        edge.upstream_watermarks(result, &read.read);
    }
}
