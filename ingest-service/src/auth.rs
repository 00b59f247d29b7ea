//! Who may write: bearer tokens, each naming a tenant.
//!
//! The tokens come from a file or an environment variable
//! ([`TokenSource`]), in the same text format: one `<tenant> <token>` pair
//! per line, blank lines and `#` comments ignored. A request proves its
//! tenant with `Authorization: Bearer <token>`; the service records the
//! tenant with its events and scopes its idempotency keys by it (see
//! [`Config::tokens`](super::Config::tokens)).
//!
//! Tokens are kept as their SHA-256 digests only, and a presented token is
//! compared with every digest in constant time ([`subtle`]), without an
//! early exit: the time of a check says nothing about which byte of which
//! token differed, nor whether a token matched. A file is read again on
//! [`Auth::reload`] (the binary's SIGHUP); a table that does not parse is
//! refused whole and the old one stays in force. The file must be the
//! owner's only (mode 600 or stricter) and is read as the service reads
//! every operator's file (the `files` module): a regular file, bounded in
//! size and in time.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

use crate::files::{self, Access, FileError};
use subtle::ConstantTimeEq;

/// The shortest token accepted, in characters: shorter ones are guessable.
pub const MIN_TOKEN_LEN: usize = 16;

/// The longest token accepted, in characters.
pub const MAX_TOKEN_LEN: usize = 4096;

/// The longest tenant name, in characters.
pub const MAX_TENANT_LEN: usize = 64;

/// The largest token file read, in bytes: room for tens of thousands of
/// tenants.
pub const MAX_TOKEN_FILE_LEN: u64 = 4 << 20;

/// Where the tokens are read from. Chosen by the binary's `--tokens FILE`
/// or `--tokens-env VAR`; read at start and on every [`Auth::reload`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// A file of `<tenant> <token>` lines, read again on each reload: edit
    /// it (or replace it atomically) and reload to rotate tokens.
    File(PathBuf),
    /// An environment variable holding the same lines. The environment of a
    /// process does not change, so a reload reads the same tokens: rotate
    /// by restarting, or use a file.
    Env(String),
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::File(path) => write!(f, "the token file {}", path.display()),
            TokenSource::Env(var) => write!(f, "the environment variable {var}"),
        }
    }
}

/// Why a token table was refused. Never holds a token, not even in part.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file could not be read: missing, not a regular file, larger
    /// than [`MAX_TOKEN_FILE_LEN`], readable by group or others, or too slow
    /// to read.
    #[error("reading {source_name}")]
    Read {
        /// The file, named.
        source_name: String,
        /// Why.
        #[source]
        error: FileError,
    },
    /// The environment variable is not set, or not UTF-8.
    #[error("the environment variable {0} is not set (or not UTF-8); it must hold `<tenant> <token>` lines")]
    MissingEnv(String),
    /// A line that is not `<tenant> <token>`.
    #[error("line {line}: {reason}")]
    Line {
        /// From 1.
        line: usize,
        /// What is wrong with it (the token itself is never shown).
        reason: String,
    },
    /// No token at all: nobody could write.
    #[error("no tokens: add `<tenant> <token>` lines (tokens of {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters)")]
    Empty,
}

/// A tenant: the name a token stands for, recorded with the events its
/// requests write. 1 to [`MAX_TENANT_LEN`] of `a-z`, `0-9`, `-` and `_`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Arc<str>);

impl Tenant {
    /// The tenant named `name`, if the name is valid.
    pub fn new(name: &str) -> Option<Tenant> {
        let valid = !name.is_empty()
            && name.len() <= MAX_TENANT_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        valid.then(|| Tenant(Arc::from(name)))
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A parsed token table: the digests of the tokens and their tenants.
#[derive(Clone)]
pub struct Tokens {
    entries: Vec<([u8; 32], Tenant)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The digests stay out of logs too.
        f.debug_struct("Tokens")
            .field("tokens", &self.entries.len())
            .finish_non_exhaustive()
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// Whether `byte` may be in a token: RFC 6750's `b64token` characters.
fn token_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~+/=".contains(&byte)
}

impl Tokens {
    /// Parses `<tenant> <token>` lines. A tenant may have several tokens
    /// (for a rotation: add the new one, reload, move the clients, remove
    /// the old one, reload); a token may stand for one tenant only.
    pub fn parse(text: &str) -> Result<Tokens, TokensError> {
        let mut entries: Vec<([u8; 32], Tenant)> = Vec::new();
        for (at, line) in text.lines().enumerate() {
            let bad = |reason: String| TokensError::Line {
                line: at + 1,
                reason,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(token), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad(
                    "expected `<tenant> <token>`, two words separated by spaces".into(),
                ));
            };
            // The messages name neither word: in a line with the two
            // swapped, the first would be the token.
            let tenant = Tenant::new(name).ok_or_else(|| {
                bad(format!(
                    "the first word, the tenant, must be 1 to {MAX_TENANT_LEN} of a-z, 0-9, - \
                     and _"
                ))
            })?;
            if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len()) {
                return Err(bad(format!(
                    "the second word, the token, is {} characters long; tokens are \
                     {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters (make one with `openssl rand \
                     -hex 32`)",
                    token.len()
                )));
            }
            if !token.bytes().all(token_byte) {
                return Err(bad(
                    "the second word, the token, holds a character outside A-Z, a-z, 0-9 and \
                     -._~+/="
                        .into(),
                ));
            }
            let digest = digest(token.as_bytes());
            if let Some(at) = entries.iter().position(|(d, _)| *d == digest) {
                return Err(bad(format!(
                    "this token is already the token number {} of the table; a token stands for \
                     one tenant",
                    at + 1
                )));
            }
            entries.push((digest, tenant));
        }
        if entries.is_empty() {
            return Err(TokensError::Empty);
        }
        Ok(Tokens { entries })
    }

    /// Reads and parses the table from `source`.
    pub async fn load(source: &TokenSource) -> Result<Tokens, TokensError> {
        let text = match source {
            TokenSource::File(path) => {
                let read = |error| TokensError::Read {
                    source_name: source.to_string(),
                    error,
                };
                let bytes = files::read(path, MAX_TOKEN_FILE_LEN, Access::OwnerOnly)
                    .await
                    .map_err(read)?;
                String::from_utf8(bytes).map_err(|_| {
                    read(FileError::Io(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "it is not UTF-8 text",
                    )))
                })?
            }
            TokenSource::Env(var) => {
                std::env::var(var).map_err(|_| TokensError::MissingEnv(var.clone()))?
            }
        };
        Tokens::parse(&text)
    }

    /// The tenant `token` stands for. Compares with every token of the
    /// table, in constant time each, whatever matches.
    pub fn tenant_of(&self, token: &[u8]) -> Option<&Tenant> {
        let presented = digest(token);
        let mut found = None;
        for (digest, tenant) in &self.entries {
            if bool::from(digest.ct_eq(&presented)) {
                found = Some(tenant);
            }
        }
        found
    }

    /// How many tokens the table holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty (never, for a parsed one).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Why a request was not authenticated: answered 401 with
/// `WWW-Authenticate`, and nothing of it is read further.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// No `Authorization` header.
    #[error("this service needs `Authorization: Bearer <token>`; nothing was stored")]
    Missing,
    /// A header that is not one `Bearer <token>`.
    #[error("the Authorization header must be one `Bearer <token>`; nothing was stored")]
    Malformed,
    /// A token the table does not hold.
    #[error("the bearer token is not valid here (revoked, mistyped, or for another service); nothing was stored")]
    Invalid,
}

/// The token table in force and where it comes from. Shared by the
/// request handlers (which check each request) and the reload handle.
#[derive(Debug)]
pub struct Auth {
    source: TokenSource,
    current: RwLock<Arc<Tokens>>,
}

impl Auth {
    /// Reads the table from `source`; fails as [`Tokens::load`] does.
    pub async fn open(source: TokenSource) -> Result<Auth, TokensError> {
        let tokens = Tokens::load(&source).await?;
        Ok(Auth {
            source,
            current: RwLock::new(Arc::new(tokens)),
        })
    }

    /// Reads the table again and puts it in force; returns how many tokens
    /// it holds. On an error the old table stays in force.
    pub async fn reload(&self) -> Result<usize, TokensError> {
        let tokens = Tokens::load(&self.source).await?;
        let count = tokens.len();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
        Ok(count)
    }

    /// Where the tokens come from.
    pub fn source(&self) -> &TokenSource {
        &self.source
    }

    /// The tenant of a request with these `Authorization` header values.
    pub fn authenticate<'a>(
        &self,
        mut values: impl Iterator<Item = &'a [u8]>,
    ) -> Result<Tenant, Unauthenticated> {
        let value = values.next().ok_or(Unauthenticated::Missing)?;
        if values.next().is_some() {
            return Err(Unauthenticated::Malformed);
        }
        let token = bearer_token(value).ok_or(Unauthenticated::Malformed)?;
        let tokens = Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()));
        tokens
            .tenant_of(token)
            .cloned()
            .ok_or(Unauthenticated::Invalid)
    }
}

/// The token of a `Bearer <token>` header value (the scheme in any case,
/// one or more spaces).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty() && token.iter().copied().all(token_byte)).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "token-of-alpha-0123456789";
    const B: &str = "token-of-beta-0123456789";

    fn table() -> Tokens {
        Tokens::parse(&format!("# tenants\nalpha {A}\n\n  beta   {B}  \n")).unwrap()
    }

    #[test]
    fn tokens_name_their_tenants_and_nothing_else_matches() {
        let tokens = table();
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens.tenant_of(A.as_bytes()).unwrap().name(), "alpha");
        assert_eq!(tokens.tenant_of(B.as_bytes()).unwrap().name(), "beta");
        assert!(tokens.tenant_of(b"token-of-alpha-012345678").is_none());
        assert!(tokens.tenant_of(b"").is_none());
        assert!(!format!("{tokens:?}").contains("token-of"));
    }

    #[test]
    fn bad_tables_are_refused_with_the_line_and_without_the_token() {
        let cases = [
            ("alpha\n", "line 1: expected"),
            (&format!("alpha {A} extra\n"), "line 1: expected"),
            (
                &format!("Alpha {A}\n"),
                "line 1: the first word, the tenant",
            ),
            // Swapped: the token would be taken for the tenant; the
            // message names neither.
            (
                "0123456789abcdef0123456789abcdef short\n",
                "line 1: the second word, the token, is 5 characters",
            ),
            (
                "alpha short\n",
                "line 1: the second word, the token, is 5 characters",
            ),
            (
                &format!("alpha {A}\nbeta {A}\n"),
                "line 2: this token is already the token number 1",
            ),
            (
                &format!("alpha {A}!\n"),
                "line 1: the second word, the token, holds",
            ),
            ("# nothing\n\n", "no tokens"),
        ];
        for (text, expected) in cases {
            let error = Tokens::parse(text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{text:?}: {error}");
            for word in ["token-of", "short", "alpha", "beta", "0123456789abcdef"] {
                assert!(!error.contains(word), "{text:?}: {error}");
            }
        }
        // Another token of the same tenant is a rotation, not an error.
        assert_eq!(
            Tokens::parse(&format!("alpha {A}\nalpha {B}\n"))
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn only_one_bearer_header_with_a_known_token_authenticates() {
        let auth = Auth {
            source: TokenSource::Env("UNUSED".into()),
            current: RwLock::new(Arc::new(table())),
        };
        let check = |values: &[&str]| auth.authenticate(values.iter().map(|v| v.as_bytes()));
        assert_eq!(check(&[&format!("Bearer {A}")]).unwrap().name(), "alpha");
        assert_eq!(check(&[&format!("bearer  {B}")]).unwrap().name(), "beta");
        assert_eq!(check(&[]), Err(Unauthenticated::Missing));
        assert_eq!(check(&[A]), Err(Unauthenticated::Malformed));
        assert_eq!(
            check(&[&format!("Basic {A}")]),
            Err(Unauthenticated::Malformed)
        );
        assert_eq!(
            check(&[&format!("Bearer{A}")]),
            Err(Unauthenticated::Malformed)
        );
        assert_eq!(check(&["Bearer "]), Err(Unauthenticated::Malformed));
        let twice = format!("Bearer {A}");
        assert_eq!(check(&[&twice, &twice]), Err(Unauthenticated::Malformed));
        assert_eq!(
            check(&["Bearer token-of-gamma-0123456789"]),
            Err(Unauthenticated::Invalid)
        );
    }

    #[tokio::test]
    async fn a_reload_that_fails_keeps_the_old_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, format!("alpha {A}\n")).unwrap();
        // The owner's only, as a token file must be.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let auth = Auth::open(TokenSource::File(path.clone())).await.unwrap();
        let header = format!("Bearer {A}");
        let check = |auth: &Auth, header: &str| auth.authenticate([header.as_bytes()].into_iter());
        assert!(check(&auth, &header).is_ok());
        std::fs::write(&path, "alpha short\n").unwrap();
        assert!(auth.reload().await.is_err());
        assert!(
            check(&auth, &header).is_ok(),
            "a bad file replaced the table"
        );
        std::fs::write(&path, format!("beta {B}\n")).unwrap();
        assert_eq!(auth.reload().await.unwrap(), 1);
        assert_eq!(check(&auth, &header), Err(Unauthenticated::Invalid));
        assert!(check(&auth, &format!("Bearer {B}")).is_ok());
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(auth.reload().await, Err(TokensError::Read { .. })));
    }
}
