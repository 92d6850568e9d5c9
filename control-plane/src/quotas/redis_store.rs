//! Quota counters in Redis (`--store`): the counted descriptors of one
//! ShouldRateLimit request are decided by one `EVALSHA` of
//! [`counters.lua`](counters.lua) (one per cluster slot on a Redis
//! Cluster, sent at once), which runs the algorithms of
//! [`super::algorithm`] inside Redis, so that any number of control-plane
//! processes count against the same counters exactly.
//!
//! - **Clock**: the script reads Redis's own clock (`TIME`), so processes
//!   on machines whose clocks disagree still share one window boundary.
//! - **Keys**: `sluice:v2:{<descriptor>}:<algorithm>`; a fixed window's
//!   count is `sluice:v2:{<descriptor>}:fixed:<window start ms>`, one
//!   string per window incremented as envoyproxy/ratelimit increments its
//!   per-window keys. The hash tag is the descriptor (its domain and
//!   entries, length-prefixed), so a descriptor's keys share a slot while
//!   a domain's descriptors spread over a cluster's masters. The algorithm
//!   is part of the key because the state means something else under each
//!   (a GCRA schedule in µs, a window start in ms). `v2` versions the
//!   layout (`v1` hash-tagged the domain).
//! - **Expiry**: a fixed window's keys one window past its end; the
//!   others two windows after the last hit.
//! - **Failures**: a request's calls are bounded together by
//!   `--store-timeout-ms`; a timeout or an error fails every descriptor of
//!   the request, and the service answers by its failure policy.

use redis::Script;
use redis::cluster_routing::Slot;

use super::algorithm::{Algorithm, Direction, Quota, QuotaOutcome};
use super::store::CountError;
use crate::store::{Store, StoreConnection};

/// Version of the keys' layout and the state they hold.
const KEY_VERSION: &str = "v2";

/// One descriptor to count.
#[derive(Debug, Clone)]
pub struct Count {
    /// The descriptor's counter (see `service::counter_key`).
    pub counter: String,
    /// Its quota.
    pub quota: Quota,
    /// Hits to add (or give back).
    pub hits: u32,
    /// Whether they are taken, charged or refunded.
    pub direction: Direction,
}

impl Count {
    /// Whether these hits could take the counter over its limit (and so
    /// take part in `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`): a refund
    /// never does.
    pub(crate) fn adds(&self) -> bool {
        self.direction != Direction::Refund
    }
}

/// Counters in the shared store.
#[derive(Debug, Clone)]
pub struct RedisCounters {
    store: Store,
    script: Script,
}

impl RedisCounters {
    /// Counters in `store`; loads the script so that the first request
    /// already takes one round trip (a server that lost it, after a
    /// restart, a failover or a `SCRIPT FLUSH`, gets it again on
    /// `NOSCRIPT`).
    pub async fn new(store: Store) -> Result<Self, crate::store::StoreError> {
        let script = Script::new(include_str!("counters.lua"));
        let mut connection = store.connection();
        script.load_async(&mut connection).await.map_err(|err| {
            crate::store::StoreError::Connect {
                url: store.url().to_string(),
                reason: format!("cannot load the quota script: {err}"),
            }
        })?;
        Ok(Self { store, script })
    }

    /// Decides `counts` of a request on Redis's clock, within the store's
    /// timeout, over `connection` when given (a runtime's own,
    /// [`Self::open_connection`]), else the store's. With
    /// `stop_increment`, when some fixed window would go over its limit
    /// only the windows that would go over count these hits.
    pub(crate) async fn decide(
        &self,
        algorithm: Algorithm,
        counts: &[Count],
        stop_increment: bool,
        connection: Option<&StoreConnection>,
    ) -> Result<Vec<QuotaOutcome>, CountError> {
        let connection = connection
            .cloned()
            .unwrap_or_else(|| self.store.connection());
        let decided = self.decide_on(connection, algorithm, counts, stop_increment, None);
        tokio::time::timeout(self.store.timeout(), decided)
            .await
            .map_err(|_| CountError::Timeout)?
    }

    /// A connection of its own, whose reads and writes run on the runtime
    /// that opens it: a thread with a runtime of its own
    /// ([`crate::serve::rls_listener`]) then never wakes another thread
    /// for a quota's round trip. Calls are bounded as the store's are.
    pub(crate) async fn open_connection(&self) -> Result<StoreConnection, redis::RedisError> {
        self.store.connection_bounded(self.store.timeout()).await
    }

    /// As [`Self::decide`], at `now_ms` when given instead of Redis's
    /// clock: the service never passes one; it lets the script be checked
    /// against [`super::algorithm`] on the same instants.
    pub async fn decide_at(
        &self,
        algorithm: Algorithm,
        counts: &[Count],
        stop_increment: bool,
        now_ms: Option<u64>,
    ) -> Result<Vec<QuotaOutcome>, CountError> {
        let decided = self.decide_on(
            self.store.connection(),
            algorithm,
            counts,
            stop_increment,
            now_ms,
        );
        tokio::time::timeout(self.store.timeout(), decided)
            .await
            .map_err(|_| CountError::Timeout)?
    }

    /// One call, or on a cluster one call per slot at once. A cluster
    /// request whose descriptors span slots and that stops incrementing
    /// reads them all first (a zero-hit call per slot), then counts: the
    /// script can only decide across the keys of one slot.
    async fn decide_on(
        &self,
        connection: StoreConnection,
        algorithm: Algorithm,
        counts: &[Count],
        stop_increment: bool,
        now_ms: Option<u64>,
    ) -> Result<Vec<QuotaOutcome>, CountError> {
        if counts.is_empty() {
            return Ok(Vec::new());
        }
        if !self.store.is_cluster() {
            let mut connection = connection;
            return self
                .call(&mut connection, algorithm, counts, stop_increment, now_ms)
                .await;
        }
        let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
        for (index, count) in counts.iter().enumerate() {
            let slot = Slot::for_key(redis_key(algorithm, &count.counter, count.quota.window_ms));
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(index),
                None => groups.push((slot, vec![index])),
            }
        }
        if groups.len() == 1 {
            let mut connection = connection;
            return self
                .call(&mut connection, algorithm, counts, stop_increment, now_ms)
                .await;
        }
        let mut hits: Vec<u32> = counts.iter().map(|count| count.hits).collect();
        if stop_increment && algorithm == Algorithm::FixedWindow {
            let peeked = self
                .per_group(
                    &connection,
                    algorithm,
                    &peeks(counts),
                    &groups,
                    |_| 0,
                    now_ms,
                )
                .await?;
            let over: Vec<bool> = peeked
                .iter()
                .zip(counts)
                .map(|(decision, count)| {
                    count.adds()
                        && decision.used + u64::from(count.hits) > u64::from(count.quota.limit)
                })
                .collect();
            if over.iter().any(|over| *over) {
                for ((hits, over), count) in hits.iter_mut().zip(&over).zip(counts) {
                    if !over && count.adds() {
                        *hits = 0;
                    }
                }
            }
        }
        self.per_group(
            &connection,
            algorithm,
            counts,
            &groups,
            |index| hits.get(index).copied().unwrap_or(0),
            now_ms,
        )
        .await
    }

    /// One call per slot group, at once, with `hits(index)` hits each;
    /// the decisions back in the order of `counts`.
    async fn per_group(
        &self,
        connection: &StoreConnection,
        algorithm: Algorithm,
        counts: &[Count],
        groups: &[(Slot, Vec<usize>)],
        hits: impl Fn(usize) -> u32,
        now_ms: Option<u64>,
    ) -> Result<Vec<QuotaOutcome>, CountError> {
        let calls = groups.iter().map(|(_, members)| {
            let group: Vec<Count> = members
                .iter()
                .filter_map(|index| {
                    counts.get(*index).map(|count| Count {
                        hits: hits(*index),
                        ..count.clone()
                    })
                })
                .collect();
            let mut connection = connection.clone();
            async move {
                self.call(&mut connection, algorithm, &group, false, now_ms)
                    .await
            }
        });
        let answers = futures_util::future::join_all(calls).await;
        let mut decisions: Vec<Option<QuotaOutcome>> = vec![None; counts.len()];
        for ((_, members), answer) in groups.iter().zip(answers) {
            for (index, decision) in members.iter().zip(answer?) {
                if let Some(slot) = decisions.get_mut(*index) {
                    *slot = Some(decision);
                }
            }
        }
        decisions
            .into_iter()
            .map(|decision| {
                decision
                    .ok_or_else(|| CountError::Unavailable("no answer for a descriptor".to_owned()))
            })
            .collect()
    }

    async fn call(
        &self,
        connection: &mut StoreConnection,
        algorithm: Algorithm,
        counts: &[Count],
        stop_increment: bool,
        now_ms: Option<u64>,
    ) -> Result<Vec<QuotaOutcome>, CountError> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .arg(algorithm_name(algorithm))
            .arg(now_ms.map(|ms| ms.to_string()).unwrap_or_default())
            .arg(if stop_increment { "1" } else { "0" });
        for count in counts {
            invocation
                .key(redis_key(algorithm, &count.counter, count.quota.window_ms))
                .arg(count.quota.limit)
                .arg(count.quota.window_ms)
                .arg(count.quota.burst)
                .arg(count.hits)
                .arg(direction_name(count.direction));
        }
        let answers = invocation
            .invoke_async::<Vec<(i64, i64, i64, i64)>>(connection)
            .await
            .map_err(|err| {
                if err.is_timeout() {
                    CountError::Timeout
                } else {
                    CountError::Unavailable(err.to_string())
                }
            })?;
        if answers.len() != counts.len() {
            return Err(CountError::Unavailable(format!(
                "{} answers to {} descriptors",
                answers.len(),
                counts.len()
            )));
        }
        Ok(answers
            .into_iter()
            .map(|(admitted, remaining, reset_ms, used)| QuotaOutcome {
                admitted: admitted == 1,
                remaining: u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
                reset_ms: u64::try_from(reset_ms).unwrap_or(0),
                used: u64::try_from(used).unwrap_or(0),
            })
            .collect())
    }
}

/// Zero-hit reads of `counts` (a refund's counter read as any other).
fn peeks(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .map(|count| Count {
            hits: 0,
            direction: Direction::Take,
            ..count.clone()
        })
        .collect()
}

fn direction_name(direction: Direction) -> &'static str {
    match direction {
        Direction::Take => "t",
        Direction::Charge => "c",
        Direction::Refund => "r",
    }
}

fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fixed",
        Algorithm::SlidingWindow => "sliding",
        Algorithm::Gcra => "gcra",
    }
}

/// The Redis key of `counter` under `algorithm`; for a fixed window of
/// `window_ms`, the key holding the latest window start reached (see
/// [`fixed_window_key`]), per window length: a limit whose unit changes
/// counts afresh, as envoyproxy/ratelimit's keys do.
pub fn redis_key(algorithm: Algorithm, counter: &str, window_ms: u64) -> String {
    match algorithm {
        Algorithm::FixedWindow => format!("sluice:{KEY_VERSION}:{{{counter}}}:fixed:{window_ms}"),
        _ => format!(
            "sluice:{KEY_VERSION}:{{{counter}}}:{}",
            algorithm_name(algorithm)
        ),
    }
}

/// The key of `counter`'s fixed window of `window_ms` that starts at
/// `start_ms`: the hits counted in it, refused ones included.
pub fn fixed_window_key(counter: &str, window_ms: u64, start_ms: u64) -> String {
    format!(
        "{}:{start_ms}",
        redis_key(Algorithm::FixedWindow, counter, window_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptors_keys_share_a_slot_and_descriptors_spread() {
        let a = redis_key(Algorithm::FixedWindow, "3:api4:user1:a", 60_000);
        assert_eq!(a, "sluice:v2:{3:api4:user1:a}:fixed:60000");
        assert_eq!(
            fixed_window_key("3:api4:user1:a", 60_000, 120_000),
            "sluice:v2:{3:api4:user1:a}:fixed:60000:120000"
        );
        assert_eq!(
            Slot::for_key(&a),
            Slot::for_key(fixed_window_key("3:api4:user1:a", 60_000, 120_000))
        );
        assert_ne!(a, redis_key(Algorithm::Gcra, "3:api4:user1:a", 60_000));
        // A domain's descriptors land on many slots.
        let slots: std::collections::HashSet<Slot> = (0..64)
            .map(|n| {
                Slot::for_key(redis_key(
                    Algorithm::FixedWindow,
                    &format!("3:api4:user2:{n:02}"),
                    1_000,
                ))
            })
            .collect();
        assert!(slots.len() > 50, "{}", slots.len());
        // A brace in a value cuts the tag short, the same way for every key
        // of that descriptor: they still share a slot.
        let odd = "3:a}b1:k1:v";
        assert_eq!(
            Slot::for_key(redis_key(Algorithm::FixedWindow, odd, 1_000)),
            Slot::for_key(fixed_window_key(odd, 1_000, 5_000))
        );
    }
}
