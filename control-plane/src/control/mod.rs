//! Deciding: the tracking policy, fair shares and priorities, and the
//! controller that turns fleet load into directives every interval; the
//! recent fleet totals and what-if replays over them.

pub mod adaptive;
pub mod controller;
pub(crate) mod drop_policy;
pub mod estimator;
pub mod fairness;
pub(crate) mod history;
pub(crate) mod whatif;
