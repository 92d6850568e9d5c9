//! A test fleet: one control plane and the Envoys of a test, built from the
//! repo's configs, everything on ephemeral loopback ports under one
//! scratch directory kept when the test fails.
//!
//! [`FleetOptions`] says what the control plane runs (limits, interval,
//! arguments, mutual TLS, quota files) and which Envoys start with it;
//! [`EnvoySpec`] describes any other Envoy (a repo config rewritten for
//! the test, or a generated one), started against the fleet
//! ([`Fleet::start_envoy`]), against replicas, or against no control
//! plane at all ([`EnvoySpec::start`] with a [`TestDir`]).

mod envoy_spec;
mod options;
mod running;
mod scratch;

pub use envoy_spec::{ControlPlaneTarget, DataPlane, EnvoyConfig, EnvoySpec};
pub use options::{FleetOptions, GrpcTls};
pub use running::Fleet;
pub use scratch::{TestDir, free_loopback_addr};
