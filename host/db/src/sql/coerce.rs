//! Integers compared with a timestamp column are timestamps in the column's
//! unit, as GreptimeDB reads them: `WHERE ts >= 1000`, `ts BETWEEN 7 AND 10`
//! and `ts IN (1, 2)` on a millisecond column mean those milliseconds since
//! the epoch. DataFusion alone refuses them ("Cannot infer common argument
//! type for comparison operation Timestamp(ms) >= Int64").
//!
//! A DataFusion expression rewrite, applied to every plan before its type
//! coercion, with the plan's input columns. Only a column compared with an
//! integer literal is touched; anything else is left to DataFusion.
//!
//! Must not know sandflow's tables or sessions: it sees DataFusion plans
//! only.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::logical_expr::expr::InList;
use datafusion::logical_expr::expr_rewriter::FunctionRewrite;
use datafusion::logical_expr::{Between, BinaryExpr, Expr, ExprSchemable, Operator};
use datafusion::prelude::SessionContext;

/// Registers the rewrite in `ctx` (and so in every session made from it).
pub fn register(ctx: &SessionContext) {
    use datafusion::execution::FunctionRegistry;
    // Only fails for registries that take no rewrites; a context takes them.
    let _ = ctx
        .state_ref()
        .write()
        .register_function_rewrite(Arc::new(IntegersAsTimestamps));
}

#[derive(Debug)]
struct IntegersAsTimestamps;

impl FunctionRewrite for IntegersAsTimestamps {
    fn name(&self) -> &str {
        "integers_as_timestamps"
    }

    fn rewrite(
        &self,
        expr: Expr,
        schema: &DFSchema,
        _config: &ConfigOptions,
    ) -> Result<Transformed<Expr>> {
        Ok(match expr {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) if is_comparison(op) => {
                match (time_unit(&left, schema), time_unit(&right, schema)) {
                    (Some(t), None) => match as_timestamp(&right, &t) {
                        Some(lit) => Transformed::yes(Expr::BinaryExpr(BinaryExpr {
                            left,
                            op,
                            right: Box::new(lit),
                        })),
                        None => Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })),
                    },
                    (None, Some(t)) => match as_timestamp(&left, &t) {
                        Some(lit) => Transformed::yes(Expr::BinaryExpr(BinaryExpr {
                            left: Box::new(lit),
                            op,
                            right,
                        })),
                        None => Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })),
                    },
                    _ => Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })),
                }
            }
            Expr::Between(b) => match time_unit(&b.expr, schema) {
                Some(t) => {
                    let low = as_timestamp(&b.low, &t);
                    let high = as_timestamp(&b.high, &t);
                    if low.is_none() && high.is_none() {
                        return Ok(Transformed::no(Expr::Between(b)));
                    }
                    Transformed::yes(Expr::Between(Between {
                        expr: b.expr,
                        negated: b.negated,
                        low: Box::new(low.unwrap_or(*b.low)),
                        high: Box::new(high.unwrap_or(*b.high)),
                    }))
                }
                None => Transformed::no(Expr::Between(b)),
            },
            Expr::InList(l) => match time_unit(&l.expr, schema) {
                Some(t) if l.list.iter().any(|e| as_timestamp(e, &t).is_some()) => {
                    let list = l
                        .list
                        .into_iter()
                        .map(|e| as_timestamp(&e, &t).unwrap_or(e))
                        .collect();
                    Transformed::yes(Expr::InList(InList {
                        expr: l.expr,
                        list,
                        negated: l.negated,
                    }))
                }
                _ => Transformed::no(Expr::InList(l)),
            },
            other => Transformed::no(other),
        })
    }
}

fn is_comparison(op: Operator) -> bool {
    matches!(
        op,
        Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq
            | Operator::IsDistinctFrom
            | Operator::IsNotDistinctFrom
    )
}

/// The unit and zone of `expr` when it is a column of timestamps.
fn time_unit(expr: &Expr, schema: &DFSchema) -> Option<(TimeUnit, Option<Arc<str>>)> {
    if !matches!(expr, Expr::Column(_)) {
        return None;
    }
    match expr.get_type(schema).ok()? {
        DataType::Timestamp(unit, tz) => Some((unit, tz)),
        _ => None,
    }
}

/// `expr` as a timestamp literal of `unit` when it is an integer literal
/// (a value in that unit); `None` for anything else, NULL included.
fn as_timestamp(expr: &Expr, (unit, tz): &(TimeUnit, Option<Arc<str>>)) -> Option<Expr> {
    let Expr::Literal(value, _) = expr else {
        return None;
    };
    let v = match value {
        ScalarValue::Int8(Some(v)) => i64::from(*v),
        ScalarValue::Int16(Some(v)) => i64::from(*v),
        ScalarValue::Int32(Some(v)) => i64::from(*v),
        ScalarValue::Int64(Some(v)) => *v,
        ScalarValue::UInt8(Some(v)) => i64::from(*v),
        ScalarValue::UInt16(Some(v)) => i64::from(*v),
        ScalarValue::UInt32(Some(v)) => i64::from(*v),
        ScalarValue::UInt64(Some(v)) => i64::try_from(*v).ok()?,
        _ => return None,
    };
    let (v, tz) = (Some(v), tz.clone());
    let value = match unit {
        TimeUnit::Second => ScalarValue::TimestampSecond(v, tz),
        TimeUnit::Millisecond => ScalarValue::TimestampMillisecond(v, tz),
        TimeUnit::Microsecond => ScalarValue::TimestampMicrosecond(v, tz),
        TimeUnit::Nanosecond => ScalarValue::TimestampNanosecond(v, tz),
    };
    Some(Expr::Literal(value, None))
}
