//! Builds the guest engine as a wasm32-wasip2 component and embeds it.
//!
//! The host only ever runs the component it was built with: the bytes are
//! embedded at compile time (see `runtime::guest`). The guest is built with a
//! nested cargo into its own target directory so it never contends for the
//! outer build's lock.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .and_then(|p| p.parent())
        .expect("host/db/ lives two levels below the workspace root")
        .to_path_buf();
    for path in [
        "guest/src",
        "guest/Cargo.toml",
        "wit",
        "Cargo.lock",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }
    println!("cargo:rerun-if-env-changed=SANDFLOW_GUEST_WASM");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    // A prebuilt component may be supplied (e.g. by packaging); otherwise build it.
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("sandflow_engine.wasm");
    let built = match env::var_os("SANDFLOW_GUEST_WASM") {
        Some(path) => Ok(PathBuf::from(path)),
        None => build_guest(&root),
    }
    .and_then(|wasm| {
        let bytes = std::fs::read(&wasm)
            .map_err(|e| format!("cannot read guest component {}: {e}", wasm.display()))?;
        if bytes.get(..8) != Some(&[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00][..]) {
            return Err(format!(
                "{} is not a WebAssembly component (wrong header)",
                wasm.display()
            ));
        }
        Ok(bytes)
    });
    match built {
        Ok(bytes) => std::fs::write(&out, &bytes).expect("write guest component into OUT_DIR"),
        // A release build must carry the guest. A debug build goes on without
        // it (so the rest of the host can be checked while the guest is being
        // changed) and the runtime then refuses to start with this reason.
        Err(reason) if env::var("PROFILE").as_deref() == Ok("release") => panic!("{reason}"),
        Err(reason) => {
            println!("cargo:warning=no guest component embedded: {reason}");
            std::fs::write(&out, b"").expect("write empty guest placeholder into OUT_DIR");
        }
    }
}

fn build_guest(root: &Path) -> Result<PathBuf, String> {
    let target_dir = match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("guest"),
        None => root.join("target").join("guest"),
    };
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args([
            "build",
            "-p",
            "sandflow-engine",
            "--lib",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "wasm",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    // Flags meant for the host build (coverage, sanitizers) must not leak into the guest.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run cargo to build the guest: {e}"))?;
    if !status.success() {
        return Err("building guest/ for wasm32-wasip2 failed (build with `cargo build -p sandflow-engine --target wasm32-wasip2` to see why; is the target installed? \
                    `rustup target add wasm32-wasip2`, which `make build` does)"
            .into());
    }
    Ok(target_dir
        .join("wasm32-wasip2")
        .join("wasm")
        .join("sandflow_engine.wasm"))
}
