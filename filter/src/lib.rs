//! Sluice's Envoy filter as a proxy-wasm module: the glue between Envoy's
//! proxy-wasm ABI and the agent library (`sluice-agent`), which does all the
//! work. One agent per VM; the root context configures it, runs its ticks
//! and carries its control-plane stream (`root`); each request's context
//! hands the request to the agent's request handler (`http`); the agent's
//! host services are proxy-wasm host calls (`envoy_host`).
//!
//! It uses the `proxy_wasm::hostcalls` functions, which return `Result`,
//! rather than the SDK's trait helpers, which unwrap: every failed host call
//! becomes a [`sluice_agent::host::HostError`] that is logged, and the
//! request passes. A panic here would take the worker's VM down.
//!
//! Only the Envoy build (`wasm32-wasip1`) has anything in it.

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod envoy_host;
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod http;
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod root;
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod status;

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
proxy_wasm::main! {{
    // Installs the SDK's panic hook, so a panic (a bug) is at least logged.
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Trace);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::SluiceRoot::new(context_id))
    });
}}
