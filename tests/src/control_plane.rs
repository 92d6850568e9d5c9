//! The control plane under test: `sluice serve` as a child process, and a
//! small client for its admin API.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::paths;
use crate::process::ChildGuard;

/// How long `sluice serve` gets to write its ready file.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// How to start `sluice serve`.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// The limits file.
    pub limits: Limits,
    /// `--control-interval-ms`; `None` keeps the file's value.
    pub control_interval_ms: Option<u64>,
    /// gRPC listen address; port 0 picks a free port.
    pub grpc_listen: SocketAddr,
    /// Admin listen address; port 0 picks a free port.
    pub admin_listen: SocketAddr,
    /// Directory for the limits file, the ready file and the log.
    pub work_dir: PathBuf,
    /// Name used for the log file and in messages.
    pub name: String,
    /// More `sluice serve` arguments (e.g. TLS files).
    pub extra_args: Vec<String>,
    /// `RUST_LOG` for the process; `None`: the environment's, else `info`.
    pub log_level: Option<String>,
}

impl ControlPlaneOptions {
    /// Ephemeral ports on loopback, files under `work_dir`.
    pub fn new(limits_yaml: &str, work_dir: &Path) -> Self {
        Self {
            limits: Limits::Yaml(limits_yaml.to_owned()),
            control_interval_ms: None,
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            work_dir: work_dir.to_path_buf(),
            name: "sluice".to_owned(),
            extra_args: Vec::new(),
            log_level: None,
        }
    }

    /// Names the process (its log, ready and limits files).
    #[must_use]
    pub fn named(mut self, name: &str) -> Self {
        name.clone_into(&mut self.name);
        self
    }

    /// Sets the process's `RUST_LOG` (benchmarks log at `warn`, so that
    /// logging costs no CPU they measure).
    #[must_use]
    pub fn log_level(mut self, level: &str) -> Self {
        self.log_level = Some(level.to_owned());
        self
    }

    /// Uses an existing limits file instead of writing one.
    #[must_use]
    pub fn limits_file(mut self, path: &Path) -> Self {
        self.limits = Limits::File(path.to_path_buf());
        self
    }

    /// Sets fixed listen addresses instead of ephemeral ports.
    #[must_use]
    pub fn listen(mut self, grpc: SocketAddr, admin: SocketAddr) -> Self {
        self.grpc_listen = grpc;
        self.admin_listen = admin;
        self
    }

    /// Appends `sluice serve` arguments.
    #[must_use]
    pub fn args(mut self, args: impl IntoIterator<Item = String>) -> Self {
        self.extra_args.extend(args);
        self
    }

    /// Sets `--control-interval-ms`.
    #[must_use]
    pub fn control_interval_ms(mut self, ms: u64) -> Self {
        self.control_interval_ms = Some(ms);
        self
    }
}

/// Where the limits come from.
#[derive(Debug, Clone)]
pub enum Limits {
    /// YAML written to `<work_dir>/<name>-limits.yaml`.
    Yaml(String),
    /// An existing file, passed as is.
    File(PathBuf),
}

/// The addresses `sluice serve` writes to its ready file.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub struct ReadyFile {
    /// Bound gRPC address.
    pub grpc: SocketAddr,
    /// Bound admin address.
    pub admin: SocketAddr,
    /// The rate limit service's own address (`--rls-listen`), if any.
    #[serde(default)]
    pub rls: Option<SocketAddr>,
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    guard: ChildGuard,
    options: ControlPlaneOptions,
    addrs: ReadyFile,
    admin: AdminClient,
    starts: u32,
}

impl ControlPlane {
    /// Writes the limits file, starts `sluice serve` with a ready file and waits for it.
    pub async fn start(options: ControlPlaneOptions) -> Result<Self> {
        let (guard, addrs) = spawn(&options, 1).await?;
        Ok(Self {
            guard,
            admin: AdminClient::new(addrs.admin)?,
            options,
            addrs,
            starts: 1,
        })
    }

    /// The bound gRPC address (what Envoy's `sluice_control_plane` cluster points at).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.addrs.grpc
    }

    /// Where the rate limit service is served: its own listener
    /// (`--rls-listen`) if it has one, else the gRPC listener.
    pub fn rls_addr(&self) -> SocketAddr {
        self.addrs.rls.unwrap_or(self.addrs.grpc)
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.addrs.admin
    }

    /// A client for the admin API of the current process.
    pub fn admin(&self) -> &AdminClient {
        &self.admin
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.guard.is_running()
    }

    /// Kills the process with SIGKILL (a crash, as far as Envoy can tell).
    pub fn kill(&mut self) -> Result<()> {
        self.guard.kill().map(drop)
    }

    /// The process id (for CPU accounting in benchmarks).
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Stops the process with SIGTERM (graceful shutdown) and checks it exited 0.
    pub fn shutdown(&mut self) -> Result<()> {
        let status = self.guard.terminate()?;
        if !status.success() {
            bail!("{}: exited with {status} after SIGTERM", self.guard.name());
        }
        Ok(())
    }

    /// Stops the current process (if running) and starts a new one on the same
    /// gRPC port (the admin port is picked anew), with the same limits file.
    pub async fn restart(&mut self) -> Result<()> {
        self.guard.kill()?;
        let mut options = self.options.clone();
        options.grpc_listen = self.addrs.grpc;
        self.starts += 1;
        let (guard, addrs) = spawn(&options, self.starts).await?;
        if addrs.grpc != self.addrs.grpc {
            bail!(
                "restarted control plane bound {} instead of {}",
                addrs.grpc,
                self.addrs.grpc
            );
        }
        // Replacing the guard drops (and stops) the old, already dead process.
        self.guard = guard;
        self.admin = AdminClient::new(addrs.admin)?;
        self.addrs = addrs;
        Ok(())
    }

    /// Prints the log tail of the current process.
    pub fn print_log(&self) {
        self.guard.print_log();
    }

    /// The current process's log file.
    pub fn log_path(&self) -> &Path {
        self.guard.log_path()
    }

    /// The limits file it reads (and reloads).
    pub fn limits_path(&self) -> PathBuf {
        limits_path(&self.options)
    }
}

/// Where the limits file of `options` is.
fn limits_path(options: &ControlPlaneOptions) -> PathBuf {
    match &options.limits {
        Limits::File(path) => path.clone(),
        Limits::Yaml(_) => options
            .work_dir
            .join(format!("{}-limits.yaml", options.name)),
    }
}

async fn spawn(options: &ControlPlaneOptions, start: u32) -> Result<(ChildGuard, ReadyFile)> {
    let name = if start == 1 {
        options.name.clone()
    } else {
        format!("{}#{start}", options.name)
    };
    std::fs::create_dir_all(&options.work_dir)
        .with_context(|| format!("cannot create {}", options.work_dir.display()))?;
    let limits = limits_path(options);
    if let Limits::Yaml(yaml) = &options.limits {
        std::fs::write(&limits, yaml)
            .with_context(|| format!("cannot write {}", limits.display()))?;
    }
    let ready = options.work_dir.join(format!("{name}.ready.json"));
    match std::fs::remove_file(&ready) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("cannot remove {}", ready.display())),
    }
    let mut command = Command::new(paths::sluice_bin()?);
    command
        .arg("serve")
        .arg("--config")
        .arg(&limits)
        .arg("--grpc-listen")
        .arg(options.grpc_listen.to_string())
        .arg("--admin-listen")
        .arg(options.admin_listen.to_string())
        .arg("--ready-file")
        .arg(&ready)
        .env(
            "RUST_LOG",
            options
                .log_level
                .clone()
                .unwrap_or_else(|| std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned())),
        );
    if let Some(ms) = options.control_interval_ms {
        command.arg("--control-interval-ms").arg(ms.to_string());
    }
    command.args(&options.extra_args);
    let log = options.work_dir.join(format!("{name}.log"));
    let mut guard = ChildGuard::spawn(&name, command, &log)?;
    let addrs = wait_ready(&mut guard, &ready).await;
    match addrs {
        Ok(addrs) => Ok((guard, addrs)),
        Err(err) => {
            guard.print_log();
            Err(err)
        }
    }
}

async fn wait_ready(guard: &mut ChildGuard, ready: &Path) -> Result<ReadyFile> {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        match std::fs::read_to_string(ready) {
            Ok(text) => return parse_ready(&text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(err).with_context(|| format!("cannot read {}", ready.display()));
            }
        }
        if let Some(status) = guard.try_exit_status()? {
            bail!("{} exited with {status} before it was ready", guard.name());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "{} did not write {} within {READY_TIMEOUT:?}",
                guard.name(),
                ready.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Parses the ready file's JSON.
pub fn parse_ready(text: &str) -> Result<ReadyFile> {
    serde_json::from_str(text).with_context(|| format!("bad ready file: {text:?}"))
}

/// `GET /v1/buckets`.
#[derive(Debug, Clone, Deserialize)]
pub struct BucketsReply {
    /// The control plane's random per-process epoch.
    pub epoch: u64,
    /// Its control interval.
    pub control_interval_ms: u64,
    /// One entry per known bucket, sorted by name.
    pub buckets: Vec<BucketStatus>,
}

impl BucketsReply {
    /// The entry for `bucket`, if the control plane knows it.
    pub fn bucket(&self, bucket: &str) -> Option<&BucketStatus> {
        self.buckets.iter().find(|b| b.bucket == bucket)
    }
}

/// One bucket in `GET /v1/buckets`.
#[derive(Debug, Clone, Deserialize)]
pub struct BucketStatus {
    /// Bucket key.
    pub bucket: String,
    /// Effective limit; `None` = unlimited.
    pub limit_rps: Option<f64>,
    /// Fleet offered rate estimate.
    pub offered_rps: f64,
    /// Fleet admitted rate as reported.
    pub admitted_rps: f64,
    /// The drop ratio the control plane pushes.
    pub drop_ratio: f64,
    /// How many proxies contributed to the estimate.
    pub proxies_reporting: u32,
    /// The cap on one proxy's share, when one applies.
    #[serde(default)]
    pub proxy_cap: Option<ProxyCap>,
    /// The bucket's cost, when its limit is a budget or its proxies count
    /// cost (then the rates above are in the cost unit per second).
    #[serde(default)]
    pub cost: Option<BucketCost>,
    /// Per (tenant, priority) cell.
    #[serde(default)]
    pub cells: Vec<CellStatus>,
}

/// One cell of a bucket in `GET /v1/buckets`.
#[derive(Debug, Clone, Deserialize)]
pub struct CellStatus {
    /// Tenant; empty when the filter derives none.
    pub tenant: String,
    /// The cell's fair share; `None` when the bucket is unlimited.
    #[serde(default)]
    pub share_rps: Option<f64>,
    /// The drop ratio pushed to proxies.
    pub drop_ratio: f64,
    /// A budget cell's balance in the budget's unit; `None` otherwise.
    #[serde(default)]
    pub balance: Option<f64>,
}

/// A bucket's cost in `GET /v1/buckets`.
#[derive(Debug, Clone, Deserialize)]
pub struct BucketCost {
    /// Estimated cost offered per second, fleet-wide.
    pub offered_per_s: f64,
    /// Estimated cost admitted per second.
    pub admitted_per_s: f64,
    /// Actual cost charged per second at stream ends.
    pub charged_per_s: f64,
    /// Charged over admitted estimate, when something was admitted.
    #[serde(default)]
    pub charged_to_estimate: Option<f64>,
    /// Under a budget, the charged cost per unit of admitted estimate the
    /// controller holds the budget by.
    #[serde(default)]
    pub charge_factor: Option<f64>,
    /// Requests offered per second, fleet-wide.
    #[serde(default)]
    pub offered_requests_rps: f64,
    /// Under a budget, cells whose proxies offer requests but no cost.
    #[serde(default)]
    pub cells_without_cost: u32,
}

/// `proxy_cap` of a bucket in `GET /v1/buckets`.
#[derive(Debug, Clone, Deserialize)]
pub struct ProxyCap {
    /// Most one proxy's offered rate counts for.
    pub cap_rps: f64,
    /// Proxies whose claim was cut.
    pub capped: Vec<CappedProxy>,
}

/// One proxy a bucket's cap cut.
#[derive(Debug, Clone, Deserialize)]
pub struct CappedProxy {
    /// The proxy.
    pub proxy_id: String,
    /// What it reported.
    pub claimed_rps: f64,
    /// What of it counted (0: ignored).
    pub counted_rps: f64,
}

/// `GET /v1/proxies`.
#[derive(Debug, Clone, Deserialize)]
pub struct ProxiesReply {
    /// Proxies with an open stream.
    pub connected: usize,
    /// Every tracked proxy, sorted by id.
    pub proxies: Vec<ProxyStatus>,
}

/// One proxy in `GET /v1/proxies`.
#[derive(Debug, Clone, Deserialize)]
pub struct ProxyStatus {
    /// Proxy id from its Hello.
    pub proxy_id: String,
    /// Zone from its Hello.
    pub zone: String,
    /// Whether its stream is open.
    pub connected: bool,
    /// Time since its last report.
    pub since_last_report_ms: u64,
    /// Age of the directives it enforces as of its last report; `None`
    /// until a report names one.
    pub directive_age_ms: Option<u64>,
    /// Instance id from its latest Hello.
    pub instance_id: u64,
    /// Whether another live instance says Hello with the same proxy id
    /// (absent before the field existed: false).
    #[serde(default)]
    pub conflict: bool,
    /// Whether it has passed its probation (absent before the field
    /// existed: true).
    #[serde(default = "established_by_default")]
    pub established: bool,
}

fn established_by_default() -> bool {
    true
}

/// A client for the admin API.
#[derive(Debug, Clone)]
pub struct AdminClient {
    base: String,
    http: reqwest::Client,
}

impl AdminClient {
    /// A client for the admin API at `addr`.
    pub fn new(addr: SocketAddr) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .context("cannot build the admin HTTP client")?;
        Ok(Self {
            base: format!("http://{addr}"),
            http,
        })
    }

    /// `GET /metrics`, the exposition text.
    pub async fn metrics(&self) -> Result<String> {
        let url = format!("{}/metrics", self.base);
        let response = self.http.get(&url).send().await.context("GET /metrics")?;
        response.text().await.context("GET /metrics body")
    }

    /// `GET /healthz` answered 200.
    pub async fn healthy(&self) -> Result<bool> {
        let response = self
            .http
            .get(format!("{}/healthz", self.base))
            .send()
            .await?;
        Ok(response.status().is_success())
    }

    /// `GET /v1/buckets`.
    pub async fn buckets(&self) -> Result<BucketsReply> {
        self.get_json("/v1/buckets").await
    }

    /// `GET /v1/proxies`.
    pub async fn proxies(&self) -> Result<ProxiesReply> {
        self.get_json("/v1/proxies").await
    }

    /// Polls `GET /v1/buckets` every `every` until `bucket` is listed and
    /// `check` returns a value for it; fails after `timeout`, naming `what`.
    pub async fn wait_for_bucket<T>(
        &self,
        bucket: &str,
        what: &str,
        timeout: Duration,
        every: Duration,
        check: impl Fn(&BucketStatus) -> Option<T>,
    ) -> Result<T> {
        crate::wait::until(what, timeout, every, || async {
            let buckets = self.buckets().await?;
            Ok(buckets.bucket(bucket).and_then(&check))
        })
        .await
    }

    /// Polls `GET /v1/buckets` until `proxies` proxies report `bucket` and
    /// it is admitted within `tolerance` (a fraction) of `limit_rps`: the
    /// fleet has converged on the limit. Fails after `timeout`.
    pub async fn wait_for_convergence(
        &self,
        bucket: &str,
        limit_rps: f64,
        tolerance: f64,
        proxies: u32,
        timeout: Duration,
    ) -> Result<BucketStatus> {
        let what = format!(
            "{proxies} proxies to report {bucket} admitted at {limit_rps} rps ± {:.0} %",
            tolerance * 100.0
        );
        self.wait_for_bucket(bucket, &what, timeout, Duration::from_millis(100), |b| {
            (b.proxies_reporting == proxies
                && crate::load::within(b.admitted_rps, limit_rps, tolerance))
            .then(|| b.clone())
        })
        .await
    }

    /// `GET /v1/quotas/{domain}?KEY=VALUE&…`: where the descriptor
    /// `entries` stands (`used`, `remaining`, …), counting nothing.
    pub async fn quota(&self, domain: &str, entries: &[(&str, &str)]) -> Result<serde_json::Value> {
        let url =
            reqwest::Url::parse_with_params(&format!("{}/v1/quotas/{domain}", self.base), entries)
                .with_context(|| format!("a quota read of {domain} {entries:?}"))?;
        let url = url.to_string();
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let response = check(response, &url).await?;
        response
            .json()
            .await
            .with_context(|| format!("GET {url}: bad JSON"))
    }

    /// The `used` of [`Self::quota`]: the descriptor's count now.
    pub async fn quota_used(&self, domain: &str, entries: &[(&str, &str)]) -> Result<u64> {
        let read = self.quota(domain, entries).await?;
        read.get("used")
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("no `used` in {read}"))
    }

    /// `GET /v1/adaptive`: every adaptive bucket's limit and why it moved.
    pub async fn adaptive(&self) -> Result<serde_json::Value> {
        self.get_json("/v1/adaptive").await
    }

    /// `GET path`, checked and decoded.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        let url = format!("{}{path}", self.base);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let response = check(response, &url).await?;
        response
            .json()
            .await
            .with_context(|| format!("GET {url}: bad JSON"))
    }

    /// `PUT /v1/limits/{bucket}` with `{"limit_rps": limit_rps}`.
    pub async fn put_limit(&self, bucket: &str, limit_rps: f64) -> Result<()> {
        let url = format!("{}/v1/limits/{bucket}", self.base);
        let response = self
            .http
            .put(&url)
            .json(&serde_json::json!({ "limit_rps": limit_rps }))
            .send()
            .await
            .with_context(|| format!("PUT {url}"))?;
        check(response, &url).await.map(drop)
    }

    /// Any admin request with an optional JSON body; fails on a non-2xx
    /// answer.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<()> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        check(response, &url).await.map(drop)
    }

    /// `DELETE /v1/limits/{bucket}`.
    pub async fn delete_limit(&self, bucket: &str) -> Result<()> {
        let url = format!("{}/v1/limits/{bucket}", self.base);
        let response = self
            .http
            .delete(&url)
            .send()
            .await
            .with_context(|| format!("DELETE {url}"))?;
        check(response, &url).await.map(drop)
    }
}

async fn check(response: reqwest::Response, url: &str) -> Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    bail!("{url}: HTTP {status}: {body}")
}

/// The value of the sample `series` (name and labels as exposed, labels in
/// any order) in a `/metrics` exposition; 0 when absent.
pub fn sample(exposition: &str, series: &str) -> f64 {
    crate::prometheus::Exposition::parse(exposition)
        .ok()
        .and_then(|page| page.series(series))
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_ready_file() {
        let ready = parse_ready(r#"{"grpc":"127.0.0.1:50051","admin":"127.0.0.1:8080"}"#).unwrap();
        assert_eq!(ready.grpc, SocketAddr::from(([127, 0, 0, 1], 50051)));
        assert_eq!(ready.admin.port(), 8080);
        assert_eq!(ready.rls, None);
        assert!(parse_ready("{").is_err());
        let ready =
            parse_ready(r#"{"grpc":"127.0.0.1:1","admin":"127.0.0.1:2","rls":"127.0.0.1:3"}"#)
                .unwrap();
        assert_eq!(ready.rls, Some(SocketAddr::from(([127, 0, 0, 1], 3))));
    }

    #[test]
    fn parses_the_buckets_reply() {
        let reply: BucketsReply = serde_json::from_str(
            r#"{"epoch":7,"control_interval_ms":200,"buckets":[
                {"bucket":"acme","limit_rps":200.0,"offered_rps":600.0,"admitted_rps":200.0,"drop_ratio":0.6667,"proxies_reporting":2},
                {"bucket":"free","limit_rps":null,"offered_rps":10.0,"admitted_rps":10.0,"drop_ratio":0.0,"proxies_reporting":1}]}"#,
        )
        .unwrap();
        assert_eq!(reply.bucket("acme").unwrap().limit_rps, Some(200.0));
        assert_eq!(reply.bucket("free").unwrap().limit_rps, None);
        assert!(reply.bucket("nope").is_none());
    }
}
