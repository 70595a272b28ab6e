//! The catalog: databases (schemas), tables, their columns, time index and
//! primary key. Metadata is persisted as JSON under meta keys of the storage
//! (see [`crate::storage::Store`]) and kept in memory behind a lock.

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard, RwLock};

use crate::error::{
    DatabaseNotFoundSnafu, InternalSnafu, InvalidNameSnafu, NotFoundSnafu, Result, SqlSnafu,
    TableExistsSnafu,
};
use crate::storage::{CommitInfo, MetaWrite, Store, WriteSet};

pub use crate::schema::*;
fn table_meta_key(id: TableId) -> String {
    format!("catalog/table/{id:020}")
}
fn database_meta_key(name: &str) -> String {
    format!("catalog/database/{name}")
}
const NEXT_TABLE_ID_KEY: &str = "catalog/next_table_id";

/// Refuses a new database, table or flow name (`kind` says which) that
/// breaks GreptimeDB's rule for names: a letter, `_`, `:` or `-`, then
/// letters, digits and `_ : - . @ #` (ASCII only). Names then read the same
/// in every client, in a quoted SQL string (`ADMIN FLUSH_FLOW('name')`), in a
/// URL and in a line-protocol measurement, and none is empty. Names already
/// stored are not checked again.
pub fn check_name(kind: &str, name: &str) -> Result<()> {
    let first = |c: char| c.is_ascii_alphabetic() || matches!(c, '_' | ':' | '-');
    let rest =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.' | '@' | '#');
    let mut chars = name.chars();
    if chars.next().is_some_and(first) && chars.all(rest) {
        return Ok(());
    }
    InvalidNameSnafu {
        message: format!(
            "Invalid {kind} name: {name}; a {kind} name starts with a letter, '_', ':' or '-', \
             and goes on with letters, digits and '_', ':', '-', '.', '@', '#'"
        ),
    }
    .fail()
}

/// The error for renaming `old` to `name`, a name a table of its database
/// holds (the table itself included).
pub fn name_taken(old: &Table, name: &str) -> crate::error::Error {
    TableExistsSnafu {
        message: format!(
            "cannot rename table '{}' to '{}': a table of that name exists",
            old.qualified_name(),
            display_name(&old.info.database, name)
        ),
    }
    .build()
}

#[derive(Default)]
struct CatalogState {
    databases: BTreeMap<String, BTreeMap<String, Arc<Table>>>,
    next_table_id: TableId,
}

/// The in-memory catalog, loaded from and written through to the store.
pub struct Catalog {
    state: RwLock<CatalogState>,
    /// Serialises DDL so the in-memory state follows the committed one.
    ddl: std::sync::Mutex<()>,
}

fn poisoned() -> crate::error::Error {
    InternalSnafu {
        message: "catalog lock poisoned by an earlier panic; restart sandflow".to_string(),
    }
    .build()
}

impl Catalog {
    /// Loads the catalog from the store, creating the default database on first use.
    pub fn load(store: &Store) -> Result<Catalog> {
        let mut state = CatalogState {
            next_table_id: 1,
            ..Default::default()
        };
        let entries = store.scan_meta("catalog/")?;
        for (key, value) in entries {
            if let Some(name) = key.strip_prefix("catalog/database/") {
                state.databases.entry(name.to_string()).or_default();
            } else if key.starts_with("catalog/table/") {
                let info: TableInfo = serde_json::from_slice(&value).map_err(|e| {
                    InternalSnafu {
                        message: format!("catalog entry {key} is unreadable: {e}"),
                    }
                    .build()
                })?;
                state
                    .databases
                    .entry(info.database.clone())
                    .or_default()
                    .insert(info.name.clone(), Table::new(info));
            } else if key == NEXT_TABLE_ID_KEY {
                let bytes: [u8; 8] = value.as_slice().try_into().map_err(|_| {
                    InternalSnafu {
                        message: "catalog entry next_table_id is corrupt".to_string(),
                    }
                    .build()
                })?;
                state.next_table_id = u64::from_be_bytes(bytes);
            }
        }
        let catalog = Catalog {
            state: RwLock::new(state),
            ddl: std::sync::Mutex::new(()),
        };
        if !catalog.database_exists(DEFAULT_DATABASE)? {
            catalog.create_database(store, DEFAULT_DATABASE, true)?;
        }
        Ok(catalog)
    }

    pub fn database_exists(&self, name: &str) -> Result<bool> {
        Ok(self
            .state
            .read()
            .map_err(|_| poisoned())?
            .databases
            .contains_key(name))
    }

    pub fn database_names(&self) -> Result<Vec<String>> {
        Ok(self
            .state
            .read()
            .map_err(|_| poisoned())?
            .databases
            .keys()
            .cloned()
            .collect())
    }

    /// Tables of one database, sorted by name.
    pub fn tables(&self, database: &str) -> Result<Vec<Arc<Table>>> {
        let state = self.state.read().map_err(|_| poisoned())?;
        Ok(state
            .databases
            .get(database)
            .map(|t| t.values().cloned().collect())
            .unwrap_or_default())
    }

    pub fn table(&self, database: &str, name: &str) -> Result<Option<Arc<Table>>> {
        let state = self.state.read().map_err(|_| poisoned())?;
        Ok(state
            .databases
            .get(database)
            .and_then(|t| t.get(name))
            .cloned())
    }

    /// Like [`Catalog::table`] but a missing table is an error naming it.
    pub fn require_table(&self, database: &str, name: &str) -> Result<Arc<Table>> {
        self.table(database, name)?.ok_or_else(|| {
            NotFoundSnafu {
                message: format!(
                    "table '{}' does not exist; create it with CREATE TABLE or check SHOW TABLES",
                    display_name(database, name)
                ),
            }
            .build()
        })
    }

    /// Returns whether it was created (false: it existed and `if_not_exists`).
    pub fn create_database(&self, store: &Store, name: &str, if_not_exists: bool) -> Result<bool> {
        let mut ddl = self.begin_ddl()?;
        if ddl.database_exists(name)? {
            if if_not_exists {
                return Ok(false);
            }
            return SqlSnafu {
                message: format!("database '{name}' already exists"),
            }
            .fail();
        }
        ddl.create_database(name)?;
        ddl.commit(store, WriteSet::new())?;
        Ok(true)
    }

    /// Takes the DDL lock and starts a batch of DDL that commits together
    /// with other writes (see [`DdlBatch`]).
    pub fn begin_ddl(&self) -> Result<DdlBatch<'_>> {
        let guard = self.ddl.lock().map_err(|_| poisoned())?;
        let next_table_id = self.state.read().map_err(|_| poisoned())?.next_table_id;
        Ok(DdlBatch {
            catalog: self,
            _ddl: guard,
            next_table_id,
            databases: Vec::new(),
            tables: Vec::new(),
            meta: Vec::new(),
        })
    }

    /// Drops a database and every table in it. Returns the dropped tables.
    pub fn drop_database(
        &self,
        store: &Store,
        name: &str,
        if_exists: bool,
    ) -> Result<Option<Vec<Arc<Table>>>> {
        let _ddl = self.ddl.lock().map_err(|_| poisoned())?;
        if name == DEFAULT_DATABASE {
            return SqlSnafu {
                message: format!("database '{DEFAULT_DATABASE}' cannot be dropped"),
            }
            .fail();
        }
        if !self.database_exists(name)? {
            if if_exists {
                return Ok(None);
            }
            return DatabaseNotFoundSnafu {
                message: format!("database '{name}' does not exist; see SHOW DATABASES"),
            }
            .fail();
        }
        let tables = self.tables(name)?;
        let mut writes = vec![MetaWrite::Delete(database_meta_key(name))];
        for t in &tables {
            writes.push(MetaWrite::Delete(table_meta_key(t.id())));
            writes.push(MetaWrite::DropTable(t.id()));
        }
        store.commit_meta(writes)?;
        self.state
            .write()
            .map_err(|_| poisoned())?
            .databases
            .remove(name);
        for t in &tables {
            store.table_dropped(t.id());
        }
        Ok(Some(tables))
    }

    /// Creates a table. Returns `(table, created)`; with `if_not_exists` an
    /// existing table is returned unchanged with `created == false`.
    pub fn create_table(
        &self,
        store: &Store,
        database: &str,
        name: &str,
        schema: TableSchema,
        options: BTreeMap<String, String>,
        if_not_exists: bool,
    ) -> Result<(Arc<Table>, bool)> {
        schema.validate()?;
        let mut ddl = self.begin_ddl()?;
        ddl.require_database(database)?;
        if let Some(existing) = ddl.table(database, name)? {
            if if_not_exists {
                return Ok((existing, false));
            }
        }
        let table = ddl.create_table(database, name, schema, options, None)?;
        ddl.commit(store, WriteSet::new())?;
        Ok((table, true))
    }

    /// Drops a table and its rows. `Ok(None)` when absent and `if_exists`.
    pub fn drop_table(
        &self,
        store: &Store,
        database: &str,
        name: &str,
        if_exists: bool,
    ) -> Result<Option<Arc<Table>>> {
        let _ddl = self.ddl.lock().map_err(|_| poisoned())?;
        let table = match self.table(database, name)? {
            Some(t) => t,
            None if if_exists => return Ok(None),
            None => return self.require_table(database, name).map(Some),
        };
        store.commit_meta(vec![
            MetaWrite::Delete(table_meta_key(table.id())),
            MetaWrite::DropTable(table.id()),
        ])?;
        if let Some(tables) = self
            .state
            .write()
            .map_err(|_| poisoned())?
            .databases
            .get_mut(database)
        {
            tables.remove(name);
        }
        store.table_dropped(table.id());
        Ok(Some(table))
    }
}

impl Catalog {
    /// ALTER TABLE: replaces `old`'s definition by `info` (same id; maybe
    /// another name), together with the writes `rows` gives for the new
    /// table (its rows in the new layout), in one storage transaction.
    pub fn alter_table(
        &self,
        store: &Store,
        old: &Arc<Table>,
        info: TableInfo,
        rows: impl FnOnce(&Arc<Table>) -> Result<WriteSet>,
    ) -> Result<Arc<Table>> {
        let _ddl = self.ddl.lock().map_err(|_| poisoned())?;
        let database = &old.info.database;
        match self.table(database, &old.info.name)? {
            Some(t) if t.id() == old.id() => {}
            _ => return self.require_table(database, &old.info.name),
        }
        if info.name != old.info.name && self.table(database, &info.name)?.is_some() {
            return Err(name_taken(old, &info.name));
        }
        let json = serde_json::to_vec(&info).map_err(|e| {
            InternalSnafu {
                message: format!("cannot encode table metadata: {e}"),
            }
            .build()
        })?;
        let table = Table::new(info);
        let mut set = rows(&table)?;
        set.push_meta(MetaWrite::Put(table_meta_key(table.id()), json));
        store.commit(set)?;
        let mut state = self.state.write().map_err(|_| poisoned())?;
        if let Some(tables) = state.databases.get_mut(database) {
            tables.remove(&old.info.name);
            tables.insert(table.info.name.clone(), table.clone());
        }
        Ok(table)
    }
}

/// DDL staged under the catalog's DDL lock, committed in ONE storage
/// transaction together with other writes (rows, flow definitions): a
/// line-protocol request creates its tables in the commit that writes its
/// rows, CREATE FLOW its sink in the commit that stores the flow. The
/// in-memory catalog changes only after that commit succeeded; a batch
/// dropped without [`DdlBatch::commit`] changes nothing. It holds the DDL
/// lock (no other DDL can interleave), so keep it on one thread and briefly.
pub struct DdlBatch<'a> {
    catalog: &'a Catalog,
    _ddl: MutexGuard<'a, ()>,
    next_table_id: TableId,
    databases: Vec<String>,
    tables: Vec<Arc<Table>>,
    meta: Vec<MetaWrite>,
}

impl DdlBatch<'_> {
    /// Whether the database exists or is created by this batch.
    pub fn database_exists(&self, name: &str) -> Result<bool> {
        Ok(self.databases.iter().any(|d| d == name) || self.catalog.database_exists(name)?)
    }

    /// A table as it will be after the batch: an existing one or one this
    /// batch creates.
    pub fn table(&self, database: &str, name: &str) -> Result<Option<Arc<Table>>> {
        if let Some(t) = self
            .tables
            .iter()
            .find(|t| t.info.database == database && t.info.name == name)
        {
            return Ok(Some(t.clone()));
        }
        self.catalog.table(database, name)
    }

    fn require_database(&self, database: &str) -> Result<()> {
        if self.database_exists(database)? {
            return Ok(());
        }
        DatabaseNotFoundSnafu {
            message: format!(
                "database '{database}' does not exist; create it with CREATE DATABASE {database}"
            ),
        }
        .fail()
    }

    /// Stages a database unless it exists; returns whether it is new.
    pub fn create_database(&mut self, name: &str) -> Result<bool> {
        if self.database_exists(name)? {
            return Ok(false);
        }
        check_name("database", name)?;
        // Queries answer these schemas themselves: a database of that name
        // could never be read.
        if [INFORMATION_SCHEMA, "pg_catalog"].contains(&name.to_ascii_lowercase().as_str()) {
            return SqlSnafu {
                message: format!(
                    "'{name}' is a system schema's name; choose another name for the database"
                ),
            }
            .fail();
        }
        self.meta
            .push(MetaWrite::Put(database_meta_key(name), Vec::new()));
        self.databases.push(name.to_string());
        Ok(true)
    }

    /// Stages a new table (its id is reserved now) and returns it; refuses
    /// a name that exists or is staged already. `description` is what made
    /// it when not a user (see [`TableInfo::description`]).
    pub fn create_table(
        &mut self,
        database: &str,
        name: &str,
        schema: TableSchema,
        options: BTreeMap<String, String>,
        description: Option<String>,
    ) -> Result<Arc<Table>> {
        schema.validate()?;
        self.require_database(database)?;
        if self.table(database, name)?.is_some() {
            return TableExistsSnafu {
                message: format!(
                    "table '{}' already exists; use CREATE TABLE IF NOT EXISTS or DROP TABLE first",
                    display_name(database, name)
                ),
            }
            .fail();
        }
        check_name("table", name)?;
        let id = self.next_table_id;
        // A sink's placeholder time index is always 0: keyed by it first,
        // rows would still be in primary-key order, and `k = ..` could no
        // longer narrow a scan.
        let time_first = schema.time_index_column().name != crate::schema::TS_PLACEHOLDER;
        let info = TableInfo {
            id,
            database: database.to_string(),
            name: name.to_string(),
            schema,
            options,
            version: 0,
            time_first,
            description,
        };
        let json = serde_json::to_vec(&info).map_err(|e| {
            InternalSnafu {
                message: format!("cannot encode table metadata: {e}"),
            }
            .build()
        })?;
        self.meta.push(MetaWrite::Put(table_meta_key(id), json));
        self.meta.push(MetaWrite::CreateTable(id));
        self.next_table_id = id + 1;
        let table = Table::new(info);
        self.tables.push(table.clone());
        Ok(table)
    }

    /// Commits the staged DDL and `set` as one storage transaction, then
    /// shows the new databases and tables in the catalog.
    pub fn commit(self, store: &Store, mut set: WriteSet) -> Result<CommitInfo> {
        let created_tables = !self.tables.is_empty();
        for w in self.meta {
            set.push_meta(w);
        }
        if created_tables {
            set.push_meta(MetaWrite::Put(
                NEXT_TABLE_ID_KEY.to_string(),
                self.next_table_id.to_be_bytes().to_vec(),
            ));
        }
        let info = store.commit(set)?;
        let mut state = self.catalog.state.write().map_err(|_| poisoned())?;
        for d in self.databases {
            state.databases.entry(d).or_default();
        }
        if created_tables {
            state.next_table_id = self.next_table_id;
        }
        for t in self.tables {
            state
                .databases
                .entry(t.info.database.clone())
                .or_default()
                .insert(t.info.name.clone(), t);
        }
        Ok(info)
    }
}

/// `name` for the default database, `db.name` otherwise.
pub fn display_name(database: &str, name: &str) -> String {
    if database == DEFAULT_DATABASE {
        name.to_string()
    } else {
        format!("{database}.{name}")
    }
}
