//! Helpers for tests that drive a `Database` through the library API.

use sandflow::database::Output;
use sandflow::Database;

/// Runs `sql` and returns the rows of its last statement, every value shown as
/// text (as psql would show it). Panics with the statement if it fails or
/// returns no rows.
pub async fn rows(db: &Database, sql: &str) -> Vec<Vec<String>> {
    let out = db
        .execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let Some(Output::Rows { batches, .. }) = out.into_iter().last() else {
        panic!("{sql}: no rows");
    };
    let mut all = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            all.push(
                b.columns()
                    .iter()
                    .map(|c| {
                        datafusion::arrow::util::display::array_value_to_string(c, r)
                            .unwrap_or_default()
                    })
                    .collect(),
            );
        }
    }
    all
}
