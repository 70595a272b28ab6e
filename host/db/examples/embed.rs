//! sandflow as a library: a database in memory on a virtual clock, a table,
//! a flow, and time moved by hand. `cargo run -p sandflow --example embed`;
//! README.md shows this file.

use std::sync::Arc;

use sandflow::clock::VirtualClock;
use sandflow::{Database, DatabaseConfig, Output};

#[tokio::main]
async fn main() -> sandflow::Result<()> {
    // In memory (`DatabaseConfig::dir(path)` keeps the data on disk), on a
    // clock that moves only when told: flows then run only when driven.
    let clock = Arc::new(VirtualClock::new(1_700_000_000_000));
    let db = Database::open_config(DatabaseConfig::in_memory().with_virtual_clock(clock)).await?;

    db.execute(
        "CREATE TABLE cpu (host STRING, usage DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host)); \
         CREATE FLOW busiest SINK TO busiest_hosts AS \
           SELECT host, max(usage) AS peak FROM cpu GROUP BY host",
    )
    .await?;
    db.execute("INSERT INTO cpu VALUES ('a', 0.5, 1700000000000), ('b', 0.9, 1700000000000)")
        .await?;
    // A second later (virtual time): the flow has ticked.
    db.advance_time_to(1_700_000_001_000).await?;

    for out in db
        .execute("SELECT host, peak FROM busiest_hosts ORDER BY host")
        .await?
    {
        if let Output::Rows { batches, .. } = out {
            let table =
                datafusion::arrow::util::pretty::pretty_format_batches(&batches).map_err(|e| {
                    sandflow::Error::Internal {
                        message: e.to_string(),
                    }
                })?;
            println!("{table}");
        }
    }
    // This database's own metrics, as GET /metrics would render them.
    assert!(db.metrics().render().contains("flow=\"busiest\""));
    Ok(())
}
