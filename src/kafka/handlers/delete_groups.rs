//! DeleteGroups: a group without members is removed with its committed offsets (tombstones in the
//! offsets log); a group with members gets `NON_EMPTY_GROUP`, an unknown one `GROUP_ID_NOT_FOUND`.

use super::{count_errors, frame, HandlerResult, Versions};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse};

pub const VERSIONS: Versions = Versions {
    key: ApiKey::DeleteGroups,
    min: 0,
    max: 2,
};

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: DeleteGroupsRequest = decode(req)?;
    let mut results = Vec::new();
    for id in &request.groups_names {
        let error = if who.may_group(core, Operation::Delete, id) {
            core.groups().delete(id).await.err()
        } else {
            Some(kafka_protocol::error::ResponseError::GroupAuthorizationFailed)
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(id.clone())
                .with_error_code(error.map_or(0, |e| e.code())),
        );
    }
    count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::DeleteGroups,
        req,
        &DeleteGroupsResponse::default().with_results(results),
    ))
}
