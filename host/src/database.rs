//! The library API of the database: `Database::open(dir)`, `execute(sql)`.
//!
//! STUB: backed by a plain in-memory DataFusion `SessionContext` until storage,
//! catalog and the SQL layer land. The signatures are the contract the
//! front doors (server/) build against.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;

use crate::error::{Result, SqlSnafu};

/// The result of one statement.
#[derive(Debug, Clone)]
pub enum Output {
    /// A result set (SELECT, SHOW, DESC, ...).
    Rows {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    /// A command with a tag and a count of affected rows
    /// (tag is e.g. "INSERT", "DELETE", "CREATE TABLE", "DROP TABLE").
    Affected { tag: String, rows: u64 },
}

pub struct Database {
    ctx: SessionContext,
}

impl Database {
    pub async fn open(_dir: impl AsRef<Path>) -> Result<Arc<Database>> {
        Ok(Arc::new(Database {
            ctx: SessionContext::new(),
        }))
    }

    /// Runs one or more `;`-separated statements, returning one output each.
    pub async fn execute(&self, sql: &str) -> Result<Vec<Output>> {
        let df = self.ctx.sql(sql).await.map_err(|e| {
            SqlSnafu {
                message: e.to_string(),
            }
            .build()
        })?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await.map_err(|e| {
            SqlSnafu {
                message: e.to_string(),
            }
            .build()
        })?;
        Ok(vec![Output::Rows { schema, batches }])
    }

    /// A DataFusion context whose catalog sees sandflow's tables, for the
    /// PostgreSQL extended-query path (parameter binding of SELECTs).
    pub fn session_context(&self) -> SessionContext {
        self.ctx.clone()
    }
}
