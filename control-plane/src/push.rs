//! Fan-out of directive batches to every open stream.
//!
//! One `tokio::sync::broadcast` channel carries `Arc<Outgoing>` deltas;
//! the current full set of directives sits next to it under the same lock, so
//! a new subscriber gets a snapshot and a receiver with no gap and no overlap
//! between them.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sluice_proto::v1::{Directive, DirectiveBatch};
use tokio::sync::broadcast::{self, error::RecvError};

/// How many deltas a stream may fall behind before it is resynchronised
/// with a snapshot instead.
const CAPACITY: usize = 64;

/// A batch as a subscription yields it.
#[derive(Debug)]
pub struct Outgoing {
    /// The batch.
    pub batch: DirectiveBatch,
    /// When the control loop published it; `None` for a snapshot sent to
    /// resynchronise a stream, which no control interval decided.
    pub decided_at: Option<Instant>,
}

/// Publishes directive batches; cheap to clone.
#[derive(Debug, Clone)]
pub struct Publisher {
    epoch: u64,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    /// Version of the latest batch (a snapshot carries the version of the
    /// state it shows; each delta increments it).
    version: u64,
    snapshot: Vec<Directive>,
    sender: broadcast::Sender<Arc<Outgoing>>,
}

impl Publisher {
    /// A publisher for `epoch` with nothing published yet.
    pub fn new(epoch: u64) -> Self {
        let (sender, _) = broadcast::channel(CAPACITY);
        Self {
            epoch,
            inner: Arc::new(Mutex::new(Inner {
                // 0 is what an unset protobuf field reads as; start above it.
                version: 1,
                snapshot: Vec::new(),
                sender,
            })),
        }
    }

    /// The epoch every batch carries.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Replaces the snapshot and, if `changed` is not empty, broadcasts it as
    /// the next delta. Returns the delta's version, if one was sent.
    pub fn publish(&self, snapshot: Vec<Directive>, changed: Vec<Directive>) -> Option<u64> {
        let mut inner = self.lock();
        inner.snapshot = snapshot;
        if changed.is_empty() {
            return None;
        }
        inner.version += 1;
        let batch = Arc::new(Outgoing {
            batch: self.batch(inner.version, changed),
            decided_at: Some(Instant::now()),
        });
        // An error only means no stream is open right now; the snapshot
        // already holds the new state for the next one.
        let _ = inner.sender.send(batch);
        Some(inner.version)
    }

    /// A snapshot of everything currently pushed, and a subscription to the
    /// deltas that follow it.
    pub fn subscribe(&self) -> (DirectiveBatch, Subscription) {
        let (snapshot, receiver) = self.snapshot_and_receiver();
        let subscription = Subscription {
            publisher: self.clone(),
            receiver,
        };
        (snapshot, subscription)
    }

    fn snapshot_and_receiver(&self) -> (DirectiveBatch, broadcast::Receiver<Arc<Outgoing>>) {
        let inner = self.lock();
        let snapshot = self.batch(inner.version, inner.snapshot.clone());
        (snapshot, inner.sender.subscribe())
    }

    fn batch(&self, version: u64, directives: Vec<Directive>) -> DirectiveBatch {
        DirectiveBatch {
            epoch: self.epoch,
            version,
            issued_at_unix_ms: unix_ms(SystemTime::now()),
            directives,
            ..Default::default()
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
pub struct Subscription {
    publisher: Publisher,
    receiver: broadcast::Receiver<Arc<Outgoing>>,
}

impl Subscription {
    /// The next batch to send. A stream that fell too far behind gets a fresh
    /// snapshot (merge semantics make that equivalent to the missed deltas)
    /// and continues from there. `None` once the publisher is gone.
    pub async fn next(&mut self) -> Option<Arc<Outgoing>> {
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

    fn directive(bucket: &str, drop_ratio: f64) -> Directive {
        Directive {
            bucket: bucket.to_owned(),
            drop_ratio,
            limit_rps: 1.0,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn snapshot_then_deltas_in_order() {
        let publisher = Publisher::new(42);
        publisher.publish(vec![directive("a", 0.5)], vec![directive("a", 0.5)]);
        let (snapshot, mut subscription) = publisher.subscribe();
        assert_eq!(snapshot.epoch, 42);
        assert_eq!(snapshot.version, 2);
        assert_eq!(snapshot.directives, [directive("a", 0.5)]);
        assert!(snapshot.issued_at_unix_ms > 0);

        assert_eq!(publisher.publish(vec![directive("a", 0.5)], vec![]), None);
        assert_eq!(
            publisher.publish(vec![directive("a", 0.7)], vec![directive("a", 0.7)]),
            Some(3)
        );
        let delta = subscription.next().await.unwrap();
        assert!(delta.decided_at.is_some());
        let delta = &delta.batch;
        assert_eq!(delta.version, 3);
        assert_eq!(delta.directives, [directive("a", 0.7)]);
    }

    #[tokio::test]
    async fn lagging_subscriber_gets_a_fresh_snapshot() {
        let publisher = Publisher::new(1);
        let (_, mut subscription) = publisher.subscribe();
        let total = CAPACITY + 10;
        for i in 0..total {
            let d = directive(&format!("b{i}"), 0.5);
            publisher.publish(vec![d.clone()], vec![d]);
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
        assert_eq!(
            batch.directives,
            [directive(&format!("b{}", total - 1), 0.5)]
        );

        // And it keeps receiving deltas after the resync.
        publisher.publish(vec![], vec![directive("z", 0.1)]);
        let next = subscription.next().await.unwrap();
        assert_eq!(next.batch.version, 2 + total as u64);
    }
}
