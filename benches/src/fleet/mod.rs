//! Simulated proxies against the real control plane, shared by the
//! propagation benchmark (`bench_propagation`) and the soak test (`soak`).
//!
//! - [`control_plane`]: `sluice serve` as a child process with its pid, for
//!   `/proc` readings.
//! - [`stream`]: one simulated filter stream per tonic client and HTTP/2
//!   connection, speaking `sluice.v1.DirectiveService/Stream` like the
//!   filter's leader VM: a Hello, then a Report every interval, recording
//!   when each directive batch arrives.
//! - [`stats`]: quantiles and the `/metrics` push-latency histogram.

pub mod control_plane;
pub mod stats;
pub mod stream;
