//! The catalog: databases (schemas), tables, their columns, time index and
//! primary key. Metadata is persisted as JSON under meta keys of the storage
//! (see [`crate::storage::Store`]) and kept in memory behind a lock.

mod types;

use std::collections::BTreeMap;
use std::sync::{Arc, MutexGuard, RwLock};

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{InternalSnafu, InvalidDataSnafu, NotFoundSnafu, Result, SqlSnafu};
use crate::storage::{CommitInfo, MetaWrite, Store, WriteSet};

pub use types::ColumnType;

/// The catalog name seen by DataFusion (as in GreptimeDB).
pub const DEFAULT_CATALOG: &str = "greptime";
/// The database (schema) tables live in unless qualified.
pub const DEFAULT_DATABASE: &str = "public";
/// The `ttl` table option of a table that keeps no rows (see [`Table::instant`]).
pub const TTL_INSTANT: &str = "instant";

/// Identifies a table for its whole life; never reused.
pub type TableId = u64;

/// How a column takes part in the data model (GreptimeDB's semantic type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SemanticType {
    /// A primary key column.
    Tag,
    /// The time index.
    Timestamp,
    /// Any other column.
    Field,
}

impl SemanticType {
    pub fn as_str(self) -> &'static str {
        match self {
            SemanticType::Tag => "TAG",
            SemanticType::Timestamp => "TIMESTAMP",
            SemanticType::Field => "FIELD",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnSchema {
    pub name: String,
    pub data_type: ColumnType,
    pub nullable: bool,
    /// The default as SQL expression text (e.g. `now()`, `0`, `'x'`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

impl ColumnSchema {
    pub fn new(name: impl Into<String>, data_type: ColumnType, nullable: bool) -> Self {
        ColumnSchema {
            name: name.into(),
            data_type,
            nullable,
            default: None,
            comment: None,
        }
    }

    pub fn with_default(mut self, default_sql: impl Into<String>) -> Self {
        self.default = Some(default_sql.into());
        self
    }
}

/// The shape of a table: columns, which one is the time index, which ones form
/// the primary key, and whether rows with the same key are kept (append mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSchema {
    pub columns: Vec<ColumnSchema>,
    /// Index into `columns` of the time index (a NOT NULL timestamp).
    pub time_index: usize,
    /// Indices into `columns`, in key order.
    pub primary_key: Vec<usize>,
    #[serde(default)]
    pub append_mode: bool,
}

impl TableSchema {
    /// Builds a schema by column names and checks it (see [`TableSchema::validate`]).
    pub fn new(
        columns: Vec<ColumnSchema>,
        time_index: &str,
        primary_key: &[&str],
        append_mode: bool,
    ) -> Result<TableSchema> {
        let find = |name: &str| {
            columns.iter().position(|c| c.name == name).ok_or_else(|| {
                InvalidDataSnafu {
                    message: format!("column '{name}' is not defined in the table"),
                }
                .build()
            })
        };
        let time_index = find(time_index)?;
        let primary_key = primary_key
            .iter()
            .map(|n| find(n))
            .collect::<Result<Vec<_>>>()?;
        let mut schema = TableSchema {
            columns,
            time_index,
            primary_key,
            append_mode,
        };
        schema.columns[time_index].nullable = false;
        schema.validate()?;
        Ok(schema)
    }

    /// Checks the invariants every stored table keeps.
    pub fn validate(&self) -> Result<()> {
        let fail = |message: String| Err(InvalidDataSnafu { message }.build());
        if self.columns.is_empty() {
            return fail("a table needs at least one column".into());
        }
        let mut seen = std::collections::HashSet::new();
        for c in &self.columns {
            if !seen.insert(c.name.as_str()) {
                return fail(format!("column '{}' is defined twice", c.name));
            }
        }
        let Some(ts) = self.columns.get(self.time_index) else {
            return fail("the time index refers to no column".into());
        };
        if !ts.data_type.is_timestamp() {
            return fail(format!(
                "time index column '{}' must be a TIMESTAMP, not {}",
                ts.name,
                ts.data_type.sql_name()
            ));
        }
        if ts.nullable {
            return fail(format!("time index column '{}' must be NOT NULL", ts.name));
        }
        let mut pk_seen = std::collections::HashSet::new();
        for &i in &self.primary_key {
            if i >= self.columns.len() {
                return fail("the primary key refers to no column".into());
            }
            if i == self.time_index {
                return fail(format!(
                    "time index column '{}' cannot also be in the PRIMARY KEY",
                    self.columns[i].name
                ));
            }
            if !pk_seen.insert(i) {
                return fail(format!(
                    "column '{}' appears twice in the PRIMARY KEY",
                    self.columns[i].name
                ));
            }
        }
        Ok(())
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    pub fn time_index_column(&self) -> &ColumnSchema {
        &self.columns[self.time_index]
    }

    pub fn primary_key_names(&self) -> Vec<&str> {
        self.primary_key
            .iter()
            .map(|&i| self.columns[i].name.as_str())
            .collect()
    }

    pub fn semantic_type(&self, column: usize) -> SemanticType {
        if column == self.time_index {
            SemanticType::Timestamp
        } else if self.primary_key.contains(&column) {
            SemanticType::Tag
        } else {
            SemanticType::Field
        }
    }

    /// The Arrow schema of the table's rows (column order as declared).
    pub fn arrow_schema(&self) -> SchemaRef {
        let fields: Vec<Field> = self
            .columns
            .iter()
            .map(|c| Field::new(&c.name, c.data_type.to_arrow(), c.nullable))
            .collect();
        Arc::new(Schema::new(fields))
    }
}

/// Everything persisted about one table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableInfo {
    pub id: TableId,
    pub database: String,
    pub name: String,
    pub schema: TableSchema,
    /// The `WITH (...)` options as given (normalised keys).
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// A table as the running database sees it: its metadata plus derived,
/// cached facts (Arrow schema, key layout).
#[derive(Debug)]
pub struct Table {
    pub info: TableInfo,
    pub arrow_schema: SchemaRef,
    /// Columns stored in the key, in key order: primary key, then time index.
    pub key_columns: Vec<usize>,
    /// Columns stored in the value, in schema order.
    pub value_columns: Vec<usize>,
}

impl Table {
    pub fn new(info: TableInfo) -> Arc<Table> {
        let schema = &info.schema;
        let mut key_columns = schema.primary_key.clone();
        key_columns.push(schema.time_index);
        let value_columns = (0..schema.columns.len())
            .filter(|i| !key_columns.contains(i))
            .collect();
        Arc::new(Table {
            arrow_schema: schema.arrow_schema(),
            info,
            key_columns,
            value_columns,
        })
    }

    pub fn id(&self) -> TableId {
        self.info.id
    }

    pub fn schema(&self) -> &TableSchema {
        &self.info.schema
    }

    /// `WITH (ttl = 'instant')`: the table keeps no rows; its writes only
    /// reach the flows that read it (GreptimeDB's flow-only source tables).
    pub fn instant(&self) -> bool {
        self.info.options.get("ttl").map(String::as_str) == Some(TTL_INSTANT)
    }

    /// `WITH (ttl = '7d')`: rows whose time index is older than now - ttl
    /// expire (see `Store::expire`). None for no ttl, `forever` and `instant`.
    pub fn ttl_ms(&self) -> Option<i64> {
        let ttl = self.info.options.get("ttl")?;
        if ttl == TTL_INSTANT {
            return None;
        }
        crate::flow::options::parse_interval(ttl).ok()
    }

    /// `database.name`
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.info.database, self.info.name)
    }
}

fn table_meta_key(id: TableId) -> String {
    format!("catalog/table/{id:020}")
}
fn database_meta_key(name: &str) -> String {
    format!("catalog/database/{name}")
}
const NEXT_TABLE_ID_KEY: &str = "catalog/next_table_id";

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
            return NotFoundSnafu {
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
        let table = ddl.create_table(database, name, schema, options)?;
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
        NotFoundSnafu {
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
        self.meta
            .push(MetaWrite::Put(database_meta_key(name), Vec::new()));
        self.databases.push(name.to_string());
        Ok(true)
    }

    /// Stages a new table (its id is reserved now) and returns it; refuses
    /// a name that exists or is staged already.
    pub fn create_table(
        &mut self,
        database: &str,
        name: &str,
        schema: TableSchema,
        options: BTreeMap<String, String>,
    ) -> Result<Arc<Table>> {
        schema.validate()?;
        self.require_database(database)?;
        if self.table(database, name)?.is_some() {
            return SqlSnafu {
                message: format!(
                    "table '{}' already exists; use CREATE TABLE IF NOT EXISTS or DROP TABLE first",
                    display_name(database, name)
                ),
            }
            .fail();
        }
        let id = self.next_table_id;
        let info = TableInfo {
            id,
            database: database.to_string(),
            name: name.to_string(),
            schema,
            options,
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
