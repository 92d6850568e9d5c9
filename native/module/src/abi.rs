//! Types and callbacks of Envoy 1.40's dynamic-module ABI (`abi.h`), the part
//! the HTTP filter uses. Layouts follow the C header; x86-64 and aarch64 pass
//! the two-word buffer structs by value in two registers.

use std::ffi::c_void;

/// The version string the module reports at load. Envoy 1.40 compares it with
/// its own and logs a warning (not an error) when they differ.
pub const ABI_VERSION: &std::ffi::CStr = c"v0.2.0";

/// Envoy's side of a filter config or a filter: opaque, only passed back.
pub type EnvoyPtr = *mut c_void;
/// The module's side: what a `*_new` hook returned.
pub type ModulePtr = *const c_void;

/// Bytes owned by Envoy, valid until the hook that received them returns.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffer {
    /// First byte, or null.
    pub ptr: *const u8,
    /// Length in bytes.
    pub length: usize,
}

/// Bytes owned by the module; Envoy copies what it keeps.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleBuffer {
    /// First byte, or null when `length` is 0.
    pub ptr: *const u8,
    /// Length in bytes.
    pub length: usize,
}

impl ModuleBuffer {
    /// A view of `bytes` for the duration of one call.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }
}

/// One header of a local reply.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleHttpHeader {
    /// Name bytes.
    pub key_ptr: *const u8,
    /// Name length.
    pub key_length: usize,
    /// Value bytes.
    pub value_ptr: *const u8,
    /// Value length.
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_attribute_id_XdsRouteName` in Envoy 1.40.0's
/// ABI (the enum grows between releases; `native_module.rs` checks this
/// value against the binary by keying buckets on the route name).
pub const ATTRIBUTE_XDS_ROUTE_NAME: u32 = 61;

/// `envoy_dynamic_module_type_http_header_type_RequestHeader`.
pub const HEADER_TYPE_REQUEST: u32 = 0;
/// `envoy_dynamic_module_type_http_header_type_ResponseHeader`.
pub const HEADER_TYPE_RESPONSE: u32 = 2;
/// `envoy_dynamic_module_type_http_header_type_ResponseTrailer`.
pub const HEADER_TYPE_RESPONSE_TRAILER: u32 = 3;

/// `envoy_dynamic_module_type_http_body_type_ReceivedResponseBody`: the
/// chunk the running response-body hook received.
pub const BODY_TYPE_RECEIVED_RESPONSE: u32 = 2;

/// `envoy_dynamic_module_type_metadata_source_Dynamic`: the request's
/// dynamic metadata.
pub const METADATA_SOURCE_DYNAMIC: u32 = 0;

/// Envoy casts a hook's status to its own `FilterHeadersStatus` /
/// `FilterDataStatus` / `FilterTrailersStatus`: 0 is `Continue` in each.
pub const STATUS_CONTINUE: u32 = 0;
/// `FilterHeadersStatus::StopIteration`: the filter answered the request.
pub const STATUS_STOP_ITERATION: u32 = 1;

/// `envoy_dynamic_module_type_metrics_result_Success`.
pub const METRICS_SUCCESS: u32 = 0;

unsafe extern "C" {
    /// Defines a counter of the filter configuration (only while Envoy
    /// creates the configuration); its id goes to `id`.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config_envoy_ptr: EnvoyPtr,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;

    /// Defines a gauge, as `define_counter`.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config_envoy_ptr: EnvoyPtr,
        name: ModuleBuffer,
        label_names: *const ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> u32;

    /// Adds to a counter of the configuration.
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config_envoy_ptr: EnvoyPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;

    /// Sets a gauge of the configuration.
    pub fn envoy_dynamic_module_callback_http_filter_config_set_gauge(
        config_envoy_ptr: EnvoyPtr,
        id: usize,
        label_values: *const ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;

    /// Reads the `index`-th value of a header; `optional_size`, when not null,
    /// receives the number of values. Returns false when there is none.
    pub fn envoy_dynamic_module_callback_http_get_header(
        filter_envoy_ptr: EnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;

    /// Reads a string attribute of the request (route name, addresses…).
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter_envoy_ptr: EnvoyPtr,
        attribute_id: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// Adds a header value (request headers: before they go upstream).
    pub fn envoy_dynamic_module_callback_http_add_header(
        filter_envoy_ptr: EnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    /// The number of slices of a body buffer (0 when there is none).
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter_envoy_ptr: EnvoyPtr,
        body_type: u32,
    ) -> usize;

    /// Fills `result` (room for `get_body_chunks_size` entries) with views
    /// of a body buffer's slices; false when there is no such buffer.
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter_envoy_ptr: EnvoyPtr,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// Reads a number of the request's metadata of `source`; false when it
    /// is absent or not a number.
    pub fn envoy_dynamic_module_callback_http_get_metadata_number(
        filter_envoy_ptr: EnvoyPtr,
        source: u32,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut f64,
    ) -> bool;

    /// Stores bytes in the request's filter state under `key`.
    pub fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter_envoy_ptr: EnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    /// Sends a local reply; Envoy copies the headers, the body and the
    /// details before it returns.
    pub fn envoy_dynamic_module_callback_http_send_response(
        filter_envoy_ptr: EnvoyPtr,
        status_code: u32,
        headers: *const ModuleHttpHeader,
        headers_count: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
}
