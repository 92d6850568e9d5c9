//! The boundary between Envoy's dynamic-module ABI and Sluice's native filter.
//!
//! Envoy 1.40 loads `libsluice_native.so`, calls the `envoy_dynamic_module_on_*`
//! hooks this crate exports ([`hooks`]) and answers the
//! `envoy_dynamic_module_callback_*` functions it declares ([`abi`]). Its only
//! job is that boundary: every decision is made by `sluice-native-filter`, in
//! safe Rust, through the [`host::EnvoyRequest`] view of one request.
//!
//! Envoy's dynamic-module SDK is not published on crates.io and must match the
//! Envoy build exactly, so the declarations here are written against the ABI
//! of Envoy 1.40.0 (the one `scripts/ensure-envoy.sh` installs) and checked by
//! the integration tests against that binary: `envoy --mode validate` and real
//! requests through the module (`tests/tests/native_module.rs`).
//!
//! This is the only crate of the workspace where `unsafe` is allowed; every
//! block carries a `SAFETY:` comment. No panic crosses the boundary: each hook
//! runs the safe code under `catch_unwind` and, if it panics, lets the request
//! through (fail open), logs it once and counts it.

pub mod abi;
pub mod hooks;
pub mod host;
pub mod request;
pub mod stats;
