pub mod batch;
mod chunk;
pub mod config;
pub mod error;
mod index;
pub mod log;
pub mod monitor;
pub mod records;
mod segment;
pub mod tail_cache;

pub use crate::config::LogConfig;
pub use crate::error::{Error, InvalidBatch, Result};
pub use crate::log::{AppendOptions, AppendResult, Log, LogStats};
pub use crate::monitor::OffsetMonitor;
pub use crate::records::{LogRead, Records};
pub use crate::tail_cache::{TailCache, TailCacheStats};
