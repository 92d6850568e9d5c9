//! Serving the proxies: `sluice serve` ([`command`]) and [`run`], the
//! gRPC streams, the fan-out of directive batches, the start-up hold, TLS,
//! the control loop that ties them together, and the rate limit service's
//! own listener.

pub(crate) mod accept;
pub(crate) mod command;
pub mod control_loop;
pub(crate) mod drain;
pub(crate) mod grpc;
pub(crate) mod push;
pub(crate) mod rls_listener;
pub(crate) mod run;
pub(crate) mod tls;
pub(crate) mod warmup;

use std::time::Duration;

/// HTTP/2 pings on every gRPC listener (the filters' and the rate limit
/// service's own) detect peers that vanished without closing the
/// connection: one every this long...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// ... and a connection whose ping is not answered within this long is
/// closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
