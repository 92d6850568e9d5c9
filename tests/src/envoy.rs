//! Envoy under test: config rewriting, start-up with readiness checks, and
//! `envoy --mode validate`.
//!
//! Tests start from the real `envoy/*.yaml` files, so the configs a newcomer
//! runs are the configs the tests exercise. [`rewrite`] makes one safe to run
//! beside others: ephemeral ports, the control plane's real port, an absolute
//! `.wasm` path, and patched plugin settings (e.g. a shorter report interval).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Map as JsonMap;
use serde_json::Value as Json;
use serde_yaml_ng::{Mapping, Value};

use crate::paths;
use crate::process::ChildGuard;

/// The cluster the filter streams to, as the demo configs and README name it.
pub const CONTROL_PLANE_CLUSTER: &str = "sluice_control_plane";
/// How long Envoy gets to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `envoy --mode validate` may take.
const VALIDATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads a YAML config.
pub fn load_config(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not valid YAML", path.display()))
}

/// Reads `envoy/<file_name>` from the workspace.
pub fn load_repo_config(file_name: &str) -> Result<Value> {
    load_config(&paths::envoy_config_dir()?.join(file_name))
}

/// What [`rewrite`] changes.
#[derive(Debug, Clone, Default)]
pub struct Rewrite {
    /// Set admin and listener ports to 0 (the OS picks free ones).
    pub ephemeral_ports: bool,
    /// Point the `sluice_control_plane` cluster at this address.
    pub control_plane: Option<SocketAddr>,
    /// Make the `sluice_control_plane` cluster's endpoints these replicas,
    /// in order (copies of its first endpoint, as many as there are).
    pub control_plane_replicas: Vec<SocketAddr>,
    /// Replace every wasm `vm_config.code.local.filename` with this path.
    pub wasm: Option<PathBuf>,
    /// Fields set (top-level, replacing) in every wasm plugin's JSON configuration,
    /// and in every Sluice dynamic module's `filter_config`.
    pub plugin_patch: JsonMap<String, Json>,
}

impl Rewrite {
    /// Everything a test needs: ephemeral ports, the control plane, the built `.wasm`
    /// (from `SLUICE_WASM`) and `plugin_patch` (a JSON object).
    pub fn for_test(control_plane: SocketAddr, plugin_patch: Json) -> Result<Self> {
        let Json::Object(plugin_patch) = plugin_patch else {
            bail!("plugin_patch must be a JSON object, got {plugin_patch}");
        };
        Ok(Self {
            ephemeral_ports: true,
            control_plane: Some(control_plane),
            control_plane_replicas: Vec::new(),
            wasm: Some(paths::sluice_wasm()?),
            plugin_patch,
        })
    }
}

impl Rewrite {
    /// As [`Rewrite::for_test`], for a config with the native module instead
    /// of the wasm filter (the module is found through
    /// `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`, see [`Envoy::start`]).
    pub fn for_native(control_plane: SocketAddr, plugin_patch: Json) -> Result<Self> {
        paths::native_module()?;
        let Json::Object(plugin_patch) = plugin_patch else {
            bail!("plugin_patch must be a JSON object, got {plugin_patch}");
        };
        Ok(Self {
            ephemeral_ports: true,
            control_plane: Some(control_plane),
            control_plane_replicas: Vec::new(),
            wasm: None,
            plugin_patch,
        })
    }
}

/// What [`rewrite`] found and changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RewriteReport {
    /// Listener ports set to 0.
    pub listeners: usize,
    /// Endpoints of `sluice_control_plane` repointed.
    pub control_plane_endpoints: usize,
    /// Wasm plugin configs seen (code path and/or configuration patched).
    pub wasm_plugins: usize,
    /// Dynamic-module filters seen (their JSON configuration patched).
    pub native_modules: usize,
}

/// Rewrites `config` in place. Fails if a requested change has nothing to apply to
/// (e.g. a control-plane address but no `sluice_control_plane` endpoint).
pub fn rewrite(config: &mut Value, rw: &Rewrite) -> Result<RewriteReport> {
    let mut report = RewriteReport::default();
    if rw.ephemeral_ports {
        let admin_port = config
            .get_mut("admin")
            .and_then(|admin| admin.get_mut("address"))
            .and_then(socket_address_mut)
            .context("config has no admin.address.socket_address")?;
        admin_port.insert("port_value".into(), 0.into());
        for listener in seq_mut(config, &["static_resources", "listeners"]) {
            if let Some(socket) = listener.get_mut("address").and_then(socket_address_mut) {
                socket.insert("port_value".into(), 0.into());
                report.listeners += 1;
            }
        }
        if report.listeners == 0 {
            bail!("config has no static listener with a socket address");
        }
    }
    if !rw.control_plane_replicas.is_empty() || rw.control_plane.is_some() {
        for cluster in seq_mut(config, &["static_resources", "clusters"]) {
            if cluster.get("name").and_then(Value::as_str) != Some(CONTROL_PLANE_CLUSTER) {
                continue;
            }
            let Some(assignment) = cluster.get_mut("load_assignment") else {
                continue;
            };
            for endpoints in seq_mut(assignment, &["endpoints"]) {
                if !rw.control_plane_replicas.is_empty() {
                    // One endpoint per replica, each a copy of the first.
                    let lbs = endpoints
                        .get_mut("lb_endpoints")
                        .and_then(Value::as_sequence_mut);
                    if let Some(lbs) = lbs
                        && let Some(template) = lbs.first().cloned()
                    {
                        *lbs = vec![template; rw.control_plane_replicas.len()];
                    }
                }
                let mut replicas = rw.control_plane_replicas.iter();
                for lb in seq_mut(endpoints, &["lb_endpoints"]) {
                    let socket = lb
                        .get_mut("endpoint")
                        .and_then(|e| e.get_mut("address"))
                        .and_then(socket_address_mut);
                    let addr = match rw.control_plane {
                        Some(addr) if rw.control_plane_replicas.is_empty() => Some(addr),
                        _ => replicas.next().copied(),
                    };
                    if let (Some(socket), Some(addr)) = (socket, addr) {
                        socket.insert("address".into(), addr.ip().to_string().into());
                        socket.insert("port_value".into(), u64::from(addr.port()).into());
                        report.control_plane_endpoints += 1;
                    }
                }
            }
        }
    }
    // One pass over the config: wasm plugins (`vm_config`) and Sluice
    // dynamic modules (`dynamic_module_config`) are patched alike.
    let mut failure: Option<anyhow::Error> = None;
    visit_mappings(config, &mut |mapping| {
        if failure.is_some() {
            return;
        }
        let patched = if mapping.contains_key("vm_config") {
            report.wasm_plugins += 1;
            patch_plugin(mapping, rw)
        } else if mapping.contains_key("dynamic_module_config") {
            report.native_modules += 1;
            patch_native_module(mapping, rw)
        } else {
            return;
        };
        if let Err(err) = patched {
            failure = Some(err);
        }
    });
    if let Some(err) = failure {
        return Err(err);
    }
    if rw.control_plane.is_some()
        && report.control_plane_endpoints == 0
        && report.native_modules == 0
    {
        bail!("config has no endpoint in cluster {CONTROL_PLANE_CLUSTER} and no dynamic module");
    }
    let plugins = report.wasm_plugins + report.native_modules;
    if (rw.wasm.is_some() || !rw.plugin_patch.is_empty()) && plugins == 0 {
        bail!("config has no wasm plugin (no `vm_config`) and no dynamic module");
    }
    Ok(report)
}

/// Patches one `DynamicModuleFilter` (the mapping holding
/// `dynamic_module_config`): the control plane's address and `plugin_patch`.
fn patch_native_module(filter: &mut Mapping, rw: &Rewrite) -> Result<()> {
    let value = filter
        .get_mut("filter_config")
        .and_then(|c| c.get_mut("value"))
        .context("dynamic module filter has no filter_config.value to patch")?;
    let text = value
        .as_str()
        .context("filter_config.value is not a string")?;
    let mut patch = rw.plugin_patch.clone();
    // A `control_plane_uri` in the patch itself wins (tests of bad values).
    if let Some(addr) = rw.control_plane {
        patch
            .entry("control_plane_uri")
            .or_insert_with(|| format!("http://{addr}").into());
    }
    *value = Value::String(patch_json_object(text, &patch)?);
    Ok(())
}

/// Patches one wasm `PluginConfig` mapping (the one holding `vm_config`).
fn patch_plugin(plugin: &mut Mapping, rw: &Rewrite) -> Result<()> {
    if let Some(wasm) = &rw.wasm {
        let local = plugin
            .get_mut("vm_config")
            .and_then(|vm| vm.get_mut("code"))
            .and_then(|code| code.get_mut("local"))
            .and_then(Value::as_mapping_mut)
            .context("wasm plugin has no vm_config.code.local")?;
        local.insert("filename".into(), wasm.display().to_string().into());
    }
    if !rw.plugin_patch.is_empty() {
        let value = plugin
            .get_mut("configuration")
            .and_then(|c| c.get_mut("value"))
            .context("wasm plugin has no configuration.value to patch")?;
        let text = value
            .as_str()
            .context("configuration.value is not a string")?;
        let patched = patch_json_object(text, &rw.plugin_patch)?;
        *value = Value::String(patched);
    }
    Ok(())
}

/// Sets top-level fields of the JSON object in `text`.
pub fn patch_json_object(text: &str, patch: &JsonMap<String, Json>) -> Result<String> {
    let mut json: Json = serde_json::from_str(text)
        .with_context(|| format!("plugin configuration is not JSON: {text}"))?;
    let object = json
        .as_object_mut()
        .context("plugin configuration is not a JSON object")?;
    for (key, value) in patch {
        object.insert(key.clone(), value.clone());
    }
    serde_json::to_string(&json).context("cannot serialize the plugin configuration")
}

/// The plugin JSON configurations of every wasm filter in `config`, parsed.
pub fn plugin_configurations(config: &Value) -> Result<Vec<Json>> {
    let mut found = Vec::new();
    let mut clone = config.clone();
    visit_mappings(&mut clone, &mut |mapping| {
        if mapping.contains_key("vm_config")
            && let Some(text) = mapping
                .get("configuration")
                .and_then(|c| c.get("value"))
                .and_then(Value::as_str)
        {
            found.push(serde_json::from_str::<Json>(text).map_err(anyhow::Error::from));
        }
    });
    found.into_iter().collect()
}

fn socket_address_mut(address: &mut Value) -> Option<&mut Mapping> {
    address
        .get_mut("socket_address")
        .and_then(Value::as_mapping_mut)
}

/// The items of the sequence at `path` below `value` (empty if absent).
fn seq_mut<'a>(value: &'a mut Value, path: &[&str]) -> impl Iterator<Item = &'a mut Value> {
    let mut current = Some(value);
    for key in path {
        current = current.and_then(|v| v.get_mut(*key));
    }
    current
        .and_then(Value::as_sequence_mut)
        .into_iter()
        .flat_map(|seq| seq.iter_mut())
}

/// Calls `f` on every mapping in `value`, depth first.
pub fn visit_mappings(value: &mut Value, f: &mut dyn FnMut(&mut Mapping)) {
    match value {
        Value::Mapping(mapping) => {
            f(mapping);
            for (_, child) in mapping.iter_mut() {
                visit_mappings(child, f);
            }
        }
        Value::Sequence(seq) => {
            for child in seq {
                visit_mappings(child, f);
            }
        }
        Value::Tagged(tagged) => visit_mappings(&mut tagged.value, f),
        _ => {}
    }
}

/// Points every endpoint of the static cluster `name` at `addr` (a
/// config's own upstream, such as `llm` in `envoy/llm-budget.yaml`).
pub fn point_cluster(config: &mut Value, name: &str, addr: SocketAddr) -> Result<()> {
    let mut endpoints = 0;
    for cluster in seq_mut(config, &["static_resources", "clusters"]) {
        if cluster.get("name").and_then(Value::as_str) != Some(name) {
            continue;
        }
        let Some(assignment) = cluster.get_mut("load_assignment") else {
            continue;
        };
        for locality in seq_mut(assignment, &["endpoints"]) {
            for lb in seq_mut(locality, &["lb_endpoints"]) {
                let socket = lb
                    .get_mut("endpoint")
                    .and_then(|e| e.get_mut("address"))
                    .and_then(socket_address_mut);
                if let Some(socket) = socket {
                    socket.insert("address".into(), addr.ip().to_string().into());
                    socket.insert("port_value".into(), u64::from(addr.port()).into());
                    endpoints += 1;
                }
            }
        }
    }
    if endpoints == 0 {
        bail!("no static cluster {name} with an endpoint to point at {addr}");
    }
    Ok(())
}

/// The cluster [`route_to_upstream`] adds.
pub const TEST_UPSTREAM_CLUSTER: &str = "sluice_test_upstream";

/// Replaces every route's `direct_response` with a route to `upstream` (a
/// STATIC cluster added under [`TEST_UPSTREAM_CLUSTER`]), so requests the
/// filter admits reach a real server; returns the routes changed.
pub fn route_to_upstream(config: &mut Value, upstream: SocketAddr) -> Result<usize> {
    let mut routes = 0;
    visit_mappings(config, &mut |mapping| {
        if mapping.remove("direct_response").is_some() {
            let mut route = Mapping::new();
            route.insert("cluster".into(), TEST_UPSTREAM_CLUSTER.into());
            route.insert("timeout".into(), "5s".into());
            mapping.insert("route".into(), Value::Mapping(route));
            routes += 1;
        }
    });
    if routes == 0 {
        bail!("no direct_response route to point at the upstream");
    }
    let cluster: Value = serde_yaml_ng::from_str(&format!(
        "name: {TEST_UPSTREAM_CLUSTER}\ntype: STATIC\nconnect_timeout: 0.25s\n\
         load_assignment:\n  cluster_name: {TEST_UPSTREAM_CLUSTER}\n  endpoints:\n  - lb_endpoints:\n    \
         - endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}\n",
        upstream.ip(),
        upstream.port()
    ))
    .context("the test upstream's cluster")?;
    let resources = config
        .get_mut("static_resources")
        .and_then(Value::as_mapping_mut)
        .context("the config has no static_resources")?;
    // The native module's config has no cluster at all (the module dials
    // the control plane itself).
    let clusters = resources
        .entry("clusters".into())
        .or_insert_with(|| Value::Sequence(Vec::new()))
        .as_sequence_mut()
        .context("static_resources.clusters is not a list")?;
    clusters.push(cluster);
    Ok(routes)
}

/// Writes `config` as YAML to `path`.
pub fn write_config(config: &Value, path: &Path) -> Result<()> {
    let text = serde_yaml_ng::to_string(config).context("cannot serialize the Envoy config")?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Where Envoy looks for a dynamic module named in a config.
const MODULE_SEARCH_PATH: &str = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH";

/// The directory of the built native module, when there is one: configs
/// that name the module `sluice_native` find it there.
fn native_module_dir() -> Option<PathBuf> {
    paths::native_module()
        .ok()
        .and_then(|module| module.parent().map(Path::to_path_buf))
}

/// Runs `envoy --mode validate` on `config` (written to a temp file).
pub async fn validate(config: &Value) -> Result<()> {
    let dir = tempfile::tempdir().context("cannot create a temp dir")?;
    let path = dir.path().join("envoy.yaml");
    write_config(config, &path)?;
    let mut command = tokio::process::Command::new(paths::envoy_bin()?);
    command
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(&path)
        .arg("--disable-hot-restart")
        .arg("-l")
        .arg("warn")
        .current_dir(paths::workspace_root()?)
        .kill_on_drop(true);
    if let Some(dir) = native_module_dir() {
        command.env(MODULE_SEARCH_PATH, dir);
    }
    let output = tokio::time::timeout(VALIDATE_TIMEOUT, command.output())
        .await
        .context("envoy --mode validate timed out")?
        .context("cannot run envoy --mode validate")?;
    if !output.status.success() {
        bail!(
            "envoy --mode validate failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// How to start Envoy.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// Name for the log file and messages (e.g. `envoy-a`).
    pub name: String,
    /// Where the config copy, the admin address file and the log go.
    pub work_dir: PathBuf,
    /// `--concurrency` (worker threads).
    pub concurrency: u32,
    /// `-l` log level.
    pub log_level: String,
    /// `--file-flush-interval-msec`: how often Envoy writes file access
    /// logs out; `None` keeps Envoy's 10 s.
    pub file_flush_interval: Option<Duration>,
}

impl EnvoyOptions {
    /// Two workers, `info` logs, files under `work_dir`.
    pub fn new(name: &str, work_dir: &Path) -> Self {
        Self {
            name: name.to_owned(),
            work_dir: work_dir.to_path_buf(),
            concurrency: 2,
            log_level: "info".to_owned(),
            file_flush_interval: None,
        }
    }
}

/// A running, ready Envoy.
#[derive(Debug)]
pub struct Envoy {
    guard: ChildGuard,
    admin: SocketAddr,
    listener: SocketAddr,
}

impl Envoy {
    /// Writes `config` to `<work_dir>/<name>.yaml` and starts Envoy on it.
    pub async fn start(config: &Value, options: &EnvoyOptions) -> Result<Self> {
        std::fs::create_dir_all(&options.work_dir)
            .with_context(|| format!("cannot create {}", options.work_dir.display()))?;
        let path = options.work_dir.join(format!("{}.yaml", options.name));
        write_config(config, &path)?;
        Self::start_file(&path, options).await
    }

    /// Starts Envoy on a config file as is (relative paths in it are taken from
    /// the workspace root, Envoy's working directory).
    pub async fn start_file(config_path: &Path, options: &EnvoyOptions) -> Result<Self> {
        std::fs::create_dir_all(&options.work_dir)
            .with_context(|| format!("cannot create {}", options.work_dir.display()))?;
        let admin_file = options
            .work_dir
            .join(format!("{}.admin-address", options.name));
        let _ = std::fs::remove_file(&admin_file);
        let mut command = Command::new(paths::envoy_bin()?);
        command
            .arg("-c")
            .arg(config_path)
            .arg("--disable-hot-restart")
            .arg("--concurrency")
            .arg(options.concurrency.to_string())
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("-l")
            .arg(&options.log_level)
            .current_dir(paths::workspace_root()?);
        if let Some(interval) = options.file_flush_interval {
            command
                .arg("--file-flush-interval-msec")
                .arg(interval.as_millis().to_string());
        }
        if let Some(dir) = native_module_dir() {
            command.env(MODULE_SEARCH_PATH, dir);
        }
        let log = options.work_dir.join(format!("{}.log", options.name));
        let mut guard = ChildGuard::spawn(&options.name, command, &log)?;
        match wait_ready(&mut guard, &admin_file).await {
            Ok((admin, listener)) => Ok(Self {
                guard,
                admin,
                listener,
            }),
            Err(err) => {
                guard.print_log();
                Err(err)
            }
        }
    }

    /// The OS process id (for reading its CPU time or memory from `/proc`).
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// The admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The (first) listener's bound address.
    pub fn listener_addr(&self) -> SocketAddr {
        self.listener
    }

    /// `http://<listener>` without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.listener)
    }

    /// Whether Envoy is still running.
    pub fn is_running(&mut self) -> bool {
        self.guard.is_running()
    }

    /// Prints the log tail.
    pub fn print_log(&self) {
        self.guard.print_log();
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        self.guard.log_path()
    }

    /// SIGTERM, then SIGKILL after the grace period.
    pub fn stop(&mut self) -> Result<()> {
        self.guard.terminate().map(drop)
    }

    /// SIGKILL at once: the process is gone, and so are its connections.
    pub fn kill(&mut self) -> Result<()> {
        self.guard.kill().map(drop)
    }

    /// SIGSTOP: the process holds its connections open but does nothing (a
    /// host that froze or fell off the network, as its peers see it). It
    /// is killed like any other when the test ends.
    pub fn pause(&self) -> Result<()> {
        let pid = i32::try_from(self.guard.pid()).context("pid out of range")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .context("cannot stop Envoy")
    }

    /// The admin `/stats` lines whose names contain `filter` (a regex, as Envoy takes it).
    pub async fn stats(&self, filter: &str) -> Result<String> {
        let url = format!("http://{}/stats?filter={filter}", self.admin);
        let response = reqwest::get(&url)
            .await
            .with_context(|| format!("GET {url}"))?;
        response.text().await.with_context(|| format!("GET {url}"))
    }

    /// `/stats/prometheus`, the filter's families under one name for both
    /// data planes: the native module's carry Envoy's dynamic-module
    /// namespace (`envoy_dynamicmodulescustom_sluice_…`) where the wasm
    /// filter's have none (`sluice_…`); the rest of the name and the labels
    /// are the same, so the namespace is cut.
    pub async fn prometheus(&self) -> Result<String> {
        let url = format!("http://{}/stats/prometheus", self.admin);
        let response = reqwest::get(&url)
            .await
            .with_context(|| format!("GET {url}"))?;
        let page = response
            .text()
            .await
            .with_context(|| format!("GET {url}"))?;
        Ok(page.replace("envoy_dynamicmodulescustom_sluice_", "sluice_"))
    }

    /// The sum of the filter's decision counters for `result` (`pass`,
    /// `drop`, `shadow_drop`, …) over every reason.
    pub async fn decisions(&self, result: &str) -> Result<u64> {
        let text = self.stats("sluice.result=").await?;
        Ok(decisions_in(&text, result))
    }

    /// Polls the filter's counters until it has decided at least one
    /// request with `result` (its directives have arrived and decide);
    /// fails after `timeout`.
    pub async fn wait_for_decision(&self, result: &str, timeout: Duration) -> Result<()> {
        crate::wait::until(
            &format!("the filter to decide a request with result {result}"),
            timeout,
            Duration::from_millis(50),
            || async move { Ok((self.decisions(result).await? > 0).then_some(())) },
        )
        .await
    }
}

/// The sum of the admin `/stats` counters (`name: value` lines) whose
/// names end with `suffix` (0 if there is none).
pub fn counter_total(stats: &str, suffix: &str) -> u64 {
    stats
        .lines()
        .filter_map(|line| line.split_once(": "))
        .filter(|(name, _)| name.ends_with(suffix))
        .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
        .sum()
}

/// The sum of the `sluice.result=<result>.…` counters in an admin `/stats`
/// text (`shadow_drop` is not counted as `drop`).
pub fn decisions_in(stats: &str, result: &str) -> u64 {
    let prefix = format!("sluice.result={result}.");
    stats
        .lines()
        .filter(|line| line.contains(&prefix))
        .filter_map(|line| line.rsplit(": ").next()?.trim().parse::<u64>().ok())
        .sum()
}

/// Starts Envoy on `envoy/demo-a.yaml` with `patch` merged into the
/// filter's configuration and no control plane listening; returns the
/// outcome and Envoy's log, for tests of configurations Envoy must refuse
/// or accept.
pub async fn start_patched_without_control_plane(
    patch: Json,
    name: &str,
) -> (Result<Envoy>, String) {
    // The discard port: nothing listens, and the filter must load anyway.
    let control_plane = SocketAddr::from(([127, 0, 0, 1], 9));
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(err) => return (Err(err.into()), String::new()),
    };
    let started = async {
        let mut config = load_repo_config("demo-a.yaml")?;
        rewrite(&mut config, &Rewrite::for_test(control_plane, patch)?)?;
        Envoy::start(&config, &EnvoyOptions::new(name, dir.path())).await
    }
    .await;
    let log = std::fs::read_to_string(dir.path().join(format!("{name}.log"))).unwrap_or_default();
    (started, log)
}

/// Checks that Envoy refuses to serve with `patch` merged into the filter's
/// configuration and that the filter's error names `field`; on failure,
/// says what Envoy did instead, with its log.
pub async fn refuses_config_naming(patch: Json, field: &str, name: &str) -> Result<()> {
    let (started, log) = start_patched_without_control_plane(patch.clone(), name).await;
    if started.is_ok() {
        bail!("Envoy served with an invalid plugin config {patch}\n{log}");
    }
    let Some(line) = log
        .lines()
        .find(|line| line.contains("invalid sluice plugin configuration"))
    else {
        bail!("no configuration error logged for {patch}\n{log}");
    };
    if !line.contains(field) {
        bail!("the error for {patch} does not name `{field}`: {line}");
    }
    Ok(())
}

async fn wait_ready(guard: &mut ChildGuard, admin_file: &Path) -> Result<(SocketAddr, SocketAddr)> {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let admin = loop {
        if let Ok(text) = std::fs::read_to_string(admin_file)
            && let Ok(addr) = text.trim().parse::<SocketAddr>()
        {
            break addr;
        }
        if let Some(status) = guard.try_exit_status()? {
            bail!("{} exited with {status} during start-up", guard.name());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "{} did not write its admin address within {READY_TIMEOUT:?}",
                guard.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .context("cannot build an HTTP client")?;
    // Poll /ready by hand rather than with `wait::until`: Envoy can write its
    // admin address and then exit (an invalid plugin configuration does), and
    // that must fail at once, not after the timeout.
    let name = guard.name().to_owned();
    loop {
        if let Some(status) = guard.try_exit_status()? {
            bail!("{name} exited with {status} during start-up");
        }
        let ready = http.get(format!("http://{admin}/ready")).send().await;
        if ready.is_ok_and(|response| response.status().is_success()) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{name} was not ready within {READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let url = format!("http://{admin}/listeners?format=json");
    let listeners: Json = http
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?
        .json()
        .await
        .with_context(|| format!("GET {url}: bad JSON"))?;
    let listener = first_listener(&listeners)
        .with_context(|| format!("GET {url}: no listener address in {listeners}"))?;
    Ok((admin, listener))
}

/// The first listener address in an admin `/listeners?format=json` reply.
pub fn first_listener(listeners: &Json) -> Option<SocketAddr> {
    let socket = listeners
        .get("listener_statuses")?
        .as_array()?
        .first()?
        .get("local_address")?
        .get("socket_address")?;
    let ip = socket.get("address")?.as_str()?.parse().ok()?;
    let port = u16::try_from(socket.get("port_value")?.as_u64()?).ok()?;
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo() -> Value {
        load_repo_config("demo-a.yaml").unwrap()
    }

    fn rw(patch: Json) -> Rewrite {
        let Json::Object(plugin_patch) = patch else {
            panic!()
        };
        Rewrite {
            ephemeral_ports: true,
            control_plane: Some(SocketAddr::from(([127, 0, 0, 1], 45678))),
            control_plane_replicas: Vec::new(),
            wasm: Some(PathBuf::from("/abs/sluice_filter.wasm")),
            plugin_patch,
        }
    }

    #[test]
    fn rewrite_points_each_endpoint_at_its_replica() {
        let mut config = load_repo_config("replicas.yaml").unwrap();
        let replicas: Vec<SocketAddr> = ["127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let rewrite_replicas = Rewrite {
            control_plane_replicas: replicas.clone(),
            ..Rewrite::default()
        };
        let report = rewrite(&mut config, &rewrite_replicas).unwrap();
        assert_eq!(report.control_plane_endpoints, 3);
        let text = serde_yaml_ng::to_string(&config).unwrap();
        for port in [1001, 1002, 1003] {
            assert!(text.contains(&format!("port_value: {port}")), "{text}");
        }
        let two = Rewrite {
            control_plane_replicas: replicas[..2].to_vec(),
            ..Rewrite::default()
        };
        let mut config = load_repo_config("replicas.yaml").unwrap();
        let report = rewrite(&mut config, &two).unwrap();
        assert_eq!(report.control_plane_endpoints, 2);
        let text = serde_yaml_ng::to_string(&config).unwrap();
        assert!(!text.contains("port_value: 1003"), "{text}");
    }

    #[test]
    fn rewrite_points_the_native_module_at_the_control_plane() {
        let mut config = load_repo_config("native-module.yaml").unwrap();
        let rewrite_native = Rewrite {
            ephemeral_ports: true,
            control_plane: Some("127.0.0.1:4567".parse().unwrap()),
            control_plane_replicas: Vec::new(),
            wasm: None,
            plugin_patch: serde_json::json!({"proxy_id": "native-x"})
                .as_object()
                .cloned()
                .unwrap(),
        };
        let report = rewrite(&mut config, &rewrite_native).unwrap();
        assert_eq!(report.native_modules, 1);
        let mut found = Vec::new();
        visit_mappings(&mut config, &mut |mapping| {
            if mapping.contains_key("dynamic_module_config") {
                let text = mapping["filter_config"]["value"].as_str().unwrap();
                found.push(serde_json::from_str::<Json>(text).unwrap());
            }
        });
        assert_eq!(found.len(), 1);
        assert_eq!(found[0]["control_plane_uri"], "http://127.0.0.1:4567");
        assert_eq!(found[0]["proxy_id"], "native-x");
    }

    #[test]
    fn rewrite_sets_ports_control_plane_wasm_and_plugin_fields() {
        let mut config = demo();
        let report = rewrite(
            &mut config,
            &rw(serde_json::json!({"proxy_id": "test-a", "report_interval_ms": 100})),
        )
        .unwrap();
        assert_eq!(
            report,
            RewriteReport {
                listeners: 1,
                control_plane_endpoints: 1,
                wasm_plugins: 1,
                native_modules: 0,
            }
        );
        assert_eq!(
            config["admin"]["address"]["socket_address"]["port_value"],
            Value::from(0)
        );
        let listener = &config["static_resources"]["listeners"][0]["address"]["socket_address"];
        assert_eq!(listener["port_value"], Value::from(0));
        let cluster = &config["static_resources"]["clusters"][0];
        assert_eq!(cluster["name"].as_str(), Some(CONTROL_PLANE_CLUSTER));
        let socket = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"];
        assert_eq!(socket["port_value"], Value::from(45678));
        assert_eq!(socket["address"].as_str(), Some("127.0.0.1"));

        let plugins = plugin_configurations(&config).unwrap();
        assert_eq!(plugins.len(), 1);
        assert_eq!(plugins[0]["proxy_id"], "test-a");
        assert_eq!(plugins[0]["report_interval_ms"], 100);
        // Untouched fields survive.
        assert_eq!(plugins[0]["control_plane_cluster"], CONTROL_PLANE_CLUSTER);
        assert_eq!(plugins[0]["bucket_key"][0]["name"], "x-tenant");

        let text = serde_yaml_ng::to_string(&config).unwrap();
        assert!(text.contains("/abs/sluice_filter.wasm"), "{text}");
        assert!(
            !text.contains("target/wasm32-wasip1/wasm/sluice_filter.wasm"),
            "{text}"
        );
    }

    #[test]
    fn rewritten_config_round_trips_through_yaml() {
        let mut config = demo();
        rewrite(&mut config, &rw(serde_json::json!({"proxy_id": "x"}))).unwrap();
        let text = serde_yaml_ng::to_string(&config).unwrap();
        let back: Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back, config);
    }

    #[test]
    fn demo_configs_differ_only_in_ports_and_proxy_id() {
        let a = plugin_configurations(&load_repo_config("demo-a.yaml").unwrap()).unwrap();
        let b = plugin_configurations(&load_repo_config("demo-b.yaml").unwrap()).unwrap();
        assert_eq!(a[0]["proxy_id"], "demo-a");
        assert_eq!(b[0]["proxy_id"], "demo-b");
        let listener_port = |file: &str| {
            let config = load_repo_config(file).unwrap();
            config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
                .as_u64()
        };
        assert_eq!(listener_port("demo-a.yaml"), Some(10000));
        assert_eq!(listener_port("demo-b.yaml"), Some(10001));
    }

    #[test]
    fn rewrite_fails_without_a_control_plane_cluster() {
        let mut config: Value = serde_yaml_ng::from_str(
            "admin: {address: {socket_address: {address: 127.0.0.1, port_value: 9901}}}\n\
             static_resources:\n  listeners:\n  - address: {socket_address: {address: 127.0.0.1, port_value: 1}}\n",
        )
        .unwrap();
        let err = rewrite(&mut config, &rw(serde_json::json!({})))
            .unwrap_err()
            .to_string();
        assert!(err.contains(CONTROL_PLANE_CLUSTER), "{err}");
    }

    #[test]
    fn patch_json_rejects_non_objects() {
        let patch = JsonMap::new();
        assert!(patch_json_object("[1]", &patch).is_err());
        assert!(patch_json_object("not json", &patch).is_err());
        assert_eq!(
            patch_json_object(r#"{"a":1}"#, &patch).unwrap(),
            r#"{"a":1}"#
        );
    }

    #[test]
    fn decisions_sum_one_result_over_its_reasons() {
        let stats = "sluice.result=drop.reason=cluster_overload.decisions: 7\n\
                     sluice.result=drop.reason=new_bucket_limit.decisions: 2\n\
                     sluice.result=shadow_drop.reason=cluster_overload.decisions: 5\n\
                     sluice.result=pass.reason=none.decisions: 11\n";
        assert_eq!(decisions_in(stats, "drop"), 9);
        assert_eq!(decisions_in(stats, "shadow_drop"), 5);
        assert_eq!(decisions_in(stats, "pass"), 11);
        assert_eq!(decisions_in(stats, "tenant"), 0);
    }

    #[test]
    fn first_listener_reads_the_admin_reply() {
        let reply = serde_json::json!({"listener_statuses": [{"name": "ingress",
            "local_address": {"socket_address": {"address": "127.0.0.1", "port_value": 34567}}}]});
        assert_eq!(
            first_listener(&reply),
            Some(SocketAddr::from(([127, 0, 0, 1], 34567)))
        );
        assert_eq!(first_listener(&serde_json::json!({})), None);
    }
}
