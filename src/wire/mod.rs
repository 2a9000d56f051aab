//! The Kafka wire format shared by the broker, the load generator and the tests: size-prefixed
//! frames, request and response headers, the hand-written FetchResponse codec, and the TCP stream (plain or
//! TLS) a reader and a writer task share.

pub mod fetch;
pub mod frame;
pub mod header;
mod stream;

pub use stream::SharedStream;
