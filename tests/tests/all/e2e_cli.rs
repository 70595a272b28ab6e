//! End-to-end: the command line, config file, environment and their
//! precedence, graceful shutdown.

use std::process::Command;

use sandflow_tests::harness::{server_bin, temp_data_dir, Options, Server};

#[test]
fn help_documents_every_setting() {
    let out = Command::new(server_bin())
        .args(["start", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--config",
        "--data-dir",
        "--postgres-addr",
        "--http-addr",
        "--max-connections",
        "--http-allowed-hosts",
        "--http-header-read-timeout",
        "--http-timeout",
        "--startup-timeout",
        "--statement-timeout",
        "SANDFLOW_DATA_DIR",
        "SANDFLOW_STARTUP_TIMEOUT",
        "SANDFLOW_STATEMENT_TIMEOUT",
        "SANDFLOW_MAX_CONNECTIONS",
        "SANDFLOW_HTTP_ALLOWED_HOSTS",
        "SANDFLOW_HTTP_HEADER_READ_TIMEOUT",
        "SANDFLOW_HTTP_TIMEOUT",
        "SANDFLOW_POSTGRES_ADDR",
        "SANDFLOW_HTTP_ADDR",
        "./sandflow-data",
        "127.0.0.1:4003",
        "127.0.0.1:4000",
        "SIGTERM",
    ] {
        assert!(
            help.contains(needle),
            "start --help lacks {needle}:\n{help}"
        );
    }
    let out = Command::new(server_bin()).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("start"));
}

#[test]
fn config_file_env_and_flag_precedence() {
    let dir = temp_data_dir();
    let data = dir.path().join("from-file");
    let cfg = dir.path().join("sandflow.toml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir = {:?}\npostgres_addr = \"127.0.0.1:0\"\n\
             http_addr = \"not an address\"\n\n[flow]\ntick_interval = \"250ms\"\n",
            data.display().to_string()
        ),
    )
    .unwrap();
    // File gives data_dir and postgres_addr; env overrides the file's bad
    // http_addr; a flag overrides the env's bad postgres_addr.
    let mut s = Server::start_with(
        dir.clone(),
        Options {
            bare: true,
            args: vec![
                "-c".into(),
                cfg.display().to_string(),
                "--postgres-addr".into(),
                "127.0.0.1:0".into(),
            ],
            env: vec![
                ("SANDFLOW_HTTP_ADDR".into(), "127.0.0.1:0".into()),
                ("SANDFLOW_POSTGRES_ADDR".into(), "bad".into()),
            ],
        },
    );
    s.sql("CREATE TABLE t (v DOUBLE, ts TIMESTAMP TIME INDEX)");
    assert!(data.exists(), "data_dir from the file was not used");
    assert!(s.stop(), "not a clean exit:\n{}", s.logs());
}

#[test]
fn bad_settings_fail_fast() {
    let dir = temp_data_dir();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "dat_dir = \"typo\"\n").unwrap();
    let out = Command::new(server_bin())
        .args(["start", "-c"])
        .arg(&cfg)
        .env_remove("SANDFLOW_HTTP_ADDR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dat_dir"), "{err}");

    let out = Command::new(server_bin())
        .args(["start", "--http-addr", "nonsense", "--data-dir"])
        .arg(dir.path().join("d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonsense"));

    let out = Command::new(server_bin())
        .args(["start", "-c"])
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let mut s = Server::start();
    s.sql("SELECT 1");
    assert!(s.stop(), "not a clean exit:\n{}", s.logs());
    let logs = s.logs();
    assert!(logs.contains("shutting down"), "{logs}");
    assert!(logs.contains("sandflow stopped"), "{logs}");
}

#[test]
fn sigint_shuts_down_cleanly_and_data_survives() {
    let mut s = Server::start();
    s.sql("CREATE TABLE t (v DOUBLE, ts TIMESTAMP TIME INDEX)");
    s.sql("INSERT INTO t VALUES (1.5, 1000)");
    assert!(s.stop_with("-INT"), "not a clean exit:\n{}", s.logs());
    assert!(s.logs().contains("SIGINT received"), "{}", s.logs());
    let s = Server::start_in(s.dir());
    assert_eq!(s.sql("SELECT v FROM t"), "1.5");
}
