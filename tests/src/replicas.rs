//! Control-plane replicas sharing one real Redis, and Envoys whose
//! control-plane cluster lists every replica (`envoy/replicas.yaml`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::control_plane::{AdminClient, ControlPlane, ControlPlaneOptions, sample};
use crate::envoy::Envoy;
use crate::fault_proxy::FaultProxy;
use crate::fleet::{ControlPlaneTarget, DataPlane, EnvoySpec, TestDir, free_loopback_addr};
use crate::redis::RedisServer;

/// How to start the set.
#[derive(Debug, Clone)]
pub struct ReplicaSetOptions {
    /// Every replica's limits file.
    pub limits_yaml: String,
    /// How many replicas (their gRPC ports are reserved up front, so every
    /// Envoy lists all of them).
    pub replicas: usize,
    /// How many of them start before the Envoys; [`ReplicaSet::start_replica`]
    /// starts the others.
    pub replicas_at_start: usize,
    /// How many Envoys.
    pub envoys: usize,
    /// `--control-interval-ms` of every replica.
    pub control_interval_ms: u64,
    /// More filter configuration keys for every Envoy (a JSON object).
    pub filter: serde_json::Value,
    /// Worker threads of every Envoy.
    pub concurrency: u32,
    /// The wasm filter or the native module in every Envoy.
    pub data_plane: DataPlane,
    /// The replica (by index) that reaches Redis through a
    /// [`FaultProxy`], so a test can cut it off ([`ReplicaSet::fault`]).
    pub partitionable: Option<usize>,
    /// `(envoy, replica)` pairs: that Envoy's control-plane cluster (or
    /// the native module's `control_plane_uri`) names only that replica,
    /// so a test can put streams on chosen replicas. Other Envoys list
    /// every replica.
    pub pinned_envoys: Vec<(usize, usize)>,
    /// More `sluice serve` arguments for every replica.
    pub replica_args: Vec<String>,
}

impl ReplicaSetOptions {
    /// `replicas` replicas and `envoys` Envoys of two workers, 200 ms
    /// control interval, 100 ms report interval.
    pub fn new(limits_yaml: &str, replicas: usize, envoys: usize) -> Self {
        Self {
            limits_yaml: limits_yaml.to_owned(),
            replicas,
            replicas_at_start: replicas,
            envoys,
            control_interval_ms: 200,
            filter: json!({}),
            concurrency: 2,
            data_plane: DataPlane::Wasm,
            partitionable: None,
            pinned_envoys: Vec::new(),
            replica_args: Vec::new(),
        }
    }
}

/// A running set: Redis, the replicas, the Envoys. Dropping it stops every
/// process; on a failed test their files stay for a post-mortem.
#[derive(Debug)]
pub struct ReplicaSet {
    /// The Envoys, in start order.
    pub envoys: Vec<Envoy>,
    /// The replicas started so far (`r0`, `r1`, …, in order).
    pub replicas: Vec<ControlPlane>,
    /// Every replica's gRPC address, started or not.
    grpc_addrs: Vec<SocketAddr>,
    /// The shared store.
    pub redis: RedisServer,
    /// Between [`ReplicaSetOptions::partitionable`] and Redis.
    pub fault: Option<FaultProxy>,
    /// The options it was started with.
    pub options: ReplicaSetOptions,
    dir: TestDir,
}

impl ReplicaSet {
    /// Starts Redis, the replicas, then the Envoys.
    pub async fn start(options: ReplicaSetOptions) -> Result<Self> {
        let dir = TestDir::new("sluice-replicas-", "replica set")?;
        let redis = RedisServer::start(dir.path()).await?;
        let grpc_addrs = (0..options.replicas)
            .map(|_| free_loopback_addr())
            .collect::<Result<Vec<_>>>()?;
        let fault = match options.partitionable {
            Some(_) => Some(FaultProxy::start(redis.addr()).await?),
            None => None,
        };
        let mut set = Self {
            envoys: Vec::with_capacity(options.envoys),
            replicas: Vec::with_capacity(options.replicas),
            grpc_addrs,
            redis,
            fault,
            options,
            dir,
        };
        for _ in 0..set.options.replicas_at_start {
            set.start_replica().await?;
        }
        for _ in 0..set.options.envoys {
            set.add_envoy().await?;
        }
        Ok(set)
    }

    /// Starts the next replica on its reserved port; returns its index.
    pub async fn start_replica(&mut self) -> Result<usize> {
        let index = self.replicas.len();
        let Some(&grpc) = self.grpc_addrs.get(index) else {
            bail!("all {} replicas already started", self.grpc_addrs.len());
        };
        let store = match (&self.fault, self.options.partitionable) {
            (Some(fault), Some(partitionable)) if partitionable == index => {
                format!("redis://{}/0", fault.addr())
            }
            _ => self.redis.url(),
        };
        let mut options = ControlPlaneOptions::new(&self.options.limits_yaml, self.dir.path())
            .control_interval_ms(self.options.control_interval_ms)
            .listen(grpc, SocketAddr::from(([127, 0, 0, 1], 0)))
            .args([
                "--store".to_owned(),
                store,
                "--replica-id".to_owned(),
                format!("r{index}"),
            ])
            .args(self.options.replica_args.iter().cloned());
        options.name = format!("sluice-r{index}");
        self.replicas.push(ControlPlane::start(options).await?);
        Ok(index)
    }

    /// With only r0 started (`replicas_at_start = 1`) and load on `bucket`:
    /// waits until r0 leads and every Envoy reports `bucket` to it, then
    /// starts the other replicas. Every stream is then on the leader.
    /// Returns the leader's fence.
    pub async fn start_the_rest_once_r0_leads_every_stream(&mut self, bucket: &str) -> Result<u64> {
        let first = self.replicas.first().context("r0 is not started")?;
        let (_, fence) = wait_for_leader(&[first], Duration::from_secs(5)).await?;
        let envoys = u32::try_from(self.envoys.len()).unwrap_or(u32::MAX);
        first
            .admin()
            .wait_for_bucket(
                bucket,
                &format!("{envoys} proxies reporting {bucket} to r0"),
                // Each Envoy's filter may first try a replica that is not
                // started yet and back off before it finds r0; on a loaded
                // machine that takes longer than a healthy start suggests.
                Duration::from_secs(20),
                Duration::from_millis(50),
                |b| (b.proxies_reporting >= envoys).then_some(()),
            )
            .await?;
        while self.replicas.len() < self.grpc_addrs.len() {
            self.start_replica().await?;
        }
        Ok(fence)
    }

    /// Starts one more Envoy from `envoy/replicas.yaml`, its cluster
    /// pointing at every replica (or, for the native module, from
    /// `envoy/native-module.yaml` with every replica in
    /// `control_plane_uri`); returns its index.
    pub async fn add_envoy(&mut self) -> Result<usize> {
        let index = self.envoys.len();
        let letter = char::from(b'a' + u8::try_from(index % 26).unwrap_or(0));
        let data_plane = self.options.data_plane;
        let file = match data_plane {
            DataPlane::Native => "native-module.yaml",
            DataPlane::Wasm => "replicas.yaml",
        };
        let spec = EnvoySpec::repo(&format!("envoy-{letter}"), file)
            .data_plane(data_plane)
            .filter(json!({"proxy_id": format!("test-{letter}"), "report_interval_ms": 100}))
            .filter(self.options.filter.clone())
            .concurrency(self.options.concurrency);
        let target = ControlPlaneTarget::Replicas(self.replicas_of_envoy(index)?);
        self.envoys
            .push(spec.start(self.dir.path(), &target).await?);
        Ok(index)
    }

    /// The replicas Envoy `index` lists: the one it is pinned to, else all.
    fn replicas_of_envoy(&self, index: usize) -> Result<Vec<SocketAddr>> {
        let pinned = self
            .options
            .pinned_envoys
            .iter()
            .find(|(envoy, _)| *envoy == index);
        match pinned {
            Some(&(_, replica)) => match self.grpc_addrs.get(replica) {
                Some(&addr) => Ok(vec![addr]),
                None => {
                    bail!("Envoy #{index} is pinned to replica #{replica}, which is not in the set")
                }
            },
            None => Ok(self.grpc_addrs.clone()),
        }
    }

    /// The `http://…` base URL of Envoy `index`.
    pub fn url(&self, index: usize) -> Result<String> {
        self.envoys
            .get(index)
            .map(Envoy::base_url)
            .with_context(|| format!("no Envoy #{index}"))
    }

    /// One control interval.
    pub fn control_interval(&self) -> Duration {
        Duration::from_millis(self.options.control_interval_ms)
    }

    /// Where logs and generated configs are.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The gRPC addresses of the replicas, in order.
    pub fn grpc_addrs(&self) -> &[SocketAddr] {
        &self.grpc_addrs
    }

    /// Prints every process's log tail.
    pub fn print_logs(&self) {
        self.redis.print_log();
        for replica in &self.replicas {
            replica.print_log();
        }
        for envoy in &self.envoys {
            envoy.print_log();
        }
    }
}

/// What a replica's `/metrics` says about its lease: `Some(fence)` while
/// it leads.
pub async fn leading(admin: &AdminClient) -> Result<Option<u64>> {
    let metrics = admin.metrics().await?;
    if sample(&metrics, "sluice_replica_leader") < 1.0 {
        return Ok(None);
    }
    let fence = sample(&metrics, "sluice_replica_fence");
    // A fence is a small positive integer: the float holds it exactly.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Some(fence as u64))
}

/// The index of the one replica among `replicas` that leads, once exactly
/// one does, and its fence; waits up to `timeout`.
pub async fn wait_for_leader(
    replicas: &[&ControlPlane],
    timeout: Duration,
) -> Result<(usize, u64)> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut leaders = Vec::new();
        for (index, replica) in replicas.iter().enumerate() {
            if let Ok(Some(fence)) = leading(replica.admin()).await {
                leaders.push((index, fence));
            }
        }
        if let [one] = leaders.as_slice() {
            return Ok(*one);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("no single leader within {timeout:?}: {leaders:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
