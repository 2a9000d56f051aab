//! The operator commands (`shoal topic`, `shoal group`, `shoal cluster`, `shoal acl`, `shoal user`
//! over the protocol, `shoal produce`, `shoal consume`): a Kafka admin client for any
//! Kafka-compatible broker, over the binary's shared client (`crate::client`).
//!
//! ## Layout, top layer first
//! - [`consume`]   — `shoal consume`: records to standard output, with its flags.
//! - [`records`]   — fetched batches decoded and records printed by template or as JSON.
//! - [`committed`] — a group's committed offsets, for `consume --group`.
//! - [`produce`]   — `shoal produce`: records from standard input, with its flags.
//! - [`user`]      — `shoal user` over the protocol: SCRAM users, with their flags.
//! - [`acl`]       — `shoal acl`: ACLs in Kafka's codes, with their flags.
//! - [`cluster`]   — `shoal cluster info`: brokers, controller, cluster id, API versions.
//! - [`group`]     — `shoal group`: consumer groups on any Kafka-compatible broker.
//! - [`topic`]     — `shoal topic`: create, delete, grow, configure, list.
//! - [`describe`]  — `shoal topic describe`: partitions, leaders, offsets, configs.
//! - [`offsets`]   — ListOffsets at each partition's leader (log start, high watermark, last
//!   stable offset, offset for a time).
//! - [`session`]   — the connection to the cluster (bootstrap, metadata, controller, leaders).
//! - [`output`]    — tables for people, JSON for scripts.
//! - [`failure`]   — Kafka errors by name, with a hint.
//! - [`args`]      — the connection and output flags every command takes.

pub mod acl;
pub mod args;
mod cluster;
mod committed;
pub mod consume;
mod describe;
mod failure;
mod group;
mod offsets;
mod output;
pub mod produce;
mod records;
mod session;
mod topic;
pub mod user;

pub use acl::AclCommand;
pub use args::{ClusterCommand, TopicCommand};
pub use consume::ConsumeCommand;
pub use failure::Failure;
pub use group::args::GroupCommand;
pub use produce::ProduceCommand;
pub use user::{parse_scram, UserAction, UserCreate, UserDelete, UserList};

/// Runs `shoal topic ...`.
pub fn run_topic(cmd: TopicCommand) -> Result<(), Failure> {
    let session = session::Session::open(&cmd.client)?;
    let report = topic::run(&session, cmd.action)?;
    report.print(cmd.client.format);
    Ok(())
}

/// Runs `shoal group ...`.
pub fn run_group(cmd: GroupCommand) -> Result<(), Failure> {
    let session = session::Session::open(&cmd.client)?;
    let report = group::run(&session, cmd.action)?;
    report.print(cmd.client.format);
    Ok(())
}

/// Runs `shoal cluster ...`.
pub fn run_cluster(cmd: ClusterCommand) -> Result<(), Failure> {
    let session = session::Session::open(&cmd.client)?;
    let report = cluster::run(&session, cmd.action)?;
    report.print(cmd.client.format);
    Ok(())
}

/// Runs `shoal acl ...`.
pub fn run_acl(cmd: AclCommand) -> Result<(), Failure> {
    let session = session::Session::open(&cmd.client)?;
    let report = acl::run(&session, cmd.action)?;
    report.print(cmd.client.format);
    Ok(())
}

/// Runs `shoal user create | delete | list` over the Kafka protocol.
pub fn run_user(action: UserAction) -> Result<(), Failure> {
    let session = session::Session::open(action.client())?;
    let format = action.client().format;
    let report = user::run(&session, action)?;
    report.print(format);
    Ok(())
}

/// Runs `shoal produce ...`.
pub fn run_produce(cmd: ProduceCommand) -> Result<(), Failure> {
    let session = session::Session::open(&cmd.client)?;
    let report = produce::run(&session, &cmd)?;
    report.print(cmd.client.format);
    Ok(())
}

/// Runs `shoal consume ...`.
pub fn run_consume(cmd: ConsumeCommand) -> Result<(), Failure> {
    let session = session::Session::open(&cmd.args.client)?;
    consume::run(&session, &cmd)
}
