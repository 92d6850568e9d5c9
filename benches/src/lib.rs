//! Fixtures shared by the benchmarks: directive tables and request
//! attributes built the way the filter builds them, and (in [`control`])
//! reports and fleet loads for the controller. [`e2e`] is the machinery of
//! the end-to-end Envoy benchmark (`bench_envoy`).

pub mod control;
pub mod e2e;
pub mod exit;
pub mod fleet;
pub mod limitador_rls;
pub mod rls;
pub mod tokens;
pub mod upstream;

use sluice_agent::agent::Agent;
use sluice_agent::config::{ConfigError, FilterConfig, RequestPolicy};
use sluice_agent::directives::DirectiveTable;
use sluice_agent::host::{
    ControlStreams, HostError, Log, LogLevel, MetricId, MetricKind, MetricSink, SharedData,
    SharedValue,
};
use sluice_agent::identity::ProxyIdentity;
use sluice_agent::request::classify::RequestAttributes;
use sluice_agent::settings::{AgentSettings, DEFAULT_UPSTREAM_SAMPLE_EVERY};
use sluice_agent::tick::pacing::DecisionMode;
use sluice_core::Priority;
use sluice_proto::v1::{Directive, DirectiveBatch};
use std::borrow::Cow;

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
                limit_rps: Some(100.0),
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

/// Each read copies the value out, as a proxy-wasm host call does.
impl RequestAttributes for Request {
    fn header(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| Cow::Owned(value.as_bytes().to_vec()))
    }

    fn route_name(&self) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Owned(b"default".to_vec()))
    }
}

/// A host that accepts every call and keeps nothing: lets a benchmark run
/// an agent's ticks (so its per-cell decision state exists, as in Envoy)
/// without a proxy.
#[derive(Debug, Default)]
pub struct QuietHost;

impl SharedData for QuietHost {
    fn get_shared_data(&self, _key: &str) -> Result<Option<SharedValue>, HostError> {
        Ok(None)
    }

    fn set_shared_data(
        &mut self,
        _key: &str,
        _value: &[u8],
        _cas: Option<u32>,
    ) -> Result<(), HostError> {
        Ok(())
    }

    fn register_shared_queue(&mut self, _name: &str) -> Result<u32, HostError> {
        Ok(1)
    }

    fn enqueue_shared_queue(&mut self, _queue_id: u32, _message: &[u8]) -> Result<(), HostError> {
        Ok(())
    }

    fn dequeue_shared_queue(&mut self, _queue_id: u32) -> Result<Option<Vec<u8>>, HostError> {
        Ok(None)
    }
}

impl ControlStreams for QuietHost {
    fn open_control_stream(&mut self, _cluster: &str) -> Result<u32, HostError> {
        Ok(1)
    }

    fn send_stream_message(&mut self, _token: u32, _message: &[u8]) -> Result<(), HostError> {
        Ok(())
    }

    fn close_stream(&mut self, _token: u32) -> Result<(), HostError> {
        Ok(())
    }
}

impl MetricSink for QuietHost {
    fn define_metric(&mut self, _kind: MetricKind, _name: &str) -> Result<MetricId, HostError> {
        Ok(MetricId(1))
    }

    fn increment_metric(&mut self, _id: MetricId, _delta: u64) -> Result<(), HostError> {
        Ok(())
    }

    fn record_metric(&mut self, _id: MetricId, _value: u64) -> Result<(), HostError> {
        Ok(())
    }
}

impl Log for QuietHost {
    fn log(&self, _level: LogLevel, _message: &str) {}
}

/// The agent settings every benchmark starts from: the configuration's
/// defaults but coin flips and no allowance, the path the `decision/*`
/// rows have measured since they were first written.
pub fn bench_settings() -> AgentSettings {
    AgentSettings {
        decision: DecisionMode::Coin,
        allowance: None,
        ..AgentSettings::new("sluice_control_plane", "bench")
    }
}

/// An agent enforcing a `drop_ratio` directive on each tenant's cell
/// (`bucket`, tenant, best effort) of `tenants`, warmed like
/// [`warm_agent`]: the per-tenant lookup of a fairness deployment.
pub fn warm_tenant_agent(bucket: &str, tenants: &[String], drop_ratio: f64) -> Agent {
    let mut agent = Agent::new(
        AgentSettings {
            max_buckets: tenants.len().max(1),
            ..bench_settings()
        },
        7,
    );
    let mut table = DirectiveTable::new(tenants.len().max(1));
    table.merge(DirectiveBatch {
        epoch: 1,
        version: 1,
        directives: tenants
            .iter()
            .map(|tenant| Directive {
                bucket: bucket.to_owned(),
                tenant: tenant.clone(),
                priority: Priority::BestEffort as i32,
                drop_ratio,
                limit_rps: Some(100.0),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    agent.load_directives(table);
    for tenant in tenants {
        agent.admit_cell(bucket, tenant, Priority::BestEffort);
    }
    agent.on_tick(&mut QuietHost, 1_000);
    for tenant in tenants {
        agent.admit_cell(bucket, tenant, Priority::BestEffort);
    }
    agent
}

/// An agent enforcing a `drop_ratio` directive on every bucket in
/// `buckets`, warmed the way a VM in Envoy is: each bucket requested once
/// and one tick run, so counters and per-cell decision state exist.
pub fn warm_agent(buckets: &[String], drop_ratio: f64) -> Agent {
    warm_agent_following(buckets, drop_ratio, DEFAULT_UPSTREAM_SAMPLE_EVERY)
}

/// A warm agent whose one directive is for the aggregate pattern `free-*`
/// (pushed with it), so every bucket `free-<anything>` is decided as
/// `free-*`: a flood of distinct members is one cell.
pub fn warm_aggregate_agent(members: &[String], drop_ratio: f64) -> Agent {
    let mut agent = Agent::new(
        AgentSettings {
            max_buckets: 16,
            ..bench_settings()
        },
        7,
    );
    let mut table = DirectiveTable::new(16);
    table.merge(DirectiveBatch {
        epoch: 1,
        version: 1,
        directives: vec![Directive {
            bucket: "free-*".into(),
            drop_ratio,
            limit_rps: Some(100.0),
            ..Default::default()
        }],
        aggregate_patterns: vec!["free-*".into()],
        ..Default::default()
    });
    agent.load_directives(table);
    for member in members {
        agent.admit(member);
    }
    agent.on_tick(&mut QuietHost, 1_000);
    agent
}

/// [`warm_agent`] deciding with the credit (the configuration's default
/// mode), so every cell has the per-cell state the credit keeps.
pub fn warm_credit_agent(buckets: &[String], drop_ratio: f64) -> Agent {
    let mut agent = Agent::new(
        AgentSettings {
            max_buckets: buckets.len().max(1),
            decision: DecisionMode::Credit,
            ..bench_settings()
        },
        7,
    );
    agent.load_directives(table_with(buckets, drop_ratio));
    for bucket in buckets {
        agent.admit(bucket);
    }
    // The credit's state is made on the pacer's tick, every 100 ms.
    agent.on_tick(&mut QuietHost, 1_000);
    agent.on_tick(&mut QuietHost, 1_100);
    for bucket in buckets {
        agent.admit(bucket);
    }
    agent
}

/// [`warm_agent`] following one admitted request in `sample_every` to its
/// response for the upstream signals.
pub fn warm_agent_following(buckets: &[String], drop_ratio: f64, sample_every: u32) -> Agent {
    let mut agent = Agent::new(
        AgentSettings {
            max_buckets: buckets.len().max(1),
            upstream_sample_every: sample_every,
            ..bench_settings()
        },
        7,
    );
    agent.load_directives(table_with(buckets, drop_ratio));
    for bucket in buckets {
        agent.admit(bucket);
    }
    agent.on_tick(&mut QuietHost, 1_000);
    for bucket in buckets {
        agent.admit(bucket);
    }
    agent
}

/// The bucket of [`warm_budget_agent`].
pub const BUDGET_BUCKET: &str = "llm";

/// An agent enforcing a token budget, deciding with the credit (the
/// configuration's default mode), and the request policy of its filter:
/// every request in the bucket [`BUDGET_BUCKET`], its estimate read from
/// `x-estimated-tokens` by the cost rule, its usage from the body. The
/// directive is the control plane's for a budget of 20,000 tokens a
/// second written per minute, estimates counted up to 16,000, with
/// `drop_ratio`. Warmed like [`warm_credit_agent`].
pub fn warm_budget_agent(drop_ratio: f64) -> Result<(Agent, RequestPolicy), ConfigError> {
    let config = serde_json::json!({
        "control_plane_cluster": "sluice_control_plane",
        "decision": "credit",
        "bucket_key": [{"source": "literal", "value": BUDGET_BUCKET}],
        "cost_rules": [{
            "bucket": BUDGET_BUCKET,
            "cost": {"estimate": {"source": "request_header", "name": "x-estimated-tokens", "default": 500}},
            "actual": {"metadata": null, "body": {"parse": true}},
        }],
    });
    let parts = FilterConfig::from_json(config.to_string().as_bytes())?
        .into_parts(|| ProxyIdentity::Named("bench".into()), String::new);
    let mut agent = Agent::new(
        AgentSettings {
            allowance: None,
            ..parts.agent
        },
        7,
    );
    let mut table = DirectiveTable::new(1);
    table.merge(DirectiveBatch {
        epoch: 1,
        version: 1,
        directives: vec![Directive {
            bucket: BUDGET_BUCKET.into(),
            drop_ratio,
            limit_rps: Some(20_000.0),
            cost_unit: "tokens".into(),
            budget_period_s: 60,
            estimate_cap: 16_000,
            ..Default::default()
        }],
        ..Default::default()
    });
    agent.load_directives(table);
    agent.admit(BUDGET_BUCKET);
    agent.on_tick(&mut QuietHost, 1_000);
    agent.on_tick(&mut QuietHost, 1_100);
    agent.admit(BUDGET_BUCKET);
    Ok((agent, parts.request))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the costed rows measure: a request let through under the cost
    /// rule carries its header's estimate to its stream's end; without
    /// the rule it carries nothing.
    #[test]
    fn the_budget_agent_counts_the_header_estimate() -> Result<(), ConfigError> {
        let request = Request {
            headers: vec![("x-estimated-tokens".into(), "1200".into())],
        };
        let (mut agent, policy) = warm_budget_agent(0.0)?;
        let (decision, pending) =
            agent.admit_costed_request(&policy.classifier, &policy.costs, &request);
        assert!(decision.admits());
        assert_eq!(pending.map(|pending| pending.estimate()), Some(1_200));
        let (_, pending) = agent.admit_costed_request(
            &policy.classifier,
            &sluice_agent::usage::rules::CostRules::default(),
            &request,
        );
        assert!(pending.is_none());
        Ok(())
    }
}
