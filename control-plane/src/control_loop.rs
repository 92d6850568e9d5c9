//! Runs the controller once per control interval and publishes the result.

use std::time::Instant;

use tokio::time::{self, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::controller::Controller;
use crate::state::AppState;

/// Ticks until `shutdown` is cancelled.
pub async fn run(state: AppState, mut controller: Controller, shutdown: CancellationToken) {
    let mut interval = time::interval(state.control_interval().as_duration());
    // After a stall, keep the spacing instead of bursting through missed
    // ticks: each tick closes one report window, and back-to-back ticks
    // would see windows with no reports and carry stale rates.
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => step(&state, &mut controller),
        }
    }
    tracing::debug!("control loop stopped");
}

/// One control interval: close the report windows, decide, publish.
pub fn step(state: &AppState, controller: &mut Controller) {
    let started = Instant::now();
    let metrics = state.metrics();
    let load = state.fleet().tick();
    let decision = {
        let policy = state.policy();
        controller.tick(&load, &policy.limits)
    };
    metrics.observe_buckets(&decision.buckets);
    state.set_buckets(decision.buckets);
    let changed = decision.changed.len();
    if let Some(version) = state
        .publisher()
        .publish(decision.snapshot, decision.changed)
    {
        metrics.batch_published();
        tracing::debug!(version, changed, "pushed directives");
    }
    metrics.control_tick(started.elapsed());
}
