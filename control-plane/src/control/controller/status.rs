//! The buckets view the admin API serves, one control interval old.

use std::sync::Arc;

use serde::Serialize;

use crate::fleet::ProxyCap;
use crate::types::LimitRps;
use sluice_core::{DropRatio, Priority, Reason};

/// One bucket as shown by `GET /v1/buckets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketStatus {
    /// Bucket key.
    pub bucket: Arc<str>,
    /// Effective limit; `None` (JSON null) when unlimited.
    pub limit_rps: Option<LimitRps>,
    /// Fleet offered rate estimate.
    pub offered_rps: f64,
    /// Fleet admitted rate, as reported.
    pub admitted_rps: f64,
    /// The largest drop ratio pushed for a cell of the bucket.
    pub drop_ratio: DropRatio,
    /// Proxies with a non-zero offered rate for the bucket.
    pub proxies_reporting: u32,
    /// Fleet rate of requests the decision would have dropped but shadow
    /// mode let through.
    pub shadow_dropped_rps: f64,
    /// The floors of the bucket's tenants alone exceed its limit, so it
    /// admits more than the limit (see [`crate::control::fairness`]).
    pub(crate) floors_exceed_limit: bool,
    /// Per (tenant, priority) cell: load, fair share and drop ratio, sorted
    /// by tenant then priority.
    pub cells: Vec<CellStatus>,
    /// The cap on one proxy's share of the bucket's fleet sum and the
    /// proxies it cut; `None` (JSON null) while fewer proxies report the
    /// bucket than a cap needs.
    pub proxy_cap: Option<ProxyCap>,
}

/// One (tenant, priority) cell of a bucket as shown by `GET /v1/buckets`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CellStatus {
    /// Tenant; empty when the filter derives none.
    pub tenant: Arc<str>,
    /// Priority as reported.
    pub priority: Priority,
    /// Fleet offered rate of the cell.
    pub offered_rps: f64,
    /// Fleet admitted rate of the cell, as reported.
    pub admitted_rps: f64,
    /// Fleet shadow-dropped rate of the cell, as reported.
    pub shadow_dropped_rps: f64,
    /// The cell's share of the limit as pushed; `None` (JSON null) when the
    /// bucket is unlimited.
    pub share_rps: Option<f64>,
    /// The drop ratio pushed to proxies.
    pub drop_ratio: DropRatio,
    /// Why the cell is dropped; `None` (JSON null) when it is not.
    pub reason: Option<Reason>,
}
