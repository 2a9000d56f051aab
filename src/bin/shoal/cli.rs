//! The command line: `shoal serve` and its flags (every number a user may want to change is here),
//! `shoal bench`, whose flags are the load generator's, `shoal user`, which manages SASL users, and
//! the operator commands `shoal topic`, `group`, `cluster`, `acl`, `user` over the protocol,
//! `produce` and `consume` (their flags in `tools`).

use crate::units::{parse_size, parse_size_or_minus_one, parse_size_usize};
use clap::{Args, Parser, Subcommand};
use shards::producers::ProducerConfig;
use shards::view_reader::ViewConfig;
use shards::LogConfig;
use shoal::admin::parse_on_off;
use shoal::auth::{AuthConfig, SaslMechanism, SecurityProtocol};
use shoal::cores::config::BrokerConfig;
use shoal::cores::fetch_sessions::FetchSessionConfig;
use shoal::cores::load::PacingConfig;
use shoal::edge::EdgeConfig;
use shoal::groups::consumer::ConsumerConfig;
use shoal::groups::lag::LagConfig;
use shoal::groups::CoordinatorConfig;
use shoal::http::HttpConfig;
use shoal::replicas::ReplicaConfig;
use shoal::server::ServerConfig;
use shoal::table::acl::AuthorizerConfig;
use shoal::table::configs::ReplicaPolicy;
use shoal::transactions::coordinator::TxnConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "shoal",
    version,
    about = "A Kafka-compatible streaming-log broker for high fan-out reads"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the broker: one Kafka listener per core (port + core index), admin HTTP on --admin.
    Serve(ServeArgs),
    /// Run a read-only fan-out tier in front of an existing Kafka cluster: consumers read here,
    /// each partition is fetched once from --upstream however many read it, group offsets live
    /// upstream, producers keep writing upstream. Takes every `serve` flag too.
    Edge(EdgeArgs),
    /// Load generators; `shoal bench fanout --help`.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// SASL users and their SCRAM credentials: `create`, `delete` and `list` ask a broker over the
    /// Kafka protocol (any Kafka-compatible one); `add`, `remove` and `list --data-dir` edit the
    /// users file of a data directory (a running server picks up changes at the next
    /// authentication).
    #[command(subcommand)]
    User(UserCommand),
    /// Topics on any Kafka-compatible broker, through the Kafka protocol: create, list, describe,
    /// alter-config, add-partitions, delete. `shoal topic --help`.
    Topic(crate::tools::TopicCommand),
    /// Consumer groups on any Kafka-compatible broker: list, describe (members, lag per
    /// partition), seek (reset a stopped group's offsets), delete. `shoal group --help`.
    Group(crate::tools::GroupCommand),
    /// The cluster a Kafka-compatible broker belongs to: `shoal cluster info`.
    Cluster(crate::tools::ClusterCommand),
    /// ACLs on any Kafka-compatible broker: create, list, delete. `shoal acl --help`.
    Acl(crate::tools::AclCommand),
    /// Produces the lines of standard input (`key<TAB>value` with --key-delimiter) to a topic.
    /// Example: `shoal produce clicks --key-delimiter '\t' < lines.txt`
    Produce(crate::tools::ProduceCommand),
    /// Prints a topic's records (kcat-style --format templates, or JSON lines). Example:
    /// `shoal consume clicks --offset beginning --exit --format '%k=%s\n'`
    Consume(crate::tools::ConsumeCommand),
}

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Makes a token for USER and prints it (the only time it is shown).
    Create {
        user: String,
        #[arg(long, default_value = "./shoal-data")]
        data_dir: PathBuf,
    },
    /// Lists the tokens: id (the start of the token's hash), user, when made.
    List {
        #[arg(long, default_value = "./shoal-data")]
        data_dir: PathBuf,
    },
    /// Revokes a token by its id (at least 8 hex digits), or every token of a user.
    Revoke {
        id_or_user: String,
        #[arg(long, default_value = "./shoal-data")]
        data_dir: PathBuf,
    },
}

/// `shoal user token ...`.
fn run_token(action: TokenAction) -> Result<(), String> {
    use shoal::auth::tokens::TokenStore;
    let load = |dir: &std::path::Path| {
        let path = TokenStore::path(dir);
        TokenStore::load(&path)
            .map(|s| (path, s))
            .map_err(|e| e.to_string())
    };
    let save = |store: &TokenStore, path: &std::path::Path| {
        store
            .save(path)
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    match action {
        TokenAction::Create { user, data_dir } => {
            shoal::auth::users::validate_user_name(&user)?;
            let (path, mut store) = load(&data_dir)?;
            let token = store.create(&user, shards::now_ms());
            save(&store, &path)?;
            println!("{token}");
            eprintln!("a token for User:{user}: send it as `Authorization: Bearer TOKEN` or `?access_token=TOKEN`; it is not shown again");
        }
        TokenAction::List { data_dir } => {
            let (_, store) = load(&data_dir)?;
            println!("{:<14}{:<24}CREATED-MS", "ID", "USER");
            for (id, t) in store.list() {
                println!("{id:<14}{:<24}{}", t.user, t.created_ms);
            }
        }
        TokenAction::Revoke {
            id_or_user,
            data_dir,
        } => {
            let (path, mut store) = load(&data_dir)?;
            let revoked = store.revoke(&id_or_user);
            if revoked == 0 {
                return Err(format!("no token has id {id_or_user:?} (8 hex digits or more) or belongs to user {id_or_user:?}"));
            }
            save(&store, &path)?;
            println!("revoked {revoked} token(s)");
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Offline: adds a user to --data-dir's users file, or sets a user's password: SCRAM
    /// credentials (salted and hashed, never the password) for each mechanism asked for.
    /// SASL/PLAIN checks passwords against them too.
    Add {
        name: String,
        /// The password (visible to other users of this machine in the process list: prefer
        /// --password-stdin).
        #[arg(
            long,
            conflicts_with = "password_stdin",
            required_unless_present = "password_stdin"
        )]
        password: Option<String>,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
        /// SCRAM mechanisms to store credentials for.
        #[arg(long, value_delimiter = ',', default_value = "SCRAM-SHA-256,SCRAM-SHA-512", value_parser = parse_scram)]
        mechanisms: Vec<shoal::auth::scram::Mechanism>,
        /// PBKDF2 iterations (Kafka's range: 4096 to 16384).
        #[arg(long, default_value_t = shoal::auth::scram::MIN_ITERATIONS)]
        iterations: u32,
        #[arg(long, default_value = "./shoal-data")]
        data_dir: PathBuf,
    },
    /// Offline: bearer tokens for the HTTP streams (`--http-listen`), each tied to a user, in
    /// --data-dir's tokens file (hashed; a running server reads it again when it changes).
    /// Example: `shoal user token create alice`
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Over the Kafka protocol (AlterUserScramCredentials): creates a user, or sets a user's
    /// password, salted and hashed here; the new password from --new-password-file or
    /// SHOAL_NEW_PASSWORD. Example: `shoal user create alice --mechanism SCRAM-SHA-512`
    Create(crate::tools::UserCreate),
    /// Over the Kafka protocol: deletes a user's credentials (all, or --mechanism's); its new
    /// connections are refused. Example: `shoal user delete alice`
    Delete(crate::tools::UserDelete),
    /// Offline: removes a user (or one mechanism's credential) from --data-dir's users file: its
    /// new connections are refused.
    Remove {
        name: String,
        #[arg(long, value_parser = parse_scram)]
        mechanism: Option<shoal::auth::scram::Mechanism>,
        #[arg(long, default_value = "./shoal-data")]
        data_dir: PathBuf,
    },
    /// Lists users with their mechanisms and iteration counts: from a broker over the Kafka
    /// protocol (DescribeUserScramCredentials), or from --data-dir's users file when it is given.
    /// Example: `shoal user list --format json`
    List(crate::tools::UserList),
}

use crate::tools::parse_scram;

fn parse_listener(s: &str) -> Result<(SecurityProtocol, SocketAddr), String> {
    let (protocol, addr) = s
        .split_once("://")
        .ok_or_else(|| format!("{s}: PROTOCOL://HOST:PORT"))?;
    let protocol = SecurityProtocol::from_name(protocol)
        .ok_or_else(|| format!("{protocol}: one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"))?;
    let addr: SocketAddr = addr
        .parse()
        .map_err(|e| format!("{addr}: an IP address and port ({e})"))?;
    Ok((protocol, addr))
}

/// One `--super-users` entry: `User:<name>`, surrounding spaces trimmed (Kafka trims
/// `super.users` entries too). Every principal shoal gives a client is a `User`, and super users
/// match exactly, so an entry of another type or with no name could never match: refused. So is
/// a comma before something that looks like another principal (`User:a,User:b`): commas belong
/// to the principal (a certificate's subject has them), entries are separated by `;`.
fn parse_super_user(s: &str) -> Result<String, String> {
    let entry = s.trim();
    if entry.is_empty() {
        return Err("an empty entry: principals are `User:<name>`, separated by `;`".into());
    }
    let Some((kind, name)) = entry.split_once(':') else {
        return Err(format!("{entry}: not a principal, `User:<name>`"));
    };
    if kind != "User" {
        return Err(format!(
            "{entry}: shoal's principals are all `User:<name>` (the type is case-sensitive)"
        ));
    }
    if name.is_empty() {
        return Err(format!("{entry}: no name after `User:`"));
    }
    // A distinguished name's parts are `attribute=value`: a part that starts with `Type:` before
    // any `=` is another principal.
    let looks_like_principal = |part: &str| {
        part.split_once(':').is_some_and(|(kind, _)| {
            let kind = kind.trim();
            !kind.is_empty() && kind.chars().all(|c| c.is_ascii_alphanumeric())
        })
    };
    if entry.split(',').skip(1).any(looks_like_principal) {
        let suggestion = entry
            .split(',')
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(";");
        return Err(format!(
            "{entry}: several principals separated by commas? Separate them with `;` \
             (`{suggestion}`, quoted in a shell), or repeat --super-users; a comma belongs to the \
             principal (`User:CN=alice,O=acme`)"
        ));
    }
    Ok(entry.to_string())
}

/// `shoal user create | delete | list` over the protocol: its failure as text.
fn protocol(action: crate::tools::UserAction) -> Result<(), String> {
    crate::tools::run_user(action).map_err(|e| e.to_string())
}

/// Runs `shoal user ...`.
pub fn run_user(cmd: UserCommand) -> Result<(), String> {
    use shoal::auth::scram::{Credential, MAX_ITERATIONS, MIN_ITERATIONS};
    use shoal::auth::users::{validate_user_name, UserStore};
    let load = |dir: &std::path::Path| {
        let path = UserStore::path(dir);
        UserStore::load(&path)
            .map(|s| (path, s))
            .map_err(|e| e.to_string())
    };
    match cmd {
        UserCommand::Add {
            name,
            password,
            password_stdin,
            mechanisms,
            iterations,
            data_dir,
        } => {
            validate_user_name(&name)?;
            if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
                return Err(format!(
                    "--iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}"
                ));
            }
            let password = match (password, password_stdin) {
                (Some(p), _) => p,
                (None, _) => {
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .map_err(|e| format!("reading the password: {e}"))?;
                    line.trim_end_matches(['\r', '\n']).to_string()
                }
            };
            if password.is_empty() {
                return Err("the password is empty".into());
            }
            let (path, mut store) = load(&data_dir)?;
            for m in &mechanisms {
                store.set(
                    &name,
                    *m,
                    Credential::new(*m, password.as_bytes(), iterations),
                );
            }
            store
                .save(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let names: Vec<&str> = mechanisms.iter().map(|m| m.name()).collect();
            println!("user {name}: {} credentials stored", names.join(", "));
        }
        UserCommand::Remove {
            name,
            mechanism,
            data_dir,
        } => {
            let (path, mut store) = load(&data_dir)?;
            if !store.remove(&name, mechanism) {
                return Err(format!("no such user or credential: {name}"));
            }
            store
                .save(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            println!("user {name}: removed");
        }
        UserCommand::Token { action } => return run_token(action),
        UserCommand::Create(c) => return protocol(crate::tools::UserAction::Create(c)),
        UserCommand::Delete(d) => return protocol(crate::tools::UserAction::Delete(d)),
        UserCommand::List(l) => {
            let Some(data_dir) = l.data_dir.clone() else {
                return protocol(crate::tools::UserAction::List(l));
            };
            let (_, store) = load(&data_dir)?;
            crate::tools::user::list_offline(store.list()).print(l.client.format);
        }
    }
    Ok(())
}

/// `--cores`: a count of at least one.
fn parse_cores(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("at least 1 core runs a broker (leave --cores out to use every CPU)".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number of cores")),
    }
}

#[derive(Debug, Clone, Args)]
pub struct EdgeArgs {
    /// Bootstrap addresses of the upstream Kafka cluster: HOST:PORT, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub upstream: Vec<String>,
    /// On-disk bytes kept per partition at the edge (under --data-dir; the oldest segments go).
    #[arg(long, default_value_t = 256 << 20, value_parser = parse_size)]
    pub edge_cache_bytes: u64,
    /// A partition's upstream fetcher stops when no consumer has asked for it this long (ms).
    #[arg(long, default_value_t = 30_000)]
    pub edge_idle_ms: u64,
    /// How often the upstream's topics and partitions are read again (ms).
    #[arg(long, default_value_t = 5_000)]
    pub edge_metadata_refresh_ms: u64,
    #[command(flatten)]
    pub serve: ServeArgs,
}

impl EdgeArgs {
    /// The server's configuration: `serve`'s, with the local logs set up as a cache of the
    /// upstream (bounded by size, not fsynced, no topics created here).
    pub fn into_config(self) -> ServerConfig {
        let mut config = self.serve.into_config();
        let cache = self.edge_cache_bytes.max(1 << 20);
        let log = &mut config.broker.log;
        log.retention_bytes = Some(cache);
        log.retention_age = None;
        log.flush_interval = None;
        log.segment_bytes = log.segment_bytes.min((cache / 4).max(1 << 20));
        log.retention_check_interval = log.retention_check_interval.min(Duration::from_secs(10));
        config.broker.auto_create_topics = false;
        let mut edge = EdgeConfig::new(self.upstream);
        edge.cache_bytes = cache;
        edge.idle = Duration::from_millis(self.edge_idle_ms.max(1));
        edge.metadata_refresh = Duration::from_millis(self.edge_metadata_refresh_ms.max(100));
        config.broker.edge = Some(edge);
        config
    }
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where partition logs and the topic table live.
    #[arg(long, default_value = "./shoal-data")]
    pub data_dir: PathBuf,
    /// Address of core 0's Kafka listener; core i listens on port + i (port 0: any free ports).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub listen: SocketAddr,
    /// A Kafka listener with its own security: PROTOCOL://HOST:PORT, PROTOCOL one of PLAINTEXT,
    /// SSL, SASL_PLAINTEXT, SASL_SSL; core i on PORT + i (0: any free ports). Repeatable; given,
    /// it replaces --listen, and each client is told the ports of the listener it connected to.
    /// TLS listeners use --tls-cert/--tls-key, SASL ones --sasl-mechanisms.
    #[arg(long = "listener", value_parser = parse_listener)]
    pub listeners: Vec<(SecurityProtocol, SocketAddr)>,
    /// Host name advertised to clients in Metadata (default: the --listen address).
    #[arg(long)]
    pub advertised_host: Option<String>,
    /// Number of cores (executors, brokers) to run, at least 1; default: all available.
    #[arg(long, value_parser = parse_cores)]
    pub cores: Option<usize>,
    /// Admin HTTP address (the console at /, /metrics, /v1/status, live settings).
    #[arg(long, default_value = "127.0.0.1:9644")]
    pub admin: SocketAddr,
    /// Serve the admin endpoint over HTTPS, with --tls-cert and --tls-key.
    #[arg(long)]
    pub admin_tls: bool,
    /// Serve GET /metrics (only) on this address too, over plain HTTP and without a token: for
    /// scrapers, when the admin endpoint is guarded.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Also export each partition's log figures on /metrics (shoal_log_*{topic,partition}: a
    /// dozen series per partition); without it, each is summed per core.
    #[arg(long)]
    pub metrics_per_partition: bool,
    #[command(flatten)]
    pub http: HttpArgs,
    /// A file holding a bearer token (at least 16 characters) that admin HTTP requests must carry
    /// (`Authorization: Bearer <token>`); `GET /metrics` stays open for scrapers.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
    /// At start-up, how long to keep retrying a listen address that is still in use (a process
    /// killed a moment ago holds its sockets until the kernel tears down its io_uring rings), in ms.
    #[arg(long, default_value_t = 10_000)]
    pub bind_retry_ms: u64,
    /// Create a topic (with --default-partitions) when a Metadata request names a missing one.
    #[arg(long, default_value = "true", action = clap::ArgAction::Set)]
    pub auto_create_topics: bool,
    /// Partitions of auto-created topics and of CreateTopics requests that ask for the default (-1).
    #[arg(long, default_value_t = 1)]
    pub default_partitions: i32,
    /// Largest request accepted, checked before any allocation (Kafka socket.request.max.bytes).
    #[arg(long, default_value_t = 100 << 20, value_parser = parse_size_usize)]
    pub max_request_bytes: usize,
    /// Largest record batch accepted (Kafka message.max.bytes).
    #[arg(long, default_value_t = 1_048_588, value_parser = parse_size_usize)]
    pub max_batch_bytes: usize,
    /// Segment size before rolling (Kafka segment.bytes).
    #[arg(long, default_value_t = 256 << 20, value_parser = parse_size)]
    pub segment_bytes: u64,
    /// Segment age before rolling, in ms (Kafka segment.ms).
    #[arg(long, default_value_t = 7 * 24 * 3600 * 1000)]
    pub segment_ms: u64,
    /// Fsync non-durable (acks=0/1) data at least this often, in ms; 0 leaves it to the OS.
    /// acks=all is always fsynced before the acknowledgement.
    #[arg(long, default_value_t = 1000)]
    pub flush_ms: u64,
    /// Write appends with Direct I/O where the file system allows it: acks=all with O_DSYNC (on
    /// stable storage when the write completes), acks=0/1 without (on the device, no flush waited
    /// for; through the page cache while the device stalls). False: everything through the page
    /// cache, acks=all acknowledged after an fdatasync.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub direct_io: bool,
    /// With Direct I/O, keep zeros written up to 4 MiB ahead of what it wrote in each active
    /// segment, so that its appends overwrite written blocks: on ext4 an append into allocated but unwritten space is
    /// handed to a kernel worker thread (15% of a core at 400 MB/s). Costs a second device write of
    /// every block (wear on flash); false: appends go to the unwritten space.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub direct_io_zero_ahead: bool,
    /// Delete old segments once a partition exceeds this many bytes; -1: no limit (Kafka retention.bytes).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_parser = parse_size_or_minus_one)]
    pub retention_bytes: i64,
    /// Delete segments whose newest record is older than this, in ms; -1: keep forever (Kafka retention.ms).
    #[arg(long, default_value_t = 7 * 24 * 3600 * 1000, allow_negative_numbers = true)]
    pub retention_ms: i64,
    /// How often each partition checks retention, in ms.
    #[arg(long, default_value_t = 300_000)]
    pub retention_check_ms: u64,
    /// Memory for recent batches per core (the tail cache), in bytes.
    #[arg(long, default_value_t = 256 << 20, value_parser = parse_size_usize)]
    pub tail_cache_bytes: usize,
    /// Fetch read coalescing: one read per (partition, offset, isolation, max_bytes, obligatory)
    /// serves every consumer asking for it. Also switchable live through the admin API.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub fetch_coalescing: bool,
    /// Read replicas of a partition on the other cores, so a hot partition is served by every
    /// core (consumers are steered by Kafka's preferred_read_replica, KIP-392): auto (once a
    /// partition is hot), all, or off. Also switchable live through the admin API, and per topic
    /// with the topic config shoal.read.replicas.
    #[arg(long, default_value = "auto", value_parser = ReplicaPolicy::parse)]
    pub read_replicas: ReplicaPolicy,
    /// `--read-replicas auto`: a partition gets replicas once this many connections fetch it on
    /// its owner core (or the owner core is busy and at least two do).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub read_replica_min_consumers: u32,
    /// Memory for recent fetch results per core (the coalescer's cache), in bytes.
    #[arg(long, default_value_t = 64 << 20, value_parser = parse_size_usize)]
    pub fetch_cache_bytes: usize,
    /// Record bytes that fetch responses not yet written may hold per core; a result shared by many
    /// responses counts once. A fetch beyond it returns what fits (at least one batch).
    #[arg(long, default_value_t = 512 << 20, value_parser = parse_size_usize)]
    pub fetch_response_budget_bytes: usize,
    /// Incremental fetch sessions (KIP-227) each core keeps, like Kafka's
    /// max.incremental.fetch.session.cache.slots; a consumer without one sends full fetches. 0: none.
    #[arg(long, default_value_t = 1000)]
    pub max_fetch_sessions_per_core: usize,
    /// Files each core's partitions may hold open (segments being read or written, Direct I/O
    /// writers; the data directory's LOCK and the groups' and transactions' logs count too).
    /// Idle partitions hold none; the least recently used are closed when it is reached.
    /// Default: half the process's open files limit (raised as far as allowed at start),
    /// shared among the cores; the other half is left to connections.
    #[arg(long, value_parser = clap::value_parser!(u64).range(8..))]
    pub max_open_files_per_core: Option<u64>,
    /// A fetch session unused for this long (ms) is the first evicted when a new session needs
    /// its slot; otherwise a new session may evict only a session with fewer partitions.
    #[arg(long, default_value_t = 120_000)]
    pub fetch_session_eviction_ms: u64,
    /// Longest a long poll woken by new data waits before it reads while its core is saturated, so
    /// that each response carries more (fetch pacing); bounded by the fetch's own max wait and by
    /// about the time the core needs to answer every fetch it holds once. 0: off; at most 1000.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub fetch_pacing_max_ms: u64,
    /// Busy share of a core's time (percent) above which fetch pacing grows its delay.
    #[arg(long, default_value_t = 85, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub fetch_pacing_target_busy_percent: u8,
    /// Memory for one view reader's window of per-shard batches, in bytes.
    #[arg(long, default_value_t = 32 << 20, value_parser = parse_size_usize)]
    pub view_window_bytes: usize,
    /// A view consumer this many offsets or fewer from the shared reader's window is served from it;
    /// further away it gets its own catch-up read. Also settable live through the admin API.
    #[arg(long, default_value_t = 100_000)]
    pub max_delta_for_fanout: i64,
    /// A view reader with no consumer for this long (ms) stops and frees its window.
    #[arg(long, default_value_t = 30_000)]
    pub view_idle_stop_ms: u64,
    /// Share one interpreting reader per view (off: every view fetch reads and splits for itself,
    /// the baseline for comparisons). Also switchable live through the admin API.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub view_sharing: bool,
    /// How long the first rebalance of an empty consumer group waits for more members, in ms; each
    /// new member extends it, up to the rebalance timeout (Kafka group.initial.rebalance.delay.ms).
    #[arg(long, default_value_t = 3000)]
    pub group_initial_rebalance_delay_ms: u64,
    /// Smallest session timeout a group member may ask for, in ms (Kafka group.min.session.timeout.ms).
    #[arg(long, default_value_t = 6000)]
    pub group_min_session_timeout_ms: u64,
    /// Largest session timeout a group member may ask for, in ms (Kafka group.max.session.timeout.ms).
    #[arg(long, default_value_t = 1_800_000)]
    pub group_max_session_timeout_ms: u64,
    /// A member of a consumer-protocol group (KIP-848) that sends no heartbeat for this long is
    /// removed, in ms (Kafka group.consumer.session.timeout.ms).
    #[arg(long, default_value_t = 45_000)]
    pub group_consumer_session_timeout_ms: u64,
    /// How often members of consumer-protocol groups heartbeat, in ms (Kafka
    /// group.consumer.heartbeat.interval.ms).
    #[arg(long, default_value_t = 5000)]
    pub group_consumer_heartbeat_interval_ms: u64,
    /// The assignor of a consumer-protocol group whose members ask for none: uniform or range
    /// (the first of Kafka's group.consumer.assignors).
    #[arg(long, default_value = "uniform", value_parser = ["uniform", "range"])]
    pub group_consumer_assignor: String,
    /// A core's committed-offsets log is compacted (rewritten with only the live offsets) once it
    /// holds at least this many records and more than twice the live ones.
    #[arg(long, default_value_t = 10_000)]
    pub group_offsets_compact_min_records: u64,
    /// How often each coordinator core computes its consumer groups' lag (the shoal_group_lag_*
    /// metrics), in ms; 0: never. Also switchable live (admin setting group_lag_interval_ms).
    #[arg(long, default_value_t = 5000)]
    pub group_lag_interval_ms: u64,
    /// Also export each group's lag per partition (shoal_group_partition_lag; can be many series).
    #[arg(long)]
    pub group_lag_per_partition: bool,
    /// Most per-partition lag series one core exports, over all its groups.
    #[arg(long, default_value_t = 10_000)]
    pub group_lag_max_partition_series: usize,
    /// Largest transaction timeout a transactional producer may ask for, in ms (Kafka
    /// transaction.max.timeout.ms); a larger one gets INVALID_TRANSACTION_TIMEOUT.
    #[arg(long, default_value_t = 900_000)]
    pub transaction_max_timeout_ms: i32,
    /// A transactional id with no transaction for this long (ms) is forgotten (Kafka
    /// transactional.id.expiration.ms).
    #[arg(long, default_value_t = 604_800_000)]
    pub transactional_id_expiration_ms: u64,
    /// How often each coordinator core aborts transactions past their timeout, in ms (Kafka
    /// transaction.abort.timed.out.transaction.cleanup.interval.ms).
    #[arg(long, default_value_t = 1_000)]
    pub transaction_timeout_check_interval_ms: u64,
    /// An idempotent producer with no batch for this long (ms) is forgotten per partition; its next
    /// batch must start a new sequence (Kafka producer.id.expiration.ms).
    #[arg(long, default_value_t = 86_400_000)]
    pub producer_id_expiration_ms: u64,
    /// Idempotent producers remembered per partition; beyond it the longest idle is forgotten.
    #[arg(long, default_value_t = 10_000)]
    pub max_producers_per_partition: usize,
    /// SASL mechanisms the Kafka listener requires clients to authenticate with (comma-separated:
    /// PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); none: no authentication. Users: `shoal user add`.
    #[arg(long, value_delimiter = ',', value_parser = SaslMechanism::parse)]
    pub sasl_mechanisms: Vec<SaslMechanism>,
    /// On SASL listeners, a connection not authenticated this long after it connected is closed.
    #[arg(long, default_value_t = 30_000)]
    pub sasl_authentication_timeout_ms: u64,
    /// TLS on the Kafka listener: the server's certificate chain (PEM, leaf first); with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by these CAs (PEM): mTLS. A client's principal is then
    /// its certificate's subject (`User:CN=...`), unless it also authenticates with SASL.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Kernel TLS: `auto` hands each TLS connection's keys to the kernel after the handshake
    /// where it offers kTLS (the `tls` module), so shared record buffers are sent without a copy
    /// into TLS records; `off`, or a kernel without it: rustls encrypts in user space.
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
    pub tls_kernel: String,
    /// A failed authentication is answered after this long, then the connection is closed.
    #[arg(long, default_value_t = 100)]
    pub failed_authentication_delay_ms: u64,
    /// Failed authentications from one address (per core) within a minute before its attempts
    /// are refused at once until the minute is over.
    #[arg(long, default_value_t = 10)]
    pub max_failed_authentications_per_minute: u32,
    /// Enforce ACLs (CreateAcls, DescribeAcls, DeleteAcls; `kafka-acls.sh`): `acl`, or `none`
    /// (every client may do everything).
    #[arg(long, default_value = "none", value_parser = ["acl", "none"])]
    pub authorizer: String,
    /// Principals allowed everything whatever the ACLs say: `User:<name>`, separated by `;` as
    /// in Kafka's `super.users` (a certificate's subject has commas: `User:CN=alice,O=acme`), or
    /// given by repeating the flag.
    #[arg(long, value_delimiter = ';', value_parser = parse_super_user)]
    pub super_users: Vec<String>,
    /// With ACLs enforced, a topic, group or the cluster that no ACL names is open to everyone
    /// (Kafka's `allow.everyone.if.no.acl.found`).
    #[arg(long, default_value = "false", action = clap::ArgAction::Set)]
    pub allow_everyone_if_no_acl_found: bool,
}

/// The server's configuration from `shoal serve` flags (the bench's `--broker-arg`s).
pub fn serve_config(args: &[String]) -> Result<ServerConfig, String> {
    let argv = ["shoal", "serve"].map(String::from).into_iter();
    match Cli::try_parse_from(argv.chain(args.iter().cloned())) {
        Ok(Cli {
            command: Command::Serve(a),
        }) => Ok(a.into_config()),
        Ok(_) => unreachable!("parsed a serve command"),
        Err(e) => Err(e.to_string()),
    }
}

/// Topics streamed to browsers and devices over HTTP (Server-Sent Events and WebSocket).
#[derive(Debug, Clone, clap::Args)]
pub struct HttpArgs {
    /// Stream topics over HTTP/1.1 on this address, from every core:
    /// GET /v1/topics/TOPIC/partitions/P/stream as text/event-stream or a WebSocket. Off by
    /// default.
    #[arg(long)]
    pub http_listen: Option<SocketAddr>,
    /// An idle stream gets an SSE comment or a WebSocket ping this often (ms); a ping unanswered
    /// by the next one closes the connection.
    #[arg(long, default_value_t = 15_000)]
    pub http_heartbeat_ms: u64,
    /// Most bytes a subscriber reads at once; one that had caught up, does not read as fast as
    /// its stream is written, and falls further behind than this gets its ?slow= treatment
    /// (disconnect, or skip with a gap event).
    #[arg(long, default_value_t = 1 << 20, value_parser = parse_size_usize)]
    pub http_stream_buffer_bytes: usize,
    /// Stream connections per core; more are answered 503.
    #[arg(long, default_value_t = 20_000)]
    pub http_max_connections: usize,
    /// Memory per core for the encoded frames subscribers share.
    #[arg(long, default_value_t = 32 << 20, value_parser = parse_size_usize)]
    pub http_frame_cache_bytes: usize,
    /// Where ACLs are enforced: topics starting with this prefix may be streamed without an
    /// identity (repeatable).
    #[arg(long)]
    pub http_anonymous_read: Vec<String>,
    /// Origins browsers may stream from (CORS, WebSocket upgrades), comma-separated; without
    /// it, no CORS answer and same-origin WebSockets only.
    #[arg(long, value_delimiter = ',')]
    pub http_allowed_origins: Vec<String>,
    /// Serve the streams over TLS (HTTPS, WSS) with the Kafka listeners' --tls-cert and
    /// --tls-key; with --tls-client-ca, a client certificate sent must verify and names the
    /// reader. HTTP Basic with a SCRAM user's password is accepted over TLS only.
    #[arg(long)]
    pub http_tls: bool,
}

impl HttpArgs {
    pub fn into_config(self) -> HttpConfig {
        HttpConfig {
            heartbeat: Duration::from_millis(self.http_heartbeat_ms.max(1)),
            stream_buffer_bytes: self.http_stream_buffer_bytes.max(4096),
            max_connections: self.http_max_connections.max(1),
            frame_cache_bytes: self.http_frame_cache_bytes,
            anonymous_read: self.http_anonymous_read,
            allowed_origins: self.http_allowed_origins,
            tls: None,
        }
    }
}

impl ServeArgs {
    /// The settings every partition's log starts from.
    fn log_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes: self.segment_bytes,
            segment_age: Some(Duration::from_millis(self.segment_ms)),
            flush_interval: (self.flush_ms > 0).then(|| Duration::from_millis(self.flush_ms)),
            retention_bytes: u64::try_from(self.retention_bytes).ok(),
            retention_age: u64::try_from(self.retention_ms)
                .ok()
                .map(Duration::from_millis),
            retention_check_interval: Duration::from_millis(self.retention_check_ms.max(1)),
            max_batch_bytes: self.max_batch_bytes,
            direct_io: self.direct_io,
            zero_ahead: self.direct_io_zero_ahead,
            ..LogConfig::default()
        }
    }

    fn fetch_session_config(&self) -> FetchSessionConfig {
        FetchSessionConfig {
            max_sessions: self.max_fetch_sessions_per_core,
            eviction_timeout: Duration::from_millis(self.fetch_session_eviction_ms),
        }
    }

    /// The group coordinator's settings.
    fn coordinator_config(&self) -> CoordinatorConfig {
        CoordinatorConfig {
            initial_rebalance_delay: Duration::from_millis(self.group_initial_rebalance_delay_ms),
            min_session_timeout: Duration::from_millis(self.group_min_session_timeout_ms),
            max_session_timeout: Duration::from_millis(self.group_max_session_timeout_ms),
            compact_min_records: self.group_offsets_compact_min_records.max(1),
            lag: LagConfig {
                interval: Duration::from_millis(self.group_lag_interval_ms),
                per_partition: self.group_lag_per_partition,
                max_partition_series: self.group_lag_max_partition_series,
            },
            consumer: ConsumerConfig {
                session_timeout: Duration::from_millis(
                    self.group_consumer_session_timeout_ms.max(1),
                ),
                heartbeat_interval: Duration::from_millis(
                    self.group_consumer_heartbeat_interval_ms.max(1),
                ),
                default_assignor: if self.group_consumer_assignor == "range" {
                    "range"
                } else {
                    "uniform"
                },
            },
        }
    }

    /// The server's configuration from the flags.
    pub fn into_config(self) -> ServerConfig {
        let groups = self.coordinator_config();
        let cores = self
            .cores
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let advertised_host = self.advertised_host.clone().unwrap_or_else(|| {
            self.listeners
                .first()
                .map_or(self.listen, |(_, addr)| *addr)
                .ip()
                .to_string()
        });
        let (log, fetch_sessions) = (self.log_config(), self.fetch_session_config());
        ServerConfig {
            http_listen: self.http.http_listen,
            http_tls: self.http.http_tls,
            http: self.http.clone().into_config(),
            listen: self.listen,
            listeners: self.listeners,
            admin: self.admin,
            cores,
            bind_retry: Duration::from_millis(self.bind_retry_ms),
            admin_token_file: self.admin_token_file,
            admin_tls: self.admin_tls,
            metrics_listen: self.metrics_listen,
            metrics_per_partition: self.metrics_per_partition,
            broker: BrokerConfig {
                data_dir: self.data_dir,
                advertised_host,
                auto_create_topics: self.auto_create_topics,
                default_partitions: self.default_partitions,
                max_request_bytes: self.max_request_bytes,
                log,
                producers: ProducerConfig {
                    expiration: Duration::from_millis(self.producer_id_expiration_ms),
                    max_producers: self.max_producers_per_partition.max(1),
                },
                tail_cache_bytes: self.tail_cache_bytes,
                fetch_coalescing: self.fetch_coalescing,
                replicas: ReplicaConfig {
                    policy: self.read_replicas,
                    min_consumers: self.read_replica_min_consumers,
                },
                fetch_cache_bytes: self.fetch_cache_bytes,
                fetch_response_budget_bytes: self.fetch_response_budget_bytes,
                fetch_sessions,
                max_open_files_per_core: self.max_open_files_per_core,
                fetch_pacing: PacingConfig {
                    max_delay: Duration::from_millis(self.fetch_pacing_max_ms),
                    target_busy: f64::from(self.fetch_pacing_target_busy_percent) / 100.0,
                },
                views: ViewConfig {
                    window_bytes: self.view_window_bytes,
                    max_delta_for_fanout: self.max_delta_for_fanout.max(0),
                    idle_stop: Duration::from_millis(self.view_idle_stop_ms),
                    shared: self.view_sharing,
                    ..Default::default()
                },
                groups,
                transactions: TxnConfig {
                    max_timeout_ms: self.transaction_max_timeout_ms.max(1),
                    id_expiration: Duration::from_millis(self.transactional_id_expiration_ms),
                    timeout_check_interval: Duration::from_millis(
                        self.transaction_timeout_check_interval_ms.max(10),
                    ),
                    ..TxnConfig::default()
                },
                auth: AuthConfig {
                    sasl: self.sasl_mechanisms,
                    tls: self.tls_cert.zip(self.tls_key).map(|(cert, key)| {
                        shoal::auth::tls::TlsConfig {
                            cert,
                            key,
                            client_ca: self.tls_client_ca,
                            kernel: self.tls_kernel == "auto",
                        }
                    }),
                    failed_delay: Duration::from_millis(self.failed_authentication_delay_ms),
                    max_failures_per_minute: self.max_failed_authentications_per_minute.max(1),
                    timeout: Duration::from_millis(self.sasl_authentication_timeout_ms.max(1)),
                },
                authorizer: AuthorizerConfig {
                    enabled: self.authorizer == "acl",
                    super_users: self.super_users,
                    allow_if_no_acl: self.allow_everyone_if_no_acl_found,
                },
                edge: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> Result<ServerConfig, String> {
        serve_config(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn size_flags_take_units_like_the_bench() {
        let c = serve(&[
            "--segment-bytes",
            "64MiB",
            "--tail-cache-bytes",
            "1GiB",
            "--retention-bytes",
            "10GB",
            "--max-batch-bytes",
            "1048588",
            "--fetch-cache-bytes",
            "16k",
        ])
        .unwrap();
        assert_eq!(c.broker.log.segment_bytes, 64 << 20);
        assert_eq!(c.broker.tail_cache_bytes, 1 << 30);
        assert_eq!(c.broker.log.retention_bytes, Some(10_000_000_000));
        assert_eq!(c.broker.log.max_batch_bytes, 1_048_588);
        assert_eq!(c.broker.fetch_cache_bytes, 16 << 10);
        let d = serve(&["--retention-bytes", "-1"]).unwrap();
        assert_eq!(d.broker.log.retention_bytes, None);
        assert!(serve(&["--segment-bytes", "64 furlongs"]).is_err());
    }

    #[test]
    fn super_users_are_separated_by_semicolons() {
        let users = |args: &[&str]| serve(args).map(|c| c.broker.authorizer.super_users);
        assert_eq!(
            users(&["--super-users", "User:admin; User:CN=alice,O=acme"]).unwrap(),
            ["User:admin", "User:CN=alice,O=acme"]
        );
        assert_eq!(
            users(&["--super-users", "User:a", "--super-users", "User:b;User:c"]).unwrap(),
            ["User:a", "User:b", "User:c"]
        );
        // An escaped comma in a certificate's subject is not taken for a separator.
        assert_eq!(
            users(&["--super-users", r"User:CN=Smith\, John,O=acme"]).unwrap(),
            [r"User:CN=Smith\, John,O=acme"]
        );
        assert!(users(&[]).unwrap().is_empty());
        for (bad, says) in [
            ("User:a,User:b", "`User:a;User:b`"),
            ("User:CN=alice,O=acme, Group:x", "Separate them with `;`"),
            ("User:a;;User:b", "an empty entry"),
            ("User:a;", "an empty entry"),
            ("", "an empty entry"),
            ("alice", "not a principal"),
            ("user:alice", "case-sensitive"),
            ("Group:admins", "all `User:<name>`"),
            ("User:", "no name"),
        ] {
            let e = users(&["--super-users", bad]).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn defaults() {
        let c = serve(&[]).unwrap();
        assert_eq!(c.broker.data_dir, PathBuf::from("./shoal-data"));
        assert_eq!(c.broker.advertised_host, "127.0.0.1");
        assert_eq!(c.listen.port(), 9092);
        assert_eq!(c.bind_retry, Duration::from_secs(10));
        assert_eq!(c.broker.log.segment_bytes, 256 << 20);
        assert!(c.cores >= 1);
    }
}
