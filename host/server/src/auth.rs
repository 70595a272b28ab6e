//! Logins on every front door: who a connection or request acts as.
//!
//! - With `--auth none` everyone is [`Principal::Root`]; the configuration
//!   refuses it unless every listen address is a loopback address.
//! - Otherwise a client proves a user's password: SCRAM-SHA-256 on the
//!   PostgreSQL door, `mysql_native_password` on the MySQL door, the password
//!   itself over HTTP (Basic, InfluxDB's `u`/`p` and `Token user:password`),
//!   checked against the verifiers of [`sandflow::auth`].
//! - A failed login is logged with the user and the peer's address and
//!   counted in `sandflow_auth_failures_total`; after a few failures from one
//!   address in a row, each further attempt from it waits longer (up to
//!   [`MAX_DELAY`]). (A statement refused for lack of privileges is logged
//!   and counted by the session, `sandflow_permission_denied_total`.)
//! - `--max-connections-per-user` caps the connections one user holds.
//! - On the first start with authentication, [`bootstrap`] creates the
//!   superuser `sandflow`.
//!
//! Must not know SQL, sessions or the wire protocols: doors pass names,
//! passwords and addresses, and get a principal or an error.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandflow::auth::{Principal, SUPERUSER};
use sandflow::database::Database;
use sandflow::error::Error;
use sandflow::metrics::Counter;
use tracing::{info, warn};

use crate::config::AuthMode;

/// Failures from one address before attempts are slowed down.
const FREE_FAILURES: u32 = 3;
/// The longest an attempt is held back.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// Failures older than this are forgotten.
const FAILURE_MEMORY: Duration = Duration::from_secs(300);

/// Logins, failures and connection counts of one server.
pub struct Gate {
    mode: AuthMode,
    db: Arc<Database>,
    per_user: Option<usize>,
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
    connections: Arc<Mutex<HashMap<String, usize>>>,
    failed_logins: HashMap<&'static str, Counter>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("mode", &self.mode).finish()
    }
}

/// A connection counted against its user's limit, until dropped.
#[derive(Debug)]
pub struct UserSlot {
    user: Option<String>,
    connections: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        let Some(user) = &self.user else { return };
        let mut c = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(user);
            }
        }
    }
}

fn auth_failed(user: &str) -> Error {
    Error::AuthFailed {
        message: format!("password authentication failed for user \"{user}\""),
    }
}

impl Gate {
    pub fn new(db: Arc<Database>, mode: AuthMode, per_user: Option<usize>) -> Gate {
        let doors = ["postgres", "http", "mysql"];
        let failed_logins = doors
            .iter()
            .map(|d| {
                (
                    *d,
                    db.metrics().counter(
                        "sandflow_auth_failures_total",
                        "Logins refused: unknown user or wrong password.",
                        &[("frontdoor", d)],
                    ),
                )
            })
            .collect();
        Gate {
            mode,
            db,
            per_user,
            failures: Mutex::new(HashMap::new()),
            connections: Arc::new(Mutex::new(HashMap::new())),
            failed_logins,
        }
    }

    /// Whether clients log in at all.
    pub fn required(&self) -> bool {
        self.mode == AuthMode::Password
    }

    /// Waits before an attempt from an address that failed repeatedly.
    pub async fn throttle(&self, peer: IpAddr) {
        let delay = {
            let f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
            match f.get(&peer) {
                Some((n, at)) if *n >= FREE_FAILURES && at.elapsed() < FAILURE_MEMORY => {
                    let steps = (*n - FREE_FAILURES).min(5);
                    (Duration::from_millis(250) * 2u32.pow(steps)).min(MAX_DELAY)
                }
                _ => Duration::ZERO,
            }
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    /// Records a failed login: logged, counted, and remembered for
    /// [`Gate::throttle`]; returns the error for the client.
    pub fn failed(&self, door: &'static str, user: &str, peer: IpAddr, why: &str) -> Error {
        warn!(frontdoor = door, user, peer = %peer, "login failed: {why}");
        if let Some(c) = self.failed_logins.get(door) {
            c.inc();
        }
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() > 100_000 {
            f.retain(|_, (_, at)| at.elapsed() < FAILURE_MEMORY);
        }
        let e = f.entry(peer).or_insert((0, Instant::now()));
        if e.1.elapsed() >= FAILURE_MEMORY {
            e.0 = 0;
        }
        e.0 = e.0.saturating_add(1);
        e.1 = Instant::now();
        auth_failed(user)
    }

    /// Records a successful login from `peer`.
    pub fn succeeded(&self, peer: IpAddr) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.remove(&peer);
    }

    /// Checks `user`'s `password` (sent in the clear: HTTP, over TLS when
    /// configured); `Root` without authentication.
    pub async fn password(
        &self,
        door: &'static str,
        peer: IpAddr,
        user: &str,
        password: &str,
    ) -> Result<Principal, Error> {
        if !self.required() {
            return Ok(Principal::Root);
        }
        self.throttle(peer).await;
        let (db, u, p) = (self.db.clone(), user.to_string(), password.to_string());
        let ok = tokio::task::spawn_blocking(move || db.access().check_password(&u, &p))
            .await
            .unwrap_or(false);
        if ok {
            self.succeeded(peer);
            Ok(Principal::User(user.to_string()))
        } else {
            Err(self.failed(door, user, peer, "wrong password or unknown user"))
        }
    }

    /// Counts a connection of `who` against `--max-connections-per-user`.
    pub fn connect(&self, who: &Principal) -> Result<UserSlot, Error> {
        let Principal::User(user) = who else {
            return Ok(UserSlot {
                user: None,
                connections: self.connections.clone(),
            });
        };
        let mut c = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.entry(user.clone()).or_insert(0);
        if let Some(limit) = self.per_user {
            if *n >= limit {
                return Err(Error::LimitExceeded {
                    message: format!(
                        "too many connections for user \"{user}\": it holds {n}, the limit is \
                         {limit} (--max-connections-per-user); close some first"
                    ),
                });
            }
        }
        *n += 1;
        Ok(UserSlot {
            user: Some(user.clone()),
            connections: self.connections.clone(),
        })
    }
}

/// On a database without users (the first start with authentication),
/// creates the superuser `sandflow`: its password is
/// `SANDFLOW_ADMIN_PASSWORD`'s, or generated, written to
/// `<data-dir>/admin-password` (mode 0600) and logged once.
pub async fn bootstrap(db: &Database, data_dir: &Path) -> Result<(), String> {
    if db.access().has_users() {
        return Ok(());
    }
    let given = std::env::var("SANDFLOW_ADMIN_PASSWORD")
        .ok()
        .filter(|p| !p.is_empty());
    let password = match &given {
        Some(p) => p.clone(),
        None => {
            use rand::RngExt;
            const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
            let mut rng = rand::rng();
            (0..24)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
                .collect()
        }
    };
    if given.is_none() {
        let path = data_dir.join("admin-password");
        write_private(&path, &format!("{password}\n"))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let created = db
        .bootstrap_superuser(&password)
        .await
        .map_err(|e| format!("cannot create the superuser {SUPERUSER}: {e}"))?;
    if created {
        match given {
            Some(_) => info!(
                "created the superuser {SUPERUSER} with the password from SANDFLOW_ADMIN_PASSWORD"
            ),
            None => info!(
                "created the superuser {SUPERUSER} with the generated password {password} (also \
                 in {}); log in with it and create users for your tenants",
                data_dir.join("admin-password").display()
            ),
        }
    }
    Ok(())
}

/// Writes `text` to a new file only its owner may read.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(text.as_bytes())?;
    f.sync_all()
}
