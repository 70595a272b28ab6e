//! The guest component: generated bindings, the embedded bytes, and the
//! on-disk cache of its compiled form.

use std::path::Path;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

use super::RuntimeError;

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "flow-engine",
    });
}

/// sandflow's guest engine, built from `guest/` by `host/build.rs`.
static GUEST_COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sandflow_engine.wasm"));

/// Compiles the embedded guest, or loads its compiled form from `cache_dir`.
///
/// A cache entry is named after the SHA-256 of the embedded component and the
/// engine's compatibility hash, and is used only when the SHA-256 of its own
/// bytes matches the digest written beside it when this host compiled it: the
/// runtime never deserialises machine code it did not produce itself.
pub fn load_embedded(engine: &Engine, cache_dir: Option<&Path>) -> Result<Component, RuntimeError> {
    let setup = |message: String| RuntimeError::Setup { message };
    if GUEST_COMPONENT.is_empty() {
        return Err(setup(
            "this build has no guest component: building guest/ for wasm32-wasip2 failed when the host \
             was compiled (see the build warnings); fix that and rebuild"
                .into(),
        ));
    }
    let Some(dir) = cache_dir else {
        return Component::new(engine, GUEST_COMPONENT)
            .map_err(|e| setup(format!("cannot compile the guest component: {e:#}")));
    };
    let key = {
        let mut h = Sha256::new();
        h.update(GUEST_COMPONENT);
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        h.update(std::hash::Hasher::finish(&hasher).to_le_bytes());
        hex(&h.finalize())
    };
    let artifact = dir.join(format!("guest-{key}.cwasm"));
    let digest_file = dir.join(format!("guest-{key}.sha256"));
    if let (Ok(bytes), Ok(expected)) = (
        std::fs::read(&artifact),
        std::fs::read_to_string(&digest_file),
    ) {
        if hex(&Sha256::digest(&bytes)) == expected.trim() {
            // SAFETY: the bytes are ones this host compiled and wrote (their digest
            // matches the one recorded at write time), for this engine's settings.
            if let Ok(component) = unsafe { Component::deserialize(engine, &bytes) } {
                return Ok(component);
            }
        }
        tracing::warn!(path = %artifact.display(), "ignoring a stale or altered compiled guest; recompiling");
    }
    let compiled = engine
        .precompile_component(GUEST_COMPONENT)
        .map_err(|e| setup(format!("cannot compile the guest component: {e:#}")))?;
    // The cache is an optimisation: failing to write it is not fatal.
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| write_atomically(&artifact, &compiled))
        .and_then(|_| write_atomically(&digest_file, hex(&Sha256::digest(&compiled)).as_bytes()));
    if let Err(e) = written {
        tracing::warn!(error = %e, dir = %dir.display(), "cannot cache the compiled guest");
    }
    // SAFETY: `compiled` was produced just now by this engine.
    unsafe { Component::deserialize(engine, &compiled) }
        .map_err(|e| setup(format!("cannot load the compiled guest component: {e:#}")))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
