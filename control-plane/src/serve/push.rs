//! Fan-out of directive batches to every open stream.
//!
//! One `tokio::sync::broadcast` channel carries `Arc<Outgoing>` deltas;
//! the current full set of directives sits next to it under the same lock, so
//! a new subscriber gets a snapshot and a receiver with no gap and no overlap
//! between them. The snapshot is kept up to date from the deltas, so a
//! control interval costs what changed, not what is known.
//!
//! Every batch carries the directive TTL and the mode policy. When nothing
//! changed for [`Publisher::heartbeat_every`], an empty batch goes out: it
//! tells each proxy that its whole table is still current, so a healthy
//! control plane keeps every proxy's directive age below that cadence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_proto::v1::{Directive, DirectiveBatch, ModePolicy};
use tokio::sync::broadcast::{self, error::RecvError};

use crate::control::controller::RetiredCell;
use crate::types::DirectiveTtl;
use sluice_core::directive::is_lift;

/// Longest time between two batches while the control plane runs.
pub(crate) const MAX_HEARTBEAT: Duration = Duration::from_secs(1);

/// How many deltas a stream may fall behind before it is resynchronised
/// with a snapshot instead.
const CAPACITY: usize = 64;

/// A batch as a subscription yields it.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// The batch.
    pub(crate) batch: DirectiveBatch,
    /// When the control loop published it; `None` for a snapshot sent to
    /// resynchronise a stream, which no control interval decided.
    pub(crate) decided_at: Option<Instant>,
}

/// Publishes directive batches; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Publisher {
    epoch: u64,
    ttl_ms: u64,
    heartbeat_every: Duration,
    inner: Arc<Mutex<Inner>>,
}

/// A directive's identity within the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct DirectiveKey {
    bucket: String,
    tenant: String,
    priority: i32,
}

impl DirectiveKey {
    fn of(directive: &Directive) -> Self {
        Self {
            bucket: directive.bucket.clone(),
            tenant: directive.tenant.clone(),
            priority: directive.priority,
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// Version of the latest batch (a snapshot carries the version of the
    /// state it shows; each delta increments it).
    version: u64,
    snapshot: HashMap<DirectiveKey, Directive>,
    modes: ModePolicy,
    aggregate_patterns: Vec<String>,
    /// When the last batch was broadcast.
    last_sent: Instant,
    sender: broadcast::Sender<Arc<Outgoing>>,
}

/// One control interval's changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Update {
    /// Directives that changed (upserted into the snapshot).
    pub(crate) changed: Vec<Directive>,
    /// Cells to take out of the snapshot after applying `changed`.
    pub(crate) retired: Vec<RetiredCell>,
    /// The mode policy in force.
    pub(crate) modes: ModePolicy,
    /// The limits' aggregate patterns, in file order.
    pub(crate) aggregate_patterns: Vec<String>,
}

/// What [`Publisher::publish`] broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Published {
    /// Nothing: no change, and the last batch is recent.
    Nothing,
    /// A delta with changed directives or a changed mode policy.
    Delta {
        /// Its version.
        version: u64,
    },
    /// An empty batch confirming that the table is current.
    Heartbeat {
        /// Its version.
        version: u64,
    },
}

impl Publisher {
    /// A publisher for `epoch` with no directive published yet and `modes`
    /// in force; every batch carries `ttl`, and heartbeats go out every
    /// [`MAX_HEARTBEAT`] or a quarter of the TTL, whichever is shorter.
    pub(crate) fn new(epoch: u64, ttl: DirectiveTtl, modes: ModePolicy) -> Self {
        let (sender, _) = broadcast::channel(CAPACITY);
        let ttl_ms = ttl.as_millis();
        Self {
            epoch,
            ttl_ms,
            heartbeat_every: MAX_HEARTBEAT.min(Duration::from_millis(ttl_ms / 4)),
            inner: Arc::new(Mutex::new(Inner {
                // 0 is what an unset protobuf field reads as; start above it.
                version: 1,
                snapshot: HashMap::new(),
                modes,
                aggregate_patterns: Vec::new(),
                last_sent: Instant::now(),
                sender,
            })),
        }
    }

    /// The epoch every batch carries.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The longest time between two batches.
    pub(crate) fn heartbeat_every(&self) -> Duration {
        self.heartbeat_every
    }

    /// Applies `update` to the snapshot and broadcasts it as the next delta
    /// if a directive or the mode policy changed; with no change, broadcasts
    /// an empty heartbeat once [`Publisher::heartbeat_every`] has passed
    /// since the last batch.
    pub(crate) fn publish(&self, update: Update) -> Published {
        self.publish_at(update, Instant::now())
    }

    /// [`Publisher::publish`] at a given time.
    pub(crate) fn publish_at(&self, update: Update, now: Instant) -> Published {
        let Update {
            changed,
            retired,
            modes,
            aggregate_patterns,
        } = update;
        let mut inner = self.lock();
        for directive in &changed {
            // A lift enforces nothing: a new stream needs no entry for it.
            if is_lift(directive) {
                inner.snapshot.remove(&DirectiveKey::of(directive));
            } else {
                inner
                    .snapshot
                    .insert(DirectiveKey::of(directive), directive.clone());
            }
        }
        for cell in retired {
            inner.snapshot.remove(&DirectiveKey {
                bucket: cell.bucket.as_ref().to_owned(),
                tenant: cell.tenant.as_ref().to_owned(),
                priority: cell.priority.to_wire() as i32,
            });
        }
        // The patterns travel with the modes: a change to either is a delta.
        let modes_changed = inner.modes != modes || inner.aggregate_patterns != aggregate_patterns;
        inner.modes = modes;
        inner.aggregate_patterns = aggregate_patterns;
        let heartbeat = now.saturating_duration_since(inner.last_sent) >= self.heartbeat_every;
        if changed.is_empty() && !modes_changed && !heartbeat {
            return Published::Nothing;
        }
        let is_heartbeat = changed.is_empty() && !modes_changed;
        inner.version += 1;
        inner.last_sent = now;
        let batch = Arc::new(Outgoing {
            batch: self.batch(inner.version, changed, &inner),
            decided_at: Some(now),
        });
        // An error only means no stream is open right now; the snapshot
        // already holds the new state for the next one.
        let _ = inner.sender.send(batch);
        if is_heartbeat {
            Published::Heartbeat {
                version: inner.version,
            }
        } else {
            Published::Delta {
                version: inner.version,
            }
        }
    }

    /// Makes `table` (every directive in force) and `modes` what is pushed:
    /// the directives that differ from the snapshot go out as a delta, and
    /// a cell the snapshot holds but `table` does not is lifted. A replica
    /// following a leader's table ([`crate::replicas`]) pushes through this.
    pub(crate) fn publish_table<'a>(
        &self,
        table: impl IntoIterator<Item = &'a Directive>,
        modes: ModePolicy,
        aggregate_patterns: Vec<String>,
    ) -> Published {
        let update = {
            let inner = self.lock();
            let mut absent: std::collections::HashSet<&DirectiveKey> =
                inner.snapshot.keys().collect();
            let mut changed = Vec::new();
            for directive in table {
                let key = DirectiveKey::of(directive);
                absent.remove(&key);
                if inner.snapshot.get(&key) != Some(directive) {
                    changed.push(directive.clone());
                }
            }
            let mut lifts: Vec<&DirectiveKey> = absent.into_iter().collect();
            lifts.sort_unstable();
            changed.extend(lifts.into_iter().map(|key| Directive {
                bucket: key.bucket.clone(),
                tenant: key.tenant.clone(),
                priority: key.priority,
                ..Directive::default()
            }));
            Update {
                changed,
                retired: Vec::new(),
                modes,
                aggregate_patterns,
            }
        };
        self.publish(update)
    }

    /// A snapshot of everything currently pushed, and a subscription to the
    /// deltas that follow it.
    pub(crate) fn subscribe(&self) -> (DirectiveBatch, Subscription) {
        let (snapshot, receiver) = self.snapshot_and_receiver();
        let subscription = Subscription {
            publisher: self.clone(),
            receiver,
        };
        (snapshot, subscription)
    }

    fn snapshot_and_receiver(&self) -> (DirectiveBatch, broadcast::Receiver<Arc<Outgoing>>) {
        let inner = self.lock();
        let mut directives: Vec<(&DirectiveKey, &Directive)> = inner.snapshot.iter().collect();
        directives.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let directives = directives.into_iter().map(|(_, d)| d.clone()).collect();
        let snapshot = self.batch(inner.version, directives, &inner);
        (snapshot, inner.sender.subscribe())
    }

    /// A batch of `directives` with what every batch carries (the TTL,
    /// the modes and the aggregate patterns in `inner`).
    fn batch(&self, version: u64, directives: Vec<Directive>, inner: &Inner) -> DirectiveBatch {
        DirectiveBatch {
            epoch: self.epoch,
            version,
            issued_at_unix_ms: unix_ms(SystemTime::now()),
            directives,
            ttl_ms: self.ttl_ms,
            modes: Some(inner.modes),
            aggregate_patterns: inner.aggregate_patterns.clone(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock; if something ever did, the
        // data is still a consistent snapshot, so keep serving it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The deltas after a snapshot, for one stream.
#[derive(Debug)]
pub(crate) struct Subscription {
    publisher: Publisher,
    receiver: broadcast::Receiver<Arc<Outgoing>>,
}

impl Subscription {
    /// The next batch to send. A stream that fell too far behind gets a fresh
    /// snapshot (merge semantics make that equivalent to the missed deltas)
    /// and continues from there. `None` once the publisher is gone.
    pub(crate) async fn next(&mut self) -> Option<Arc<Outgoing>> {
        match self.receiver.recv().await {
            Ok(batch) => Some(batch),
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "stream fell behind; resending a full snapshot");
                // Resubscribing (rather than reading on) skips the backlog:
                // those deltas are older than the snapshot and must not be
                // applied after it.
                let (snapshot, receiver) = self.publisher.snapshot_and_receiver();
                self.receiver = receiver;
                Some(Arc::new(Outgoing {
                    batch: snapshot,
                    decided_at: None,
                }))
            }
            Err(RecvError::Closed) => None,
        }
    }
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Priority;

    fn directive(bucket: &str, drop_ratio: f64) -> Directive {
        Directive {
            bucket: bucket.to_owned(),
            drop_ratio,
            limit_rps: Some(1.0),
            ..Default::default()
        }
    }

    fn changed(directives: Vec<Directive>) -> Update {
        Update {
            changed: directives,
            ..Update::default()
        }
    }

    fn publisher() -> Publisher {
        Publisher::new(
            42,
            DirectiveTtl::from_millis(4_000).unwrap(),
            ModePolicy::default(),
        )
    }

    #[tokio::test]
    async fn snapshot_then_deltas_in_order() {
        let publisher = publisher();
        let now = Instant::now();
        publisher.publish_at(changed(vec![directive("a", 0.5)]), now);
        let (snapshot, mut subscription) = publisher.subscribe();
        assert_eq!(snapshot.epoch, 42);
        assert_eq!(snapshot.version, 2);
        assert_eq!(snapshot.directives, [directive("a", 0.5)]);
        assert_eq!(snapshot.ttl_ms, 4_000);
        assert_eq!(snapshot.modes, Some(ModePolicy::default()));
        assert!(snapshot.issued_at_unix_ms > 0);

        assert_eq!(
            publisher.publish_at(changed(vec![]), now),
            Published::Nothing
        );
        assert_eq!(
            publisher.publish_at(changed(vec![directive("a", 0.7)]), now),
            Published::Delta { version: 3 }
        );
        let delta = subscription.next().await.unwrap();
        assert!(delta.decided_at.is_some());
        let delta = &delta.batch;
        assert_eq!(delta.version, 3);
        assert_eq!(delta.ttl_ms, 4_000);
        assert_eq!(delta.directives, [directive("a", 0.7)]);
    }

    #[tokio::test]
    async fn a_lift_is_pushed_but_leaves_no_entry_in_the_snapshot() {
        let publisher = publisher();
        let now = Instant::now();
        publisher.publish_at(changed(vec![directive("a", 0.5)]), now);
        let lift = crate::control::controller::lift("a", "", Priority::Unspecified);
        let (_, mut subscription) = publisher.subscribe();
        assert_eq!(
            publisher.publish_at(changed(vec![lift.clone()]), now),
            Published::Delta { version: 3 }
        );
        assert_eq!(subscription.next().await.unwrap().batch.directives, [lift]);
        assert!(publisher.subscribe().0.directives.is_empty());
    }

    #[tokio::test]
    async fn the_snapshot_follows_deltas_and_retirements() {
        let publisher = publisher();
        let mut cell = directive("a", 0.5);
        cell.tenant = "gold".into();
        cell.priority = Priority::Bulk.to_wire() as i32;
        publisher.publish(changed(vec![directive("b", 0.1), cell.clone()]));
        let (snapshot, _) = publisher.subscribe();
        assert_eq!(snapshot.directives, [cell.clone(), directive("b", 0.1)]);
        publisher.publish(Update {
            changed: vec![directive("b", 0.0)],
            retired: vec![RetiredCell {
                bucket: Arc::from("a"),
                tenant: Arc::from("gold"),
                priority: Priority::Bulk,
            }],
            modes: ModePolicy::default(),
            aggregate_patterns: Vec::new(),
        });
        let (snapshot, _) = publisher.subscribe();
        assert_eq!(snapshot.directives, [directive("b", 0.0)]);
    }

    #[tokio::test]
    async fn a_mode_change_alone_is_broadcast() {
        let publisher = publisher();
        let (_, mut subscription) = publisher.subscribe();
        let now = Instant::now();
        let kill = ModePolicy {
            kill_switch: true,
            ..ModePolicy::default()
        };
        let update = Update {
            modes: kill,
            ..Update::default()
        };
        assert!(matches!(
            publisher.publish_at(update.clone(), now),
            Published::Delta { .. }
        ));
        let batch = subscription.next().await.unwrap();
        assert!(batch.batch.directives.is_empty());
        assert_eq!(batch.batch.modes, Some(kill));
        assert_eq!(publisher.publish_at(update, now), Published::Nothing);
        assert_eq!(publisher.subscribe().0.modes, Some(kill));
    }

    #[tokio::test]
    async fn aggregate_patterns_travel_with_every_batch() {
        let publisher = publisher();
        let (_, mut subscription) = publisher.subscribe();
        let now = Instant::now();
        let update = Update {
            aggregate_patterns: vec!["free-*".into()],
            ..Update::default()
        };
        assert!(matches!(
            publisher.publish_at(update.clone(), now),
            Published::Delta { .. }
        ));
        let batch = subscription.next().await.unwrap();
        assert_eq!(batch.batch.aggregate_patterns, ["free-*"]);
        assert_eq!(publisher.publish_at(update, now), Published::Nothing);
        // A new stream's snapshot and every later delta carry them too.
        assert_eq!(publisher.subscribe().0.aggregate_patterns, ["free-*"]);
        publisher.publish_at(
            Update {
                changed: vec![directive("a", 0.5)],
                aggregate_patterns: vec!["free-*".into()],
                ..Update::default()
            },
            now,
        );
        let batch = subscription.next().await.unwrap();
        assert_eq!(batch.batch.aggregate_patterns, ["free-*"]);
        // Taking the pattern out of the limits is a change of its own.
        assert!(matches!(
            publisher.publish_at(Update::default(), now),
            Published::Delta { .. }
        ));
        let batch = subscription.next().await.unwrap();
        assert!(batch.batch.aggregate_patterns.is_empty());
    }

    #[tokio::test]
    async fn heartbeats_fill_quiet_periods() {
        let publisher = publisher();
        assert_eq!(publisher.heartbeat_every(), Duration::from_secs(1));
        let (_, mut subscription) = publisher.subscribe();
        let start = Instant::now();
        assert_eq!(
            publisher.publish_at(Update::default(), start),
            Published::Nothing
        );
        let later = start + Duration::from_millis(1_100);
        assert_eq!(
            publisher.publish_at(Update::default(), later),
            Published::Heartbeat { version: 2 }
        );
        assert_eq!(
            publisher.publish_at(Update::default(), later + Duration::from_millis(500)),
            Published::Nothing,
            "the heartbeat itself restarts the wait"
        );
        let heartbeat = subscription.next().await.unwrap();
        assert!(heartbeat.batch.directives.is_empty());
        assert_eq!(heartbeat.batch.ttl_ms, 4_000);

        // A short TTL shortens the cadence to a quarter of it.
        let short = Publisher::new(
            1,
            DirectiveTtl::from_millis(1_000).unwrap(),
            ModePolicy::default(),
        );
        assert_eq!(short.heartbeat_every(), Duration::from_millis(250));
    }

    #[tokio::test]
    async fn lagging_subscriber_gets_a_fresh_snapshot() {
        let publisher = publisher();
        let (_, mut subscription) = publisher.subscribe();
        let total = CAPACITY + 10;
        for i in 0..total {
            publisher.publish(changed(vec![directive(&format!("b{i:03}"), 0.5)]));
        }
        let resync = subscription.next().await.unwrap();
        assert!(
            resync.decided_at.is_none(),
            "a snapshot has no decision time"
        );
        let batch = &resync.batch;
        assert_eq!(
            batch.version,
            1 + total as u64,
            "snapshot of the latest state"
        );
        assert_eq!(batch.directives.len(), total);

        // And it keeps receiving deltas after the resync.
        publisher.publish(changed(vec![directive("z", 0.1)]));
        let next = subscription.next().await.unwrap();
        assert_eq!(next.batch.version, 2 + total as u64);
    }

    #[tokio::test]
    async fn a_table_goes_out_as_its_difference_and_lifts_what_it_lacks() {
        let publisher = publisher();
        publisher.publish(changed(vec![directive("a", 0.5), directive("b", 0.2)]));
        let (_, mut subscription) = publisher.subscribe();
        let table = [directive("a", 0.5), directive("c", 0.1)];
        let published = publisher.publish_table(table.iter(), ModePolicy::default(), Vec::new());
        assert!(
            matches!(published, Published::Delta { .. }),
            "{published:?}"
        );
        let delta = subscription.next().await.unwrap();
        let named: Vec<(&str, f64)> = delta
            .batch
            .directives
            .iter()
            .map(|d| (d.bucket.as_str(), d.drop_ratio))
            .collect();
        // "a" is unchanged and not resent; "c" is new; "b" is lifted.
        assert_eq!(named, [("c", 0.1), ("b", 0.0)]);
        assert!(is_lift(&delta.batch.directives[1]));
        let (snapshot, _) = publisher.subscribe();
        let mut held: Vec<&str> = snapshot
            .directives
            .iter()
            .map(|d| d.bucket.as_str())
            .collect();
        held.sort_unstable();
        assert_eq!(held, ["a", "c"]);
        // The same table again changes nothing.
        let again = publisher.publish_table(table.iter(), ModePolicy::default(), Vec::new());
        assert!(matches!(again, Published::Nothing), "{again:?}");
    }
}
