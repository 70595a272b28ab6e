//! Nodes in a cluster, against real etcd and nats-server processes on
//! loopback: joining with a role, `SHOW NODES` and
//! `information_schema.nodes`, leaving at shutdown, dropping out after a
//! crash when the lease runs out, one live holder per node id; a storage
//! node's change streams in JetStream.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandflow_cluster::changes::ChangeStreams;
use sandflow_tests::harness::{poll_until, server_bin, temp_data_dir, Etcd, Nats, Options, Server};

fn node(etcd: &Etcd, id: &str, role: &str, ttl: &str) -> Options {
    Options {
        args: [
            "--etcd",
            &etcd.url(),
            "--node-id",
            id,
            "--role",
            role,
            "--lease-ttl",
            ttl,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Options::default()
    }
}

/// `SHOW NODES` as rows of `id|role|address|lease|flows`.
fn nodes(s: &Server) -> Vec<Vec<String>> {
    s.sql("SHOW NODES")
        .lines()
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect()
}

fn ids(s: &Server) -> Vec<String> {
    nodes(s).into_iter().map(|r| r[0].clone()).collect()
}

/// `sandflow start` with `args` on a fresh directory, which must fail: its
/// standard error.
fn start_fails(args: &[&str]) -> String {
    let dir = temp_data_dir();
    let out = Command::new(server_bin())
        .args(["start", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--postgres-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--mysql-addr", "127.0.0.1:0", "--auth", "none"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sandflow");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    stderr
}

#[test]
fn nodes_join_show_their_roles_and_leave() {
    let etcd = Etcd::start();
    let storage = Server::start_with(temp_data_dir(), node(&etcd, "storage-1", "storage", "2s"));
    let mut flow = Server::start_with(temp_data_dir(), node(&etcd, "flow-1", "flow", "2s"));

    let rows = nodes(&storage);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        rows[0][..3],
        ["flow-1", "flow", &format!("127.0.0.1:{}", flow.http_port)]
    );
    assert_eq!(
        rows[1][..3],
        [
            "storage-1",
            "storage",
            &format!("127.0.0.1:{}", storage.http_port)
        ]
    );
    for r in &rows {
        let lease: i64 = r[3].parse().unwrap_or_else(|_| panic!("lease of {r:?}"));
        assert!((0..=2).contains(&lease), "{r:?}");
        assert_eq!(r[4], "0", "{r:?}");
    }
    // The same through information_schema, from the other node.
    assert_eq!(
        flow.sql("SELECT id, role FROM information_schema.nodes WHERE role <> 'flow'"),
        "storage-1|storage"
    );

    // A flow on the storage node: its own row counts it at once, the other
    // node hears of it through etcd.
    storage
        .sql("CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    storage.sql("CREATE FLOW f SINK TO s AS SELECT host, count(v) AS n FROM m GROUP BY host");
    assert!(
        poll_until(Duration::from_secs(10), || {
            storage.sql("SELECT flows FROM information_schema.nodes WHERE id = 'storage-1'") == "1"
        }),
        "{:?}",
        nodes(&storage)
    );
    assert_eq!(
        storage.sql("SELECT flow_name, node FROM information_schema.flows"),
        "f|storage-1"
    );
    assert_eq!(
        storage.metric("sandflow_cluster_reregistrations"),
        Some(0.0)
    );
    assert!(
        poll_until(Duration::from_secs(10), || {
            flow.sql("SELECT flows FROM information_schema.nodes WHERE id = 'storage-1'") == "1"
        }),
        "the flow node never heard of the storage node's flow: {:?}",
        nodes(&flow)
    );

    // A database lives on one storage node; a flow node holds none.
    storage.sql("CREATE DATABASE shop");
    let e = flow.sql_err("CREATE DATABASE anything");
    assert!(
        e.contains("node flow-1 (role flow) holds no databases"),
        "{e}"
    );
    let mut storage2 =
        Server::start_with(temp_data_dir(), node(&etcd, "storage-2", "storage", "2s"));
    let e = storage2.sql_err("CREATE DATABASE shop");
    assert!(
        e.contains("database 'shop' lives on storage node storage-1"),
        "{e}"
    );
    storage.sql("DROP DATABASE shop");
    storage2.sql("CREATE DATABASE shop");
    let e = storage.sql_err("CREATE DATABASE shop");
    assert!(e.contains("lives on storage node storage-2"), "{e}");
    assert!(storage2.stop(), "{}", storage2.logs());

    // A clean stop leaves at once (the lease is revoked, not waited out).
    assert!(flow.stop(), "unclean stop:\n{}", flow.logs());
    let gone = Instant::now();
    assert!(
        poll_until(Duration::from_millis(1500), || ids(&storage)
            == ["storage-1"]),
        "flow-1 still listed after its stop: {:?}",
        nodes(&storage)
    );
    assert!(gone.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_crashed_node_drops_out_when_its_lease_runs_out_and_its_id_waits_for_that() {
    let etcd = Etcd::start();
    let a = Server::start_with(temp_data_dir(), node(&etcd, "a", "all", "2s"));
    let dir = temp_data_dir();
    let opts = node(&etcd, "b", "flow", "3s");
    let mut b = Server::start_with(dir.clone(), opts.clone());
    assert_eq!(ids(&a), ["a", "b"]);

    b.kill9();
    let killed = Instant::now();
    // Still listed while its lease lasts, gone after.
    assert_eq!(ids(&a), ["a", "b"]);
    assert!(
        poll_until(Duration::from_secs(10), || ids(&a) == ["a"]),
        "b never dropped out: {:?}",
        nodes(&a)
    );
    assert!(
        killed.elapsed() >= Duration::from_secs(1),
        "b dropped out before its lease ran out"
    );

    // Restarted at once after a crash, the node waits for its old lease.
    let mut b = Server::start_with(dir.clone(), opts.clone());
    assert_eq!(ids(&a), ["a", "b"]);
    b.kill9();
    let restarted = Instant::now();
    let b = Server::start_with(dir, opts);
    assert!(
        restarted.elapsed() >= Duration::from_secs(2),
        "b registered again while its crashed run still held the id"
    );
    assert!(
        b.logs().contains("waiting for it to run out"),
        "{}",
        b.logs()
    );
    assert_eq!(ids(&b), ["a", "b"]);
}

#[test]
fn a_node_id_held_by_a_live_node_is_refused() {
    let etcd = Etcd::start();
    let a = Server::start_with(temp_data_dir(), node(&etcd, "n1", "all", "2s"));
    let stderr = start_fails(&[
        "--etcd",
        &etcd.url(),
        "--node-id",
        "n1",
        "--lease-ttl",
        "2s",
    ]);
    assert!(
        stderr.contains("node id 'n1' is held by a live node at 127.0.0.1:")
            && stderr.contains("another --node-id"),
        "{stderr}"
    );
    // The live holder is untouched.
    assert_eq!(ids(&a), ["n1"]);
}

#[test]
fn cluster_settings_need_etcd_and_etcd_needs_a_reachable_server() {
    let run = start_fails;
    let e = run(&["--node-id", "x"]);
    assert!(
        e.contains("--node-id belongs to a cluster node: set --etcd too"),
        "{e}"
    );
    let e = run(&["--etcd", "http://127.0.0.1:1"]);
    assert!(e.contains("--etcd needs --node-id"), "{e}");
    let e = run(&[
        "--etcd",
        "http://127.0.0.1:1",
        "--node-id",
        "x",
        "--role",
        "leader",
    ]);
    assert!(
        e.contains("unknown role 'leader': use storage, flow or all"),
        "{e}"
    );
    let port = sandflow_tests::harness::free_port();
    let e = run(&[
        "--etcd",
        &format!("http://127.0.0.1:{port}"),
        "--node-id",
        "x",
    ]);
    assert!(
        e.contains("cannot join the cluster: cannot reach etcd at"),
        "{e}"
    );
}

#[test]
fn a_server_alone_is_one_node() {
    let s = Server::start();
    s.sql("CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    s.sql("CREATE FLOW f SINK TO s AS SELECT host, count(v) AS n FROM m GROUP BY host");
    assert_eq!(s.sql("SHOW NODES"), "local|all|||1");
    assert_eq!(s.sql("SELECT node FROM information_schema.flows"), "local");
    s.sql("ADMIN PAUSE_FLOW('f')");
    assert_eq!(
        s.sql("SELECT node IS NULL FROM information_schema.flows"),
        "t"
    );
    assert_eq!(s.sql("SHOW NODES"), "local|all|||0");
    assert_eq!(s.sql("SHOW NODES LIKE 'x%'"), "");
    let e = s.sql_err("ADMIN MOVE_FLOW('f', 'n2')");
    assert!(e.contains("ADMIN MOVE_FLOW needs a cluster"), "{e}");
}

/// A part of a change stream: its position and its rows (`host|v|ts`)
/// with their diffs.
type Part = ((u64, u32), Vec<(String, i64)>);

/// Every part on node `node`'s change streams.
fn stream_parts(nats: &Nats, node: &str) -> Vec<Part> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let streams = ChangeStreams::connect(&nats.url()).await.unwrap();
        let all = format!("sandflow.changes.{}.*", hex_of(node));
        let parts = streams.read_after(&all, (0, 0), 100_000).await.unwrap();
        parts
            .into_iter()
            .map(|p| {
                let (rows, diffs) = sandflow::export::decode(&p.body).unwrap();
                let text = datafusion::arrow::util::display::ArrayFormatter::try_new;
                let cols: Vec<_> = (0..rows.num_columns())
                    .map(|c| text(rows.column(c).as_ref(), &Default::default()).unwrap())
                    .collect();
                let rows = (0..rows.num_rows())
                    .map(|r| {
                        let row: Vec<String> =
                            cols.iter().map(|f| f.value(r).to_string()).collect();
                        (row.join("|"), diffs[r])
                    })
                    .collect();
                ((p.seq, p.part), rows)
            })
            .collect()
    })
}

fn hex_of(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// What the parts add up to: each row with its summed diff (zeros left out).
fn integrate(parts: &[Part]) -> BTreeMap<String, i64> {
    let mut sum = BTreeMap::new();
    for (_, rows) in parts {
        for (row, d) in rows {
            *sum.entry(row.clone()).or_insert(0) += d;
        }
    }
    sum.retain(|_, d| *d != 0);
    sum
}

#[test]
fn a_storage_node_publishes_every_change_once_in_order_across_a_crash() {
    let etcd = Etcd::start();
    let nats = Nats::start();
    let mut opts = node(&etcd, "s1", "storage", "2s");
    opts.args.extend(["--nats".to_string(), nats.url()]);
    let dir = temp_data_dir();
    let mut s = Server::start_with(dir.clone(), opts.clone());
    s.sql("CREATE TABLE m (host STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    s.sql("CREATE FLOW f SINK TO out AS SELECT host, sum(v) AS total FROM m GROUP BY host");
    // Commits of one row, of several, an upsert that replaces a row, and a
    // delete.
    for i in 0..20 {
        s.sql(&format!("INSERT INTO m VALUES ('h{}', {i}, {i}000)", i % 4));
    }
    s.sql("INSERT INTO m VALUES ('h0', 100, 0), ('h9', 9, 1000), ('h8', 8, 2000)");
    s.sql("DELETE FROM m WHERE host = 'h8'");
    let table = |s: &Server| -> BTreeMap<String, i64> {
        s.sql("SELECT host, v, CAST(ts AS BIGINT) FROM m")
            .lines()
            .map(|l| (l.to_string(), 1))
            .collect()
    };
    // The stream's rows print the time as a timestamp; compare by key and value.
    let key = |m: &BTreeMap<String, i64>| -> Vec<String> {
        m.keys()
            .map(|k| k.split('|').take(2).collect::<Vec<_>>().join("|"))
            .collect()
    };
    let want = table(&s);
    assert!(
        poll_until(Duration::from_secs(20), || key(&integrate(&stream_parts(
            &nats, "s1"
        ))) == key(&want)),
        "the stream never added up to the table:\n{:?}\nvs\n{want:?}",
        integrate(&stream_parts(&nats, "s1"))
    );

    // Writes while NATS cannot take them (paused), then a crash: they wait
    // in the node's log and are published after the restart, with more.
    nats.signal("-STOP");
    for i in 0..30 {
        s.sql(&format!("INSERT INTO m VALUES ('k{}', {i}, {i}000)", i % 7));
    }
    s.kill9();
    nats.signal("-CONT");
    let s = Server::start_with(dir, opts);
    s.sql("INSERT INTO m VALUES ('after', 1, 0)");
    let want = table(&s);
    assert!(
        poll_until(Duration::from_secs(30), || key(&integrate(&stream_parts(
            &nats, "s1"
        ))) == key(&want)),
        "after the crash the stream never added up to the table:\n{:?}\nvs\n{want:?}",
        integrate(&stream_parts(&nats, "s1"))
    );
    let parts = stream_parts(&nats, "s1");
    let positions: Vec<(u64, u32)> = parts.iter().map(|(p, _)| *p).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "positions out of order or repeated: {positions:?}"
    );
    // Every row ever written is in the stream exactly once as an insert.
    let inserts: usize = parts
        .iter()
        .flat_map(|(_, rows)| rows.iter())
        .filter(|(_, d)| *d > 0)
        .count();
    assert_eq!(inserts, 20 + 3 + 30 + 1, "{parts:?}");
    assert!(
        s.metric("sandflow_change_stream_parts_total")
            .unwrap_or(0.0)
            >= 1.0,
        "{:?}",
        s.metric("sandflow_change_stream_parts_total")
    );
}

/// Whether every flow's sink (`table(columns)`) shows what its query gives
/// now.
fn sinks_exact(s: &Server, flows: &[(&str, &str)]) -> bool {
    flows.iter().all(|(sink, query)| {
        let (table, columns) = sink.split_once('(').unwrap_or((sink, "*)"));
        let columns = columns.trim_end_matches(')');
        s.psql(&format!("SELECT {columns} FROM {table} ORDER BY 1"))
            .ok()
            .map(|rows| rows.trim().to_string())
            == s.psql(&format!("{query} ORDER BY 1"))
                .ok()
                .map(|rows| rows.trim().to_string())
    })
}

#[test]
fn flows_run_on_flow_nodes_and_move_when_one_dies() {
    let etcd = Etcd::start();
    let nats = Nats::start();
    let with_nats = |mut o: Options| {
        o.args.extend(["--nats".to_string(), nats.url()]);
        o
    };
    let storage_dir = temp_data_dir();
    let storage_opts = with_nats(node(&etcd, "storage-1", "storage", "2s"));
    let mut storage = Server::start_with(storage_dir.clone(), storage_opts.clone());
    let mut f1 = Server::start_with(
        temp_data_dir(),
        with_nats(node(&etcd, "flow-1", "flow", "2s")),
    );
    let f2 = Server::start_with(
        temp_data_dir(),
        with_nats(node(&etcd, "flow-2", "flow", "2s")),
    );
    storage
        .sql("CREATE TABLE m (host STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    storage.sql("INSERT INTO m VALUES ('a', 1, 0), ('b', 2, 0)");
    let flows = [
        (
            "s1(host, n, total)",
            "SELECT host, count(v) AS n, sum(v) AS total FROM m GROUP BY host",
        ),
        (
            "s2(host, top)",
            "SELECT host, max(v) AS top FROM m GROUP BY host",
        ),
        ("s3(n)", "SELECT count(*) AS n FROM m"),
        (
            "s4(host, low)",
            "SELECT host, min(v) AS low FROM m WHERE v > 1 GROUP BY host",
        ),
    ];
    for (i, (sink, query)) in flows.iter().enumerate() {
        let table = sink.split('(').next().unwrap_or(sink);
        storage.sql(&format!("CREATE FLOW f{i} SINK TO {table} AS {query}"));
    }
    let nodes_of = |s: &Server| -> Vec<String> {
        s.sql("SELECT coalesce(node, '-') FROM information_schema.flows ORDER BY flow_name")
            .lines()
            .map(str::to_string)
            .collect()
    };
    // Spread over the two flow nodes, none left on the storage node.
    assert!(
        poll_until(Duration::from_secs(20), || {
            let n = nodes_of(&storage);
            n.iter().filter(|x| *x == "flow-1").count() == 2
                && n.iter().filter(|x| *x == "flow-2").count() == 2
        }),
        "flows not spread: {:?}\n{}\n{}",
        nodes_of(&storage),
        f1.logs(),
        storage.logs()
    );
    for i in 0..20 {
        storage.sql(&format!("INSERT INTO m VALUES ('h{}', {i}, {i}000)", i % 3));
    }
    storage.sql("INSERT INTO m VALUES ('a', 100, 0)");
    storage.sql("DELETE FROM m WHERE host = 'b'");
    assert!(
        poll_until(Duration::from_secs(20), || sinks_exact(&storage, &flows)),
        "sinks never caught up on the flow nodes\n{}\n{}\n{:?} {}{}",
        f1.logs(),
        f2.logs(),
        storage.metric("sandflow_change_stream_parts_total"),
        storage.sql("SELECT flow_name, node, rows_written, status, last_error FROM information_schema.flows"),
        ""
    );
    assert!(
        poll_until(Duration::from_secs(10), || {
            storage.sql("SELECT flows FROM information_schema.nodes WHERE id = 'flow-1'") == "2"
        }),
        "{:?}",
        nodes(&storage)
    );

    // ADMIN FLUSH_FLOW on the storage node waits for the flow nodes.
    for i in 20..30 {
        storage.sql(&format!("INSERT INTO m VALUES ('g{}', {i}, {i}000)", i % 4));
    }
    for i in 0..flows.len() {
        storage.sql(&format!("ADMIN FLUSH_FLOW('f{i}')"));
    }
    assert!(
        sinks_exact(&storage, &flows),
        "a flush returned before the sink caught up"
    );

    // The internal calls need the cluster's secret.
    for path in ["/internal/v1/plan", "/internal/v1/commit"] {
        let (status, body) = storage
            .try_http(
                "POST",
                path,
                Some("application/json"),
                "{\"flow\":\"f0\",\"fence\":1}",
            )
            .unwrap();
        assert_eq!(status, 403, "{path}: {body}");
    }

    // ADMIN MOVE_FLOW puts a flow where it is told; the sink stays exact.
    let f0_node = storage.sql("SELECT node FROM information_schema.flows WHERE flow_name = 'f0'");
    let other = if f0_node == "flow-1" {
        "flow-2"
    } else {
        "flow-1"
    };
    assert_eq!(
        storage.sql(&format!("ADMIN MOVE_FLOW('f0', '{other}')")),
        "1"
    );
    assert_eq!(
        storage.sql("SELECT node FROM information_schema.flows WHERE flow_name = 'f0'"),
        other
    );
    storage.sql("INSERT INTO m VALUES ('moved', 5, 0)");
    assert!(
        poll_until(Duration::from_secs(20), || sinks_exact(&storage, &flows)),
        "sinks not exact after MOVE_FLOW"
    );
    for (sql, want) in [
        ("ADMIN MOVE_FLOW('f0', 'nowhere')", "no live node 'nowhere'"),
        ("ADMIN MOVE_FLOW('f0', 'storage-1')", "its own storage node"),
        ("ADMIN MOVE_FLOW('nope', 'flow-1')", "nope"),
        (
            "ADMIN MOVE_FLOW('f0')",
            "MOVE_FLOW takes the flow's name and a node's id",
        ),
    ] {
        let e = storage.sql_err(sql);
        assert!(e.contains(want), "{sql}: {e}");
    }

    // A flow that fails on its node for good is failed on the storage node
    // too, with the reason, and no longer placed.
    storage.sql(
        "CREATE TABLE m2 (host STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
    );
    storage.sql(
        "CREATE FLOW lim SINK TO lim_sink WITH (output_rows_limit_per_tick = '3') AS \
         SELECT host, count(v) AS n FROM m2 GROUP BY host",
    );
    let lim_node = || {
        storage
            .sql("SELECT coalesce(node, '-') FROM information_schema.flows WHERE flow_name = 'lim'")
    };
    assert!(poll_until(Duration::from_secs(20), || lim_node().starts_with("flow-")));
    storage.sql(
        "INSERT INTO m2 VALUES ('a', 1, 0), ('b', 1, 0), ('c', 1, 0), ('d', 1, 0), ('e', 1, 0)",
    );
    assert!(
        poll_until(Duration::from_secs(20), || storage.sql(
            "SELECT status FROM information_schema.flows WHERE flow_name = 'lim'"
        ) == "failed"),
        "{}",
        storage
            .sql("SELECT status, last_error FROM information_schema.flows WHERE flow_name = 'lim'")
    );
    let error =
        storage.sql("SELECT last_error FROM information_schema.flows WHERE flow_name = 'lim'");
    assert!(
        error.contains("on node flow-") && error.contains("output_rows_limit_per_tick"),
        "{error}"
    );
    assert_eq!(lim_node(), "-");
    storage.sql("DROP FLOW lim");

    // A paused flow stops on its node; resumed, it is placed again.
    storage.sql("ADMIN PAUSE_FLOW('f1')");
    let paused = storage.sql("SELECT host, top FROM s2 ORDER BY 1");
    storage.sql("INSERT INTO m VALUES ('paused', 1000, 0)");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(storage.sql("SELECT host, top FROM s2 ORDER BY 1"), paused);
    assert_eq!(
        storage.sql(
            "SELECT status, node IS NULL FROM information_schema.flows WHERE flow_name = 'f1'"
        ),
        "paused|t"
    );
    storage.sql("ADMIN RESUME_FLOW('f1')");
    assert!(
        poll_until(Duration::from_secs(20), || sinks_exact(&storage, &flows)
            && nodes_of(&storage).iter().all(|n| n.starts_with("flow-"))),
        "after RESUME_FLOW: {:?}",
        nodes_of(&storage)
    );

    // A third flow node joins: the flows spread over it too.
    let mut f3 = Server::start_with(
        temp_data_dir(),
        with_nats(node(&etcd, "flow-3", "flow", "2s")),
    );
    assert!(
        poll_until(Duration::from_secs(20), || {
            let n = nodes_of(&storage);
            ["flow-1", "flow-2", "flow-3"]
                .iter()
                .all(|id| n.iter().any(|x| x == id))
        }),
        "no rebalance: {:?}",
        nodes_of(&storage)
    );
    storage.sql("INSERT INTO m VALUES ('c', 3, 0)");
    assert!(
        poll_until(Duration::from_secs(20), || sinks_exact(&storage, &flows)),
        "sinks not exact after the rebalance\n{}",
        f3.logs()
    );

    // A flow node dies: its flows go to the others, and stay exact.
    f1.kill9();
    for i in 20..40 {
        storage.sql(&format!("INSERT INTO m VALUES ('h{}', {i}, {i}000)", i % 5));
    }
    assert!(
        poll_until(Duration::from_secs(30), || nodes_of(&storage)
            .iter()
            .all(|n| n == "flow-2" || n == "flow-3")),
        "flows did not move: {:?}",
        nodes_of(&storage)
    );
    storage.sql("INSERT INTO m VALUES ('z', 7, 0)");
    assert!(
        poll_until(Duration::from_secs(30), || sinks_exact(&storage, &flows)),
        "sinks not exact after the move\n{}\n{}",
        f2.logs(),
        storage.logs()
    );

    // A flow node paused past its lease: its flows move; resumed, its runs
    // are fenced off and nothing is counted twice.
    f2.signal("-STOP");
    assert!(
        poll_until(Duration::from_secs(30), || nodes_of(&storage)
            .iter()
            .all(|n| n == "flow-3")),
        "flows did not leave the paused node: {:?}",
        nodes_of(&storage)
    );
    for i in 40..50 {
        storage.sql(&format!("INSERT INTO m VALUES ('p{}', {i}, {i}000)", i % 4));
    }
    f2.signal("-CONT");
    storage.sql("DELETE FROM m WHERE host = 'p1'");
    assert!(
        poll_until(Duration::from_secs(30), || sinks_exact(&storage, &flows)),
        "sinks not exact after the pause\n{}\n{}",
        f2.logs(),
        f3.logs()
    );
    // Back in the cluster, it gets flows again, under new fences.
    assert!(
        poll_until(Duration::from_secs(30), || nodes_of(&storage)
            .iter()
            .any(|n| n == "flow-2")),
        "{:?}",
        nodes_of(&storage)
    );
    storage.sql("INSERT INTO m VALUES ('q', 1, 0)");
    assert!(
        poll_until(Duration::from_secs(30), || sinks_exact(&storage, &flows)),
        "sinks not exact after the paused node came back\n{}",
        f2.logs()
    );

    // The storage node restarts during ingest: nothing lost, nothing twice.
    for i in 50..60 {
        storage.sql(&format!("INSERT INTO m VALUES ('r{}', {i}, {i}000)", i % 3));
    }
    assert!(storage.stop(), "{}", storage.logs());
    let storage = Server::start_with(storage_dir, storage_opts);
    for i in 60..70 {
        storage.sql(&format!("INSERT INTO m VALUES ('r{}', {i}, {i}000)", i % 3));
    }
    assert!(
        poll_until(Duration::from_secs(30), || sinks_exact(&storage, &flows)
            && nodes_of(&storage).iter().all(|n| n.starts_with("flow-"))),
        "sinks not exact after the storage node restarted: {:?}\n{}",
        nodes_of(&storage),
        storage.logs()
    );
    assert!(f3.stop(), "{}", f3.logs());
}

/// One storage node, three flow nodes, 30 flows of two tenants (databases),
/// writers through psql and HTTP while a flow node is killed: after a flush
/// every sink equals its query, and every acknowledged row is counted once.
#[test]
fn thirty_flows_of_two_tenants_survive_a_flow_node_killed_during_ingest() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let etcd = Etcd::start();
    let nats = Nats::start();
    let with_nats = |mut o: Options| {
        o.args.extend(["--nats".to_string(), nats.url()]);
        o
    };
    let storage = Arc::new(Server::start_with(
        temp_data_dir(),
        with_nats(node(&etcd, "storage-1", "storage", "2s")),
    ));
    let mut flow_nodes: Vec<Server> = (1..=3)
        .map(|i| {
            Server::start_with(
                temp_data_dir(),
                with_nats(node(&etcd, &format!("flow-{i}"), "flow", "2s")),
            )
        })
        .collect();
    let mut flows: Vec<(String, String)> = Vec::new();
    for tenant in ["t1", "t2"] {
        storage.sql(&format!("CREATE DATABASE {tenant}"));
        storage.sql(&format!(
            "CREATE TABLE {tenant}.m (host STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))"
        ));
        for i in 0..15 {
            let (columns, query) = match i % 3 {
                0 => ("n", format!("SELECT count(*) AS n FROM {tenant}.m")),
                1 => (
                    "host, n, total",
                    format!(
                        "SELECT host, count(v) AS n, sum(v) AS total FROM {tenant}.m GROUP BY host"
                    ),
                ),
                _ => (
                    "host, top",
                    format!(
                        "SELECT host, max(v) AS top FROM {tenant}.m WHERE v % {} = 0 GROUP BY host",
                        i + 1
                    ),
                ),
            };
            storage.sql(&format!(
                "CREATE FLOW {tenant}_f{i} SINK TO {tenant}.s{i} AS {query}"
            ));
            flows.push((format!("{tenant}.s{i}({columns})"), query));
        }
    }
    let flows_ref: Vec<(&str, &str)> = flows
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let on_flow_nodes = || {
        storage.sql("SELECT count(*) FROM information_schema.flows WHERE node LIKE 'flow-%'")
            == "30"
    };
    assert!(
        poll_until(Duration::from_secs(60), on_flow_nodes),
        "{}",
        storage.sql("SELECT flow_name, node FROM information_schema.flows")
    );

    // Writers: psql into t1, HTTP into t2, counting what was acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (storage, stop, acked) = (storage.clone(), stop.clone(), acked[w].clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let sql = format!("INSERT INTO t{}.m VALUES ('h{}', {i}, {i})", w + 1, i % 7);
                    let ok = match w {
                        0 => storage.psql(&sql).is_ok(),
                        _ => storage.http_sql(&sql).0 == 200,
                    };
                    if ok {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    flow_nodes[0].kill9();
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    assert!(
        poll_until(Duration::from_secs(30), || storage.sql(
            "SELECT count(*) FROM information_schema.flows WHERE node IN ('flow-2', 'flow-3')"
        ) == "30"),
        "{}",
        storage.sql("SELECT flow_name, node FROM information_schema.flows")
    );
    for i in 0..15 {
        for tenant in ["t1", "t2"] {
            storage.sql(&format!("ADMIN FLUSH_FLOW('{tenant}_f{i}')"));
        }
    }
    assert!(
        sinks_exact(&storage, &flows_ref),
        "a sink differs from its query"
    );
    for (t, acked) in acked.iter().enumerate() {
        let n = acked.load(Ordering::Relaxed);
        assert!(n > 0);
        assert_eq!(
            storage.sql(&format!("SELECT n FROM t{}.s0", t + 1)),
            n.to_string()
        );
    }
    flow_nodes.clear();
}
