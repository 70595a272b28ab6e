//! The reference workload (see DESIGN.md "Measuring"), usable from benches and examples without
//! DataFusion: `SELECT k, count(*), sum(v) FROM t GROUP BY k` with key = i % 1000, value = i.

use prost::Message;
use substrait::proto::aggregate_rel::{Grouping, Measure};
use substrait::proto::expression::field_reference::{ReferenceType, RootType};
use substrait::proto::expression::ScalarFunction;
use substrait::proto::expression::{reference_segment, FieldReference, ReferenceSegment, RexType};
use substrait::proto::extensions::simple_extension_declaration::{ExtensionFunction, MappingType};
use substrait::proto::extensions::SimpleExtensionDeclaration;
use substrait::proto::function_argument::ArgType;
use substrait::proto::read_rel::{NamedTable, ReadType};
use substrait::proto::{
    join_rel, plan_rel, r#type, rel, AggregateFunction, AggregateRel, Expression, FunctionArgument,
    JoinRel, NamedStruct, Plan, PlanRel, ReadRel, Rel, RelRoot, Type,
};

use crate::types::{Batch, Column, DataType, Field, SourceSchema};
use crate::Flow;

fn field(i: i32) -> Expression {
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

fn i64_type() -> Type {
    Type {
        kind: Some(r#type::Kind::I64(r#type::I64 {
            type_variation_reference: 0,
            nullability: r#type::Nullability::Required as i32,
        })),
    }
}

fn ext(anchor: u32, name: &str) -> SimpleExtensionDeclaration {
    #[allow(deprecated)]
    SimpleExtensionDeclaration {
        mapping_type: Some(MappingType::ExtensionFunction(ExtensionFunction {
            function_anchor: anchor,
            name: name.to_string(),
            ..Default::default()
        })),
    }
}

/// A read of table `table` with two Int64 columns named `cols`.
fn read_two_ints(table: &str, cols: [&str; 2]) -> Rel {
    Rel {
        rel_type: Some(rel::RelType::Read(Box::new(ReadRel {
            base_schema: Some(NamedStruct {
                names: cols.iter().map(|c| c.to_string()).collect(),
                r#struct: Some(r#type::Struct {
                    types: vec![i64_type(), i64_type()],
                    type_variation_reference: 0,
                    nullability: r#type::Nullability::Required as i32,
                }),
            }),
            read_type: Some(ReadType::NamedTable(NamedTable {
                names: vec![table.into()],
                advanced_extension: None,
            })),
            ..Default::default()
        }))),
    }
}

/// `count(*)` (function 0) and `sum(field sum_of)` (function 1), grouped by field `group`.
#[allow(deprecated)]
fn count_and_sum(input: Rel, group: i32, sum_of: i32) -> Rel {
    Rel {
        rel_type: Some(rel::RelType::Aggregate(Box::new(AggregateRel {
            input: Some(Box::new(input)),
            grouping_expressions: vec![field(group)],
            groupings: vec![Grouping {
                grouping_expressions: vec![],
                expression_references: vec![0],
            }],
            measures: vec![
                Measure {
                    measure: Some(AggregateFunction {
                        function_reference: 0,
                        ..Default::default()
                    }),
                    filter: None,
                },
                Measure {
                    measure: Some(AggregateFunction {
                        function_reference: 1,
                        arguments: vec![FunctionArgument {
                            arg_type: Some(ArgType::Value(field(sum_of))),
                        }],
                        ..Default::default()
                    }),
                    filter: None,
                },
            ],
            ..Default::default()
        }))),
    }
}

/// Substrait bytes of `SELECT k, count(*), sum(v) FROM t GROUP BY k`.
pub fn reference_plan() -> Vec<u8> {
    let agg = count_and_sum(read_two_ints("t", ["k", "v"]), 0, 1);
    plan_bytes(agg, &["count", "sum"], &["k", "count(*)", "sum(t.v)"])
}

/// The bytes of a plan whose root is `root`, with functions `functions` (anchors 0, 1, ...)
/// and output column names `names`.
fn plan_bytes(root: Rel, functions: &[&str], names: &[&str]) -> Vec<u8> {
    #[allow(deprecated)]
    let plan = Plan {
        extensions: functions
            .iter()
            .enumerate()
            .map(|(i, f)| ext(i as u32, f))
            .collect(),
        relations: vec![PlanRel {
            rel_type: Some(plan_rel::RelType::Root(RelRoot {
                input: Some(root),
                names: names.iter().map(|n| n.to_string()).collect(),
            })),
        }],
        ..Default::default()
    };
    plan.encode_to_vec()
}

pub fn reference_sources() -> Vec<SourceSchema> {
    vec![SourceSchema {
        name: "t".into(),
        fields: vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ],
    }]
}

/// One batch of the workload: rows `start..start+len` (`len` > 0).
pub fn reference_batch(start: u64, len: u32) -> Batch {
    let ks = (start..start + len as u64)
        .map(|i| (i % 1000) as i64)
        .collect();
    let vs = (start..start + len as u64).map(|i| i as i64).collect();
    Batch {
        rows: len,
        columns: vec![
            Column {
                ints: ks,
                ..Default::default()
            },
            Column {
                ints: vs,
                ..Default::default()
            },
        ],
        // One time and one diff for all rows, as the host sends a write.
        times: vec![0],
        diffs: vec![1],
    }
}

/// Runs the workload (`total` rows in batches of `batch`, a tick after each batch, every
/// output row read); returns the number of output rows seen. Batches are built up front by
/// the caller's timer-free loop here so that only push + tick are on the hot path.
pub fn run_reference_workload(batches: Vec<Batch>) -> Result<u64, crate::FlowError> {
    let mut flow = Flow::create(&reference_plan(), reference_sources(), vec![])?;
    let mut out_rows = 0u64;
    let mut checksum = 0u64;
    for b in batches {
        flow.push(0, b)?;
        loop {
            let t = flow.tick(0, u32::MAX)?;
            out_rows += t.output.rows as u64;
            // "Read" every delta.
            if let Some(c) = t.output.columns.get(2) {
                checksum = c
                    .ints
                    .iter()
                    .fold(checksum, |a, x| a.wrapping_add(*x as u64));
            }
            if !t.more {
                break;
            }
        }
    }
    std::hint::black_box(checksum);
    Ok(out_rows)
}

/// Substrait bytes of the join workload (issue "Flows over several sources", `make bench`'s
/// joins benchmark): `SELECT d.a, count(*), sum(f.v) FROM f JOIN d ON f.k = d.k GROUP BY d.a`
/// over `f (k, v)` and `d (k, a)`, as DataFusion plans it (the join, then the aggregate over
/// its columns `f.k, f.v, d.k, d.a`).
pub fn join_plan() -> Vec<u8> {
    #[allow(deprecated)]
    let equal = Expression {
        rex_type: Some(RexType::ScalarFunction(ScalarFunction {
            function_reference: 2,
            arguments: [0, 2]
                .into_iter()
                .map(|i| FunctionArgument {
                    arg_type: Some(ArgType::Value(field(i))),
                })
                .collect(),
            output_type: Some(Type {
                kind: Some(r#type::Kind::Bool(r#type::Boolean {
                    type_variation_reference: 0,
                    nullability: r#type::Nullability::Required as i32,
                })),
            }),
            ..Default::default()
        })),
    };
    let join = Rel {
        rel_type: Some(rel::RelType::Join(Box::new(JoinRel {
            left: Some(Box::new(read_two_ints("f", ["k", "v"]))),
            right: Some(Box::new(read_two_ints("d", ["k", "a"]))),
            expression: Some(Box::new(equal)),
            r#type: join_rel::JoinType::Inner as i32,
            ..Default::default()
        }))),
    };
    let agg = count_and_sum(join, 3, 1);
    plan_bytes(
        agg,
        &["count", "sum", "equal"],
        &["a", "count(*)", "sum(f.v)"],
    )
}

/// The join workload's sources: `f (k, v)` (facts) and `d (k, a)` (the dimension).
pub fn join_sources() -> Vec<SourceSchema> {
    ["f", "d"]
        .into_iter()
        .zip([["k", "v"], ["k", "a"]])
        .map(|(name, cols)| SourceSchema {
            name: name.into(),
            fields: cols
                .iter()
                .map(|c| Field::new(*c, DataType::Int64, false))
                .collect(),
        })
        .collect()
}

/// The join workload's dimension rows: `(k, k % attrs)` for k in `0..dims`.
pub fn join_dims(dims: i64, attrs: i64) -> Batch {
    Batch {
        rows: dims as u32,
        columns: vec![
            Column {
                ints: (0..dims).collect(),
                ..Default::default()
            },
            Column {
                ints: (0..dims).map(|k| k % attrs).collect(),
                ..Default::default()
            },
        ],
        times: vec![0],
        diffs: vec![1],
    }
}

/// Fact batch `b` of `len` rows: `(i % dims, i)` for i in `b*len..(b+1)*len`.
pub fn join_facts(b: usize, len: usize, dims: i64) -> Batch {
    let start = (b * len) as i64;
    let range = start..start + len as i64;
    Batch {
        rows: len as u32,
        columns: vec![
            Column {
                ints: range.clone().map(|i| i % dims).collect(),
                ..Default::default()
            },
            Column {
                ints: range.collect(),
                ..Default::default()
            },
        ],
        times: vec![b as i64 + 1],
        diffs: vec![1],
    }
}

/// Runs the join workload: the dimension rows and a tick, then each fact batch and a tick,
/// every output row read. Returns (output rows, checksum of every value and diff), the
/// figures `make bench`'s joins benchmark compares across engines.
pub fn run_join_workload(dims: Batch, facts: Vec<Batch>) -> Result<(u64, i64), crate::FlowError> {
    let mut flow = Flow::create(&join_plan(), join_sources(), vec![])?;
    let (mut rows, mut sum) = (0u64, 0i64);
    let batches = std::iter::once((1u32, dims)).chain(facts.into_iter().map(|b| (0u32, b)));
    for (i, (source, b)) in batches.enumerate() {
        flow.push(source, b)?;
        loop {
            let t = flow.tick(i as i64, u32::MAX)?;
            rows += t.output.rows as u64;
            for c in &t.output.columns {
                sum = c.ints.iter().fold(sum, |a, v| a.wrapping_add(*v));
            }
            sum = t.output.diffs.iter().fold(sum, |a, d| a.wrapping_add(*d));
            if !t.more {
                break;
            }
        }
    }
    Ok((rows, sum))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_drained_in_parts_is_the_output_drained_at_once() {
        let drain = |max: u32| {
            let mut flow = Flow::create(&reference_plan(), reference_sources(), vec![]).unwrap();
            flow.push(0, reference_batch(0, 2500)).unwrap();
            let (mut rows, mut parts) = (Vec::new(), 0);
            loop {
                let t = flow.tick(0, max).unwrap();
                assert!(t.output.rows <= max);
                parts += 1;
                rows.extend(t.output.to_rows(&flow.output_schema()));
                if !t.more {
                    break;
                }
            }
            (rows, parts)
        };
        let (whole, one) = drain(u32::MAX);
        let (parted, many) = drain(300);
        assert_eq!(whole.len(), 1000);
        assert_eq!((one, many), (1, 4));
        assert_eq!(parted, whole);
    }
}
