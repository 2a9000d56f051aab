//! The flags of `shoal topic` and `shoal cluster`: where the cluster is, how to authenticate to
//! it, how long to wait, and how to print.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns, for people.
    Table,
    /// One JSON document, for scripts.
    Json,
}

/// How to reach and authenticate to the cluster, and how to print.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Bootstrap broker(s), `host:port`, comma-separated; the first that answers is used.
    #[arg(short = 'b', long, global = true, default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// Use TLS, trusting this CA certificate (PEM).
    #[arg(long, global = true)]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs --tls-key and --tls-ca.
    #[arg(long, global = true, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Authenticate with SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; needs --user.
    #[arg(long, global = true, value_parser = parse_mechanism, requires = "user")]
    pub sasl_mechanism: Option<shoal::auth::SaslMechanism>,
    /// The SASL user.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// A file whose first line is the SASL password; without it, the environment variable
    /// SHOAL_PASSWORD (a password is never taken from the command line).
    #[arg(long, global = true)]
    pub password_file: Option<PathBuf>,
    /// How long to wait for a connection or an answer before giving up (e.g. 10s, 500ms).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Output: a table for people, or JSON for scripts.
    #[arg(long, global = true, value_enum, default_value = "table")]
    pub format: Format,
}

fn parse_mechanism(s: &str) -> Result<shoal::auth::SaslMechanism, String> {
    shoal::auth::SaslMechanism::from_name(s)
        .ok_or_else(|| format!("{s}: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"))
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s}: a duration such as 10s or 500ms"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("{s}: a duration such as 10s or 500ms")),
    };
    if d.is_zero() {
        return Err("the timeout must be above zero".into());
    }
    Ok(d)
}

/// `key=value`, a topic config.
pub fn parse_config(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s}: key=value"))
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  shoal topic create clicks --partitions 12 -c retention.ms=86400000\n  \
    shoal topic describe clicks --format json\n  \
    SHOAL_PASSWORD=... shoal topic list -b host:9093 --tls-ca ca.pem --sasl-mechanism SCRAM-SHA-256 --user admin"
)]
pub struct TopicCommand {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: TopicAction,
}

#[derive(Debug, Subcommand)]
pub enum TopicAction {
    /// Creates a topic. Example: `shoal topic create clicks --partitions 12 -c cleanup.policy=compact`
    Create {
        name: String,
        #[arg(short, long)]
        partitions: i32,
        /// Replicas per partition; -1: the broker's default.
        #[arg(short, long, default_value_t = -1, allow_negative_numbers = true)]
        replication_factor: i16,
        /// A topic config, `key=value`; repeat for more.
        #[arg(short = 'c', long = "config", value_parser = parse_config)]
        configs: Vec<(String, String)>,
    },
    /// Lists the topics with their partition counts. Example: `shoal topic list --format json`
    List,
    /// A topic's partitions (leader, replicas, ISR, high watermark, log start) and configs with
    /// their sources. Example: `shoal topic describe clicks`
    Describe { name: String },
    /// Sets or removes topic configs (others are kept). Example:
    /// `shoal topic alter-config clicks -c retention.ms=3600000 --delete-config segment.bytes`
    AlterConfig {
        name: String,
        /// A config to set, `key=value`; repeat for more.
        #[arg(short = 'c', long = "config", value_parser = parse_config)]
        configs: Vec<(String, String)>,
        /// A config to remove (back to its default); repeat for more.
        #[arg(long = "delete-config")]
        delete: Vec<String>,
    },
    /// Raises a topic's partition count to N. Example: `shoal topic add-partitions clicks --partitions 24`
    AddPartitions {
        name: String,
        /// The new total number of partitions.
        #[arg(short, long)]
        partitions: i32,
    },
    /// Deletes a topic and its data. Example: `shoal topic delete clicks`
    Delete { name: String },
}

#[derive(Debug, Args)]
#[command(after_help = "Example:\n  shoal cluster info -b 127.0.0.1:9092 --format json")]
pub struct ClusterCommand {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub action: ClusterAction,
}

#[derive(Debug, Subcommand)]
pub enum ClusterAction {
    /// Brokers (for shoal: its cores), the controller, the cluster id and the API versions the
    /// broker serves. Example: `shoal cluster info`
    Info,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_configs_parse() {
        assert_eq!(parse_timeout("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_timeout("3"), Ok(Duration::from_secs(3)));
        assert!(parse_timeout("0s").is_err());
        assert!(parse_timeout("ten").is_err());
        assert_eq!(
            parse_config("retention.ms=1=2"),
            Ok(("retention.ms".into(), "1=2".into()))
        );
        assert!(parse_config("=x").is_err());
        assert!(parse_config("novalue").is_err());
    }
}
