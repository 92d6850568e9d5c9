//! The proxy-wasm binding: the only code that talks to Envoy.
//!
//! It uses the `proxy_wasm::hostcalls` functions, which return `Result`,
//! rather than the SDK's trait helpers, which unwrap: every failed host call
//! becomes a [`HostError`](crate::host_api::HostError) that is logged, and
//! the request passes. A panic here would take the worker's VM down.

mod envoy_host;
mod http;
mod root;
mod status;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    // Installs the SDK's panic hook, so a panic (a bug) is at least logged.
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(root::SluiceRoot::new(context_id))
    });
}}
