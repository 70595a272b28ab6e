//! Builds the hostile test guest (tests/hostile-guest) as a wasm32-wasip2
//! component for the sandbox tests, into its own target directory.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .expect("tests/ lives in the workspace root")
        .to_path_buf();
    for path in [
        "tests/hostile-guest/src",
        "tests/hostile-guest/Cargo.toml",
        "wit",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    let target_dir = match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("guest"),
        None => root.join("target").join("guest"),
    };
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(&root)
        .args([
            "build",
            "-p",
            "sandflow-hostile-guest",
            "--lib",
            "--target",
            "wasm32-wasip2",
            "--release",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("run cargo to build the hostile guest");
    assert!(
        status.success(),
        "building tests/hostile-guest for wasm32-wasip2 failed (is the target installed? `rustup target add wasm32-wasip2`)"
    );
    let wasm = target_dir.join("wasm32-wasip2/release/sandflow_hostile_guest.wasm");
    println!("cargo:rustc-env=HOSTILE_GUEST_WASM={}", wasm.display());
}
