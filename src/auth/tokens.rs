//! Bearer tokens for the HTTP streams, each tied to a user: `<data-dir>/tokens.json` beside the
//! users file holds each token's SHA-256 (never the token), its user and when it was made.
//! `shoal user token create|list|revoke` edits the file; a running server reads it again when it
//! changes. A stream request that carries a token is that user for the ACLs.

use super::watched::Watched;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const TOKENS_FILE: &str = "tokens.json";

/// One token as stored: its user and when it was made (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredToken {
    pub user: String,
    pub created_ms: i64,
}

/// Every token, by the hex SHA-256 of the token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenStore {
    tokens: BTreeMap<String, StoredToken>,
}

/// The hex SHA-256 of a token: what is stored, and its id (a prefix of it names it in `list` and
/// `revoke`).
pub fn token_hash(token: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl TokenStore {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(TOKENS_FILE)
    }

    /// The store in `path`; empty if there is no file.
    pub fn load(path: &Path) -> std::io::Result<Self> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e),
        };
        let tokens = serde_json::from_slice(&bytes).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })?;
        Ok(Self { tokens })
    }

    /// Writes the store to `path` (readable by its owner only), whole.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(&self.tokens).expect("plain data serializes");
        if let Some(dir) = path.parent() {
            shards::files::create_dir_all_durable(dir)?;
        }
        shards::files::write_atomically(path, &bytes)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
    }

    /// Makes a new token for `user`, keeps its hash, and returns it: the only time it is seen.
    pub fn create(&mut self, user: &str, now_ms: i64) -> String {
        let secret: [u8; 32] = rand::random();
        let token = format!("shoal_{}", B64URL.encode(secret));
        self.tokens.insert(
            token_hash(&token),
            StoredToken {
                user: user.to_string(),
                created_ms: now_ms,
            },
        );
        token
    }

    /// The user `token` belongs to, if it is a token of this store.
    pub fn user_of(&self, token: &str) -> Option<&str> {
        self.tokens.get(&token_hash(token)).map(|t| t.user.as_str())
    }

    /// Every token: (its id, the first 12 hex digits of its hash; the stored token).
    pub fn list(&self) -> Vec<(String, &StoredToken)> {
        self.tokens
            .iter()
            .map(|(hash, t)| (hash[..12].to_string(), t))
            .collect()
    }

    /// Revokes the tokens whose id starts with `id` (at least 8 hex digits, so that a typo cannot
    /// revoke many), or every token of user `id` when no id matches; how many were revoked.
    pub fn revoke(&mut self, id: &str) -> usize {
        let before = self.tokens.len();
        if id.len() >= 8 && self.tokens.keys().any(|h| h.starts_with(id)) {
            self.tokens.retain(|h, _| !h.starts_with(id));
        } else {
            self.tokens.retain(|_, t| t.user != id);
        }
        before - self.tokens.len()
    }
}

/// A core's view of the tokens file: read again when it changes (see [`Watched`]).
pub type Tokens = Watched<TokenStore>;

/// The tokens file of `data_dir`, as a core reads it.
pub fn tokens(data_dir: &Path) -> Tokens {
    Watched::new(TokenStore::path(data_dir), "tokens", TokenStore::load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_hashed_and_revoked_by_id_or_user() {
        let dir = tempfile::tempdir().unwrap();
        let path = TokenStore::path(dir.path());
        let mut s = TokenStore::load(&path).unwrap();
        let alice = s.create("alice", 1);
        let alice2 = s.create("alice", 2);
        let bob = s.create("bob", 3);
        assert_ne!(alice, alice2);
        s.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&alice), "the token itself is not stored");
        let mut s = TokenStore::load(&path).unwrap();
        assert_eq!(s.user_of(&alice), Some("alice"));
        assert_eq!(s.user_of(&bob), Some("bob"));
        assert_eq!(s.user_of("shoal_nothing"), None);
        assert_eq!(s.list().len(), 3);
        let id = token_hash(&bob)[..12].to_string();
        assert_eq!(s.revoke(&id), 1);
        assert_eq!(s.user_of(&bob), None);
        assert_eq!(s.revoke("abc"), 0, "a short id revokes nothing");
        assert_eq!(s.revoke("alice"), 2);
        assert!(s.list().is_empty());
    }
}
