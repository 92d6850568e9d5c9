//! The directive table: what the control plane said about each cell,
//! merged from `DirectiveBatch` messages and shared between VMs as one
//! encoded `DirectiveBatch`.
//!
//! Bucket-wide directives (empty tenant, unspecified priority) are indexed
//! by the plain bucket name, the others by the cell key
//! ([`crate::request::classify`]), so finding a request's directive is at most two hash
//! probes: the exact cell, then the bucket. Entries live in a vector the
//! indexes point into, so the request path can take the entry mutably (for
//! its per-cell state) after immutable probes.
//!
//! Every directive that enforces something is kept, a zero drop ratio
//! included: the 429 contract needs its limit. A directive that enforces
//! nothing (no ratio, no limit, no share, no mode) is a lift: it removes
//! the cell's entry, so unlimited and retired cells never hold a slot.

use crate::fast_map::{self, FastMap};
use crate::modes::ModeSettings;
use crate::request::classify::{key_of, parse_key};
use crate::request::reject::{
    BudgetFacts, BudgetResponses, RejectFacts, RejectResponse, ResponseSettings,
};
use prost::Message;
use sluice_core::allowance::DirectiveRates;
use sluice_core::directive::{CellDirective, is_lift};
use sluice_core::gcra::Gcra;
use sluice_core::glob::{Glob, MAX_AGGREGATE_PATTERNS};
use sluice_core::{DropRatio, DropReason, DropThreshold, MAX_BUCKET_KEY_BYTES, Priority};
use sluice_proto::v1::{Directive, DirectiveBatch};
use std::sync::Arc;
use thiserror::Error;

/// `DirectiveBatch.directives`' field number (`proto/sluice/v1/sluice.proto`).
const DIRECTIVES_FIELD: u32 = 4;

/// Where the directives came from: the control plane's process (`epoch`)
/// and its batch counter (`version`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Random per control-plane process.
    pub epoch: u64,
    /// Batch counter within the epoch.
    pub version: u64,
    /// When the control plane computed the batch (Unix ms).
    pub issued_at_unix_ms: u64,
}

/// What merging a batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeOutcome {
    /// Directives applied.
    pub applied: usize,
    /// Directives ignored: empty or oversized bucket or tenant, a number
    /// out of range, or table full.
    pub rejected: usize,
}

/// The shared blob could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("undecodable directive table: {0}")]
pub struct DecodeError(String);

/// Mutable state of a directive kept across table updates, shared by every
/// cell it governs (a cell's own state is in its record,
/// [`crate::request::cell_table`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DirectiveState {
    /// The local limiter used while the table is stale (`local_limit`).
    pub fallback: Option<Gcra>,
}

/// One cell's directive with what the request path needs prepared.
#[derive(Debug, Clone, PartialEq)]
pub struct CellEntry {
    /// What the control plane said.
    pub directive: CellDirective,
    /// Whether drops are enforced on this proxy (else shadowed).
    pub enforce: bool,
    /// The 429 for drops decided by the directive.
    pub response: Arc<RejectResponse>,
    /// The 429 for drops of the local fallback limit.
    pub fallback_response: Arc<RejectResponse>,
    /// A cost budget's 429s by the wait a request's estimate needs: the
    /// directive's, then the fallback's ([`Self::response_for`]).
    pub budget_responses: Option<Arc<(BudgetResponses, BudgetResponses)>>,
    /// Per-cell state.
    pub state: DirectiveState,
    /// The wire form, for sharing the table.
    wire: Directive,
}

impl CellEntry {
    /// The directive as it arrived.
    pub fn wire(&self) -> &Directive {
        &self.wire
    }

    /// The 429 of a request of `weight` dropped by the directive
    /// (`fallback`: by the local fallback limit): under a cost budget the
    /// variant whose wait covers the weight, else the cell's one response.
    #[inline]
    pub fn response_for(&self, fallback: bool, weight: u64) -> &Arc<RejectResponse> {
        let budget = self
            .budget_responses
            .as_deref()
            .and_then(|(own, local)| if fallback { local } else { own }.for_estimate(weight));
        match (budget, fallback) {
            (Some(response), _) => response,
            (None, false) => &self.response,
            (None, true) => &self.fallback_response,
        }
    }
}

/// Directives by cell.
#[derive(Debug, Clone)]
pub struct DirectiveTable {
    entries: Vec<CellEntry>,
    /// Bucket-wide directives by bucket name.
    bucket_wide: FastMap<String, usize>,
    /// Tenant or priority directives by cell key.
    cells: FastMap<String, usize>,
    provenance: Provenance,
    modes: ModeSettings,
    ttl_ms: u64,
    /// Globs whose matching buckets are counted as the one bucket the
    /// pattern names, first match first.
    aggregates: Vec<Glob>,
    max_entries: usize,
    responses: Arc<ResponseSettings>,
    proxy_id: Arc<str>,
    /// Changes whenever what [`Self::find`] returns may change (a merge,
    /// or this table replacing another), so a caller may remember a lookup
    /// for as long as the generation stays the same.
    generation: u64,
}

impl PartialEq for DirectiveTable {
    fn eq(&self, other: &Self) -> bool {
        self.encode() == other.encode()
    }
}

impl DirectiveTable {
    /// An empty table of at most `max_entries` cells, with default
    /// responses, for a proxy without an id.
    pub fn new(max_entries: usize) -> Self {
        Self::with_settings(max_entries, Arc::new(ResponseSettings::default()), "")
    }

    /// An empty table rendering responses with `responses`, applying mode
    /// policies for the proxy `proxy_id`.
    pub fn with_settings(
        max_entries: usize,
        responses: Arc<ResponseSettings>,
        proxy_id: &str,
    ) -> Self {
        Self {
            entries: Vec::new(),
            bucket_wide: fast_map::new(),
            cells: fast_map::new(),
            provenance: Provenance::default(),
            modes: ModeSettings::default(),
            ttl_ms: 0,
            aggregates: Vec::new(),
            max_entries,
            responses,
            proxy_id: Arc::from(proxy_id),
            generation: 0,
        }
    }

    /// The threshold of a bucket's bucket-wide directive;
    /// [`DropThreshold::NEVER`] if it has none. One probe, no allocation.
    pub fn threshold(&self, bucket: &str) -> DropThreshold {
        self.bucket_wide
            .get(bucket)
            .and_then(|i| self.entries.get(*i))
            .map_or(DropThreshold::NEVER, |e| e.directive.threshold)
    }

    /// The drop ratio of a bucket's bucket-wide directive, if any.
    pub fn drop_ratio(&self, bucket: &str) -> Option<DropRatio> {
        self.bucket_wide
            .get(bucket)
            .and_then(|i| self.entries.get(*i))
            .map(|e| e.directive.drop_ratio)
    }

    /// The index of the entry covering a request: the exact cell (`cell_key`,
    /// skipped when `None`, i.e. the request's cell is bucket-wide), else
    /// the bucket's. At most two probes, no allocation.
    pub fn find(&self, cell_key: Option<&str>, bucket: &str) -> Option<usize> {
        if let Some(key) = cell_key
            && let Some(index) = self.cells.get(key)
        {
            return Some(*index);
        }
        self.bucket_wide.get(bucket).copied()
    }

    /// Identifies the table's current content for remembered lookups: a
    /// [`Self::find`] result holds while the generation is unchanged.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every entry, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = &CellEntry> {
        self.entries.iter()
    }

    /// What the directive governing the cell `key` (its own, else its
    /// bucket's) says about rates, as the pacer's allowance needs it.
    pub fn rates_for_cell(&self, key: &str) -> Option<DirectiveRates> {
        let directive = self.directive_for_cell(key)?;
        Some(DirectiveRates {
            drop_ratio: directive.drop_ratio,
            limit_rps: directive.limit_in_weight_rps(),
            fleet_offered_rps: directive.offered_rps,
        })
    }

    /// The directive governing the cell `key`: its own, else its
    /// bucket's.
    fn directive_for_cell(&self, key: &str) -> Option<&CellDirective> {
        let (bucket, tenant, priority) = parse_key(key)?;
        let wide = tenant.is_empty() && priority == Priority::Unspecified;
        let index = self.find((!wide).then_some(key), bucket)?;
        Some(&self.entries.get(index)?.directive)
    }

    /// Whether the directive governing the cell `key` is a cost budget (its
    /// rates in estimated cost, not requests); `None` when no directive
    /// governs the cell.
    pub fn is_budget(&self, key: &str) -> Option<bool> {
        Some(self.directive_for_cell(key)?.cost_unit.is_some())
    }

    /// Whether a directive governs the cell `key` (its own or its
    /// bucket's).
    pub fn covers(&self, key: &str) -> bool {
        self.rates_for_cell(key).is_some()
    }

    /// The entry at an index from [`Self::find`].
    pub fn entry_mut(&mut self, index: usize) -> Option<&mut CellEntry> {
        self.entries.get_mut(index)
    }

    /// The directive of exactly this cell, if any (not the bucket's).
    pub fn cell(&self, bucket: &str, tenant: &str, priority: Priority) -> Option<&CellEntry> {
        let index = if tenant.is_empty() && priority == Priority::Unspecified {
            self.bucket_wide.get(bucket)
        } else {
            self.cells.get(&key_of(bucket, tenant, priority))
        };
        index.and_then(|i| self.entries.get(*i))
    }

    /// Number of cells with a directive.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no cell has a directive.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most proxies any directive counted as reporting its bucket: a
    /// lower bound on the fleet the control plane last saw, told to a new
    /// control plane in `Hello`.
    pub fn known_proxies(&self) -> u32 {
        self.entries
            .iter()
            .map(|e| e.directive.reporting_proxies)
            .max()
            .unwrap_or(0)
    }

    /// Cells whose drop ratio is above zero.
    pub fn shedding(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| !e.directive.threshold.is_never())
            .count()
    }

    /// The batch the table was last merged from.
    pub fn provenance(&self) -> Provenance {
        self.provenance
    }

    /// The mode policy in force.
    pub fn modes(&self) -> ModeSettings {
        self.modes
    }

    /// Names the proxy the table applies mode policies for, once it is
    /// known ([`crate::identity`]): the policy in force is applied again,
    /// so canary membership follows the name.
    pub fn set_proxy_id(&mut self, proxy_id: &str) {
        if *self.proxy_id == *proxy_id {
            return;
        }
        self.proxy_id = Arc::from(proxy_id);
        let modes = ModeSettings::from_policy(self.modes.to_policy().as_ref(), proxy_id);
        if modes != self.modes {
            self.generation = self.generation.wrapping_add(1);
            self.modes = modes;
            for entry in &mut self.entries {
                entry.enforce = modes.enforces(entry.directive.mode);
            }
        }
    }

    /// The TTL the last batch named (0: the configured default).
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// The aggregate pattern `bucket` is counted under, if one matches: the
    /// bucket a request of `bucket` is decided and counted as. No pattern
    /// (the common case) costs one length check.
    #[inline]
    pub fn aggregate_of(&self, bucket: &str) -> Option<&str> {
        if self.aggregates.is_empty() {
            return None;
        }
        self.aggregates
            .iter()
            .find(|glob| glob.matches(bucket))
            .map(Glob::as_str)
    }

    /// Merges a batch: named cells take the new directive (keeping their
    /// state), others keep theirs; the batch's mode policy and TTL replace
    /// the previous ones (an absent policy means "enforce, no kill
    /// switch"). Invalid directives are skipped and counted, never fatal.
    pub fn merge(&mut self, batch: DirectiveBatch) -> MergeOutcome {
        self.merge_reusing(batch, None)
    }

    /// [`Self::merge`], taking a cell's prepared 429s from its entry here or
    /// in `previous` (the table this one replaces) when they were rendered
    /// from the same facts: a VM re-reading the shared table after one
    /// cell changed renders that cell's responses, not every cell's.
    fn merge_reusing(&mut self, batch: DirectiveBatch, previous: Option<&Self>) -> MergeOutcome {
        self.generation = self.generation.wrapping_add(1);
        self.provenance = Provenance {
            epoch: batch.epoch,
            version: batch.version,
            issued_at_unix_ms: batch.issued_at_unix_ms,
        };
        self.ttl_ms = batch.ttl_ms;
        let mut outcome = MergeOutcome::default();
        let (aggregates, refused) = valid_aggregates(&batch.aggregate_patterns);
        self.aggregates = aggregates;
        outcome.rejected += refused;
        let modes = ModeSettings::from_policy(batch.modes.as_ref(), &self.proxy_id);
        if modes != self.modes {
            self.modes = modes;
            for entry in &mut self.entries {
                entry.enforce = modes.enforces(entry.directive.mode);
            }
        }
        for directive in batch.directives {
            if self.apply(directive, previous) {
                outcome.applied += 1;
            } else {
                outcome.rejected += 1;
            }
        }
        outcome
    }

    /// Whether merging `batch` would change more than freshness: it names
    /// directives, or its mode policy, TTL or aggregate patterns differ.
    pub fn changes_with(&self, batch: &DirectiveBatch) -> bool {
        !batch.directives.is_empty()
            || batch.ttl_ms != self.ttl_ms
            || valid_aggregates(&batch.aggregate_patterns).0 != self.aggregates
            || ModeSettings::from_policy(batch.modes.as_ref(), &self.proxy_id) != self.modes
    }

    fn apply(&mut self, wire: Directive, previous: Option<&Self>) -> bool {
        let Some(directive) = CellDirective::from_wire(&wire) else {
            return false;
        };
        let priority = Priority::from_wire(wire.priority);
        let wide = wire.tenant.is_empty() && priority == Priority::Unspecified;
        let key = if wide {
            wire.bucket.clone()
        } else {
            key_of(&wire.bucket, &wire.tenant, priority)
        };
        if is_lift(&wire) {
            self.remove(wide, &key);
            return true;
        }
        let index_map = if wide { &self.bucket_wide } else { &self.cells };
        let existing = index_map.get(&key).copied();
        if existing.is_none() && self.entries.len() >= self.max_entries {
            return false;
        }
        let rendered = existing
            .and_then(|i| self.entries.get(i))
            .or_else(|| {
                previous
                    .filter(|p| Arc::ptr_eq(&p.responses, &self.responses))
                    .and_then(|p| p.entry_of(wide, &key))
            })
            .filter(|entry| same_response_facts(&entry.directive, &directive))
            .map(|entry| {
                (
                    Arc::clone(&entry.response),
                    Arc::clone(&entry.fallback_response),
                    entry.budget_responses.clone(),
                )
            });
        let (response, fallback_response, budget_responses) = rendered.unwrap_or_else(|| {
            let facts = |reason| RejectFacts {
                bucket: &wire.bucket,
                tenant: &wire.tenant,
                reason,
                limit_rps: directive.stated_limit_rps().unwrap_or(0.0),
                retry_after_ms: directive.retry_after_ms,
                budget: directive.cost_unit.as_deref().map(|unit| BudgetFacts {
                    unit,
                    period_s: directive.budget_period_s,
                    charge_factor: directive.charge_factor,
                }),
            };
            let render = |reason| Arc::new(self.responses.render(&facts(reason)));
            let budget = directive.cost_unit.is_some().then(|| {
                Arc::new((
                    self.responses.render_budget(&facts(directive.reason)),
                    self.responses
                        .render_budget(&facts(DropReason::FallbackLimit)),
                ))
            });
            (
                render(directive.reason),
                render(DropReason::FallbackLimit),
                budget,
            )
        });
        let enforce = self.modes.enforces(directive.mode);
        let mut wire = wire;
        wire.priority = priority as i32;
        match existing.and_then(|i| self.entries.get_mut(i)) {
            Some(entry) => {
                entry.directive = directive;
                entry.enforce = enforce;
                entry.response = response;
                entry.fallback_response = fallback_response;
                entry.budget_responses = budget_responses;
                entry.wire = wire;
            }
            None => {
                let index = self.entries.len();
                self.entries.push(CellEntry {
                    directive,
                    enforce,
                    response,
                    fallback_response,
                    budget_responses,
                    state: DirectiveState::default(),
                    wire,
                });
                if wide {
                    self.bucket_wide.insert(key, index);
                } else {
                    self.cells.insert(key, index);
                }
            }
        }
        true
    }

    /// The entry of `key` (a bucket name when `wide`, else a cell key).
    fn entry_of(&self, wide: bool, key: &str) -> Option<&CellEntry> {
        let index_map = if wide { &self.bucket_wide } else { &self.cells };
        index_map.get(key).and_then(|&i| self.entries.get(i))
    }

    /// Removes the entry of `key` (a bucket name when `wide`, else a cell
    /// key), moving the last entry into its place.
    fn remove(&mut self, wide: bool, key: &str) {
        let index_map = if wide {
            &mut self.bucket_wide
        } else {
            &mut self.cells
        };
        let Some(index) = index_map.remove(key) else {
            return;
        };
        if index >= self.entries.len() {
            return;
        }
        self.entries.swap_remove(index);
        // The entry that was last now sits at `index`: repoint its index.
        if let Some(moved) = self.entries.get(index) {
            let wire = &moved.wire;
            let priority = Priority::from_wire(wire.priority);
            if wire.tenant.is_empty() && priority == Priority::Unspecified {
                if let Some(slot) = self.bucket_wide.get_mut(wire.bucket.as_str()) {
                    *slot = index;
                }
            } else if let Some(slot) = self
                .cells
                .get_mut(key_of(&wire.bucket, &wire.tenant, priority).as_str())
            {
                *slot = index;
            }
        }
    }

    /// Takes over the per-cell state of `previous` for cells both hold (a
    /// VM rebuilding its table from the shared blob keeps its limiters).
    pub fn adopt_state(&mut self, previous: &mut DirectiveTable) {
        // Lookups remembered against the previous table are void.
        self.generation = previous.generation.wrapping_add(1);
        for (bucket, index) in &self.bucket_wide {
            if let (Some(entry), Some(old)) = (
                self.entries.get_mut(*index),
                previous
                    .bucket_wide
                    .get(bucket)
                    .and_then(|i| previous.entries.get_mut(*i)),
            ) {
                entry.state = std::mem::take(&mut old.state);
            }
        }
        for (key, index) in &self.cells {
            if let (Some(entry), Some(old)) = (
                self.entries.get_mut(*index),
                previous
                    .cells
                    .get(key)
                    .and_then(|i| previous.entries.get_mut(*i)),
            ) {
                entry.state = std::mem::take(&mut old.state);
            }
        }
    }

    /// The shared form: a `DirectiveBatch` holding the whole table (mode
    /// policy and TTL included), cells sorted so equal tables encode to
    /// equal bytes. The directives are encoded from the table in place (a
    /// batch's other fields first, then each directive as its repeated
    /// field): the leader writes this on every change, and copying every
    /// directive into a batch first cost more than encoding it.
    pub fn encode(&self) -> Vec<u8> {
        let mut directives: Vec<&Directive> = self.entries.iter().map(|e| &e.wire).collect();
        directives.sort_unstable_by(|a, b| {
            (&a.bucket, &a.tenant, a.priority).cmp(&(&b.bucket, &b.tenant, b.priority))
        });
        let header = DirectiveBatch {
            epoch: self.provenance.epoch,
            version: self.provenance.version,
            issued_at_unix_ms: self.provenance.issued_at_unix_ms,
            directives: Vec::new(),
            ttl_ms: self.ttl_ms,
            modes: self.modes.to_policy(),
            aggregate_patterns: self
                .aggregates
                .iter()
                .map(|glob| glob.as_str().to_owned())
                .collect(),
        };
        let body: usize = directives
            .iter()
            .map(|d| prost::encoding::message::encoded_len(DIRECTIVES_FIELD, *d))
            .sum();
        let mut bytes = Vec::with_capacity(header.encoded_len() + body);
        header.encode_raw(&mut bytes);
        for directive in directives {
            prost::encoding::message::encode(DIRECTIVES_FIELD, directive, &mut bytes);
        }
        bytes
    }

    /// Rebuilds a table from its shared form, validating every entry again
    /// (the blob is written by another VM, possibly another module version).
    pub fn decode(bytes: &[u8], max_entries: usize) -> Result<(Self, MergeOutcome), DecodeError> {
        Self::decode_with(bytes, Self::new(max_entries))
    }

    /// Like [`Self::decode`], into an empty table with `empty`'s settings.
    pub fn decode_with(bytes: &[u8], empty: Self) -> Result<(Self, MergeOutcome), DecodeError> {
        let batch = DirectiveBatch::decode(bytes).map_err(|err| DecodeError(err.to_string()))?;
        let mut table = empty;
        let outcome = table.merge(batch);
        Ok((table, outcome))
    }

    /// Like [`Self::decode_with`] into `previous`'s settings, taking the
    /// prepared 429s of cells whose facts did not change from `previous`
    /// (the table the decoded one replaces) instead of rendering them again.
    pub fn decode_replacing(
        bytes: &[u8],
        previous: &Self,
    ) -> Result<(Self, MergeOutcome), DecodeError> {
        let batch = DirectiveBatch::decode(bytes).map_err(|err| DecodeError(err.to_string()))?;
        let mut table = previous.empty_like();
        let outcome = table.merge_reusing(batch, Some(previous));
        Ok((table, outcome))
    }

    /// An empty table with this table's settings.
    pub fn empty_like(&self) -> Self {
        Self::with_settings(
            self.max_entries,
            Arc::clone(&self.responses),
            &self.proxy_id,
        )
    }
}

/// The aggregate patterns of a batch a table may hold: the first
/// [`MAX_AGGREGATE_PATTERNS`] of 1 to [`MAX_BUCKET_KEY_BYTES`] bytes; and
/// how many were refused.
fn valid_aggregates(patterns: &[String]) -> (Vec<Glob>, usize) {
    let valid: Vec<Glob> = patterns
        .iter()
        .filter(|pattern| (1..=MAX_BUCKET_KEY_BYTES).contains(&pattern.len()))
        .take(MAX_AGGREGATE_PATTERNS)
        .map(|pattern| Glob::new(pattern.as_str()))
        .collect();
    let refused = patterns.len() - valid.len();
    (valid, refused)
}

/// Whether a cell's 429s, rendered for `old`, are the ones `new` needs:
/// they depend on the reason, the stated limit and the retry hint, and a
/// budget's waits on its charge factor (and the cell's key and the
/// response settings, which the caller compares).
fn same_response_facts(old: &CellDirective, new: &CellDirective) -> bool {
    old.reason == new.reason
        && old.stated_limit_rps().map(f64::to_bits) == new.stated_limit_rps().map(f64::to_bits)
        && old.charge_factor.to_bits() == new.charge_factor.to_bits()
        && old.retry_after_ms == new.retry_after_ms
        && old.cost_unit == new.cost_unit
        && old.budget_period_s == new.budget_period_s
}

#[cfg(test)]
#[path = "directives_tests.rs"]
mod tests;
