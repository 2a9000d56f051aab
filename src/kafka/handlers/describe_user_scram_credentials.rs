//! DescribeUserScramCredentials (KIP-554, `kafka-configs.sh --describe --entity-type users`): the
//! SCRAM mechanisms and iteration counts of the users asked for (null or empty: all). Needs DESCRIBE on the
//! cluster. Never shows salts or keys.

use super::{frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    ApiKey, DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DescribeUserScramCredentials,
    min: 0,
    max: 0,
};

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: DescribeUserScramCredentialsRequest = decode(req)?;
    let response = DescribeUserScramCredentialsResponse::default();
    if !who.may_cluster(core, Operation::Describe) {
        core.metrics.error(req.api_key);
        let denied = response
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            .with_error_message(Some(StrBytes::from_static_str("not authorized")));
        return Ok(frame(ApiKey::DescribeUserScramCredentials, req, &denied));
    }
    let store = core.security.users.current().await;
    let listed = store.list();
    let result = |user: &str| {
        let r = DescribeUserScramCredentialsResult::default()
            .with_user(StrBytes::from_string(user.to_string()));
        match listed.iter().find(|(u, _)| u == user) {
            Some((_, creds)) => r.with_credential_infos(
                creds
                    .iter()
                    .map(|(m, iterations)| {
                        CredentialInfo::default()
                            .with_mechanism(m.code())
                            .with_iterations(*iterations as i32)
                    })
                    .collect(),
            ),
            None => r
                .with_error_code(ResponseError::ResourceNotFound.code())
                .with_error_message(Some(StrBytes::from_string(format!(
                    "no SCRAM credentials for user {user}"
                )))),
        }
    };
    // Null or empty: every user (as Kafka reads it).
    let results: Vec<DescribeUserScramCredentialsResult> = match &request.users {
        None => listed.iter().map(|(u, _)| result(u)).collect(),
        Some(users) if users.is_empty() => listed.iter().map(|(u, _)| result(u)).collect(),
        Some(users) => {
            let mut seen = std::collections::HashSet::new();
            users
                .iter()
                .map(|u| {
                    if !seen.insert(u.name.as_str()) {
                        return DescribeUserScramCredentialsResult::default()
                            .with_user(u.name.clone())
                            .with_error_code(ResponseError::DuplicateResource.code())
                            .with_error_message(Some(StrBytes::from_static_str(
                                "user named twice",
                            )));
                    }
                    result(u.name.as_str())
                })
                .collect()
        }
    };
    super::count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::DescribeUserScramCredentials,
        req,
        &response.with_results(results),
    ))
}
