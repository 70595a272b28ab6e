//! Compiling a flow's query: SQL → DataFusion logical plan → Substrait bytes,
//! plus what the host needs around it: the source tables in the order the
//! guest is told about them, the output columns, and which output columns are
//! GROUP BY keys (they become the sink's primary key).

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::TableReference;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::prelude::SessionContext;
use prost::Message;

use super::arrow::{fields_from_arrow, ConvertError};
use crate::runtime::{Field, SourceSchema};
use crate::sql::parser::{table_name, TableName};

/// A flow query ready to be handed to a guest.
#[derive(Debug, Clone)]
pub struct CompiledFlow {
    /// Substrait `Plan` message bytes.
    pub plan: Vec<u8>,
    /// Source tables, in the order of the guest's source indexes.
    pub sources: Vec<FlowSource>,
    /// The query's output columns (names as DataFusion displays them).
    pub output: Vec<Field>,
    /// Names of output columns that are GROUP BY keys, in output order.
    pub group_keys: Vec<String>,
    /// Whether the query aggregates.
    pub aggregates: bool,
    /// Whether the plan is the flow's query wrapped to count its rows (see
    /// the manager's `compile_flow`): it aggregates, the query does not.
    pub counted: bool,
    /// Whether the plan has an outer join (whose padded columns may be NULL
    /// whatever their tables say).
    pub outer_join: bool,
}

/// One table a flow reads.
#[derive(Debug, Clone)]
pub struct FlowSource {
    /// The table as the query named it (resolved against the session's defaults).
    pub table: TableReference,
    /// Its full schema, as rows are pushed to the guest.
    pub schema: SourceSchema,
}

/// Why a query cannot become a flow.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileError(pub String);

/// How deep a flow's expressions may nest, counting each operator of a chain
/// (`a + b + c`) as a level: the engine decodes and evaluates expression trees
/// by recursion on its own stack in the sandbox, which holds trees this deep
/// with room to spare. Deeper ones are refused at CREATE FLOW (a plain query
/// may go deeper, up to [`crate::sql::parser::MAX_EXPRESSION_DEPTH`]).
pub const FLOW_MAX_EXPRESSION_DEPTH: usize = 250;

/// How many operators deep a flow's plan may be (its scans, filters,
/// projections and aggregates on top of each other).
pub const FLOW_MAX_PLAN_DEPTH: usize = 64;

/// The text that marks a [`CompileError`] as a limit (SQLSTATE 54001).
pub const TOO_COMPLEX: &str = "too complex for a flow";

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<ConvertError> for CompileError {
    fn from(e: ConvertError) -> Self {
        CompileError(e.0)
    }
}

/// Plans `sql` in `ctx` and encodes it for the guest.
pub async fn compile(ctx: &SessionContext, sql: &str) -> Result<CompiledFlow, CompileError> {
    let sql = crate::sql::parser::greptime_type_names(sql, crate::sql::parser::Dialect::Generic);
    let df = ctx
        .sql(&sql)
        .await
        .map_err(|e| CompileError(format!("cannot plan the flow's query: {e}")))?;
    // Before optimising: the optimiser folds now() into a constant.
    let (state, plan) = df.into_parts();
    let plan = temporal_filters(plan)?;
    check_deterministic(&plan)?;
    check_depth(&plan)?;
    let plan = state
        .optimize(&plan)
        .map_err(|e| CompileError(format!("cannot optimise the flow's query: {e}")))?;
    check_depth(&plan)?;
    compile_plan(ctx, &plan)
}

/// The tables `query` names in its FROM clauses (not its CTEs), resolved as
/// a flow's sources are (`t` is `database.t`), in the order written, each
/// once. Empty when the text does not parse.
pub fn named_tables(query: &str, database: &str) -> Vec<TableName> {
    use datafusion::sql::sqlparser::ast::{ObjectName, Query, Visit, Visitor};
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use std::ops::ControlFlow;

    struct Names {
        database: String,
        ctes: Vec<String>,
        tables: Vec<TableName>,
    }
    impl Visitor for Names {
        type Break = ();
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
            if let Some(with) = &query.with {
                self.ctes.extend(
                    with.cte_tables
                        .iter()
                        .map(|c| crate::sql::parser::normalize_ident(&c.alias.name)),
                );
            }
            ControlFlow::Continue(())
        }
        fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<()> {
            if let Ok(mut t) = table_name(name) {
                t.bind(&self.database);
                if !self.tables.contains(&t) {
                    self.tables.push(t);
                }
            }
            ControlFlow::Continue(())
        }
    }
    let Ok(statements) =
        datafusion::sql::sqlparser::parser::Parser::parse_sql(&GenericDialect {}, query)
    else {
        return Vec::new();
    };
    let mut names = Names {
        database: database.to_string(),
        ctes: Vec::new(),
        tables: Vec::new(),
    };
    for s in &statements {
        let _ = s.visit(&mut names);
    }
    let Names { ctes, tables, .. } = names;
    tables
        .into_iter()
        .filter(|t| t.qualified || !ctes.contains(&t.table))
        .collect()
}

/// Encodes an already planned query for the guest.
pub fn compile_plan(
    ctx: &SessionContext,
    plan: &LogicalPlan,
) -> Result<CompiledFlow, CompileError> {
    let sources = sources_of(plan)?;
    if sources.is_empty() {
        return Err(CompileError(
            "a flow must read from at least one table".into(),
        ));
    }
    let output = fields_from_arrow(plan.schema().as_arrow())?;
    let (aggregates, group_keys) = group_keys_of(plan);
    let mut outer_join = false;
    let mut not_in = false;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Join(j) = node {
            use datafusion::common::JoinType;
            outer_join |= matches!(
                j.join_type,
                JoinType::Left | JoinType::Right | JoinType::Full
            );
            not_in |= j.null_aware;
        }
        Ok(TreeNodeRecursion::Continue)
    });
    if not_in {
        return Err(CompileError(
            "unsupported: NOT IN (SELECT ...) is not supported in flows (one NULL in the \
             subquery's rows empties the result); use NOT EXISTS (SELECT ... WHERE ...), which \
             flows maintain"
                .into(),
        ));
    }
    let substrait =
        datafusion_substrait::logical_plan::producer::to_substrait_plan(plan, &ctx.state())
            .map_err(|e| {
                CompileError(format!("cannot encode the flow's query as Substrait: {e}"))
            })?;
    Ok(CompiledFlow {
        plan: substrait.encode_to_vec(),
        sources,
        output,
        group_keys,
        aggregates,
        counted: false,
        outer_join,
    })
}

/// How deep an expression tree is (a leaf is 1).
fn expr_depth(e: &Expr) -> usize {
    let mut deepest = 0;
    let _ = e.apply_children(|child| {
        deepest = deepest.max(expr_depth(child));
        Ok(TreeNodeRecursion::Continue)
    });
    deepest + 1
}

/// How deep a plan is, and its deepest expression.
fn plan_depth(plan: &LogicalPlan) -> (usize, usize) {
    let mut deepest_input = 0;
    let mut deepest_expr = 0;
    let _ = plan.apply_expressions(|e| {
        deepest_expr = deepest_expr.max(expr_depth(e));
        Ok(TreeNodeRecursion::Continue)
    });
    for input in plan.inputs() {
        let (p, e) = plan_depth(input);
        deepest_input = deepest_input.max(p);
        deepest_expr = deepest_expr.max(e);
    }
    (deepest_input + 1, deepest_expr)
}

/// Refuses plans deeper than the engine takes ([`FLOW_MAX_EXPRESSION_DEPTH`],
/// [`FLOW_MAX_PLAN_DEPTH`]), naming the limit.
fn check_depth(plan: &LogicalPlan) -> Result<(), CompileError> {
    let (plan_levels, expr_levels) = plan_depth(plan);
    if expr_levels > FLOW_MAX_EXPRESSION_DEPTH {
        return Err(CompileError(format!(
            "the query is {TOO_COMPLEX}: its expressions nest {expr_levels} levels deep (each \
             operator of a chain such as a + b + c or x AND y AND z is a level), and flows \
             accept at most {FLOW_MAX_EXPRESSION_DEPTH}; split the expression (e.g. use IN (...) \
             instead of a chain of ORs)"
        )));
    }
    if plan_levels > FLOW_MAX_PLAN_DEPTH {
        return Err(CompileError(format!(
            "the query is {TOO_COMPLEX}: its plan is {plan_levels} operators deep, and flows \
             accept at most {FLOW_MAX_PLAN_DEPTH}"
        )));
    }
    Ok(())
}

/// An interval literal in nanoseconds (days, hours, minutes, seconds; not
/// months, whose length varies).
fn interval_ns(v: &datafusion::common::ScalarValue) -> Option<i128> {
    use datafusion::common::ScalarValue;
    match v {
        ScalarValue::IntervalMonthDayNano(Some(i)) if i.months == 0 => {
            Some(i128::from(i.days) * 86_400_000_000_000 + i128::from(i.nanoseconds))
        }
        ScalarValue::IntervalDayTime(Some(i)) => {
            Some(i128::from(i.days) * 86_400_000_000_000 + i128::from(i.milliseconds) * 1_000_000)
        }
        _ => None,
    }
}

/// `date_trunc`'s granularities of a fixed length, in nanoseconds: the
/// multiples of these since the epoch are where a truncation lands (weeks
/// start on Mondays and months vary, so those are not here).
fn trunc_ns(granularity: &str) -> Option<i128> {
    Some(match granularity.to_ascii_lowercase().as_str() {
        "microsecond" => 1_000,
        "millisecond" => 1_000_000,
        "second" => 1_000_000_000,
        "minute" => 60_000_000_000,
        "hour" => 3_600_000_000_000,
        "day" => 86_400_000_000_000,
        _ => return None,
    })
}

/// `now()`, `now() ± interval` (or `interval + now()`), and those of
/// `date_trunc('minute', now())` (a fixed-length granularity): the offset
/// from now() in nanoseconds and the truncation of now() (1: none), as
/// `trunc(now()) + offset`.
fn now_offset(e: &Expr) -> Option<(i128, i128)> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{BinaryExpr, Operator};
    match e {
        Expr::ScalarFunction(f) if f.func.name() == "now" && f.args.is_empty() => Some((0, 1)),
        Expr::ScalarFunction(f) if f.func.name() == "date_trunc" && f.args.len() == 2 => {
            let unit = match &f.args[0] {
                Expr::Literal(ScalarValue::Utf8(Some(g)), _)
                | Expr::Literal(ScalarValue::LargeUtf8(Some(g)), _)
                | Expr::Literal(ScalarValue::Utf8View(Some(g)), _) => trunc_ns(g)?,
                _ => return None,
            };
            // trunc(trunc(now) + o) is trunc(now) + o when o is a multiple
            // of the unit, and of the truncation before.
            let (offset, before) = now_offset(&f.args[1])?;
            (offset % unit == 0 && unit % before == 0).then_some((offset, unit))
        }
        Expr::Cast(c) => now_offset(&c.expr),
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let lit = |e: &Expr| match e {
                Expr::Literal(v, _) => interval_ns(v),
                _ => None,
            };
            match op {
                Operator::Plus => match (now_offset(left), lit(right)) {
                    (Some((a, u)), Some(b)) => Some((a + b, u)),
                    _ => match (lit(left), now_offset(right)) {
                        (Some(a), Some((b, u))) => Some((a + b, u)),
                        _ => None,
                    },
                },
                Operator::Minus => {
                    let (a, u) = now_offset(left)?;
                    Some((a - lit(right)?, u))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether `e` calls now() anywhere.
fn calls_now(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|x| {
        if matches!(x, Expr::ScalarFunction(f) if f.func.name() == "now") {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// One condition of a WHERE, with comparisons of a row's value with
/// `now() ± interval` written as [`FLOW_NOW_CMP`] calls.
fn temporal_conjunct(e: Expr) -> Vec<Expr> {
    use crate::sql::functions::FlowNowCmp;
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{expr::ScalarFunction, BinaryExpr, Operator};
    let cmp = |x: Expr, (off, trunc): (i128, i128), op: &str| -> Expr {
        let off = i64::try_from(off).unwrap_or(if off < 0 { i64::MIN } else { i64::MAX });
        // At most a day: it fits.
        let trunc = i64::try_from(trunc).unwrap_or(1);
        Expr::ScalarFunction(ScalarFunction::new_udf(
            FlowNowCmp::udf(),
            vec![
                x,
                Expr::Literal(ScalarValue::Int64(Some(off)), None),
                Expr::Literal(ScalarValue::Utf8(Some(op.to_string())), None),
                Expr::Literal(ScalarValue::Int64(Some(trunc)), None),
            ],
        ))
    };
    match e {
        Expr::Between(b)
            if !b.negated && !calls_now(&b.expr) && (calls_now(&b.low) || calls_now(&b.high)) =>
        {
            let low = Expr::BinaryExpr(BinaryExpr::new(b.expr.clone(), Operator::GtEq, b.low));
            let high = Expr::BinaryExpr(BinaryExpr::new(b.expr, Operator::LtEq, b.high));
            let mut out = temporal_conjunct(low);
            out.extend(temporal_conjunct(high));
            out
        }
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let name = |op: Operator, flip: bool| match (op, flip) {
                (Operator::Gt, false) | (Operator::Lt, true) => Some("gt"),
                (Operator::GtEq, false) | (Operator::LtEq, true) => Some("ge"),
                (Operator::Lt, false) | (Operator::Gt, true) => Some("lt"),
                (Operator::LtEq, false) | (Operator::GtEq, true) => Some("le"),
                _ => None,
            };
            if let (Some(off), false, Some(n)) =
                (now_offset(&right), calls_now(&left), name(op, false))
            {
                return vec![cmp(*left, off, n)];
            }
            if let (Some(off), false, Some(n)) =
                (now_offset(&left), calls_now(&right), name(op, true))
            {
                return vec![cmp(*right, off, n)];
            }
            vec![Expr::BinaryExpr(BinaryExpr { left, op, right })]
        }
        other => vec![other],
    }
}

/// Rewrites temporal filters (`WHERE ts > now() - INTERVAL '5 minutes'`,
/// also `>=`, `<`, `<=` and `BETWEEN`, now() on either side) for the engine,
/// which evaluates them at each tick's time. Any other use of now() is left
/// for [`check_deterministic`] to refuse.
fn temporal_filters(plan: LogicalPlan) -> Result<LogicalPlan, CompileError> {
    use datafusion::common::tree_node::Transformed;
    use datafusion::logical_expr::utils::{conjunction, split_conjunction_owned};
    use datafusion::logical_expr::Filter;
    plan.transform_up(|node| match node {
        LogicalPlan::Filter(f) if calls_now(&f.predicate) => {
            let parts: Vec<Expr> = split_conjunction_owned(f.predicate)
                .into_iter()
                .flat_map(temporal_conjunct)
                .collect();
            let predicate = conjunction(parts).unwrap_or(Expr::Literal(
                datafusion::common::ScalarValue::Boolean(Some(true)),
                None,
            ));
            Ok(Transformed::yes(LogicalPlan::Filter(Filter::try_new(
                predicate, f.input,
            )?)))
        }
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
    .map_err(|e| CompileError(format!("cannot plan the flow's temporal filter: {e}")))
}

/// Refuses functions whose value is not fixed by their arguments (now(),
/// current_date, random(), ...). DataFusion would fold now() into the time the
/// flow was planned, so the flow would compute with a frozen clock (another
/// one after each restart), and the guest never reads a clock.
fn check_deterministic(plan: &LogicalPlan) -> Result<(), CompileError> {
    let mut found: Option<String> = None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if f.func.signature().volatility != Volatility::Immutable
                        && f.func.name() != crate::sql::functions::FLOW_NOW_CMP
                    {
                        found = Some(f.func.name().to_string());
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })
    .map_err(|e| CompileError(e.to_string()))?;
    match found {
        Some(name) if name == "now" => Err(CompileError(
            "unsupported: now() is not supported in flows except in a WHERE condition that compares a \
             row's time with now() or now() plus or minus an interval (e.g. WHERE ts > now() - \
             INTERVAL '5 minutes', or BETWEEN), also truncated to a second, minute, hour or day \
             (date_trunc('minute', now())): the flow keeps each row in its result while the \
             condition holds at the tick time; other uses would freeze the time the flow was \
             planned"
                .into(),
        )),
        Some(name) => Err(CompileError(format!(
            "unsupported: function {name}() is not supported in flows: its value depends on \
             when the query runs, and a flow's result may depend only on its sources' rows \
             (to drop old windows, use EXPIRE AFTER)"
        ))),
        None => Ok(()),
    }
}

/// Every table the plan scans, first appearance first.
fn sources_of(plan: &LogicalPlan) -> Result<Vec<FlowSource>, CompileError> {
    let mut sources: Vec<FlowSource> = Vec::new();
    let mut failure = None;
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            if !sources.iter().any(|s| s.table == scan.table_name) {
                let schema = scan.source.schema();
                match fields_from_arrow(&schema) {
                    Ok(fields) => sources.push(FlowSource {
                        table: scan.table_name.clone(),
                        schema: SourceSchema {
                            name: scan.table_name.table().to_string(),
                            fields,
                        },
                    }),
                    Err(e) => {
                        failure = Some(CompileError(format!("table {}: {e}", scan.table_name)));
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
            }
        }
        // Subqueries are plans inside expressions; visit them too.
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| CompileError(e.to_string()))?;
    match failure {
        Some(e) => Err(e),
        None => Ok(sources),
    }
}

/// Output columns that are plain references to GROUP BY keys of the topmost
/// aggregate (through projections, filters and sorts above it).
fn group_keys_of(plan: &LogicalPlan) -> (bool, Vec<String>) {
    // Names (qualified) of the columns, at the current node, that carry a group key.
    fn walk(plan: &LogicalPlan) -> Option<Vec<datafusion::common::Column>> {
        match plan {
            LogicalPlan::Aggregate(agg) => {
                let n = agg.group_expr.len();
                Some(agg.schema.columns().into_iter().take(n).collect())
            }
            LogicalPlan::Projection(p) => {
                let below = walk(&p.input)?;
                let out = p.schema.columns();
                Some(
                    p.expr
                        .iter()
                        .zip(out)
                        .filter_map(|(e, out_col)| {
                            let inner = match e {
                                Expr::Alias(a) => a.expr.as_ref(),
                                other => other,
                            };
                            match inner {
                                Expr::Column(c) if below.contains(c) => Some(out_col),
                                _ => None,
                            }
                        })
                        .collect(),
                )
            }
            LogicalPlan::Filter(f) => walk(&f.input),
            LogicalPlan::Sort(s) => walk(&s.input),
            LogicalPlan::Limit(l) => walk(&l.input),
            LogicalPlan::SubqueryAlias(s) => {
                let below = walk(&s.input)?;
                let names: Vec<String> = below.iter().map(|c| c.name.clone()).collect();
                Some(
                    s.schema
                        .columns()
                        .into_iter()
                        .filter(|c| names.contains(&c.name))
                        .collect(),
                )
            }
            _ => None,
        }
    }
    match walk(plan) {
        Some(cols) => {
            let keys = plan
                .schema()
                .columns()
                .into_iter()
                .filter(|c| cols.contains(c))
                .map(|c| c.name)
                .collect();
            (true, keys)
        }
        None => (false, Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType as A, Field as F, Schema, TimeUnit};
    use datafusion::datasource::MemTable;

    use super::*;
    use crate::runtime::DataType;

    fn ctx() -> SessionContext {
        let ctx = SessionContext::new();
        let schema = Arc::new(Schema::new(vec![
            F::new("host", A::Utf8, true),
            F::new("status", A::Int32, true),
            F::new("bytes", A::Float64, true),
            F::new("ts", A::Timestamp(TimeUnit::Millisecond, None), false),
        ]));
        ctx.register_table(
            "requests",
            Arc::new(MemTable::try_new(schema, vec![vec![]]).unwrap()),
        )
        .unwrap();
        ctx
    }

    #[tokio::test]
    async fn group_keys_sources_and_output_columns() {
        let ctx = ctx();
        let f = compile(
            &ctx,
            "SELECT status, count(*) AS hits, sum(bytes), date_bin(INTERVAL '1 minute', ts) AS minute \
             FROM requests GROUP BY status, minute",
        )
        .await
        .unwrap();
        assert!(f.aggregates);
        assert_eq!(
            f.group_keys,
            vec!["status".to_string(), "minute".to_string()]
        );
        let names: Vec<_> = f.output.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["status", "hits", "sum(requests.bytes)", "minute"]
        );
        assert_eq!(f.output[3].data_type, DataType::TimestampMillisecond);
        assert_eq!(f.sources.len(), 1);
        assert_eq!(f.sources[0].schema.name, "requests");
        assert_eq!(
            f.sources[0].schema.fields.len(),
            4,
            "sources carry the full table schema"
        );
        assert!(!f.plan.is_empty());
    }

    #[tokio::test]
    async fn filter_only_queries_have_no_group_keys() {
        let f = compile(
            &ctx(),
            "SELECT host, bytes * 2 AS b2 FROM requests WHERE status >= 500",
        )
        .await
        .unwrap();
        assert!(!f.aggregates);
        assert!(f.group_keys.is_empty());
    }

    #[tokio::test]
    async fn planning_errors_are_reported() {
        let e = compile(&ctx(), "SELECT nope FROM requests")
            .await
            .unwrap_err();
        assert!(e.0.contains("cannot plan"), "{e}");
        let e = compile(&ctx(), "SELECT 1").await.unwrap_err();
        assert!(e.0.contains("at least one table"), "{e}");
    }

    #[tokio::test]
    async fn functions_of_the_clock_or_chance_are_refused() {
        for (sql, name) in [
            ("SELECT host, now() AS n FROM requests", "now()"),
            (
                "SELECT host FROM requests WHERE ts > now() - INTERVAL '1 hour' OR bytes > 1",
                "now()",
            ),
            (
                "SELECT host, count(*) FROM requests WHERE ts > current_date() GROUP BY host",
                "current_date()",
            ),
            ("SELECT host, random() AS r FROM requests", "random()"),
            (
                "SELECT host, count(*) FROM requests GROUP BY host HAVING max(bytes) > random()",
                "random()",
            ),
        ] {
            let e = compile(&ctx(), sql).await.unwrap_err();
            assert!(
                e.0.contains(name) && e.0.contains("not supported in flows"),
                "{sql}: {e}"
            );
        }
        // A temporal filter compiles: its comparison with now() is written
        // for the engine, which evaluates it at the tick time.
        let c = compile(
            &ctx(),
            "SELECT host FROM requests WHERE ts > now() - INTERVAL '1 hour' AND ts <= now()",
        )
        .await
        .unwrap();
        let plan = String::from_utf8_lossy(&c.plan).into_owned();
        assert!(plan.contains(crate::sql::functions::FLOW_NOW_CMP), "{plan}");
        // Immutable functions of the row still compile.
        compile(
            &ctx(),
            "SELECT host, abs(bytes) AS a, date_trunc('hour', ts) AS h FROM requests",
        )
        .await
        .unwrap();
    }
}
