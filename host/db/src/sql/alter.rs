//! `ALTER TABLE`: columns added (`[FIRST | AFTER c]`, with a DEFAULT or
//! NULL for the rows already there), dropped, renamed or retyped (only
//! where the cast loses nothing), the table renamed, its options set and
//! unset.
//!
//! A change of columns rewrites the table's rows in the new layout, in the
//! commit that stores the new definition: writes planned against the old
//! layout and committed after it are refused (`Error::Conflict`), and the
//! rewrite itself is retried when a write lands while it reads. Flows that
//! read or write the table are stopped first and rebuilt over the new table
//! afterwards (a back-fill), unless they read a column the ALTER dropped,
//! renamed or retyped: those fail with the column's name.

use std::sync::Arc;

use datafusion::arrow::array::{new_null_array, Array, ArrayRef};
use datafusion::arrow::compute::cast;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;

use crate::catalog::{ColumnSchema, ColumnType, Table, TableInfo};
use crate::database::{Core, Output};
use crate::error::{Error, InvalidDataSnafu, NotFoundSnafu, Result, SqlSnafu, UnsupportedSnafu};
use crate::flow::manager::TableChange;
use crate::sql::parser::{AlterOp, AlterTable, ColumnPosition};
use crate::sql::provider::blocking;
use crate::storage::WriteSet;

/// How many times an ALTER TABLE reads and rewrites the rows again when
/// writes keep landing while it reads.
const REWRITE_ATTEMPTS: usize = 5;

/// The table an ALTER TABLE makes, and how to get its rows from the old one.
struct Plan {
    info: TableInfo,
    /// Per new column: the old column its values come from (`None`: a new
    /// column, its DEFAULT or NULL).
    sources: Vec<Option<usize>>,
    /// Whether the rows must be rewritten (columns added, dropped or
    /// retyped).
    rewrite: bool,
    change: TableChange,
}

pub(crate) async fn alter_table(
    core: &Arc<Core>,
    ctx: &SessionContext,
    at: AlterTable,
) -> Result<Output> {
    let old = core
        .catalog
        .require_table(&at.name.database, &at.name.table)?;
    let plan = plan(core, &old, &at.ops)?;
    let unchanged = plan.info.name == old.info.name
        && plan.info.schema == old.info.schema
        && plan.info.options == old.info.options;
    if unchanged {
        return Ok(affected());
    }
    let flows = core.flows.table_altering(core, &old).await;
    let result = {
        let (c, old, plan) = (core.clone(), old.clone(), plan_parts(&plan));
        blocking(move || rewrite(&c, &old, plan)).await
    };
    core.forget_defaults(old.id());
    // Flows start again whether or not the ALTER took effect.
    let mut change = plan.change.clone();
    if result.is_err() {
        change = TableChange {
            database: change.database,
            table: change.table,
            ..TableChange::default()
        };
    }
    core.flows.table_altered(core, ctx, flows, &change).await;
    result.map(|_| affected())
}

fn affected() -> Output {
    Output::Affected {
        tag: "ALTER TABLE".into(),
        rows: 0,
    }
}

/// What the rewrite needs, owned (it runs on a blocking thread).
fn plan_parts(plan: &Plan) -> (TableInfo, Vec<Option<usize>>, bool) {
    (plan.info.clone(), plan.sources.clone(), plan.rewrite)
}

/// Commits the new definition with the rows in the new layout; retries
/// when writes land while the rows are read.
fn rewrite(
    core: &Arc<Core>,
    old: &Arc<Table>,
    (info, sources, rewrite): (TableInfo, Vec<Option<usize>>, bool),
) -> Result<Arc<Table>> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = core
            .catalog
            .alter_table(&core.store, old, info.clone(), |new| {
                let mut set = WriteSet::new();
                if !rewrite {
                    return Ok(set);
                }
                let snapshot = core.store.scan(old)?;
                for batch in snapshot.batches.iter().filter(|b| b.num_rows() > 0) {
                    set.delete(old.clone(), batch.clone());
                    set.upsert(new.clone(), relayout(core, new, &sources, batch)?);
                }
                set.relayout(new.id(), new.info.version, snapshot.seq);
                Ok(set)
            });
        match result {
            Err(Error::Conflict { .. }) if attempt < REWRITE_ATTEMPTS => continue,
            other => return other,
        }
    }
}

/// `batch` (rows of the old table) in `new`'s columns.
fn relayout(
    core: &Core,
    new: &Table,
    sources: &[Option<usize>],
    batch: &RecordBatch,
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(sources.len());
    for (c, source) in new.schema().columns.iter().zip(sources) {
        let ty = new.arrow_schema.field(columns.len()).data_type().clone();
        let array = match source {
            Some(i) => {
                let from = batch.column(*i);
                let to = cast(from, &ty).map_err(|e| {
                    InvalidDataSnafu {
                        message: format!("cannot convert column '{}': {e}", c.name),
                    }
                    .build()
                })?;
                if to.null_count() != from.null_count() {
                    return InvalidDataSnafu {
                        message: format!(
                            "column '{}' has values that do not fit {}; nothing was changed",
                            c.name,
                            c.data_type.sql_name()
                        ),
                    }
                    .fail();
                }
                to
            }
            None => match core.eval_default(c, rows)? {
                Some(a) => a,
                None => new_null_array(&ty, rows),
            },
        };
        columns.push(array);
    }
    RecordBatch::try_new(new.arrow_schema.clone(), columns).map_err(|e| {
        InvalidDataSnafu {
            message: format!("cannot rewrite the rows of '{}': {e}", new.qualified_name()),
        }
        .build()
    })
}

fn sql(message: String) -> Error {
    SqlSnafu { message }.build()
}

/// Applies `ops` in order to `old`'s definition; checks each.
fn plan(core: &Core, old: &Table, ops: &[AlterOp]) -> Result<Plan> {
    let shown = crate::catalog::display_name(&old.info.database, &old.info.name);
    let schema = &old.info.schema;
    let time_index = schema.time_index_column().name.clone();
    let mut key: Vec<String> = schema
        .primary_key_names()
        .into_iter()
        .map(String::from)
        .collect();
    let mut columns: Vec<(ColumnSchema, Option<usize>)> = schema
        .columns
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, c)| (c, Some(i)))
        .collect();
    let mut info = old.info.clone();
    let mut rewrite = false;
    let mut change = TableChange {
        database: old.info.database.clone(),
        table: old.info.name.clone(),
        ..TableChange::default()
    };
    let find = |columns: &[(ColumnSchema, Option<usize>)], name: &str| {
        columns.iter().position(|(c, _)| c.name == name)
    };
    let missing = |name: &str| {
        NotFoundSnafu {
            message: format!("column '{name}' does not exist in table '{shown}'; see DESC TABLE"),
        }
        .build()
    };
    let is_key = |name: &str, key: &[String]| name == time_index || key.iter().any(|k| k == name);
    for op in ops {
        match op {
            AlterOp::AddColumn {
                column,
                if_not_exists,
                position,
            } => {
                if find(&columns, &column.name).is_some() {
                    if *if_not_exists {
                        continue;
                    }
                    return Err(sql(format!(
                        "column '{}' already exists in table '{shown}'; use ADD COLUMN IF NOT \
                         EXISTS to skip it",
                        column.name
                    )));
                }
                if column.time_index {
                    return Err(sql(format!(
                        "cannot add column '{}' as the TIME INDEX: table '{shown}' has one, \
                         '{time_index}'",
                        column.name
                    )));
                }
                let c = ColumnSchema {
                    name: column.name.clone(),
                    data_type: column.data_type,
                    nullable: column.nullable.unwrap_or(true),
                    default: column.default.as_ref().map(|e| e.to_string()),
                    comment: column.comment.clone(),
                    index: column.index.clone(),
                };
                if !c.nullable && c.default.is_none() {
                    return Err(sql(format!(
                        "column '{}' is NOT NULL without a DEFAULT: the rows already in \
                         '{shown}' would have no value; give it a DEFAULT or let it be NULL",
                        c.name
                    )));
                }
                // A DEFAULT that does not give a value of the type fails here.
                core.eval_default(&c, 1)?;
                let at = match position {
                    None => columns.len(),
                    Some(ColumnPosition::First) => 0,
                    Some(ColumnPosition::After(after)) => {
                        find(&columns, after).ok_or_else(|| missing(after))? + 1
                    }
                };
                if column.primary_key {
                    key.push(c.name.clone());
                }
                columns.insert(at, (c, None));
                rewrite = true;
            }
            AlterOp::DropColumn { name, if_exists } => {
                let Some(i) = find(&columns, name) else {
                    if *if_exists {
                        continue;
                    }
                    return Err(missing(name));
                };
                if is_key(name, &key) {
                    return Err(sql(format!(
                        "cannot drop column '{name}': it is part of the key of table \
                         '{shown}' (its time index or primary key)"
                    )));
                }
                columns.remove(i);
                change
                    .columns
                    .push((name.clone(), "was dropped".to_string()));
                rewrite = true;
            }
            AlterOp::RenameColumn { from, to } => {
                let i = find(&columns, from).ok_or_else(|| missing(from))?;
                if find(&columns, to).is_some() {
                    return Err(sql(format!(
                        "cannot rename column '{from}' to '{to}': table '{shown}' has a column \
                         '{to}'"
                    )));
                }
                columns[i].0.name = to.clone();
                for k in key.iter_mut().filter(|k| *k == from) {
                    *k = to.clone();
                }
                change
                    .columns
                    .push((from.clone(), format!("was renamed to '{to}'")));
            }
            AlterOp::RenameTable(name) => {
                crate::catalog::check_name("table", name)?;
                if *name == old.info.name {
                    // That name is taken, by the table itself (GreptimeDB
                    // refuses it too); the catalog refuses any other taken one.
                    return Err(crate::catalog::name_taken(old, name));
                }
                info.name = name.clone();
                change.renamed_to = Some(name.clone());
            }
            AlterOp::ModifyColumn { name, data_type } => {
                let i = find(&columns, name).ok_or_else(|| missing(name))?;
                let from = columns[i].0.data_type;
                if from == *data_type {
                    continue;
                }
                if is_key(name, &key) {
                    return UnsupportedSnafu {
                        message: format!(
                            "cannot change the type of column '{name}': it is part of the key \
                             of table '{shown}' (its time index or primary key)"
                        ),
                    }
                    .fail();
                }
                if !modifiable(from, *data_type) {
                    return UnsupportedSnafu {
                        message: format!(
                            "cannot change column '{name}' from {} to {}: not every value \
                             converts without loss; add a new column and copy the values with \
                             an INSERT INTO ... SELECT instead",
                            from.sql_name(),
                            data_type.sql_name()
                        ),
                    }
                    .fail();
                }
                columns[i].0.data_type = *data_type;
                change.columns.push((
                    name.clone(),
                    format!("changed type to {}", data_type.sql_name()),
                ));
                rewrite = true;
            }
            AlterOp::ColumnIndex { name, kind, clause } => {
                // Kept and shown, as in CREATE TABLE; rows are stored and
                // read the same with or without an index.
                let i = find(&columns, name).ok_or_else(|| missing(name))?;
                let column = &mut columns[i].0;
                if *kind == "FULLTEXT" && clause.is_some() && column.data_type != ColumnType::String
                {
                    return UnsupportedSnafu {
                        message: format!(
                            "FULLTEXT INDEX needs a STRING column; '{name}' is {}",
                            column.data_type.sql_name()
                        ),
                    }
                    .fail();
                }
                column.index = crate::sql::parser::set_index_clause(
                    column.index.as_deref(),
                    kind,
                    clause.clone(),
                );
            }
            AlterOp::SetOptions(options) => {
                for (k, v) in options {
                    if k == "append_mode" {
                        return UnsupportedSnafu {
                            message: format!(
                                "append_mode of table '{shown}' cannot be changed: it decides \
                                 how rows are kept; create a new table and copy the rows"
                            ),
                        }
                        .fail();
                    }
                    if crate::sql::is_tuning_option(k) {
                        // `SET 'k' = NULL`: back to GreptimeDB's default.
                        if v.is_empty() {
                            info.options.remove(k);
                        } else {
                            info.options
                                .insert(k.clone(), crate::sql::tuning_value(k, v)?);
                        }
                        continue;
                    }
                    match crate::sql::row_option(k, v)? {
                        Some(v) => info.options.insert(k.clone(), v),
                        None => info.options.remove(k),
                    };
                }
            }
            AlterOp::UnsetOptions(keys) => {
                for k in keys {
                    if k == "append_mode" {
                        return UnsupportedSnafu {
                            message: format!("append_mode of table '{shown}' cannot be changed"),
                        }
                        .fail();
                    }
                    // Checks the name; the default is what is left.
                    if !crate::sql::is_tuning_option(k) {
                        crate::sql::row_option(k, "")?;
                    }
                    info.options.remove(k);
                }
            }
        }
    }
    if info.options.contains_key("merge_mode") && schema.append_mode {
        return Err(sql(
            "merge_mode = 'last_non_null' merges the versions of a row, and this table is \
             append-mode: it keeps every version"
                .to_string(),
        ));
    }
    let (cols, sources): (Vec<ColumnSchema>, Vec<Option<usize>>) = columns.into_iter().unzip();
    let pk: Vec<&str> = key.iter().map(String::as_str).collect();
    // The time index keeps its column, whatever its name is now.
    let ts = sources
        .iter()
        .position(|s| *s == Some(schema.time_index))
        .and_then(|i| cols.get(i))
        .map(|c| c.name.clone())
        .unwrap_or(time_index);
    let mut new_schema = crate::catalog::TableSchema::new(cols, &ts, &pk, schema.append_mode)?;
    new_schema.partition = schema.partition.clone();
    info.schema = new_schema;
    if rewrite {
        info.version = old.info.version + 1;
    }
    Ok(Plan {
        info,
        sources,
        rewrite,
        change,
    })
}

/// Whether MODIFY COLUMN may change a column from `from` to `to`: a cast
/// that loses nothing, or to a string (every value has its text).
fn modifiable(from: ColumnType, to: ColumnType) -> bool {
    crate::flow::sink::lossless(from, to)
        || (to == ColumnType::String && from != ColumnType::Binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modify_only_without_loss() {
        assert!(modifiable(ColumnType::Int32, ColumnType::Int64));
        assert!(modifiable(ColumnType::Float64, ColumnType::String));
        assert!(!modifiable(ColumnType::Int64, ColumnType::Int32));
        assert!(!modifiable(ColumnType::String, ColumnType::Int64));
        assert!(!modifiable(ColumnType::Binary, ColumnType::String));
    }
}
