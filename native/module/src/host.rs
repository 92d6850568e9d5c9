//! One request as the agent's request handler sees it: [`HttpRequest`]
//! over Envoy's header, filter-state and local-reply callbacks, the
//! response's status and the module's monotonic clock.

use std::borrow::Cow;

use sluice_native_filter::{
    HostError, HttpRequest, Log, LogLevel, REJECT_STATUS, RejectResponse, RequestAttributes, Stderr,
};

use crate::abi::{self, EnvoyBuffer, EnvoyPtr, ModuleBuffer, ModuleHttpHeader};

/// Most headers a local reply carries; more are dropped.
const MAX_REPLY_HEADERS: usize = 16;
/// Why Envoy's access log says the module answered.
const REPLY_DETAILS: &[u8] = b"sluice_native";
/// Filter state key of the decision record: `%FILTER_STATE(sluice:PLAIN)%`.
const RECORD_KEY: &[u8] = b"sluice";

/// Envoy's filter object for the request being handled, valid for the
/// duration of the hook that created this view.
pub struct EnvoyRequest {
    filter: EnvoyPtr,
}

impl EnvoyRequest {
    /// A view of the request behind `filter`.
    ///
    /// # Safety
    /// `filter` must be the `filter_envoy_ptr` Envoy passed to the running
    /// hook, and the view must not outlive that hook.
    pub unsafe fn new(filter: EnvoyPtr) -> Self {
        Self { filter }
    }
}

impl EnvoyRequest {
    /// The first value of a header of the map `header_type`.
    fn header(&self, header_type: u32, name: &str) -> Option<&[u8]> {
        let mut value = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: `self.filter` is the live filter of the running hook (see
        // `new`); the key buffer points into `name`, alive for the call; the
        // result pointer is a local Envoy writes once; a null `optional_size`
        // is allowed by the ABI.
        let found = unsafe {
            abi::envoy_dynamic_module_callback_http_get_header(
                self.filter,
                header_type,
                ModuleBuffer::of(name.as_bytes()),
                &mut value,
                0,
                std::ptr::null_mut(),
            )
        };
        if !found || value.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy returned a pointer into its header map with its
        // length; the map is not modified while `&self` is borrowed (this view
        // has no setter), and the slice's lifetime is tied to `&self`, which
        // does not outlive the hook.
        Some(unsafe { std::slice::from_raw_parts(value.ptr, value.length) })
    }
}

impl RequestAttributes for EnvoyRequest {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.header(abi::HEADER_TYPE_REQUEST, name)
            .map(Cow::Borrowed)
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        let mut value = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: `self.filter` is the live filter of the running hook and
        // the result is a local Envoy writes once.
        let found = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.filter,
                abi::ATTRIBUTE_XDS_ROUTE_NAME,
                &mut value,
            )
        };
        if !found || value.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy returned a view of the route's name, which lives as
        // long as the route configuration, beyond this hook; the slice is
        // tied to `&self`.
        Some(Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(value.ptr, value.length)
        }))
    }
}

impl Log for EnvoyRequest {
    fn log(&self, level: LogLevel, message: &str) {
        Stderr.log(level, message);
    }
}

impl HttpRequest for EnvoyRequest {
    fn add_request_header(&mut self, name: &str, value: &str) -> Result<(), HostError> {
        // SAFETY: `self.filter` is the live filter of the running hook; both
        // buffers are borrowed for the call and Envoy copies them.
        unsafe {
            abi::envoy_dynamic_module_callback_http_add_header(
                self.filter,
                abi::HEADER_TYPE_REQUEST,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            );
        }
        Ok(())
    }

    fn set_decision_record(&mut self, record: &str) -> Result<(), HostError> {
        // SAFETY: as for `add_request_header`: live filter, borrowed buffers
        // that Envoy copies.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.filter,
                ModuleBuffer::of(RECORD_KEY),
                ModuleBuffer::of(record.as_bytes()),
            );
        }
        Ok(())
    }

    fn send_rejection(&mut self, response: &RejectResponse) -> Result<(), HostError> {
        let headers: Vec<ModuleHttpHeader> = response
            .headers
            .iter()
            .take(MAX_REPLY_HEADERS)
            .map(|(name, value)| ModuleHttpHeader {
                key_ptr: name.as_ptr(),
                key_length: name.len(),
                value_ptr: value.as_ptr(),
                value_length: value.len(),
            })
            .collect();
        // SAFETY: `self.filter` is the live filter of the running hook; every
        // pointer refers to memory borrowed for this call (the header array,
        // the names and values it points to, the body and the details), and
        // Envoy copies all of it before returning.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.filter,
                u32::from(REJECT_STATUS),
                headers.as_ptr(),
                headers.len(),
                ModuleBuffer::of(&response.body),
                ModuleBuffer::of(REPLY_DETAILS),
            );
        }
        Ok(())
    }

    fn response_status(&self) -> Option<Cow<'_, [u8]>> {
        self.header(abi::HEADER_TYPE_RESPONSE, ":status")
            .map(Cow::Borrowed)
    }

    fn clock_ns(&self) -> Option<u64> {
        sluice_native_filter::clock::monotonic_ns()
    }

    fn metadata_number(&self, namespace: &str, key: &str) -> Option<f64> {
        let mut value = 0.0_f64;
        // SAFETY: `self.filter` is the live filter of the running hook; the
        // namespace and key are borrowed for the call; the result is a
        // local Envoy writes at most once.
        let found = unsafe {
            abi::envoy_dynamic_module_callback_http_get_metadata_number(
                self.filter,
                abi::METADATA_SOURCE_DYNAMIC,
                ModuleBuffer::of(namespace.as_bytes()),
                ModuleBuffer::of(key.as_bytes()),
                &mut value,
            )
        };
        found.then_some(value)
    }

    fn response_header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.header(abi::HEADER_TYPE_RESPONSE, name)
            .map(Cow::Borrowed)
    }

    fn response_trailer(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.header(abi::HEADER_TYPE_RESPONSE_TRAILER, name)
            .map(Cow::Borrowed)
    }
}

impl EnvoyRequest {
    /// Hands each slice of the response body chunk the running
    /// response-body hook received to `read`, without copying it.
    pub fn received_response_body(&self, mut read: impl FnMut(&[u8])) {
        // SAFETY: `self.filter` is the live filter of the running hook.
        let count = unsafe {
            abi::envoy_dynamic_module_callback_http_get_body_chunks_size(
                self.filter,
                abi::BODY_TYPE_RECEIVED_RESPONSE,
            )
        };
        if count == 0 {
            return;
        }
        let mut slices = vec![
            EnvoyBuffer {
                ptr: std::ptr::null(),
                length: 0,
            };
            count
        ];
        // SAFETY: as above; `slices` has room for the `count` entries Envoy
        // just said the buffer has, and the buffer does not change during
        // the hook.
        let filled = unsafe {
            abi::envoy_dynamic_module_callback_http_get_body_chunks(
                self.filter,
                abi::BODY_TYPE_RECEIVED_RESPONSE,
                slices.as_mut_ptr(),
            )
        };
        if !filled {
            return;
        }
        for slice in slices {
            if slice.ptr.is_null() || slice.length == 0 {
                continue;
            }
            // SAFETY: Envoy filled in views of its buffer's slices, valid
            // until the hook returns; each is read here and not kept.
            read(unsafe { std::slice::from_raw_parts(slice.ptr, slice.length) });
        }
    }
}
