//! `INSERT INTO t [(columns)] VALUES (...), ...` of plain literals, without
//! DataFusion: the most common write, and in a profile of 1,000-row INSERTs
//! DataFusion's planning, expression simplification and the allocations
//! they make were about half of the server's time per row.
//!
//! The fast path takes only statements whose result it can give exactly as
//! DataFusion would: each value a number, a single-quoted string, a boolean
//! or NULL; each column's values of one kind; every cast to the column's
//! type done with arrow's cast kernel, as DataFusion's planner casts each
//! VALUES literal to its target column. Anything else (expressions,
//! parameters, `ON CONFLICT`, an unknown table or column, a cast that
//! fails, ...) returns `None`, and the statement goes through DataFusion,
//! which gives its own answer or error. The rows are written by the same
//! function as DataFusion's INSERT (`provider::write_rows`): transaction
//! blocks, the cancel gate, quotas, NOT NULL and type checks in the store.
//!
//! Must not know: the front doors, flows.

use std::sync::Arc;

use datafusion::arrow::array::{
    new_null_array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::prelude::SessionContext;
use datafusion::sql::planner::IdentNormalizer;
use datafusion::sql::sqlparser::ast::{
    Expr, Insert, ObjectNamePart, SetExpr, Statement, TableObject, UnaryOperator, Value,
};

use crate::auth::{Principal, Privilege};
use crate::database::Core;
use crate::error::Result;
use crate::session::SessionShared;

/// Runs `stmt` if it is a plain literal INSERT (see the module docs):
/// `Some(rows affected)`, or `None` when DataFusion must plan it.
pub(crate) async fn try_insert(
    core: &Arc<Core>,
    ctx: &SessionContext,
    stmt: &Statement,
) -> Result<Option<u64>> {
    let Statement::Insert(insert) = stmt else {
        return Ok(None);
    };
    let Some(rows) = literal_rows(insert) else {
        return Ok(None);
    };
    let (database, normalize, shared) = {
        let state = ctx.state_ref();
        let state = state.read();
        let options = state.config().options();
        (
            options.catalog.default_schema.clone(),
            options.sql_parser.enable_ident_normalization,
            state.config().get_extension::<SessionShared>(),
        )
    };
    let normalizer = IdentNormalizer::new(normalize);
    let TableObject::TableName(name) = &insert.table else {
        return Ok(None);
    };
    let mut parts = Vec::with_capacity(2);
    for part in &name.0 {
        let ObjectNamePart::Identifier(ident) = part else {
            return Ok(None);
        };
        parts.push(normalizer.normalize(ident.clone()));
    }
    let (database, table_name) = match parts.as_slice() {
        [t] => (database, t.clone()),
        [d, t] => (d.clone(), t.clone()),
        _ => return Ok(None),
    };
    let Some(table) = core.catalog.table(&database, &table_name)? else {
        return Ok(None);
    };
    // The privilege check DataFusion's INSERT gets from `authorize_plan`.
    let principal = shared
        .as_ref()
        .map(|s| s.principal.clone())
        .unwrap_or(Principal::Root);
    if principal != Principal::Root && !core.access.is_superuser(&principal) {
        core.access
            .check(&principal, Privilege::Insert, &database, Some(&table_name))?;
    }

    let columns = &table.schema().columns;
    // Which table column each VALUES position fills.
    let targets: Vec<usize> = if insert.columns.is_empty() {
        (0..columns.len()).collect()
    } else {
        let mut targets = Vec::with_capacity(insert.columns.len());
        for c in &insert.columns {
            let [ObjectNamePart::Identifier(ident)] = c.0.as_slice() else {
                return Ok(None);
            };
            let name = normalizer.normalize(ident.clone());
            match columns.iter().position(|c| c.name == name) {
                Some(i) if !targets.contains(&i) => targets.push(i),
                _ => return Ok(None),
            }
        }
        targets
    };
    if rows.iter().any(|r| r.len() != targets.len()) {
        return Ok(None);
    }
    let n = rows.len();
    let schema = &table.arrow_schema;
    let mut arrays: Vec<Option<ArrayRef>> = vec![None; columns.len()];
    for (position, &column) in targets.iter().enumerate() {
        let target = schema.field(column).data_type();
        let Some(array) = column_array(rows.iter().map(|r| &r[position]), n, target) else {
            return Ok(None);
        };
        arrays[column] = Some(array);
    }
    let mut fields = Vec::with_capacity(columns.len());
    let mut filled = Vec::with_capacity(columns.len());
    for (i, array) in arrays.into_iter().enumerate() {
        let field = schema.field(i);
        let array = match array {
            Some(a) => a,
            None => match core.eval_default(&columns[i], n)? {
                Some(a) if a.data_type() == field.data_type() => a,
                Some(_) => return Ok(None),
                None => new_null_array(field.data_type(), n),
            },
        };
        // NOT NULL is checked by the store, naming the column.
        fields.push(Field::new(field.name(), field.data_type().clone(), true));
        filled.push(array);
    }
    let Ok(batch) = RecordBatch::try_new(Arc::new(Schema::new(fields)), filled) else {
        return Ok(None);
    };
    let written = crate::sql::provider::write_rows(core, &table, vec![batch], shared).await?;
    Ok(Some(written))
}

/// One VALUES literal.
enum Literal<'a> {
    Null,
    Bool(bool),
    /// A number's text and whether it had a minus in front.
    Number(&'a str, bool),
    Str(&'a str),
}

/// The rows of a plain `INSERT ... VALUES` whose values are all literals.
fn literal_rows(insert: &Insert) -> Option<Vec<Vec<Literal<'_>>>> {
    let plain = insert.or.is_none()
        && !insert.ignore
        && insert.table_alias.is_none()
        && !insert.overwrite
        && insert.assignments.is_empty()
        && insert.partitioned.is_none()
        && insert.after_columns.is_empty()
        && insert.on.is_none()
        && insert.returning.is_none()
        && insert.output.is_none()
        && !insert.replace_into
        && insert.priority.is_none()
        && insert.insert_alias.is_none()
        && insert.settings.is_none()
        && insert.format_clause.is_none()
        && insert.multi_table_insert_type.is_none()
        && insert.multi_table_into_clauses.is_empty()
        && insert.optimizer_hints.is_empty();
    let query = insert.source.as_ref()?;
    let plain = plain
        && query.with.is_none()
        && query.order_by.is_none()
        && query.limit_clause.is_none()
        && query.fetch.is_none()
        && query.locks.is_empty()
        && query.for_clause.is_none()
        && query.settings.is_none()
        && query.format_clause.is_none()
        && query.pipe_operators.is_empty();
    if !plain {
        return None;
    }
    let SetExpr::Values(values) = query.body.as_ref() else {
        return None;
    };
    if values.value_keyword || values.rows.is_empty() {
        return None;
    }
    values
        .rows
        .iter()
        .map(|row| row.content.iter().map(literal).collect::<Option<Vec<_>>>())
        .collect()
}

fn literal(e: &Expr) -> Option<Literal<'_>> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Null => Some(Literal::Null),
            Value::Boolean(b) => Some(Literal::Bool(*b)),
            Value::Number(n, false) => Some(Literal::Number(n, false)),
            Value::SingleQuotedString(s) => Some(Literal::Str(s)),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(n, false) => Some(Literal::Number(n, true)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// One column's values as an array of `target`, cast the way DataFusion
/// casts VALUES literals; `None` when they are not of one kind or a cast
/// fails (DataFusion then answers).
fn column_array<'a>(
    values: impl Iterator<Item = &'a Literal<'a>> + Clone,
    n: usize,
    target: &DataType,
) -> Option<ArrayRef> {
    #[derive(PartialEq, Clone, Copy)]
    enum Kind {
        Int,
        Float,
        Str,
        Bool,
    }
    let mut kind: Option<Kind> = None;
    for v in values.clone() {
        let k = match v {
            Literal::Null => continue,
            Literal::Bool(_) => Kind::Bool,
            Literal::Str(_) => Kind::Str,
            Literal::Number(text, negative) => match parse_int(text, *negative) {
                Some(_) => Kind::Int,
                // Past i64 DataFusion reads an unsigned integer.
                None if text.bytes().all(|b| b.is_ascii_digit()) => return None,
                None => Kind::Float,
            },
        };
        match (kind, k) {
            (None, k) => kind = Some(k),
            (Some(a), b) if a == b => {}
            // Integers and fractions in one column of floats: each is the
            // same double either way.
            (Some(Kind::Int | Kind::Float), Kind::Int | Kind::Float)
                if matches!(target, DataType::Float64) =>
            {
                kind = Some(Kind::Float)
            }
            // Otherwise DataFusion casts each literal on its own: leave the
            // statement to it.
            _ => return None,
        }
    }
    let array: ArrayRef = match kind {
        None => return Some(new_null_array(target, n)),
        Some(Kind::Bool) => Arc::new(
            values
                .map(|v| match v {
                    Literal::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect::<BooleanArray>(),
        ),
        Some(Kind::Str) => Arc::new(
            values
                .map(|v| match v {
                    Literal::Str(s) => Some(*s),
                    _ => None,
                })
                .collect::<StringArray>(),
        ),
        Some(Kind::Int) => {
            let mut ints = Vec::with_capacity(n);
            for v in values {
                ints.push(match v {
                    Literal::Number(text, negative) => Some(parse_int(text, *negative)?),
                    _ => None,
                });
            }
            Arc::new(Int64Array::from(ints))
        }
        Some(Kind::Float) => {
            let mut floats = Vec::with_capacity(n);
            for v in values {
                floats.push(match v {
                    Literal::Number(text, negative) => {
                        let f: f64 = text.parse().ok()?;
                        Some(if *negative { -f } else { f })
                    }
                    _ => None,
                });
            }
            Arc::new(Float64Array::from(floats))
        }
    };
    if array.data_type() == target {
        return Some(array);
    }
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(&array, target, &options).ok()
}

/// A number literal as DataFusion reads an integer: an `i64`, sign
/// included; anything else (a fraction, an exponent, past `i64`) is not.
fn parse_int(text: &str, negative: bool) -> Option<i64> {
    if negative {
        format!("-{text}").parse().ok()
    } else {
        text.parse().ok()
    }
}
