//! The Kafka front end: framing, connections, request headers, and one handler module per API.

pub mod connection;
pub mod errors;
pub mod frame;
pub mod handlers;
pub mod header;
