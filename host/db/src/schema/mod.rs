//! What a table is: its columns, time index, primary key, options, and the
//! Arrow schema of its rows. The catalog names and persists tables; storage
//! stores their rows; both read these definitions, neither knows the other
//! through them.

pub mod interval;
mod types;

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::error::{InvalidDataSnafu, Result};

pub use types::ColumnType;

/// The catalog name seen by DataFusion (as in GreptimeDB).
pub const DEFAULT_CATALOG: &str = "greptime";
/// The database (schema) tables live in unless qualified.
pub const DEFAULT_DATABASE: &str = "public";
/// The schema queries answer with the catalog's own metadata; no database
/// may take its name.
pub const INFORMATION_SCHEMA: &str = "information_schema";
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
    /// A GreptimeDB index clause as given (`FULLTEXT INDEX WITH(...)`,
    /// `SKIPPING INDEX`, `INVERTED INDEX`): kept and shown by SHOW CREATE
    /// TABLE; rows are stored the same with or without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
}

impl ColumnSchema {
    pub fn new(name: impl Into<String>, data_type: ColumnType, nullable: bool) -> Self {
        ColumnSchema {
            name: name.into(),
            data_type,
            nullable,
            default: None,
            comment: None,
            index: None,
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
    /// GreptimeDB's `PARTITION ON COLUMNS (...) (...)` clause as given: kept
    /// and shown by SHOW CREATE TABLE; a table is one partition here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
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
            partition: None,
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
            if self.columns[i].data_type.item().is_some() {
                return fail(format!(
                    "column '{}' of type {} cannot be in the PRIMARY KEY: lists are not keys",
                    self.columns[i].name,
                    self.columns[i].data_type.sql_name()
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

/// The time index an auto-created sink gets when the output has none.
pub const TS_PLACEHOLDER: &str = "__ts_placeholder";

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
    /// How its rows are laid out: 0 at CREATE, one more at each ALTER
    /// TABLE that rewrites them. Writes made with an older layout are
    /// refused (see `WriteSet::relayout`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
    /// The key's column order: time index first, then the primary key
    /// (every table created since this field exists, except sinks whose
    /// time index is the constant `__ts_placeholder`), or, when false, the
    /// primary key first (those sinks, and tables created before, whose
    /// stored rows keep that order). See `Table::key_columns`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub time_first: bool,
    /// What made the table, when not a user's CREATE TABLE: the note a flow
    /// leaves on the sink it creates. Not an option (nothing reads it);
    /// SHOW CREATE TABLE shows it as GreptimeDB shows a table's
    /// description, `'comment' = '...'`, unless a `comment` option is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// A table as the running database sees it: its metadata plus derived,
/// cached facts (Arrow schema, key layout).
#[derive(Debug)]
pub struct Table {
    pub info: TableInfo,
    pub arrow_schema: SchemaRef,
    /// Columns stored in the key, in key order: the time index, then the
    /// primary key (or, for tables created before `TableInfo::time_first`,
    /// the primary key, then the time index).
    ///
    /// Time first, because time-series rows arrive in time order over many
    /// keys: a batch of increasing times then appends to the end of the
    /// table's B-tree instead of touching a leaf per key (a 1,000-row
    /// INSERT over 1,000 keys dirtied ~1,000 pages, ~4.5 KB written per
    /// row). A flow's sink, keyed by its groups and window, likewise updates
    /// the current window's rows, which now sit together.
    pub key_columns: Vec<usize>,
    /// Columns stored in the value, in schema order.
    pub value_columns: Vec<usize>,
}

impl Table {
    pub fn new(info: TableInfo) -> Arc<Table> {
        let schema = &info.schema;
        let mut key_columns = schema.primary_key.clone();
        match info.time_first {
            true => key_columns.insert(0, schema.time_index),
            false => key_columns.push(schema.time_index),
        }
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
    /// `WITH (merge_mode = 'last_non_null')`: a row that replaces another
    /// (same primary key and time index) keeps the old value of each column
    /// it has NULL in.
    pub fn last_non_null(&self) -> bool {
        self.info.options.get("merge_mode").map(String::as_str) == Some("last_non_null")
    }

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
        interval::parse_interval(ttl).ok()
    }

    /// `database.name`
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.info.database, self.info.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(time_first: bool) -> TableInfo {
        let columns = vec![
            ColumnSchema::new("host", ColumnType::String, true),
            ColumnSchema::new("v", ColumnType::Float64, true),
            ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
        ];
        TableInfo {
            id: 1,
            database: "public".into(),
            name: "t".into(),
            schema: TableSchema::new(columns, "ts", &["host"], false).unwrap(),
            options: Default::default(),
            version: 0,
            time_first,
            description: None,
        }
    }

    #[test]
    fn new_tables_key_by_time_first_and_older_metadata_keeps_its_order() {
        let new = info(true);
        assert_eq!(Table::new(new.clone()).key_columns, [2, 0]);
        let json = serde_json::to_string(&new).unwrap();
        let back: TableInfo = serde_json::from_str(&json).unwrap();
        assert_eq!(Table::new(back).key_columns, [2, 0]);
        // Metadata written before the field existed has no `time_first`.
        let old = serde_json::to_string(&info(false)).unwrap();
        assert!(!old.contains("time_first"), "{old}");
        let back: TableInfo = serde_json::from_str(&old).unwrap();
        assert_eq!(Table::new(back).key_columns, [0, 2]);
        assert_eq!(Table::new(info(false)).value_columns, [1]);
    }
}
