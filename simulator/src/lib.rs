//! A deterministic simulator of a Sluice fleet, for measuring how closely
//! the controller holds a limit (`sluice-simulate`, `just simulate`).
//!
//! Every simulated Envoy runs the agent library's own agent in each of its
//! workers' VMs ([`proxy`]), and the control plane's real fleet
//! ([`sluice_control_plane::fleet`]) and controller decide, on a simulated
//! millisecond clock, so that what it measures is the shipped code, not a
//! model of it. Only the network between them is simulated. Same scenario
//! and seed, same result.

pub mod adaptive;
pub mod adaptive_plot;
pub mod budget;
pub mod budget_plot;
pub mod chart;
pub mod command;
pub mod cost;
pub mod load;
pub mod metrics;
pub mod plot;
pub mod proxy;
pub mod report;
pub mod scenario;
pub mod sim;
pub mod upstream;

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod tests;
