//! End-to-end durability: every acknowledged row survives a SIGTERM restart
//! and a kill -9 exactly once, and no multi-row statement is half-written.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use postgres::{Client, NoTls};
use sandflow_tests::harness::Server;

fn connect(s: &Server) -> Client {
    Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=sandflow dbname=public connect_timeout=10",
            s.pg_port
        ),
        NoTls,
    )
    .expect("connect")
}

/// (batch, row) -> count of rows with that key.
fn contents(s: &Server) -> BTreeMap<(i64, i64), i64> {
    let mut c = connect(s);
    c.query("SELECT b, i, count(*) FROM w GROUP BY b, i", &[])
        .expect("select")
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

const CREATE: &str =
    "CREATE TABLE w (b BIGINT, i BIGINT, v STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (b, i))";

fn insert_batch(c: &mut Client, b: i64, rows: i64) -> Result<u64, postgres::Error> {
    let values: Vec<String> = (0..rows)
        .map(|i| {
            format!(
                "({b}, {i}, 'row {b}/{i}', {})",
                1_700_000_000_000i64 + b * 100 + i
            )
        })
        .collect();
    c.execute(&format!("INSERT INTO w VALUES {}", values.join(", ")), &[])
}

#[test]
fn sigterm_restart_keeps_every_row_once() {
    let mut s = Server::start();
    let mut c = connect(&s);
    c.execute(CREATE, &[]).unwrap();
    for b in 0..30 {
        assert_eq!(insert_batch(&mut c, b, 3).unwrap(), 3);
    }
    drop(c);
    let dir = s.dir();
    assert!(s.stop(), "unclean shutdown:\n{}", s.logs());

    let s = Server::start_in(dir.clone());
    let got = contents(&s);
    assert_eq!(got.len(), 90, "rows after restart: {got:?}\n{}", s.logs());
    assert!(got.values().all(|n| *n == 1), "{got:?}");

    // And it keeps accepting writes after the restart.
    let mut c = connect(&s);
    insert_batch(&mut c, 100, 1).unwrap();
    assert_eq!(contents(&s).len(), 91);
}

#[test]
fn kill9_during_writes_loses_no_acknowledged_row() {
    const ROWS: i64 = 5;
    let mut s = Server::start();
    connect(&s).execute(CREATE, &[]).unwrap();

    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let port = s.pg_port;
    let writer = {
        let acked = acked.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Client::connect(
                &format!(
                    "host=127.0.0.1 port={port} user=sandflow dbname=public connect_timeout=10"
                ),
                NoTls,
            )
            .expect("connect");
            let mut b = 0;
            // Bounded: stops at the kill, or after 100k statements.
            while !stop.load(Ordering::SeqCst) && b < 100_000 {
                match insert_batch(&mut c, b, ROWS) {
                    Ok(_) => acked.lock().unwrap().push(b),
                    Err(_) => break,
                }
                b += 1;
            }
            b
        })
    };
    // Let some writes land, then pull the plug mid-stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while acked.lock().unwrap().len() < 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    s.kill9();
    stop.store(true, Ordering::SeqCst);
    let attempted = writer.join().expect("writer thread");
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 20,
        "too few writes before the kill: {}",
        acked.len()
    );

    let s = Server::start_in(s.dir());
    let got = contents(&s);
    let mut per_batch: BTreeMap<i64, i64> = BTreeMap::new();
    for ((b, _), n) in &got {
        assert_eq!(*n, 1, "row of batch {b} stored {n} times");
        *per_batch.entry(*b).or_default() += 1;
    }
    for b in &acked {
        assert_eq!(
            per_batch.get(b).copied(),
            Some(ROWS),
            "acknowledged batch {b} not fully there"
        );
    }
    for (b, n) in &per_batch {
        assert_eq!(*n, ROWS, "batch {b} half-written ({n} of {ROWS} rows)");
        assert!(*b < attempted.max(1) + 1, "batch {b} was never sent");
    }
}
