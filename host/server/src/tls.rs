//! TLS for the front doors: reads the certificate chain and private key named
//! by `--tls-cert`/`--tls-key` (SANDFLOW_TLS_CERT/KEY, `[tls]`) once, at
//! startup, checks them, and gives each door the rustls configuration it
//! speaks: PostgreSQL after an SSLRequest (ALPN `postgresql`), HTTPS (ALPN
//! `http/1.1`), MySQL after its SSL request (opensrv-mysql's rustls 0.22). A
//! file that cannot be used stops the server with a message that names the
//! file, says what is wrong with it and how to fix it.
//!
//! Owns: PEM parsing, the certificate/key consistency check, the rustls
//! settings (the *ring* provider, TLS 1.2 and 1.3, no client certificates),
//! whether plaintext is refused (`require`). Must not know the doors'
//! protocols, connections, sessions or users: a door takes its acceptor or
//! configuration and does its own negotiation, handshake deadline and refusal.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::{self, PemObject, SectionKind};
use rustls_pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs1KeyDer, PrivatePkcs8KeyDer, PrivateSec1KeyDer,
};
use snafu::{ResultExt, Snafu};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsConfig;

/// The ALPN name of the PostgreSQL protocol (PostgreSQL 17's libpq offers it).
pub const POSTGRES_ALPN: &[u8] = b"postgresql";

/// Why the certificate or key cannot be served.
#[derive(Debug, Snafu)]
pub enum TlsError {
    #[snafu(display(
        "cannot read the TLS {what} file {}: {source} (set by {setting})",
        path.display()
    ))]
    ReadFile {
        what: &'static str,
        setting: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[snafu(display(
        "the TLS {what} file {} is not valid PEM: {source}; it must hold \
         -----BEGIN ...----- / -----END ...----- blocks of base64 (set by {setting})",
        path.display()
    ))]
    BadPem {
        what: &'static str,
        setting: &'static str,
        path: PathBuf,
        source: pem::Error,
    },
    #[snafu(display(
        "the TLS certificate file {} holds no certificate (no -----BEGIN CERTIFICATE----- \
         block){hint}; --tls-cert (SANDFLOW_TLS_CERT, [tls] cert) takes the server's \
         certificate in PEM, followed by any intermediate CA certificates",
        path.display()
    ))]
    NoCertificate { path: PathBuf, hint: &'static str },
    #[snafu(display(
        "the TLS key file {} holds no private key (no -----BEGIN PRIVATE KEY-----, \
         RSA PRIVATE KEY or EC PRIVATE KEY block){hint}; --tls-key (SANDFLOW_TLS_KEY, \
         [tls] key) takes the unencrypted private key of the certificate in PEM",
        path.display()
    ))]
    NoKey { path: PathBuf, hint: &'static str },
    #[snafu(display(
        "the TLS key file {} holds an encrypted private key, which the server cannot \
         unlock: write it out unencrypted with `openssl pkey -in {} -out server.key` and \
         keep that file readable by the server only",
        path.display(),
        path.display()
    ))]
    EncryptedKey { path: PathBuf },
    #[snafu(display(
        "the TLS key file {} holds {count} private keys: keep only the key of the \
         certificate",
        path.display()
    ))]
    SeveralKeys { path: PathBuf, count: usize },
    #[snafu(display("{}", rejected(cert, key, source)))]
    Rejected {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[snafu(display(
        "the TLS certificate {} and key {} cannot be served to MySQL clients: {source}",
        cert.display(),
        key.display()
    ))]
    MysqlRejected {
        cert: PathBuf,
        key: PathBuf,
        source: mysql_rustls::Error,
    },
}

/// What rustls refusing the pair means for the person who configured it.
fn rejected(cert: &Path, key: &Path, source: &rustls::Error) -> String {
    let (cert, key) = (cert.display(), key.display());
    match source {
        rustls::Error::InconsistentKeys(_) => format!(
            "the private key in {key} is not the key of the certificate in {cert}: give the \
             key the certificate was made for, and put the server's own certificate first \
             in {cert} (intermediates after it); `openssl x509 -in {cert} -noout -pubkey` \
             and `openssl pkey -in {key} -pubout` must print the same key"
        ),
        rustls::Error::InvalidCertificate(e) => format!(
            "the certificate in {cert} cannot be parsed ({e:?}): give an X.509 certificate \
             in PEM, e.g. one made with `openssl req -x509` or issued by a CA"
        ),
        rustls::Error::General(e) => format!(
            "the private key in {key} cannot be used ({e}): the server takes RSA (2048 bits \
             or more), ECDSA P-256/P-384 and Ed25519 keys"
        ),
        other => format!("the TLS certificate {cert} and key {key} cannot be served: {other}"),
    }
}

/// The loaded certificate and key, ready for each door; cheap to clone.
#[derive(Clone)]
pub struct Tls {
    postgres: TlsAcceptor,
    http: TlsAcceptor,
    mysql: Arc<mysql_rustls::ServerConfig>,
    require: bool,
    summary: Arc<str>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("require", &self.require)
            .field("summary", &self.summary)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// The TLS the settings ask for: `None` when no certificate is set.
    pub fn load(config: &TlsConfig) -> Result<Option<Tls>, TlsError> {
        let (Some(cert_path), Some(key_path)) = (&config.cert, &config.key) else {
            return Ok(None);
        };
        let chain = read_certificates(cert_path)?;
        let key = read_key(key_path)?;
        let server = |alpn: &[u8]| -> Result<TlsAcceptor, TlsError> {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .and_then(|b| {
                    b.with_no_client_auth()
                        .with_single_cert(chain.clone(), key.clone_key())
                })
                .context(RejectedSnafu {
                    cert: cert_path.clone(),
                    key: key_path.clone(),
                })?;
            config.alpn_protocols = vec![alpn.to_vec()];
            Ok(TlsAcceptor::from(Arc::new(config)))
        };
        let postgres = server(POSTGRES_ALPN)?;
        let http = server(b"http/1.1")?;
        let mysql = mysql_rustls::ServerConfig::builder_with_provider(Arc::new(
            mysql_rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .and_then(|b| {
            b.with_no_client_auth()
                .with_single_cert(chain.clone(), key.clone_key())
        })
        .context(MysqlRejectedSnafu {
            cert: cert_path.clone(),
            key: key_path.clone(),
        })?;
        let summary = format!(
            "certificate {} ({} certificate{} in the chain), key {}; PostgreSQL (SSLRequest), \
             HTTPS only on the HTTP address, MySQL; {}",
            cert_path.display(),
            chain.len(),
            if chain.len() == 1 { "" } else { "s" },
            key_path.display(),
            if config.require {
                "plaintext PostgreSQL and MySQL logins are refused (--require-tls)"
            } else {
                "plaintext PostgreSQL and MySQL logins are still accepted (--require-tls refuses them)"
            }
        );
        Ok(Some(Tls {
            postgres,
            http,
            mysql: Arc::new(mysql),
            require: config.require,
            summary: summary.into(),
        }))
    }

    /// For the PostgreSQL door, after it answered an SSLRequest with 'S'.
    pub fn postgres(&self) -> &TlsAcceptor {
        &self.postgres
    }

    /// For the HTTP door: every connection is HTTPS.
    pub fn http(&self) -> &TlsAcceptor {
        &self.http
    }

    /// For the MySQL door (opensrv-mysql's rustls).
    pub fn mysql(&self) -> Arc<mysql_rustls::ServerConfig> {
        self.mysql.clone()
    }

    /// Whether plaintext logins are refused.
    pub fn require(&self) -> bool {
        self.require
    }

    /// What is served, for the startup log.
    pub fn summary(&self) -> &str {
        &self.summary
    }
}

/// A PEM file: its sections (kind, DER) and its text, for hints.
struct PemFile {
    sections: Vec<(SectionKind, Vec<u8>)>,
    text: String,
}

/// Reads `path`; sections of unknown kinds are skipped.
fn read_pem(path: &Path, what: &'static str, setting: &'static str) -> Result<PemFile, TlsError> {
    let bytes = std::fs::read(path).context(ReadFileSnafu {
        what,
        setting,
        path: path.to_path_buf(),
    })?;
    let sections = <(SectionKind, Vec<u8>)>::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .context(BadPemSnafu {
            what,
            setting,
            path: path.to_path_buf(),
        })?;
    Ok(PemFile {
        sections,
        text: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

fn is_key(kind: SectionKind) -> bool {
    matches!(
        kind,
        SectionKind::PrivateKey | SectionKind::RsaPrivateKey | SectionKind::EcPrivateKey
    )
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let PemFile {
        sections: found,
        text,
    } = read_pem(path, "certificate", "--tls-cert")?;
    let chain: Vec<CertificateDer<'static>> = found
        .iter()
        .filter(|(kind, _)| *kind == SectionKind::Certificate)
        .map(|(_, der)| CertificateDer::from(der.clone()))
        .collect();
    if chain.is_empty() {
        let hint = if found.iter().any(|(kind, _)| is_key(*kind)) || text.contains("PRIVATE KEY") {
            ": it holds a private key; are --tls-cert and --tls-key swapped?"
        } else if found.iter().any(|(kind, _)| *kind == SectionKind::Csr) {
            ": it holds a certificate request (CSR), which a CA must sign first"
        } else {
            ""
        };
        return NoCertificateSnafu {
            path: path.to_path_buf(),
            hint,
        }
        .fail();
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let PemFile {
        sections: found,
        text,
    } = read_pem(path, "key", "--tls-key")?;
    let mut keys: Vec<PrivateKeyDer<'static>> = found
        .into_iter()
        .filter_map(|(kind, der)| match kind {
            SectionKind::PrivateKey => Some(PrivatePkcs8KeyDer::from(der).into()),
            SectionKind::RsaPrivateKey => Some(PrivatePkcs1KeyDer::from(der).into()),
            SectionKind::EcPrivateKey => Some(PrivateSec1KeyDer::from(der).into()),
            _ => None,
        })
        .collect();
    match keys.len() {
        1 => Ok(keys.remove(0)),
        0 if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") => {
            EncryptedKeySnafu {
                path: path.to_path_buf(),
            }
            .fail()
        }
        0 => NoKeySnafu {
            path: path.to_path_buf(),
            hint: if text.contains("BEGIN CERTIFICATE") {
                ": it holds a certificate; are --tls-cert and --tls-key swapped?"
            } else {
                ""
            },
        }
        .fail(),
        count => SeveralKeysSnafu {
            path: path.to_path_buf(),
            count,
        }
        .fail(),
    }
}

/// Certificates for tests, made with the `openssl` CLI.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;
    use std::process::Command;

    pub fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A self-signed EC certificate `name.pem` with its key `name.key`.
    pub fn self_signed(dir: &Path, name: &str) {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}"),
            ],
        );
    }

    /// A CA `ca.pem` and the certificate `server.pem` (key `server.key`) it
    /// signs for localhost.
    pub fn ca_and_server(dir: &Path) {
        self_signed(dir, "ca");
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        );
        std::fs::write(dir.join("server.ext"), "subjectAltName=DNS:localhost\n").unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "server.ext",
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{openssl, self_signed};
    use super::*;

    fn load(dir: &Path, cert: &str, key: &str) -> Result<Option<Tls>, TlsError> {
        Tls::load(&TlsConfig {
            cert: Some(dir.join(cert)),
            key: Some(dir.join(key)),
            require: false,
        })
    }

    #[test]
    fn loads_a_certificate_and_its_key() {
        let dir = tempfile::tempdir().unwrap();
        self_signed(dir.path(), "a");
        let tls = load(dir.path(), "a.pem", "a.key").unwrap().unwrap();
        assert!(!tls.require());
        assert!(
            tls.summary().contains("1 certificate in the chain"),
            "{tls:?}"
        );
        assert!(Tls::load(&TlsConfig::default()).unwrap().is_none());
    }

    #[test]
    fn unusable_files_say_which_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        self_signed(d, "a");
        self_signed(d, "b");
        std::fs::write(d.join("empty"), "").unwrap();
        std::fs::write(
            d.join("broken.pem"),
            "-----BEGIN CERTIFICATE-----\nnot base64!\n",
        )
        .unwrap();
        let both = format!(
            "{}{}",
            std::fs::read_to_string(d.join("a.key")).unwrap(),
            std::fs::read_to_string(d.join("b.key")).unwrap()
        );
        std::fs::write(d.join("two.key"), both).unwrap();
        openssl(
            d,
            &[
                "pkey", "-in", "a.key", "-out", "enc.key", "-aes256", "-passout", "pass:x",
            ],
        );

        let message = |cert: &str, key: &str| load(d, cert, key).unwrap_err().to_string();
        let m = message("missing.pem", "a.key");
        assert!(
            m.contains("cannot read the TLS certificate file") && m.contains("missing.pem"),
            "{m}"
        );
        let m = message("a.pem", "missing.key");
        assert!(m.contains("cannot read the TLS key file"), "{m}");
        let m = message("empty", "a.key");
        assert!(m.contains("holds no certificate"), "{m}");
        let m = message("broken.pem", "a.key");
        assert!(m.contains("is not valid PEM"), "{m}");
        let m = message("a.key", "a.pem");
        assert!(m.contains("swapped"), "{m}");
        let m = message("a.pem", "empty");
        assert!(m.contains("holds no private key"), "{m}");
        let m = message("a.pem", "b.key");
        assert!(m.contains("is not the key of the certificate"), "{m}");
        let m = message("a.pem", "enc.key");
        assert!(m.contains("encrypted private key"), "{m}");
        let m = message("a.pem", "two.key");
        assert!(m.contains("2 private keys"), "{m}");
    }
}
