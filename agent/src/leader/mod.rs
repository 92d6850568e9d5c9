//! What only the leading agent of a process does: own the control-plane
//! stream, align every agent's counts to report windows and report them,
//! merge the directive batches and publish them and the process's rates.

pub mod counters;
pub(crate) mod grpc_service;
pub(crate) mod leadership;
pub(crate) mod process_rates;
pub(crate) mod report_window;
pub(crate) mod stream;
