//! Serving the proxies: the gRPC streams, the fan-out of directive
//! batches, the start-up hold, TLS, the control loop that ties them
//! together, and the rate limit service's own listener.

pub(crate) mod accept;
pub mod control_loop;
pub mod drain;
pub(crate) mod grpc;
pub(crate) mod push;
pub mod rls_listener;
pub(crate) mod tls;
pub(crate) mod warmup;
