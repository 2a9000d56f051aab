//! ApiVersions: the APIs and versions shoal serves, derived from the handlers' declarations, and
//! (v3) the features: `group.version` 1, the consumer group protocol (KIP-848), supported and
//! finalized as in Kafka 4.

use super::{frame, frame_at, HandlerResult, Reply, Versions, APIS};
use crate::wire::header::Request;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};
use kafka_protocol::protocol::StrBytes;

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
        .with_supported_features(vec![SupportedFeatureKey::default()
            .with_name(StrBytes::from_static_str(GROUP_VERSION))
            .with_min_version(0)
            .with_max_version(1)])
        .with_finalized_features_epoch(0)
        .with_finalized_features(vec![FinalizedFeatureKey::default()
            .with_name(StrBytes::from_static_str(GROUP_VERSION))
            .with_min_version_level(1)
            .with_max_version_level(1)])
}

/// The feature whose level 1 is the consumer group protocol.
const GROUP_VERSION: &str = "group.version";

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
