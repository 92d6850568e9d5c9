//! Simulated proxies against the real control plane, shared by the
//! propagation benchmark (`bench_propagation`) and the soak test (`soak`).
//!
//! - `sluice serve` itself is the integration tests' harness
//!   (`sluice_integration_tests::control_plane`), whose pid gives the
//!   `/proc` readings.
//! - [`stream`]: one simulated filter stream per tonic client and HTTP/2
//!   connection, speaking `sluice.v1.DirectiveService/Stream` like the
//!   filter's leader VM: a Hello, then a Report every interval, recording
//!   when each directive batch arrives.
//! - [`stats`]: quantiles and the `/metrics` push-latency histogram.

pub mod stats;
pub mod stream;
