//! The `shoal` binary: parses the command line and runs the chosen command, the broker (the `shoal`
//! library), the load generator (`bench`) or an operator command (`tools`: `topic`, `group`,
//! `cluster`, `acl`, `user` over the protocol, `produce`, `consume`),
//! the last two part of this binary only, sharing its Kafka client (`client`).

mod bench;
mod cli;
mod client;
mod tools;
mod units;

use clap::Parser;
use cli::{Cli, Command};

#[global_allocator]
static ALLOC: shoal::alloc_guard::GuardedAllocator = shoal::alloc_guard::GuardedAllocator;

fn main() {
    let cli = Cli::parse();
    // The load generator's embedded broker logs only what needs attention.
    let level = match cli.command {
        Command::Bench(_)
        | Command::User(_)
        | Command::Topic(_)
        | Command::Group(_)
        | Command::Cluster(_)
        | Command::Acl(_)
        | Command::Produce(_)
        | Command::Consume(_) => "warn",
        Command::Serve(_) | Command::Edge(_) => "info",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    if !matches!(
        cli.command,
        Command::Serve(_) | Command::Edge(_) | Command::Bench(_)
    ) {
        // A command whose reader has gone (`shoal topic list | head`) ends as `cat` would, by
        // SIGPIPE, rather than panicking in `println!`. Its sockets are unaffected: the standard
        // library sends with MSG_NOSIGNAL. Brokers (serve, edge, the bench's embedded one) keep
        // the signal ignored.
        // SAFETY: no other thread runs yet, and SIG_DFL is a valid disposition.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Serve(args) => shoal::server::run(args.into_config()),
        Command::Edge(args) => shoal::server::run(args.into_config()),
        Command::Bench(cmd) => bench::run(cmd, cli::serve_config),
        Command::User(cmd) => cli::run_user(cmd).map_err(std::io::Error::other),
        Command::Topic(cmd) => tools::run_topic(cmd).map_err(std::io::Error::other),
        Command::Group(cmd) => tools::run_group(cmd).map_err(std::io::Error::other),
        Command::Cluster(cmd) => tools::run_cluster(cmd).map_err(std::io::Error::other),
        Command::Acl(cmd) => tools::run_acl(cmd).map_err(std::io::Error::other),
        Command::Produce(cmd) => tools::run_produce(cmd).map_err(std::io::Error::other),
        Command::Consume(cmd) => tools::run_consume(cmd).map_err(std::io::Error::other),
    };
    if let Err(e) = result {
        eprintln!("shoal: {e}");
        std::process::exit(1);
    }
}
