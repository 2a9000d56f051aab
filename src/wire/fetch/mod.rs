//! FetchResponse by hand, both ways: the broker's zero-copy encoder and the load generator's
//! streaming decoder. Control-plane messages go through `kafka-protocol` instead.

pub mod decode;
pub mod encode;
