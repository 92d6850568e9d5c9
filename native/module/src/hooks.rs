//! The `envoy_dynamic_module_on_*` functions Envoy 1.40 looks up in the
//! module. Envoy refuses a module that lacks any HTTP filter hook, so every
//! one is here; those the filter has no use for do nothing and continue.

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_native_filter::{HeadersAction, NativeConfig, NativeFilter};

use crate::abi::{self, EnvoyBuffer, EnvoyPtr, ModulePtr};
use crate::host::EnvoyRequest;
use crate::request::RequestState;
use crate::stats::EnvoyStats;

/// Hooks that panicked (the request went on as if the filter were absent).
static PANICS: AtomicU64 = AtomicU64::new(0);

/// How many hooks have panicked since the module was loaded.
pub fn panics() -> u64 {
    PANICS.load(Ordering::Relaxed)
}

/// Runs `body`; a panic becomes `fallback`, counted and reported once.
fn guarded<T>(hook: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    guarded_with(hook, fallback, body, || {})
}

/// [`guarded`], calling `on_panic` as well when `body` panics.
fn guarded_with<T>(
    hook: &str,
    fallback: T,
    body: impl FnOnce() -> T,
    on_panic: impl FnOnce(),
) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            if PANICS.fetch_add(1, Ordering::Relaxed) == 0 {
                eprintln!("sluice_native: {hook} panicked; the request continues unfiltered");
            }
            // Counting must not panic again across the boundary.
            let _ = catch_unwind(AssertUnwindSafe(on_panic));
            fallback
        }
    }
}

/// The bytes of an Envoy buffer, for the duration of the hook.
///
/// # Safety
/// `buffer` must be one Envoy passed to the running hook.
unsafe fn envoy_bytes<'a>(buffer: EnvoyBuffer) -> &'a [u8] {
    if buffer.ptr.is_null() {
        return &[];
    }
    // SAFETY: Envoy guarantees `length` readable bytes at `ptr` until the
    // hook returns, and callers do not keep the slice past it.
    unsafe { std::slice::from_raw_parts(buffer.ptr, buffer.length) }
}

/// Called once when Envoy loads the module.
#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    abi::ABI_VERSION.as_ptr()
}

/// A filter configuration: parsed here, refused (null) when invalid, which
/// makes Envoy reject the listener's configuration.
///
/// # Safety
/// Called by Envoy with buffers valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy_ptr: EnvoyPtr,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ModulePtr {
    // SAFETY: `config` is the buffer Envoy passed to this hook.
    let bytes = unsafe { envoy_bytes(config) };
    guarded("config_new", std::ptr::null(), || {
        // SAFETY: this is the running `config_new` hook of that
        // configuration, and the stats live inside the filter, which
        // `config_destroy` drops.
        let stats = Arc::new(unsafe { EnvoyStats::define(config_envoy_ptr) });
        let started = NativeConfig::parse(bytes)
            .map_err(|error| error.to_string())
            .and_then(|config| {
                NativeFilter::start(config, stats).map_err(|error| error.to_string())
            });
        match started {
            Ok(filter) => Box::into_raw(Box::new(filter)) as ModulePtr,
            Err(error) => {
                eprintln!("{error}");
                std::ptr::null()
            }
        }
    })
}

/// Envoy drops a configuration after every filter made from it is gone.
///
/// # Safety
/// `config` is a pointer `config_new` returned, passed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: ModulePtr) {
    if !config.is_null() {
        // SAFETY: `config` came from `Box::into_raw` in `config_new`, and
        // Envoy destroys each configuration once, after its last filter.
        drop(unsafe { Box::from_raw(config as *mut NativeFilter) });
    }
}

/// Per-route configuration is not supported: refused.
#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> ModulePtr {
    eprintln!("sluice_native: per-route configuration is not supported");
    std::ptr::null()
}

/// Nothing to free: per-route configurations are never created.
#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: ModulePtr) {
}

/// This request's state and the configuration's filter, from the pointer
/// `filter_new` returned; `None` when it returned null (no configuration).
///
/// # Safety
/// `filter` must be what `filter_new` returned for the request whose hook
/// is running, not yet destroyed; the references must not outlive the hook.
unsafe fn request_of<'a>(filter: ModulePtr) -> Option<(&'a mut RequestState, &'a NativeFilter)> {
    if filter.is_null() {
        return None;
    }
    // SAFETY: `filter` is this request's own `RequestState` (from
    // `Box::into_raw` in `filter_new`), which Envoy passes to one hook at a
    // time on the request's worker thread until `filter_destroy`.
    let state = unsafe { &mut *(filter as *mut RequestState) };
    // SAFETY: `state.filter` is the configuration's `NativeFilter`, which
    // Envoy keeps alive until this request's filter is destroyed; it is
    // only read.
    let native = unsafe { &*state.filter };
    Some((state, native))
}

/// A new request: its own [`RequestState`] over the configuration's filter
/// (null when the configuration is, which every hook lets through).
#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ModulePtr,
    _filter_envoy_ptr: EnvoyPtr,
) -> ModulePtr {
    if config.is_null() {
        return std::ptr::null();
    }
    let state = Box::new(RequestState {
        filter: config as *const NativeFilter,
        followed: None,
        charge: None,
    });
    Box::into_raw(state) as ModulePtr
}

/// The request's filter is gone: its state is freed.
///
/// # Safety
/// `filter` is a pointer `filter_new` returned, passed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: ModulePtr) {
    if !filter.is_null() {
        // SAFETY: `filter` came from `Box::into_raw` in `filter_new`, and
        // Envoy destroys each request's filter once, after its last hook.
        drop(unsafe { Box::from_raw(filter as *mut RequestState) });
    }
}

/// The request headers: the filter decides.
///
/// # Safety
/// Called by Envoy with the request's own pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy_ptr: EnvoyPtr,
    filter: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy passes this request's `filter_new` pointer to its hooks.
    let Some((state, native)) = (unsafe { request_of(filter) }) else {
        return abi::STATUS_CONTINUE;
    };
    // SAFETY: `filter_envoy_ptr` is this request's filter and the view is
    // dropped before the hook returns.
    let mut request = unsafe { EnvoyRequest::new(filter_envoy_ptr) };
    guarded_with(
        "request_headers",
        abi::STATUS_CONTINUE,
        || match native.on_request_headers(&mut request, &mut state.followed, &mut state.charge) {
            HeadersAction::Continue => abi::STATUS_CONTINUE,
            HeadersAction::Stop => abi::STATUS_STOP_ITERATION,
        },
        || native.count_hook_panic(),
    )
}

/// The response headers: a followed request's status and latency go into
/// the upstream signals.
///
/// # Safety
/// Called by Envoy with the request's own pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy_ptr: EnvoyPtr,
    filter: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy passes this request's `filter_new` pointer to its hooks.
    let Some((state, native)) = (unsafe { request_of(filter) }) else {
        return abi::STATUS_CONTINUE;
    };
    let Some(followed) = state.followed.take() else {
        return abi::STATUS_CONTINUE;
    };
    // SAFETY: `filter_envoy_ptr` is this request's filter and the view is
    // dropped before the hook returns.
    let request = unsafe { EnvoyRequest::new(filter_envoy_ptr) };
    guarded_with(
        "response_headers",
        abi::STATUS_CONTINUE,
        || {
            native.on_response_headers(&followed, &request);
            abi::STATUS_CONTINUE
        },
        || native.count_hook_panic(),
    )
}

/// A chunk of the response body: a costed request's parser reads it as it
/// passes (the hook always continues; nothing is buffered).
///
/// # Safety
/// Called by Envoy with the request's own pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter_envoy_ptr: EnvoyPtr,
    filter: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: Envoy passes this request's `filter_new` pointer to its hooks.
    let Some((state, native)) = (unsafe { request_of(filter) }) else {
        return abi::STATUS_CONTINUE;
    };
    let Some(pending) = &state.charge else {
        return abi::STATUS_CONTINUE;
    };
    if !pending.reads_body() {
        native.on_response_body(&mut state.charge, &[], end_of_stream);
        return abi::STATUS_CONTINUE;
    }
    // SAFETY: `filter_envoy_ptr` is this request's filter and the view is
    // dropped before the hook returns.
    let request = unsafe { EnvoyRequest::new(filter_envoy_ptr) };
    guarded_with(
        "response_body",
        abi::STATUS_CONTINUE,
        || {
            request.received_response_body(|chunk| {
                native.on_response_body(&mut state.charge, chunk, false);
            });
            native.on_response_body(&mut state.charge, &[], end_of_stream);
            abi::STATUS_CONTINUE
        },
        || native.count_hook_panic(),
    )
}

/// The response trailers: a costed request's response is complete.
///
/// # Safety
/// Called by Envoy with the request's own pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _filter_envoy_ptr: EnvoyPtr,
    filter: ModulePtr,
) -> u32 {
    // SAFETY: Envoy passes this request's `filter_new` pointer to its hooks.
    if let Some((state, native)) = unsafe { request_of(filter) } {
        native.on_response_trailers(&mut state.charge);
    }
    abi::STATUS_CONTINUE
}

/// The stream is complete (ended, reset or abandoned), before the filter
/// is destroyed: a costed request is charged.
///
/// # Safety
/// Called by Envoy with the request's own pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    filter_envoy_ptr: EnvoyPtr,
    filter: ModulePtr,
) {
    // SAFETY: Envoy passes this request's `filter_new` pointer to its hooks.
    let Some((state, native)) = (unsafe { request_of(filter) }) else {
        return;
    };
    let Some(pending) = state.charge.take() else {
        return;
    };
    // SAFETY: `filter_envoy_ptr` is this request's filter and the view is
    // dropped before the hook returns.
    let request = unsafe { EnvoyRequest::new(filter_envoy_ptr) };
    guarded_with(
        "stream_complete",
        (),
        || native.on_stream_complete(&request, pending),
        || native.count_hook_panic(),
    );
}

/// Defines a hook that does nothing and lets the stream continue.
macro_rules! continue_hook {
    ($name:ident $(, $arg:ident : $ty:ty)*) => {
        /// Not used by the filter: continue.
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(_envoy: EnvoyPtr, _filter: ModulePtr $(, $arg: $ty)*) -> u32 {
            $(let _ = $arg;)*
            abi::STATUS_CONTINUE
        }
    };
}

/// Defines a hook the filter has no use for.
macro_rules! ignored_hook {
    ($name:ident) => {
        /// Not used by the filter.
        #[unsafe(no_mangle)]
        pub extern "C" fn $name(_envoy: *mut c_void, _module: ModulePtr) {}
    };
}

continue_hook!(envoy_dynamic_module_on_http_filter_request_body, end_of_stream: bool);
continue_hook!(envoy_dynamic_module_on_http_filter_request_trailers);
continue_hook!(
    envoy_dynamic_module_on_http_filter_local_reply,
    response_code: u32,
    details: EnvoyBuffer,
    reset_imminent: bool
);

ignored_hook!(envoy_dynamic_module_on_http_filter_scheduled);
ignored_hook!(envoy_dynamic_module_on_http_filter_http_callout_done);
ignored_hook!(envoy_dynamic_module_on_http_filter_http_stream_headers);
ignored_hook!(envoy_dynamic_module_on_http_filter_http_stream_data);
ignored_hook!(envoy_dynamic_module_on_http_filter_http_stream_trailers);
ignored_hook!(envoy_dynamic_module_on_http_filter_http_stream_complete);
ignored_hook!(envoy_dynamic_module_on_http_filter_http_stream_reset);
ignored_hook!(envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark);
ignored_hook!(envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark);
ignored_hook!(envoy_dynamic_module_on_http_filter_config_scheduled);
ignored_hook!(envoy_dynamic_module_on_http_filter_config_http_callout_done);
ignored_hook!(envoy_dynamic_module_on_http_filter_config_http_stream_headers);
ignored_hook!(envoy_dynamic_module_on_http_filter_config_http_stream_data);
ignored_hook!(envoy_dynamic_module_on_http_filter_config_http_stream_trailers);
ignored_hook!(envoy_dynamic_module_on_http_filter_config_http_stream_complete);
ignored_hook!(envoy_dynamic_module_on_http_filter_config_http_stream_reset);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_a_hook_becomes_the_fallback_and_is_counted() {
        let before = panics();
        let status = guarded("test", abi::STATUS_CONTINUE, || -> u32 {
            std::panic::panic_any("boom")
        });
        assert_eq!(status, abi::STATUS_CONTINUE);
        assert_eq!(panics(), before + 1);
        let mut counted = false;
        let status = guarded_with(
            "test",
            abi::STATUS_CONTINUE,
            || -> u32 { std::panic::panic_any("boom") },
            || counted = true,
        );
        assert_eq!(status, abi::STATUS_CONTINUE);
        assert!(counted);
    }

    #[test]
    fn the_version_string_is_nul_terminated_ascii() {
        let version = abi::ABI_VERSION.to_str().ok();
        assert_eq!(version, Some("v0.2.0"));
    }
}
