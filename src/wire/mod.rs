//! The Kafka wire format shared by the broker, the load generator and the tests: size-prefixed
//! frames, request and response headers, the hand-written FetchResponse codec, and the TCP stream (plain or
//! TLS) a reader and a writer task share, with kernel TLS ([`ktls`]) where the kernel offers it.

pub mod fetch;
pub mod frame;
pub mod header;
pub mod ktls;
mod stream;

pub use stream::SharedStream;
