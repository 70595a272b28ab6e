//! Flow components: the generated bindings of the contract, and compiling a
//! component with an on-disk cache of its compiled form.

use std::path::Path;

use sha2::{Digest as _, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

use super::{Digest, RuntimeError};

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "flow-engine",
    });
}

/// Compiles `bytes`, or loads their compiled form from `cache_dir`.
///
/// A cache entry is named after the component's digest and the engine's
/// compatibility hash, and is used only when the SHA-256 of its own bytes
/// matches the digest written beside it when this sandbox compiled it: the
/// sandbox never deserialises machine code it did not produce itself.
pub fn compile(
    engine: &Engine,
    bytes: &[u8],
    digest: &Digest,
    cache_dir: Option<&Path>,
) -> Result<Component, RuntimeError> {
    let setup = |message: String| RuntimeError::Setup { message };
    if bytes.is_empty() {
        return Err(setup(
            "the component is empty (a build without the engine component: building guest/ \
             for wasm32-wasip2 failed when sandflow was compiled; see the build warnings)"
                .into(),
        ));
    }
    let Some(dir) = cache_dir else {
        return Component::new(engine, bytes)
            .map_err(|e| setup(format!("cannot compile component {digest}: {e:#}")));
    };
    let key = {
        let mut h = Sha256::new();
        h.update(digest.0);
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        h.update(std::hash::Hasher::finish(&hasher).to_le_bytes());
        hex::encode(h.finalize())
    };
    let artifact = dir.join(format!("component-{key}.cwasm"));
    let digest_file = dir.join(format!("component-{key}.sha256"));
    if let (Ok(compiled), Ok(expected)) = (
        std::fs::read(&artifact),
        std::fs::read_to_string(&digest_file),
    ) {
        if hex::encode(Sha256::digest(&compiled)) == expected.trim() {
            // SAFETY: the bytes are ones this sandbox compiled and wrote (their
            // digest matches the one recorded at write time), for this engine's
            // settings.
            if let Ok(component) = unsafe { Component::deserialize(engine, &compiled) } {
                return Ok(component);
            }
        }
        tracing::warn!(path = %artifact.display(), "ignoring a stale or altered compiled component; recompiling");
    }
    let compiled = engine
        .precompile_component(bytes)
        .map_err(|e| setup(format!("cannot compile component {digest}: {e:#}")))?;
    // The cache is an optimisation: failing to write it is not fatal.
    let written = std::fs::create_dir_all(dir)
        .and_then(|_| write_atomically(&artifact, &compiled))
        .and_then(|_| {
            write_atomically(
                &digest_file,
                hex::encode(Sha256::digest(&compiled)).as_bytes(),
            )
        });
    if let Err(e) = written {
        tracing::warn!(error = %e, dir = %dir.display(), "cannot cache a compiled component");
    }
    // SAFETY: `compiled` was produced just now by this engine.
    unsafe { Component::deserialize(engine, &compiled) }
        .map_err(|e| setup(format!("cannot load compiled component {digest}: {e:#}")))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // A name of this process's and this call's own: processes sharing a
    // cache (concurrent `sandflow test` runs) never write into one file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}
