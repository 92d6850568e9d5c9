//! Fixtures shared by the benchmarks: directive tables and request
//! attributes built the way the filter builds them, and (in [`control`])
//! reports and fleet loads for the controller. [`e2e`] is the machinery of
//! the end-to-end Envoy benchmark (`bench_envoy`).

pub mod control;
pub mod e2e;
pub mod fleet;
pub mod rls;
pub mod upstream;

use sluice_filter::bucket_key::RequestAttributes;
use sluice_filter::directives::DirectiveTable;
use sluice_proto::v1::{Directive, DirectiveBatch};

/// Bucket names `tenant-0` … `tenant-{n-1}`.
pub fn bucket_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("tenant-{i}")).collect()
}

/// A table holding a directive with `drop_ratio` for every bucket.
pub fn table_with(buckets: &[String], drop_ratio: f64) -> DirectiveTable {
    let mut table = DirectiveTable::new(buckets.len().max(1));
    table.merge(DirectiveBatch {
        epoch: 1,
        version: 1,
        issued_at_unix_ms: 0,
        directives: buckets
            .iter()
            .map(|bucket| Directive {
                bucket: bucket.clone(),
                drop_ratio,
                limit_rps: 100.0,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    table
}

/// A request as the filter sees it through its host: a few headers.
#[derive(Debug, Clone)]
pub struct Request {
    /// (lower-case name, value) pairs, pseudo-headers included.
    pub headers: Vec<(String, String)>,
}

impl RequestAttributes for Request {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    }

    fn route_name(&self) -> Option<String> {
        Some("default".to_owned())
    }
}
