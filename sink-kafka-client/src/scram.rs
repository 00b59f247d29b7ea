//! SCRAM (RFC 5802), as Kafka's `SCRAM-SHA-256` and `SCRAM-SHA-512`
//! mechanisms use it (RFC 7677): the client's side, and the server's check
//! of a client's proof, which the tests' proxy uses.
//!
//! ```text
//!  client-first  n,,n=<user>,r=<client nonce>
//!  server-first  r=<client nonce><server nonce>,s=<salt>,i=<iterations>
//!  client-final  c=biws,r=<nonce>,p=<proof>        proof = ClientKey XOR HMAC(StoredKey, AuthMessage)
//!  server-final  v=<signature>                      checked: a server that knows the password
//! ```
//!
//! Built on RustCrypto's `hmac`, `sha2` and `pbkdf2` (no maintained crate
//! does SCRAM-SHA-512 under an open licence); the exchange itself is the
//! RFC's few lines. Checked against RFC 7677's test vector.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

/// Which hash a SCRAM exchange uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScramHash {
    /// `SCRAM-SHA-256`.
    Sha256,
    /// `SCRAM-SHA-512`.
    Sha512,
}

impl ScramHash {
    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
            ScramHash::Sha512 => {
                let mut mac = <Hmac<Sha512> as Mac>::new_from_slice(key).expect("any key length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => Sha256::digest(data).to_vec(),
            ScramHash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// Hi(password, salt, i): PBKDF2 with this hash's HMAC.
    fn salted(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(password, salt, iterations).to_vec()
            }
            ScramHash::Sha512 => {
                pbkdf2::pbkdf2_hmac_array::<Sha512, 64>(password, salt, iterations).to_vec()
            }
        }
    }
}

/// The keys a server keeps of a password (and a client derives from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramKeys {
    /// H(ClientKey).
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key").
    pub server_key: Vec<u8>,
    client_key: Vec<u8>,
}

impl ScramKeys {
    /// The keys of `password` with `salt` and `iterations`.
    pub fn derive(hash: ScramHash, password: &str, salt: &[u8], iterations: u32) -> ScramKeys {
        let salted = hash.salted(password.as_bytes(), salt, iterations);
        let client_key = hash.hmac(&salted, b"Client Key");
        ScramKeys {
            stored_key: hash.hash(&client_key),
            server_key: hash.hmac(&salted, b"Server Key"),
            client_key,
        }
    }
}

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The server's message is not what the RFC says.
    #[error("the server's SCRAM message cannot be read: {0}")]
    Malformed(String),
    /// The server refused (`e=...`).
    #[error("the server refused the SCRAM exchange: {0}")]
    Refused(String),
    /// The server's signature is wrong: it does not know the password (or
    /// the exchange was tampered with).
    #[error("the server's SCRAM signature is wrong: it is not the server that holds the password")]
    BadServerSignature,
}

/// The client's side of one exchange.
#[derive(Debug)]
pub struct ScramClient {
    hash: ScramHash,
    password: String,
    client_first_bare: String,
    nonce: String,
    /// Set by `client_final`: the server signature expected.
    expected_signature: Option<Vec<u8>>,
}

/// `name` escaped as SCRAM's `saslname` (`=` and `,`).
fn sasl_name(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

impl ScramClient {
    /// An exchange for `username` with `password`, with `nonce` (printable,
    /// random, without `,`).
    pub fn new(hash: ScramHash, username: &str, password: &str, nonce: &str) -> ScramClient {
        ScramClient {
            hash,
            password: password.to_string(),
            client_first_bare: format!("n={},r={nonce}", sasl_name(username)),
            nonce: nonce.to_string(),
            expected_signature: None,
        }
    }

    /// The first message: `n,,n=<user>,r=<nonce>`.
    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// The answer to the server's first message: the proof.
    pub fn client_final(&mut self, server_first: &str) -> Result<String, ScramError> {
        let field = |name: char| {
            server_first
                .split(',')
                .find_map(|part| part.strip_prefix(name).and_then(|p| p.strip_prefix('=')))
        };
        if let Some(error) = field('e') {
            return Err(ScramError::Refused(error.to_string()));
        }
        let nonce = field('r').ok_or_else(|| ScramError::Malformed("no nonce".into()))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(ScramError::Malformed(
                "the server's nonce does not extend the client's".into(),
            ));
        }
        let salt = field('s')
            .and_then(|s| STANDARD.decode(s).ok())
            .ok_or_else(|| ScramError::Malformed("no salt".into()))?;
        let iterations: u32 = field('i')
            .and_then(|i| i.parse().ok())
            .filter(|i| *i > 0)
            .ok_or_else(|| ScramError::Malformed("no iteration count".into()))?;
        let keys = ScramKeys::derive(self.hash, &self.password, &salt, iterations);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = self.hash.hmac(&keys.stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = keys
            .client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.expected_signature = Some(self.hash.hmac(&keys.server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)))
    }

    /// Checks the server's last message (`v=<signature>`).
    pub fn check_server_final(&self, server_final: &str) -> Result<(), ScramError> {
        if let Some(error) = server_final.strip_prefix("e=") {
            return Err(ScramError::Refused(error.to_string()));
        }
        let signature = server_final
            .strip_prefix("v=")
            .and_then(|v| STANDARD.decode(v).ok())
            .ok_or_else(|| ScramError::Malformed("no server signature".into()))?;
        match &self.expected_signature {
            Some(expected) if *expected == signature => Ok(()),
            _ => Err(ScramError::BadServerSignature),
        }
    }
}

/// The server's check of a client's final message: whether its proof shows
/// the password behind `keys`, and the server's final message if so. Called
/// by the tests' SASL proxy.
pub fn server_check(
    hash: ScramHash,
    keys: &ScramKeys,
    client_first_bare: &str,
    server_first: &str,
    client_final: &str,
) -> Option<String> {
    let (without_proof, proof) = client_final.rsplit_once(",p=")?;
    let proof = STANDARD.decode(proof).ok()?;
    let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
    let signature = hash.hmac(&keys.stored_key, auth_message.as_bytes());
    let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
    if proof.len() != signature.len() || hash.hash(&client_key) != keys.stored_key {
        return None;
    }
    let server_signature = hash.hmac(&keys.server_key, auth_message.as_bytes());
    Some(format!("v={}", STANDARD.encode(server_signature)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_7677s_exchange_is_reproduced_byte_for_byte() {
        // RFC 7677, section 3: user "user", password "pencil".
        let mut client =
            ScramClient::new(ScramHash::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(client.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let client_final = client.client_final(server_first).unwrap();
        assert_eq!(
            client_final,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        let server_final = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";
        client.check_server_final(server_final).unwrap();
        assert_eq!(
            client.check_server_final("v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
            Err(ScramError::BadServerSignature)
        );
        // The server's side agrees, and refuses a wrong password's proof.
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let keys = ScramKeys::derive(ScramHash::Sha256, "pencil", &salt, 4096);
        let bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        assert_eq!(
            server_check(ScramHash::Sha256, &keys, bare, server_first, &client_final).as_deref(),
            Some(server_final)
        );
        let mut wrong = ScramClient::new(ScramHash::Sha256, "user", "pen", "rOprNGfwEbeRWgbNEkqO");
        let wrong_final = wrong.client_final(server_first).unwrap();
        assert_eq!(
            server_check(ScramHash::Sha256, &keys, bare, server_first, &wrong_final),
            None
        );
    }

    #[test]
    fn sha_512_round_trips_and_names_are_escaped() {
        let salt = b"0123456789abcdef";
        let keys = ScramKeys::derive(ScramHash::Sha512, "secret", salt, 4096);
        assert_eq!(keys.stored_key.len(), 64);
        let mut client = ScramClient::new(ScramHash::Sha512, "a=b,c", "secret", "nonce1");
        assert_eq!(client.client_first(), "n,,n=a=3Db=2Cc,r=nonce1");
        let server_first = format!("r=nonce1srv,s={},i=4096", STANDARD.encode(salt));
        let client_final = client.client_final(&server_first).unwrap();
        let server_final = server_check(
            ScramHash::Sha512,
            &keys,
            "n=a=3Db=2Cc,r=nonce1",
            &server_first,
            &client_final,
        )
        .expect("the right password");
        client.check_server_final(&server_final).unwrap();
        // A server that does not extend the nonce, or refuses.
        let mut other = ScramClient::new(ScramHash::Sha512, "u", "p", "n1");
        assert!(matches!(
            other.client_final("r=x,s=AA==,i=1"),
            Err(ScramError::Malformed(_))
        ));
        assert_eq!(
            other.client_final("e=unknown-user"),
            Err(ScramError::Refused("unknown-user".into()))
        );
    }
}
