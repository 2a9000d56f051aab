//! The Kafka front end: connections and one handler module per API (framing and headers are
//! [`crate::wire`]'s).
//!
//! ## Layout, top layer first
//! - [`connection`]   — one client connection: TLS, authentication, then requests handled
//!   concurrently in their task queues.
//! - `authenticate`   — SASL before any other request (handshake, PLAIN and SCRAM exchanges).
//! - `requests`       — the next request off the wire; responses written in request order.
//! - [`handlers`]     — one module per API and the dispatcher, derived from their declared versions.
//! - [`leaders`]      — which core a client is sent to for a partition (owner or read replica).
//! - [`session`]      — who a connection is and what it may do (principal, ACL decisions).
//! - [`upstream`]     — the front end's one seam to edge mode.
//! - [`errors`]       — engine errors as Kafka error codes.
//! - `fault`          — faults injected by tests (`SHOAL_FAULT`), off in production.

mod authenticate;
pub mod connection;
pub mod errors;
mod fault;
pub mod handlers;
pub mod leaders;
mod requests;
pub mod session;
pub mod upstream;
