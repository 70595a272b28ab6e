//! sandflow's own engine component, built from `guest/` by `build.rs` and
//! embedded: the component every flow runs unless an embedder registers
//! another.

/// The engine's component bytes (empty in a debug build whose guest build
/// failed; registering them then fails with the reason).
static ENGINE_COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sandflow_engine.wasm"));

/// The engine's component bytes, to register in a [`crate::runtime::Sandbox`].
pub fn component() -> &'static [u8] {
    ENGINE_COMPONENT
}
