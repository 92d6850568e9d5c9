//! What the module keeps per request between Envoy's hooks.

use sluice_native_filter::{FollowedRequest, NativeFilter, PendingCharge};

/// The object `filter_new` hands Envoy for one request: the configuration's
/// shared filter, and the request followed for the upstream signals, if it
/// is (set at the request headers, taken at the response headers).
pub struct RequestState {
    /// The configuration's filter; Envoy keeps the configuration alive
    /// until every request's filter made from it is destroyed.
    pub filter: *const NativeFilter,
    /// The request picked for the upstream signals.
    pub followed: Option<FollowedRequest>,
    /// An admitted request with a cost rule, charged when its stream
    /// completes.
    pub charge: Option<PendingCharge>,
}
