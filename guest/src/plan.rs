//! Lowering of a Substrait plan to the engine's operator plan.

use crate::hash::FxHashMap;

use prost::Message;
use substrait::proto::aggregate_function::AggregationInvocation;
use substrait::proto::expression::field_reference::{ReferenceType, RootType};
use substrait::proto::expression::literal::LiteralType;
use substrait::proto::expression::reference_segment;
use substrait::proto::expression::RexType;
use substrait::proto::extensions::simple_extension_declaration::MappingType;
use substrait::proto::function_argument::ArgType;
use substrait::proto::read_rel::ReadType;
use substrait::proto::rel::RelType;
use substrait::proto::rel_common::EmitKind;
use substrait::proto::{plan_rel, r#type, Expression, Plan, Rel, RelCommon, Type};

use crate::expr::{cast_supported, Arith, Cmp, Expr, Func, Lit, Pattern, TruncUnit};
use crate::types::{bad, unsupported, DataType, Field, FlowError, SourceSchema};

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum AggKind {
    CountStar,
    Count,
    CountDistinct,
    Sum,
    Avg,
    Min,
    Max,
    /// A sketch function's state over the argument's current values.
    Sketch(SketchKind),
    /// A statistic of the argument's current values (see [`StatKind`]).
    Stat(StatKind),
}

/// Aggregates computed from the exact multiset of current inputs, so that
/// deletes and upserts are exact: the value after any changes is what
/// DataFusion computes over the current rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum StatKind {
    /// `var`, `var_samp`: sample variance (NULL below two values).
    VarSamp,
    /// `var_pop`: population variance.
    VarPop,
    /// `stddev`, `stddev_samp`.
    StddevSamp,
    /// `stddev_pop`.
    StddevPop,
    /// `median`: the middle value, or the mean of the two middle ones (in
    /// the argument's type: integers truncate, as DataFusion's).
    Median,
    /// `bool_and`: every value true.
    BoolAnd,
    /// `bool_or`: some value true.
    BoolOr,
    /// `first_value(v ORDER BY k)` and `last_value`: the value of the row at
    /// one end of the order (the argument is `Func::OrderedPair`; `max`: the
    /// largest pair), of type `ty`.
    FirstValue { max: bool, ty: DataType },
    /// `string_agg(v, delimiter ORDER BY k)`: the non-NULL values in that
    /// order (`reverse`: descending), each as often as it occurs, joined by
    /// the measure's `param`.
    StringAgg { reverse: bool },
    /// `array_agg(v ORDER BY k)`: every value of type `ty`, NULLs included,
    /// in that order (`reverse`: descending), as a list. Without an ORDER
    /// BY, and with DISTINCT (each value once), ordered by the value itself
    /// (`by_value`), NULLs first or last as `nulls_first` says.
    ArrayAgg {
        reverse: bool,
        distinct: bool,
        by_value: bool,
        nulls_first: bool,
        ty: DataType,
    },
}

/// GreptimeDB's sketch aggregates (see `sketch.rs`): their state is computed
/// from the exact multiset of current inputs, so deletes are exact.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum SketchKind {
    /// `hll(x)`.
    Hll,
    /// `hll_merge(state)`.
    HllMerge,
    /// `uddsketch_state(max_buckets, error_rate, x)`.
    Udd { max_buckets: i64, error_rate: f64 },
    /// `uddsketch_merge(max_buckets, error_rate, state)`.
    UddMerge { max_buckets: i64, error_rate: f64 },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MeasureSpec {
    pub kind: AggKind,
    pub arg: Option<Expr>,
    pub filter: Option<Expr>,
    pub out: DataType,
    /// A constant the aggregate takes besides its input: string_agg's
    /// delimiter (empty for the others).
    pub param: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AggSpec {
    pub keys: Vec<Expr>,
    /// Whether each key can be NULL.
    pub key_nullable: Vec<bool>,
    pub measures: Vec<MeasureSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OpSpec {
    Filter(Expr),
    Project(Vec<Expr>),
    Aggregate(AggSpec),
    /// `hop(ts, slide, size)` in a GROUP BY: each row becomes one row per
    /// window `[start, start + size)` that holds `ts`, starts being
    /// multiples of `slide`; the window's start is appended as a column.
    Hop(HopSpec),
    /// Conditions on now(), the tick time (`temporal.rs`).
    Temporal(Vec<crate::temporal::Bound>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HopSpec {
    pub ts: Expr,
    pub slide_ns: i64,
    pub size_ns: i64,
    /// The type of the appended start column (the timestamp's).
    pub out: DataType,
}

/// The lowered plan: a tree of stages. Each stage takes its rows from one
/// input (a source, a join of two earlier stages, or a union of earlier
/// stages) and runs them through a chain of operators. A stage's inputs
/// always come before it; the last stage is the flow's output.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Lowered {
    pub stages: Vec<StageSpec>,
    pub output: Vec<Field>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StageSpec {
    pub input: Input,
    pub ops: Vec<OpSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Input {
    /// The rows pushed for source `n`.
    Source(usize),
    /// The join of two earlier stages' outputs.
    Join(JoinSpec),
    /// The rows of several earlier stages (UNION ALL).
    Union(Vec<usize>),
}

/// Which rows a join emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinKind {
    Inner,
    Left,
    Right,
    Full,
    LeftSemi,
    LeftAnti,
    RightSemi,
    RightAnti,
}

/// An equi-join of stages `left` and `right`: rows match when every key of
/// the left row equals the same key of the right row (NULL never equals
/// anything unless that key is `null_eq`, IS NOT DISTINCT FROM) and the
/// residual condition, over the left row's columns then the right row's,
/// is true.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JoinSpec {
    pub left: usize,
    pub right: usize,
    pub kind: JoinKind,
    /// Over the left stage's columns.
    pub left_keys: Vec<Expr>,
    /// Over the right stage's columns.
    pub right_keys: Vec<Expr>,
    pub null_eq: Vec<bool>,
    pub residual: Option<Expr>,
    /// Both inputs are the same sub-plan (e.g. a table joined with itself, with the same
    /// projections and filters): they carry the same rows at every tick.
    pub same_inputs: bool,
}

/// A column of an intermediate schema: type and nullability.
type Schema = Vec<(DataType, bool)>;

struct Ctx<'a> {
    funcs: FxHashMap<u32, String>,
    sources: &'a [SourceSchema],
    /// The input of the stage being lowered, once its leaf is reached.
    input: Option<Input>,
    /// Finished stages.
    stages: Vec<StageSpec>,
}

pub(crate) fn lower(plan_bytes: &[u8], sources: &[SourceSchema]) -> Result<Lowered, FlowError> {
    if let Err(depth) = crate::wire::nesting(plan_bytes, crate::wire::MAX_PLAN_NESTING) {
        return Err(FlowError::LimitExceeded(format!(
            "the plan's messages nest at least {depth} levels deep; the engine decodes at most {} \
             (simplify the query's expressions)",
            crate::wire::MAX_PLAN_NESTING
        )));
    }
    let plan =
        Plan::decode(plan_bytes).map_err(|e| bad(format!("plan is not a Substrait plan: {e}")))?;
    let mut funcs = FxHashMap::default();
    for ext in &plan.extensions {
        if let Some(MappingType::ExtensionFunction(f)) = &ext.mapping_type {
            let name = f.name.split(':').next().unwrap_or("").to_ascii_lowercase();
            funcs.insert(f.function_anchor, name);
        }
    }
    if plan.relations.len() != 1 {
        return Err(bad(format!(
            "plan must have exactly one relation, has {}",
            plan.relations.len()
        )));
    }
    let (rel, names) = match plan.relations.first().and_then(|r| r.rel_type.as_ref()) {
        Some(plan_rel::RelType::Root(root)) => (root.input.as_ref(), root.names.clone()),
        Some(plan_rel::RelType::Rel(rel)) => (Some(rel), Vec::new()),
        None => (None, Vec::new()),
    };
    let rel = rel.ok_or_else(|| bad("plan has no root relation"))?;
    let mut ctx = Ctx {
        funcs,
        sources,
        input: None,
        stages: Vec::new(),
    };
    let mut ops = Vec::new();
    let schema = lower_rel(rel, &mut ctx, &mut ops)?;
    let input = ctx.input.take().ok_or_else(|| bad("plan reads no table"))?;
    let mut stages = ctx.stages;
    stages.push(StageSpec { input, ops });
    let output = schema
        .iter()
        .enumerate()
        .map(|(i, (t, n))| Field {
            name: names
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("column{i}")),
            data_type: *t,
            nullable: *n,
        })
        .collect();
    Ok(Lowered { stages, output })
}

/// Lowers `rel` as a stage of its own and returns its index and schema.
fn lower_stage(rel: &Rel, ctx: &mut Ctx<'_>) -> Result<(usize, Schema), FlowError> {
    let outer = ctx.input.take();
    let mut ops = Vec::new();
    let schema = lower_rel(rel, ctx, &mut ops)?;
    let input = ctx
        .input
        .take()
        .ok_or_else(|| bad("a join or union input reads no table"))?;
    ctx.input = outer;
    ctx.stages.push(StageSpec { input, ops });
    Ok((ctx.stages.len() - 1, schema))
}

/// The columns an expression reads.
fn columns_of(e: &Expr, out: &mut Vec<usize>) {
    match e {
        Expr::Col(i, _) => out.push(*i),
        Expr::Lit(..) => {}
        Expr::Call(_, args, _) => args.iter().for_each(|a| columns_of(a, out)),
        Expr::Cast(x, _) => columns_of(x, out),
        Expr::Case(whens, els, _) => {
            for (w, t) in whens {
                columns_of(w, out);
                columns_of(t, out);
            }
            if let Some(x) = els {
                columns_of(x, out);
            }
        }
        Expr::InList(x, list) => {
            columns_of(x, out);
            list.iter().for_each(|a| columns_of(a, out));
        }
    }
}

/// `e` with every column reference `i` replaced by `i - by`.
fn shift_columns(e: &Expr, by: usize) -> Expr {
    let s = |x: &Expr| shift_columns(x, by);
    match e {
        Expr::Col(i, t) => Expr::Col(i.saturating_sub(by), *t),
        Expr::Lit(..) => e.clone(),
        Expr::Call(f, args, t) => Expr::Call(f.clone(), args.iter().map(s).collect(), *t),
        Expr::Cast(x, t) => Expr::Cast(Box::new(s(x)), *t),
        Expr::Case(whens, els, t) => Expr::Case(
            whens.iter().map(|(w, v)| (s(w), s(v))).collect(),
            els.as_ref().map(|x| Box::new(s(x))),
            *t,
        ),
        Expr::InList(x, list) => Expr::InList(Box::new(s(x)), list.iter().map(s).collect()),
    }
}

/// The conjuncts of a condition (`a AND b AND c` → a, b, c).
fn conjuncts(e: Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::Call(Func::And, args, _) => args.into_iter().for_each(|a| conjuncts(a, out)),
        other => out.push(other),
    }
}

/// Whether `e` holds a comparison with now() anywhere.
fn has_now(e: &Expr) -> bool {
    match e {
        Expr::Call(Func::NowCmp { .. }, _, _) => true,
        Expr::Col(..) | Expr::Lit(..) => false,
        Expr::Call(_, args, _) => args.iter().any(has_now),
        Expr::Cast(x, _) => has_now(x),
        Expr::Case(whens, els, _) => {
            whens.iter().any(|(w, t)| has_now(w) || has_now(t))
                || els.as_deref().is_some_and(has_now)
        }
        Expr::InList(x, list) => has_now(x) || list.iter().any(has_now),
    }
}

/// Appends a WHERE condition: its comparisons with now() become the
/// temporal operator, after a filter of the other conditions.
fn push_filter(e: Expr, ops: &mut Vec<OpSpec>) -> Result<(), FlowError> {
    let mut parts = Vec::new();
    conjuncts(e, &mut parts);
    let mut bounds = Vec::new();
    let mut rest = Vec::new();
    for p in parts {
        match p {
            Expr::Call(
                Func::NowCmp {
                    op,
                    offset_ns,
                    trunc_ns,
                },
                args,
                _,
            ) => {
                let x = args
                    .into_iter()
                    .next()
                    .ok_or_else(|| bad("a comparison with now() without its operand"))?;
                bounds.push(crate::temporal::Bound {
                    x,
                    op,
                    offset_ns,
                    trunc_ns,
                });
            }
            other if has_now(&other) => {
                return Err(unsupported(
                    "now() is not supported in flows except in a WHERE condition that compares a \
                     row's time with now() plus or minus an interval (e.g. ts > now() - \
                     INTERVAL '5 minutes'), joined to the others with AND, not inside OR, NOT \
                     or CASE",
                ))
            }
            other => rest.push(other),
        }
    }
    if let Some(r) = rest
        .into_iter()
        .reduce(|a, b| Expr::Call(Func::And, vec![a, b], DataType::Boolean))
    {
        ops.push(OpSpec::Filter(r));
    }
    if !bounds.is_empty() {
        ops.push(OpSpec::Temporal(bounds));
    }
    Ok(())
}

/// Lowers a join of two relations into a stage input.
fn lower_join(
    j: &substrait::proto::JoinRel,
    ctx: &mut Ctx<'_>,
    ops: &mut Vec<OpSpec>,
) -> Result<Schema, FlowError> {
    use substrait::proto::join_rel::JoinType;
    let kind = match JoinType::try_from(j.r#type).unwrap_or(JoinType::Unspecified) {
        JoinType::Inner => JoinKind::Inner,
        JoinType::Left => JoinKind::Left,
        JoinType::Right => JoinKind::Right,
        JoinType::Outer => JoinKind::Full,
        JoinType::LeftSemi => JoinKind::LeftSemi,
        JoinType::LeftAnti => JoinKind::LeftAnti,
        JoinType::RightSemi => JoinKind::RightSemi,
        JoinType::RightAnti => JoinKind::RightAnti,
        JoinType::LeftSingle | JoinType::RightSingle => {
            return Err(unsupported(
                "scalar subqueries that join (single joins) are not supported in flows",
            ))
        }
        JoinType::LeftMark | JoinType::RightMark => {
            return Err(unsupported(
                "IN / EXISTS subqueries inside OR or other expressions (mark joins) are not \
                 supported in flows; use them as a top-level condition of WHERE",
            ))
        }
        JoinType::Unspecified => return Err(bad("join without a type")),
    };
    let left_rel = j
        .left
        .as_ref()
        .ok_or_else(|| bad("join without a left input"))?;
    let right_rel = j
        .right
        .as_ref()
        .ok_or_else(|| bad("join without a right input"))?;
    let same_inputs = left_rel == right_rel;
    let (left, left_schema) = lower_stage(left_rel, ctx)?;
    let (right, right_schema) = lower_stage(right_rel, ctx)?;
    let nl = left_schema.len();
    let both: Schema = left_schema
        .iter()
        .chain(right_schema.iter())
        .copied()
        .collect();
    let no_equality = || {
        unsupported(
            "a join without an equality between a column of each side (a cross join, or a \
             join ON only inequalities) is not supported in flows: every change would be \
             compared with every row of the other side; join ON an equality such as a.k = b.k",
        )
    };
    let cond = match &j.expression {
        Some(e) => lower_expr(e, &both, ctx)?.0,
        None => return Err(no_equality()),
    };
    let mut parts = Vec::new();
    conjuncts(cond, &mut parts);
    let mut left_keys = Vec::new();
    let mut right_keys = Vec::new();
    let mut null_eq = Vec::new();
    let mut residual: Vec<Expr> = Vec::new();
    for p in parts {
        let side = |e: &Expr| {
            let mut cols = Vec::new();
            columns_of(e, &mut cols);
            if cols.is_empty() {
                None
            } else if cols.iter().all(|c| *c < nl) {
                Some(true)
            } else if cols.iter().all(|c| *c >= nl) {
                Some(false)
            } else {
                None
            }
        };
        if let Expr::Call(Func::Cmp(op @ (Cmp::Eq | Cmp::NotDistinct)), args, _) = &p {
            if let [a, b] = args.as_slice() {
                let pair = match (side(a), side(b)) {
                    (Some(true), Some(false)) => Some((a, b)),
                    (Some(false), Some(true)) => Some((b, a)),
                    _ => None,
                };
                if let Some((l, r)) = pair {
                    if l.ty().storage() == r.ty().storage()
                        && l.ty().is_float() == r.ty().is_float()
                        && l.ty().is_unsigned_int() == r.ty().is_unsigned_int()
                    {
                        left_keys.push(l.clone());
                        right_keys.push(shift_columns(r, nl));
                        null_eq.push(*op == Cmp::NotDistinct);
                        continue;
                    }
                }
            }
        }
        residual.push(p);
    }
    if left_keys.is_empty() {
        return Err(no_equality());
    }
    let residual = residual
        .into_iter()
        .reduce(|a, b| Expr::Call(Func::And, vec![a, b], DataType::Boolean));
    if let Some(r) = &residual {
        if r.ty() != DataType::Boolean {
            return Err(bad("join condition is not boolean"));
        }
    }
    let nullable = |s: &Schema| -> Schema { s.iter().map(|(t, _)| (*t, true)).collect() };
    let mut schema: Schema = match kind {
        JoinKind::Inner => both,
        JoinKind::Left => left_schema
            .iter()
            .copied()
            .chain(nullable(&right_schema))
            .collect(),
        JoinKind::Right => nullable(&left_schema)
            .into_iter()
            .chain(right_schema.iter().copied())
            .collect(),
        JoinKind::Full => nullable(&left_schema)
            .into_iter()
            .chain(nullable(&right_schema))
            .collect(),
        JoinKind::LeftSemi | JoinKind::LeftAnti => left_schema,
        JoinKind::RightSemi | JoinKind::RightAnti => right_schema,
    };
    ctx.input = Some(Input::Join(JoinSpec {
        left,
        right,
        kind,
        left_keys,
        right_keys,
        null_eq,
        residual,
        same_inputs,
    }));
    if let Some(f) = &j.post_join_filter {
        if kind != JoinKind::Inner {
            return Err(unsupported(
                "a filter after an outer, semi or anti join is not supported in flows",
            ));
        }
        let (e, _) = lower_expr(f, &schema, ctx)?;
        ops.push(OpSpec::Filter(e));
    }
    schema = apply_emit(&j.common, schema, ops)?;
    Ok(schema)
}

/// Lowers UNION ALL of relations into a stage input.
fn lower_union(
    set: &substrait::proto::SetRel,
    ctx: &mut Ctx<'_>,
    ops: &mut Vec<OpSpec>,
) -> Result<Schema, FlowError> {
    use substrait::proto::set_rel::SetOp;
    match SetOp::try_from(set.op).unwrap_or(SetOp::Unspecified) {
        SetOp::UnionAll => {}
        SetOp::UnionDistinct => {
            return Err(unsupported(
                "UNION (DISTINCT) is not supported in flows as a set operation; use UNION ALL \
                 (with SELECT DISTINCT around it if rows must be distinct)",
            ))
        }
        _ => {
            return Err(unsupported(
                "INTERSECT and EXCEPT are not supported in flows; UNION ALL is",
            ))
        }
    }
    let mut ids = Vec::new();
    let mut schema: Option<Schema> = None;
    for input in &set.inputs {
        let (id, s) = lower_stage(input, ctx)?;
        ids.push(id);
        schema = Some(match schema {
            None => s,
            Some(prev) => {
                if prev.len() != s.len() || prev.iter().zip(&s).any(|(a, b)| a.0 != b.0) {
                    return Err(unsupported(
                        "UNION ALL of inputs with different column types is not supported in \
                         flows; cast the columns to the same types",
                    ));
                }
                prev.iter()
                    .zip(&s)
                    .map(|(a, b)| (a.0, a.1 || b.1))
                    .collect()
            }
        });
    }
    let schema = schema.ok_or_else(|| bad("UNION ALL without inputs"))?;
    ctx.input = Some(Input::Union(ids));
    apply_emit(&set.common, schema, ops)
}

fn apply_emit(
    common: &Option<RelCommon>,
    schema: Schema,
    ops: &mut Vec<OpSpec>,
) -> Result<Schema, FlowError> {
    let Some(EmitKind::Emit(emit)) = common.as_ref().and_then(|c| c.emit_kind.as_ref()) else {
        return Ok(schema);
    };
    let identity = emit.output_mapping.len() == schema.len()
        && emit
            .output_mapping
            .iter()
            .enumerate()
            .all(|(i, m)| *m as usize == i);
    if identity {
        return Ok(schema);
    }
    let mut exprs = Vec::new();
    let mut out = Vec::new();
    for &m in &emit.output_mapping {
        let col = usize::try_from(m)
            .ok()
            .and_then(|i| schema.get(i).map(|c| (i, *c)))
            .ok_or_else(|| bad(format!("emit mapping {m} is out of range")))?;
        exprs.push(Expr::Col(col.0, col.1 .0));
        out.push(col.1);
    }
    push_project(ops, exprs);
    Ok(out)
}

/// Appends a projection, fusing it into a preceding projection when possible.
fn push_project(ops: &mut Vec<OpSpec>, exprs: Vec<Expr>) {
    if let Some(OpSpec::Project(prev)) = ops.last() {
        if exprs.iter().all(|e| matches!(e, Expr::Col(..))) {
            let fused: Option<Vec<Expr>> = exprs
                .iter()
                .map(|e| match e {
                    Expr::Col(i, _) => prev.get(*i).cloned(),
                    _ => None,
                })
                .collect();
            if let Some(fused) = fused {
                if let Some(last) = ops.last_mut() {
                    *last = OpSpec::Project(fused);
                }
                return;
            }
        }
    }
    ops.push(OpSpec::Project(exprs));
}

fn lower_rel(rel: &Rel, ctx: &mut Ctx<'_>, ops: &mut Vec<OpSpec>) -> Result<Schema, FlowError> {
    let rt = rel
        .rel_type
        .as_ref()
        .ok_or_else(|| bad("relation without a type"))?;
    match rt {
        RelType::Read(read) => {
            if ctx.input.is_some() {
                return Err(bad("a relation reads two inputs without a join"));
            }
            let names = match &read.read_type {
                Some(ReadType::NamedTable(t)) => &t.names,
                Some(ReadType::VirtualTable(_)) => {
                    return Err(unsupported(
                        "VALUES / virtual tables are not supported in flows",
                    ))
                }
                _ => return Err(unsupported("only named tables can be read in flows")),
            };
            let table = names
                .last()
                .ok_or_else(|| bad("read of a table without a name"))?;
            let (si, src) = ctx
                .sources
                .iter()
                .enumerate()
                .find(|(_, s)| s.name.rsplit('.').next() == Some(table.as_str()))
                .or_else(|| {
                    ctx.sources.iter().enumerate().find(|(_, s)| {
                        s.name
                            .rsplit('.')
                            .next()
                            .is_some_and(|n| n.eq_ignore_ascii_case(table))
                    })
                })
                .ok_or_else(|| bad(format!("plan reads table {table}, which is not a source")))?;
            ctx.input = Some(Input::Source(si));
            // Map the plan's base schema onto the source's columns by name.
            let base_names: Vec<String> = read
                .base_schema
                .as_ref()
                .map(|b| b.names.clone())
                .unwrap_or_default();
            let mut schema: Schema = src
                .fields
                .iter()
                .map(|f| (f.data_type, f.nullable))
                .collect();
            if !base_names.is_empty() {
                let mut exprs = Vec::new();
                let mut mapped = Vec::new();
                for n in &base_names {
                    let idx = src
                        .fields
                        .iter()
                        .position(|f| &f.name == n)
                        .or_else(|| {
                            src.fields
                                .iter()
                                .position(|f| f.name.eq_ignore_ascii_case(n))
                        })
                        .ok_or_else(|| {
                            bad(format!(
                                "table {table} has no column {n} in the source schema"
                            ))
                        })?;
                    let f = &src.fields[idx.min(src.fields.len().saturating_sub(1))];
                    exprs.push(Expr::Col(idx, f.data_type));
                    mapped.push((f.data_type, f.nullable));
                }
                let identity = exprs.len() == schema.len()
                    && exprs
                        .iter()
                        .enumerate()
                        .all(|(i, e)| matches!(e, Expr::Col(j, _) if *j == i));
                if !identity {
                    push_project(ops, exprs);
                }
                schema = mapped;
            }
            for f in [&read.filter, &read.best_effort_filter]
                .into_iter()
                .flatten()
            {
                let (e, _) = lower_expr(f, &schema, ctx)?;
                push_filter(e, ops)?;
            }
            if let Some(sel) = read.projection.as_ref().and_then(|p| p.select.as_ref()) {
                let mut exprs = Vec::new();
                let mut out = Vec::new();
                for item in &sel.struct_items {
                    let c = usize::try_from(item.field)
                        .ok()
                        .and_then(|i| schema.get(i).map(|c| (i, *c)))
                        .ok_or_else(|| bad("read projection out of range"))?;
                    exprs.push(Expr::Col(c.0, c.1 .0));
                    out.push(c.1);
                }
                push_project(ops, exprs);
                schema = out;
            }
            apply_emit(&read.common, schema, ops)
        }
        RelType::Filter(f) => {
            let input = f
                .input
                .as_ref()
                .ok_or_else(|| bad("filter without input"))?;
            let schema = lower_rel(input, ctx, ops)?;
            let cond = f
                .condition
                .as_ref()
                .ok_or_else(|| bad("filter without condition"))?;
            let (e, _) = lower_expr(cond, &schema, ctx)?;
            push_filter(e, ops)?;
            apply_emit(&f.common, schema, ops)
        }
        RelType::Project(p) => {
            let input = p
                .input
                .as_ref()
                .ok_or_else(|| bad("project without input"))?;
            let mut schema = lower_rel(input, ctx, ops)?;
            let mut exprs: Vec<Expr> = schema
                .iter()
                .enumerate()
                .map(|(i, (t, _))| Expr::Col(i, *t))
                .collect();
            for e in &p.expressions {
                let (x, n) = lower_expr(e, &schema, ctx)?;
                schema.push((x.ty(), n));
                exprs.push(x);
            }
            // Resolve the emit mapping directly against the projection's expressions.
            if let Some(EmitKind::Emit(emit)) = p.common.as_ref().and_then(|c| c.emit_kind.as_ref())
            {
                let mut sel = Vec::new();
                let mut out = Vec::new();
                for &m in &emit.output_mapping {
                    let i = usize::try_from(m)
                        .ok()
                        .filter(|i| *i < exprs.len())
                        .ok_or_else(|| bad(format!("emit mapping {m} is out of range")))?;
                    sel.push(exprs[i].clone());
                    out.push(schema[i]);
                }
                push_project(ops, sel);
                return Ok(out);
            }
            push_project(ops, exprs);
            Ok(schema)
        }
        RelType::Aggregate(a) => {
            let input = a
                .input
                .as_ref()
                .ok_or_else(|| bad("aggregate without input"))?;
            let in_schema = lower_rel(input, ctx, ops)?;
            if ops.iter().any(|o| matches!(o, OpSpec::Aggregate(_))) {
                // Nested aggregation is maintained like any other operator chain.
            }
            if a.groupings.len() > 1 {
                return Err(unsupported(
                    "grouping sets / ROLLUP / CUBE are not supported in flows",
                ));
            }
            let mut key_exprs: Vec<&Expression> = Vec::new();
            if let Some(g) = a.groupings.first() {
                // Producers fill both the (deprecated) inline expressions and the references
                // into `grouping_expressions`; prefer the references.
                #[allow(deprecated)]
                if g.expression_references.is_empty() {
                    for e in &g.grouping_expressions {
                        key_exprs.push(e);
                    }
                }
                for r in &g.expression_references {
                    key_exprs.push(
                        a.grouping_expressions
                            .get(*r as usize)
                            .ok_or_else(|| bad("grouping expression reference out of range"))?,
                    );
                }
            }
            let mut schema = Vec::new();
            let mut keys = Vec::new();
            let mut key_nullable = Vec::new();
            let mut hop = None;
            for e in key_exprs {
                let (x, n) = match hop_spec(e, &in_schema, ctx)? {
                    Some(spec) => {
                        if hop.is_some() {
                            return Err(unsupported(
                                "a flow may group by one hop(...) window, not several",
                            ));
                        }
                        let col = Expr::Col(in_schema.len(), spec.out);
                        hop = Some(spec);
                        (col, false)
                    }
                    None => lower_expr(e, &in_schema, ctx)?,
                };
                schema.push((x.ty(), n));
                keys.push(x);
                key_nullable.push(n);
            }
            // The expansion comes right before the aggregate, which reads its
            // column after the input's.
            if let Some(spec) = hop {
                ops.push(OpSpec::Hop(spec));
            }
            let mut measures = Vec::new();
            for m in &a.measures {
                let f = m
                    .measure
                    .as_ref()
                    .ok_or_else(|| bad("aggregate measure without a function"))?;
                let name = ctx
                    .funcs
                    .get(&f.function_reference)
                    .cloned()
                    .ok_or_else(|| bad("aggregate function reference not declared"))?;
                let mut args: Vec<Expr> = Vec::new();
                for a in &f.arguments {
                    match &a.arg_type {
                        Some(ArgType::Value(v)) => args.push(lower_expr(v, &in_schema, ctx)?.0),
                        _ => return Err(unsupported(format!("non-value argument to {name}"))),
                    }
                }
                let distinct = f.invocation == AggregationInvocation::Distinct as i32;
                // The sketch functions take their parameters first, as literals.
                let sketch = sketch_kind(&name, &args)?;
                if sketch.is_some() {
                    args = args.split_off(args.len().saturating_sub(1));
                }
                let mut param = Vec::new();
                if name == "string_agg" {
                    // The delimiter: a constant, kept aside.
                    match args.pop() {
                        Some(Expr::Lit(Lit::Bytes(b), _)) if args.len() == 1 => param = b,
                        _ => {
                            return Err(unsupported(
                                "string_agg takes a value and a constant delimiter in flows, \
                                 e.g. string_agg(v, ',' ORDER BY ts)",
                            ))
                        }
                    }
                }
                let mut arg = args.first().cloned();
                let arg_ty = arg.as_ref().map(|a| a.ty());
                let mut ordered = None;
                if name == "array_agg" {
                    let (pair, kind) = array_agg(f, arg.take(), distinct, &in_schema, ctx)?;
                    arg = Some(pair);
                    ordered = Some(kind);
                }
                if matches!(name.as_str(), "first_value" | "last_value" | "string_agg") {
                    if distinct {
                        return Err(unsupported(format!(
                            "{name}(DISTINCT ...) is not supported in flows"
                        )));
                    }
                    let (pair, asc) = ordered_pair(&name, f, arg.take(), &in_schema, ctx)?;
                    let ty = arg_ty.unwrap_or(DataType::Utf8);
                    if name == "string_agg" && ty.storage() != crate::types::Storage::Bytes {
                        return Err(unsupported(format!(
                            "string_agg of {ty} is not supported in flows; cast it to a string"
                        )));
                    }
                    let first = name == "first_value";
                    arg = Some(pair);
                    ordered = Some(match name.as_str() {
                        "string_agg" => StatKind::StringAgg { reverse: !asc },
                        _ => StatKind::FirstValue {
                            max: asc != first,
                            ty,
                        },
                    });
                }
                let (kind, out, nullable) = match (name.as_str(), arg_ty) {
                    ("array_agg", Some(t)) => match (ordered, DataType::list_of(t)) {
                        (Some(kind), Some(list)) => (AggKind::Stat(kind), list, true),
                        _ => {
                            return Err(unsupported(format!(
                                "array_agg of {t} is not supported in flows: lists of lists \
                                 are not"
                            )))
                        }
                    },
                    (_, Some(t)) if ordered.is_some() => {
                        (AggKind::Stat(ordered.unwrap_or(StatKind::BoolOr)), t, true)
                    }
                    (_, Some(t)) if sketch.is_some() => {
                        let k = sketch.unwrap_or(SketchKind::Hll);
                        let merge = matches!(k, SketchKind::HllMerge | SketchKind::UddMerge { .. });
                        if merge && t != DataType::Binary {
                            return Err(unsupported(format!(
                                "{name} takes a BINARY state (of hll or uddsketch_state), not {t}"
                            )));
                        }
                        if matches!(k, SketchKind::Udd { .. }) && !t.is_numeric() {
                            return Err(unsupported(format!(
                                "uddsketch_state takes a number, not {t}"
                            )));
                        }
                        (AggKind::Sketch(k), DataType::Binary, false)
                    }
                    ("count", None) => (AggKind::CountStar, DataType::Int64, false),
                    ("count", Some(_)) if distinct => {
                        (AggKind::CountDistinct, DataType::Int64, false)
                    }
                    ("count", Some(_)) if matches!(&arg, Some(Expr::Lit(l, _)) if *l != Lit::Null) =>
                    {
                        // count(1): every row counts.
                        (AggKind::CountStar, DataType::Int64, false)
                    }
                    ("count", Some(_)) => (AggKind::Count, DataType::Int64, false),
                    ("sum" | "avg" | "mean", Some(_)) if distinct => {
                        return Err(unsupported(format!(
                            "{name}(DISTINCT ...) is not supported in flows"
                        )))
                    }
                    ("sum", Some(t)) if t.is_signed_int() => (AggKind::Sum, DataType::Int64, true),
                    ("sum", Some(t)) if t.is_unsigned_int() => {
                        (AggKind::Sum, DataType::UInt64, true)
                    }
                    ("sum", Some(t)) if t.is_float() => (AggKind::Sum, DataType::Float64, true),
                    ("avg" | "mean", Some(t)) if t.is_numeric() => {
                        (AggKind::Avg, DataType::Float64, true)
                    }
                    (
                        "var" | "var_samp" | "var_sample" | "var_pop" | "var_population" | "stddev"
                        | "stddev_samp" | "stddev_pop" | "median" | "bool_and" | "bool_or",
                        Some(_),
                    ) if distinct => {
                        return Err(unsupported(format!(
                            "{name}(DISTINCT ...) is not supported in flows"
                        )))
                    }
                    ("var" | "var_samp" | "var_sample", Some(t)) if t.is_numeric() => {
                        (AggKind::Stat(StatKind::VarSamp), DataType::Float64, true)
                    }
                    ("var_pop" | "var_population", Some(t)) if t.is_numeric() => {
                        (AggKind::Stat(StatKind::VarPop), DataType::Float64, true)
                    }
                    ("stddev" | "stddev_samp", Some(t)) if t.is_numeric() => {
                        (AggKind::Stat(StatKind::StddevSamp), DataType::Float64, true)
                    }
                    ("stddev_pop", Some(t)) if t.is_numeric() => {
                        (AggKind::Stat(StatKind::StddevPop), DataType::Float64, true)
                    }
                    ("median", Some(t)) if t.is_numeric() => {
                        (AggKind::Stat(StatKind::Median), t, true)
                    }
                    ("bool_and", Some(DataType::Boolean)) => {
                        (AggKind::Stat(StatKind::BoolAnd), DataType::Boolean, true)
                    }
                    ("bool_or", Some(DataType::Boolean)) => {
                        (AggKind::Stat(StatKind::BoolOr), DataType::Boolean, true)
                    }
                    ("min", Some(t)) => (AggKind::Min, t, true),
                    ("max", Some(t)) => (AggKind::Max, t, true),
                    ("sum" | "avg" | "mean", Some(t)) => {
                        return Err(unsupported(format!(
                            "{name} of {t} is not supported in flows"
                        )))
                    }
                    ("approx_distinct", _) => {
                        return Err(unsupported(
                            "approx_distinct is not supported in flows: DataFusion's estimate \
                             hashes values with foldhash, which computes differently on the \
                             64-bit host than in the 32-bit sandbox, so a flow could not give \
                             the query's estimate bit for bit; use count(DISTINCT x), which \
                             flows keep exactly, or hll(x) with hll_count (the same sketch in \
                             queries and flows)",
                        ))
                    }
                    (
                        "approx_percentile_cont"
                        | "approx_percentile_cont_with_weight"
                        | "approx_median",
                        _,
                    ) => {
                        return Err(unsupported(format!(
                            "{name} is not supported in flows: DataFusion's t-digest depends on \
                             the order and batching of the rows it sees, so no incremental \
                             result can equal it; use median(x) (exact) or uddsketch_state \
                             with uddsketch_calc (the same sketch in queries and flows)"
                        )))
                    }
                    _ => {
                        return Err(unsupported(format!(
                            "aggregate function {name} is not supported in flows"
                        )))
                    }
                };
                if args.len() > 1 {
                    return Err(unsupported(format!(
                        "aggregate function {name} with {} arguments is not supported in flows",
                        args.len()
                    )));
                }
                let filter = match &m.filter {
                    Some(e) => Some(lower_expr(e, &in_schema, ctx)?.0),
                    None => None,
                };
                schema.push((out, nullable));
                let arg = if kind == AggKind::CountStar {
                    None
                } else {
                    arg
                };
                measures.push(MeasureSpec {
                    kind,
                    arg,
                    filter,
                    out,
                    param,
                });
            }
            ops.push(OpSpec::Aggregate(AggSpec {
                keys,
                key_nullable,
                measures,
            }));
            apply_emit(&a.common, schema, ops)
        }
        RelType::Join(j) => lower_join(j, ctx, ops),
        RelType::Cross(_) | RelType::NestedLoopJoin(_) => Err(unsupported(
            "a join without an equality between a column of each side (a cross join) is not \
             supported in flows: every change would be compared with every row of the other \
             side; join ON an equality such as a.k = b.k",
        )),
        RelType::HashJoin(_) | RelType::MergeJoin(_) => Err(unsupported(
            "physical join relations are not supported in flows; send the logical plan",
        )),
        RelType::Window(_) => Err(unsupported("window functions are not supported in flows")),
        RelType::Sort(_) => Err(unsupported("ORDER BY is not supported in flows")),
        RelType::Fetch(_) => Err(unsupported("LIMIT / OFFSET is not supported in flows")),
        RelType::Set(set) => lower_union(set, ctx, ops),
        RelType::Reference(_) => Err(unsupported(
            "relation references are not supported in flows",
        )),
        _ => Err(unsupported("this relation type is not supported in flows")),
    }
}

fn nullable_of(t: &Type) -> Option<bool> {
    use r#type::Kind;
    let n = match t.kind.as_ref()? {
        Kind::Bool(x) => x.nullability,
        Kind::I8(x) => x.nullability,
        Kind::I16(x) => x.nullability,
        Kind::I32(x) => x.nullability,
        Kind::I64(x) => x.nullability,
        Kind::Fp32(x) => x.nullability,
        Kind::Fp64(x) => x.nullability,
        Kind::String(x) => x.nullability,
        Kind::Binary(x) => x.nullability,
        Kind::Date(x) => x.nullability,
        Kind::PrecisionTimestamp(x) => x.nullability,
        Kind::PrecisionTimestampTz(x) => x.nullability,
        _ => return None,
    };
    Some(n != r#type::Nullability::Required as i32)
}

pub(crate) fn map_type(t: &Type) -> Result<DataType, FlowError> {
    use r#type::Kind;
    let unsigned = |v: u32| v == 1;
    let kind = t.kind.as_ref().ok_or_else(|| bad("type without a kind"))?;
    let ts = |p: i32| match p {
        0 => Ok(DataType::TimestampSecond),
        3 => Ok(DataType::TimestampMillisecond),
        6 => Ok(DataType::TimestampMicrosecond),
        9 => Ok(DataType::TimestampNanosecond),
        p => Err(unsupported(format!(
            "timestamp precision {p} is not supported in flows"
        ))),
    };
    Ok(match kind {
        Kind::Bool(_) => DataType::Boolean,
        Kind::I8(x) if unsigned(x.type_variation_reference) => DataType::UInt8,
        Kind::I8(_) => DataType::Int8,
        Kind::I16(x) if unsigned(x.type_variation_reference) => DataType::UInt16,
        Kind::I16(_) => DataType::Int16,
        Kind::I32(x) if unsigned(x.type_variation_reference) => DataType::UInt32,
        Kind::I32(_) => DataType::Int32,
        Kind::I64(x) if unsigned(x.type_variation_reference) => DataType::UInt64,
        Kind::I64(_) => DataType::Int64,
        Kind::Fp32(_) => DataType::Float32,
        Kind::Fp64(_) => DataType::Float64,
        Kind::String(_) | Kind::Varchar(_) | Kind::FixedChar(_) => DataType::Utf8,
        Kind::Binary(_) | Kind::FixedBinary(_) => DataType::Binary,
        Kind::Date(x) if x.type_variation_reference == 0 => DataType::Date32,
        Kind::PrecisionTimestamp(x) => ts(x.precision)?,
        Kind::PrecisionTimestampTz(x) => ts(x.precision)?,
        #[allow(deprecated)]
        Kind::Timestamp(_) => DataType::TimestampMicrosecond,
        Kind::Decimal(_) => return Err(unsupported("decimal types are not supported in flows")),
        Kind::IntervalDay(_) | Kind::IntervalYear(_) | Kind::IntervalCompound(_) => {
            return Err(unsupported(
                "interval values are not supported in flows (only as date_bin strides)",
            ))
        }
        _ => {
            return Err(unsupported(format!(
                "type {kind:?} is not supported in flows"
            )))
        }
    })
}

/// `first_value(v ORDER BY k)`, `last_value`, `string_agg`: the argument
/// that pairs each row's sort key with its value, and whether the order is
/// ascending.
fn ordered_pair(
    name: &str,
    f: &substrait::proto::AggregateFunction,
    value: Option<Expr>,
    schema: &Schema,
    ctx: &Ctx<'_>,
) -> Result<(Expr, bool), FlowError> {
    let value = value.ok_or_else(|| unsupported(format!("{name} needs an argument")))?;
    let [sort] = f.sorts.as_slice() else {
        return Err(unsupported(format!(
            "{name} needs exactly one ORDER BY key inside the call in flows, e.g. \
             {name}(v ORDER BY ts): without one its row is not defined"
        )));
    };
    let key = sort
        .expr
        .as_ref()
        .ok_or_else(|| bad(format!("{name}'s ORDER BY without an expression")))?;
    let (key, _) = lower_expr(key, schema, ctx)?;
    if key.ty().storage() == crate::types::Storage::Bytes {
        return Err(unsupported(format!(
            "{name} ORDER BY a {} key is not supported in flows; order by a number or a \
             timestamp",
            key.ty()
        )));
    }
    let (asc, nulls_first) = sort_direction(sort);
    let pair = Expr::Call(
        Func::OrderedPair {
            // In ascending byte order, NULL keys sit low exactly when they
            // come first in an ascending order or last in a descending one.
            nulls_low: asc == nulls_first,
        },
        vec![key, value],
        DataType::Binary,
    );
    Ok((pair, asc))
}

/// An ORDER BY key's (ascending, NULLs first); ASC NULLS LAST unless it
/// says otherwise.
fn sort_direction(sort: &substrait::proto::SortField) -> (bool, bool) {
    use substrait::proto::sort_field::{SortDirection, SortKind};
    let direction = match sort.sort_kind {
        Some(SortKind::Direction(d)) => {
            SortDirection::try_from(d).unwrap_or(SortDirection::AscNullsLast)
        }
        _ => SortDirection::AscNullsLast,
    };
    match direction {
        SortDirection::AscNullsFirst => (true, true),
        SortDirection::DescNullsFirst => (false, true),
        SortDirection::DescNullsLast => (false, false),
        _ => (true, false),
    }
}

/// `array_agg(v [ORDER BY k])`, `array_agg(DISTINCT v)`: the argument that
/// pairs each row's sort key (a constant when the values order themselves)
/// with its value, and the statistic's kind.
fn array_agg(
    f: &substrait::proto::AggregateFunction,
    value: Option<Expr>,
    distinct: bool,
    schema: &Schema,
    ctx: &Ctx<'_>,
) -> Result<(Expr, StatKind), FlowError> {
    let value = value.ok_or_else(|| unsupported("array_agg needs an argument"))?;
    let ty = value.ty();
    if ty.item().is_some() {
        return Err(unsupported(format!(
            "array_agg of {ty} is not supported in flows: lists of lists are not"
        )));
    }
    if !(distinct || f.sorts.is_empty()) {
        let (pair, asc) = ordered_pair("array_agg", f, Some(value), schema, ctx)?;
        let kind = StatKind::ArrayAgg {
            reverse: !asc,
            distinct,
            by_value: false,
            nulls_first: false,
            ty,
        };
        return Ok((pair, kind));
    }
    // Ordered by the value: DISTINCT may only order by its argument.
    let (asc, nulls_first) = match f.sorts.as_slice() {
        [] => (true, false),
        [sort] => sort_direction(sort),
        _ => {
            return Err(unsupported(
                "array_agg(DISTINCT v ORDER BY ...) orders by v alone in flows",
            ))
        }
    };
    let reverse = !asc;
    let pair = Expr::Call(
        Func::OrderedPair { nulls_low: true },
        vec![Expr::Lit(Lit::Int(0), DataType::Int64), value],
        DataType::Binary,
    );
    let kind = StatKind::ArrayAgg {
        reverse,
        distinct,
        by_value: true,
        nulls_first,
        ty,
    };
    Ok((pair, kind))
}

/// `hop(ts, slide, size)` as a grouping expression, if `e` is one.
fn hop_spec(e: &Expression, schema: &Schema, ctx: &Ctx<'_>) -> Result<Option<HopSpec>, FlowError> {
    let Some(RexType::ScalarFunction(f)) = &e.rex_type else {
        return Ok(None);
    };
    if ctx.funcs.get(&f.function_reference).map(String::as_str) != Some("hop") {
        return Ok(None);
    }
    let raw = args_of(&f.arguments)?;
    let [ts, slide, size] = raw.as_slice() else {
        return Err(unsupported("hop takes (ts, slide, size)"));
    };
    let (slide_ns, size_ns) = (interval_ns(slide)?, interval_ns(size)?);
    if slide_ns <= 0 || size_ns < slide_ns {
        return Err(bad(
            "hop needs a positive slide and a size at least as large as the slide",
        ));
    }
    if size_ns / slide_ns > 10_000 {
        return Err(unsupported(
            "hop windows overlap too much: a row would be in more than 10000 windows",
        ));
    }
    let (ts, _) = lower_expr(ts, schema, ctx)?;
    if !ts.ty().is_timestamp() {
        return Err(unsupported(format!(
            "hop over {} is not supported in flows",
            ts.ty()
        )));
    }
    let out = ts.ty();
    Ok(Some(HopSpec {
        ts,
        slide_ns,
        size_ns,
        out,
    }))
}

fn args_of(f: &[substrait::proto::FunctionArgument]) -> Result<Vec<&Expression>, FlowError> {
    f.iter()
        .map(|a| match &a.arg_type {
            Some(ArgType::Value(v)) => Ok(v),
            Some(ArgType::Enum(e)) => Err(unsupported(format!(
                "enum function argument {e} is not supported in flows"
            ))),
            _ => Err(unsupported(
                "non-value function arguments are not supported in flows",
            )),
        })
        .collect()
}

/// Whether `e` is an interval literal.
fn is_interval_literal(e: &Expression) -> bool {
    matches!(
        &e.rex_type,
        Some(RexType::Literal(l)) if matches!(
            l.literal_type,
            Some(LiteralType::IntervalDayToSecond(_))
                | Some(LiteralType::IntervalCompound(_))
                | Some(LiteralType::IntervalYearToMonth(_))
        )
    )
}

/// Interval literal → nanoseconds (months must be zero).
fn interval_ns(e: &Expression) -> Result<i64, FlowError> {
    use substrait::proto::expression::literal::interval_day_to_second::PrecisionMode;
    let Some(RexType::Literal(l)) = &e.rex_type else {
        return Err(unsupported(
            "date_bin needs a constant interval stride in flows",
        ));
    };
    let dts = |d: &substrait::proto::expression::literal::IntervalDayToSecond| -> i64 {
        let sub_ns = match d.precision_mode {
            #[allow(deprecated)]
            Some(PrecisionMode::Microseconds(us)) => us as i64 * 1_000,
            Some(PrecisionMode::Precision(p)) => {
                let p = p.clamp(0, 9) as u32;
                d.subseconds.saturating_mul(10i64.pow(9 - p))
            }
            None => d.subseconds,
        };
        (d.days as i64 * 86_400 + d.seconds as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(sub_ns)
    };
    match &l.literal_type {
        Some(LiteralType::IntervalDayToSecond(d)) => Ok(dts(d)),
        Some(LiteralType::IntervalCompound(c)) => {
            if c.interval_year_to_month
                .as_ref()
                .is_some_and(|y| y.years != 0 || y.months != 0)
            {
                return Err(unsupported(
                    "date_bin with a stride in months or years is not supported in flows",
                ));
            }
            Ok(c.interval_day_to_second.as_ref().map(dts).unwrap_or(0))
        }
        Some(LiteralType::IntervalYearToMonth(_)) => Err(unsupported(
            "date_bin with a stride in months or years is not supported in flows",
        )),
        _ => Err(unsupported("date_bin needs an interval stride")),
    }
}

fn lower_literal(l: &substrait::proto::expression::Literal) -> Result<(Lit, DataType), FlowError> {
    let unsigned = l.type_variation_reference == 1;
    let int = |v: i64, s: DataType, u: DataType| -> (Lit, DataType) {
        let t = if unsigned { u } else { s };
        (Lit::Int(t.wrap_int(v)), t)
    };
    let lt = l
        .literal_type
        .as_ref()
        .ok_or_else(|| bad("literal without a value"))?;
    Ok(match lt {
        LiteralType::Boolean(b) => (Lit::Int(*b as i64), DataType::Boolean),
        LiteralType::I8(v) => int(*v as i64, DataType::Int8, DataType::UInt8),
        LiteralType::I16(v) => int(*v as i64, DataType::Int16, DataType::UInt16),
        LiteralType::I32(v) => int(*v as i64, DataType::Int32, DataType::UInt32),
        LiteralType::I64(v) => int(*v, DataType::Int64, DataType::UInt64),
        LiteralType::Fp32(v) => (Lit::Float(*v as f64), DataType::Float32),
        LiteralType::Fp64(v) => (Lit::Float(*v), DataType::Float64),
        LiteralType::String(s) | LiteralType::FixedChar(s) => {
            (Lit::Bytes(s.as_bytes().to_vec()), DataType::Utf8)
        }
        LiteralType::VarChar(v) => (Lit::Bytes(v.value.as_bytes().to_vec()), DataType::Utf8),
        LiteralType::Binary(b) | LiteralType::FixedBinary(b) => {
            (Lit::Bytes(b.clone()), DataType::Binary)
        }
        LiteralType::Date(d) => (Lit::Int(*d as i64), DataType::Date32),
        LiteralType::PrecisionTimestamp(p) | LiteralType::PrecisionTimestampTz(p) => {
            let t = map_type(&Type {
                kind: Some(r#type::Kind::PrecisionTimestamp(
                    r#type::PrecisionTimestamp {
                        precision: p.precision,
                        type_variation_reference: 0,
                        nullability: 0,
                    },
                )),
            })?;
            (Lit::Int(p.value), t)
        }
        #[allow(deprecated)]
        LiteralType::Timestamp(v) | LiteralType::TimestampTz(v) => {
            (Lit::Int(*v), DataType::TimestampMicrosecond)
        }
        LiteralType::Null(t) => (Lit::Null, map_type(t)?),
        LiteralType::Decimal(_) => {
            return Err(unsupported("decimal literals are not supported in flows"))
        }
        LiteralType::IntervalDayToSecond(_)
        | LiteralType::IntervalYearToMonth(_)
        | LiteralType::IntervalCompound(_) => {
            return Err(unsupported(
                "interval values are not supported in flows (only as date_bin strides)",
            ))
        }
        other => {
            return Err(unsupported(format!(
                "literal {other:?} is not supported in flows"
            )))
        }
    })
}

fn field_index(fr: &substrait::proto::expression::FieldReference) -> Result<usize, FlowError> {
    match &fr.root_type {
        Some(RootType::RootReference(_)) | None => {}
        Some(RootType::OuterReference(_)) => {
            return Err(unsupported("subqueries are not supported in flows"))
        }
        Some(_) => {
            return Err(unsupported(
                "nested field references are not supported in flows",
            ))
        }
    }
    match &fr.reference_type {
        Some(ReferenceType::DirectReference(seg)) => match &seg.reference_type {
            Some(reference_segment::ReferenceType::StructField(sf)) => {
                if sf.child.is_some() {
                    return Err(unsupported(
                        "nested field references are not supported in flows",
                    ));
                }
                usize::try_from(sf.field).map_err(|_| bad("negative field reference"))
            }
            _ => Err(unsupported(
                "only struct field references are supported in flows",
            )),
        },
        _ => Err(unsupported(
            "masked field references are not supported in flows",
        )),
    }
}

fn lower_expr(e: &Expression, schema: &Schema, ctx: &Ctx<'_>) -> Result<(Expr, bool), FlowError> {
    let rex = e
        .rex_type
        .as_ref()
        .ok_or_else(|| bad("expression without a kind"))?;
    match rex {
        RexType::Selection(fr) => {
            let i = field_index(fr)?;
            let (t, n) = schema
                .get(i)
                .copied()
                .ok_or_else(|| bad(format!("field reference {i} is out of range")))?;
            Ok((Expr::Col(i, t), n))
        }
        RexType::Literal(l) => {
            let (v, t) = lower_literal(l)?;
            let null = v == Lit::Null;
            Ok((Expr::Lit(v, t), null))
        }
        RexType::Cast(c) => {
            let input = c.input.as_ref().ok_or_else(|| bad("cast without input"))?;
            let t = c.r#type.as_ref().ok_or_else(|| bad("cast without type"))?;
            let to = map_type(t)?;
            let (x, n) = lower_expr(input, schema, ctx)?;
            if !cast_supported(x.ty(), to) {
                return Err(unsupported(format!(
                    "CAST from {} to {to} is not supported in flows",
                    x.ty()
                )));
            }
            if x.ty() == to {
                return Ok((x, n));
            }
            Ok((Expr::Cast(Box::new(x), to), n))
        }
        RexType::IfThen(it) => {
            let mut whens = Vec::new();
            let mut out_ty: Option<DataType> = None;
            let mut nullable = it.r#else.is_none();
            let mut thens = Vec::new();
            // DataFusion writes a simple CASE (`CASE x WHEN v THEN ...`, which its optimiser
            // also makes of e.g. `s LIKE '%'`) as a first clause holding `x` and no result;
            // each WHEN then tests `x = v`.
            let (base, clauses) = match it.ifs.split_first() {
                Some((first, rest)) if first.then.is_none() => {
                    let x = first
                        .r#if
                        .as_ref()
                        .ok_or_else(|| bad("CASE without condition"))?;
                    (Some(lower_expr(x, schema, ctx)?.0), rest)
                }
                _ => (None, it.ifs.as_slice()),
            };
            for clause in clauses {
                let c = clause
                    .r#if
                    .as_ref()
                    .ok_or_else(|| bad("CASE without condition"))?;
                let t = clause
                    .then
                    .as_ref()
                    .ok_or_else(|| bad("CASE without result"))?;
                let (c, _) = lower_expr(c, schema, ctx)?;
                let c = match &base {
                    Some(x) => {
                        let bytes = |t: DataType| t.storage() == crate::types::Storage::Bytes;
                        if bytes(x.ty()) != bytes(c.ty()) {
                            return Err(unsupported(format!(
                                "CASE {} WHEN {} is not supported in flows (mixed comparison)",
                                x.ty(),
                                c.ty()
                            )));
                        }
                        Expr::Call(Func::Cmp(Cmp::Eq), vec![x.clone(), c], DataType::Boolean)
                    }
                    None => c,
                };
                let (t, tn) = lower_expr(t, schema, ctx)?;
                nullable |= tn;
                if out_ty.is_none() && !matches!(t, Expr::Lit(Lit::Null, _)) {
                    out_ty = Some(t.ty());
                }
                thens.push(t.ty());
                whens.push((c, t));
            }
            let els = match &it.r#else {
                Some(x) => {
                    let (x, xn) = lower_expr(x, schema, ctx)?;
                    nullable |= xn;
                    if out_ty.is_none() && !matches!(x, Expr::Lit(Lit::Null, _)) {
                        out_ty = Some(x.ty());
                    }
                    Some(Box::new(x))
                }
                None => None,
            };
            let t = out_ty
                .or_else(|| thens.first().copied())
                .unwrap_or(DataType::Int64);
            Ok((Expr::Case(whens, els, t), nullable))
        }
        RexType::SingularOrList(s) => {
            let v = s.value.as_ref().ok_or_else(|| bad("IN without a value"))?;
            let (v, mut n) = lower_expr(v, schema, ctx)?;
            let mut list = Vec::new();
            for o in &s.options {
                let (x, xn) = lower_expr(o, schema, ctx)?;
                n |= xn;
                list.push(x);
            }
            Ok((Expr::InList(Box::new(v), list), n))
        }
        RexType::ScalarFunction(f) => {
            let name = ctx
                .funcs
                .get(&f.function_reference)
                .cloned()
                .ok_or_else(|| bad("function reference not declared in the plan"))?;
            let raw_args = args_of(&f.arguments)?;
            let out_ty = match &f.output_type {
                Some(t) => Some(map_type(t)?),
                None => None,
            };
            let out_null = f.output_type.as_ref().and_then(nullable_of);
            lower_call(&name, &raw_args, out_ty, out_null, schema, ctx)
        }
        RexType::WindowFunction(_) => {
            Err(unsupported("window functions are not supported in flows"))
        }
        RexType::Subquery(_) => Err(unsupported("subqueries are not supported in flows")),
        RexType::SwitchExpression(_) => Err(unsupported(
            "simple CASE (switch) expressions are not supported in flows",
        )),
        RexType::MultiOrList(_) => Err(unsupported(
            "multi-column IN lists are not supported in flows",
        )),
        _ => Err(unsupported(
            "this expression kind is not supported in flows",
        )),
    }
}

fn lower_call(
    name: &str,
    raw: &[&Expression],
    out_ty: Option<DataType>,
    out_null: Option<bool>,
    schema: &Schema,
    ctx: &Ctx<'_>,
) -> Result<(Expr, bool), FlowError> {
    let lower_all = || -> Result<(Vec<Expr>, Vec<bool>), FlowError> {
        let mut v = Vec::new();
        let mut n = Vec::new();
        for a in raw {
            let (x, xn) = lower_expr(a, schema, ctx)?;
            n.push(xn);
            v.push(x);
        }
        Ok((v, n))
    };
    let need = |k: usize| -> Result<(), FlowError> {
        if raw.len() < k {
            Err(bad(format!(
                "function {name} needs {k} arguments, has {}",
                raw.len()
            )))
        } else {
            Ok(())
        }
    };
    // timestamp ± a constant interval (DataFusion: `ts + INTERVAL '1 minute'`).
    if matches!(name, "add" | "subtract") && raw.len() == 2 {
        if let Some(i) = raw.iter().position(|e| is_interval_literal(e)) {
            if name == "subtract" && i == 0 {
                return Err(unsupported(
                    "an interval minus a timestamp is not supported in flows",
                ));
            }
            let ns = interval_ns(raw[i]).map_err(|_| {
                unsupported(
                    "interval arithmetic in flows takes a constant interval of days, hours, \
                     minutes or seconds (not months or years)",
                )
            })?;
            let (ts, n) = lower_expr(raw[1 - i], schema, ctx)?;
            let t = ts.ty();
            let Some(unit) = t.timestamp_unit_nanos() else {
                return Err(unsupported(format!(
                    "{name} of an interval to {t} is not supported in flows (timestamps only)"
                )));
            };
            if ns % unit != 0 {
                return Err(unsupported(format!(
                    "interval of {ns} ns is finer than the timestamp's unit ({t})"
                )));
            }
            let delta = if name == "subtract" {
                -(ns / unit)
            } else {
                ns / unit
            };
            let sum = Expr::Call(
                Func::Arith(Arith::Add),
                vec![
                    Expr::Cast(Box::new(ts), DataType::Int64),
                    Expr::Lit(Lit::Int(delta), DataType::Int64),
                ],
                DataType::Int64,
            );
            let raw_ts = Expr::Cast(Box::new(sum), t);
            let out = out_ty.unwrap_or(t);
            let e = if out == t {
                raw_ts
            } else {
                Expr::Cast(Box::new(raw_ts), out)
            };
            return Ok((e, n || out_null.unwrap_or(false)));
        }
    }
    if name == "flow_now_cmp" {
        need(3)?;
        let (x, _) = lower_expr(raw[0], schema, ctx)?;
        if !x.ty().is_timestamp() {
            return Err(unsupported(format!(
                "now() compared with a value of type {} is not supported in flows; compare it \
                 with a timestamp",
                x.ty()
            )));
        }
        let offset_ns = match lower_expr(raw[1], schema, ctx)?.0 {
            Expr::Lit(Lit::Int(v), _) => v,
            _ => return Err(bad("flow_now_cmp needs a constant offset")),
        };
        let op = match lower_expr(raw[2], schema, ctx)?.0 {
            Expr::Lit(Lit::Bytes(b), _) => match b.as_slice() {
                b"gt" => Cmp::Gt,
                b"ge" => Cmp::Ge,
                b"lt" => Cmp::Lt,
                b"le" => Cmp::Le,
                _ => return Err(bad("flow_now_cmp: unknown comparison")),
            },
            _ => return Err(bad("flow_now_cmp needs a constant comparison")),
        };
        // The fourth argument, when there: now() truncated to multiples of it (ns).
        let trunc_ns = match raw.get(3) {
            Some(r) => match lower_expr(r, schema, ctx)?.0 {
                Expr::Lit(Lit::Int(v), _) if v >= 1 => v,
                _ => return Err(bad("flow_now_cmp needs a positive constant truncation")),
            },
            None => 1,
        };
        return Ok((
            Expr::Call(
                Func::NowCmp {
                    op,
                    offset_ns,
                    trunc_ns,
                },
                vec![x],
                DataType::Boolean,
            ),
            true,
        ));
    }
    let func = match name {
        "add" => Func::Arith(Arith::Add),
        "subtract" => Func::Arith(Arith::Sub),
        "multiply" => Func::Arith(Arith::Mul),
        "divide" => Func::Arith(Arith::Div),
        "modulus" | "mod" => Func::Arith(Arith::Mod),
        "equal" => Func::Cmp(Cmp::Eq),
        "not_equal" => Func::Cmp(Cmp::Ne),
        "lt" => Func::Cmp(Cmp::Lt),
        "lte" => Func::Cmp(Cmp::Le),
        "gt" => Func::Cmp(Cmp::Gt),
        "gte" => Func::Cmp(Cmp::Ge),
        "is_distinct_from" => Func::Cmp(Cmp::Distinct),
        "is_not_distinct_from" => Func::Cmp(Cmp::NotDistinct),
        "and" => Func::And,
        "or" => Func::Or,
        "not" => Func::Not,
        "negate" | "negative" => Func::Negate,
        "is_null" => Func::IsNull,
        "is_not_null" => Func::IsNotNull,
        "is_true" => Func::IsTrue,
        "is_false" => Func::IsFalse,
        "is_not_true" => Func::IsNotTrue,
        "is_not_false" => Func::IsNotFalse,
        "like" => Func::Like {
            case_insensitive: false,
        },
        "ilike" => Func::Like {
            case_insensitive: true,
        },
        "abs" => Func::Abs,
        "round" => Func::Round,
        "trunc" => Func::Trunc,
        "floor" => Func::Floor,
        "ceil" | "ceiling" => Func::Ceil,
        "concat" => Func::Concat,
        "str_concat" | "||" => Func::StrConcat,
        "lower" => Func::Lower,
        "upper" => Func::Upper,
        "character_length" | "char_length" | "length" => Func::CharLength,
        "coalesce" => Func::Coalesce,
        "date_bin" => {
            need(2)?;
            let stride_ns = interval_ns(raw[0])?;
            if stride_ns <= 0 {
                return Err(bad("date_bin stride must be positive"));
            }
            let origin_ns = match raw.get(2) {
                None => 0,
                Some(o) => {
                    let (x, _) = lower_expr(o, schema, ctx)?;
                    match x {
                        Expr::Lit(Lit::Int(v), t) if t.is_timestamp() => (v as i128
                            * t.timestamp_unit_nanos().unwrap_or(1) as i128)
                            .clamp(i64::MIN as i128, i64::MAX as i128)
                            as i64,
                        _ => {
                            return Err(unsupported(
                                "date_bin needs a constant timestamp origin in flows",
                            ))
                        }
                    }
                }
            };
            let (ts, n) = lower_expr(raw[1], schema, ctx)?;
            if !ts.ty().is_timestamp() {
                return Err(unsupported(format!(
                    "date_bin over {} is not supported in flows",
                    ts.ty()
                )));
            }
            let t = out_ty.unwrap_or(ts.ty());
            if !t.is_timestamp() {
                return Err(unsupported("date_bin must return a timestamp"));
            }
            return Ok((
                Expr::Call(
                    Func::DateBin {
                        stride_ns,
                        origin_ns,
                    },
                    vec![ts],
                    t,
                ),
                n || out_null.unwrap_or(false),
            ));
        }
        "date_trunc" => {
            need(2)?;
            let (g, _) = lower_expr(raw[0], schema, ctx)?;
            let unit = match &g {
                Expr::Lit(Lit::Bytes(b), _) => {
                    match String::from_utf8_lossy(b).to_ascii_lowercase().as_str() {
                        "microsecond" | "microseconds" => TruncUnit::Microsecond,
                        "millisecond" | "milliseconds" => TruncUnit::Millisecond,
                        "second" | "seconds" => TruncUnit::Second,
                        "minute" | "minutes" => TruncUnit::Minute,
                        "hour" | "hours" => TruncUnit::Hour,
                        "day" | "days" => TruncUnit::Day,
                        "week" | "weeks" => TruncUnit::Week,
                        "month" | "months" => TruncUnit::Month,
                        "quarter" | "quarters" => TruncUnit::Quarter,
                        "year" | "years" => TruncUnit::Year,
                        other => {
                            return Err(unsupported(format!(
                                "date_trunc to {other} is not supported in flows"
                            )))
                        }
                    }
                }
                _ => {
                    return Err(unsupported(
                        "date_trunc needs a constant granularity in flows",
                    ))
                }
            };
            let (ts, n) = lower_expr(raw[1], schema, ctx)?;
            if !ts.ty().is_timestamp() {
                return Err(unsupported(format!(
                    "date_trunc over {} is not supported in flows",
                    ts.ty()
                )));
            }
            let t = out_ty.unwrap_or(ts.ty());
            if !t.is_timestamp() {
                return Err(unsupported("date_trunc must return a timestamp"));
            }
            return Ok((
                Expr::Call(Func::DateTrunc(unit), vec![ts], t),
                n || out_null.unwrap_or(false),
            ));
        }
        "regexp_like" | "regex_match" | "regex_imatch" | "regex_not_match" | "regex_not_imatch" => {
            return lower_regex_match(name, raw, out_ty, out_null, schema, ctx)
        }
        other => {
            return Err(unsupported(format!(
                "function {other} is not supported in flows"
            )))
        }
    };
    let (mut args, arg_nulls) = lower_all()?;
    if matches!(func, Func::And | Func::Or | Func::Not) {
        // A NULL literal of any type is a boolean NULL here.
        for a in &mut args {
            if let Expr::Lit(Lit::Null, t) = a {
                *t = DataType::Boolean;
            }
        }
    }
    let any_null = arg_nulls.iter().any(|n| *n);
    let arity_ok = match &func {
        Func::Arith(_) | Func::Cmp(_) => args.len() == 2,
        Func::And | Func::Or | Func::Concat | Func::StrConcat | Func::Coalesce => !args.is_empty(),
        Func::Like { .. } => args.len() == 2 || args.len() == 3,
        Func::Round | Func::Trunc => args.len() == 1 || args.len() == 2,
        _ => args.len() == 1,
    };
    if !arity_ok {
        return Err(bad(format!(
            "function {name} called with {} arguments",
            args.len()
        )));
    }
    let first = args.first().map(|a| a.ty()).unwrap_or(DataType::Int64);
    let boolean = matches!(
        func,
        Func::Cmp(_)
            | Func::And
            | Func::Or
            | Func::Not
            | Func::IsNull
            | Func::IsNotNull
            | Func::IsTrue
            | Func::IsFalse
            | Func::IsNotTrue
            | Func::IsNotFalse
            | Func::Like { .. }
    );
    let t = if boolean {
        DataType::Boolean
    } else {
        out_ty.unwrap_or(match func {
            Func::Concat | Func::StrConcat | Func::Lower | Func::Upper => DataType::Utf8,
            Func::CharLength => DataType::Int32,
            Func::Round | Func::Trunc | Func::Floor | Func::Ceil => DataType::Float64,
            _ => first,
        })
    };
    // Type checks for what the evaluator implements: the result it computes must have the
    // type the plan declares (`t`), or the flow would emit columns that break its own output
    // schema.
    let bad_types = |what: &str| {
        unsupported(format!(
            "{name} over {} returning {t} is not supported in flows ({what})",
            args.iter()
                .map(|a| a.ty().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    let (ok, what) = match &func {
        Func::Arith(_) => (
            t.is_numeric()
                && args.iter().all(|a| a.ty().is_numeric())
                && (t.is_float() || args.iter().all(|a| a.ty().is_integer())),
            "only numeric arithmetic, with a float result when an argument is a float",
        ),
        Func::Negate | Func::Abs => (
            first.is_numeric() && t == first,
            "numeric only, returning the argument's type",
        ),
        Func::Round | Func::Trunc | Func::Floor | Func::Ceil => {
            (first.is_numeric() && t.is_numeric(), "numeric only")
        }
        Func::Lower | Func::Upper => (
            first == DataType::Utf8 && t == DataType::Utf8,
            "strings only, returning a string",
        ),
        Func::CharLength => (
            first == DataType::Utf8 && t.is_integer(),
            "strings only, returning an integer",
        ),
        Func::Like { .. } => (first == DataType::Utf8, "strings only"),
        Func::And | Func::Or | Func::Not => (
            args.iter().all(|a| a.ty() == DataType::Boolean),
            "booleans only",
        ),
        Func::Cmp(_) => {
            let bytes = |e: &Expr| e.ty().storage() == crate::types::Storage::Bytes;
            (
                args.first().map(bytes) == args.get(1).map(bytes),
                "mixed comparison",
            )
        }
        Func::Concat | Func::StrConcat => (
            t == DataType::Utf8 && args.iter().all(|a| cast_supported(a.ty(), DataType::Utf8)),
            "string concatenation only",
        ),
        Func::Coalesce => (
            args.iter().all(|a| cast_supported(a.ty(), t)),
            "incompatible types",
        ),
        _ => (true, ""),
    };
    if !ok {
        return Err(bad_types(what));
    }
    // Nullability follows from the arguments as the evaluator treats them; the plan's own
    // claim can only add nullability (a plan that says NOT NULL over nullable arguments is
    // not believed).
    let nullable = match &func {
        Func::IsNull | Func::IsNotNull | Func::IsTrue | Func::IsFalse | Func::IsNotTrue => false,
        Func::IsNotFalse => false,
        Func::Cmp(Cmp::Distinct | Cmp::NotDistinct) => false,
        // NULL arguments are skipped: never NULL.
        Func::Concat => out_null.unwrap_or(any_null),
        Func::Coalesce => arg_nulls.iter().all(|n| *n) || out_null.unwrap_or(false),
        _ => any_null || out_null.unwrap_or(false),
    };
    Ok((Expr::Call(func, args, t), nullable))
}

/// `regexp_like(s, pattern[, flags])`, and the operators DataFusion's optimizer rewrites it to
/// (a literal `flags` of `''` or `'i'`, or none) and SQL's own: `s ~ pattern` arrives as
/// `regex_match`, `~*` as `regex_imatch`, `!~` and `!~*` as `regex_not_match` and
/// `regex_not_imatch`. The pattern and the flags must be constants; the pattern is compiled here,
/// once, as DataFusion 55 compiles it (`(?flags)pattern`).
fn lower_regex_match(
    name: &str,
    raw: &[&Expression],
    out_ty: Option<DataType>,
    out_null: Option<bool>,
    schema: &Schema,
    ctx: &Ctx<'_>,
) -> Result<(Expr, bool), FlowError> {
    let (negated, op_flags) = match name {
        "regex_imatch" => (false, Some("i")),
        "regex_not_match" => (true, None),
        "regex_not_imatch" => (true, Some("i")),
        _ => (false, None),
    };
    let is_fn = name == "regexp_like";
    let (value, pattern, flags) = match raw {
        [v, p] => (*v, *p, None),
        [v, p, f] if is_fn => (*v, *p, Some(*f)),
        _ => {
            return Err(bad(format!(
                "function {name} called with {} arguments",
                raw.len()
            )))
        }
    };
    if let Some(t) = out_ty.filter(|t| *t != DataType::Boolean) {
        return Err(unsupported(format!(
            "{name} returning {t} is not supported in flows (it returns a boolean)"
        )));
    }
    let (value, value_null) = lower_expr(value, schema, ctx)?;
    if value.ty() != DataType::Utf8 && !matches!(value, Expr::Lit(Lit::Null, _)) {
        return Err(unsupported(format!(
            "{name} over {} is not supported in flows (strings only)",
            value.ty()
        )));
    }
    // A constant string argument, `None` when it is NULL (of any type: before DataFusion's
    // analyser, a NULL literal is untyped, which lower_expr refuses).
    let constant = |e: &Expression, what: &str| -> Result<Option<String>, FlowError> {
        if let Some(RexType::Literal(l)) = &e.rex_type {
            if let Some(LiteralType::Null(_)) = l.literal_type {
                return Ok(None);
            }
        }
        let (x, _) = lower_expr(e, schema, ctx)?;
        let x = match x {
            Expr::Cast(inner, DataType::Utf8) => *inner,
            x => x,
        };
        match x {
            Expr::Lit(Lit::Null, _) => Ok(None),
            Expr::Lit(Lit::Bytes(b), DataType::Utf8) => {
                Ok(Some(String::from_utf8_lossy(&b).into_owned()))
            }
            _ => Err(unsupported(format!(
                "{name} with a {what} that is not a constant string is not supported in flows"
            ))),
        }
    };
    let pattern = constant(pattern, "pattern")?;
    // DataFusion: a NULL flags argument is the same as none; flags with `g` are refused.
    // Its optimiser rewrites regexp_like without flags, or with '' or 'i', to `~` / `~*` (so
    // '' never reaches the regex as an invalid `(?)`); other flags stay regexp_like's.
    let (flags, rewritten) = match flags {
        Some(f) => match constant(f, "flags argument")? {
            None => (None, false),
            Some(f) if f.is_empty() => (None, true),
            Some(f) => {
                let i = f == "i";
                (Some(f), i)
            }
        },
        None => (op_flags.map(str::to_string), true),
    };
    if is_fn && flags.as_deref().is_some_and(|f| f.contains('g')) {
        return Err(bad("regexp_like() does not support the \"global\" option"));
    }
    let nullable = value_null || out_null.unwrap_or(false);
    let Some(pattern) = pattern else {
        // A NULL pattern matches nothing, not even to say false: every row is NULL.
        return Ok((Expr::Lit(Lit::Null, DataType::Boolean), true));
    };
    if rewritten && !negated && pattern == ".*" {
        // DataFusion's optimiser makes `s ~ '.*'` (and `~*`) `s IS NOT NULL`: false, not NULL,
        // for a NULL string. (`!~ '.*'` becomes `s IS NULL AND NULL`, which is what the regex
        // gives anyway.)
        return Ok((
            Expr::Call(Func::IsNotNull, vec![value], DataType::Boolean),
            out_null.unwrap_or(false),
        ));
    }
    let re = Pattern::new(&pattern, flags.as_deref()).map_err(|e| match e {
        FlowError::BadInput(m) => bad(format!("{name}: {m}")),
        e => e,
    })?;
    Ok((
        Expr::Call(
            Func::RegexMatch { re, negated },
            vec![value],
            DataType::Boolean,
        ),
        nullable,
    ))
}

/// The sketch function `name` is, with its literal parameters checked;
/// `None` for other functions.
fn sketch_kind(name: &str, args: &[Expr]) -> Result<Option<SketchKind>, FlowError> {
    let one = |what: &str| {
        if args.len() == 1 {
            Ok(())
        } else {
            Err(unsupported(format!("{name} takes one argument, {what}")))
        }
    };
    let params = |what: &str| -> Result<(i64, f64), FlowError> {
        let [b, e, _] = args else {
            return Err(unsupported(format!(
                "{name} takes three arguments: {name}(max_buckets, error_rate, {what})"
            )));
        };
        let max_buckets = match b {
            Expr::Lit(Lit::Int(i), _) => *i,
            _ => {
                return Err(unsupported(format!(
                    "{name}'s max_buckets must be an integer literal, e.g. {name}(128, 0.01, ...)"
                )))
            }
        };
        let error_rate = match e {
            Expr::Lit(Lit::Float(f), _) => *f,
            Expr::Lit(Lit::Int(i), _) => *i as f64,
            _ => {
                return Err(unsupported(format!(
                    "{name}'s error_rate must be a number literal, e.g. {name}(128, 0.01, ...)"
                )))
            }
        };
        // The same checks as the accumulator's, at CREATE FLOW.
        crate::sketch::UddAcc::new(max_buckets, error_rate)
            .map_err(|m| unsupported(format!("{name}: {m}")))?;
        Ok((max_buckets, error_rate))
    };
    Ok(Some(match name {
        "hll" => {
            one("the value to count distinct")?;
            SketchKind::Hll
        }
        "hll_merge" => {
            one("a state of hll")?;
            SketchKind::HllMerge
        }
        "uddsketch_state" => {
            let (max_buckets, error_rate) = params("value")?;
            SketchKind::Udd {
                max_buckets,
                error_rate,
            }
        }
        "uddsketch_merge" => {
            let (max_buckets, error_rate) = params("state")?;
            SketchKind::UddMerge {
                max_buckets,
                error_rate,
            }
        }
        _ => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use substrait::proto::expression::field_reference::ReferenceType;
    use substrait::proto::expression::{
        reference_segment, FieldReference, ReferenceSegment, ScalarFunction,
    };
    use substrait::proto::extensions::simple_extension_declaration::ExtensionFunction;
    use substrait::proto::extensions::SimpleExtensionDeclaration;
    use substrait::proto::read_rel::NamedTable;
    use substrait::proto::rel_common::Emit;
    use substrait::proto::{
        rel, FunctionArgument, NamedStruct, PlanRel, ProjectRel, ReadRel, RelRoot,
    };

    fn sources() -> Vec<SourceSchema> {
        vec![SourceSchema {
            name: "t".into(),
            fields: vec![
                Field::new("k", DataType::Int64, true),
                Field::new("g", DataType::Utf8, true),
                Field::new("u", DataType::UInt32, false),
            ],
        }]
    }

    fn col(i: i32) -> Expression {
        Expression {
            rex_type: Some(RexType::Selection(Box::new(FieldReference {
                reference_type: Some(ReferenceType::DirectReference(ReferenceSegment {
                    reference_type: Some(reference_segment::ReferenceType::StructField(Box::new(
                        reference_segment::StructField {
                            field: i,
                            child: None,
                        },
                    ))),
                })),
                root_type: Some(RootType::RootReference(Default::default())),
            }))),
        }
    }

    fn ty(kind: r#type::Kind) -> Type {
        Type { kind: Some(kind) }
    }

    fn nullability(nullable: bool) -> i32 {
        if nullable {
            r#type::Nullability::Nullable as i32
        } else {
            r#type::Nullability::Required as i32
        }
    }

    fn i64_ty(nullable: bool) -> Type {
        ty(r#type::Kind::I64(r#type::I64 {
            type_variation_reference: 0,
            nullability: nullability(nullable),
        }))
    }

    /// `SELECT func(args...) FROM t`, the call declared to return `out`.
    fn call_plan(func: &str, args: Vec<Expression>, out: Type) -> Vec<u8> {
        project_plan(func, args, out, vec![3], vec!["x".into()])
    }

    /// `SELECT ... FROM t` where the columns are picked by `mapping` from `k, g, u` (0-2) and
    /// `func(args...)` (3), the call declared to return `out`.
    fn project_plan(
        func: &str,
        args: Vec<Expression>,
        out: Type,
        mapping: Vec<i32>,
        names: Vec<String>,
    ) -> Vec<u8> {
        let read = Rel {
            rel_type: Some(RelType::Read(Box::new(ReadRel {
                base_schema: Some(NamedStruct {
                    names: vec!["k".into(), "g".into(), "u".into()],
                    r#struct: None,
                }),
                read_type: Some(ReadType::NamedTable(NamedTable {
                    names: vec!["t".into()],
                    advanced_extension: None,
                })),
                ..Default::default()
            }))),
        };
        #[allow(deprecated)]
        let call = Expression {
            rex_type: Some(RexType::ScalarFunction(ScalarFunction {
                function_reference: 0,
                arguments: args
                    .into_iter()
                    .map(|a| FunctionArgument {
                        arg_type: Some(ArgType::Value(a)),
                    })
                    .collect(),
                output_type: Some(out),
                ..Default::default()
            })),
        };
        let project = Rel {
            rel_type: Some(rel::RelType::Project(Box::new(ProjectRel {
                common: Some(RelCommon {
                    emit_kind: Some(EmitKind::Emit(Emit {
                        output_mapping: mapping,
                    })),
                    ..Default::default()
                }),
                input: Some(Box::new(read)),
                expressions: vec![call],
                advanced_extension: None,
            }))),
        };
        #[allow(deprecated)]
        let plan = Plan {
            extensions: vec![SimpleExtensionDeclaration {
                mapping_type: Some(MappingType::ExtensionFunction(ExtensionFunction {
                    function_anchor: 0,
                    name: func.into(),
                    ..Default::default()
                })),
            }],
            relations: vec![PlanRel {
                rel_type: Some(plan_rel::RelType::Root(RelRoot {
                    input: Some(project),
                    names,
                })),
            }],
            ..Default::default()
        };
        plan.encode_to_vec()
    }

    fn output(plan: &[u8]) -> Result<Field, FlowError> {
        let lowered = lower(plan, &sources())?;
        assert_eq!(lowered.output.len(), 1);
        Ok(lowered.output[0].clone())
    }

    #[test]
    fn declared_result_types_must_be_what_the_engine_computes() {
        let binary = ty(r#type::Kind::Binary(r#type::Binary {
            type_variation_reference: 0,
            nullability: nullability(true),
        }));
        let float = ty(r#type::Kind::Fp64(r#type::Fp64 {
            type_variation_reference: 0,
            nullability: nullability(true),
        }));
        let int32 = ty(r#type::Kind::I32(r#type::I32 {
            type_variation_reference: 0,
            nullability: nullability(true),
        }));
        let string = ty(r#type::Kind::String(r#type::String {
            type_variation_reference: 0,
            nullability: nullability(true),
        }));
        let refused = [
            ("character_length", vec![col(1)], binary.clone()),
            ("upper", vec![col(1)], int32.clone()),
            ("abs", vec![col(0)], float.clone()),
            ("negate", vec![col(0)], string.clone()),
            ("multiply", vec![col(0), col(0)], binary),
            ("and", vec![col(0), col(0)], i64_ty(true)),
            ("not", vec![col(1)], i64_ty(true)),
        ];
        for (func, args, out) in refused {
            match output(&call_plan(func, args, out)) {
                Err(FlowError::Unsupported(m)) => assert!(m.starts_with(func), "{m}"),
                other => panic!("{func}: {other:?}"),
            }
        }
        let accepted = [
            ("character_length", vec![col(1)], int32, DataType::Int32),
            ("upper", vec![col(1)], string, DataType::Utf8),
            ("abs", vec![col(0)], i64_ty(true), DataType::Int64),
            ("multiply", vec![col(0), col(2)], float, DataType::Float64),
        ];
        for (func, args, out, want) in accepted {
            let f = output(&call_plan(func, args, out)).expect(func);
            assert_eq!(f.data_type, want, "{func}");
        }
    }

    #[test]
    fn nullability_follows_the_arguments_not_the_plans_claim() {
        // k is nullable: a plan that says k * k is NOT NULL is not believed.
        let f = output(&call_plan("multiply", vec![col(0), col(0)], i64_ty(false))).unwrap();
        assert!(f.nullable);
        // u is not: u * u is NOT NULL unless the plan says otherwise.
        let f = output(&call_plan("multiply", vec![col(2), col(2)], i64_ty(false))).unwrap();
        assert!(!f.nullable);
        let f = output(&call_plan("multiply", vec![col(2), col(2)], i64_ty(true))).unwrap();
        assert!(f.nullable);
        // coalesce is NULL only when every argument can be.
        let f = output(&call_plan("coalesce", vec![col(0), col(2)], i64_ty(false))).unwrap();
        assert!(!f.nullable);
        let f = output(&call_plan("coalesce", vec![col(0), col(0)], i64_ty(false))).unwrap();
        assert!(f.nullable);
    }

    fn lit(l: LiteralType) -> Expression {
        Expression {
            rex_type: Some(RexType::Literal(substrait::proto::expression::Literal {
                literal_type: Some(l),
                ..Default::default()
            })),
        }
    }

    fn text(s: &str) -> Expression {
        lit(LiteralType::String(s.into()))
    }

    fn null_text() -> Expression {
        lit(LiteralType::Null(ty(r#type::Kind::String(
            r#type::String {
                type_variation_reference: 0,
                nullability: nullability(true),
            },
        ))))
    }

    fn bool_ty() -> Type {
        ty(r#type::Kind::Bool(r#type::Boolean {
            type_variation_reference: 0,
            nullability: nullability(true),
        }))
    }

    const STRINGS: [Option<&str>; 8] = [
        Some("abc"),
        Some("xyz"),
        None,
        Some("ABBA"),
        Some("Köln"),
        Some(""),
        Some("line1\nline2"),
        Some("ΣΊΣΥΦΟΣ"),
    ];

    /// `SELECT g, func(g, args...) FROM t` over a row per string of [`STRINGS`]: the result
    /// of each row, in order.
    fn regex_rows(func: &str, args: Vec<Expression>) -> Result<Vec<Option<bool>>, FlowError> {
        use crate::types::{Batch, Value};
        let mut all = vec![col(1)];
        all.extend(args);
        let plan = project_plan(
            func,
            all,
            bool_ty(),
            vec![1, 3],
            vec!["g".into(), "x".into()],
        );
        let mut flow = crate::Flow::create(&plan, sources(), vec![])?;
        let out = flow.output_schema();
        assert_eq!(out[1].data_type, DataType::Boolean);
        assert!(out[1].nullable);
        let rows: Vec<Vec<Value>> = STRINGS
            .iter()
            .map(|s| {
                vec![
                    Value::Int(1),
                    s.map_or(Value::Null, |s| Value::Str(s.into())),
                    Value::UInt(0),
                ]
            })
            .collect();
        let n = rows.len();
        let batch = Batch::from_rows(&sources()[0].fields, &rows, &vec![0; n], &vec![1; n])?;
        flow.push(0, batch)?;
        // A snapshot carries the plan, which is lowered (and the pattern compiled) again.
        let mut flow = crate::Flow::restore(&flow.snapshot()?)?;
        let tick = flow.tick(0, 1000)?;
        let got = tick.output.to_rows(&out);
        assert_eq!(got.len(), n);
        let result = |s: &Option<&str>| -> Option<bool> {
            let want = s.map_or(Value::Null, |s| Value::Str(s.into()));
            let row = got.iter().find(|(r, _, _)| r[0] == want);
            match row.map(|(r, _, d)| (&r[1], *d)) {
                Some((Value::Bool(b), 1)) => Some(*b),
                Some((Value::Null, 1)) => None,
                other => panic!("{func} on {s:?}: {other:?}"),
            }
        };
        Ok(STRINGS.iter().map(result).collect())
    }

    #[test]
    fn regexp_like_matches_like_datafusion() {
        let (t, f, null) = (Some(true), Some(false), None);
        // STRINGS: abc, xyz, NULL, ABBA, Köln, "", line1\nline2, ΣΊΣΥΦΟΣ
        // The function, its arguments after `g`, and the result for each of STRINGS.
        type Case = (&'static str, Vec<Expression>, [Option<bool>; 8]);
        let cases: Vec<Case> = vec![
            ("regexp_like", vec![text("b")], [t, f, null, f, f, f, f, f]),
            (
                "regexp_like",
                vec![text("^(a|x)")],
                [t, t, null, f, f, f, f, f],
            ),
            // The 'i' flag, and DataFusion's optimised forms of it (`~*`, `!~*`).
            (
                "regexp_like",
                vec![text("b"), text("i")],
                [t, f, null, t, f, f, f, f],
            ),
            ("regex_imatch", vec![text("b")], [t, f, null, t, f, f, f, f]),
            (
                "regex_not_imatch",
                vec![text("b")],
                [f, t, null, f, t, t, t, t],
            ),
            ("regex_match", vec![text("b")], [t, f, null, f, f, f, f, f]),
            (
                "regex_not_match",
                vec![text("b")],
                [f, t, null, t, t, t, t, t],
            ),
            // Unicode: the example of DataFusion's documentation, \w, case folding.
            (
                "regexp_like",
                vec![text("[a-zA-Z]ö[a-zA-Z]{2}")],
                [f, f, null, f, t, f, f, f],
            ),
            (
                "regexp_like",
                vec![text("^\\w+$")],
                [t, t, null, t, t, f, f, t],
            ),
            (
                "regexp_like",
                vec![text("σίσυφος"), text("i")],
                [f, f, null, f, f, f, f, t],
            ),
            // Other flags: multi-line, dot-all, more than one.
            (
                "regexp_like",
                vec![text("^line2$"), text("m")],
                [f, f, null, f, f, f, t, f],
            ),
            (
                "regexp_like",
                vec![text("^line2$")],
                [f, f, null, f, f, f, f, f],
            ),
            (
                "regexp_like",
                vec![text("1.line"), text("s")],
                [f, f, null, f, f, f, t, f],
            ),
            (
                "regexp_like",
                vec![text("1.LINE"), text("is")],
                [f, f, null, f, f, f, t, f],
            ),
            // The empty pattern matches every string.
            ("regexp_like", vec![text("")], [t, t, null, t, t, t, t, t]),
            // Empty flags are none: DataFusion's optimiser makes this `g ~ 'B'`.
            (
                "regexp_like",
                vec![text("B"), text("")],
                [f, f, null, t, f, f, f, f],
            ),
            // `.*` is `g IS NOT NULL` after DataFusion's optimiser, where it applies.
            ("regexp_like", vec![text(".*")], [t, t, f, t, t, t, t, t]),
            (
                "regexp_like",
                vec![text(".*"), text("i")],
                [t, t, f, t, t, t, t, t],
            ),
            ("regex_imatch", vec![text(".*")], [t, t, f, t, t, t, t, t]),
            ("regex_match", vec![text(".*")], [t, t, f, t, t, t, t, t]),
            (
                "regex_not_match",
                vec![text(".*")],
                [f, f, null, f, f, f, f, f],
            ),
            (
                "regexp_like",
                vec![text(".*"), null_text()],
                [t, t, null, t, t, t, t, t],
            ),
            (
                "regexp_like",
                vec![text(".*"), text("s")],
                [t, t, null, t, t, t, t, t],
            ),
            // NULL pattern: NULL everywhere; NULL flags: as if there were none (DataFusion).
            ("regexp_like", vec![null_text()], [null; 8]),
            ("regexp_like", vec![null_text(), text("i")], [null; 8]),
            ("regex_match", vec![null_text()], [null; 8]),
            (
                "regexp_like",
                vec![text("B"), null_text()],
                [f, f, null, t, f, f, f, f],
            ),
        ];
        for (func, args, want) in cases {
            let got = regex_rows(func, args).unwrap_or_else(|e| panic!("{func}: {e}"));
            assert_eq!(got, want, "{func}");
        }
    }

    #[test]
    fn regexp_like_refusals_are_clear_errors() {
        let bad_input =
            |func: &str, args: Vec<Expression>, needle: &str| match regex_rows(func, args) {
                Err(FlowError::BadInput(m)) => assert!(m.contains(needle), "{func}: {m}"),
                other => panic!("{func}: {other:?}"),
            };
        // Patterns that do not compile, with the regex crate's explanation.
        bad_input(
            "regexp_like",
            vec![text("(ab")],
            "regexp_like: regular expression \"(ab\" did not compile: unclosed group",
        );
        bad_input("regexp_like", vec![text("a{2,1}")], "did not compile");
        bad_input("regex_match", vec![text("[z-a]")], "did not compile");
        bad_input(
            "regex_imatch",
            vec![text("\\p{NotAClass}")],
            "did not compile",
        );
        // Flags: only what the regex crate knows; 'g' is refused as DataFusion does.
        bad_input("regexp_like", vec![text("a"), text("c")], "did not compile");
        // Too big once compiled: the regex crate's default limit, as in DataFusion.
        bad_input("regex_match", vec![text("\\w{1000}")], "exceeds size limit");
        bad_input(
            "regexp_like",
            vec![text("a"), text("-")],
            "dangling flag negation",
        );
        bad_input(
            "regexp_like",
            vec![text("a"), text("ig")],
            "\"global\" option",
        );
        bad_input(
            "regexp_like",
            vec![null_text(), text("g")],
            "\"global\" option",
        );
        bad_input(
            "regexp_like",
            vec![text("a"), text("i"), text("x")],
            "4 arguments",
        );
        bad_input("regex_match", vec![text("a"), text("i")], "3 arguments");
        let unsupported =
            |func: &str, args: Vec<Expression>, needle: &str| match regex_rows(func, args) {
                Err(FlowError::Unsupported(m)) => {
                    assert!(
                        m.contains(needle) && m.contains("not supported in flows"),
                        "{m}"
                    )
                }
                other => panic!("{func}: {other:?}"),
            };
        // The pattern or the flags from a column.
        unsupported(
            "regexp_like",
            vec![col(1)],
            "pattern that is not a constant",
        );
        unsupported(
            "regex_match",
            vec![col(1)],
            "pattern that is not a constant",
        );
        unsupported("regexp_like", vec![text("a"), col(1)], "flags argument");
        // Not over a string, or not returning a boolean.
        let plan = call_plan("regexp_like", vec![col(0), text("1")], bool_ty());
        match output(&plan) {
            Err(FlowError::Unsupported(m)) => assert!(m.contains("strings only"), "{m}"),
            other => panic!("{other:?}"),
        }
        let plan = call_plan("regexp_like", vec![col(1), text("1")], i64_ty(true));
        match output(&plan) {
            Err(FlowError::Unsupported(m)) => assert!(m.contains("returns a boolean"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn regex_patterns_compile_once_at_lowering() {
        let plan = call_plan(
            "regexp_like",
            vec![col(1), text("a+"), text("i")],
            bool_ty(),
        );
        let lowered = lower(&plan, &sources()).unwrap();
        let ops = &lowered.stages[0].ops;
        let Some(OpSpec::Project(exprs)) = ops.last() else {
            panic!("{ops:?}")
        };
        match exprs.as_slice() {
            [Expr::Call(Func::RegexMatch { re, negated: false }, args, DataType::Boolean)] => {
                assert_eq!(re.as_str(), "(?i)a+");
                assert_eq!(args.as_slice(), &[Expr::Col(1, DataType::Utf8)]);
            }
            other => panic!("{other:?}"),
        }
        // Lowering the same plan twice gives equal plans (the compiled patterns compare equal).
        assert_eq!(lower(&plan, &sources()).unwrap(), lowered);
        // Over a value that cannot be NULL, the result cannot be NULL either.
        let f = output(&call_plan(
            "regexp_like",
            vec![text("abc"), text("b")],
            ty(r#type::Kind::Bool(r#type::Boolean {
                type_variation_reference: 0,
                nullability: nullability(false),
            })),
        ))
        .unwrap();
        assert_eq!(f.data_type, DataType::Boolean);
        assert!(!f.nullable);
    }

    #[test]
    fn simple_case_compares_the_base_with_each_when() {
        use crate::types::{Batch, Value};
        use substrait::proto::expression::if_then::IfClause;
        use substrait::proto::expression::IfThen;
        // DataFusion's form of `CASE g WHEN 'abc' THEN 1 WHEN NULL THEN 2 ELSE 0 END`: the
        // base is a first clause without a result.
        let case = |when: Expression| Expression {
            rex_type: Some(RexType::IfThen(Box::new(IfThen {
                ifs: vec![
                    IfClause {
                        r#if: Some(col(1)),
                        then: None,
                    },
                    IfClause {
                        r#if: Some(when),
                        then: Some(lit(LiteralType::I64(1))),
                    },
                    IfClause {
                        r#if: Some(null_text()),
                        then: Some(lit(LiteralType::I64(2))),
                    },
                ],
                r#else: Some(Box::new(lit(LiteralType::I64(0)))),
            }))),
        };
        let plan = project_plan(
            "coalesce",
            vec![case(text("abc"))],
            i64_ty(true),
            vec![1, 3],
            vec!["g".into(), "x".into()],
        );
        let mut flow = crate::Flow::create(&plan, sources(), vec![]).unwrap();
        let rows: Vec<Vec<Value>> = [Some("abc"), Some("xyz"), None]
            .iter()
            .map(|s| {
                let g = s.map_or(Value::Null, |s| Value::Str(s.into()));
                vec![Value::Int(1), g, Value::UInt(0)]
            })
            .collect();
        let batch = Batch::from_rows(&sources()[0].fields, &rows, &[0; 3], &[1; 3]).unwrap();
        flow.push(0, batch).unwrap();
        let out = flow.output_schema();
        let mut got: Vec<(Value, Value)> = flow
            .tick(0, 100)
            .unwrap()
            .output
            .to_rows(&out)
            .into_iter()
            .map(|(r, _, _)| (r[0].clone(), r[1].clone()))
            .collect();
        got.sort_by_key(|(g, _)| format!("{g:?}"));
        assert_eq!(
            got,
            vec![
                (Value::Null, Value::Int(0)),
                (Value::Str("abc".into()), Value::Int(1)),
                (Value::Str("xyz".into()), Value::Int(0)),
            ]
        );
        // A string base against a number is refused, as a comparison would be.
        let plan = call_plan(
            "coalesce",
            vec![case(lit(LiteralType::I64(1)))],
            i64_ty(true),
        );
        match output(&plan) {
            Err(FlowError::Unsupported(m)) => assert!(m.contains("mixed comparison"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
