//! What one core is told to do: the broker settings the cores, the Kafka front end, the control
//! plane and the groups read. The command line converts its flags into this (and into the
//! process-level [`crate::server::ServerConfig`] around it); nothing here knows about flags.

use crate::auth::AuthConfig;
use crate::cores::fetch_sessions::FetchSessionConfig;
use crate::cores::load::PacingConfig;
use crate::groups::CoordinatorConfig;
use crate::table::acl::AuthorizerConfig;
use shards::producers::ProducerConfig;
use shards::view_reader::ViewConfig;
use shards::LogConfig;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Topic table and partition logs; absolute once the server has started.
    pub data_dir: PathBuf,
    /// Host name clients are told to connect to (Metadata).
    pub advertised_host: String,
    /// Create a topic when a Metadata request names a missing one.
    pub auto_create_topics: bool,
    /// Partitions of auto-created topics and of CreateTopics asking for the default (-1).
    pub default_partitions: i32,
    /// Largest request frame, checked before allocating.
    pub max_request_bytes: usize,
    /// Settings every partition's log starts from; topic configs override them.
    pub log: LogConfig,
    /// Idempotent producer state per partition.
    pub producers: ProducerConfig,
    /// Memory for recent batches per core.
    pub tail_cache_bytes: usize,
    /// Fetch read coalescing on at start (switchable live).
    pub fetch_coalescing: bool,
    /// Memory for recent fetch results per core.
    pub fetch_cache_bytes: usize,
    /// Record bytes unsent fetch responses may hold per core.
    pub fetch_response_budget_bytes: usize,
    /// Incremental fetch sessions per core and their eviction.
    pub fetch_sessions: FetchSessionConfig,
    /// Descriptors each core's logs may hold open (segment files, Direct I/O writers, the small
    /// files they write); `None`: a share of the process's open files limit (see
    /// `server::data_dir`).
    pub max_open_files_per_core: Option<u64>,
    pub views: ViewConfig,
    /// Read replicas of hot partitions on the other cores (policy switchable live).
    pub replicas: crate::replicas::ReplicaConfig,
    pub groups: CoordinatorConfig,
    pub transactions: crate::transactions::coordinator::TxnConfig,
    /// Long polls on a saturated core wait a little to carry more per response.
    pub fetch_pacing: PacingConfig,
    /// How the Kafka listener authenticates clients.
    pub auth: AuthConfig,
    /// Whether and how ACLs are enforced.
    pub authorizer: AuthorizerConfig,
    /// Edge mode (`shoal edge`): the upstream cluster this server mirrors; `None` for `serve`.
    pub edge: Option<crate::edge::EdgeConfig>,
}
