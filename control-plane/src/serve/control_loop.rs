//! Runs the controller once per control interval and publishes the result;
//! between intervals, keeps heartbeats going. With replicas
//! ([`crate::replicas`]) the interval goes through the store: shares out,
//! fleet total in, the leader's table pushed.

use std::collections::HashMap;
use std::time::Instant;

use tokio::time::{self, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use sluice_proto::v1::ModePolicy;

use crate::control::controller::Controller;
use crate::fleet::Fleet;
use crate::fleet::health::UpstreamHealth;
use crate::replicas::{Replica, Upstream};
use crate::serve::push::{Published, Update};
use crate::state::AppState;

/// Ticks until `shutdown` is cancelled; with `replica`, as one of the
/// replicas sharing its store.
pub async fn run(
    state: AppState,
    mut controller: Controller,
    mut replica: Option<Replica>,
    shutdown: CancellationToken,
) {
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
            _ = interval.tick() => match replica.as_mut() {
                None => step(&state, &mut controller),
                Some(replica) => replicated_step(&state, &mut controller, replica).await,
            },
            _ = heartbeat.tick() => match replica.as_ref() {
                Some(replica) if replica.table().fence > 0 => {
                    heartbeat_with(&state, replica.table().modes);
                }
                _ => keep_alive(&state),
            },
        }
    }
    if let Some(replica) = replica.as_mut() {
        replica.resign().await;
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
    let load = state.tick_fleet();
    let health = observe_upstream(state);
    state.record_history(&load, &health);
    let (decision, modes) = {
        let policy = state.policy();
        let adapted = state.adapt(&policy, &load, &health);
        let decision = controller.decide(&load, adapted.as_ref().unwrap_or(&policy));
        (decision, policy.modes.to_wire())
    };
    metrics.observe_fleet(&load.stats);
    metrics.observe_buckets(&decision.buckets);
    state.set_buckets(decision.buckets);
    let changed = decision.changed.len();
    let published = state.publisher().publish(Update {
        changed: decision.changed,
        retired: decision.retired,
        modes,
        aggregate_patterns: aggregate_patterns(state),
    });
    record(state, published, changed);
    metrics.control_tick(started.elapsed());
}

/// One control interval of the start-up hold: the report windows close
/// and the admin API shows the fleet as reported so far, but nothing is
/// pushed and `controller` has not run yet, so the first directives come
/// from a fresh controller and the whole fleet. A throwaway controller of
/// the same policy computes the status: what would be pushed now.
fn hold(state: &AppState) {
    let load = state.tick_fleet();
    let health = observe_upstream(state);
    state.record_history(&load, &health);
    let decision = Controller::tracking(state.control_interval()).decide(&load, &state.policy());
    state.metrics().observe_fleet(&load.stats);
    state.metrics().observe_buckets(&decision.buckets);
    state.set_buckets(decision.buckets);
}

/// Between control intervals: publishes a mode change or a heartbeat if
/// one is due, without touching the fleet.
pub(crate) fn keep_alive(state: &AppState) {
    let modes = state.policy().modes.to_wire();
    heartbeat_with(state, modes);
}

/// The limits' aggregate patterns, pushed with every batch. A replica
/// pushes its own (every replica reads the same limits file, and the
/// patterns never depend on the load), not the leader's.
fn aggregate_patterns(state: &AppState) -> Vec<String> {
    state.policy().limits.aggregate_patterns().to_vec()
}

/// A heartbeat (or a change to `modes` or the aggregate patterns) if one
/// is due.
fn heartbeat_with(state: &AppState, modes: ModePolicy) {
    let published = state.publisher().publish(Update {
        modes,
        aggregate_patterns: aggregate_patterns(state),
        ..Update::default()
    });
    record(state, published, 0);
}

/// One control interval of a replica: share the load, decide on the fleet
/// total, lead if the lease is ours, push the table the store holds. A
/// store failure at any step leaves the pushed table as it was (its
/// heartbeats go on), so a replica that lost the store never pushes what
/// it computed from its own partial view.
pub(crate) async fn replicated_step(
    state: &AppState,
    controller: &mut Controller,
    replica: &mut Replica,
) {
    let started = Instant::now();
    let metrics = state.metrics();
    let (may_push, ended) = state.warmup().check(started);
    if let Some(ended) = ended {
        tracing::info!(?ended, "start-up hold over: pushing directives");
    }
    let (own, proxies) = state.tick_fleet_and(Fleet::connected_proxy_ids);
    metrics.observe_fleet(&own.stats);
    // This replica's metrics show its own proxies' signals; the adaptive
    // limits follow the fleet's, so the adaptive buckets' travel in the
    // share.
    let health = observe_upstream(state);
    let adaptive_health: Upstream = {
        let policy = state.policy();
        health
            .into_iter()
            .filter(|(bucket, _)| policy.adaptive.contains(bucket))
            .collect()
    };
    let shared = match replica.share(own, &proxies, adaptive_health).await {
        Ok(shared) => shared,
        Err(err) => {
            replica.step_down();
            metrics.replicas().store_failed("share");
            metrics.replicas().observe_leading(None);
            if replica.past_store_grace() {
                // The others count this replica's proxies at their last
                // rates only for a bounded time: let them go to a replica
                // that reaches the store.
                if state.set_accepting_streams(false) {
                    replica.hand_off();
                    metrics.replicas().observe_accepting_streams(false);
                    tracing::warn!(%err, "store unreachable past the grace: handing the proxies to the other replicas");
                }
            } else {
                tracing::warn!(%err, "store unreachable: keeping the last directives");
            }
            heartbeat_with(state, replica.table().modes);
            metrics.control_tick(started.elapsed());
            return;
        }
    };
    if state.set_accepting_streams(true) {
        metrics.replicas().observe_accepting_streams(true);
        tracing::info!("store reachable again: taking proxies' streams");
    }
    metrics
        .replicas()
        .observe_share(shared.replicas, shared.orphans, shared.unreadable);
    state.record_history(&shared.total, &shared.upstream);
    // Decide only on a whole view; otherwise a throwaway controller gives
    // the admin API its status and nothing is led.
    let decides = may_push && shared.complete;
    let (decision, modes) = {
        let policy = state.policy();
        let decision = if decides {
            let adapted = state.adapt(&policy, &shared.total, &shared.upstream);
            controller.decide(&shared.total, adapted.as_ref().unwrap_or(&policy))
        } else {
            Controller::tracking(state.control_interval()).decide(&shared.total, &policy)
        };
        (decision, policy.modes.to_wire())
    };
    metrics.observe_buckets(&decision.buckets);
    state.set_buckets(decision.buckets);
    if may_push {
        // The lease is renewed on every interval, the table written only
        // from a decision on a whole view.
        match replica.lead().await {
            Ok(Some(fence)) if decides => {
                if let Err(err) = replica
                    .publish(fence, &decision.changed, &decision.retired, modes)
                    .await
                {
                    replica.step_down();
                    metrics.replicas().store_failed("publish");
                    tracing::warn!(%err, "could not write the directive table");
                }
            }
            Ok(_) => {}
            Err(err) => {
                metrics.replicas().store_failed("lead");
                tracing::warn!(%err, "could not renew the lease");
            }
        }
    }
    metrics.replicas().observe_leading(replica.fence());
    if let Err(err) = replica.follow().await {
        metrics.replicas().store_failed("follow");
        tracing::warn!(%err, "could not read the directive table");
    }
    // A table any leader wrote is the fleet's, even during this replica's
    // own start-up hold: only deciding waits for the hold.
    if replica.table().fence > 0 {
        let table = replica.table();
        let changed = table.len();
        let published = state.publisher().publish_table(
            table.directives(),
            table.modes,
            aggregate_patterns(state),
        );
        record(state, published, changed);
    } else {
        // No leader has written a table yet: this replica's own modes.
        keep_alive(state);
    }
    metrics.control_tick(started.elapsed());
}

/// Closes the interval's upstream signals into the per-bucket metrics;
/// returns them for the adaptive limits.
fn observe_upstream(state: &AppState) -> HashMap<String, UpstreamHealth> {
    let health = state.take_upstream_health();
    if !health.is_empty() {
        let policy = state.policy();
        state
            .metrics()
            .upstream()
            .observe(&health, |bucket| policy.limits.limit_for(bucket).is_some());
    }
    health
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
