//! Who may do what: users, their password verifiers, their privileges on
//! databases and tables, database owners and tenant quotas.
//!
//! - **Principals.** Every session runs as a [`Principal`]: `Root` (the
//!   library's own sessions and servers started with `--auth none`: allowed
//!   everything) or a named user, whose rights are looked up in the current
//!   state at every check, so a GRANT or REVOKE takes effect on sessions that
//!   are already open, and a dropped user can do nothing more.
//! - **Privileges** are `SELECT`, `INSERT`, `DELETE` and `CREATE` (tables
//!   and flows), granted on a database (all its tables, now and later) or on
//!   one table. A superuser may do everything; a database's owner (its
//!   creator) has every privilege on it and may grant them. DDL on a table
//!   (ALTER, DROP) needs CREATE on its database.
//! - **Visibility.** A user sees a database when they have any privilege on
//!   it or on one of its tables, and a table when they have any privilege on
//!   it or on its database: listings (SHOW, information_schema, pg_catalog)
//!   show only that.
//! - **Quotas** per database ([`Quotas`]), set by a superuser.
//!
//! The whole state is one metadata entry (`auth/state`), rewritten in one
//! storage commit per change, so a change is all or nothing and survives a
//! crash. Passwords are kept only as salted SCRAM verifiers (and the MySQL
//! double SHA-1, see [`scram`]).
//!
//! Must not know SQL text, sessions or front doors: callers say which
//! privilege on which object; this module answers yes, or why not.

pub mod scram;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::error::{
    Error, InternalSnafu, InvalidDataSnafu, LimitExceededSnafu, NotFoundSnafu,
    PermissionDeniedSnafu, Result, SqlSnafu,
};
use crate::storage::{MetaWrite, Store};
use scram::{MysqlNative, Verifier};

/// The superuser created on a server's first start.
pub const SUPERUSER: &str = "sandflow";
/// The metadata key of the whole access state.
const STATE_KEY: &str = "auth/state";

/// Who a session (or a flow) acts as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// Allowed everything, checked by nothing: the library's sessions and a
    /// server without authentication.
    Root,
    /// A user of the database, checked at every statement.
    User(String),
}

impl Principal {
    /// The name `current_user` shows.
    pub fn name(&self) -> &str {
        match self {
            Principal::Root => SUPERUSER,
            Principal::User(n) => n,
        }
    }
}

/// A privilege on a database or table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Privilege {
    Select,
    Insert,
    Delete,
    Create,
}

impl Privilege {
    pub const EVERY: [Privilege; 4] = [
        Privilege::Select,
        Privilege::Insert,
        Privilege::Delete,
        Privilege::Create,
    ];

    fn bit(self) -> u8 {
        match self {
            Privilege::Select => 1,
            Privilege::Insert => 2,
            Privilege::Delete => 4,
            Privilege::Create => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Privilege::Select => "SELECT",
            Privilege::Insert => "INSERT",
            Privilege::Delete => "DELETE",
            Privilege::Create => "CREATE",
        }
    }

    /// The privilege a keyword names (`ALL` is handled by the caller).
    pub fn from_name(name: &str) -> Option<Privilege> {
        match name.to_ascii_uppercase().as_str() {
            "SELECT" => Some(Privilege::Select),
            "INSERT" => Some(Privilege::Insert),
            "DELETE" => Some(Privilege::Delete),
            "CREATE" => Some(Privilege::Create),
            _ => None,
        }
    }
}

/// What a GRANT or REVOKE is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantTarget {
    Database(String),
    Table { database: String, table: String },
}

impl std::fmt::Display for GrantTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrantTarget::Database(d) => write!(f, "DATABASE {d}"),
            GrantTarget::Table { database, table } => write!(f, "TABLE {database}.{table}"),
        }
    }
}

/// A database's limits; `None`: unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_flows: Option<u64>,
    /// The sum of its flows' memory limits, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_memory_limit: Option<u64>,
    /// The highest `cpu_limit_per_tick` one of its flows may have, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpu_limit_per_tick_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tables: Option<u64>,
    /// Bytes its tables' rows take in storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_storage: Option<u64>,
}

/// The quota option names, as `CREATE DATABASE ... WITH (...)` takes them.
pub const QUOTA_OPTIONS: [&str; 5] = [
    "max_flows",
    "flow_memory_limit",
    "max_cpu_limit_per_tick",
    "max_tables",
    "max_storage",
];

impl Quotas {
    /// Applies `name = value` options (`'unlimited'`, `'none'` or `0`
    /// removes a limit).
    pub fn apply(&mut self, options: &[(String, String)]) -> Result<()> {
        for (name, value) in options {
            let v = value.trim();
            let off = matches!(v.to_ascii_lowercase().as_str(), "unlimited" | "none" | "0");
            let bad = |why: String| {
                InvalidDataSnafu {
                    message: format!("invalid value '{value}' for database option {name}: {why}"),
                }
                .build()
            };
            let count = || -> Result<Option<u64>> {
                if off {
                    return Ok(None);
                }
                crate::flow::options::parse_count(v).map(Some).map_err(bad)
            };
            let size = || -> Result<Option<u64>> {
                if off {
                    return Ok(None);
                }
                crate::flow::options::parse_size(v)
                    .map(|n| Some(n as u64))
                    .map_err(bad)
            };
            match name.to_ascii_lowercase().as_str() {
                "max_flows" => self.max_flows = count()?,
                "max_tables" => self.max_tables = count()?,
                "flow_memory_limit" => self.flow_memory_limit = size()?,
                "max_storage" => self.max_storage = size()?,
                "max_cpu_limit_per_tick" => {
                    self.max_cpu_limit_per_tick_ms = if off {
                        None
                    } else {
                        Some(crate::schema::interval::parse_interval(v).map_err(bad)? as u64)
                    }
                }
                other => {
                    return InvalidDataSnafu {
                        message: format!(
                            "unknown database option '{other}'; the options are {}",
                            QUOTA_OPTIONS.join(", ")
                        ),
                    }
                    .fail()
                }
            }
        }
        Ok(())
    }

    /// The quotas as `name = value` pairs, for SHOW.
    pub fn describe(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(n) = self.max_flows {
            out.push(("max_flows", n.to_string()));
        }
        if let Some(n) = self.flow_memory_limit {
            out.push(("flow_memory_limit", n.to_string()));
        }
        if let Some(n) = self.max_cpu_limit_per_tick_ms {
            out.push(("max_cpu_limit_per_tick", format!("{n}ms")));
        }
        if let Some(n) = self.max_tables {
            out.push(("max_tables", n.to_string()));
        }
        if let Some(n) = self.max_storage {
            out.push(("max_storage", n.to_string()));
        }
        out
    }
}

/// A user as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct User {
    #[serde(default)]
    superuser: bool,
    #[serde(default)]
    createdb: bool,
    #[serde(default)]
    scram: Option<Verifier>,
    #[serde(default)]
    mysql: Option<MysqlNative>,
    #[serde(default)]
    grants: Vec<Grant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Grant {
    database: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    table: Option<String>,
    /// Bits of [`Privilege::bit`].
    privileges: u8,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct DatabaseAccess {
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    quotas: Quotas,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    #[serde(default)]
    users: BTreeMap<String, User>,
    #[serde(default)]
    databases: BTreeMap<String, DatabaseAccess>,
}

/// Options of CREATE USER and ALTER USER.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserOptions {
    /// `Some(None)`: `PASSWORD NULL` (no password: cannot log in).
    pub password: Option<Option<String>>,
    pub superuser: Option<bool>,
    pub createdb: Option<bool>,
}

/// Users, grants, owners and quotas; see the module docs.
#[derive(Debug, Default)]
pub struct Access {
    state: RwLock<Arc<State>>,
    /// Serialises changes (read, change, store, publish).
    write: Mutex<()>,
    /// Passwords checked recently (user, SHA-256 of salt and password):
    /// PBKDF2 is slow on purpose, and HTTP clients send the password with
    /// every request. Cleared by every change.
    checked: Mutex<HashSet<(String, [u8; 32])>>,
}

fn poisoned() -> Error {
    InternalSnafu {
        message: "the access state's lock was poisoned by an earlier panic; restart the server",
    }
    .build()
}

fn denied(message: String) -> Error {
    PermissionDeniedSnafu { message }.build()
}

impl Access {
    /// The state stored in `store` (empty on a new database).
    pub fn load(store: &Store) -> Result<Access> {
        let state = match store.get_meta(STATE_KEY)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                InternalSnafu {
                    message: format!("the stored users and grants cannot be read: {e}"),
                }
                .build()
            })?,
            None => State::default(),
        };
        Ok(Access {
            state: RwLock::new(Arc::new(state)),
            ..Access::default()
        })
    }

    fn current(&self) -> Arc<State> {
        self.state
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Changes the state with `f` and stores it, all or nothing.
    fn change<T>(&self, store: &Store, f: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let _guard = self.write.lock().map_err(|_| poisoned())?;
        let mut next = (*self.current()).clone();
        let out = f(&mut next)?;
        let bytes = serde_json::to_vec(&next).map_err(|e| {
            InternalSnafu {
                message: format!("cannot encode users and grants: {e}"),
            }
            .build()
        })?;
        store.commit_meta(vec![MetaWrite::Put(STATE_KEY.into(), bytes)])?;
        *self.state.write().map_err(|_| poisoned())? = Arc::new(next);
        if let Ok(mut c) = self.checked.lock() {
            c.clear();
        }
        Ok(out)
    }

    /// Whether any user exists.
    pub fn has_users(&self) -> bool {
        !self.current().users.is_empty()
    }

    /// Whether `name` is a user.
    pub fn user_exists(&self, name: &str) -> bool {
        self.current().users.contains_key(name)
    }

    /// Creates the superuser [`SUPERUSER`] with `password` unless a user
    /// exists already; returns whether it did.
    pub fn bootstrap(&self, store: &Store, password: &str) -> Result<bool> {
        if self.has_users() {
            return Ok(false);
        }
        self.change(store, |s| {
            if !s.users.is_empty() {
                return Ok(false);
            }
            s.users.insert(
                SUPERUSER.to_string(),
                User {
                    superuser: true,
                    createdb: true,
                    scram: Some(Verifier::new(password)),
                    mysql: Some(MysqlNative::new(password)),
                    grants: Vec::new(),
                },
            );
            Ok(true)
        })
    }

    /// The SCRAM verifier of `user`, if the user exists and has a password.
    pub fn verifier(&self, user: &str) -> Option<Verifier> {
        self.current().users.get(user).and_then(|u| u.scram.clone())
    }

    /// The MySQL native-password hash of `user`.
    pub fn mysql_native(&self, user: &str) -> Option<MysqlNative> {
        self.current().users.get(user).and_then(|u| u.mysql.clone())
    }

    /// Checks a password sent in the clear (HTTP Basic, line protocol).
    pub fn check_password(&self, user: &str, password: &str) -> bool {
        let Some(v) = self.verifier(user) else {
            return false;
        };
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(v.salt.as_bytes());
        h.update([0]);
        h.update(password.as_bytes());
        let key = (user.to_string(), h.finalize().into());
        if self.checked.lock().is_ok_and(|c| c.contains(&key)) {
            return true;
        }
        let ok = v.check_password(password);
        if ok {
            if let Ok(mut c) = self.checked.lock() {
                if c.len() > 10_000 {
                    c.clear();
                }
                c.insert(key);
            }
        }
        ok
    }

    /// Whether the principal may do everything.
    pub fn is_superuser(&self, who: &Principal) -> bool {
        match who {
            Principal::Root => true,
            Principal::User(n) => self.current().users.get(n).is_some_and(|u| u.superuser),
        }
    }

    fn require_superuser(&self, who: &Principal, what: &str) -> Result<()> {
        if self.is_superuser(who) {
            return Ok(());
        }
        Err(denied(format!(
            "permission denied: only a superuser may {what} (user {} is not one)",
            who.name()
        )))
    }

    fn privileges_of(state: &State, user: &str, database: &str, table: Option<&str>) -> u8 {
        let Some(u) = state.users.get(user) else {
            return 0;
        };
        if u.superuser
            || state
                .databases
                .get(database)
                .and_then(|d| d.owner.as_deref())
                == Some(user)
        {
            return 0xff;
        }
        u.grants
            .iter()
            .filter(|g| {
                g.database == database && (g.table.is_none() || g.table.as_deref() == table)
            })
            .fold(0, |acc, g| acc | g.privileges)
    }

    /// Allows `privilege` on `database` (and `table`, if given) to `who`, or
    /// says why not.
    pub fn check(
        &self,
        who: &Principal,
        privilege: Privilege,
        database: &str,
        table: Option<&str>,
    ) -> Result<()> {
        let Principal::User(user) = who else {
            return Ok(());
        };
        let state = self.current();
        if !state.users.contains_key(user) {
            return Err(denied(format!(
                "permission denied: user {user} no longer exists"
            )));
        }
        if Self::privileges_of(&state, user, database, table) & privilege.bit() != 0 {
            return Ok(());
        }
        let p = privilege.name();
        Err(denied(match table {
            Some(t) => format!(
                "permission denied for table {database}.{t}: user {user} has no {p} privilege \
                 on it; a superuser or the owner of database {database} can GRANT {p} ON TABLE \
                 {database}.{t} TO {user}"
            ),
            None => format!(
                "permission denied for database {database}: user {user} has no {p} privilege \
                 on it; a superuser or its owner can GRANT {p} ON DATABASE {database} TO {user}"
            ),
        }))
    }

    /// Whether `who` may see `database` (some privilege on it or on one of
    /// its tables).
    pub fn can_see_database(&self, who: &Principal, database: &str) -> bool {
        let Principal::User(user) = who else {
            return true;
        };
        let state = self.current();
        let Some(u) = state.users.get(user) else {
            return false;
        };
        u.superuser
            || state
                .databases
                .get(database)
                .and_then(|d| d.owner.as_deref())
                == Some(user.as_str())
            || u.grants
                .iter()
                .any(|g| g.database == database && g.privileges != 0)
    }

    /// Whether `who` may see `database.table`.
    pub fn can_see_table(&self, who: &Principal, database: &str, table: &str) -> bool {
        let Principal::User(user) = who else {
            return true;
        };
        Self::privileges_of(&self.current(), user, database, Some(table)) != 0
    }

    /// The owner of `database` (`None`: superusers only).
    pub fn owner(&self, database: &str) -> Option<String> {
        self.current()
            .databases
            .get(database)
            .and_then(|d| d.owner.clone())
    }

    /// The quotas of `database`.
    pub fn quotas(&self, database: &str) -> Quotas {
        self.current()
            .databases
            .get(database)
            .map(|d| d.quotas.clone())
            .unwrap_or_default()
    }

    /// Refuses CREATE DATABASE unless `who` is a superuser or has CREATEDB.
    pub fn check_create_database(
        &self,
        who: &Principal,
        options: &[(String, String)],
    ) -> Result<()> {
        let Principal::User(user) = who else {
            return Ok(());
        };
        let state = self.current();
        let u = state.users.get(user);
        if !options.is_empty() && !u.is_some_and(|u| u.superuser) {
            return Err(denied(format!(
                "permission denied: only a superuser may set a database's quotas (user {user} \
                 is not one)"
            )));
        }
        if u.is_some_and(|u| u.superuser || u.createdb) {
            return Ok(());
        }
        Err(denied(format!(
            "permission denied to create database: user {user} is neither a superuser nor has \
             CREATEDB; a superuser can ALTER USER {user} CREATEDB"
        )))
    }

    /// Records a new database: `who` owns it (a user; Root's databases are
    /// owned by no one but superusers), with `quotas`.
    pub fn database_created(
        &self,
        store: &Store,
        who: &Principal,
        database: &str,
        quotas: Quotas,
    ) -> Result<()> {
        let owner = match who {
            Principal::Root => None,
            Principal::User(u) => Some(u.clone()),
        };
        if owner.is_none() && quotas == Quotas::default() && !self.has_users() {
            return Ok(());
        }
        self.change(store, |s| {
            s.databases
                .insert(database.to_string(), DatabaseAccess { owner, quotas });
            Ok(())
        })
    }

    /// Forgets a dropped database: its owner, quotas and every grant on it.
    pub fn database_dropped(&self, store: &Store, database: &str) -> Result<()> {
        let state = self.current();
        let mentioned = state.databases.contains_key(database)
            || state
                .users
                .values()
                .any(|u| u.grants.iter().any(|g| g.database == database));
        if !mentioned {
            return Ok(());
        }
        self.change(store, |s| {
            s.databases.remove(database);
            for u in s.users.values_mut() {
                u.grants.retain(|g| g.database != database);
            }
            Ok(())
        })
    }

    /// Forgets the grants on a dropped table.
    pub fn table_dropped(&self, store: &Store, database: &str, table: &str) -> Result<()> {
        let is_it = |g: &Grant| g.database == database && g.table.as_deref() == Some(table);
        if !self
            .current()
            .users
            .values()
            .any(|u| u.grants.iter().any(is_it))
        {
            return Ok(());
        }
        self.change(store, |s| {
            for u in s.users.values_mut() {
                u.grants.retain(|g| !is_it(g));
            }
            Ok(())
        })
    }

    /// `ALTER DATABASE db SET (...)`: superusers only.
    pub fn set_quotas(
        &self,
        store: &Store,
        who: &Principal,
        database: &str,
        options: &[(String, String)],
    ) -> Result<()> {
        self.require_superuser(who, "change a database's quotas")?;
        let mut quotas = self.quotas(database);
        quotas.apply(options)?;
        self.change(store, |s| {
            s.databases.entry(database.to_string()).or_default().quotas = quotas;
            Ok(())
        })
    }

    /// CREATE USER.
    pub fn create_user(
        &self,
        store: &Store,
        who: &Principal,
        name: &str,
        options: &UserOptions,
        if_not_exists: bool,
    ) -> Result<bool> {
        self.require_superuser(who, "create users")?;
        check_user_name(name)?;
        self.change(store, |s| {
            if s.users.contains_key(name) {
                if if_not_exists {
                    return Ok(false);
                }
                return SqlSnafu {
                    message: format!("role \"{name}\" already exists"),
                }
                .fail();
            }
            let mut user = User::default();
            apply_user_options(&mut user, options);
            s.users.insert(name.to_string(), user);
            Ok(true)
        })
    }

    /// ALTER USER: a superuser changes anything; a user may change their own
    /// password only.
    pub fn alter_user(
        &self,
        store: &Store,
        who: &Principal,
        name: &str,
        options: &UserOptions,
    ) -> Result<()> {
        let own_password = who == &Principal::User(name.to_string())
            && options.superuser.is_none()
            && options.createdb.is_none();
        if !own_password {
            self.require_superuser(who, "change other users or anyone's SUPERUSER/CREATEDB")?;
        }
        self.change(store, |s| {
            let Some(user) = s.users.get_mut(name) else {
                return NotFoundSnafu {
                    message: format!("role \"{name}\" does not exist"),
                }
                .fail();
            };
            apply_user_options(user, options);
            if !s.users.values().any(|u| u.superuser) {
                return InvalidDataSnafu {
                    message: format!(
                        "cannot take SUPERUSER from {name}: it is the last superuser, and \
                         nobody could manage users any more"
                    ),
                }
                .fail();
            }
            Ok(())
        })
    }

    /// DROP USER: the databases it owned are then owned by superusers only.
    pub fn drop_user(
        &self,
        store: &Store,
        who: &Principal,
        name: &str,
        if_exists: bool,
    ) -> Result<bool> {
        self.require_superuser(who, "drop users")?;
        if who == &Principal::User(name.to_string()) {
            return InvalidDataSnafu {
                message: "the current user cannot be dropped; log in as another superuser",
            }
            .fail();
        }
        self.change(store, |s| {
            if s.users.remove(name).is_none() {
                if if_exists {
                    return Ok(false);
                }
                return NotFoundSnafu {
                    message: format!("role \"{name}\" does not exist"),
                }
                .fail();
            }
            if !s.users.values().any(|u| u.superuser) {
                return InvalidDataSnafu {
                    message: format!("cannot drop {name}: it is the last superuser"),
                }
                .fail();
            }
            for d in s.databases.values_mut() {
                if d.owner.as_deref() == Some(name) {
                    d.owner = None;
                }
            }
            Ok(true)
        })
    }

    /// Whether `who` may grant on `target`'s database: a superuser or its
    /// owner.
    fn check_grantor(&self, who: &Principal, database: &str) -> Result<()> {
        let Principal::User(user) = who else {
            return Ok(());
        };
        if self.is_superuser(who) || self.owner(database).as_deref() == Some(user) {
            return Ok(());
        }
        Err(denied(format!(
            "permission denied: only a superuser or the owner of database {database} may grant \
             or revoke privileges on it"
        )))
    }

    /// GRANT (`grant = true`) or REVOKE `privileges` on `target` to or from
    /// `users`.
    pub fn grant(
        &self,
        store: &Store,
        who: &Principal,
        privileges: &[Privilege],
        target: &GrantTarget,
        users: &[String],
        grant: bool,
    ) -> Result<()> {
        let (database, table) = match target {
            GrantTarget::Database(d) => (d.clone(), None),
            GrantTarget::Table { database, table } => (database.clone(), Some(table.clone())),
        };
        self.check_grantor(who, &database)?;
        let bits = privileges.iter().fold(0u8, |a, p| a | p.bit());
        self.change(store, |s| {
            for name in users {
                let Some(user) = s.users.get_mut(name) else {
                    return NotFoundSnafu {
                        message: format!(
                            "role \"{name}\" does not exist; CREATE USER {name} first"
                        ),
                    }
                    .fail();
                };
                match user
                    .grants
                    .iter_mut()
                    .find(|g| g.database == database && g.table == table)
                {
                    Some(g) if grant => g.privileges |= bits,
                    Some(g) => g.privileges &= !bits,
                    None if grant => user.grants.push(Grant {
                        database: database.clone(),
                        table: table.clone(),
                        privileges: bits,
                    }),
                    None => {}
                }
                if !grant && table.is_none() {
                    // REVOKE on a database also takes the privilege from its
                    // tables.
                    for g in user.grants.iter_mut().filter(|g| g.database == database) {
                        g.privileges &= !bits;
                    }
                }
                user.grants.retain(|g| g.privileges != 0);
            }
            Ok(())
        })
    }

    /// The users, for `information_schema`-like listings: (name,
    /// superuser, createdb). A non-superuser sees only themself.
    pub fn users(&self, who: &Principal) -> Vec<(String, bool, bool)> {
        let all = self.is_superuser(who);
        self.current()
            .users
            .iter()
            .filter(|(n, _)| all || Some(n.as_str()) == Some(who.name()))
            .map(|(n, u)| (n.clone(), u.superuser, u.createdb))
            .collect()
    }

    /// Every grant visible to `who`: (user, database, table, privileges).
    pub fn grants(&self, who: &Principal) -> Vec<(String, String, Option<String>, Vec<Privilege>)> {
        let state = self.current();
        let mut out = Vec::new();
        for (name, u) in &state.users {
            for g in &u.grants {
                let visible = self.is_superuser(who)
                    || who.name() == name
                    || state
                        .databases
                        .get(&g.database)
                        .and_then(|d| d.owner.as_deref())
                        == Some(who.name());
                if visible {
                    let privileges = Privilege::EVERY
                        .into_iter()
                        .filter(|p| g.privileges & p.bit() != 0)
                        .collect();
                    out.push((
                        name.clone(),
                        g.database.clone(),
                        g.table.clone(),
                        privileges,
                    ));
                }
            }
        }
        out
    }

    /// Refuses going over `quota` of `database`: `used` now, `adding` more.
    pub fn check_quota(
        &self,
        database: &str,
        quota: &str,
        limit: Option<u64>,
        used: u64,
        adding: u64,
        unit: &str,
    ) -> Result<()> {
        let Some(limit) = limit else { return Ok(()) };
        if used.saturating_add(adding) <= limit {
            return Ok(());
        }
        LimitExceededSnafu {
            message: format!(
                "quota {quota} of database {database} exceeded: {used}{unit} in use, this needs \
                 {adding}{unit} more, the quota is {limit}{unit}; a superuser can raise it with \
                 ALTER DATABASE {database} SET ({quota} = ...)"
            ),
        }
        .fail()
    }
}

fn apply_user_options(user: &mut User, options: &UserOptions) {
    if let Some(password) = &options.password {
        user.scram = password.as_deref().map(Verifier::new);
        user.mysql = password.as_deref().map(MysqlNative::new);
    }
    if let Some(s) = options.superuser {
        user.superuser = s;
    }
    if let Some(c) = options.createdb {
        user.createdb = c;
    }
}

fn check_user_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'));
    if ok {
        return Ok(());
    }
    InvalidDataSnafu {
        message: format!(
            "invalid user name '{name}': use 1 to 63 letters, digits, '_', '-', '.' or '@'"
        ),
    }
    .fail()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Principal {
        Principal::User("alice".into())
    }

    #[test]
    fn grants_open_and_revokes_close() {
        let store = Store::in_memory().unwrap();
        let access = Access::load(&store).unwrap();
        assert!(access.bootstrap(&store, "pw").unwrap());
        assert!(!access.bootstrap(&store, "other").unwrap());
        let admin = Principal::User(SUPERUSER.into());
        let opts = UserOptions {
            password: Some(Some("a".into())),
            ..Default::default()
        };
        access
            .create_user(&store, &admin, "alice", &opts, false)
            .unwrap();
        assert!(access
            .create_user(&store, &alice(), "bob", &opts, false)
            .is_err());
        let e = access
            .check(&alice(), Privilege::Select, "a", Some("t"))
            .unwrap_err();
        assert!(matches!(e, Error::PermissionDenied { .. }), "{e}");
        assert!(!access.can_see_database(&alice(), "a"));
        let t = GrantTarget::Table {
            database: "a".into(),
            table: "t".into(),
        };
        access
            .grant(
                &store,
                &admin,
                &[Privilege::Select],
                &t,
                &["alice".into()],
                true,
            )
            .unwrap();
        access
            .check(&alice(), Privilege::Select, "a", Some("t"))
            .unwrap();
        assert!(access
            .check(&alice(), Privilege::Select, "a", Some("u"))
            .is_err());
        assert!(access
            .check(&alice(), Privilege::Insert, "a", Some("t"))
            .is_err());
        assert!(access.can_see_database(&alice(), "a"));
        assert!(!access.can_see_table(&alice(), "a", "u"));
        // A revoke on the database also closes the table's grant.
        access
            .grant(
                &store,
                &admin,
                &[Privilege::Select],
                &GrantTarget::Database("a".into()),
                &["alice".into()],
                false,
            )
            .unwrap();
        assert!(access
            .check(&alice(), Privilege::Select, "a", Some("t"))
            .is_err());
        // State survives a reload; passwords are verifiers.
        let again = Access::load(&store).unwrap();
        assert!(again.check_password("alice", "a"));
        assert!(!again.check_password("alice", "b"));
        assert!(again.check_password(SUPERUSER, "pw"));
        let raw = String::from_utf8(store.get_meta(STATE_KEY).unwrap().unwrap()).unwrap();
        assert!(
            !raw.contains("\"pw\"") && raw.contains("stored_key"),
            "{raw}"
        );
        // The last superuser stays.
        assert!(again.drop_user(&store, &admin, SUPERUSER, false).is_err());
    }

    #[test]
    fn owners_grant_and_quotas_parse() {
        let store = Store::in_memory().unwrap();
        let access = Access::load(&store).unwrap();
        access.bootstrap(&store, "pw").unwrap();
        let admin = Principal::User(SUPERUSER.into());
        for n in ["alice", "bob"] {
            access
                .create_user(&store, &admin, n, &UserOptions::default(), false)
                .unwrap();
        }
        access
            .database_created(&store, &alice(), "a", Quotas::default())
            .unwrap();
        access
            .check(&alice(), Privilege::Create, "a", None)
            .unwrap();
        let bob = Principal::User("bob".into());
        access
            .grant(
                &store,
                &alice(),
                &[Privilege::Select],
                &GrantTarget::Database("a".into()),
                &["bob".into()],
                true,
            )
            .unwrap();
        access
            .check(&bob, Privilege::Select, "a", Some("x"))
            .unwrap();
        assert!(access
            .grant(
                &store,
                &bob,
                &[Privilege::Select],
                &GrantTarget::Database("a".into()),
                &["bob".into()],
                true
            )
            .is_err());
        let mut q = Quotas::default();
        q.apply(&[
            ("max_flows".into(), "2".into()),
            ("flow_memory_limit".into(), "64MiB".into()),
            ("max_cpu_limit_per_tick".into(), "1s".into()),
        ])
        .unwrap();
        assert_eq!(q.max_flows, Some(2));
        assert_eq!(q.flow_memory_limit, Some(64 << 20));
        assert_eq!(q.max_cpu_limit_per_tick_ms, Some(1000));
        assert!(q.apply(&[("max_rows".into(), "1".into())]).is_err());
        let e = access
            .check_quota("a", "max_flows", Some(2), 2, 1, "")
            .unwrap_err();
        assert!(e.to_string().contains("max_flows") && e.to_string().contains("2"));
    }
}
