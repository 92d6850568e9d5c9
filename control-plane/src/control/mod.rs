//! Deciding: the tracking policy, fair shares and priorities, and the
//! controller that turns fleet load into directives every interval.

pub mod controller;
pub mod estimator;
pub mod fairness;
