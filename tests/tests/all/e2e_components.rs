//! User components end to end, on the real binary: uploads over HTTP and
//! SQL, flows `USING COMPONENT` next to the same built-in flows (sinks
//! equal), versions and rollback, restart without compiling again, and
//! hostile uploads refused with a clear error while a neighbouring flow
//! stays exact, and an uploaded component that misbehaves when it runs
//! failing only its own flows.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use postgres::{Client, NoTls};
use sandflow_tests::harness::{read_response, Options, Server};

pub(super) fn connect(s: &Server) -> Client {
    Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=sandflow dbname=public connect_timeout=10",
            s.pg_port
        ),
        NoTls,
    )
    .expect("connect")
}

/// `PUT path` with a binary body; (status, JSON). The server may answer
/// before reading the whole body (413), so a failed write is not an error.
pub(super) fn put(s: &Server, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
    put_as(s, path, body, None)
}

/// [`put`] with HTTP Basic credentials `user:password`.
pub(super) fn put_as(
    s: &Server,
    path: &str,
    body: &[u8],
    credentials: Option<&str>,
) -> (u16, serde_json::Value) {
    use base64::Engine;
    let auth = credentials
        .map(|c| {
            format!(
                "Authorization: Basic {}\r\n",
                base64::engine::general_purpose::STANDARD.encode(c)
            )
        })
        .unwrap_or_default();
    let mut stream = TcpStream::connect(("127.0.0.1", s.http_port)).expect("connect HTTP");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\
         Content-Type: application/wasm\r\n{auth}Content-Length: {}\r\n\r\n",
        s.http_port,
        body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(body));
    let (status, text) = read_response(&mut stream).expect("HTTP response");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

/// The engine's component with a custom section appended: the same code
/// under another digest (a "new version" that behaves the same).
fn engine_variant(tag: &str) -> Vec<u8> {
    let mut bytes = sandflow::engine::component().to_vec();
    let name = b"sandflow-test";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(tag.as_bytes());
    assert!(payload.len() < 128, "one-byte LEB128 length");
    bytes.push(0x00);
    bytes.push(payload.len() as u8);
    bytes.extend_from_slice(&payload);
    bytes
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest the server reports for `bytes` (the sandbox's SHA-256).
fn sha256_hex(bytes: &[u8]) -> String {
    sandflow::runtime::Digest::of(bytes).to_string()
}

/// Text rows of a query, each row's columns joined by `|`.
pub(super) fn rows(c: &mut Client, sql: &str) -> Vec<String> {
    c.simple_query(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            ),
            _ => None,
        })
        .collect()
}

fn sqlstate(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

fn message(e: &postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| e.to_string())
}

/// A built-in flow beside the hostile ones: `neighbour` over `src`.
const NEIGHBOUR: &str = "CREATE TABLE src (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, \
                         PRIMARY KEY (k)); CREATE FLOW neighbour SINK TO s_n AS SELECT k, \
                         count(*) AS n, sum(v) AS total FROM src GROUP BY k";

/// Flushes `neighbour` and checks its sink against its query.
fn assert_neighbour(c: &mut Client, what: &str) {
    c.batch_execute("ADMIN FLUSH_FLOW('neighbour')").unwrap();
    assert_eq!(
        rows(c, "SELECT k, n, total FROM s_n ORDER BY k"),
        rows(
            c,
            "SELECT k, count(*), sum(v) FROM src GROUP BY k ORDER BY k"
        ),
        "neighbour after {what}"
    );
}

const QUERY: &str = "SELECT k, count(*) AS n, sum(v) AS total, max(v) AS top FROM src GROUP BY k";

fn flush_both(c: &mut Client) {
    c.batch_execute("ADMIN FLUSH_FLOW('builtin'); ADMIN FLUSH_FLOW('user_flow')")
        .expect("flush");
}

fn assert_sinks_equal(c: &mut Client, what: &str) -> Vec<String> {
    flush_both(c);
    let builtin = rows(c, "SELECT k, n, total, top FROM s_builtin ORDER BY k");
    let user = rows(c, "SELECT k, n, total, top FROM s_user ORDER BY k");
    let truth = rows(c, &format!("{QUERY} ORDER BY k"));
    assert_eq!(builtin, truth, "built-in sink after {what}");
    assert_eq!(user, truth, "component sink after {what}");
    truth
}

#[test]
fn the_engine_uploaded_as_a_component_runs_like_the_built_in_flow() {
    let s = Server::start();
    let engine = sandflow::engine::component().to_vec();
    let v2 = engine_variant("v2");

    // Version 1 over HTTP, version 2 over SQL as a bytea literal.
    let (status, json) = put(&s, "/v1/components/eng?db=public", &engine);
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["version"], 1, "{json}");
    assert_eq!(json["digest"], sha256_hex(&engine), "{json}");
    let mut c = connect(&s);
    let err = c
        .batch_execute(&format!("CREATE COMPONENT eng FROM '\\x{}'", hex(&v2)))
        .expect_err("CREATE COMPONENT of an existing name");
    assert_eq!(sqlstate(&err), "42710", "{err:?}");
    c.batch_execute(&format!(
        "CREATE OR REPLACE COMPONENT eng FROM '\\x{}'",
        hex(&v2)
    ))
    .expect("CREATE OR REPLACE COMPONENT");
    assert_eq!(
        rows(
            &mut c,
            "SELECT name, database, version, digest, size, world_version, owner IS NULL \
             FROM information_schema.components ORDER BY version"
        ),
        vec![
            format!(
                "eng|public|1|{}|{}|0.3.0|t",
                sha256_hex(&engine),
                engine.len()
            ),
            format!("eng|public|2|{}|{}|0.3.0|t", sha256_hex(&v2), v2.len()),
        ]
    );
    assert_eq!(
        rows(&mut c, "SHOW COMPONENTS"),
        vec![format!("eng|2|{}|{}", sha256_hex(&v2), v2.len())]
    );

    c.batch_execute(
        "CREATE TABLE src (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))",
    )
    .unwrap();
    c.batch_execute(&format!("CREATE FLOW builtin SINK TO s_builtin AS {QUERY}"))
        .unwrap();
    c.batch_execute(&format!(
        "CREATE FLOW user_flow SINK TO s_user USING COMPONENT eng COMMENT 'on a component' AS \
         {QUERY}"
    ))
    .unwrap();
    assert_eq!(
        rows(
            &mut c,
            "SELECT flow_name, component, component_digest FROM information_schema.flows \
             ORDER BY flow_name"
        ),
        vec![
            "builtin|NULL|NULL".to_string(),
            format!("user_flow|eng|{}", sha256_hex(&v2)),
        ]
    );
    let show = rows(&mut c, "SHOW CREATE FLOW user_flow").join("\n");
    assert!(show.contains("USING COMPONENT public.eng"), "{show}");

    // Inserts, upserts (same key and time), deletes.
    for i in 0..40 {
        c.batch_execute(&format!(
            "INSERT INTO src VALUES ('k{}', {i}, {})",
            i % 7,
            1_700_000_000_000i64 + i
        ))
        .unwrap();
    }
    assert_sinks_equal(&mut c, "inserts");
    c.batch_execute(
        "INSERT INTO src VALUES ('k1', 1000, 1700000000001), ('k2', -5, 1700000000002)",
    )
    .unwrap();
    c.batch_execute("DELETE FROM src WHERE k = 'k3'").unwrap();
    c.batch_execute("DELETE FROM src WHERE k = 'k4' AND v > 10")
        .unwrap();
    assert_sinks_equal(&mut c, "upserts and deletes");

    // A newer version does not move the flow; ALTER FLOW does, both ways.
    let v3 = engine_variant("v3");
    let (status, json) = put(&s, "/v1/components/eng", &v3);
    assert_eq!((status, json["version"].as_u64()), (200, Some(3)), "{json}");
    let digest_of_flow = |c: &mut Client| {
        rows(
            c,
            "SELECT component_digest FROM information_schema.flows WHERE flow_name = 'user_flow'",
        )
    };
    assert_eq!(digest_of_flow(&mut c), vec![sha256_hex(&v2)]);
    c.batch_execute("ALTER FLOW user_flow SET COMPONENT VERSION 1")
        .unwrap();
    assert_eq!(digest_of_flow(&mut c), vec![sha256_hex(&engine)]);
    c.batch_execute("INSERT INTO src VALUES ('k9', 9, 1700000000100)")
        .unwrap();
    assert_sinks_equal(&mut c, "rollback to version 1");
    c.batch_execute("ALTER FLOW user_flow SET COMPONENT VERSION 3")
        .unwrap();
    assert_eq!(digest_of_flow(&mut c), vec![sha256_hex(&v3)]);
    assert_sinks_equal(&mut c, "moving to version 3");
    let err = c
        .batch_execute("ALTER FLOW user_flow SET COMPONENT VERSION 9")
        .expect_err("no version 9");
    assert_eq!(sqlstate(&err), "42704", "{err:?}");
    assert!(message(&err).contains("no version 9"), "{err:?}");
    let err = c
        .batch_execute("ALTER FLOW builtin SET COMPONENT VERSION 1")
        .expect_err("a built-in flow has no component");
    assert_eq!(sqlstate(&err), "0A000", "{err:?}");

    // Pause and resume: the flow comes back on its component.
    c.batch_execute("ADMIN PAUSE_FLOW('user_flow')").unwrap();
    c.batch_execute("INSERT INTO src VALUES ('k11', 11, 1700000000150)")
        .unwrap();
    c.batch_execute("ADMIN RESUME_FLOW('user_flow')").unwrap();
    assert_sinks_equal(&mut c, "pause and resume");

    // In use: DROP COMPONENT names the flow.
    let err = c.batch_execute("DROP COMPONENT eng").expect_err("in use");
    assert_eq!(sqlstate(&err), "2BP01", "{err:?}");
    assert!(message(&err).contains("user_flow"), "{err:?}");
    assert_eq!(
        s.metric("sandflow_components_compiled_total")
            .unwrap_or(0.0),
        3.0,
        "each version compiled once, at its upload"
    );

    // Restart: the flow runs version 3 from its stored compiled form.
    drop(c);
    let s = s.restart();
    let mut c = connect(&s);
    c.batch_execute("INSERT INTO src VALUES ('k10', 10, 1700000000200), ('k1', 7, 1700000000300)")
        .unwrap();
    c.batch_execute("DELETE FROM src WHERE k = 'k5'").unwrap();
    assert_sinks_equal(&mut c, "a restart");
    assert_eq!(digest_of_flow(&mut c), vec![sha256_hex(&v3)]);
    assert_eq!(
        s.metric("sandflow_components_compiled_total"),
        None,
        "nothing compiled after the restart:\n{}",
        s.logs()
    );
    assert!(
        s.metric("sandflow_components_loaded_total").unwrap_or(0.0) >= 1.0,
        "the component was loaded from storage:\n{}",
        s.logs()
    );

    // Once no flow uses it, it can be dropped, with every version.
    c.batch_execute("DROP FLOW user_flow; DROP COMPONENT eng")
        .unwrap();
    assert!(rows(&mut c, "SELECT * FROM information_schema.components").is_empty());
    c.batch_execute("DROP COMPONENT IF EXISTS eng").unwrap();
    let err = c.batch_execute("DROP COMPONENT eng").expect_err("gone");
    assert_eq!(sqlstate(&err), "42704", "{err:?}");
}

#[test]
fn a_component_as_a_bytea_parameter_and_through_decode() {
    let s = Server::start();
    let mut c = connect(&s);
    let engine = sandflow::engine::component().to_vec();
    c.execute("CREATE COMPONENT p FROM $1", &[&engine])
        .expect("bytea parameter");
    let v2 = engine_variant("decode");
    c.batch_execute(&format!(
        "CREATE OR REPLACE COMPONENT p FROM decode('{}', 'hex')",
        hex(&v2)
    ))
    .expect("decode(..., 'hex')");
    assert_eq!(
        rows(
            &mut c,
            "SELECT version, digest FROM information_schema.components ORDER BY version"
        ),
        vec![
            format!("1|{}", sha256_hex(&engine)),
            format!("2|{}", sha256_hex(&v2)),
        ]
    );
}

/// A component whose only content is an import of the interface `name` (an
/// instance with one function, `send`).
fn component_importing(name: &str) -> Vec<u8> {
    let name = name.as_bytes();
    let mut out = vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
    // Type section: one instance type declaring a function type `func()`
    // and an export `send` of that type.
    let types = [
        0x01, 0x42, 0x02, // one type: an instance type with two declarations
        0x01, 0x40, 0x00, 0x01, 0x00, // type: func() with no results
        0x04, 0x00, 0x04, b's', b'e', b'n', b'd', 0x01, 0x00, // export "send": func type 0
    ];
    out.push(0x07);
    out.push(types.len() as u8);
    out.extend_from_slice(&types);
    // Import section: that instance type under the name.
    let mut import = vec![0x01, 0x00, name.len() as u8];
    import.extend_from_slice(name);
    import.extend_from_slice(&[0x05, 0x00]);
    out.push(0x0a);
    out.push(import.len() as u8);
    out.extend_from_slice(&import);
    out
}

/// The hostile guest (a valid flow component) with every name of the
/// contract moved to another version: what a component built against an
/// older `wit/flow.wit` looks like.
fn component_of_contract_version(version: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(env!("HOSTILE_GUEST_WASM"))
        .expect("the hostile guest is built by tests/build.rs");
    for interface in ["engine", "types"] {
        let from = format!("sandflow:flow/{interface}@0.3.0");
        let to = format!("sandflow:flow/{interface}@{version}");
        assert_eq!(
            from.len(),
            to.len(),
            "same-length names keep the binary valid"
        );
        let mut at = 0;
        while let Some(i) = bytes[at..]
            .windows(from.len())
            .position(|w| w == from.as_bytes())
        {
            bytes[at + i..at + i + to.len()].copy_from_slice(to.as_bytes());
            at += i + to.len();
        }
    }
    bytes
}

/// `PUT` of a body that claims 1 GiB and sends its first 64 KiB: the server
/// answers from the header, without waiting for (or storing) the rest.
fn put_claiming_one_gib(s: &Server) -> (u16, serde_json::Value) {
    let mut stream = TcpStream::connect(("127.0.0.1", s.http_port)).expect("connect HTTP");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "PUT /v1/components/huge HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\
         Content-Type: application/wasm\r\nContent-Length: {}\r\n\r\n",
        s.http_port,
        1u64 << 30
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(&[0u8; 64 << 10]));
    let (status, text) = read_response(&mut stream).expect("HTTP response");
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

#[test]
fn hostile_uploads_are_refused_while_a_neighbouring_flow_stays_exact() {
    let s = Server::start_with_args(&["--max-component-size", "1MiB"]);
    let mut c = connect(&s);
    c.batch_execute(NEIGHBOUR).unwrap();
    let mut written = 0i64;
    let mut write_and_check = |c: &mut Client, what: &str| {
        written += 1;
        c.batch_execute(&format!(
            "INSERT INTO src VALUES ('k{}', {written}, {})",
            written % 3,
            1_700_000_000_000i64 + written
        ))
        .unwrap();
        assert_neighbour(c, what);
    };

    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "not wasm",
            b"#!/bin/sh\nrm -rf /\n".to_vec(),
            422,
            "not a WebAssembly component",
        ),
        (
            "a core module",
            b"\0asm\x01\0\0\0".to_vec(),
            422,
            "core WebAssembly module",
        ),
        (
            "an unknown import",
            component_importing("evil:net/socket"),
            422,
            "evil:net/socket",
        ),
        // WASI that a preopen-less context would answer with nothing is
        // still refused, by name.
        (
            "a filesystem import",
            component_importing("wasi:filesystem/types@0.2.6"),
            422,
            "wasi:filesystem/types@0.2.6",
        ),
        (
            "a socket import",
            component_importing("wasi:sockets/tcp@0.2.6"),
            422,
            "wasi:sockets/tcp@0.2.6",
        ),
        (
            "another world",
            b"\0asm\x0d\0\x01\0".to_vec(),
            422,
            "sandflow:flow/engine@0.3.0",
        ),
        (
            "another contract version",
            component_of_contract_version("0.2.0"),
            422,
            "version 0.2.0 of sandflow's flow contract",
        ),
        (
            "truncated engine",
            sandflow::engine::component()[..1000].to_vec(),
            422,
            "does not validate",
        ),
        (
            "over the size cap",
            vec![0u8; 2 << 20],
            413,
            "--max-component-size",
        ),
    ];
    for (what, bytes, status, needle) in &cases {
        let (got, json) = put(&s, "/v1/components/bad", bytes);
        assert_eq!(got, *status, "{what}: {json}");
        let error = json["error"].as_str().unwrap_or_default();
        assert!(error.contains(needle), "{what}: {error}");
        write_and_check(&mut c, what);
    }
    let (got, json) = put_claiming_one_gib(&s);
    assert_eq!(got, 413, "1 GiB: {json}");
    assert!(
        json["error"]
            .as_str()
            .unwrap_or_default()
            .contains("--max-component-size"),
        "1 GiB: {json}"
    );
    write_and_check(&mut c, "1 GiB");
    // The same refusals through SQL, with SQLSTATEs.
    for (what, bytes, _, needle) in &cases {
        let err = c
            .batch_execute(&format!("CREATE COMPONENT bad FROM '\\x{}'", hex(bytes)))
            .expect_err(what);
        let code = if bytes.len() > 1 << 20 {
            "54000"
        } else {
            "42P13"
        };
        assert_eq!(sqlstate(&err), code, "{what}: {err:?}");
        assert!(message(&err).contains(needle), "{what}: {err:?}");
        write_and_check(&mut c, what);
    }
    assert!(
        rows(&mut c, "SELECT * FROM information_schema.components").is_empty(),
        "nothing refused was stored"
    );
    let err = c
        .batch_execute(
            "CREATE FLOW f2 SINK TO s2 USING COMPONENT missing AS SELECT k, count(*) AS n FROM \
             src GROUP BY k",
        )
        .expect_err("no such component");
    assert_eq!(sqlstate(&err), "42704", "{err:?}");
    write_and_check(&mut c, "a flow on a missing component");
}

#[test]
fn uploading_needs_create_on_the_database_and_listings_show_only_what_a_user_may_see() {
    const ADMIN_PW: &str = "admin-secret";
    let s = Server::start_with(
        sandflow_tests::harness::temp_data_dir(),
        Options {
            env: vec![
                ("SANDFLOW_AUTH".into(), "password".into()),
                ("SANDFLOW_ADMIN_PASSWORD".into(), ADMIN_PW.into()),
            ],
            ..Default::default()
        },
    );
    let login = |user: &str, password: &str, database: &str| {
        Client::connect(
            &format!(
                "host=127.0.0.1 port={} user={user} password={password} dbname={database} \
                 connect_timeout=10",
                s.pg_port
            ),
            NoTls,
        )
        .expect("login")
    };
    let mut admin = login("sandflow", ADMIN_PW, "public");
    admin
        .batch_execute(
            "CREATE DATABASE acme; CREATE DATABASE other; \
             CREATE USER alice WITH PASSWORD 'a'; GRANT ALL ON DATABASE acme TO alice; \
             CREATE USER bob WITH PASSWORD 'b'; GRANT SELECT ON DATABASE acme TO bob; \
             CREATE USER carol WITH PASSWORD 'c'; GRANT ALL ON DATABASE other TO carol",
        )
        .unwrap();
    let engine = sandflow::engine::component().to_vec();

    let mut alice = login("alice", "a", "acme");
    alice
        .execute("CREATE COMPONENT acme.c FROM $1", &[&engine])
        .expect("alice has CREATE on acme");
    let (status, json) = put_as(&s, "/v1/components/c2?db=acme", &engine, Some("alice:a"));
    assert_eq!(status, 200, "{json}");
    let (status, json) = put_as(&s, "/v1/components/c?db=other", &engine, Some("alice:a"));
    assert_eq!(status, 403, "{json}");
    let (status, _) = put_as(&s, "/v1/components/c?db=acme", &engine, None);
    assert_eq!(status, 401);

    let mut bob = login("bob", "b", "acme");
    let err = bob
        .execute("CREATE COMPONENT acme.d FROM $1", &[&engine])
        .expect_err("bob has only SELECT on acme");
    assert_eq!(sqlstate(&err), "42501", "{err:?}");
    let err = bob
        .batch_execute("DROP COMPONENT acme.c")
        .expect_err("bob may not drop");
    assert_eq!(sqlstate(&err), "42501", "{err:?}");
    let listed = |c: &mut Client| {
        rows(
            c,
            "SELECT database, name, version, owner FROM information_schema.components \
             ORDER BY name",
        )
    };
    let expected = vec!["acme|c|1|alice".to_string(), "acme|c2|1|alice".to_string()];
    assert_eq!(listed(&mut bob), expected);
    assert_eq!(listed(&mut alice), expected);
    assert_eq!(listed(&mut admin), expected);
    let mut carol = login("carol", "c", "other");
    assert!(listed(&mut carol).is_empty());
    assert!(rows(&mut carol, "SHOW COMPONENTS FROM acme").is_empty());
    assert_eq!(rows(&mut bob, "SHOW COMPONENTS FROM acme").len(), 2);
    alice.batch_execute("DROP COMPONENT acme.c2").unwrap();
    assert_eq!(listed(&mut admin), vec!["acme|c|1|alice".to_string()]);
}

#[tokio::test]
async fn a_compilation_past_its_time_bound_fails_the_upload_not_the_database() {
    use sandflow::flow::FlowSettings;
    use sandflow::{Database, DatabaseConfig};
    let db = Database::open_config(DatabaseConfig::in_memory().with_flows(FlowSettings {
        component_compile_timeout: Duration::from_millis(1),
        ..Default::default()
    }))
    .await
    .unwrap();
    let err = db
        .put_component(
            &sandflow::auth::Principal::Root,
            "public",
            "slow",
            engine_variant("slow"),
        )
        .await
        .expect_err("compiling the engine takes more than 1 ms");
    assert!(
        matches!(err, sandflow::Error::InvalidComponent { .. })
            && err.to_string().contains("took longer"),
        "{err}"
    );
    // The database goes on: statements run, nothing was stored.
    let out = db
        .execute("SELECT count(*) FROM information_schema.components")
        .await
        .unwrap();
    let sandflow::Output::Rows { batches, .. } = &out[0] else {
        panic!("rows expected")
    };
    let text = datafusion::arrow::util::pretty::pretty_format_batches(batches)
        .unwrap()
        .to_string();
    assert!(text.contains("| 0 "), "{text}");
}

/// A hostile component that passes every upload check (the test suite's
/// evil guest) and turns bad when its flows run: a loop in `create` fails
/// the CREATE FLOW; each attack at a tick fails only its own flow, with the
/// reason in `information_schema.flows`; a built-in flow next to them stays
/// exact.
#[test]
fn an_uploaded_component_that_misbehaves_fails_only_its_own_flows() {
    let s = Server::start();
    let evil = std::fs::read(env!("HOSTILE_GUEST_WASM"))
        .expect("the hostile guest is built by tests/build.rs");
    let (status, json) = put(&s, "/v1/components/evil", &evil);
    assert_eq!(status, 200, "upload: {json}");
    let mut c = connect(&s);
    c.batch_execute(NEIGHBOUR).unwrap();
    // (mode, words the flow's error must contain). The memory limit leaves
    // room for `huge_output`'s one row past a call's million, so that the
    // contract check, not the memory limit, stops it.
    let attacks = [
        ("loop", "CPU budget"),
        ("alloc", "memory limit"),
        ("recurse", "trapped"),
        ("panic", "panics on purpose"),
        ("huge_output", "broke the contract"),
        ("endless_output", "output_rows_limit_per_tick"),
        ("bad_utf8", "broke the contract"),
    ];
    // A loop in `create` fails the CREATE FLOW itself, within the setup
    // budget, and leaves nothing behind.
    let err = c
        .batch_execute(
            "CREATE TABLE hostile_create_loop (x BIGINT, ts TIMESTAMP TIME INDEX); \
             CREATE FLOW evil_create SINK TO evil_create_sink USING COMPONENT evil \
               AS SELECT x FROM hostile_create_loop",
        )
        .expect_err("a component that loops in create");
    assert!(message(&err).contains("CPU budget"), "{}", message(&err));
    assert!(
        rows(
            &mut c,
            "SELECT flow_name FROM information_schema.flows WHERE flow_name = 'evil_create'"
        )
        .is_empty(),
        "a flow whose create failed is not kept"
    );
    for (i, (mode, words)) in attacks.iter().enumerate() {
        c.batch_execute(&format!(
            "CREATE TABLE hostile_{mode} (x BIGINT, ts TIMESTAMP TIME INDEX); \
             INSERT INTO hostile_{mode} VALUES (1, 0); \
             CREATE FLOW evil_{mode} SINK TO evil_{mode}_sink USING COMPONENT evil \
               WITH (memory_limit = '96MiB', cpu_limit_per_tick = '300ms') \
               AS SELECT x FROM hostile_{mode}"
        ))
        .unwrap_or_else(|e| panic!("{mode}: {}", message(&e)));
        let err = c
            .batch_execute(&format!("ADMIN FLUSH_FLOW('evil_{mode}')"))
            .expect_err(&format!("{mode}: the hostile flow flushed"));
        assert!(message(&err).contains(words), "{mode}: {}", message(&err));
        assert_eq!(
            rows(
                &mut c,
                &format!(
                    "SELECT status FROM information_schema.flows WHERE flow_name = 'evil_{mode}'"
                )
            ),
            vec!["failed"],
            "{mode}"
        );
        c.batch_execute(&format!(
            "INSERT INTO src VALUES ('k{}', {i}, {})",
            i % 3,
            1_700_000_000_000i64 + i as i64
        ))
        .unwrap();
        assert_neighbour(&mut c, mode);
    }
}

/// A component that writes junk as its snapshot and cannot read it back:
/// while the server runs nothing shows; after a restart only that flow
/// fails, naming the snapshot and the component's own panic, its sink keeps
/// what it had written, and a built-in flow next to it stays exact.
#[test]
fn a_component_that_corrupts_its_own_snapshot_fails_only_its_flow_at_restore() {
    let s = Server::start();
    let evil = std::fs::read(env!("HOSTILE_GUEST_WASM"))
        .expect("the hostile guest is built by tests/build.rs");
    let (status, json) = put(&s, "/v1/components/evil", &evil);
    assert_eq!(status, 200, "upload: {json}");
    let mut c = connect(&s);
    c.batch_execute(NEIGHBOUR).unwrap();
    c.batch_execute(
        "CREATE TABLE hostile_corrupt_snapshot (x BIGINT, ts TIMESTAMP TIME INDEX); \
         INSERT INTO hostile_corrupt_snapshot VALUES (1, 0); \
         CREATE FLOW evil SINK TO evil_sink USING COMPONENT evil \
           AS SELECT x FROM hostile_corrupt_snapshot; \
         INSERT INTO src VALUES ('a', 1, 1), ('b', 2, 2)",
    )
    .unwrap();
    // Its first flush writes a row and (the first snapshot) its junk state.
    c.batch_execute("ADMIN FLUSH_FLOW('evil'); ADMIN FLUSH_FLOW('neighbour')")
        .expect("both flows run before the restart");
    assert!(
        !rows(&mut c, "SELECT * FROM evil_sink").is_empty(),
        "the hostile flow wrote nothing"
    );

    drop(c);
    let s = s.restart();
    let mut c = connect(&s);
    let status = rows(
        &mut c,
        "SELECT status, last_error FROM information_schema.flows WHERE flow_name = 'evil'",
    );
    assert_eq!(status.len(), 1, "{status:?}");
    assert!(status[0].starts_with("failed|"), "{status:?}");
    for words in [
        "cannot restore",
        "corrupted on purpose",
        "CREATE OR REPLACE FLOW",
    ] {
        assert!(status[0].contains(words), "missing '{words}': {status:?}");
    }
    // (It ticks on its own while it runs, so what it had written is read
    // after the restart, and must stay.)
    let written = rows(&mut c, "SELECT * FROM evil_sink");
    assert!(!written.is_empty(), "the failed flow's sink lost its rows");
    c.batch_execute("INSERT INTO src VALUES ('a', 5, 3), ('c', 7, 1)")
        .unwrap();
    assert_neighbour(&mut c, "the restart");
    assert_eq!(
        rows(&mut c, "SELECT * FROM evil_sink"),
        written,
        "the failed flow wrote nothing after the restart"
    );
}

/// The engine's own component uploaded as a user component runs four kinds
/// of flow (an aggregate, a filter, a join with an upserted dimension table,
/// a time-bucketed aggregate) beside the same built-in flows over one random
/// stream of inserts, upserts and deletes: after every flush each pair of
/// sinks is equal, and equal to its query.
#[test]
fn the_engine_as_a_user_component_equals_the_built_in_on_a_random_stream() {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    const FLOWS: [(&str, &str, &str); 4] = [
        (
            "agg",
            "SELECT k, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi FROM src \
             GROUP BY k",
            "k, n, total, lo, hi",
        ),
        (
            "filtered",
            "SELECT k, v, ts FROM src WHERE v % 3 = 0",
            "k, v, ts",
        ),
        (
            "joined",
            "SELECT d.region, count(*) AS n, sum(s.v) AS total FROM src s JOIN dim d \
             ON s.k = d.k GROUP BY d.region",
            "region, n, total",
        ),
        (
            "binned",
            "SELECT k, date_bin(INTERVAL '10 seconds', ts) AS w, count(*) AS n, sum(v) AS total \
             FROM src GROUP BY k, w",
            "k, w, n, total",
        ),
    ];
    let seed: u64 = std::env::var("SANDFLOW_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut rng = StdRng::seed_from_u64(seed);

    let s = Server::start();
    let (status, json) = put(&s, "/v1/components/eng", sandflow::engine::component());
    assert_eq!(status, 200, "upload: {json}");
    let mut c = connect(&s);
    c.batch_execute(
        "CREATE TABLE src (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k)); \
         CREATE TABLE dim (k STRING PRIMARY KEY, region STRING, ts TIMESTAMP TIME INDEX DEFAULT 0)",
    )
    .unwrap();
    for (name, query, _) in FLOWS {
        c.batch_execute(&format!(
            "CREATE FLOW b_{name} SINK TO sb_{name} AS {query}; \
             CREATE FLOW u_{name} SINK TO su_{name} USING COMPONENT eng AS {query}"
        ))
        .unwrap_or_else(|e| panic!("{name}: {}", message(&e)));
    }
    let check = |c: &mut Client, step: usize| {
        for (name, query, cols) in FLOWS {
            c.batch_execute(&format!(
                "ADMIN FLUSH_FLOW('b_{name}'); ADMIN FLUSH_FLOW('u_{name}')"
            ))
            .expect("flush");
            let truth = rows(
                c,
                &format!("SELECT {cols} FROM ({query}) q ORDER BY {cols}"),
            );
            assert!(
                step < 200 || !truth.is_empty(),
                "{name} has no rows at step {step}: the stream tests nothing (seed {seed})"
            );
            for sink in [format!("sb_{name}"), format!("su_{name}")] {
                assert_eq!(
                    rows(c, &format!("SELECT {cols} FROM {sink} ORDER BY {cols}")),
                    truth,
                    "{sink} after step {step} (seed {seed})"
                );
            }
        }
    };
    let key = |rng: &mut StdRng| format!("k{}", rng.random_range(0..8));
    for step in 0..240usize {
        let sql = match rng.random_range(0..100) {
            0..55 => {
                // One to four rows; a (k, ts) already stored is replaced.
                let n = rng.random_range(1..5);
                let values: Vec<String> = (0..n)
                    .map(|_| {
                        format!(
                            "('{}', {}, {})",
                            key(&mut rng),
                            rng.random_range(-50..200),
                            rng.random_range(0..40) * 1000
                        )
                    })
                    .collect();
                format!("INSERT INTO src VALUES {}", values.join(", "))
            }
            55..75 => format!(
                "DELETE FROM src WHERE k = '{}' AND v < {}",
                key(&mut rng),
                rng.random_range(-50..200)
            ),
            75..92 => format!(
                "INSERT INTO dim (k, region) VALUES ('{}', 'r{}')",
                key(&mut rng),
                rng.random_range(0..3)
            ),
            _ => format!("DELETE FROM dim WHERE k = '{}'", key(&mut rng)),
        };
        c.batch_execute(&sql)
            .unwrap_or_else(|e| panic!("{sql}: {}", message(&e)));
        if step % 40 == 39 {
            check(&mut c, step);
        }
    }
}

/// Uploads compile in a child process whose address space is bounded by
/// `--component-compile-memory`: a compilation past it fails the upload
/// with a message that says so, and the server, its flows and its catalog
/// are untouched.
#[test]
fn a_compilation_past_its_memory_bound_fails_the_upload_not_the_server() {
    let s = Server::start_with_args(&["--component-compile-memory", "64MiB"]);
    let mut c = connect(&s);
    c.batch_execute(&format!("{NEIGHBOUR}; INSERT INTO src VALUES ('a', 1, 1)"))
        .unwrap();
    let (status, json) = put(&s, "/v1/components/eng", sandflow::engine::component());
    assert_eq!(status, 422, "{json}");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("compiling the component failed") && error.contains("memory"),
        "{error}"
    );
    let err = c
        .batch_execute(&format!(
            "CREATE COMPONENT eng FROM '\\x{}'",
            hex(sandflow::engine::component())
        ))
        .expect_err("over the compile memory bound");
    assert_eq!(sqlstate(&err), "42P13", "{err:?}");
    assert!(
        message(&err).contains("compiling the component failed"),
        "{err:?}"
    );

    assert!(
        rows(&mut c, "SELECT * FROM information_schema.components").is_empty(),
        "nothing was stored"
    );
    c.batch_execute("INSERT INTO src VALUES ('b', 2, 2), ('a', 3, 3)")
        .unwrap();
    c.batch_execute("ADMIN FLUSH_FLOW('neighbour')").unwrap();
    assert_eq!(
        rows(&mut c, "SELECT k, n, total FROM s_n ORDER BY k"),
        vec!["a|2|4", "b|1|2"]
    );
}
