//! The users who may authenticate, and their SCRAM credentials (salted and hashed, as Kafka keeps
//! them: never a password), in `<data-dir>/users.json`. `shoal user add|remove|list` edits the file;
//! a running server reads it again when it changes, at the next authentication.

use super::scram::{Credential, Mechanism};
use super::watched::Watched;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const USERS_FILE: &str = "users.json";

/// Every user's credentials, by user and mechanism.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserStore {
    users: BTreeMap<String, BTreeMap<Mechanism, Credential>>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredCredential {
    salt: String,
    iterations: u32,
    stored_key: String,
    server_key: String,
}

/// Why a user name is refused.
pub fn validate_user_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 256 {
        return Err("a user name has 1 to 256 characters".into());
    }
    if name.chars().any(char::is_control) {
        return Err("a user name has no control characters".into());
    }
    Ok(())
}

impl UserStore {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(USERS_FILE)
    }

    /// The store in `path`; empty if there is no file.
    pub fn load(path: &Path) -> std::io::Result<Self> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e),
        };
        let raw: BTreeMap<String, BTreeMap<String, StoredCredential>> =
            serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
        let bad = |why: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {why}", path.display()),
            )
        };
        let mut users = BTreeMap::new();
        for (user, creds) in raw {
            let mut by_mech = BTreeMap::new();
            for (mech, c) in creds {
                let m = Mechanism::from_name(&mech)
                    .ok_or_else(|| bad(format!("unknown mechanism {mech} for {user}")))?;
                let b = |s: &str| {
                    B64.decode(s)
                        .map_err(|_| bad(format!("{user}/{mech}: not base64")))
                };
                by_mech.insert(
                    m,
                    Credential {
                        salt: b(&c.salt)?,
                        iterations: c.iterations,
                        stored_key: b(&c.stored_key)?,
                        server_key: b(&c.server_key)?,
                    },
                );
            }
            users.insert(user, by_mech);
        }
        Ok(Self { users })
    }

    /// Writes the store to `path` (readable by its owner only), whole: a crash leaves the old file
    /// or the new one.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let raw: BTreeMap<&str, BTreeMap<&str, StoredCredential>> = self
            .users
            .iter()
            .map(|(u, creds)| {
                let creds = creds
                    .iter()
                    .map(|(m, c)| {
                        (
                            m.name(),
                            StoredCredential {
                                salt: B64.encode(&c.salt),
                                iterations: c.iterations,
                                stored_key: B64.encode(&c.stored_key),
                                server_key: B64.encode(&c.server_key),
                            },
                        )
                    })
                    .collect();
                (u.as_str(), creds)
            })
            .collect();
        let bytes = serde_json::to_vec_pretty(&raw).expect("plain data serializes");
        if let Some(dir) = path.parent() {
            shards::files::create_dir_all_durable(dir)?;
        }
        shards::files::write_atomically(path, &bytes)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
    }

    pub fn credential(&self, user: &str, mechanism: Mechanism) -> Option<&Credential> {
        self.users.get(user)?.get(&mechanism)
    }

    /// Any credential of `user` (SASL/PLAIN checks a password against it).
    pub fn any_credential(&self, user: &str) -> Option<(Mechanism, &Credential)> {
        self.users.get(user)?.iter().next().map(|(m, c)| (*m, c))
    }

    pub fn set(&mut self, user: &str, mechanism: Mechanism, credential: Credential) {
        self.users
            .entry(user.to_string())
            .or_default()
            .insert(mechanism, credential);
    }

    /// Removes `user`'s credential for `mechanism`, or all of them; whether there was any.
    pub fn remove(&mut self, user: &str, mechanism: Option<Mechanism>) -> bool {
        let Some(creds) = self.users.get_mut(user) else {
            return false;
        };
        let removed = match mechanism {
            Some(m) => creds.remove(&m).is_some(),
            None => !std::mem::take(creds).is_empty(),
        };
        if creds.is_empty() {
            self.users.remove(user);
        }
        removed
    }

    /// Every user with the mechanisms and iteration counts of their credentials.
    pub fn list(&self) -> Vec<(String, Vec<(Mechanism, u32)>)> {
        self.users
            .iter()
            .map(|(u, c)| {
                (
                    u.clone(),
                    c.iter().map(|(m, c)| (*m, c.iterations)).collect(),
                )
            })
            .collect()
    }
}

/// Serializes changes of the users file by the Kafka APIs (AlterUserScramCredentials may arrive
/// on any core): held only by a blocking thread, never by an executor.
static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One change of AlterUserScramCredentials.
#[derive(Debug, Clone)]
pub enum CredentialChange {
    Set(String, Mechanism, Credential),
    Remove(String, Mechanism),
}

impl UserStore {
    /// Applies `changes` to the file at `path`, whole (blocking: run it off the executor thread).
    /// Per change, whether it applied (`Remove` of a credential that is not there does not).
    pub fn change_file(path: &Path, changes: &[CredentialChange]) -> std::io::Result<Vec<bool>> {
        let _writing = WRITING.lock().unwrap_or_else(|e| e.into_inner());
        let mut store = Self::load(path)?;
        let applied = changes
            .iter()
            .map(|c| match c {
                CredentialChange::Set(user, m, cred) => {
                    store.set(user, *m, cred.clone());
                    true
                }
                CredentialChange::Remove(user, m) => store.remove(user, Some(*m)),
            })
            .collect();
        store.save(path)?;
        Ok(applied)
    }
}

/// A core's view of the users file: read again when it changes (see [`Watched`]).
pub type Users = Watched<UserStore>;

/// The users file of `data_dir`, as a core reads it.
pub fn users(data_dir: &Path) -> Users {
    Watched::new(UserStore::path(data_dir), "users", UserStore::load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_remove_and_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = UserStore::path(dir.path());
        assert_eq!(UserStore::load(&path).unwrap(), UserStore::default());
        let mut s = UserStore::default();
        // Spaces cannot appear in base64: the password cannot show up in the file by chance.
        let pw = b"correct horse battery staple";
        s.set(
            "alice",
            Mechanism::Sha256,
            Credential::new(Mechanism::Sha256, pw, 4096),
        );
        s.set(
            "alice",
            Mechanism::Sha512,
            Credential::new(Mechanism::Sha512, pw, 8192),
        );
        s.set(
            "bob,=x",
            Mechanism::Sha512,
            Credential::new(Mechanism::Sha512, b"pw2", 4096),
        );
        s.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("horse"), "no password is stored");
        let back = UserStore::load(&path).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            back.list(),
            vec![
                (
                    "alice".into(),
                    vec![(Mechanism::Sha256, 4096), (Mechanism::Sha512, 8192)]
                ),
                ("bob,=x".into(), vec![(Mechanism::Sha512, 4096)])
            ]
        );
        let mut s = back;
        assert!(s.remove("alice", Some(Mechanism::Sha256)));
        assert!(!s.remove("alice", Some(Mechanism::Sha256)));
        assert!(s.remove("bob,=x", None));
        assert_eq!(s.list().len(), 1);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(UserStore::load(&path).is_err());
    }
}
