//! Runs the controller once per control interval and publishes the result;
//! between intervals, keeps heartbeats going.

use std::time::Instant;

use tokio::time::{self, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::controller::Controller;
use crate::push::{Published, Update};
use crate::state::AppState;

/// Ticks until `shutdown` is cancelled.
pub async fn run(state: AppState, mut controller: Controller, shutdown: CancellationToken) {
    let mut interval = time::interval(state.control_interval().as_duration());
    // After a stall, keep the spacing instead of bursting through missed
    // ticks: each tick closes one report window, and back-to-back ticks
    // would see windows with no reports and carry stale rates.
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // With a control interval longer than the heartbeat cadence, heartbeats
    // (and mode changes) still go out on time.
    let mut heartbeat = time::interval(state.publisher().heartbeat_every());
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => step(&state, &mut controller),
            _ = heartbeat.tick() => keep_alive(&state),
        }
    }
    tracing::debug!("control loop stopped");
}

/// One control interval: close the report windows, decide, publish.
pub fn step(state: &AppState, controller: &mut Controller) {
    let started = Instant::now();
    let metrics = state.metrics();
    let (may_push, ended) = state.warmup().check(started);
    if let Some(ended) = ended {
        tracing::info!(?ended, "start-up hold over: pushing directives");
    }
    if !may_push {
        hold(state);
        metrics.control_tick(started.elapsed());
        return;
    }
    let load = state.fleet().tick();
    let (decision, modes) = {
        let policy = state.policy();
        (controller.decide(&load, &policy), policy.modes.to_wire())
    };
    metrics.observe_fleet(&load.stats);
    metrics.observe_buckets(&decision.buckets);
    state.set_buckets(decision.buckets);
    let changed = decision.changed.len();
    let published = state.publisher().publish(Update {
        changed: decision.changed,
        retired: decision.retired,
        modes,
    });
    record(state, published, changed);
    metrics.control_tick(started.elapsed());
}

/// One control interval of the start-up hold: the report windows close
/// and the admin API shows the fleet as reported so far, but nothing is
/// pushed and `controller` has not run yet, so the first directives come
/// from a fresh controller and the whole fleet. A throwaway controller
/// computes the status.
fn hold(state: &AppState) {
    let load = state.fleet().tick();
    let decision = Controller::default().decide(&load, &state.policy());
    state.metrics().observe_fleet(&load.stats);
    state.metrics().observe_buckets(&decision.buckets);
    state.set_buckets(decision.buckets);
}

/// Between control intervals: publishes a mode change or a heartbeat if
/// one is due, without touching the fleet.
pub fn keep_alive(state: &AppState) {
    let modes = state.policy().modes.to_wire();
    let published = state.publisher().publish(Update {
        modes,
        ..Update::default()
    });
    record(state, published, 0);
}

fn record(state: &AppState, published: Published, changed: usize) {
    let metrics = state.metrics();
    match published {
        Published::Nothing => {}
        Published::Delta { version } => {
            metrics.batch_published();
            tracing::debug!(version, changed, "pushed directives");
        }
        Published::Heartbeat { version } => {
            metrics.heartbeat_published();
            tracing::trace!(version, "heartbeat");
        }
    }
}
