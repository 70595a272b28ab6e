//! A hostile implementation of sandflow's flow contract. The behaviour is chosen
//! by the plan bytes given to `create` — either the mode name itself, or
//! (when the database hands it a real Substrait plan) the first
//! `hostile_<mode>` marker in the plan, i.e. a source table named after the
//! mode with `_` for `-` — and triggered on `tick` (so the host first sees a
//! well-behaved create, as with a real flow that turns bad later):
//!
//! - `ok`: returns one valid row per tick (a well-behaved control flow).
//! - `endless-output`: returns `max-rows` valid rows and "more" forever.
//! - `loop`: spins forever.
//! - `alloc`: allocates without bound.
//! - `recurse`: recurses without bound.
//! - `panic`: panics with a message.
//! - `out-of-bounds`: reads the first byte past its linear memory.
//! - `chatty`: prints a line to stdout, a 5000-byte line and 2000 more lines
//!   to stderr on every tick, then returns one valid row.
//! - `huge-output`: returns more rows than `max-rows`.
//! - `wrong-lengths`: rows count disagrees with the column's list lengths.
//! - `bad-offsets`: string offsets out of range.
//! - `bad-utf8`: a string column with invalid UTF-8.
//! - `extra-columns`: more columns than the declared output schema.
//! - `bad-list`: declares `s` a list of integers and sends an element
//!   with flag 7.
//! - `list-without-item`: declares `s` a list without an element type
//!   (refused when the host reads the output schema, at create).
//! - `create-loop`: spins forever in `create` (the only mode that
//!   misbehaves before a tick).
//! - `corrupt-snapshot`: ticks like `ok`, but its snapshots are junk and
//!   `restore` panics on them (a component that breaks its own state).
//!
//! Only built for wasm32; natively the crate is empty.

#[cfg(target_arch = "wasm32")]
mod component {
    use std::cell::Cell;

    wit_bindgen::generate!({ path: "../../wit", world: "flow-engine" });

    use exports::sandflow::flow::engine::{Guest, GuestFlow};
    use sandflow::flow::types::{
        Batch, Column, DataType, Field, FlowError, SourceSchema, TickOutput,
    };

    struct Component;

    struct Evil {
        mode: String,
        ticks: Cell<i64>,
    }

    impl Guest for Component {
        type Flow = Evil;
    }

    fn string_column(values: &[&[u8]]) -> Column {
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for v in values {
            bytes.extend_from_slice(v);
            offsets.push(bytes.len() as u32);
        }
        Column {
            ints: vec![],
            floats: vec![],
            bytes,
            offsets,
            nulls: vec![],
        }
    }

    fn one_row(now: i64, n: i64) -> Batch {
        Batch {
            rows: 1,
            columns: vec![
                Column {
                    ints: vec![n],
                    floats: vec![],
                    bytes: vec![],
                    offsets: vec![],
                    nulls: vec![],
                },
                string_column(&[b"ok"]),
            ],
            times: vec![now],
            diffs: vec![1],
        }
    }

    /// `rows` valid rows numbered from `first`, each with the string "x".
    fn numbered_rows(now: i64, first: i64, rows: u32) -> Batch {
        let strs: Vec<&[u8]> = (0..rows).map(|_| &b"x"[..]).collect();
        Batch {
            rows,
            columns: vec![
                Column {
                    ints: (0..rows as i64).map(|i| first + i).collect(),
                    floats: vec![],
                    bytes: vec![],
                    offsets: vec![],
                    nulls: vec![],
                },
                string_column(&strs),
            ],
            times: vec![now; rows as usize],
            diffs: vec![1; rows as usize],
        }
    }

    /// The mode a plan asks for (see the crate docs).
    fn mode_of(plan: &[u8]) -> Option<String> {
        if let Ok(text) = std::str::from_utf8(plan) {
            if !text.is_empty()
                && text
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            {
                return Some(text.to_string());
            }
        }
        let marker = b"hostile_";
        let at = plan.windows(marker.len()).position(|w| w == marker)?;
        let rest = &plan[at + marker.len()..];
        let len = rest
            .iter()
            .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || **b == b'_')
            .count();
        let mode: String = rest[..len]
            .iter()
            .map(|&b| if b == b'_' { '-' } else { b as char })
            .collect();
        (!mode.is_empty()).then_some(mode)
    }

    /// How a `corrupt-snapshot` flow's snapshots start.
    const CORRUPT: &[u8] = b"corrupt:";

    #[allow(unconditional_recursion)]
    fn recurse(depth: u64) -> u64 {
        let local = std::hint::black_box([depth; 4]);
        recurse(depth + 1).wrapping_add(local[(depth % 4) as usize])
    }

    impl GuestFlow for Evil {
        fn create(
            plan: Vec<u8>,
            _sources: Vec<SourceSchema>,
            _options: Vec<(String, String)>,
        ) -> Result<exports::sandflow::flow::engine::Flow, FlowError> {
            let mode = mode_of(&plan).ok_or_else(|| {
                FlowError::BadInput(
                    "plan must be a mode name or name a hostile_<mode> table".into(),
                )
            })?;
            if mode == "create-loop" {
                // Spins where the host first calls in, before any tick.
                let mut n = 0u64;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            Ok(exports::sandflow::flow::engine::Flow::new(Evil {
                mode,
                ticks: Cell::new(0),
            }))
        }

        fn output_schema(&self) -> Vec<Field> {
            vec![
                Field {
                    name: "n".into(),
                    data_type: DataType::Int64,
                    nullable: false,
                    item: None,
                },
                Field {
                    name: "s".into(),
                    data_type: match self.mode.as_str() {
                        "bad-list" | "list-without-item" => DataType::List,
                        _ => DataType::Utf8,
                    },
                    nullable: false,
                    item: (self.mode == "bad-list").then_some(DataType::Int64),
                },
            ]
        }

        fn push(&self, _source: u32, _input: Batch) -> Result<(), FlowError> {
            Ok(())
        }

        fn tick(&self, now: i64, max_rows: u32) -> Result<TickOutput, FlowError> {
            let n = self.ticks.get() + 1;
            self.ticks.set(n);
            let output = match self.mode.as_str() {
                "ok" | "corrupt-snapshot" => one_row(now, n),
                "loop" => {
                    let mut x = n as u64;
                    loop {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                }
                "alloc" => {
                    let mut hoard: Vec<Vec<u8>> = Vec::new();
                    loop {
                        hoard.push(vec![1u8; 1 << 20]);
                        std::hint::black_box(&hoard);
                    }
                }
                "recurse" => {
                    let r = recurse(0);
                    one_row(now, r as i64)
                }
                "panic" => panic!("hostile guest panics on purpose"),
                "out-of-bounds" => {
                    let end = core::arch::wasm32::memory_size(0) * 65536;
                    // SAFETY: none; this is the attack. The sandbox must trap it.
                    let byte = unsafe { core::ptr::read_volatile(end as *const u8) };
                    one_row(now, i64::from(byte))
                }
                "chatty" => {
                    println!("chatty says hello at tick {n}");
                    eprintln!("{}", "x".repeat(5000));
                    for i in 0..2000 {
                        eprintln!("chatty tick {n} line {i}");
                    }
                    one_row(now, n)
                }
                "huge-output" => numbered_rows(now, 0, max_rows.saturating_add(1)),
                "endless-output" => {
                    return Ok(TickOutput {
                        output: numbered_rows(now, n * 10_000, max_rows.clamp(1, 10_000)),
                        more: true,
                        next_wakeup: None,
                    });
                }
                "wrong-lengths" => {
                    let mut b = one_row(now, n);
                    b.rows = 3;
                    b
                }
                "bad-offsets" => {
                    let mut b = one_row(now, n);
                    b.columns[1].offsets = vec![0, 1000];
                    b
                }
                "bad-utf8" => {
                    let mut b = one_row(now, n);
                    b.columns[1] = string_column(&[&[0xff, 0xfe]]);
                    b
                }
                "bad-list" => {
                    let mut b = one_row(now, n);
                    b.columns[1] = string_column(&[&[7, 0, 0]]);
                    b
                }
                "extra-columns" => {
                    let mut b = one_row(now, n);
                    b.columns.push(string_column(&[b"extra"]));
                    b
                }
                other => {
                    return Err(FlowError::Unsupported(format!(
                        "unknown hostile mode {other}"
                    )))
                }
            };
            Ok(TickOutput {
                output,
                more: false,
                next_wakeup: None,
            })
        }

        fn snapshot(&self) -> Result<Vec<u8>, FlowError> {
            if self.mode == "corrupt-snapshot" {
                let mut junk = CORRUPT.to_vec();
                junk.extend(std::iter::repeat_n(0xff, 4096));
                return Ok(junk);
            }
            Ok(self.mode.as_bytes().to_vec())
        }

        fn restore(state: Vec<u8>) -> Result<exports::sandflow::flow::engine::Flow, FlowError> {
            if state.starts_with(CORRUPT) {
                panic!("hostile guest cannot read the snapshot it corrupted on purpose");
            }
            Self::create(state, vec![], vec![])
        }

        fn state_size(&self) -> u64 {
            0
        }
    }

    export!(Component);
}
