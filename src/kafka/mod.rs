//! The Kafka front end: connections and one handler module per API (framing and headers are
//! [`crate::wire`]'s).

mod authenticate;
pub mod connection;
pub mod errors;
mod fault;
pub mod handlers;
pub mod leaders;
mod requests;
pub mod session;
pub mod upstream;
