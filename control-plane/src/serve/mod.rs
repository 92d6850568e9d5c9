//! Serving the proxies: the gRPC streams, the fan-out of directive
//! batches, the shared state, the start-up hold, TLS and the control loop
//! that ties them together.

pub mod control_loop;
pub mod grpc;
pub mod push;
pub mod state;
pub mod tls;
pub mod warmup;
