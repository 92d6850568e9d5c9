//! In-memory hosts: the agent outside a proxy, for tests and the simulator.

pub mod host;
#[cfg(test)]
pub mod request;
