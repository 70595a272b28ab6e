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

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result};
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
        let mut changed = false;
        // `e` as a time of type `to` when it is an integer literal.
        let mut convert = |e: Box<Expr>, to: &Option<DataType>| match to
            .as_ref()
            .and_then(|t| as_timestamp(&e, t))
        {
            Some(lit) => {
                changed = true;
                Box::new(lit)
            }
            None => e,
        };
        let expr = match expr {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) if is_comparison(op) => {
                let (on_left, on_right) = (timestamps(&left, schema), timestamps(&right, schema));
                Expr::BinaryExpr(BinaryExpr {
                    left: convert(left, &on_right),
                    op,
                    right: convert(right, &on_left),
                })
            }
            Expr::Between(b) => {
                let t = timestamps(&b.expr, schema);
                Expr::Between(Between {
                    low: convert(b.low, &t),
                    high: convert(b.high, &t),
                    ..b
                })
            }
            Expr::InList(l) => {
                let t = timestamps(&l.expr, schema);
                let list = l
                    .list
                    .into_iter()
                    .map(|e| *convert(Box::new(e), &t))
                    .collect();
                Expr::InList(InList { list, ..l })
            }
            other => other,
        };
        Ok(match changed {
            true => Transformed::yes(expr),
            false => Transformed::no(expr),
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

/// The type of `expr` when it is a column of timestamps.
fn timestamps(expr: &Expr, schema: &DFSchema) -> Option<DataType> {
    if !matches!(expr, Expr::Column(_)) {
        return None;
    }
    expr.get_type(schema)
        .ok()
        .filter(|t| matches!(t, DataType::Timestamp(..)))
}

/// `expr` as a literal of the timestamp type `to` when it is an integer
/// literal (a count of `to`'s unit, as arrow casts it); `None` for anything
/// else, NULL and integers out of range included.
fn as_timestamp(expr: &Expr, to: &DataType) -> Option<Expr> {
    let Expr::Literal(value, _) = expr else {
        return None;
    };
    if value.is_null() || !value.data_type().is_integer() {
        return None;
    }
    let value = value.cast_to(to).ok()?;
    (!value.is_null()).then_some(Expr::Literal(value, None))
}
