//! The operator commands (`shoal topic`, `shoal group`, `shoal cluster`): a Kafka admin client for any
//! Kafka-compatible broker, over the binary's shared client (`crate::client`).
//!
//! - [`args`]: the connection and output flags every command takes;
//! - [`session`]: the connection to the cluster (bootstrap, metadata, controller, leaders);
//! - [`failure`]: Kafka errors by name, with a hint;
//! - [`output`]: tables for people, JSON for scripts;
//! - [`offsets`]: ListOffsets at each partition's leader (log start, high watermark, last stable
//!   offset, offset for a time);
//! - [`topic`], [`describe`], [`group`], [`cluster`]: the commands.

pub mod args;
mod cluster;
mod describe;
mod failure;
mod group;
mod offsets;
mod output;
mod session;
mod topic;

pub use args::{ClusterCommand, TopicCommand};
pub use failure::Failure;
pub use group::args::GroupCommand;

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
