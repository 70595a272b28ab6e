use serde::{Deserialize, Serialize};

use super::*;

/// Sum of `v` per `k`; emits (k, sum) changes. With option `bad = 'width'`
/// it returns rows of the wrong width.
#[derive(Serialize, Deserialize, Default)]
struct Sums {
    sums: BTreeMap<String, i64>,
    last: BTreeMap<String, i64>,
    bad: bool,
}

impl Component for Sums {
    fn create(
        _plan: &[u8],
        sources: &[SourceSchema],
        options: &[(String, String)],
    ) -> Result<Self, FlowError> {
        column_index(&sources[0].fields, "v")?;
        Ok(Sums {
            bad: option(options, "bad").is_some(),
            ..Default::default()
        })
    }

    fn output_schema(&self) -> Vec<Field> {
        vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("total", DataType::Int64, false),
        ]
    }

    fn on_rows(&mut self, _source: u32, rows: Vec<InputRow>) -> Result<(), FlowError> {
        for (values, _, diff) in rows {
            let (Value::Str(k), Value::Int(v)) = (&values[0], &values[1]) else {
                return Err(bad("unexpected row"));
            };
            *self.sums.entry(k.clone()).or_default() += v * diff;
        }
        Ok(())
    }

    fn on_tick(&mut self, _now: i64) -> Result<Vec<OutputRow>, FlowError> {
        if self.bad {
            return Ok(vec![(vec![Value::Int(1)], 1)]);
        }
        let mut out = Vec::new();
        for (k, s) in &self.sums {
            match self.last.insert(k.clone(), *s) {
                Some(old) if old == *s => {}
                Some(old) => {
                    out.push((vec![Value::Str(k.clone()), Value::Int(old)], -1));
                    out.push((vec![Value::Str(k.clone()), Value::Int(*s)], 1));
                }
                None => out.push((vec![Value::Str(k.clone()), Value::Int(*s)], 1)),
            }
        }
        // Equal rows with opposite signs are consolidated away by the SDK.
        out.push((vec![Value::Str("ghost".into()), Value::Int(0)], 1));
        out.push((vec![Value::Str("ghost".into()), Value::Int(0)], -1));
        Ok(out)
    }
}

fn source() -> Vec<SourceSchema> {
    vec![SourceSchema {
        name: "t".into(),
        fields: vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ],
    }]
}

fn input(rows: &[(&str, i64, i64, i64)]) -> Batch {
    let values: Vec<Vec<Value>> = rows
        .iter()
        .map(|(k, v, _, _)| vec![Value::Str(k.to_string()), Value::Int(*v)])
        .collect();
    let times: Vec<i64> = rows.iter().map(|r| r.2).collect();
    let diffs: Vec<i64> = rows.iter().map(|r| r.3).collect();
    Batch::from_rows(&source()[0].fields, &values, &times, &diffs).unwrap()
}

fn out_rows(r: &Runner<Sums>, t: &TickOutput) -> Vec<(Vec<Value>, i64, i64)> {
    t.output.to_rows(&r.output_schema())
}

fn row(k: &str, total: i64, time: i64, diff: i64) -> (Vec<Value>, i64, i64) {
    (vec![Value::Str(k.into()), Value::Int(total)], time, diff)
}

#[test]
fn rows_wait_for_their_time_and_output_is_consolidated() {
    let mut r = Runner::<Sums>::create(b"", source(), &[]).unwrap();
    r.push(
        0,
        input(&[("a", 1, 10, 1), ("a", 2, 20, 1), ("b", 5, 10, 1)]),
    )
    .unwrap();
    let t = r.tick(15, 100).unwrap();
    assert_eq!(
        out_rows(&r, &t),
        vec![row("a", 1, 15, 1), row("b", 5, 15, 1)]
    );
    assert_eq!((t.more, t.next_wakeup), (false, Some(20)));
    let t = r.tick(20, 100).unwrap();
    assert_eq!(
        out_rows(&r, &t),
        vec![row("a", 1, 20, -1), row("a", 3, 20, 1)]
    );
    assert_eq!(t.next_wakeup, None);
    let t = r.tick(21, 100).unwrap();
    assert_eq!(t.output.rows, 0);
}

#[test]
fn output_drains_max_rows_at_a_time_and_survives_a_snapshot() {
    let mut r = Runner::<Sums>::create(b"", source(), &[]).unwrap();
    r.push(0, input(&[("a", 1, 0, 1), ("b", 2, 0, 1), ("c", 3, 0, 1)]))
        .unwrap();
    let t = r.tick(1, 2).unwrap();
    assert_eq!(out_rows(&r, &t), vec![row("a", 1, 1, 1), row("b", 2, 1, 1)]);
    assert!(t.more);
    // Input pushed while output is queued waits for the queue to drain.
    r.push(0, input(&[("a", 10, 0, 1)])).unwrap();
    let snap = r.snapshot().unwrap();
    let mut back = Runner::<Sums>::restore(&snap).unwrap();
    assert_eq!(back.snapshot().unwrap(), snap);
    for runner in [&mut r, &mut back] {
        let t = runner.tick(2, 2).unwrap();
        assert_eq!(
            t.output.to_rows(&runner.output_schema()),
            vec![row("c", 3, 1, 1)]
        );
        assert!(!t.more);
        let t = runner.tick(2, 2).unwrap();
        assert_eq!(
            t.output.to_rows(&runner.output_schema()),
            vec![row("a", 1, 2, -1), row("a", 11, 2, 1)]
        );
    }
}

#[test]
fn bad_input_and_bad_snapshots_are_errors_not_panics() {
    let mut r = Runner::<Sums>::create(b"", source(), &[]).unwrap();
    assert!(
        matches!(r.push(3, input(&[("a", 1, 0, 1)])), Err(FlowError::BadInput(m)) if m.contains("unknown source index 3"))
    );
    let mut b = input(&[("a", 1, 0, 1)]);
    b.columns.pop();
    assert!(matches!(r.push(0, b), Err(FlowError::BadInput(m)) if m.contains("source t")));
    let snap = r.snapshot().unwrap();
    let mut corrupt = snap.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let err = |s: &[u8]| match Runner::<Sums>::restore(s) {
        Err(FlowError::BadInput(m)) => m,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("restored"),
    };
    assert!(err(&corrupt).contains("checksum"));
    assert!(err(b"nonsense").contains("not a snapshot"));
    assert!(err(&snap[..snap.len() - 1]).contains("checksum"));
    let mut other_version = snap.clone();
    other_version[7] = 9;
    assert!(err(&other_version).contains("state version 9"));
    assert!(matches!(
        Runner::<Sums>::create(b"", vec![SourceSchema { name: "t".into(), fields: vec![] }], &[]),
        Err(FlowError::BadInput(m)) if m.contains("no column 'v'")
    ));
}

#[test]
fn rows_that_do_not_fit_the_output_schema_are_an_internal_error() {
    let mut r = Runner::<Sums>::create(b"", source(), &[("bad".into(), "width".into())]).unwrap();
    assert!(matches!(r.tick(0, 10), Err(FlowError::Internal(m)) if m.contains("1 values")));
}

#[test]
fn datums_order_totally() {
    let mut v = [
        Datum::Float(f64::NAN),
        Datum::Str("a".into()),
        Datum::Float(-1.0),
        Datum::Null,
        Datum::Int(3),
        Datum::Float(2.0),
    ];
    v.sort();
    assert_eq!(v[0], Datum::Null);
    assert_eq!(v[1], Datum::Int(3));
    assert_eq!(&v[2..4], &[Datum::Float(-1.0), Datum::Float(2.0)]);
    assert!(matches!(v[4], Datum::Float(x) if x.is_nan()));
    assert_eq!(
        Value::from(Datum::from(Value::Str("s".into()))),
        Value::Str("s".into())
    );
}
