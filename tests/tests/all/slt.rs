//! `sandflow test` on the real binary: the repository's scenario files in
//! `tests/slt/` pass, give the same results on every run, a wrong
//! expectation fails with the record's line and a diff, `--override`
//! rewrites it (and only it), `--junit` writes a report.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sandflow_tests::harness::{server_bin, temp_data_dir};

fn slt_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("slt")
}

fn sandflow_test(args: &[&str]) -> Output {
    Command::new(server_bin())
        .arg("test")
        .args(args)
        .output()
        .expect("run sandflow test")
}

/// The report without the real time each file took.
fn results(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| match l.find(" (") {
            Some(i) if l.starts_with("PASS ") || l.starts_with("FAIL ") => l[..i].to_string(),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_repository_scenarios_pass_and_repeat_exactly() {
    let dir = slt_dir();
    let first = sandflow_test(&[dir.to_str().unwrap()]);
    assert!(
        first.status.success(),
        "{}{}",
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&first.stderr)
    );
    let report = results(&first);
    assert!(
        report.contains("PASS ") && !report.contains("FAIL "),
        "{report}"
    );
    for _ in 0..2 {
        assert_eq!(results(&sandflow_test(&[dir.to_str().unwrap()])), report);
    }
    // The engine compiled in gives the same results as the one in wasm.
    let native = sandflow_test(&["--engine", "native", dir.to_str().unwrap()]);
    assert!(
        native.status.success(),
        "{}",
        String::from_utf8_lossy(&native.stdout)
    );
    assert_eq!(results(&native), report);
}

const WRONG: &str = "# A scenario with one wrong expectation.\n\
statement ok\n\
CREATE TABLE t (k INT, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))\n\
\n\
statement ok\n\
CREATE FLOW f SINK TO s AS SELECT sum(v) AS total FROM t\n\
\n\
statement ok\n\
INSERT INTO t VALUES (1, 2, 0), (2, 3, 0)\n\
\n\
query I\n\
SELECT total FROM s\n\
----\n\
4\n\
\n\
# The rows below stay as they are.\n\
query I\n\
SELECT count(*) FROM t\n\
----\n\
2\n";

#[test]
fn a_wrong_expectation_fails_with_a_diff_and_override_fixes_it() {
    let tmp = temp_data_dir();
    let dir = tmp.path();
    let file = dir.join("wrong.slt");
    std::fs::write(&file, WRONG).unwrap();
    let path = file.to_str().unwrap();

    let out = sandflow_test(&[path]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("FAIL {path}")), "{stdout}");
    assert!(
        stdout.contains(&format!("{path}:11:")),
        "the query's line: {stdout}"
    );
    assert!(stdout.contains("- 4") && stdout.contains("+ 5"), "{stdout}");

    // A JUnit report names the failure.
    let junit = dir.join("report.xml");
    let out = sandflow_test(&["--junit", junit.to_str().unwrap(), path]);
    assert_eq!(out.status.code(), Some(1));
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"1\" failures=\"1\""), "{xml}");
    assert!(xml.contains("<failure"), "{xml}");

    // --override rewrites the wrong rows and nothing else; then it passes.
    let out = sandflow_test(&["--override", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let fixed = std::fs::read_to_string(&file).unwrap();
    assert_eq!(fixed, WRONG.replace("----\n4\n", "----\n5\n"));
    let out = sandflow_test(&[path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn bad_runs_are_refused_clearly() {
    let tmp = temp_data_dir();
    let dir = tmp.path();
    // Time going backwards fails naming the line.
    let file = dir.join("back.slt");
    std::fs::write(&file, "control time 5000\n\ncontrol time 4000\n").unwrap();
    let out = sandflow_test(&[file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{}:3:", file.display())) && stdout.contains("backwards"),
        "{stdout}"
    );
    // No such path; no such engine.
    let out = sandflow_test(&["/nonexistent/x.slt"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
    let out = sandflow_test(&["--engine", "jit", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown engine 'jit'"));
}

/// The compiled engine is kept in the cache directory between runs; a
/// damaged cached form is compiled anew, and `--no-cache` writes nothing.
#[test]
fn the_compiled_engine_is_kept_between_runs_and_a_damaged_one_is_replaced() {
    let tmp = temp_data_dir();
    let cache = tmp.path().join("cache");
    let file = slt_dir().join("filter.slt");
    let run = |extra: &[&str]| {
        let mut args = vec!["--cache-dir", cache.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.push(file.to_str().unwrap());
        let out = sandflow_test(&args);
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        results(&out)
    };
    let files = || {
        let mut names: Vec<String> = std::fs::read_dir(&cache)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    // --no-cache leaves the directory alone.
    let report = run(&["--no-cache"]);
    assert!(files().is_empty(), "{:?}", files());
    // The first run compiles and keeps the compiled form and its checksum,
    // and nothing half-written.
    assert_eq!(run(&[]), report);
    let kept = files();
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(
        kept[0].ends_with(".cwasm") && kept[1].ends_with(".sha256"),
        "{kept:?}"
    );
    let compiled = cache.join(&kept[0]);
    assert!(std::fs::read(&compiled).unwrap().starts_with(b"\x7fELF"));
    // A damaged compiled form is not loaded: the run compiles anew, passes
    // the same, and replaces it.
    std::fs::write(&compiled, b"not machine code").unwrap();
    assert_eq!(run(&[]), report);
    assert_eq!(files(), kept);
    assert!(std::fs::read(&compiled).unwrap().starts_with(b"\x7fELF"));
}

/// Each scenario file run 20 times in one process (one sandbox, so the
/// engine compiles once): every run passes, in both engines.
#[test]
fn each_file_passes_twenty_times_in_both_engines() {
    use sandflow::flow::FlowEngine;
    use sandflow::runtime::{RuntimeConfig, Sandbox};
    use sandflow::testing::slt;
    let files = slt::collect_files(&[slt_dir()]).unwrap();
    assert!(files.len() >= 3, "{files:?}");
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let sandbox = std::sync::Arc::new(Sandbox::new(RuntimeConfig::default()).unwrap());
            for (engine, sandbox) in [
                (FlowEngine::Wasm, Some(sandbox)),
                (FlowEngine::Native, None),
            ] {
                let options = slt::Options {
                    override_results: false,
                    engine,
                    sandbox,
                };
                for _ in 0..20 {
                    for f in &files {
                        let r = rt.block_on(slt::run_file(f, &options));
                        assert!(r.passed(), "{engine:?}: {}", r.report());
                    }
                }
            }
        })
        .unwrap()
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
}
