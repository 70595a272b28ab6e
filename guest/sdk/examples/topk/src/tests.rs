use sandflow_sdk::{Batch, Runner};

use super::*;

fn source() -> Vec<SourceSchema> {
    vec![SourceSchema {
        name: "m".into(),
        fields: vec![
            Field::new("host", DataType::Utf8, false),
            Field::new("v", DataType::Float64, true),
            Field::new("ts", DataType::TimestampMillisecond, false),
        ],
    }]
}

fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Pushes (host, v, diff) rows at time 0 and ticks; returns the output rows.
fn step(r: &mut Runner<TopK>, rows: &[(&str, Option<f64>, i64)]) -> Vec<(String, i64, f64, i64)> {
    let values: Vec<Vec<Value>> = rows
        .iter()
        .map(|(h, v, _)| {
            vec![
                Value::Str(h.to_string()),
                v.map(Value::Float).unwrap_or(Value::Null),
                Value::Int(0),
            ]
        })
        .collect();
    let diffs: Vec<i64> = rows.iter().map(|r| r.2).collect();
    let b = Batch::from_rows(&source()[0].fields, &values, &vec![0; rows.len()], &diffs).unwrap();
    r.push(0, b).unwrap();
    let t = r.tick(1, 1000).unwrap();
    t.output
        .to_rows(&r.output_schema())
        .into_iter()
        .map(|(v, _, d)| match (&v[0], &v[1], &v[2]) {
            (Value::Str(h), Value::Int(rank), Value::Float(x)) => (h.clone(), *rank, *x, d),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// Applies output changes to a sink (a multiset of rows).
fn apply(sink: &mut BTreeMap<(String, i64), f64>, changes: &[(String, i64, f64, i64)]) {
    for (h, rank, v, d) in changes {
        if *d < 0 {
            assert_eq!(
                sink.remove(&(h.clone(), *rank)),
                Some(*v),
                "retracting {h} {rank}"
            );
        }
    }
    for (h, rank, v, d) in changes {
        if *d > 0 {
            assert_eq!(
                sink.insert((h.clone(), *rank), *v),
                None,
                "inserting {h} {rank}"
            );
        }
    }
}

#[test]
fn keeps_the_k_largest_per_key_under_deletes_and_a_snapshot() {
    let mut r = Runner::<TopK>::create(b"", source(), &opts(&[("k", "2")])).unwrap();
    assert_eq!(
        r.output_schema(),
        vec![
            Field::new("host", DataType::Utf8, false),
            Field::new("rank", DataType::Int64, false),
            Field::new("v", DataType::Float64, false),
        ]
    );
    let mut sink = BTreeMap::new();
    let c = step(
        &mut r,
        &[
            ("a", Some(1.0), 1),
            ("a", Some(5.0), 1),
            ("a", Some(3.0), 1),
            ("a", None, 1),
        ],
    );
    apply(&mut sink, &c);
    assert_eq!(sink.values().copied().collect::<Vec<_>>(), vec![5.0, 3.0]);
    // Deleting the largest brings the third back; a duplicate takes two ranks.
    let c = step(&mut r, &[("a", Some(5.0), -1), ("a", Some(1.0), 1)]);
    apply(&mut sink, &c);
    assert_eq!(sink.values().copied().collect::<Vec<_>>(), vec![3.0, 1.0]);
    let snap = r.snapshot().unwrap();
    let mut r = Runner::<TopK>::restore(&snap).unwrap();
    let c = step(&mut r, &[("a", Some(3.0), -1), ("b", Some(2.0), 1)]);
    apply(&mut sink, &c);
    assert_eq!(
        sink,
        BTreeMap::from([
            (("a".into(), 1), 1.0),
            (("a".into(), 2), 1.0),
            (("b".into(), 1), 2.0)
        ])
    );
    let c = step(
        &mut r,
        &[
            ("a", Some(1.0), -1),
            ("a", Some(1.0), -1),
            ("b", Some(2.0), -1),
        ],
    );
    apply(&mut sink, &c);
    assert!(sink.is_empty(), "{sink:?}");
    assert_eq!(r.component().state_size(), 0);
}

#[test]
fn options_are_checked_with_clear_errors() {
    let err = |o: &[(&str, &str)]| match Runner::<TopK>::create(b"", source(), &opts(o)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("created with {o:?}"),
    };
    assert!(err(&[("k", "0")]).contains("k must be a whole number"));
    assert!(err(&[("k", "x")]).contains("k must be a whole number"));
    assert!(err(&[("value", "nope")]).contains("no column 'nope'; the columns are host, v, ts"));
    let two = vec![source()[0].clone(), source()[0].clone()];
    assert!(matches!(
        Runner::<TopK>::create(b"", two, &[]),
        Err(FlowError::Unsupported(m)) if m.contains("exactly one source")
    ));
    // Defaults: key = first column, value = first numeric other column, k = 3.
    let r = Runner::<TopK>::create(b"", source(), &[]).unwrap();
    assert_eq!(r.component().k, 3);
    assert_eq!(
        (r.component().key_column, r.component().value_column),
        (0, 1)
    );
}
