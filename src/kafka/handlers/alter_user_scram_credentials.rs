//! AlterUserScramCredentials (KIP-554, `kafka-configs.sh --alter --add-config
//! 'SCRAM-SHA-256=[password=...]' --entity-type users`): sets or removes users' SCRAM credentials in
//! the users file, which every core reads again at its next authentication. The client sends the
//! salted password, never the password. Needs ALTER on the cluster.

use super::{frame, HandlerResult, Versions};
use crate::auth::scram::{Credential, Mechanism, MAX_ITERATIONS, MIN_ITERATIONS};
use crate::auth::users::{validate_user_name, CredentialChange, UserStore};
use crate::cores::Core;
use crate::kafka::session::Session;
use crate::table::acl::Operation;
use crate::wire::header::{decode, Request};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, ApiKey,
};
use kafka_protocol::protocol::StrBytes;

pub const VERSIONS: Versions = Versions {
    key: ApiKey::AlterUserScramCredentials,
    min: 0,
    max: 0,
};

type Refusal = (ResponseError, String);

fn mechanism(code: i8) -> Result<Mechanism, Refusal> {
    Mechanism::from_code(code).ok_or_else(|| {
        (
            ResponseError::UnsupportedSaslMechanism,
            format!("mechanism {code} (SCRAM-SHA-256 is 1, SCRAM-SHA-512 2)"),
        )
    })
}

pub async fn handle(core: &Core, req: &Request, who: &Session) -> HandlerResult {
    let request: AlterUserScramCredentialsRequest = decode(req)?;
    let allowed = who.may_cluster(core, Operation::Alter);
    // One result per user named, in order of first mention; a user changed twice for the same
    // mechanism in one request is refused, as Kafka does.
    let mut users: Vec<(String, Option<Refusal>)> = Vec::new();
    let mut changes: Vec<(usize, CredentialChange)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut note = |name: &str| -> usize {
        match users.iter().position(|(u, _)| u == name) {
            Some(i) => i,
            None => {
                users.push((name.to_string(), None));
                users.len() - 1
            }
        }
    };
    let mut planned: Vec<(usize, Result<CredentialChange, Refusal>)> = Vec::new();
    for d in &request.deletions {
        let i = note(&d.name);
        let change =
            mechanism(d.mechanism).map(|m| CredentialChange::Remove(d.name.to_string(), m));
        planned.push((
            i,
            change.and_then(|c| dedupe(&mut seen, &d.name, d.mechanism, c)),
        ));
    }
    for u in &request.upsertions {
        let i = note(&u.name);
        let change = mechanism(u.mechanism).and_then(|m| {
            validate_user_name(&u.name)
                .map_err(|why| (ResponseError::UnacceptableCredential, why))?;
            let iterations = u32::try_from(u.iterations)
                .ok()
                .filter(|i| (MIN_ITERATIONS..=MAX_ITERATIONS).contains(i))
                .ok_or_else(|| {
                    (
                        ResponseError::UnacceptableCredential,
                        format!("iterations must be {MIN_ITERATIONS} to {MAX_ITERATIONS}"),
                    )
                })?;
            if u.salt.is_empty() || u.salted_password.is_empty() {
                return Err((
                    ResponseError::UnacceptableCredential,
                    "salt and salted password are required".into(),
                ));
            }
            Ok(CredentialChange::Set(
                u.name.to_string(),
                m,
                Credential::from_salted_password(m, &u.salt, iterations, &u.salted_password),
            ))
        });
        planned.push((
            i,
            change.and_then(|c| dedupe(&mut seen, &u.name, u.mechanism, c)),
        ));
    }
    for (i, change) in planned {
        match change {
            _ if !allowed => {
                users[i].1 = Some((
                    ResponseError::ClusterAuthorizationFailed,
                    "not authorized".into(),
                ))
            }
            Ok(c) => changes.push((i, c)),
            Err(refusal) => {
                users[i].1.get_or_insert(refusal);
            }
        }
    }
    // A user with any refused change changes nothing.
    changes.retain(|(i, _)| users[*i].1.is_none());
    if !changes.is_empty() {
        let path = core.security.users.path().to_path_buf();
        let list: Vec<CredentialChange> = changes.iter().map(|(_, c)| c.clone()).collect();
        let applied = glommio::executor()
            .spawn_blocking(move || UserStore::change_file(&path, &list))
            .await;
        match applied {
            Err(e) => {
                log::error!("could not write the users file: {e}");
                for (i, _) in &changes {
                    users[*i].1 = Some((ResponseError::KafkaStorageError, e.to_string()));
                }
            }
            Ok(applied) => {
                for ((i, c), done) in changes.iter().zip(applied) {
                    match c {
                        CredentialChange::Remove(user, m) if !done => {
                            users[*i].1.get_or_insert((
                                ResponseError::ResourceNotFound,
                                format!("user {user} has no {} credential", m.name()),
                            ));
                        }
                        CredentialChange::Remove(user, m) => {
                            log::info!("{} removed {user}'s {} credential", who.principal, m.name())
                        }
                        CredentialChange::Set(user, m, _) => {
                            log::info!("{} set {user}'s {} credential", who.principal, m.name())
                        }
                    }
                }
            }
        }
    }
    let results: Vec<AlterUserScramCredentialsResult> = users
        .into_iter()
        .map(|(user, refusal)| {
            let r =
                AlterUserScramCredentialsResult::default().with_user(StrBytes::from_string(user));
            match refusal {
                None => r,
                Some((e, why)) => r
                    .with_error_code(e.code())
                    .with_error_message(Some(StrBytes::from_string(why))),
            }
        })
        .collect();
    super::count_errors(core, req, results.iter().map(|r| r.error_code));
    Ok(frame(
        ApiKey::AlterUserScramCredentials,
        req,
        &AlterUserScramCredentialsResponse::default().with_results(results),
    ))
}

/// Refuses a second change of the same user and mechanism in one request.
fn dedupe(
    seen: &mut std::collections::HashSet<(String, i8)>,
    user: &str,
    mechanism: i8,
    change: CredentialChange,
) -> Result<CredentialChange, Refusal> {
    if seen.insert((user.to_string(), mechanism)) {
        Ok(change)
    } else {
        Err((
            ResponseError::DuplicateResource,
            "a user's credential for one mechanism is changed twice".into(),
        ))
    }
}
