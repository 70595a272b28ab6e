//! Hostile guests do not hurt the host: each failure is confined to its own
//! flow instance with a clear error, and a well-behaved flow in the same
//! runtime keeps producing correct output meanwhile.

use std::time::Duration;

use sandflow::runtime::{FlowLimits, RuntimeConfig, RuntimeError};
use sandflow_engine::types::{Batch, DataType, Field, SourceSchema, Value};
use sandflow_tests::engine::Runtime;
use sandflow_tests::engine::{plan, wasm_runtime};

fn hostile_runtime() -> Runtime {
    let bytes = std::fs::read(env!("HOSTILE_GUEST_WASM"))
        .expect("hostile guest was built by tests/build.rs");
    Runtime::with_component(RuntimeConfig::default(), &bytes).expect("hostile runtime")
}

fn limits() -> FlowLimits {
    FlowLimits {
        memory: 32 << 20,
        cpu_per_call: Duration::from_millis(300),
        max_output_rows: 1000,
        ..FlowLimits::default()
    }
}

fn fail_on_tick(rt: &Runtime, mode: &str) -> RuntimeError {
    let mut flow = rt
        .create_flow(mode.as_bytes(), &[], &[], limits())
        .unwrap_or_else(|e| panic!("{mode}: create failed: {e}"));
    let err = flow
        .tick(1)
        .err()
        .unwrap_or_else(|| panic!("{mode}: tick succeeded"));
    // The instance is poisoned: later calls fail fast with the same reason.
    let again = flow.tick(2).expect_err("poisoned instance accepted a call");
    assert!(
        matches!(again, RuntimeError::Poisoned { .. }),
        "{mode}: {again}"
    );
    assert!(
        again.to_string().contains(&err.to_string()),
        "{mode}: {again}"
    );
    err
}

#[test]
fn each_hostile_behaviour_fails_only_its_flow_with_a_clear_error() {
    let rt = hostile_runtime();
    // A control flow in the same runtime, ticked between every attack.
    let mut control = rt
        .create_flow(b"ok", &[], &[], limits())
        .expect("control flow");
    let mut expected_n = 0;
    let mut check_control = |control: &mut sandflow::runtime::FlowInstance| {
        expected_n += 1;
        let out = control
            .tick(expected_n)
            .expect("control flow keeps working");
        let rows = out.output.to_rows(control.output_schema());
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].0[0], Value::Int(expected_n));
    };

    type IsExpected = fn(&RuntimeError) -> bool;
    let cases: &[(&str, IsExpected, &str)] = &[
        (
            "loop",
            |e| matches!(e, RuntimeError::CpuLimit { .. }),
            "CPU budget",
        ),
        (
            "alloc",
            |e| matches!(e, RuntimeError::MemoryLimit { .. }),
            "memory limit",
        ),
        (
            "recurse",
            |e| matches!(e, RuntimeError::Trap { .. }),
            "stack",
        ),
        (
            "panic",
            |e| matches!(e, RuntimeError::Trap { .. }),
            "panics on purpose",
        ),
        (
            "out-of-bounds",
            |e| matches!(e, RuntimeError::Trap { .. }),
            "out of bounds memory access",
        ),
        (
            "huge-output",
            |e| matches!(e, RuntimeError::Contract { .. }),
            "more than",
        ),
        (
            "wrong-lengths",
            |e| matches!(e, RuntimeError::Contract { .. }),
            "malformed",
        ),
        (
            "bad-offsets",
            |e| matches!(e, RuntimeError::Contract { .. }),
            "offsets",
        ),
        (
            "bad-utf8",
            |e| matches!(e, RuntimeError::Contract { .. }),
            "UTF-8",
        ),
        (
            "extra-columns",
            |e| matches!(e, RuntimeError::Contract { .. }),
            "columns",
        ),
        (
            "bad-list",
            |e| matches!(e, RuntimeError::Contract { .. }),
            "element flag 7",
        ),
    ];
    for (mode, kind, words) in cases {
        check_control(&mut control);
        let err = fail_on_tick(&rt, mode);
        assert!(kind(&err), "{mode}: unexpected error kind: {err:?}");
        assert!(
            err.to_string().contains(words),
            "{mode}: error does not say '{words}': {err}"
        );
    }
    check_control(&mut control);
    // A list column must name its element type: refused at create.
    let err = rt
        .create_flow(b"list-without-item", &[], &[], limits())
        .err()
        .expect("a list without an element type is refused");
    assert!(
        matches!(&err, RuntimeError::Contract { message } if message.contains("scalar element type")),
        "{err}"
    );
    check_control(&mut control);
}

#[test]
fn a_looping_flow_does_not_stall_a_flow_on_another_thread() {
    let rt = std::sync::Arc::new(hostile_runtime());
    let rt2 = rt.clone();
    let looping = std::thread::spawn(move || {
        let mut flow = rt2
            .create_flow(
                b"loop",
                &[],
                &[],
                FlowLimits {
                    cpu_per_call: Duration::from_secs(2),
                    ..limits()
                },
            )
            .expect("create");
        flow.tick(1).expect_err("loop stopped")
    });
    let mut control = rt.create_flow(b"ok", &[], &[], limits()).expect("control");
    let started = std::time::Instant::now();
    let mut ticks = 0;
    while !looping.is_finished() {
        control.tick(ticks).expect("control tick");
        ticks += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let err = looping.join().expect("looping thread");
    assert!(matches!(err, RuntimeError::CpuLimit { .. }), "{err}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "loop was stopped too early"
    );
    assert!(
        ticks > 10,
        "the control flow made only {ticks} ticks while the other looped"
    );
}

#[test]
fn the_real_guest_is_stopped_by_its_memory_cap_and_others_continue() {
    let sources = vec![SourceSchema {
        name: "t".into(),
        fields: vec![
            Field::new("g", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ],
    }];
    let plan = plan(
        "SELECT g, count(DISTINCT s) AS d FROM t GROUP BY g",
        &sources,
    );
    let rt = wasm_runtime();
    let small = FlowLimits {
        memory: 24 << 20,
        cpu_per_call: Duration::from_secs(30),
        max_output_rows: 100_000,
        ..FlowLimits::default()
    };
    let mut greedy = rt
        .create_flow(&plan, &sources, &[], small)
        .expect("greedy flow");
    let mut modest = rt
        .create_flow(&plan, &sources, &[], small)
        .expect("modest flow");
    let mut failed = None;
    for round in 0..200i64 {
        let rows: Vec<Vec<Value>> = (0..5000)
            .map(|i| {
                vec![
                    Value::Int(i % 7),
                    Value::Str(format!("distinct-value-{round}-{i}-{}", "x".repeat(40))),
                ]
            })
            .collect();
        let n = rows.len();
        let batch = Batch::from_rows(&sources[0].fields, &rows, &vec![round; n], &vec![1; n])
            .expect("batch");
        let result = greedy.push(0, batch).and_then(|_| greedy.tick(round));
        if let Err(e) = result {
            failed = Some(e);
            break;
        }
    }
    let err = failed.expect("a flow holding ever more distinct strings must hit a 24 MiB cap");
    assert!(matches!(err, RuntimeError::MemoryLimit { .. }), "{err:?}");
    assert!(err.to_string().contains("memory limit"), "{err}");

    let rows = vec![
        vec![Value::Int(1), Value::Str("a".into())],
        vec![Value::Int(1), Value::Str("b".into())],
    ];
    let batch = Batch::from_rows(&sources[0].fields, &rows, &[0, 0], &[1, 1]).expect("batch");
    modest.push(0, batch).expect("modest push");
    let out = modest.tick(0).expect("modest tick");
    let got = out.output.to_rows(modest.output_schema());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, vec![Value::Int(1), Value::Int(2)]);
}

/// The engine grows its memory in 2 MiB steps (for huge pages, see the
/// sandbox's `memory.rs`). Under a limit that is not a whole number of steps
/// the last step is refused without a trap and the engine takes only what it
/// needs: it grows past its last whole step, up to its limit.
#[test]
fn the_real_guest_grows_in_steps_and_into_a_limit_between_them() {
    const STEP: usize = 2 << 20;
    let sources = vec![SourceSchema {
        name: "t".into(),
        fields: vec![Field::new("g", DataType::Int64, false)],
    }];
    let plan = plan("SELECT g, count(*) AS n FROM t GROUP BY g", &sources);
    let rt = wasm_runtime();
    let limits = |memory| FlowLimits {
        memory,
        cpu_per_call: Duration::from_secs(30),
        max_output_rows: 100_000,
        ..FlowLimits::default()
    };
    let round = |r: i64| {
        let rows: Vec<Vec<Value>> = (0..1000).map(|i| vec![Value::Int(r * 1000 + i)]).collect();
        Batch::from_rows(&sources[0].fields, &rows, &[r; 1000], &[1; 1000]).expect("batch")
    };
    // A flow grows its memory to the next step at once, and under a limit
    // half a step past that, into the half step.
    let start = rt
        .create_flow(&plan, &sources, &[], limits(64 << 20))
        .expect("flow")
        .memory_size();
    let step = start.next_multiple_of(STEP);
    let limit = step + STEP / 2;
    let mut flow = rt
        .create_flow(&plan, &sources, &[], limits(limit))
        .expect("flow");
    let mut sizes = vec![flow.memory_size()];
    let mut r = 0;
    while flow.memory_size() <= step {
        assert!(r < 1000, "the flow never grew past {step} bytes: {sizes:?}");
        flow.push(0, round(r))
            .and_then(|_| flow.tick(r))
            .unwrap_or_else(|e| panic!("round {r} at {sizes:?}: {e}"));
        if sizes.last() != Some(&flow.memory_size()) {
            sizes.push(flow.memory_size());
        }
        r += 1;
    }
    assert_eq!(sizes.get(1), Some(&step), "{sizes:?}");
    let now = flow.memory_size();
    assert!(
        now > step && now <= limit,
        "{sizes:?} under a limit of {limit}"
    );
}

#[test]
fn bytes_that_are_not_a_valid_component_are_refused_before_anything_runs() {
    let bad = b"\x00asm\x0d\x00\x01\x00garbage";
    let err = Runtime::with_component(RuntimeConfig::default(), bad)
        .err()
        .expect("garbage bytes accepted");
    assert!(matches!(err, RuntimeError::Setup { .. }), "{err}");
}

/// A minimal component (binary format, written by hand) whose only content
/// is an import of `evil:net/socket`, a function outside the contract and
/// outside WASI.
fn component_importing_evil_socket() -> Vec<u8> {
    let name = b"evil:net/socket";
    let mut bytes = b"\x00asm\x0d\x00\x01\x00".to_vec();
    // Type section: one `(func)` type with no params and no results.
    bytes.extend_from_slice(&[0x07, 0x05, 0x01, 0x40, 0x00, 0x01, 0x00]);
    // Import section: `(import "evil:net/socket" (func (type 0)))`.
    let mut import = vec![0x01, 0x00, name.len() as u8];
    import.extend_from_slice(name);
    import.extend_from_slice(&[0x01, 0x00]);
    bytes.push(0x0a);
    bytes.push(import.len() as u8);
    bytes.extend_from_slice(&import);
    bytes
}

#[test]
fn a_component_importing_beyond_the_contract_is_refused_at_load() {
    let err = Runtime::with_component(RuntimeConfig::default(), &component_importing_evil_socket())
        .err()
        .expect("a component with a foreign import was accepted");
    let text = err.to_string();
    assert!(matches!(err, RuntimeError::Setup { .. }), "{text}");
    // Refused by the linker (nothing to satisfy the import), not by the parser.
    assert!(text.contains("does not fit the sandbox"), "{text}");
    assert!(text.contains("evil:net/socket"), "{text}");
}
