//! Serving the proxies: the gRPC streams, the fan-out of directive
//! batches, the shared state, the start-up hold, TLS and the control loop
//! that ties them together.

pub mod control_loop;
pub(crate) mod grpc;
pub(crate) mod push;
pub(crate) mod state;
pub(crate) mod tls;
pub(crate) mod warmup;
