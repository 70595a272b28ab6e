//! The wasm runtime that hosts flow guests.
