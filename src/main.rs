//! The `shoal` binary: parses the command line and runs the chosen command.

use clap::Parser;
use shoal::cli::{Cli, Command};

#[global_allocator]
static ALLOC: shoal::alloc_guard::GuardedAllocator = shoal::alloc_guard::GuardedAllocator;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => shoal::server::run(args),
    };
    if let Err(e) = result {
        eprintln!("shoal: {e}");
        std::process::exit(1);
    }
}
