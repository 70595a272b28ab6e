//! User components: flow components that users upload (`CREATE [OR REPLACE]
//! COMPONENT`, `PUT /v1/components/{name}`), which flows then run instead of
//! sandflow's engine (`CREATE FLOW ... USING COMPONENT c`).
//!
//! A component belongs to a database, like a table. Each upload of a name is
//! a new version (1, 2, ...); earlier versions are kept, so that a flow keeps
//! running the digest it was created with and can be moved back.
//!
//! Nothing of an upload runs before it is checked: the size cap, the header
//! (not wasm, a core module), then a compilation on a thread of its own with
//! a time bound, then the sandbox's check of its imports (only the contract
//! and the stubbed WASI) and of its export (the contract's version). Only
//! then are its bytes and its compiled form stored, in the database's own
//! storage, under the SHA-256 of the bytes; the compiled form carries its own
//! SHA-256, checked before wasmtime loads it after a restart, so a restart
//! does not compile again and nothing outside the database can swap it.
//!
//! Keys (metadata):
//! - `component/def/<len>/<database>/<name>`: a [`ComponentDef`] (JSON);
//! - `component/blob/<digest>`: the component's bytes;
//! - `component/compiled/<digest>`: SHA-256 of the compiled form (32 bytes),
//!   the sandbox's compatibility hash (8 bytes, little-endian), the compiled
//!   form.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tracing::{info, warn};

use super::manager::{ComponentCompiler, FlowComponent, FlowManager};
use crate::auth::{Principal, Privilege};
use crate::catalog::display_name;
use crate::database::Core;
use crate::error::{
    ComponentExistsSnafu, ComponentNotFoundSnafu, DatabaseNotFoundSnafu, FlowNotFoundSnafu,
    InUseSnafu, InternalSnafu, InvalidComponentSnafu, LimitExceededSnafu, PermissionDeniedSnafu,
    Result, StorageSnafu, TooLargeSnafu, UnsupportedSnafu,
};
use crate::runtime::{Digest, Sandbox, FLOW_WORLD_VERSION};
use crate::sql::parser::{ComponentRef, TableName};
use crate::sql::provider::blocking;
use crate::storage::WriteSet;

/// Prefix of every component key (reserved: see `WriteSet::check_user_meta`).
pub const KEY_PREFIX: &str = "component/";
const DEF_PREFIX: &str = "component/def/";
const BLOB_PREFIX: &str = "component/blob/";
const COMPILED_PREFIX: &str = "component/compiled/";

/// Compilations of uploads that may run at once (also those still running
/// past their time bound); another upload is refused until one ends.
const MAX_COMPILING: usize = 2;

/// A component and its versions, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentDef {
    pub database: String,
    pub name: String,
    /// Who uploaded the first version (`None`: without authentication).
    pub owner: Option<String>,
    /// Oldest first; never empty.
    pub versions: Vec<ComponentVersion>,
}

/// One upload of a component.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentVersion {
    pub version: u32,
    /// Hex SHA-256 of the bytes.
    pub digest: String,
    pub size: u64,
    /// The contract version it was checked against.
    pub world_version: String,
    pub created_ms: i64,
}

impl ComponentDef {
    /// The newest version.
    pub fn latest(&self) -> Option<&ComponentVersion> {
        self.versions.last()
    }

    pub fn version(&self, version: u32) -> Option<&ComponentVersion> {
        self.versions.iter().find(|v| v.version == version)
    }

    pub fn display_name(&self) -> String {
        display_name(&self.database, &self.name)
    }
}

fn def_key(database: &str, name: &str) -> String {
    // The database's length keeps `a/b`.`c` and `a`.`b/c` apart.
    format!("{DEF_PREFIX}{}/{database}/{name}", database.len())
}

fn blob_key(digest: &Digest) -> String {
    format!("{BLOB_PREFIX}{digest}")
}

/// The refusal of a compilation past its time.
fn too_slow<T>(limit: std::time::Duration) -> Result<T> {
    InvalidComponentSnafu {
        message: format!(
            "compiling the component took longer than {limit:?} and was given up; a flow \
             component must compile within that time"
        ),
    }
    .fail()
}

fn compiled_key(digest: &Digest) -> String {
    format!("{COMPILED_PREFIX}{digest}")
}

fn parse_digest(hex_text: &str) -> Result<Digest> {
    let bytes = hex::decode(hex_text).ok().filter(|b| b.len() == 32);
    match bytes {
        Some(b) => {
            let mut d = [0u8; 32];
            d.copy_from_slice(&b);
            Ok(Digest(d))
        }
        None => InternalSnafu {
            message: format!("stored component digest {hex_text:?} is not a SHA-256"),
        }
        .fail(),
    }
}

/// Every component of every database, by database and name.
pub(crate) fn list(core: &Core) -> Result<Vec<ComponentDef>> {
    let mut out = Vec::new();
    for (key, value) in core.store.scan_meta(DEF_PREFIX)? {
        match serde_json::from_slice::<ComponentDef>(&value) {
            Ok(def) => out.push(def),
            Err(e) => warn!(key, error = %e, "ignoring an unreadable component definition"),
        }
    }
    out.sort_by(|a, b| (&a.database, &a.name).cmp(&(&b.database, &b.name)));
    Ok(out)
}

fn get(core: &Core, database: &str, name: &str) -> Result<Option<ComponentDef>> {
    match core.store.get_meta(&def_key(database, name))? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            InternalSnafu {
                message: format!(
                    "stored definition of component {} is unreadable: {e}",
                    display_name(database, name)
                ),
            }
            .build()
        }),
    }
}

fn not_found(database: &str, name: &str) -> crate::Error {
    ComponentNotFoundSnafu {
        message: format!(
            "component {} does not exist; upload it with CREATE COMPONENT {} FROM '\\x...' or \
             PUT /v1/components/{name}?db={database} (SHOW COMPONENTS lists them)",
            display_name(database, name),
            display_name(database, name),
        ),
    }
    .build()
}

/// What an upload became.
#[derive(Debug, Clone)]
pub struct Uploaded {
    pub database: String,
    pub name: String,
    pub version: ComponentVersion,
}

/// The compiled form as stored: its SHA-256, the compatibility hash, itself.
fn seal(compatibility: u64, compiled: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + compiled.len());
    out.extend_from_slice(&sha2::Sha256::digest(compiled));
    out.extend_from_slice(&compatibility.to_le_bytes());
    out.extend_from_slice(compiled);
    out
}

/// The compiled form inside a stored entry, if its SHA-256 matches and it
/// was made for this compatibility hash.
fn unseal(compatibility: u64, stored: &[u8]) -> Option<&[u8]> {
    if stored.len() < 40 {
        return None;
    }
    let (sum, rest) = stored.split_at(32);
    let (compat, compiled) = rest.split_at(8);
    let same_engine = u64::from_le_bytes(compat.try_into().ok()?) == compatibility;
    (same_engine && sha2::Sha256::digest(compiled).as_slice() == sum).then_some(compiled)
}

impl FlowManager {
    /// `CREATE [OR REPLACE] COMPONENT` and `PUT /v1/components/{name}`:
    /// checks, compiles (off the request path, time-bounded) and stores a
    /// new version of `database`.`name`.
    pub(crate) async fn put_component(
        &self,
        core: &Arc<Core>,
        who: &Principal,
        database: &str,
        name: &str,
        bytes: Arc<Vec<u8>>,
        or_replace: bool,
    ) -> Result<Uploaded> {
        if !core.access.is_superuser(who) {
            core.access
                .check(who, Privilege::Create, database, None)
                .map_err(|_| {
                    PermissionDeniedSnafu {
                        message: format!(
                            "permission denied for database {database}: creating a component \
                             needs the CREATE privilege on it (GRANT CREATE ON DATABASE \
                             {database} TO {})",
                            who.name()
                        ),
                    }
                    .build()
                })?;
        }
        if !core.catalog.database_exists(database)? {
            return DatabaseNotFoundSnafu {
                message: format!(
                    "database '{database}' does not exist; create it with CREATE DATABASE \
                     {database}"
                ),
            }
            .fail();
        }
        if name.is_empty() || name.len() > 255 || name.contains('\0') {
            return InvalidComponentSnafu {
                message: "a component's name must be 1 to 255 characters, without NUL",
            }
            .fail();
        }
        let max = self.settings().max_component_size;
        if bytes.len() > max {
            return TooLargeSnafu {
                message: too_large_message(bytes.len(), max),
            }
            .fail();
        }
        // Refused early (before compiling) when it could not be stored anyway.
        if !or_replace && get(core, database, name)?.is_some() {
            return exists(database, name);
        }
        let (sandbox, _) = self.sandbox().await?;
        let digest = Digest::of(&bytes);
        // Bytes uploaded before (under any name) were checked then, and their
        // compiled form is stored: nothing to compile.
        let (c, compatibility) = (core.clone(), sandbox.compatibility_hash());
        let stored = blocking(move || {
            Ok(c.store
                .get_meta(&compiled_key(&digest))?
                .is_some_and(|s| unseal(compatibility, &s).is_some()))
        })
        .await?;
        let compiled = match stored && self.load_stored(core, &sandbox, digest).await? {
            true => None,
            false => Some(self.compile_bounded(core, &sandbox, bytes.clone()).await?),
        };
        let _ddl = self.ddl.lock().await;
        let old = get(core, database, name)?;
        if old.is_some() && !or_replace {
            return exists(database, name);
        }
        let now = self.now_ms();
        let mut def = old.unwrap_or_else(|| ComponentDef {
            database: database.to_string(),
            name: name.to_string(),
            owner: match who {
                Principal::Root => None,
                Principal::User(u) => Some(u.clone()),
            },
            versions: Vec::new(),
        });
        let version = ComponentVersion {
            version: def.latest().map_or(1, |v| v.version + 1),
            digest: digest.to_string(),
            size: bytes.len() as u64,
            world_version: FLOW_WORLD_VERSION.to_string(),
            created_ms: now,
        };
        def.versions.push(version.clone());
        let json = serde_json::to_vec(&def).map_err(|e| {
            InternalSnafu {
                message: format!("cannot encode component definition: {e}"),
            }
            .build()
        })?;
        let (c, key) = (core.clone(), def_key(database, name));
        blocking(move || {
            let mut set = WriteSet::new();
            set.put_meta(key, json);
            if c.store.get_meta(&blob_key(&digest))?.is_none() {
                set.put_meta(blob_key(&digest), bytes.to_vec());
            }
            if let Some(compiled) = compiled {
                set.put_meta(compiled_key(&digest), seal(compatibility, &compiled));
            }
            c.store.commit(set)
        })
        .await?;
        info!(
            component = %def.display_name(),
            version = version.version,
            digest = %digest,
            size = version.size,
            "component stored"
        );
        Ok(Uploaded {
            database: database.to_string(),
            name: name.to_string(),
            version,
        })
    }

    /// Compiles an upload where [`FlowSettings::component_compiler`] says,
    /// waiting at most the compile timeout, registers it in the sandbox and
    /// returns the compiled form. A compilation past its time fails the
    /// upload; at most [`MAX_COMPILING`] run at once (a thread past its
    /// time counts until it finishes on its own; a process is killed).
    ///
    /// [`FlowSettings::component_compiler`]: super::FlowSettings::component_compiler
    async fn compile_bounded(
        &self,
        core: &Core,
        sandbox: &Arc<Sandbox>,
        bytes: Arc<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let running = self.compiling.clone();
        if running.fetch_add(1, Ordering::SeqCst) >= MAX_COMPILING {
            running.fetch_sub(1, Ordering::SeqCst);
            return LimitExceededSnafu {
                message: format!(
                    "{MAX_COMPILING} component compilations are running already; try the upload \
                     again later"
                ),
            }
            .fail();
        }
        if let ComponentCompiler::Process { program, args } = &self.settings().component_compiler {
            let result = self.compile_in_process(sandbox, program, args, bytes).await;
            running.fetch_sub(1, Ordering::SeqCst);
            let compiled = result?;
            compiled_counter(core).inc();
            return Ok(compiled);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sb = sandbox.clone();
        let spawned = std::thread::Builder::new()
            .name("component-compile".into())
            .spawn(move || {
                let result = sb.compile_untrusted(&bytes);
                running.fetch_sub(1, Ordering::SeqCst);
                let _ = tx.send(result);
            });
        if let Err(e) = spawned {
            self.compiling.fetch_sub(1, Ordering::SeqCst);
            return InternalSnafu {
                message: format!("cannot start a thread to compile the component: {e}"),
            }
            .fail();
        }
        let limit = self.settings().component_compile_timeout;
        let result = match tokio::time::timeout(limit, rx).await {
            Err(_) => return too_slow(limit),
            Ok(Err(_)) => {
                return InternalSnafu {
                    message: "the component's compilation thread ended without an answer",
                }
                .fail()
            }
            Ok(Ok(result)) => result,
        };
        let (_, compiled) = result.map_err(|e| {
            InvalidComponentSnafu {
                message: format!("component refused: {e}"),
            }
            .build()
        })?;
        compiled_counter(core).inc();
        Ok(compiled)
    }

    /// Compiles an upload in a child process (see
    /// [`ComponentCompiler::Process`]), killed at the compile timeout, and
    /// registers the compiled form it returns.
    async fn compile_in_process(
        &self,
        sandbox: &Arc<Sandbox>,
        program: &Path,
        args: &[String],
        bytes: Arc<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        use tokio::io::AsyncWriteExt;

        let limit = self.settings().component_compile_timeout;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                InternalSnafu {
                    message: format!(
                        "cannot start the component compiler {}: {e}",
                        program.display()
                    ),
                }
                .build()
            })?;
        let Some(mut stdin) = child.stdin.take() else {
            return InternalSnafu {
                message: "the component compiler has no standard input",
            }
            .fail();
        };
        let input = bytes.clone();
        // The child may end before reading everything (a refusal): a failed
        // write is not the error to report, its exit status is.
        let feeder = tokio::spawn(async move {
            let _ = stdin.write_all(&input).await;
        });
        let waited = tokio::time::timeout(limit, child.wait_with_output()).await;
        feeder.abort();
        let out = match waited {
            // Dropping the child's future killed it (kill_on_drop).
            Err(_) => return too_slow(limit),
            Ok(Err(e)) => {
                return InternalSnafu {
                    message: format!("cannot wait for the component compiler: {e}"),
                }
                .fail()
            }
            Ok(Ok(out)) => out,
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = stderr.trim();
        // The end of what it said: a refusal is short, a crash may not be.
        let said = &said[said.floor_char_boundary(said.len().saturating_sub(2000))..];
        match out.status.code() {
            Some(0) => {}
            Some(2) => {
                return InvalidComponentSnafu {
                    message: format!("component refused: {said}"),
                }
                .fail()
            }
            _ => {
                warn!(status = %out.status, stderr = %said, "the component compiler failed");
                return InvalidComponentSnafu {
                    message: format!(
                        "compiling the component failed ({}): {said}; a compilation that needs \
                         more memory than the compiler's bound ends so",
                        out.status
                    ),
                }
                .fail();
            }
        }
        let compiled = out.stdout;
        let digest = Digest::of(&bytes);
        let sb = sandbox.clone();
        blocking(move || {
            // SAFETY: `compiled` is what `Sandbox::compile_untrusted` of this
            // same sandflow returned for these bytes in the child process
            // (the contract of `ComponentCompiler::Process`); wasmtime checks
            // that it was made for this engine's version and settings, and
            // `register_compiled` checks its imports and exports again.
            unsafe { sb.register_compiled(digest, &compiled) }
                .map(|()| compiled)
                .map_err(|e| {
                    InternalSnafu {
                        message: format!(
                            "the component compiler's output does not load: {e}; it must be \
                             this same sandflow"
                        ),
                    }
                    .build()
                })
        })
        .await
    }

    /// Registers the component `digest` in the sandbox from its stored
    /// compiled form, if there is a usable one. Whether it is registered.
    async fn load_stored(
        &self,
        core: &Arc<Core>,
        sandbox: &Arc<Sandbox>,
        digest: Digest,
    ) -> Result<bool> {
        if sandbox.is_registered(&digest) {
            return Ok(true);
        }
        let (c, sb) = (core.clone(), sandbox.clone());
        let loaded = blocking(move || {
            let Some(stored) = c.store.get_meta(&compiled_key(&digest))? else {
                return Ok(false);
            };
            let Some(compiled) = unseal(sb.compatibility_hash(), &stored) else {
                warn!(%digest, "stored compiled component is for another engine or damaged; compiling again");
                return Ok(false);
            };
            // SAFETY: these bytes are what `compile_untrusted` returned for
            // this digest (only `put_component` and `load_component` write
            // this key, which library users cannot write: `component/` is
            // reserved), and their SHA-256 matches the one stored with them.
            match unsafe { sb.register_compiled(digest, compiled) } {
                Ok(()) => Ok(true),
                Err(e) => {
                    warn!(%digest, error = %e, "cannot load the stored compiled component; compiling again");
                    Ok(false)
                }
            }
        })
        .await?;
        if loaded {
            loaded_counter(core).inc();
        }
        Ok(loaded)
    }

    /// The digest of a flow's component, registered in the sandbox: from
    /// its stored compiled form, or compiled again from its stored bytes
    /// (another wasmtime version), whose SHA-256 must be the digest.
    pub(super) async fn load_component(
        &self,
        core: &Arc<Core>,
        sandbox: &Arc<Sandbox>,
        component: &FlowComponent,
    ) -> Result<Digest> {
        let digest = parse_digest(&component.digest)?;
        if self.load_stored(core, sandbox, digest).await? {
            return Ok(digest);
        }
        let (c, sb) = (core.clone(), sandbox.clone());
        let name = component.display_name();
        blocking(move || {
            let Some(bytes) = c.store.get_meta(&blob_key(&digest))? else {
                return StorageSnafu {
                    message: format!(
                        "the bytes of component {name} (digest {digest}) are missing from \
                         storage; upload it again and ALTER FLOW ... SET COMPONENT VERSION"
                    ),
                }
                .fail();
            };
            if Digest::of(&bytes) != digest {
                return StorageSnafu {
                    message: format!(
                        "the stored bytes of component {name} do not match their digest \
                         {digest}; refusing to run them"
                    ),
                }
                .fail();
            }
            let (_, compiled) = sb.compile_untrusted(&bytes).map_err(|e| {
                InvalidComponentSnafu {
                    message: format!("component {name} no longer compiles: {e}"),
                }
                .build()
            })?;
            compiled_counter(&c).inc();
            let mut set = WriteSet::new();
            set.put_meta(
                compiled_key(&digest),
                seal(sb.compatibility_hash(), &compiled),
            );
            c.store.commit(set)?;
            Ok(digest)
        })
        .await
    }

    /// `DROP COMPONENT [IF EXISTS]`: refused while a flow runs any version
    /// of it. Removes the bytes no other component's version shares.
    pub(crate) async fn drop_component(
        &self,
        core: &Arc<Core>,
        name: &TableName,
        if_exists: bool,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let Some(def) = get(core, &name.database, &name.table)? else {
            if if_exists {
                return Ok(false);
            }
            return Err(not_found(&name.database, &name.table));
        };
        let users: Vec<String> = self
            .infos()
            .into_iter()
            .filter(|i| {
                i.def
                    .component
                    .as_ref()
                    .is_some_and(|c| c.database == def.database && c.name == def.name)
            })
            .map(|i| i.def.name)
            .collect();
        if !users.is_empty() {
            return InUseSnafu {
                message: format!(
                    "component {} is used by flow {}; drop those flows (DROP FLOW {}) or move \
                     them to another component first",
                    def.display_name(),
                    users.join(", "),
                    users[0]
                ),
            }
            .fail();
        }
        let others = list(core)?;
        let kept: std::collections::HashSet<String> = others
            .iter()
            .filter(|o| !(o.database == def.database && o.name == def.name))
            .flat_map(|o| o.versions.iter().map(|v| v.digest.clone()))
            .collect();
        let mut set = WriteSet::new();
        set.delete_meta(def_key(&def.database, &def.name));
        for v in &def.versions {
            if !kept.contains(&v.digest) {
                let digest = parse_digest(&v.digest)?;
                set.delete_meta(blob_key(&digest));
                set.delete_meta(compiled_key(&digest));
            }
        }
        let c = core.clone();
        blocking(move || c.store.commit(set)).await?;
        info!(component = %def.display_name(), "component dropped");
        Ok(true)
    }

    /// The component a new flow runs: `c`'s given version, or its newest.
    /// The flow's creator must see the component's database.
    pub(super) fn resolve_component(
        &self,
        core: &Core,
        who: &Principal,
        c: &ComponentRef,
    ) -> Result<FlowComponent> {
        let (database, name) = (&c.name.database, &c.name.table);
        if !core.access.can_see_database(who, database) {
            return PermissionDeniedSnafu {
                message: format!(
                    "permission denied for component {}: user {} has no privilege on database \
                     {database}",
                    display_name(database, name),
                    who.name()
                ),
            }
            .fail();
        }
        let def = get(core, database, name)?.ok_or_else(|| not_found(database, name))?;
        let version = match c.version {
            Some(n) => def.version(n).ok_or_else(|| {
                ComponentNotFoundSnafu {
                    message: format!(
                        "component {} has no version {n}; it has versions {} (see \
                         information_schema.components)",
                        def.display_name(),
                        def.versions
                            .iter()
                            .map(|v| v.version.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
                .build()
            })?,
            None => def.latest().ok_or_else(|| not_found(database, name))?,
        };
        Ok(FlowComponent {
            database: def.database.clone(),
            name: def.name.clone(),
            version: version.version,
            digest: version.digest.clone(),
        })
    }

    /// `ALTER FLOW f SET COMPONENT VERSION n`: the flow is rebuilt on that
    /// version (as CREATE OR REPLACE FLOW with it would), older or newer.
    pub(crate) async fn set_component_version(
        &self,
        core: &Arc<Core>,
        ctx: &datafusion::prelude::SessionContext,
        name: &str,
        version: u32,
    ) -> Result<()> {
        let _ddl = self.ddl.lock().await;
        let Some(def) = self.get_def(name) else {
            return FlowNotFoundSnafu {
                message: format!("flow '{name}' does not exist; see SHOW FLOWS"),
            }
            .fail();
        };
        let Some(component) = &def.component else {
            return UnsupportedSnafu {
                message: format!(
                    "flow '{name}' runs sandflow's engine, not a user component; recreate it with \
                     CREATE OR REPLACE FLOW ... USING COMPONENT c"
                ),
            }
            .fail();
        };
        let mut stmt = super::manager::recreate_statement(&def);
        if let Some(c) = &mut stmt.component {
            c.version = Some(version);
        }
        // Checked before the flow is touched: a wrong version changes nothing.
        self.resolve_component(
            core,
            &crate::sql::visible::principal_of(&ctx.copied_config()),
            &ComponentRef {
                name: TableName {
                    database: component.database.clone(),
                    table: component.name.clone(),
                    qualified: true,
                },
                version: Some(version),
            },
        )?;
        self.create_locked(core, ctx, stmt).await?;
        info!(flow = %name, version, "flow moved to another component version");
        Ok(())
    }
}

fn exists<T>(database: &str, name: &str) -> Result<T> {
    ComponentExistsSnafu {
        message: format!(
            "component {} already exists; use CREATE OR REPLACE COMPONENT (or PUT) to add a \
             version",
            display_name(database, name)
        ),
    }
    .fail()
}

/// The refusal of a component over the size cap.
pub fn too_large_message(size: usize, max: usize) -> String {
    format!(
        "the component is {size} bytes, more than the server's limit of {max} bytes \
         (--max-component-size, [flow] max_component_size)"
    )
}

fn compiled_counter(core: &Core) -> crate::metrics::Counter {
    core.metrics().counter(
        "sandflow_components_compiled_total",
        "User components compiled (uploads, and stored components whose compiled form could not be used).",
        &[],
    )
}

fn loaded_counter(core: &Core) -> crate::metrics::Counter {
    core.metrics().counter(
        "sandflow_components_loaded_total",
        "User components loaded from their stored compiled form, without compiling.",
        &[],
    )
}
