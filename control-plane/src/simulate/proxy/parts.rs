//! One simulated Envoy made of the filter's request-path parts: its real
//! [`DirectiveTable`], [`Pacer`] and [`BucketCounters`], with reports sent
//! every `report_interval_ms` exactly and no ticks, lease, freshness or
//! process budgets. The published accuracy table is measured on it: what
//! the decision core does with ideal report timing.

use rand::rngs::SmallRng;
use sluice_core::decision::Verdict;
use sluice_core::{DropThreshold, Priority};
use sluice_filter::agent::{DEFAULT_UPSTREAM_SAMPLE_EVERY, TICK_MS};
use sluice_filter::cell::key_of;
use sluice_filter::counters::{BucketCounters, Outcome};
use sluice_filter::directives::DirectiveTable;
use sluice_filter::pacing::{DecisionMode, Pacer};
use sluice_filter::upstream::ResponseSampler;
use sluice_proto::v1::{DirectiveBatch, Hello, ProxyMessage, Report, proxy_message};

/// The token of the model's one stream.
const TOKEN: u32 = 1;

/// A proxy of the filter's parts.
pub struct PartsProxy {
    id: String,
    table: DirectiveTable,
    pacer: Pacer,
    counters: BucketCounters,
    responses: ResponseSampler,
    rng: SmallRng,
    /// Every cell key the scenario's requests fall in, for the pacer's tick.
    cells: Vec<String>,
    next_tick_ms: u64,
    next_report_ms: u64,
    last_report_ms: u64,
    sequence: u64,
    /// Says hello at its next tick: it has just connected.
    hello_due: bool,
    report_interval_ms: u64,
}

impl PartsProxy {
    /// A proxy whose first report comes `phase_ms` after it connects.
    pub fn new(
        id: String,
        (decision, allowance): (
            DecisionMode,
            Option<sluice_core::allowance::AllowanceSettings>,
        ),
        max_buckets: usize,
        report_interval_ms: u64,
        cells: Vec<String>,
        rng: SmallRng,
        phase_ms: u64,
    ) -> Self {
        Self {
            id,
            table: DirectiveTable::new(max_buckets),
            pacer: Pacer::new(decision, allowance, TICK_MS, max_buckets),
            counters: BucketCounters::new(max_buckets),
            responses: ResponseSampler::new(DEFAULT_UPSTREAM_SAMPLE_EVERY),
            rng,
            cells,
            next_tick_ms: phase_ms % TICK_MS,
            next_report_ms: phase_ms,
            last_report_ms: 0,
            sequence: 0,
            hello_due: true,
            report_interval_ms,
        }
    }

    /// Its `proxy_id`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Connects at `t_ms` (again): the partial window is lost, as an Envoy
    /// that was shut down loses it; the report phase is kept.
    pub fn restart(&mut self, t_ms: u64) {
        self.counters.drain();
        self.hello_due = true;
        self.connect(t_ms);
    }

    fn connect(&mut self, t_ms: u64) {
        self.last_report_ms = t_ms;
        self.next_report_ms = t_ms + self.next_report_ms.min(self.report_interval_ms);
    }

    /// The hello of a proxy that has just connected, and the pacer's 100 ms
    /// tick when due.
    pub fn tick(&mut self, t_ms: u64, sent: &mut Vec<(u32, ProxyMessage)>) {
        if self.hello_due {
            self.hello_due = false;
            if t_ms == 0 {
                self.connect(t_ms);
            }
            sent.push((
                TOKEN,
                ProxyMessage {
                    kind: Some(proxy_message::Kind::Hello(Hello {
                        proxy_id: self.id.clone(),
                        instance_id: 0,
                        ..Default::default()
                    })),
                },
            ));
        }
        if t_ms >= self.next_tick_ms {
            self.next_tick_ms = t_ms + TICK_MS;
            self.pacer
                .on_tick(t_ms, self.cells.iter().map(String::as_str), &mut self.rng);
        }
    }

    /// The report, when one is due at `t_ms` (after the millisecond's
    /// requests).
    pub fn report(&mut self, t_ms: u64, sent: &mut Vec<(u32, ProxyMessage)>) {
        if t_ms < self.next_report_ms {
            return;
        }
        let report = Report {
            sequence: self.sequence,
            window_ms: t_ms - self.last_report_ms,
            directive_age_ms: None,
            buckets: self.counters.drain(),
            upstream: self.responses.signals.drain(),
        };
        self.sequence += 1;
        self.last_report_ms = t_ms;
        self.next_report_ms = t_ms + self.report_interval_ms;
        sent.push((
            TOKEN,
            ProxyMessage {
                kind: Some(proxy_message::Kind::Report(report)),
            },
        ));
    }

    /// Merges a batch and reconciles every cell's allowance with the
    /// table, as the filter's VMs do when their table changes.
    pub fn deliver(&mut self, mut batch: DirectiveBatch) {
        sluice_core::proxy_cap::resolve_batch(&mut batch, &self.id);
        self.table.merge(batch);
        let table = &self.table;
        self.pacer.resolve_all(|key| table.rates_for_cell(key));
    }

    /// Decides and counts a request of `bucket` for `tenant` (empty: none).
    pub fn admit(&mut self, bucket: &str, tenant: &str) -> bool {
        if tenant.is_empty() {
            let threshold = self.table.threshold(bucket);
            let key = key_of(bucket, "", Priority::Unspecified);
            let admitted = self.pacer.decide(&key, threshold, &mut self.rng) == Verdict::Admit;
            self.counters.record(bucket, admitted);
            return admitted;
        }
        let key = key_of(bucket, tenant, Priority::Unspecified);
        // The exact cell's directive, else the bucket's.
        let threshold = self
            .table
            .find(Some(&key), bucket)
            .and_then(|index| self.table.entry_mut(index))
            .map_or(DropThreshold::NEVER, |entry| entry.directive.threshold);
        let admitted = self.pacer.decide(&key, threshold, &mut self.rng) == Verdict::Admit;
        let outcome = if admitted {
            Outcome::Admitted
        } else {
            Outcome::Dropped
        };
        self.counters.record_cell(&key, outcome, true);
        admitted
    }

    /// Every response may be followed: the model picks one in four when
    /// it arrives (the same one in four as at admission).
    pub fn follows_response(&mut self) -> Option<usize> {
        Some(0)
    }

    /// A response of `bucket`, followed if it is the one in four.
    pub fn observe_response(&mut self, bucket: &str, status: u32, latency_us: u64) {
        if self.responses.pick() {
            self.responses
                .signals
                .observe(bucket, status, Some(latency_us));
        }
    }
}
