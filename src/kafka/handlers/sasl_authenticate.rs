//! SaslAuthenticate: one token of the SASL exchange. Answered by the connection while it is
//! authenticating (`kafka::authenticate`); here, once it is done or on a listener without SASL,
//! it is out of place: `ILLEGAL_SASL_STATE` (re-authentication, KIP-368, is not offered).

use super::{frame, HandlerResult, Versions};
use crate::auth::sasl::ILLEGAL_SASL_STATE;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::{ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::SaslAuthenticate,
    min: 0,
    max: 2,
};

pub fn handle(req: &Request) -> HandlerResult {
    let _: SaslAuthenticateRequest = decode(req)?;
    Ok(frame(
        ApiKey::SaslAuthenticate,
        req,
        &SaslAuthenticateResponse::default()
            .with_error_code(ILLEGAL_SASL_STATE)
            .with_error_message(Some(StrBytes::from_static_str(
                "already authenticated, or this listener does not use SASL",
            ))),
    ))
}
