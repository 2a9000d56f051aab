//! SaslHandshake: the client names its SASL mechanism. Answered by the connection while it is
//! authenticating (`kafka::authenticate`); here, once it is done or on a listener without SASL,
//! it is out of place: `ILLEGAL_SASL_STATE`, as Kafka answers. v1's tokens travel in
//! SaslAuthenticate requests; v0's (old clients) as bare size-prefixed frames after it.

use super::{frame, HandlerResult, Versions};
use crate::auth::sasl::ILLEGAL_SASL_STATE;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::{ApiKey, SaslHandshakeRequest, SaslHandshakeResponse};

pub const VERSIONS: Versions = Versions {
    key: ApiKey::SaslHandshake,
    min: 0,
    max: 1,
};

pub fn handle(req: &Request) -> HandlerResult {
    let _: SaslHandshakeRequest = decode(req)?;
    Ok(frame(
        ApiKey::SaslHandshake,
        req,
        &SaslHandshakeResponse::default().with_error_code(ILLEGAL_SASL_STATE),
    ))
}
