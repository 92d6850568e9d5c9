//! Control-plane replicas sharing one Redis (`--store`): each publishes its
//! proxies' load, one leader decides on the fleet total, every replica
//! pushes the leader's table to its own proxies.
//!
//! Every control interval a replica:
//! 1. publishes its own share of the load ([`load`]) under a key that
//!    expires after a few intervals, and reads the other live replicas'
//!    shares: the sum is the fleet total;
//! 2. runs its controller on the total (every replica does, so a new
//!    leader's tracking state is warm and its first table continues the
//!    last one instead of stepping);
//! 3. acquires or renews the leader lease ([`acquire.lua`](acquire.lua));
//!    the leader writes its table ([`record`]) through
//!    [`publish.lua`](publish.lua), which refuses a writer that no longer
//!    holds the lease under its fence;
//! 4. reads the table and pushes what changed to its own streams, under its
//!    own epoch.
//!
//! Fail static: a replica that cannot reach the store neither leads nor
//! adopts anything; its streams keep the last table and their heartbeats.
//! So no replica ever pushes directives computed from a partial view.
//!
//! Partitions: the others still count a vanished share (its replica's
//! proxies may still be enforcing that replica's last table) until those
//! proxies show up in a live share or [`ReplicaOptions::orphan_hold`]
//! passes; a replica cut off for [`ReplicaOptions::store_grace`] closes
//! its streams and refuses new ones, so its proxies move to a replica
//! that reaches the store (see `serve::control_loop`).

pub(crate) mod load;
pub(crate) mod record;
pub(crate) mod transfer;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Script;
use sluice_proto::v1::{Directive, ModePolicy};
use tokio::time::Instant;

use crate::control::controller::RetiredCell;
use crate::fleet::health::merge_health;
use crate::fleet::{BucketTraffic, FleetLoad};
use crate::store::Store;
use crate::store::keys::{self, Keys};
pub use load::Upstream;
pub(crate) use record::Record;

/// Longest wait for a replica's own connection to open at `join`.
const CONNECT_BOUND: Duration = Duration::from_secs(2);

/// Replicas whose share expired this long ago leave the index.
const INDEX_RETENTION: Duration = Duration::from_secs(60);

/// Why one exchange with the store failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The store did not answer in time.
    #[error("the store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store answered with an error or the connection is down.
    #[error("store: {0}")]
    Store(#[from] redis::RedisError),
    /// The store holds another layout's keys.
    #[error(
        "the store holds Sluice state in format {found}; this build reads format {}: refusing to read or write it",
        keys::FORMAT
    )]
    Format {
        /// The format it names.
        found: String,
    },
}

/// How one replica takes part.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// This replica's name in the store (unique among the replicas).
    pub id: String,
    /// The control interval (every replica should run the same).
    pub control_interval: Duration,
    /// How long this replica, cut off from the store, keeps serving its
    /// proxies the last table before handing them to the other replicas
    /// (`--store-grace-ms`; every replica should run the same).
    pub store_grace: Duration,
}

impl ReplicaOptions {
    /// How long a share counts after its replica stopped publishing: three
    /// control intervals, at least one second.
    pub(crate) fn share_ttl(&self) -> Duration {
        (self.control_interval * 3).max(Duration::from_secs(1))
    }

    /// How long the lease outlives the leader's last renewal: five control
    /// intervals, at least one second. A dead leader is replaced after
    /// this; meanwhile every replica keeps pushing the last table.
    pub(crate) fn lease_ttl(&self) -> Duration {
        (self.control_interval * 5).max(Duration::from_secs(1))
    }

    /// Bound on one exchange with the store: half an interval, at least
    /// 100 ms.
    pub(crate) fn call_timeout(&self) -> Duration {
        (self.control_interval / 2).max(Duration::from_millis(100))
    }

    /// How long a vanished share still counts unless its proxies show up
    /// in a live share first: its replica may be cut off from the store
    /// and still serving them its last table for [`Self::store_grace`],
    /// and once it lets them go they need up to the filter's longest
    /// reconnect delay and one share lifetime to be counted elsewhere.
    pub(crate) fn orphan_hold(&self) -> Duration {
        self.store_grace
            + self.share_ttl()
            + Duration::from_millis(sluice_core::backoff::MAX_DELAY_MS)
    }
}

/// Default [`ReplicaOptions::store_grace`].
pub(crate) const DEFAULT_STORE_GRACE: Duration = Duration::from_secs(10);

/// The last share read from another replica.
#[derive(Debug)]
struct LastShare {
    /// As stored (decoded again only if it has to stand in).
    bytes: Vec<u8>,
    /// When it was last read live.
    seen: Instant,
}

/// What one interval's exchange of shares found.
#[derive(Debug)]
pub struct Shared {
    /// The fleet total: this replica's share plus the others'.
    pub total: FleetLoad,
    /// Replicas whose live share counted, this one included.
    pub replicas: usize,
    /// Vanished shares still counted (their proxies have not shown up
    /// elsewhere yet).
    pub orphans: usize,
    /// Shares refused as unreadable (another layout, corruption).
    pub(crate) unreadable: usize,
    /// The upstream signals of the interval over the live replicas' proxies
    /// (this replica's own included), per adaptive bucket. Vanished shares'
    /// signals are not counted again: they are old news.
    pub upstream: Upstream,
    /// Whether the total may be decided on: this replica has shared for a
    /// whole share lifetime without a failure (so every live replica's
    /// share is in, also after the store came back empty), and no share
    /// vanished since the last interval (a flushed store or a replica
    /// gone: one interval later the view is whole again or the loss is
    /// real).
    pub complete: bool,
}

/// One replica's handle on the shared state.
#[derive(Debug)]
pub struct Replica {
    /// This replica's own connection, bounded by its call timeout rather
    /// than the request bound of the shared one.
    connection: crate::store::StoreConnection,
    keys: Keys,
    options: ReplicaOptions,
    acquire: Script,
    publish: Script,
    release: Script,
    /// The fence while this replica holds the lease.
    fence: Option<u64>,
    /// The highest fence seen (handed to `acquire.lua` as a floor).
    highest_fence: u64,
    /// The last table read or written.
    table: Record,
    /// The stored table was missing at the last read (a flushed store):
    /// the leader writes its table again even if nothing changed.
    table_missing: bool,
    /// Since when every share succeeded.
    sharing_since: Option<Instant>,
    /// Shares counted (live and orphaned) by the last successful share.
    last_replicas: usize,
    /// Since when every exchange with the store failed.
    failing_since: Option<Instant>,
    /// The other replicas' last shares, by replica id.
    last_shares: HashMap<String, LastShare>,
    /// This replica let its proxies go (past its store grace) and has not
    /// shared since.
    handed_off: bool,
    /// Back from a hand-off: its view is not whole before this.
    rejoining_until: Option<Instant>,
}

impl Replica {
    /// Joins the replicas sharing `store`; fails if the store holds another
    /// layout's state.
    pub async fn join(store: Store, options: ReplicaOptions) -> Result<Self, ReplicaError> {
        let connection = tokio::time::timeout(
            options.call_timeout() + CONNECT_BOUND,
            store.connection_bounded(options.call_timeout()),
        )
        .await
        .map_err(|_| ReplicaError::Timeout(options.call_timeout() + CONNECT_BOUND))??;
        let replica = Self {
            connection,
            keys: Keys::default(),
            options,
            acquire: Script::new(include_str!("acquire.lua")),
            publish: Script::new(include_str!("publish.lua")),
            release: Script::new(RELEASE),
            fence: None,
            highest_fence: 0,
            table: Record::default(),
            table_missing: false,
            sharing_since: None,
            last_replicas: 0,
            failing_since: None,
            last_shares: HashMap::new(),
            handed_off: false,
            rejoining_until: None,
        };
        let mut connection = replica.connection.clone();
        let format: Option<String> = replica
            .bounded(
                redis::pipe()
                    .cmd("SET")
                    .arg(&replica.keys.format)
                    .arg(keys::FORMAT)
                    .arg("NX")
                    .ignore()
                    .cmd("GET")
                    .arg(&replica.keys.format)
                    .query_async::<(Option<String>,)>(&mut connection),
            )
            .await?
            .0;
        check_format(format)?;
        Ok(replica)
    }

    /// This replica's id.
    pub(crate) fn id(&self) -> &str {
        &self.options.id
    }

    /// The fence while this replica leads.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// The table last read or written.
    pub fn table(&self) -> &Record {
        &self.table
    }

    /// Publishes `own` (this replica's tick), the ids of the proxies it
    /// serves and their `upstream` signals (for the adaptive buckets), and
    /// returns the fleet total over the live replicas (and the orphaned
    /// shares). Two round trips.
    pub async fn share(
        &mut self,
        own: FleetLoad,
        proxies: &[String],
        upstream: Upstream,
    ) -> Result<Shared, ReplicaError> {
        let shared = self.exchange_shares(own, proxies, upstream).await;
        match &shared {
            Ok(_) => {
                self.settle();
                self.failing_since = None;
                if std::mem::take(&mut self.handed_off) {
                    // The proxies it let go (and, after an outage of the
                    // whole store, every other replica's) come back on
                    // their own reconnect delays, up to the filter's
                    // longest: until then a total would miss some of them.
                    self.rejoining_until = Some(Instant::now() + self.rejoin_hold());
                }
            }
            Err(_) => {
                self.sharing_since = None;
                self.failing_since.get_or_insert_with(Instant::now);
            }
        }
        shared.map(|mut shared| {
            let counted = shared.replicas + shared.orphans;
            shared.complete = self.is_settled(counted);
            self.last_replicas = counted;
            shared
        })
    }

    /// Whether this replica has failed to reach the store for longer than
    /// its grace: its proxies should go to a replica that reaches it.
    pub(crate) fn past_store_grace(&self) -> bool {
        self.failing_since
            .is_some_and(|since| since.elapsed() >= self.options.store_grace)
    }

    fn settle(&mut self) {
        if self.sharing_since.is_none() {
            self.sharing_since = Some(Instant::now());
        }
    }

    fn is_settled(&self, replicas: usize) -> bool {
        self.shared_long_enough()
            && replicas >= self.last_replicas
            && self
                .rejoining_until
                .is_none_or(|until| Instant::now() >= until)
    }

    /// How long a replica back from a hand-off waits before deciding: the
    /// filter's longest reconnect delay and a share lifetime.
    fn rejoin_hold(&self) -> Duration {
        Duration::from_millis(sluice_core::backoff::MAX_DELAY_MS) + self.options.share_ttl()
    }

    /// Notes that this replica let its proxies go (closed their streams
    /// past its store grace): back on the store, it decides again only
    /// once they have had time to return.
    pub(crate) fn hand_off(&mut self) {
        self.handed_off = true;
    }

    /// Whether every share since a whole share lifetime ago succeeded.
    fn shared_long_enough(&self) -> bool {
        self.sharing_since
            .is_some_and(|since| since.elapsed() >= self.options.share_ttl())
    }

    async fn exchange_shares(
        &mut self,
        own: FleetLoad,
        proxies: &[String],
        mut upstream: Upstream,
    ) -> Result<Shared, ReplicaError> {
        let now_ms = unix_ms();
        let ttl_ms = millis(self.options.share_ttl());
        let retention_ms = millis(INDEX_RETENTION);
        let mut connection = self.connection.clone();
        let (format, members): (Option<String>, Vec<String>) = self
            .bounded(
                redis::pipe()
                    .cmd("SET")
                    .arg(self.keys.load(&self.options.id))
                    .arg(load::encode(&own, proxies, &upstream))
                    .arg("PX")
                    .arg(ttl_ms)
                    .ignore()
                    .cmd("ZADD")
                    .arg(&self.keys.replicas)
                    .arg(now_ms)
                    .arg(&self.options.id)
                    .ignore()
                    .cmd("ZREMRANGEBYSCORE")
                    .arg(&self.keys.replicas)
                    .arg("-inf")
                    .arg(now_ms.saturating_sub(retention_ms))
                    .ignore()
                    // A flushed store gets its format key back.
                    .cmd("SET")
                    .arg(&self.keys.format)
                    .arg(keys::FORMAT)
                    .arg("NX")
                    .ignore()
                    .cmd("GET")
                    .arg(&self.keys.format)
                    .cmd("ZRANGE")
                    .arg(&self.keys.replicas)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut connection),
            )
            .await?;
        check_format(format)?;
        let others: Vec<String> = members
            .into_iter()
            .filter(|id| *id != self.options.id)
            .collect();
        let mut stored: Vec<Option<Vec<u8>>> = Vec::new();
        if !others.is_empty() {
            let keys: Vec<String> = others.iter().map(|id| self.keys.load(id)).collect();
            stored = self
                .bounded(redis::cmd("MGET").arg(&keys).query_async(&mut connection))
                .await?;
        }
        let now = Instant::now();
        let mut shares = Vec::with_capacity(others.len());
        let mut unreadable = 0;
        let mut vanished = Vec::new();
        let mut served: BTreeSet<String> = proxies.iter().cloned().collect();
        for (id, bytes) in others.into_iter().zip(stored) {
            let Some(bytes) = bytes else {
                vanished.push(id);
                continue;
            };
            match load::decode(&bytes) {
                Ok(share) => {
                    served.extend(share.proxies);
                    merge_health(&mut upstream, share.upstream);
                    shares.push(share.buckets);
                    self.last_shares.insert(id, LastShare { bytes, seen: now });
                }
                Err(err) => {
                    unreadable += 1;
                    tracing::warn!(%err, replica = %id, "ignoring a replica's load share");
                }
            }
        }
        let live = shares.len();
        for id in &vanished {
            if let Some(orphan) = self.orphan(id, &served, now) {
                shares.push(orphan);
            }
        }
        let orphans = shares.len() - live;
        // Replicas gone from the index (retention, or a flushed store) are
        // forgotten with their shares.
        self.last_shares
            .retain(|id, last| last.seen == now || vanished.contains(id));
        Ok(Shared {
            total: load::merge(own, shares),
            replicas: 1 + live,
            orphans,
            unreadable,
            upstream,
            complete: false,
        })
    }

    /// The last share of replica `id`, whose share vanished, if it still
    /// counts: its proxies may still enforce that replica's last table
    /// (cut off from the store, it serves them for its grace), so the
    /// others keep counting their load until they show up in a live share
    /// (`served`) or the orphan hold passes. Counting them twice meanwhile
    /// errs on the side of dropping.
    fn orphan(
        &mut self,
        id: &str,
        served: &BTreeSet<String>,
        now: Instant,
    ) -> Option<Vec<BucketTraffic>> {
        let last = self.last_shares.get(id)?;
        if now.duration_since(last.seen) > self.options.orphan_hold() {
            tracing::info!(replica = %id, "a vanished replica's share no longer counts: its hold is over");
            self.last_shares.remove(id);
            return None;
        }
        let share = load::decode(&last.bytes).ok()?;
        if !share.proxies.is_empty() && share.proxies.iter().all(|p| served.contains(p)) {
            tracing::info!(replica = %id, "a vanished replica's proxies are served by the others");
            self.last_shares.remove(id);
            return None;
        }
        Some(load::carried_over(share.buckets))
    }

    /// Acquires or renews the lease; `Some(fence)` while this replica leads.
    /// An error steps down.
    pub async fn lead(&mut self) -> Result<Option<u64>, ReplicaError> {
        let mut connection = self.connection.clone();
        let mut invocation = self.acquire.prepare_invoke();
        invocation
            .key(&self.keys.leader)
            .key(&self.keys.fence)
            .arg(&self.options.id)
            .arg(millis(self.options.lease_ttl()))
            .arg(self.highest_fence);
        let granted = self
            .bounded(invocation.invoke_async::<u64>(&mut connection))
            .await;
        let previous = self.fence;
        self.fence = match granted {
            Ok(0) => None,
            Ok(fence) => Some(fence),
            Err(err) => {
                self.fence = None;
                return Err(err);
            }
        };
        if let Some(fence) = self.fence {
            self.highest_fence = self.highest_fence.max(fence);
            if previous != Some(fence) {
                tracing::info!(replica = %self.options.id, fence, "leading: this replica decides for the fleet");
            }
        } else if previous.is_some() {
            tracing::info!(replica = %self.options.id, "no longer leading");
        }
        Ok(self.fence)
    }

    /// As leader under `fence`: writes the table after this interval's
    /// decision if it changed (or the stored one went missing). `Ok(false)`
    /// when the write was fenced off (the lease went to another replica).
    pub async fn publish(
        &mut self,
        fence: u64,
        changed: &[Directive],
        retired: &[RetiredCell],
        modes: ModePolicy,
    ) -> Result<bool, ReplicaError> {
        let next = self.table.next(fence, changed, retired, modes);
        if next.same_table(&self.table) && self.table.fence == fence && !self.table_missing {
            return Ok(true);
        }
        let mut connection = self.connection.clone();
        let mut invocation = self.publish.prepare_invoke();
        invocation
            .key(&self.keys.leader)
            .key(&self.keys.directives)
            .arg(format!("{} {fence}", self.options.id))
            .arg(next.encode());
        let written = self
            .bounded(invocation.invoke_async::<u8>(&mut connection))
            .await?;
        if written == 1 {
            self.table = next;
            self.table_missing = false;
            Ok(true)
        } else {
            tracing::warn!(replica = %self.options.id, fence, "fenced off: another replica holds the lease");
            self.fence = None;
            Ok(false)
        }
    }

    /// Reads the stored table; adopts it if it was written after the one
    /// held and this replica has shared for a whole share lifetime (so the
    /// table was decided with its proxies in view). Returns whether it
    /// was adopted.
    pub async fn follow(&mut self) -> Result<bool, ReplicaError> {
        let mut connection = self.connection.clone();
        let stored: Option<Vec<u8>> = self
            .bounded(
                redis::cmd("GET")
                    .arg(&self.keys.directives)
                    .query_async(&mut connection),
            )
            .await?;
        let Some(bytes) = stored else {
            self.table_missing = self.table.fence > 0;
            return Ok(false);
        };
        self.table_missing = false;
        let record = match Record::decode(&bytes) {
            Ok(record) => record,
            Err(err) => {
                tracing::warn!(%err, "ignoring the stored directive table");
                return Ok(false);
            }
        };
        self.highest_fence = self.highest_fence.max(record.fence);
        // Back from a store outage (or a partition), the tables written
        // meanwhile were decided without this replica's share: keep
        // pushing the last one until the leader has had this replica's
        // share for a whole share lifetime, so its proxies never get a
        // table that forgot them.
        if !self.shared_long_enough() {
            return Ok(false);
        }
        if record.is_after(&self.table) {
            self.table = record;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Gives up the lease if this replica holds it (on shutdown), so
    /// another takes over without waiting for it to expire.
    pub(crate) async fn resign(&mut self) {
        let Some(fence) = self.fence.take() else {
            return;
        };
        let mut connection = self.connection.clone();
        let mut invocation = self.release.prepare_invoke();
        invocation
            .key(&self.keys.leader)
            .arg(format!("{} {fence}", self.options.id));
        match self
            .bounded(invocation.invoke_async::<u8>(&mut connection))
            .await
        {
            Ok(_) => tracing::info!(replica = %self.options.id, "gave up the lease"),
            Err(err) => tracing::warn!(%err, "could not give up the lease; it expires by itself"),
        }
    }

    /// Steps down without telling the store (it could not be reached).
    pub(crate) fn step_down(&mut self) {
        if self.fence.take().is_some() {
            tracing::warn!(replica = %self.options.id, "stepped down: the store is unreachable");
        }
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, ReplicaError> {
        let limit = self.options.call_timeout();
        Ok(tokio::time::timeout(limit, call)
            .await
            .map_err(|_| ReplicaError::Timeout(limit))??)
    }
}

/// Deletes the lease if, and only if, it is still this replica's.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

fn check_format(found: Option<String>) -> Result<(), ReplicaError> {
    match found {
        Some(found) if found != keys::FORMAT => Err(ReplicaError::Format { found }),
        _ => Ok(()),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
