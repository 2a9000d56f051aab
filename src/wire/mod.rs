//! The Kafka wire format shared by the broker, the load generator and the tests: size-prefixed
//! frames, request and response headers, the hand-written FetchResponse codec, and the TCP stream (plain or
//! TLS) a reader and a writer task share, with kernel TLS ([`ktls`]) where the kernel offers it;
//! the [`requests`] several clients build.

//!
//! ## Layout, top layer first
//! - [`fetch`]    — the FetchResponse codec, hand-written (shared record bytes, no copies).
//! - [`requests`] — requests more than one client builds.
//! - [`frame`]    — size-prefixed frames, read with a bound.
//! - [`header`]   — request and response headers.
//! - `stream`     — the TCP stream (plain or TLS) a reader and a writer task share.
//! - [`ktls`]     — kernel TLS where the kernel offers it.

pub mod fetch;
pub mod frame;
pub mod header;
pub mod ktls;
pub mod requests;
mod stream;

pub use stream::SharedStream;

/// The highest version of an API both sides speak: the peer serves `theirs` (its ApiVersions
/// answer's min and max), this side `ours`; `None` when the ranges do not meet.
pub fn common_version(theirs: (i16, i16), ours: (i16, i16)) -> Option<i16> {
    let v = theirs.1.min(ours.1);
    (v >= theirs.0.max(ours.0)).then_some(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_common_version_is_the_highest_both_speak() {
        use super::common_version;
        assert_eq!(common_version((0, 12), (4, 9)), Some(9));
        assert_eq!(common_version((0, 7), (4, 9)), Some(7));
        assert_eq!(common_version((5, 7), (5, 5)), Some(5));
        assert_eq!(common_version((0, 3), (4, 9)), None);
        assert_eq!(common_version((10, 12), (4, 9)), None);
    }
}
