//! `shoal user create | list | delete` over the Kafka protocol (AlterUserScramCredentials and
//! DescribeUserScramCredentials, KIP-554), for any broker that serves them. The password is salted
//! and hashed here (a random salt, PBKDF2): only the salted password travels. The offline
//! `shoal user add | remove | list --data-dir`, which edits a data directory's users file, is in
//! `cli.rs`.

use super::args::ClientArgs;
use super::failure::Failure;
use super::output::done;
use super::output::{Report, Table};
use super::session::Session;
use clap::Args;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, ApiKey,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use shoal::auth::scram::{Mechanism, MAX_ITERATIONS, MIN_ITERATIONS};
use std::path::PathBuf;

/// The environment variable the new user's password may come from.
const NEW_PASSWORD_ENV: &str = "SHOAL_NEW_PASSWORD";

pub fn parse_scram(s: &str) -> Result<Mechanism, String> {
    Mechanism::from_name(s).ok_or_else(|| format!("{s}: SCRAM-SHA-256 or SCRAM-SHA-512"))
}

/// `shoal user create NAME`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  SHOAL_NEW_PASSWORD=... SHOAL_PASSWORD=... shoal user create \
    alice --mechanism SCRAM-SHA-512 -b host:9093 --tls-ca ca.pem --sasl-mechanism SCRAM-SHA-256 \
    --user admin"
)]
pub struct UserCreate {
    pub name: String,
    /// The SCRAM mechanism to store a credential for; repeatable.
    #[arg(long, value_parser = parse_scram, default_value = "SCRAM-SHA-256")]
    pub mechanism: Vec<Mechanism>,
    /// PBKDF2 iterations (4096 to 16384).
    #[arg(long, default_value_t = MIN_ITERATIONS)]
    pub iterations: u32,
    /// A file whose first line is the new user's password; without it, the environment variable
    /// SHOAL_NEW_PASSWORD (never the command line).
    #[arg(long)]
    pub new_password_file: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `shoal user delete NAME`.
#[derive(Debug, Args)]
#[command(after_help = "Example:\n  shoal user delete alice -b 127.0.0.1:9092")]
pub struct UserDelete {
    pub name: String,
    /// Only this mechanism's credential; repeatable (default: every credential the user has).
    #[arg(long, value_parser = parse_scram)]
    pub mechanism: Vec<Mechanism>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `shoal user list`: over the protocol, or offline with --data-dir.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  shoal user list -b 127.0.0.1:9092 --format json\n  \
    shoal user list --data-dir ./shoal-data"
)]
pub struct UserList {
    /// Read the users file of this data directory instead of asking a broker.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// What a protocol user command does.
#[derive(Debug)]
pub enum UserAction {
    Create(UserCreate),
    Delete(UserDelete),
    List(UserList),
}

impl UserAction {
    pub fn client(&self) -> &ClientArgs {
        match self {
            UserAction::Create(c) => &c.client,
            UserAction::Delete(d) => &d.client,
            UserAction::List(l) => &l.client,
        }
    }
}

#[derive(Debug, Serialize)]
struct CredentialInfo {
    mechanism: String,
    iterations: i32,
}

#[derive(Debug, Serialize)]
struct UserInfo {
    user: String,
    credentials: Vec<CredentialInfo>,
}

pub fn run(s: &Session, action: UserAction) -> Result<Report, Failure> {
    match action {
        UserAction::Create(c) => create(s, &c),
        UserAction::Delete(d) => delete(s, &d),
        UserAction::List(_) => list(s),
    }
}

/// The new user's password: the first line of --new-password-file, else $SHOAL_NEW_PASSWORD.
fn new_password(c: &UserCreate) -> Result<String, Failure> {
    let password = match &c.new_password_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| {
                Failure::usage(format!(
                    "reading --new-password-file {}: {e}",
                    path.display()
                ))
            })?
            .lines()
            .next()
            .unwrap_or("")
            .to_string(),
        None => std::env::var(NEW_PASSWORD_ENV).map_err(|_| {
            Failure::usage(format!(
                "the new user's password: --new-password-file FILE or the environment variable \
                 {NEW_PASSWORD_ENV}"
            ))
        })?,
    };
    if password.is_empty() {
        return Err(Failure::usage("the new user's password is empty"));
    }
    Ok(password)
}

fn create(s: &Session, c: &UserCreate) -> Result<Report, Failure> {
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&c.iterations) {
        return Err(Failure::usage(format!(
            "--iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}"
        )));
    }
    let password = new_password(c)?;
    let mut mechanisms = c.mechanism.clone();
    mechanisms.sort();
    mechanisms.dedup();
    let upsertions = mechanisms
        .iter()
        .map(|m| {
            let salt: [u8; 32] = rand::random();
            let salted = m.salted_password(password.as_bytes(), &salt, c.iterations);
            ScramCredentialUpsertion::default()
                .with_name(StrBytes::from_string(c.name.clone()))
                .with_mechanism(m.code())
                .with_iterations(c.iterations as i32)
                .with_salt(salt.to_vec().into())
                .with_salted_password(salted.into())
        })
        .collect();
    alter(
        s,
        AlterUserScramCredentialsRequest::default().with_upsertions(upsertions),
        &format!("creating user {}", c.name),
    )?;
    let names: Vec<&str> = mechanisms.iter().map(|m| m.name()).collect();
    Ok(done(
        format!("user {}: {} credentials stored", c.name, names.join(", ")),
        serde_json::json!({"user": c.name, "mechanisms": names, "iterations": c.iterations}),
    ))
}

fn delete(s: &Session, d: &UserDelete) -> Result<Report, Failure> {
    let mechanisms: Vec<Mechanism> = if d.mechanism.is_empty() {
        let users = describe(s, Some(&d.name))?;
        users
            .iter()
            .flat_map(|u| &u.credentials)
            .filter_map(|c| Mechanism::from_name(&c.mechanism))
            .collect()
    } else {
        d.mechanism.clone()
    };
    let deletions = mechanisms
        .iter()
        .map(|m| {
            ScramCredentialDeletion::default()
                .with_name(StrBytes::from_string(d.name.clone()))
                .with_mechanism(m.code())
        })
        .collect();
    alter(
        s,
        AlterUserScramCredentialsRequest::default().with_deletions(deletions),
        &format!("deleting user {}", d.name),
    )?;
    let names: Vec<&str> = mechanisms.iter().map(|m| m.name()).collect();
    Ok(done(
        format!("user {}: {} credentials deleted", d.name, names.join(", ")),
        serde_json::json!({"user": d.name, "deleted": names}),
    ))
}

fn alter(s: &Session, req: AlterUserScramCredentialsRequest, what: &str) -> Result<(), Failure> {
    let version = s.version(ApiKey::AlterUserScramCredentials, 0, 0)?;
    let r: AlterUserScramCredentialsResponse =
        s.call_controller(ApiKey::AlterUserScramCredentials, version, &req)?;
    for res in &r.results {
        Failure::check(res.error_code, what, res.error_message.as_deref())?;
    }
    Ok(())
}

/// The users (one, or all: `None`) with their mechanisms and iteration counts.
fn describe(s: &Session, user: Option<&str>) -> Result<Vec<UserInfo>, Failure> {
    let version = s.version(ApiKey::DescribeUserScramCredentials, 0, 0)?;
    let req = DescribeUserScramCredentialsRequest::default().with_users(
        user.map(|u| vec![UserName::default().with_name(StrBytes::from_string(u.to_string()))]),
    );
    let r: DescribeUserScramCredentialsResponse = s.call(
        s.bootstrap,
        ApiKey::DescribeUserScramCredentials,
        version,
        &req,
    )?;
    Failure::check(r.error_code, "listing users", r.error_message.as_deref())?;
    let mut out = Vec::new();
    for res in &r.results {
        Failure::check(
            res.error_code,
            &format!("user {}", res.user.as_str()),
            res.error_message.as_deref(),
        )
        .map_err(|mut f| {
            if f.name == "ResourceNotFound" {
                f.hint = "`shoal user list` shows the users there are";
            }
            f
        })?;
        out.push(UserInfo {
            user: res.user.to_string(),
            credentials: res
                .credential_infos
                .iter()
                .map(|c| CredentialInfo {
                    mechanism: Mechanism::from_code(c.mechanism)
                        .map_or_else(|| format!("UNKNOWN({})", c.mechanism), |m| m.name().into()),
                    iterations: c.iterations,
                })
                .collect(),
        });
    }
    out.sort_by(|a, b| a.user.cmp(&b.user));
    Ok(out)
}

fn list(s: &Session) -> Result<Report, Failure> {
    Ok(users_report(&describe(s, None)?))
}

/// `shoal user list --data-dir`: the users file's users, as the broker would list them.
pub fn list_offline(users: Vec<(String, Vec<(Mechanism, u32)>)>) -> Report {
    let users: Vec<UserInfo> = users
        .into_iter()
        .map(|(user, creds)| UserInfo {
            user,
            credentials: creds
                .into_iter()
                .map(|(m, iterations)| CredentialInfo {
                    mechanism: m.name().into(),
                    iterations: iterations.try_into().unwrap_or(i32::MAX),
                })
                .collect(),
        })
        .collect();
    users_report(&users)
}

fn users_report(users: &[UserInfo]) -> Report {
    let mut t = Table::new(None, vec!["USER", "MECHANISM", "ITERATIONS"]);
    for u in users {
        for c in &u.credentials {
            t.rows.push(vec![
                u.user.clone(),
                c.mechanism.clone(),
                c.iterations.to_string(),
            ]);
        }
    }
    Report {
        tables: vec![t],
        json: serde_json::to_value(users).expect("plain data serializes"),
    }
}
