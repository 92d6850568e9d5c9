//! An HTTP filter that lets every request through without looking at it.
//!
//! Loaded in place of Sluice it measures what any Rust proxy-wasm filter
//! costs in Envoy (VM entry, context creation per request), so the
//! end-to-end benchmark can tell that cost apart from Sluice's own work.
//! Build: `cargo build -p sluice-empty-filter --target wasm32-wasip1 --profile wasm`.

#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
mod filter {
    use proxy_wasm::traits::{Context, HttpContext};
    use proxy_wasm::types::LogLevel;

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Warn);
        proxy_wasm::set_http_context(|_, _| -> Box<dyn HttpContext> { Box::new(Pass) });
    }}

    /// Per-request context; the trait defaults continue at every step.
    struct Pass;

    impl Context for Pass {}

    impl HttpContext for Pass {}
}
