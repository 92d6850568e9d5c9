//! One proxy as the admin API shows it.

use std::time::Duration;

use serde::Serialize;

/// One proxy as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ProxyStatus {
    /// Proxy id from the Hello.
    pub(crate) proxy_id: String,
    /// Zone from the Hello; empty when the proxy named none.
    pub(crate) zone: String,
    /// Instance id from the latest Hello; changes when the proxy restarts.
    pub(crate) instance_id: u64,
    /// Whether a stream of the proxy is open.
    pub(crate) connected: bool,
    /// Whether another live instance (another Envoy process) says Hello
    /// with the same proxy id: both are counted, as two proxies.
    pub(crate) conflict: bool,
    /// Whether the proxy has passed its probation: until then its claims
    /// are weighed against the established proxies' and have no say in
    /// what is plausible.
    pub(crate) established: bool,
    /// Time since the proxy's last report (since its Hello before the
    /// first one); serialized as `since_last_report_ms`.
    #[serde(rename = "since_last_report_ms", serialize_with = "millis")]
    pub(crate) since_last_report: Duration,
    /// Cells (bucket, tenant, priority) in the proxy's current rates.
    pub(crate) cells: usize,
    /// Age of the directives the proxy enforces, on its own clock, as of
    /// its last report; `None` (JSON null) until a report names one, or
    /// while the proxy holds no directives; serialized as
    /// `directive_age_ms`.
    #[serde(rename = "directive_age_ms", serialize_with = "optional_millis")]
    pub(crate) directive_age: Option<Duration>,
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
