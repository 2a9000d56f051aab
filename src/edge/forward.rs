//! Consumer-group requests at the edge go to the upstream's group coordinator, over connections of
//! the client connection's own (one per coordinator it talks to). Kafka answers a connection's
//! requests in order, and a JoinGroup may wait a whole rebalance: a connection shared by several
//! clients would hold one client's heartbeats behind another's join.

use super::upstream::{Conn, UpstreamError};
use super::{EdgeCore, REQUEST_TIMEOUT};
use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// A JoinGroup waits up to the group's rebalance timeout (Kafka's default is 5 minutes).
const LONGEST_GROUP_REQUEST: Duration = Duration::from_secs(330);

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
    /// Sends a request body as it came to `addr` and returns the whole response frame (its
    /// correlation id first). Requests of one client connection go one at a time, in order.
    pub async fn forward(
        &self,
        edge: &EdgeCore,
        addr: &str,
        key: ApiKey,
        version: i16,
        client_id: Option<&str>,
        body: &[u8],
    ) -> Result<Bytes, UpstreamError> {
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
        let limit = match key {
            ApiKey::JoinGroup | ApiKey::SyncGroup => LONGEST_GROUP_REQUEST,
            _ => REQUEST_TIMEOUT,
        };
        let response = conn.forward(key, version, client_id, body, limit).await?;
        self.conns.borrow_mut().insert(addr.to_string(), conn);
        Ok(response)
    }
}
