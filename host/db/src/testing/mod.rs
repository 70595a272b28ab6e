//! Testing flows: a database in memory on a virtual clock, driven by hand
//! ([`TestDatabase`]), and scenario files in the sqllogictest format run
//! against it ([`slt`], what `sandflow test` runs).
//!
//! Nothing here reads the wall clock or waits: time moves only when a test
//! moves it, flows run only when it drives them, so a test gives the same
//! result on every run.
//!
//! ```
//! # async fn demo() -> sandflow::Result<()> {
//! use std::time::Duration;
//! use sandflow::testing::TestDatabase;
//!
//! let mut t = TestDatabase::new().await?;
//! t.execute("CREATE TABLE cpu (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))").await?;
//! t.execute("CREATE FLOW peak SINK TO peaks AS SELECT host, max(v) AS m FROM cpu GROUP BY host").await?;
//! t.execute("INSERT INTO cpu VALUES ('a', 0.5, 0)").await?;
//! t.advance(Duration::from_secs(1)).await?;
//! assert_eq!(t.query("SELECT host, m FROM peaks").await?, vec![vec!["a".to_string(), "0.5".to_string()]]);
//! t.restart().await?; // a clean restart on the same in-memory store
//! t.crash().await?;   // as a kill -9: only what was committed survives
//! # Ok(()) }
//! ```

pub mod slt;

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::Array;
use datafusion::arrow::util::display::array_value_to_string;
use sandflow_flows::VirtualClock;

use crate::database::{DatabaseConfig, StorageConfig};
use crate::error::{InternalSnafu, Result};
use crate::flow::FlowSettings;
use crate::storage::redb::RedbStorage;
use crate::{Database, Output};

/// A database in memory on a virtual clock (starting at 0, 1970-01-01),
/// whose flows run only when driven: after each statement, and as time
/// moves.
pub struct TestDatabase {
    db: Option<Arc<Database>>,
    clock: Arc<VirtualClock>,
    storage: RedbStorage,
    flows: FlowSettings,
    /// The test's session database (`USE`), kept across statements and
    /// restarts as a client's connection would keep it.
    session_database: std::sync::Mutex<String>,
}

impl std::fmt::Debug for TestDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDatabase")
            .field("now_ms", &self.now_ms())
            .finish_non_exhaustive()
    }
}

impl TestDatabase {
    /// A fresh database with default flow settings.
    pub async fn new() -> Result<TestDatabase> {
        TestDatabase::with_flows(FlowSettings::default()).await
    }

    /// A fresh database whose flows run with `flows`. Without a sandbox in
    /// `flows`, it makes one that its restarts keep (the engine is compiled
    /// once).
    pub async fn with_flows(flows: FlowSettings) -> Result<TestDatabase> {
        let mut flows = flows;
        if flows.engine == crate::flow::FlowEngine::Wasm && flows.sandbox.is_none() {
            let sandbox = crate::runtime::Sandbox::new(crate::runtime::RuntimeConfig::default())
                .map_err(|e| {
                    InternalSnafu {
                        message: format!("cannot set up the sandbox: {e}"),
                    }
                    .build()
                })?;
            flows.sandbox = Some(Arc::new(sandbox));
        }
        let storage = RedbStorage::in_memory()?;
        let clock = Arc::new(VirtualClock::new(0));
        let db = open(&storage, &clock, &flows).await?;
        Ok(TestDatabase {
            db: Some(db),
            clock,
            storage,
            flows,
            session_database: std::sync::Mutex::new(crate::catalog::DEFAULT_DATABASE.into()),
        })
    }

    /// The database under test.
    pub fn database(&self) -> &Arc<Database> {
        self.db
            .as_ref()
            .expect("a TestDatabase always holds its database")
    }

    /// The virtual time (ms since the Unix epoch).
    pub fn now_ms(&self) -> i64 {
        use sandflow_flows::Clock;
        self.clock.now_ms()
    }

    /// Runs `sql` (one or more statements) in the test's session database,
    /// then every flow that has input.
    pub async fn execute(&self, sql: &str) -> Result<Vec<Output>> {
        let current = self.session_database();
        let mut session = self.database().session();
        // A database dropped since: the session falls back to `public`.
        if session.use_database(&current).is_err() {
            self.set_session_database(crate::catalog::DEFAULT_DATABASE);
        }
        let out = Box::pin(session.execute(sql)).await;
        self.set_session_database(&session.database());
        self.database().run_flows().await?;
        out
    }

    fn session_database(&self) -> String {
        self.session_database
            .lock()
            .map(|d| d.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    fn set_session_database(&self, database: &str) {
        let mut d = self
            .session_database
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *d = database.to_string();
    }

    /// Runs a query; returns its rows, each cell as sqllogictest writes it
    /// (`NULL`, `(empty)` for an empty string).
    pub async fn query(&self, sql: &str) -> Result<Vec<Vec<String>>> {
        let out = self.execute(sql).await?;
        Ok(match out.into_iter().last() {
            Some(Output::Rows { batches, .. }) => rows_of(&batches),
            _ => Vec::new(),
        })
    }

    /// Moves time forward by `d`: flows tick as they would over that span,
    /// rows past a ttl expire.
    pub async fn advance(&self, d: Duration) -> Result<()> {
        let to = self
            .now_ms()
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.set_time(to).await
    }

    /// Sets the time (forward only).
    pub async fn set_time(&self, ms: i64) -> Result<()> {
        self.database().advance_time_to(ms).await
    }

    /// Every flow catches up with everything committed (`ADMIN FLUSH_FLOW`
    /// for each of them), flows that read other flows' sinks included: the
    /// flows are flushed again until a round writes nothing.
    pub async fn flush(&self) -> Result<()> {
        let db = self.database();
        let flows = db.flows();
        // A chain of flows is at most as long as there are flows.
        for _ in 0..=flows.len() {
            let mut wrote = 0;
            for f in &flows {
                if f.status.error.is_none() {
                    wrote += db.flush_flow(&f.def.name).await?;
                }
            }
            if wrote == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Closes the database cleanly and opens it again on the same store.
    pub async fn restart(&mut self) -> Result<()> {
        if let Some(db) = self.db.take() {
            close(db, false).await?;
        }
        self.db = Some(open(&self.storage, &self.clock, &self.flows).await?);
        Ok(())
    }

    /// Closes the database as a crash would (flows write nothing more), and
    /// opens it again on what was committed.
    pub async fn crash(&mut self) -> Result<()> {
        if let Some(db) = self.db.take() {
            close(db, true).await?;
        }
        self.db = Some(open(&self.storage, &self.clock, &self.flows).await?);
        Ok(())
    }
}

async fn open(
    storage: &RedbStorage,
    clock: &Arc<VirtualClock>,
    flows: &FlowSettings,
) -> Result<Arc<Database>> {
    let config = DatabaseConfig {
        storage: StorageConfig::Shared(storage.clone()),
        flows: flows.clone(),
        clock: crate::database::ClockConfig::Virtual(clock.clone()),
    };
    let db = Database::open_config(config).await?;
    db.run_flows().await?;
    Ok(db)
}

/// Drops the database on a blocking thread (its flows' last steps run there).
async fn close(db: Arc<Database>, crash: bool) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        if crash {
            db.crash();
        } else {
            drop(db);
        }
    })
    .await
    .map_err(|e| {
        InternalSnafu {
            message: format!("closing the test database failed: {e}"),
        }
        .build()
    })
}

/// Rows of `batches`, each cell as sqllogictest writes it.
pub fn rows_of(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|c| cell(c.as_ref(), r))
                    .collect::<Vec<_>>(),
            );
        }
    }
    rows
}

fn cell(c: &dyn Array, row: usize) -> String {
    if c.is_null(row) {
        return "NULL".to_string();
    }
    match array_value_to_string(c, row) {
        Ok(s) if s.is_empty() => "(empty)".to_string(),
        Ok(s) => s,
        Err(e) => format!("<{e}>"),
    }
}
