//! ApiVersions: the APIs and versions shoal serves, derived from the handlers' declarations.

use super::{frame, frame_at, HandlerResult, Reply, Versions, APIS};
use crate::wire::header::Request;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

pub const VERSIONS: Versions = Versions {
    key: ApiKey::ApiVersions,
    min: 0,
    max: 3,
};

fn response(error: i16) -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(error)
        .with_api_keys(
            APIS.iter()
                .map(|v| {
                    ApiVersion::default()
                        .with_api_key(v.key as i16)
                        .with_min_version(v.min)
                        .with_max_version(v.max)
                })
                .collect(),
        )
}

pub fn handle(req: &Request) -> HandlerResult {
    // The body (client software name and version, v3) is informational; a malformed one is no reason
    // to refuse the client its version list.
    Ok(frame(ApiKey::ApiVersions, req, &response(0)))
}

/// KIP-511: a client that asks with a version we do not serve gets a v0 response with
/// UNSUPPORTED_VERSION and our ranges, and retries with a version we do.
pub fn unsupported_version(req: &Request) -> Reply {
    let body = response(ResponseError::UnsupportedVersion.code());
    frame_at(ApiKey::ApiVersions, 0, req.correlation_id, &body)
}
