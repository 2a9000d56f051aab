//! Consumer-group requests at the edge go to the upstream's group coordinator, over connections of
//! the client connection's own (one per coordinator it talks to). Kafka answers a connection's
//! requests in order, and a JoinGroup may wait a whole rebalance: a connection shared by several
//! clients would hold one client's heartbeats behind another's join.

use super::upstream::{Conn, UpstreamError};
use super::{EdgeCore, REQUEST_TIMEOUT};
use crate::wire::header::Request;
use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// A SyncGroup may wait for the group's leader through a rebalance (Kafka's default rebalance
/// timeout is 5 minutes); a JoinGroup waits for its own rebalance timeout ([`join_limit`]).
const LONGEST_SYNC: Duration = Duration::from_secs(330);

/// How long a JoinGroup may wait upstream: its rebalance timeout (its session timeout before v1),
/// and a margin.
pub fn join_limit(rebalance_timeout_ms: i32, session_timeout_ms: i32) -> Duration {
    let ms = rebalance_timeout_ms.max(session_timeout_ms).max(0) as u64;
    Duration::from_millis(ms) + Duration::from_secs(30)
}

/// One client connection's connections to upstream coordinators.
#[derive(Debug)]
pub struct Forwarder {
    conns: RefCell<HashMap<String, Conn>>,
    turn: glommio::sync::Semaphore,
}

impl Default for Forwarder {
    fn default() -> Self {
        Self {
            conns: RefCell::default(),
            turn: glommio::sync::Semaphore::new(1),
        }
    }
}

impl Forwarder {
    /// Sends a client's request as it came (its API key, version, client id and body) to `addr`
    /// and returns the whole response frame (its correlation id first). Requests of one client
    /// connection go one at a time, in order. `limit`: how long the answer may take (`None`: the
    /// usual for the API).
    pub async fn forward(
        &self,
        edge: &EdgeCore,
        addr: &str,
        req: &Request,
        limit: Option<Duration>,
    ) -> Result<Bytes, UpstreamError> {
        let key = ApiKey::try_from(req.api_key)
            .map_err(|_| format!("cannot forward API key {}", req.api_key))?;
        let (version, client_id) = (req.api_version, req.header.client_id.as_deref());
        let Ok(_turn) = self.turn.acquire_permit(1).await else {
            return Err("closing".into());
        };
        let taken = self.conns.borrow_mut().remove(addr);
        let mut conn = match taken {
            Some(c) => c,
            None => Conn::connect(addr, edge.client_id()).await?,
        };
        if !conn.takes(key as i16, version) {
            return Err(format!("{addr} does not take {key:?} v{version}"));
        }
        let limit = limit.unwrap_or(match key {
            ApiKey::JoinGroup | ApiKey::SyncGroup => LONGEST_SYNC,
            _ => REQUEST_TIMEOUT,
        });
        let response = conn
            .forward(key, version, client_id, &req.body, limit)
            .await?;
        self.conns.borrow_mut().insert(addr.to_string(), conn);
        Ok(response)
    }
}
