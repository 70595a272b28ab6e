//! The reference workload (see DESIGN.md "Measuring"), usable from benches and examples without
//! DataFusion: `SELECT k, count(*), sum(v) FROM t GROUP BY k` with key = i % 1000, value = i.

use prost::Message;
use substrait::proto::aggregate_rel::{Grouping, Measure};
use substrait::proto::expression::field_reference::{ReferenceType, RootType};
use substrait::proto::expression::{reference_segment, FieldReference, ReferenceSegment, RexType};
use substrait::proto::extensions::simple_extension_declaration::{ExtensionFunction, MappingType};
use substrait::proto::extensions::SimpleExtensionDeclaration;
use substrait::proto::function_argument::ArgType;
use substrait::proto::read_rel::{NamedTable, ReadType};
use substrait::proto::{
    plan_rel, r#type, rel, AggregateFunction, AggregateRel, Expression, FunctionArgument,
    NamedStruct, Plan, PlanRel, ReadRel, Rel, RelRoot, Type,
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

/// Substrait bytes of `SELECT k, count(*), sum(v) FROM t GROUP BY k`.
pub fn reference_plan() -> Vec<u8> {
    let read = Rel {
        rel_type: Some(rel::RelType::Read(Box::new(ReadRel {
            base_schema: Some(NamedStruct {
                names: vec!["k".into(), "v".into()],
                r#struct: Some(r#type::Struct {
                    types: vec![i64_type(), i64_type()],
                    type_variation_reference: 0,
                    nullability: r#type::Nullability::Required as i32,
                }),
            }),
            read_type: Some(ReadType::NamedTable(NamedTable {
                names: vec!["t".into()],
                advanced_extension: None,
            })),
            ..Default::default()
        }))),
    };
    #[allow(deprecated)]
    let agg = Rel {
        rel_type: Some(rel::RelType::Aggregate(Box::new(AggregateRel {
            input: Some(Box::new(read)),
            grouping_expressions: vec![field(0)],
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
                            arg_type: Some(ArgType::Value(field(1))),
                        }],
                        ..Default::default()
                    }),
                    filter: None,
                },
            ],
            ..Default::default()
        }))),
    };
    #[allow(deprecated)]
    let plan = Plan {
        extensions: vec![ext(0, "count"), ext(1, "sum")],
        relations: vec![PlanRel {
            rel_type: Some(plan_rel::RelType::Root(RelRoot {
                input: Some(agg),
                names: vec!["k".into(), "count(*)".into(), "sum(t.v)".into()],
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
