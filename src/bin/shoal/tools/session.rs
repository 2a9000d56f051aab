//! The connection to a cluster: the bootstrap broker, the API versions it serves, metadata, and
//! connections to the controller or a partition's leader, each bounded by `--timeout`.

use super::args::ClientArgs;
use super::failure::Failure;
use crate::client::{pick_version, resolve, sasl, tls, SyncConn};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// The environment variable a SASL password may come from.
const PASSWORD_ENV: &str = "SHOAL_PASSWORD";

pub fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

#[derive(Debug)]
pub struct Session {
    pub bootstrap: SocketAddr,
    pub versions: ApiVersionsResponse,
    timeout: Duration,
}

impl Session {
    /// Sets up TLS and SASL for the process, then asks the first bootstrap broker that answers
    /// for its API versions.
    pub fn open(args: &ClientArgs) -> Result<Session, Failure> {
        if let Some(ca) = &args.tls_ca {
            let client = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
            tls::enable(ca, client)?;
        }
        if let Some(m) = args.sasl_mechanism {
            let user = args.user.clone().unwrap_or_default();
            sasl::enable(m, user, password(args)?)?;
        }
        let mut last = None;
        for b in args
            .brokers
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
        {
            match Self::try_bootstrap(b, args.timeout) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Failure::usage("--brokers names no broker")))
    }

    fn try_bootstrap(broker: &str, timeout: Duration) -> Result<Session, Failure> {
        let bootstrap = resolve(broker)?;
        let mut c = SyncConn::connect_within(bootstrap, timeout, timeout)?;
        // v0 is served by every broker and lists every API's range.
        let versions: ApiVersionsResponse =
            c.call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())?;
        Failure::check(versions.error_code, "ApiVersions", None)?;
        Ok(Session {
            bootstrap,
            versions,
            timeout,
        })
    }

    /// The highest version of `key` in `lo..=hi` the broker serves.
    pub fn version(&self, key: ApiKey, lo: i16, hi: i16) -> Result<i16, Failure> {
        pick_version(&self.versions, key, lo, hi).map_err(|e| {
            Failure::other(
                "UnsupportedVersion",
                e.to_string(),
                "the broker is older than this command needs",
            )
        })
    }

    /// `--timeout`: how long a connection or an answer may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn connect(&self, addr: SocketAddr) -> Result<SyncConn, Failure> {
        Ok(SyncConn::connect_within(addr, self.timeout, self.timeout)?)
    }

    /// One request to `addr`, on a connection of its own.
    pub fn call<Req: Encodable, Resp: Decodable>(
        &self,
        addr: SocketAddr,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> Result<Resp, Failure> {
        Ok(self.connect(addr)?.call(key, version, body)?)
    }

    /// Metadata for `topics` (all topics: `None`), never creating one.
    pub fn metadata(&self, topics: Option<&[&str]>) -> Result<MetadataResponse, Failure> {
        let version = self.version(ApiKey::Metadata, 1, 12)?;
        let mut req = MetadataRequest::default().with_topics(topics.map(|ts| {
            ts.iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                .collect()
        }));
        if version >= 4 {
            req = req.with_allow_auto_topic_creation(false);
        }
        self.call(self.bootstrap, ApiKey::Metadata, version, &req)
    }

    /// Where broker `id` listens, by the metadata.
    pub fn broker(&self, m: &MetadataResponse, id: i32) -> Option<SocketAddr> {
        let b = m.brokers.iter().find(|b| b.node_id.0 == id)?;
        resolve(&format!("{}:{}", b.host, b.port)).ok()
    }

    /// Each partition of `topic` with its leader's node id and address (a topic the broker does
    /// not know, or a partition without a leader, is an error).
    pub fn leaders(&self, topic: &str) -> Result<BTreeMap<i32, (i32, SocketAddr)>, Failure> {
        let m = self.metadata(Some(&[topic]))?;
        let t = m
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .ok_or_else(|| Failure::kafka(3, &format!("topic {topic}"), None))?;
        Failure::check(t.error_code, &format!("topic {topic}"), None)?;
        let mut leaders = BTreeMap::new();
        for p in &t.partitions {
            let leader = p.leader_id.0;
            let addr = self.broker(&m, leader).ok_or_else(|| {
                Failure::other(
                    "LeaderNotAvailable",
                    format!("topic {topic} partition {}: no leader", p.partition_index),
                    "retry in a moment",
                )
            })?;
            leaders.insert(p.partition_index, (leader, addr));
        }
        Ok(leaders)
    }

    /// One request to the controller (the bootstrap broker when the metadata names none).
    pub fn call_controller<Req: Encodable, Resp: Decodable>(
        &self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> Result<Resp, Failure> {
        let m = self.metadata(Some(&[]))?;
        let controller = self.broker(&m, m.controller_id.0).unwrap_or(self.bootstrap);
        self.call(controller, key, version, body)
    }
}

/// The SASL password: the first line of --password-file, else $SHOAL_PASSWORD.
fn password(args: &ClientArgs) -> Result<String, Failure> {
    if let Some(path) = &args.password_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::usage(format!("reading --password-file {}: {e}", path.display()))
        })?;
        return Ok(text.lines().next().unwrap_or("").to_string());
    }
    std::env::var(PASSWORD_ENV).map_err(|_| {
        Failure::usage(format!(
            "--sasl-mechanism needs a password: --password-file FILE or the environment variable \
             {PASSWORD_ENV}"
        ))
    })
}
