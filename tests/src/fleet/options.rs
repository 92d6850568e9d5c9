//! What a test fleet is made of: the control plane's limits, arguments and
//! listeners, and the Envoys' count, data plane and filter keys.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use crate::fleet::envoy_spec::{DataPlane, EnvoySpec};

/// Settings of a fleet: a control plane and `envoys` Envoys.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// The control plane's limits file.
    pub limits_yaml: String,
    /// `--control-interval-ms`; `None` keeps the limits file's.
    pub control_interval_ms: Option<u64>,
    /// More `sluice serve` arguments.
    pub control_plane_args: Vec<String>,
    /// Mutual TLS on the gRPC listener, and Envoys that present a client
    /// certificate (`demo-mtls.yaml`).
    pub grpc_tls: GrpcTls,
    /// Quota files (`(name, YAML)`) served with `--quotas` from the
    /// fleet's `quotas/` directory; none: no `--quotas`.
    pub quota_files: Vec<(String, String)>,
    /// The filter's `report_interval_ms`.
    pub report_interval_ms: u64,
    /// How many Envoys (they use demo-a.yaml, demo-b.yaml, demo-a.yaml, …).
    pub envoys: usize,
    /// More filter configuration keys for every Envoy (a JSON object).
    pub filter: serde_json::Value,
    /// Proxy ids, by Envoy index; `test-<letter>` where absent.
    pub proxy_ids: Vec<String>,
    /// Worker threads of every Envoy (`--concurrency`).
    pub concurrency: u32,
    /// The wasm filter or the native module in every Envoy.
    pub data_plane: DataPlane,
    /// Route admitted requests to this server instead of answering them
    /// in Envoy ([`crate::envoy::route_to_upstream`]).
    pub upstream: Option<SocketAddr>,
}

/// The control plane's gRPC listener.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GrpcTls {
    /// Plaintext.
    #[default]
    Plaintext,
    /// Client certificates of a fresh test CA required, and its client
    /// identity may claim any proxy id
    /// ([`crate::certs::DevCerts::serve_args`], before the other
    /// arguments).
    Mutual,
    /// Client certificates required, no identity rule but the test's own
    /// arguments ([`crate::certs::DevCerts::tls_args`]).
    MutualOwnRules,
}

/// The control interval of a fleet whose options do not set one.
const DEFAULT_CONTROL_INTERVAL_MS: u64 = 200;

impl FleetOptions {
    /// `envoys` Envoys of two workers, 200 ms control interval, 100 ms
    /// report interval.
    pub fn new(limits_yaml: &str, envoys: usize) -> Self {
        Self {
            limits_yaml: limits_yaml.to_owned(),
            control_interval_ms: Some(DEFAULT_CONTROL_INTERVAL_MS),
            control_plane_args: Vec::new(),
            grpc_tls: GrpcTls::Plaintext,
            quota_files: Vec::new(),
            report_interval_ms: 100,
            envoys,
            filter: json!({}),
            proxy_ids: Vec::new(),
            concurrency: 2,
            data_plane: DataPlane::Wasm,
            upstream: None,
        }
    }

    /// A control plane alone (no Envoy started with it).
    pub fn control_plane_only(limits_yaml: &str) -> Self {
        Self::new(limits_yaml, 0)
    }

    /// The same fleet with `data_plane` in every Envoy.
    #[must_use]
    pub fn with_data_plane(mut self, data_plane: DataPlane) -> Self {
        self.data_plane = data_plane;
        self
    }

    /// Sets `--control-interval-ms` (`None`: the limits file's).
    #[must_use]
    pub fn control_interval_ms(mut self, ms: impl Into<Option<u64>>) -> Self {
        self.control_interval_ms = ms.into();
        self
    }

    /// Appends `sluice serve` arguments.
    #[must_use]
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.control_plane_args
            .extend(args.into_iter().map(Into::into));
        self
    }

    /// Mutual TLS on the gRPC listener, the test client's identity free
    /// to claim any proxy id ([`GrpcTls::Mutual`]).
    #[must_use]
    pub fn mutual_tls(mut self) -> Self {
        self.grpc_tls = GrpcTls::Mutual;
        self
    }

    /// Sets the gRPC listener's TLS.
    #[must_use]
    pub fn grpc_tls(mut self, tls: GrpcTls) -> Self {
        self.grpc_tls = tls;
        self
    }

    /// Serves `yaml` as the quota file `name` (`--quotas`).
    #[must_use]
    pub fn quota_file(mut self, name: &str, yaml: &str) -> Self {
        self.quota_files.push((name.to_owned(), yaml.to_owned()));
        self
    }

    /// Sets the Envoys' proxy ids, by index.
    #[must_use]
    pub fn proxy_ids(mut self, ids: &[&str]) -> Self {
        self.proxy_ids = ids.iter().map(|id| (*id).to_owned()).collect();
        self
    }

    /// Sets more filter keys for every Envoy.
    #[must_use]
    pub fn filter(mut self, keys: serde_json::Value) -> Self {
        self.filter = keys;
        self
    }

    /// Sets every Envoy's worker threads.
    #[must_use]
    pub fn concurrency(mut self, workers: u32) -> Self {
        self.concurrency = workers;
        self
    }

    /// One control interval (the default's when the options keep the
    /// limits file's).
    pub fn control_interval(&self) -> Duration {
        Duration::from_millis(
            self.control_interval_ms
                .unwrap_or(DEFAULT_CONTROL_INTERVAL_MS),
        )
    }

    /// The Envoy `index` of this fleet: `envoy-<letter>` on the demo
    /// config of its index (or `demo-mtls.yaml` under mutual TLS, with
    /// `certs`), its proxy id, the report interval, the filter keys, the
    /// upstream and the worker threads.
    pub fn envoy(&self, index: usize, certs: Option<&crate::certs::DevCerts>) -> EnvoySpec {
        let letter = char::from(b'a' + u8::try_from(index % 26).unwrap_or(0));
        let name = format!("envoy-{letter}");
        let spec = match certs {
            Some(certs) => EnvoySpec::mutual_tls(&name, certs, true),
            None => EnvoySpec::repo(&name, self.data_plane.demo_config(index))
                .data_plane(self.data_plane),
        };
        let proxy_id = self
            .proxy_ids
            .get(index)
            .cloned()
            .unwrap_or_else(|| format!("test-{letter}"));
        let mut spec = spec
            .proxy_id(&proxy_id)
            .filter(json!({ "report_interval_ms": self.report_interval_ms }))
            .filter(self.filter.clone())
            .concurrency(self.concurrency);
        if let Some(upstream) = self.upstream {
            spec = spec.upstream(upstream);
        }
        spec
    }
}
