//! Password verifiers and the proofs clients send.
//!
//! - **SCRAM-SHA-256** (RFC 5802, RFC 7677), as PostgreSQL stores and checks
//!   it: a [`Verifier`] keeps the salt, the iteration count, `StoredKey` and
//!   `ServerKey`; never the password nor the salted password, so a stolen
//!   verifier does not let anyone log in. [`ScramExchange`] is the server's
//!   side of the SASL exchange; [`Verifier::check_password`] checks a
//!   password sent in the clear (HTTP Basic, over TLS).
//! - **MySQL's `mysql_native_password`**: its scramble can only be checked
//!   against `SHA1(SHA1(password))`, which is therefore kept as well
//!   ([`MysqlNative`]). It is the one unsalted value stored; it does not let
//!   anyone log in either (the client must know `SHA1(password)`).
//!
//! Must not know users, grants or front doors: bytes and text in, yes or no
//! out.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{KeyInit, Mac};
use rand::RngExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = hmac::Hmac<Sha256>;

/// PBKDF2 iterations of new verifiers (PostgreSQL's default).
pub const ITERATIONS: u32 = 4096;
const SALT_LEN: usize = 16;
const NONCE_LEN: usize = 18;

/// A salted SCRAM-SHA-256 verifier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verifier {
    /// Base64, as SCRAM sends it.
    pub salt: String,
    pub iterations: u32,
    /// `H(HMAC(SaltedPassword, "Client Key"))`, hex.
    pub stored_key: String,
    /// `HMAC(SaltedPassword, "Server Key")`, hex.
    pub server_key: String,
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// A password as SCRAM hashes it: SASLprep-normalised when it can be (as
/// PostgreSQL and its clients do), else its bytes as they are.
fn normalized(password: &str) -> String {
    stringprep::saslprep(password)
        .map(|p| p.into_owned())
        .unwrap_or_else(|_| password.to_string())
}

fn salted_password(password: &str, salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut out = [0u8; 32];
    pbkdf2::pbkdf2_hmac::<Sha256>(normalized(password).as_bytes(), salt, iterations, &mut out);
    out
}

impl Verifier {
    /// A verifier of `password` with a fresh random salt.
    pub fn new(password: &str) -> Verifier {
        let mut salt = [0u8; SALT_LEN];
        rand::rng().fill(&mut salt[..]);
        Self::with_salt(password, &salt, ITERATIONS)
    }

    fn with_salt(password: &str, salt: &[u8], iterations: u32) -> Verifier {
        let salted = salted_password(password, salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let server_key = hmac(&salted, b"Server Key");
        Verifier {
            salt: B64.encode(salt),
            iterations,
            stored_key: hex::encode(stored_key),
            server_key: hex::encode(server_key),
        }
    }

    /// Whether `password` is the one this verifier was made from.
    pub fn check_password(&self, password: &str) -> bool {
        let Ok(salt) = B64.decode(&self.salt) else {
            return false;
        };
        let again = Self::with_salt(password, &salt, self.iterations);
        again
            .stored_key
            .as_bytes()
            .ct_eq(self.stored_key.as_bytes())
            .into()
    }

    fn keys(&self) -> Option<([u8; 32], [u8; 32])> {
        let stored = hex::decode(&self.stored_key).ok()?.try_into().ok()?;
        let server = hex::decode(&self.server_key).ok()?.try_into().ok()?;
        Some((stored, server))
    }
}

/// Why a SCRAM exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// The client's message is not what SCRAM-SHA-256 sends.
    Malformed(String),
    /// The proof does not match: wrong password (or no such user).
    WrongProof,
}

/// The server's side of one SCRAM-SHA-256 exchange.
#[derive(Debug)]
pub struct ScramExchange {
    verifier: Verifier,
    client_first_bare: String,
    server_first: String,
    gs2_header: String,
    nonce: String,
}

impl ScramExchange {
    /// Reads the client-first message and answers the server-first one. With
    /// no verifier (unknown user) the exchange goes on with a made-up one
    /// and fails at the proof, so that a client cannot tell which users
    /// exist.
    pub fn start(
        verifier: Option<&Verifier>,
        client_first: &str,
    ) -> Result<(ScramExchange, String), ScramError> {
        let malformed = |why: &str| ScramError::Malformed(why.to_string());
        // gs2-header: "n,," / "y,," (no channel binding), then the bare part.
        let (cb, rest) = client_first
            .split_once(',')
            .ok_or_else(|| malformed("no GS2 header"))?;
        match cb {
            "n" | "y" => {}
            c if c.starts_with("p=") => {
                return Err(malformed(
                    "channel binding is not supported; use SCRAM-SHA-256 without -PLUS",
                ))
            }
            _ => return Err(malformed("invalid GS2 header")),
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or_else(|| malformed("no client-first-message-bare"))?;
        if !authzid.is_empty() {
            return Err(malformed("authorization identities are not supported"));
        }
        let client_nonce = bare
            .split(',')
            .find_map(|a| a.strip_prefix("r="))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b','))
            .ok_or_else(|| malformed("no valid client nonce"))?;
        let mut ours = [0u8; NONCE_LEN];
        rand::rng().fill(&mut ours[..]);
        let nonce = format!("{client_nonce}{}", B64.encode(ours));
        let verifier = match verifier {
            Some(v) => v.clone(),
            None => {
                let mut salt = [0u8; SALT_LEN];
                rand::rng().fill(&mut salt[..]);
                Verifier {
                    salt: B64.encode(salt),
                    iterations: ITERATIONS,
                    stored_key: hex::encode([0u8; 32]),
                    server_key: hex::encode([0u8; 32]),
                }
            }
        };
        let server_first = format!("r={nonce},s={},i={}", verifier.salt, verifier.iterations);
        Ok((
            ScramExchange {
                verifier,
                client_first_bare: bare.to_string(),
                server_first: server_first.clone(),
                gs2_header: format!("{cb},,"),
                nonce,
            },
            server_first,
        ))
    }

    /// Checks the client-final message; returns the server-final message
    /// (the server's signature) when the proof is right.
    pub fn finish(self, client_final: &str) -> Result<String, ScramError> {
        let malformed = |why: &str| ScramError::Malformed(why.to_string());
        let (without_proof, proof) = client_final
            .rsplit_once(",p=")
            .ok_or_else(|| malformed("no proof"))?;
        let mut channel = None;
        let mut nonce = None;
        for attr in without_proof.split(',') {
            if let Some(c) = attr.strip_prefix("c=") {
                channel = Some(c);
            } else if let Some(r) = attr.strip_prefix("r=") {
                nonce = Some(r);
            }
        }
        if channel != Some(B64.encode(&self.gs2_header).as_str()) {
            return Err(malformed(
                "channel binding data does not match the GS2 header",
            ));
        }
        if nonce != Some(self.nonce.as_str()) {
            return Err(malformed("nonce does not match"));
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| malformed("proof is not base64"))?;
        let (stored_key, server_key) = self.verifier.keys().ok_or(ScramError::WrongProof)?;
        if proof.len() != 32 {
            return Err(ScramError::WrongProof);
        }
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(signature).map(|(p, s)| p ^ s).collect();
        let hashed: [u8; 32] = Sha256::digest(&client_key).into();
        if !bool::from(hashed.ct_eq(&stored_key)) {
            return Err(ScramError::WrongProof);
        }
        let server_signature = hmac(&server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)))
    }
}

/// `SHA1(SHA1(password))`, hex: what `mysql_native_password` checks against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MysqlNative(pub String);

impl MysqlNative {
    pub fn new(password: &str) -> MysqlNative {
        let once = sha1::Sha1::digest(password.as_bytes());
        MysqlNative(hex::encode(sha1::Sha1::digest(once)))
    }

    /// Checks a client's scramble for `salt` (the 20 bytes the server sent):
    /// the client sends `SHA1(pw) XOR SHA1(salt + SHA1(SHA1(pw)))`.
    pub fn check(&self, salt: &[u8], scramble: &[u8]) -> bool {
        let Ok(stored) = hex::decode(&self.0) else {
            return false;
        };
        if scramble.len() != 20 || stored.len() != 20 {
            return false;
        }
        let mut h = sha1::Sha1::new();
        h.update(salt);
        h.update(&stored);
        let mask = h.finalize();
        let once: Vec<u8> = scramble
            .iter()
            .zip(mask.iter())
            .map(|(a, b)| a ^ b)
            .collect();
        let twice = sha1::Sha1::digest(&once);
        bool::from(twice.as_slice().ct_eq(&stored))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's side, as RFC 5802 describes it (libpq does the same).
    fn client_final(password: &str, client_first_bare: &str, server_first: &str) -> String {
        let attrs: Vec<&str> = server_first.split(',').collect();
        let nonce = attrs[0].strip_prefix("r=").unwrap();
        let salt = B64.decode(attrs[1].strip_prefix("s=").unwrap()).unwrap();
        let iterations: u32 = attrs[2].strip_prefix("i=").unwrap().parse().unwrap();
        let salted = salted_password(password, &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let sig = hmac(&stored_key, auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(sig).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", B64.encode(proof))
    }

    #[test]
    fn rfc7677_example_verifier() {
        // RFC 7677 section 3: user "user", password "pencil".
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let v = Verifier::with_salt("pencil", &salt, 4096);
        let (exchange, server_first) = {
            let (mut e, _) =
                ScramExchange::start(Some(&v), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
            // The RFC's server nonce, to reproduce its messages.
            e.nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into();
            e.server_first = format!("r={},s={},i=4096", e.nonce, v.salt);
            let sf = e.server_first.clone();
            (e, sf)
        };
        assert_eq!(
            server_first,
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let last = exchange
            .finish(
                "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                 p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            )
            .unwrap();
        assert_eq!(last, "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    #[test]
    fn exchange_accepts_the_password_and_refuses_others() {
        let v = Verifier::new("s3cret");
        assert!(v.check_password("s3cret"));
        assert!(!v.check_password("s3cret "));
        let bare = "n=,r=abcdefgh";
        let (e, sf) = ScramExchange::start(Some(&v), &format!("n,,{bare}")).unwrap();
        assert!(e.finish(&client_final("s3cret", bare, &sf)).is_ok());
        let (e, sf) = ScramExchange::start(Some(&v), &format!("n,,{bare}")).unwrap();
        assert_eq!(
            e.finish(&client_final("wrong", bare, &sf)),
            Err(ScramError::WrongProof)
        );
        // An unknown user fails the same way, at the proof.
        let (e, sf) = ScramExchange::start(None, &format!("n,,{bare}")).unwrap();
        assert_eq!(
            e.finish(&client_final("s3cret", bare, &sf)),
            Err(ScramError::WrongProof)
        );
        for bad in ["", "x", "n,,", "p=tls-server-end-point,,n=,r=a", "n,,n=,r="] {
            assert!(ScramExchange::start(Some(&v), bad).is_err(), "{bad}");
        }
        let (e, _) = ScramExchange::start(Some(&v), &format!("n,,{bare}")).unwrap();
        assert!(e.finish("c=biws,r=other,p=AAAA").is_err());
    }

    #[test]
    fn mysql_native_scramble() {
        let stored = MysqlNative::new("pw");
        let salt = [7u8; 20];
        let once = sha1::Sha1::digest(b"pw");
        let mut h = sha1::Sha1::new();
        h.update(salt);
        h.update(hex::decode(&stored.0).unwrap());
        let mask = h.finalize();
        let scramble: Vec<u8> = once.iter().zip(mask.iter()).map(|(a, b)| a ^ b).collect();
        assert!(stored.check(&salt, &scramble));
        assert!(!stored.check(&[8u8; 20], &scramble));
        assert!(!stored.check(&salt, &scramble[..19]));
    }
}
