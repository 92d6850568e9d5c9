//! Per-proxy, per-cell rate estimation and the fleet-wide sum.
//!
//! A cell is a (bucket, tenant, priority) triple as the filter reports it.
//! Reports are added as they arrive and [`Fleet::tick`] turns what arrived
//! since the previous tick into rates. Decisions never read a clock; time
//! enters only through the windows the proxies report and the number of
//! ticks a proxy has been silent (the proxies view alone notes when a proxy
//! last reported).
//!
//! The state is bounded whatever the proxies send: keys longer than
//! [`FleetCaps`] allows are refused, each proxy may hold a bounded number of
//! cells per window and the fleet a bounded number in total, and a cell that
//! no proxy's rates mention any more is evicted at the next tick. Every
//! refusal and eviction is counted in [`FleetStats`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_proto::v1::Report;

use crate::cell::{CellKey, Priority};

/// Identifies one gRPC stream, so that a stale stream of a proxy that has
/// reconnected cannot touch the state of its replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// A rate pair in requests per second.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rates {
    /// Everything the proxy saw, dropped requests included.
    pub offered_rps: f64,
    /// What it let through.
    pub admitted_rps: f64,
    /// What it would have dropped but shadow mode let through.
    pub shadow_dropped_rps: f64,
}

/// Fleet-wide load of one bucket or one cell: what a
/// [`crate::controller::DropPolicy`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BucketLoad {
    /// Σ over proxies of their offered rate.
    pub offered_rps: f64,
    /// Σ over proxies of their admitted rate.
    pub admitted_rps: f64,
    /// Proxies whose offered rate is non-zero.
    pub proxies_reporting: u32,
}

/// Fleet-wide load of one cell of a bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct CellLoad {
    /// Tenant; empty when the filter derives none.
    pub tenant: Arc<str>,
    /// Priority as reported.
    pub priority: Priority,
    /// Offered and admitted rates and the proxies reporting the cell.
    pub load: BucketLoad,
    /// Σ over proxies of their shadow-dropped rate.
    pub shadow_dropped_rps: f64,
}

/// Fleet-wide load of one bucket: totals and cells.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketTraffic {
    /// Bucket key.
    pub bucket: Arc<str>,
    /// Totals over the cells; `proxies_reporting` counts each proxy once.
    pub load: BucketLoad,
    /// Σ over the cells of their shadow-dropped rate.
    pub shadow_dropped_rps: f64,
    /// Cells with a non-zero offered rate, sorted by tenant then priority.
    pub cells: Vec<CellLoad>,
}

impl BucketTraffic {
    /// A bucket with one cell (no tenant, unclassified), as a filter that
    /// derives neither reports it.
    pub fn single(bucket: &str, load: BucketLoad) -> Self {
        Self {
            bucket: Arc::from(bucket),
            load,
            shadow_dropped_rps: 0.0,
            cells: vec![CellLoad {
                tenant: Arc::from(""),
                priority: Priority::Unspecified,
                load,
                shadow_dropped_rps: 0.0,
            }],
        }
    }

    /// A bucket from its cells; totals are computed, `proxies_reporting` is
    /// the largest of the cells' (the proxies view of a real tick counts
    /// distinct proxies instead).
    pub fn from_cells(bucket: &str, mut cells: Vec<CellLoad>) -> Self {
        cells.sort_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
        let mut load = BucketLoad::default();
        let mut shadow_dropped_rps = 0.0;
        for cell in &cells {
            load.offered_rps += cell.load.offered_rps;
            load.admitted_rps += cell.load.admitted_rps;
            load.proxies_reporting = load.proxies_reporting.max(cell.load.proxies_reporting);
            shadow_dropped_rps += cell.shadow_dropped_rps;
        }
        Self {
            bucket: Arc::from(bucket),
            load,
            shadow_dropped_rps,
            cells,
        }
    }
}

/// What one tick saw: the load per bucket and what the fleet refused or
/// evicted since the previous tick.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetLoad {
    /// Buckets with traffic, sorted by bucket.
    pub buckets: Vec<BucketTraffic>,
    /// Counts since the previous tick.
    pub stats: FleetStats,
}

impl FleetLoad {
    /// A load from buckets in any order.
    pub fn new(mut buckets: Vec<BucketTraffic>) -> Self {
        buckets.sort_unstable_by(|a, b| a.bucket.cmp(&b.bucket));
        Self {
            buckets,
            stats: FleetStats::default(),
        }
    }

    /// The bucket's traffic, if it has any.
    pub fn get(&self, bucket: &str) -> Option<&BucketTraffic> {
        self.buckets
            .binary_search_by(|b| b.bucket.as_ref().cmp(bucket))
            .ok()
            .and_then(|at| self.buckets.get(at))
    }

    /// Whether no bucket has traffic.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// Cells refused and evicted since the previous tick, and cells tracked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FleetStats {
    /// Cells tracked after the tick.
    pub cells: usize,
    /// Buckets tracked after the tick.
    pub buckets: usize,
    /// Report entries refused: bucket or tenant longer than allowed.
    pub rejected_key_too_long: u64,
    /// Report entries refused: the proxy already had its maximum of cells
    /// in the window.
    pub rejected_proxy_cap: u64,
    /// Report entries refused: the fleet already tracked its maximum of
    /// cells.
    pub rejected_fleet_cap: u64,
    /// Cells forgotten because no proxy's rates mentioned them any more.
    pub evicted_idle: u64,
}

/// Bounds on the state reports can create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetCaps {
    /// Longest accepted bucket key, in bytes.
    pub max_bucket_len: usize,
    /// Longest accepted tenant, in bytes.
    pub max_tenant_len: usize,
    /// Distinct cells one proxy may report in one window.
    pub max_cells_per_proxy: usize,
    /// Distinct cells tracked fleet-wide.
    pub max_cells: usize,
}

impl Default for FleetCaps {
    /// Bucket keys as long as the admin API accepts; tenants as long as the
    /// filter cuts them; per proxy 5× the filter's default `max_buckets`;
    /// 250k cells in total (a few hundred bytes each).
    fn default() -> Self {
        Self {
            max_bucket_len: crate::types::MAX_BUCKET_LEN,
            max_tenant_len: 256,
            max_cells_per_proxy: 50_000,
            max_cells: 250_000,
        }
    }
}

/// What [`Fleet::connect`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connected {
    /// A proxy id not seen before (or forgotten after expiry).
    New,
    /// The proxy was known; `previous` is the stream now superseded, if it
    /// was still open. Its rates are kept until the new stream reports.
    Replaced {
        /// The superseded stream.
        previous: Option<StreamId>,
    },
}

/// Why a report was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReportRejected {
    /// The stream no longer speaks for the proxy: a newer stream with the
    /// same proxy id replaced it.
    #[error("stream was replaced by a newer stream of the same proxy")]
    Superseded,
    /// `window_ms` is 0, so the counts cannot be turned into a rate.
    #[error("report has window_ms = 0")]
    EmptyWindow,
}

/// One proxy as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProxyStatus {
    /// Proxy id from the Hello.
    pub proxy_id: String,
    /// Zone from the Hello; empty when the proxy named none.
    pub zone: String,
    /// Instance id from the latest Hello; changes when the proxy restarts.
    pub instance_id: u64,
    /// Whether a stream of the proxy is open.
    pub connected: bool,
    /// Time since the proxy's last report (since its Hello before the
    /// first one); serialized as `since_last_report_ms`.
    #[serde(rename = "since_last_report_ms", serialize_with = "millis")]
    pub since_last_report: Duration,
    /// Cells (bucket, tenant, priority) in the proxy's current rates.
    pub cells: usize,
    /// Age of the directives the proxy enforces, on its own clock, as of
    /// its last report; `None` (JSON null) until a report names one, or
    /// while the proxy holds no directives; serialized as
    /// `directive_age_ms`.
    #[serde(rename = "directive_age_ms", serialize_with = "optional_millis")]
    pub directive_age: Option<Duration>,
}

fn millis<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

fn optional_millis<S: serde::Serializer>(
    duration: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => millis(duration, serializer),
        None => serializer.serialize_none(),
    }
}

/// Index of a cell in the interner.
type CellId = u32;

/// Hashes a [`CellId`] by one multiplication. The ids are handed out here,
/// never chosen by a proxy, so the protection a keyed hash gives string
/// keys from request headers is not needed for them.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<CellId, V, std::hash::BuildHasherDefault<IdHasher>>;
/// Marks an empty priority slot of a tenant.
const NO_CELL: CellId = CellId::MAX;

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    offered: u64,
    admitted: u64,
    shadow_dropped: u64,
}

impl Counts {
    fn add(&mut self, count: &sluice_proto::v1::BucketCount) {
        self.offered = self.offered.saturating_add(count.offered);
        self.admitted = self.admitted.saturating_add(count.admitted);
        self.shadow_dropped = self.shadow_dropped.saturating_add(count.shadow_dropped);
    }
}

#[derive(Debug)]
struct Proxy {
    /// The stream that owns this proxy id; `None` once it ended.
    stream: Option<StreamId>,
    instance_id: u64,
    /// Failure domain from the Hello.
    zone: String,
    /// When the proxy last reported (its Hello before the first report).
    /// Only the operator view reads it.
    last_report: Instant,
    /// Directive age (ms) named by the last report of the current stream.
    /// Only the operator view reads it.
    directive_age_ms: Option<u64>,
    /// Σ window_ms of the reports since the previous tick.
    window_ms: u64,
    /// Σ counts of the reports since the previous tick.
    counts: IdMap<Counts>,
    /// The cell of each entry of the previous report: a proxy lists the
    /// same cells in the same order report after report, so checking the
    /// hint's key is enough and the strings need no hashing.
    hints: Vec<CellId>,
    /// Rates as of the last tick that had reports.
    rates: Vec<(CellId, Rates)>,
    /// Ticks since the last one that had reports.
    silent_ticks: u32,
}

/// One bucket's cells: tenant → cell per priority (wire order).
#[derive(Debug)]
struct BucketCells {
    id: u32,
    tenants: HashMap<Arc<str>, [CellId; 5]>,
}

#[derive(Debug)]
struct Slot {
    key: CellKey,
    bucket: u32,
    /// The last tick at which some proxy's rates mentioned the cell.
    seen: u64,
}

/// Gives every cell a small id, so that per-proxy state and the per-tick
/// sums index arrays instead of hashing strings, and shares the strings.
#[derive(Debug, Default)]
struct Interner {
    buckets: HashMap<Arc<str>, BucketCells>,
    slots: Vec<Option<Slot>>,
    free: Vec<CellId>,
    free_buckets: Vec<u32>,
    next_bucket: u32,
    live: usize,
}

impl Interner {
    /// Whether `id` is the live cell with this key.
    fn matches(&self, id: CellId, bucket: &str, tenant: &str, priority: Priority) -> bool {
        self.slots.get(id as usize).is_some_and(|slot| {
            slot.as_ref().is_some_and(|slot| {
                slot.key.priority == priority
                    && slot.key.bucket.as_ref() == bucket
                    && slot.key.tenant.as_ref() == tenant
            })
        })
    }

    fn find(&self, bucket: &str, tenant: &str, priority: Priority) -> Option<CellId> {
        let id = *self
            .buckets
            .get(bucket)?
            .tenants
            .get(tenant)?
            .get(priority.index())?;
        (id != NO_CELL).then_some(id)
    }

    fn insert(&mut self, bucket: &str, tenant: &str, priority: Priority, seen: u64) -> CellId {
        let (bucket_key, cells) = match self.buckets.get_key_value(bucket) {
            Some((key, cells)) => (Arc::clone(key), cells.id),
            None => {
                let key: Arc<str> = Arc::from(bucket);
                let id = self.free_buckets.pop().unwrap_or_else(|| {
                    self.next_bucket += 1;
                    self.next_bucket - 1
                });
                self.buckets.insert(
                    Arc::clone(&key),
                    BucketCells {
                        id,
                        tenants: HashMap::new(),
                    },
                );
                (key, id)
            }
        };
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = CellId::try_from(self.slots.len()).unwrap_or(NO_CELL - 1);
                self.slots.push(None);
                id
            }
        };
        let Some(bucket_cells) = self.buckets.get_mut(bucket) else {
            return NO_CELL;
        };
        let tenant_key = match bucket_cells.tenants.get_key_value(tenant) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::from(tenant),
        };
        let priorities = bucket_cells
            .tenants
            .entry(Arc::clone(&tenant_key))
            .or_insert([NO_CELL; 5]);
        if let Some(slot) = priorities.get_mut(priority.index()) {
            *slot = id;
        }
        if let Some(slot) = self.slots.get_mut(id as usize) {
            *slot = Some(Slot {
                key: CellKey {
                    bucket: bucket_key,
                    tenant: tenant_key,
                    priority,
                },
                bucket: cells,
                seen,
            });
        }
        self.live += 1;
        id
    }

    /// Forgets every cell not seen at `tick`; returns how many.
    fn evict_unseen(&mut self, tick: u64) -> u64 {
        let mut evicted = 0;
        for (id, slot) in self.slots.iter_mut().enumerate() {
            let Some(entry) = slot.take_if(|entry| entry.seen != tick) else {
                continue;
            };
            evicted += 1;
            self.live -= 1;
            self.free.push(CellId::try_from(id).unwrap_or(NO_CELL));
            let key = entry.key;
            let Some(cells) = self.buckets.get_mut(key.bucket.as_ref()) else {
                continue;
            };
            if let Some(priorities) = cells.tenants.get_mut(key.tenant.as_ref()) {
                if let Some(slot) = priorities.get_mut(key.priority.index()) {
                    *slot = NO_CELL;
                }
                if priorities.iter().all(|&id| id == NO_CELL) {
                    cells.tenants.remove(key.tenant.as_ref());
                }
            }
            if cells.tenants.is_empty() {
                self.free_buckets.push(cells.id);
                self.buckets.remove(key.bucket.as_ref());
            }
        }
        evicted
    }
}

/// Per-tick sums, kept between ticks so the arrays are allocated once.
#[derive(Debug, Default)]
struct Sums {
    cells: Vec<(BucketLoad, f64)>,
    /// Per bucket id: the last proxy (index + 1) counted as reporting it.
    last_proxy: Vec<usize>,
    proxies_reporting: Vec<u32>,
}

/// All proxies, keyed by proxy id.
#[derive(Debug)]
pub struct Fleet {
    proxies: HashMap<String, Proxy>,
    carry_ticks: u32,
    caps: FleetCaps,
    cells: Interner,
    stats: FleetStats,
    tick: u64,
    sums: Sums,
}

impl Fleet {
    /// How many control intervals a silent proxy's rates are carried.
    pub const DEFAULT_CARRY_TICKS: u32 = 3;

    /// An empty fleet with the default caps; silent proxies keep their rates
    /// for `carry_ticks` ticks.
    pub fn new(carry_ticks: u32) -> Self {
        Self::with_caps(carry_ticks, FleetCaps::default())
    }

    /// An empty fleet with the given caps.
    pub fn with_caps(carry_ticks: u32, caps: FleetCaps) -> Self {
        Self {
            proxies: HashMap::new(),
            carry_ticks,
            caps,
            cells: Interner::default(),
            stats: FleetStats::default(),
            tick: 0,
            sums: Sums::default(),
        }
    }

    /// The caps in force.
    pub fn caps(&self) -> FleetCaps {
        self.caps
    }

    /// A stream said Hello for `proxy_id`. The newest stream always wins: an
    /// Envoy whose leader VM changed opens a new stream before the old one
    /// is torn down.
    pub fn connect(&mut self, proxy_id: &str, instance_id: u64, stream: StreamId) -> Connected {
        self.connect_in_zone(proxy_id, instance_id, "", stream)
    }

    /// [`Fleet::connect`] with the zone the Hello named.
    pub fn connect_in_zone(
        &mut self,
        proxy_id: &str,
        instance_id: u64,
        zone: &str,
        stream: StreamId,
    ) -> Connected {
        let now = Instant::now();
        match self.proxies.get_mut(proxy_id) {
            Some(proxy) => {
                let previous = proxy.stream.replace(stream);
                proxy.instance_id = instance_id;
                zone.clone_into(&mut proxy.zone);
                proxy.last_report = now;
                proxy.directive_age_ms = None;
                Connected::Replaced { previous }
            }
            None => {
                self.proxies.insert(
                    proxy_id.to_owned(),
                    Proxy {
                        stream: Some(stream),
                        instance_id,
                        zone: zone.to_owned(),
                        last_report: now,
                        directive_age_ms: None,
                        window_ms: 0,
                        counts: IdMap::default(),
                        hints: Vec::new(),
                        rates: Vec::new(),
                        silent_ticks: 0,
                    },
                );
                Connected::New
            }
        }
    }

    /// Adds a report's counts to the proxy's current window. Entries the
    /// caps refuse are skipped and counted; the rest of the report counts.
    pub fn report(
        &mut self,
        proxy_id: &str,
        stream: StreamId,
        report: &Report,
    ) -> Result<(), ReportRejected> {
        let Self {
            proxies,
            caps,
            cells,
            stats,
            tick,
            ..
        } = self;
        let proxy = proxies
            .get_mut(proxy_id)
            .filter(|proxy| proxy.stream == Some(stream))
            .ok_or(ReportRejected::Superseded)?;
        if report.window_ms == 0 {
            return Err(ReportRejected::EmptyWindow);
        }
        proxy.window_ms = proxy.window_ms.saturating_add(report.window_ms);
        proxy.last_report = Instant::now();
        proxy.directive_age_ms = report.directive_age_ms;
        proxy.hints.resize(report.buckets.len(), NO_CELL);
        for (count, hint) in report.buckets.iter().zip(proxy.hints.iter_mut()) {
            // Reports list only cells with traffic; a zero entry would only
            // create state.
            if count.offered == 0 {
                continue;
            }
            if count.bucket.len() > caps.max_bucket_len || count.tenant.len() > caps.max_tenant_len
            {
                stats.rejected_key_too_long += 1;
                continue;
            }
            let priority = Priority::from_wire(count.priority);
            let known = if cells.matches(*hint, &count.bucket, &count.tenant, priority) {
                Some(*hint)
            } else {
                cells.find(&count.bucket, &count.tenant, priority)
            };
            if let Some(id) = known
                && let Some(counts) = proxy.counts.get_mut(&id)
            {
                *hint = id;
                counts.add(count);
                continue;
            }
            if proxy.counts.len() >= caps.max_cells_per_proxy {
                stats.rejected_proxy_cap += 1;
                continue;
            }
            let id = match known {
                Some(id) => id,
                None if cells.live >= caps.max_cells => {
                    stats.rejected_fleet_cap += 1;
                    continue;
                }
                // Marked seen now so a tick cannot evict it before the
                // window that holds it closes.
                None => cells.insert(&count.bucket, &count.tenant, priority, *tick),
            };
            *hint = id;
            proxy.counts.entry(id).or_default().add(count);
        }
        Ok(())
    }

    /// The stream ended. Only the owning stream can disconnect a proxy; its
    /// rates are carried like those of any silent proxy, so a quick
    /// reconnect does not make the fleet rate dip.
    pub fn disconnect(&mut self, proxy_id: &str, stream: StreamId) -> bool {
        match self.proxies.get_mut(proxy_id) {
            Some(proxy) if proxy.stream == Some(stream) => {
                proxy.stream = None;
                true
            }
            _ => false,
        }
    }

    /// Instance id the proxy announced in its latest Hello.
    pub fn instance_id(&self, proxy_id: &str) -> Option<u64> {
        self.proxies.get(proxy_id).map(|proxy| proxy.instance_id)
    }

    /// Every tracked proxy, sorted by proxy id: connected ones and
    /// disconnected ones whose rates are still carried.
    pub fn proxies(&self) -> Vec<ProxyStatus> {
        let now = Instant::now();
        let mut proxies: Vec<ProxyStatus> = self
            .proxies
            .iter()
            .map(|(proxy_id, proxy)| ProxyStatus {
                proxy_id: proxy_id.clone(),
                zone: proxy.zone.clone(),
                instance_id: proxy.instance_id,
                connected: proxy.stream.is_some(),
                since_last_report: now.saturating_duration_since(proxy.last_report),
                cells: proxy.rates.len(),
                directive_age: proxy.directive_age_ms.map(Duration::from_millis),
            })
            .collect();
        proxies.sort_unstable_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
        proxies
    }

    /// Number of proxies still tracked (connected, or disconnected but
    /// still carried).
    pub fn len(&self) -> usize {
        self.proxies.len()
    }

    /// Whether no proxy is tracked.
    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// Cells tracked right now.
    pub fn cells(&self) -> usize {
        self.cells.live
    }

    /// Closes the current window of every proxy and returns the fleet load.
    ///
    /// For each proxy, `rate_c = Σcounts_c / Σwindow` over the reports since
    /// the previous tick. A proxy without reports keeps its previous rates
    /// for `carry_ticks` ticks, then contributes nothing; a disconnected one
    /// is forgotten at that point. Cells no proxy's rates mention are
    /// evicted.
    pub fn tick(&mut self) -> FleetLoad {
        let carry_ticks = self.carry_ticks;
        self.proxies.retain(|_, proxy| {
            proxy.close_window(carry_ticks);
            proxy.stream.is_some() || !proxy.rates.is_empty()
        });
        self.tick += 1;
        let tick = self.tick;

        let sums = &mut self.sums;
        sums.cells.clear();
        sums.cells
            .resize(self.cells.slots.len(), (BucketLoad::default(), 0.0));
        let buckets = self.cells.next_bucket as usize;
        sums.last_proxy.clear();
        sums.last_proxy.resize(buckets, 0);
        sums.proxies_reporting.clear();
        sums.proxies_reporting.resize(buckets, 0);
        for (index, proxy) in self.proxies.values().enumerate() {
            for &(id, rates) in &proxy.rates {
                let Some(Some(slot)) = self.cells.slots.get_mut(id as usize) else {
                    continue;
                };
                slot.seen = tick;
                let bucket = slot.bucket as usize;
                if let Some((sum, shadow)) = sums.cells.get_mut(id as usize) {
                    sum.offered_rps += rates.offered_rps;
                    sum.admitted_rps += rates.admitted_rps;
                    sum.proxies_reporting += 1;
                    *shadow += rates.shadow_dropped_rps;
                }
                if let (Some(last), Some(reporting)) = (
                    sums.last_proxy.get_mut(bucket),
                    sums.proxies_reporting.get_mut(bucket),
                ) && *last != index + 1
                {
                    *last = index + 1;
                    *reporting += 1;
                }
            }
            // Cells in a window still open (reports since this tick began
            // cannot exist, but a proxy that has counts keeps them alive).
            for &id in proxy.counts.keys() {
                if let Some(Some(slot)) = self.cells.slots.get_mut(id as usize) {
                    slot.seen = tick;
                }
            }
        }
        let mut stats = std::mem::take(&mut self.stats);
        stats.evicted_idle = self.cells.evict_unseen(tick);

        let mut load = Vec::with_capacity(self.cells.buckets.len());
        for (bucket, cells) in &self.cells.buckets {
            let mut traffic = BucketTraffic {
                bucket: Arc::clone(bucket),
                load: BucketLoad {
                    proxies_reporting: sums
                        .proxies_reporting
                        .get(cells.id as usize)
                        .copied()
                        .unwrap_or(0),
                    ..BucketLoad::default()
                },
                shadow_dropped_rps: 0.0,
                cells: Vec::new(),
            };
            for (tenant, priorities) in &cells.tenants {
                for (&id, priority) in priorities.iter().zip(Priority::ALL) {
                    let Some(&(sum, shadow)) = sums.cells.get(id as usize) else {
                        continue;
                    };
                    if sum.offered_rps <= 0.0 {
                        continue;
                    }
                    traffic.load.offered_rps += sum.offered_rps;
                    traffic.load.admitted_rps += sum.admitted_rps;
                    traffic.shadow_dropped_rps += shadow;
                    traffic.cells.push(CellLoad {
                        tenant: Arc::clone(tenant),
                        priority,
                        load: sum,
                        shadow_dropped_rps: shadow,
                    });
                }
            }
            if traffic.cells.is_empty() {
                continue;
            }
            if traffic.cells.len() > 1 {
                traffic
                    .cells
                    .sort_unstable_by(|a, b| (&a.tenant, a.priority).cmp(&(&b.tenant, b.priority)));
            }
            load.push(traffic);
        }
        stats.cells = self.cells.live;
        stats.buckets = self.cells.buckets.len();
        let mut load = FleetLoad::new(load);
        load.stats = stats;
        load
    }
}

impl Proxy {
    fn close_window(&mut self, carry_ticks: u32) {
        if self.window_ms > 0 {
            let seconds = self.window_ms as f64 / 1000.0;
            // Cells absent from every report of the window had no traffic.
            self.rates.clear();
            self.rates.extend(self.counts.drain().map(|(id, counts)| {
                let rates = Rates {
                    offered_rps: counts.offered as f64 / seconds,
                    admitted_rps: counts.admitted as f64 / seconds,
                    shadow_dropped_rps: counts.shadow_dropped as f64 / seconds,
                };
                (id, rates)
            }));
            self.window_ms = 0;
            self.silent_ticks = 0;
        } else {
            self.silent_ticks = self.silent_ticks.saturating_add(1);
            if self.silent_ticks > carry_ticks {
                self.rates.clear();
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)]
mod tests {
    use sluice_proto::v1::BucketCount;

    use super::*;

    fn report(window_ms: u64, buckets: &[(&str, u64, u64)]) -> Report {
        Report {
            sequence: 0,
            window_ms,
            directive_age_ms: None,
            buckets: buckets
                .iter()
                .map(|&(bucket, offered, admitted)| BucketCount {
                    bucket: bucket.to_owned(),
                    offered,
                    admitted,
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn offered(load: &FleetLoad, bucket: &str) -> f64 {
        load.get(bucket).map_or(0.0, |b| b.load.offered_rps)
    }

    fn cell(bucket: &str, tenant: &str, priority: Priority, offered: u64) -> BucketCount {
        BucketCount {
            bucket: bucket.to_owned(),
            tenant: tenant.to_owned(),
            priority: priority.to_wire() as i32,
            offered,
            admitted: offered / 2,
            shadow_dropped: offered / 4,
        }
    }

    fn cells_report(window_ms: u64, cells: Vec<BucketCount>) -> Report {
        Report {
            sequence: 0,
            window_ms,
            directive_age_ms: None,
            buckets: cells,
        }
    }

    #[test]
    fn cells_are_summed_per_tenant_and_priority_with_bucket_totals() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet.connect("b", 2, StreamId(2));
        fleet
            .report(
                "a",
                StreamId(1),
                &cells_report(
                    100,
                    vec![
                        cell("api", "gold", Priority::Critical, 10),
                        cell("api", "free", Priority::Bulk, 20),
                    ],
                ),
            )
            .unwrap();
        fleet
            .report(
                "b",
                StreamId(2),
                &cells_report(
                    100,
                    vec![
                        cell("api", "gold", Priority::Critical, 30),
                        cell("api", "gold", Priority::Bulk, 4),
                    ],
                ),
            )
            .unwrap();
        let load = fleet.tick();
        let api = load.get("api").unwrap();
        assert_eq!(api.load.offered_rps, 640.0);
        assert_eq!(api.load.admitted_rps, 320.0);
        assert_eq!(api.shadow_dropped_rps, 150.0);
        assert_eq!(api.load.proxies_reporting, 2, "each proxy counted once");
        let cells: Vec<(&str, Priority, f64, u32)> = api
            .cells
            .iter()
            .map(|c| {
                (
                    c.tenant.as_ref(),
                    c.priority,
                    c.load.offered_rps,
                    c.load.proxies_reporting,
                )
            })
            .collect();
        assert_eq!(
            cells,
            [
                ("free", Priority::Bulk, 200.0, 1),
                ("gold", Priority::Critical, 400.0, 2),
                ("gold", Priority::Bulk, 40.0, 1),
            ]
        );
        assert_eq!(api.cells[1].shadow_dropped_rps, 90.0);
        assert_eq!(fleet.cells(), 3);
    }

    #[test]
    fn idle_cells_are_evicted_and_counted() {
        let mut fleet = Fleet::new(1);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report(
                "a",
                StreamId(1),
                &cells_report(
                    100,
                    vec![
                        cell("x", "t1", Priority::Unspecified, 1),
                        cell("y", "", Priority::Unspecified, 1),
                    ],
                ),
            )
            .unwrap();
        fleet.tick();
        fleet
            .report(
                "a",
                StreamId(1),
                &cells_report(100, vec![cell("y", "", Priority::Unspecified, 1)]),
            )
            .unwrap();
        let load = fleet.tick();
        assert_eq!(load.stats.evicted_idle, 1);
        assert_eq!(load.stats.cells, 1);
        assert_eq!(load.stats.buckets, 1);
        // A silent proxy's carried cells stay until the carry ends.
        assert_eq!(fleet.tick().stats.evicted_idle, 0);
        let load = fleet.tick();
        assert_eq!(load.stats.evicted_idle, 1);
        assert_eq!(fleet.cells(), 0);
    }

    #[test]
    fn long_keys_are_refused() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        let long = "x".repeat(FleetCaps::default().max_bucket_len + 1);
        let long_tenant = "t".repeat(FleetCaps::default().max_tenant_len + 1);
        fleet
            .report(
                "a",
                StreamId(1),
                &cells_report(
                    100,
                    vec![
                        cell(&long, "", Priority::Unspecified, 1),
                        cell("ok", &long_tenant, Priority::Unspecified, 1),
                        cell("ok", "", Priority::Unspecified, 1),
                    ],
                ),
            )
            .unwrap();
        let load = fleet.tick();
        assert_eq!(load.stats.rejected_key_too_long, 2);
        assert_eq!(load.buckets.len(), 1);
        assert_eq!(
            fleet.tick().stats.rejected_key_too_long,
            0,
            "counts are per tick"
        );
    }

    #[test]
    fn a_cardinality_flood_stays_within_the_caps() {
        let caps = FleetCaps {
            max_cells_per_proxy: 100,
            max_cells: 150,
            ..FleetCaps::default()
        };
        let mut fleet = Fleet::with_caps(3, caps);
        fleet.connect("flood", 1, StreamId(1));
        fleet.connect("b", 2, StreamId(2));
        fleet.connect("c", 3, StreamId(3));
        let mut rejected_proxy = 0;
        let mut rejected_fleet = 0;
        for round in 0..20 {
            // Every round the flooding proxy reports 1000 buckets never seen.
            let flood = (0..1000)
                .map(|i| cell(&format!("f{round}-{i}"), "", Priority::Unspecified, 1))
                .collect();
            fleet
                .report("flood", StreamId(1), &cells_report(100, flood))
                .unwrap();
            let steady = (0..40)
                .map(|i| cell(&format!("s{i}"), "", Priority::Unspecified, 1))
                .collect();
            fleet
                .report("b", StreamId(2), &cells_report(100, steady))
                .unwrap();
            let more = (0..40)
                .map(|i| cell(&format!("c{round}-{i}"), "", Priority::Unspecified, 1))
                .collect();
            let _ = fleet.report("c", StreamId(3), &cells_report(100, more));
            let load = fleet.tick();
            assert!(
                fleet.cells() <= 150,
                "round {round}: {} cells",
                fleet.cells()
            );
            assert!(load.buckets.len() <= 150);
            rejected_proxy += load.stats.rejected_proxy_cap;
            rejected_fleet += load.stats.rejected_fleet_cap;
            assert!(
                fleet.proxies().iter().all(|p| p.cells <= 100),
                "{:?}",
                fleet.proxies()
            );
        }
        // The flood alone sent 1000 new cells a round, and at most 100 fit.
        assert!(
            rejected_proxy + rejected_fleet >= 20 * 900,
            "{rejected_proxy} + {rejected_fleet}"
        );
        assert!(rejected_proxy > 0);
        assert!(rejected_fleet > 0, "the fleet cap was reached too");
        assert!(
            fleet.cells.slots.len() <= 150,
            "slots are reused, not grown"
        );
    }

    #[test]
    fn rate_is_counts_over_summed_windows() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        // 150 + 50 requests over 250 + 250 ms = 400 rps; uneven windows are
        // weighted by their length, not averaged per report.
        fleet
            .report("a", StreamId(1), &report(250, &[("acme", 150, 100)]))
            .unwrap();
        fleet
            .report("a", StreamId(1), &report(250, &[("acme", 50, 50)]))
            .unwrap();
        let load = fleet.tick();
        let acme = load.get("acme").unwrap().load;
        assert_eq!(acme.offered_rps, 400.0);
        assert_eq!(acme.admitted_rps, 300.0);
        assert_eq!(acme.proxies_reporting, 1);
    }

    #[test]
    fn proxies_are_summed() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet.connect("b", 2, StreamId(2));
        fleet
            .report("a", StreamId(1), &report(500, &[("acme", 225, 225)]))
            .unwrap();
        fleet
            .report(
                "b",
                StreamId(2),
                &report(250, &[("acme", 37, 37), ("x", 1, 1)]),
            )
            .unwrap();
        let load = fleet.tick();
        assert_eq!(offered(&load, "acme"), 450.0 + 148.0);
        assert_eq!(load.get("acme").unwrap().load.proxies_reporting, 2);
        assert_eq!(load.get("x").unwrap().load.proxies_reporting, 1);
    }

    #[test]
    fn silent_proxy_is_carried_then_expires() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        for _ in 0..3 {
            assert_eq!(offered(&fleet.tick(), "acme"), 100.0, "carried");
        }
        let load = fleet.tick();
        assert!(
            load.is_empty(),
            "expired after three silent ticks: {load:?}"
        );
        assert_eq!(fleet.len(), 1, "still connected, so still known");

        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 5, 5)]))
            .unwrap();
        assert_eq!(offered(&fleet.tick(), "acme"), 50.0, "fresh again");
    }

    #[test]
    fn an_empty_report_means_zero_traffic() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        fleet.tick();
        fleet.report("a", StreamId(1), &report(100, &[])).unwrap();
        assert!(fleet.tick().is_empty());
    }

    #[test]
    fn bucket_missing_from_a_fresh_window_drops_to_zero() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report(
                "a",
                StreamId(1),
                &report(100, &[("acme", 10, 10), ("x", 1, 1)]),
            )
            .unwrap();
        fleet.tick();
        fleet
            .report("a", StreamId(1), &report(100, &[("x", 2, 2)]))
            .unwrap();
        let load = fleet.tick();
        assert!(load.get("acme").is_none());
        assert_eq!(offered(&load, "x"), 20.0);
    }

    #[test]
    fn newer_stream_replaces_older_one() {
        let mut fleet = Fleet::new(3);
        assert_eq!(fleet.connect("a", 1, StreamId(1)), Connected::New);
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        fleet.tick();
        assert_eq!(
            fleet.connect("a", 2, StreamId(2)),
            Connected::Replaced {
                previous: Some(StreamId(1))
            }
        );
        assert_eq!(fleet.instance_id("a"), Some(2));
        assert_eq!(
            fleet.report("a", StreamId(1), &report(100, &[("acme", 99, 99)])),
            Err(ReportRejected::Superseded)
        );
        assert!(
            !fleet.disconnect("a", StreamId(1)),
            "old stream cannot unregister the new one"
        );
        // Rates carry over the replacement until the new stream reports.
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        fleet
            .report("a", StreamId(2), &report(100, &[("acme", 20, 20)]))
            .unwrap();
        assert_eq!(offered(&fleet.tick(), "acme"), 200.0, "not double counted");
    }

    #[test]
    fn disconnected_proxy_is_carried_then_forgotten() {
        let mut fleet = Fleet::new(2);
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        assert!(fleet.disconnect("a", StreamId(1)));
        assert_eq!(
            offered(&fleet.tick(), "acme"),
            100.0,
            "window before disconnect counts"
        );
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        assert_eq!(offered(&fleet.tick(), "acme"), 100.0);
        assert!(fleet.tick().is_empty());
        assert!(fleet.is_empty());
    }

    #[test]
    fn zero_window_and_unknown_proxy_are_rejected() {
        let mut fleet = Fleet::new(3);
        assert_eq!(
            fleet.report("a", StreamId(1), &report(100, &[])),
            Err(ReportRejected::Superseded)
        );
        fleet.connect("a", 1, StreamId(1));
        assert_eq!(
            fleet.report("a", StreamId(1), &report(0, &[("acme", 1, 1)])),
            Err(ReportRejected::EmptyWindow)
        );
        assert!(fleet.tick().is_empty());
    }

    #[test]
    fn proxies_view_shows_zone_instance_and_connection() {
        let mut fleet = Fleet::new(3);
        fleet.connect_in_zone("b", 2, "eu-1", StreamId(2));
        fleet.connect("a", 1, StreamId(1));
        fleet
            .report("b", StreamId(2), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        fleet.tick();
        fleet.disconnect("a", StreamId(1));
        let proxies = fleet.proxies();
        let ids: Vec<&str> = proxies.iter().map(|p| p.proxy_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"], "sorted by proxy id");
        assert!(!proxies[0].connected);
        assert_eq!(proxies[1].zone, "eu-1");
        assert_eq!(proxies[1].instance_id, 2);
        assert!(proxies[1].connected);
        assert_eq!(proxies[1].cells, 1);
        assert!(proxies[1].since_last_report < Duration::from_secs(5));
        let json = serde_json::to_value(&proxies[1]).unwrap();
        assert!(json["since_last_report_ms"].is_u64(), "{json}");
    }

    #[test]
    fn proxies_view_shows_the_directive_age_of_the_last_report() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        let age = |fleet: &Fleet| fleet.proxies()[0].directive_age;
        let json = |fleet: &Fleet| serde_json::to_value(&fleet.proxies()[0]).unwrap();
        assert_eq!(age(&fleet), None, "unknown before a report");
        assert!(json(&fleet)["directive_age_ms"].is_null());

        let aged = |ms| Report {
            directive_age_ms: Some(ms),
            ..report(100, &[])
        };
        fleet.report("a", StreamId(1), &aged(1_250)).unwrap();
        assert_eq!(age(&fleet), Some(Duration::from_millis(1_250)));
        assert_eq!(json(&fleet)["directive_age_ms"], 1_250);
        fleet.report("a", StreamId(1), &aged(40)).unwrap();
        assert_eq!(age(&fleet), Some(Duration::from_millis(40)), "latest wins");
        // A proxy without directives (or of an older build) names none.
        fleet.report("a", StreamId(1), &report(100, &[])).unwrap();
        assert_eq!(age(&fleet), None);

        fleet.report("a", StreamId(1), &aged(40)).unwrap();
        fleet.connect("a", 2, StreamId(2));
        assert_eq!(age(&fleet), None, "a new stream has not reported yet");
        assert_eq!(
            fleet.report("a", StreamId(1), &aged(7)),
            Err(ReportRejected::Superseded)
        );
        assert_eq!(age(&fleet), None, "a replaced stream cannot set it");
    }

    #[test]
    fn proxies_reporting_counts_only_non_zero_rates() {
        let mut fleet = Fleet::new(3);
        fleet.connect("a", 1, StreamId(1));
        fleet.connect("b", 2, StreamId(2));
        fleet
            .report("a", StreamId(1), &report(100, &[("acme", 10, 10)]))
            .unwrap();
        // A filter should not list zero buckets, but tolerate it.
        fleet
            .report("b", StreamId(2), &report(100, &[("acme", 0, 0)]))
            .unwrap();
        assert_eq!(fleet.tick().get("acme").unwrap().load.proxies_reporting, 1);
    }
}
