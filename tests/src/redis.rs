//! A real `redis-server` on an ephemeral loopback port, for the shared
//! store: no persistence, its files in the test's folder, stopped with the
//! test (its log printed when the test fails), and killable and
//! restartable on the same port for outage tests; optionally TLS-only with
//! a password. [`RedisCluster`] runs several as one Redis Cluster.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::certs::{self, DevCerts};
use crate::paths;
use crate::process::ChildGuard;

/// How long a start may take before it counts as failed.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Ports tried before giving up (another process may take a free port
/// between the probe and Redis's bind).
const PORT_ATTEMPTS: u32 = 5;

/// A running `redis-server`.
#[derive(Debug)]
pub struct RedisServer {
    guard: ChildGuard,
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    starts: u32,
    /// TLS and password settings, kept for restarts.
    extra: Extra,
}

/// What a server adds to the plain-text default.
#[derive(Debug, Clone, Default)]
struct Extra {
    /// A configuration file, the first argument (a sentinel needs one it
    /// can rewrite).
    config_file: Option<PathBuf>,
    /// Arguments after the common ones.
    args: Vec<String>,
    /// The port speaks TLS (readiness is read from the log, not a PING).
    tls: bool,
}

impl RedisServer {
    /// Starts one with its files (and log) in `dir`, on a free port.
    pub async fn start(dir: &Path) -> Result<Self> {
        Self::start_with(dir, Extra::default()).await
    }

    /// Starts one that speaks only TLS with `certs`' server certificate
    /// (clients need not present one) and requires `password`.
    pub async fn start_tls(dir: &Path, certs: &DevCerts, password: &str) -> Result<Self> {
        Self::start_tls_with(dir, certs, password, false).await
    }

    /// As [`Self::start_tls`], and clients must present a certificate
    /// `certs`' CA signed (`tls-auth-clients yes`).
    pub async fn start_mtls(dir: &Path, certs: &DevCerts, password: &str) -> Result<Self> {
        Self::start_tls_with(dir, certs, password, true).await
    }

    async fn start_tls_with(
        dir: &Path,
        certs: &DevCerts,
        password: &str,
        client_certs: bool,
    ) -> Result<Self> {
        Self::start_with(
            dir,
            Extra {
                args: tls_args(certs, password, client_certs),
                tls: true,
                config_file: None,
            },
        )
        .await
    }

    /// Its log's last lines.
    fn log_tail(&self) -> String {
        self.guard.log_tail()
    }

    async fn start_with(dir: &Path, extra: Extra) -> Result<Self> {
        let binary = paths::redis_server()?;
        let dir = dir.join("redis");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut last_error = None;
        for attempt in 1..=PORT_ATTEMPTS {
            let port = free_port()?;
            match spawn(&binary, &dir, port, attempt, &extra).await {
                Ok(guard) => {
                    return Ok(Self {
                        guard,
                        binary,
                        dir,
                        port,
                        starts: attempt,
                        extra,
                    });
                }
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("redis-server did not start")))
    }

    /// `redis://127.0.0.1:PORT/0`, or `rediss://localhost:PORT/0` for TLS
    /// (the name on the test certificate).
    pub fn url(&self) -> String {
        if self.extra.tls {
            format!("rediss://localhost:{}/0", self.port)
        } else {
            format!("redis://127.0.0.1:{}/0", self.port)
        }
    }

    /// The current process's id (for CPU accounting in benchmarks).
    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// SIGKILL: the store vanishes mid-flight, as a crash would.
    pub fn kill(&mut self) -> Result<()> {
        self.guard.kill().map(drop)
    }

    /// SIGSTOP: the server holds its connections but answers nothing (a
    /// stalled store); [`Self::resume`] undoes it.
    pub fn pause(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        let pid = i32::try_from(self.guard.pid()).context("pid out of range")?;
        kill(Pid::from_raw(pid), signal).with_context(|| format!("cannot send {signal} to Redis"))
    }

    /// Starts a new, empty server on the same port (after [`Self::kill`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.guard.kill()?;
        self.starts += 1;
        // The port may take a moment to be free again.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match spawn(&self.binary, &self.dir, self.port, self.starts, &self.extra).await {
                Ok(guard) => {
                    self.guard = guard;
                    return Ok(());
                }
                Err(err) if Instant::now() > deadline => return Err(err),
                Err(_) => {
                    self.starts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Prints the current process's log tail.
    pub fn print_log(&self) {
        self.guard.print_log();
    }

    /// `GET key` (a plain-text server).
    pub async fn get(&self, key: impl AsRef<str>) -> Result<Option<String>> {
        command(self.addr(), |c| {
            c.arg("GET").arg(key.as_ref());
        })
        .await
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// A Redis Cluster of masters, each with its replicas, on ephemeral
/// loopback ports, made by `redis-cli --cluster create` as an operator
/// makes one; each node's files in its own folder; stopped with the test.
/// A node that cannot be reached for a second is failed over, and masters
/// keep serving their slots while another is down
/// (`cluster-require-full-coverage no`).
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes, in the order they were started.
    pub nodes: Vec<RedisServer>,
    /// Ports of the nodes killed.
    killed: Vec<u16>,
}

/// A node's role in `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Its id.
    pub id: String,
    /// Its port.
    pub port: u16,
    /// Whether it is a master (with slots, or none).
    pub master: bool,
    /// A replica's master's id.
    pub master_id: Option<String>,
    /// Whether the others consider it failed.
    pub failed: bool,
}

/// How long a node may be unreachable before the cluster fails it over.
const CLUSTER_NODE_TIMEOUT_MS: u64 = 1_000;

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each in `dir`,
    /// joins them with `redis-cli --cluster create` and waits until every
    /// node reports the cluster ok and every replica is in sync.
    pub async fn start(dir: &Path, masters: usize, replicas: usize) -> Result<Self> {
        let total = masters * (replicas + 1);
        let mut servers = Vec::with_capacity(total);
        for index in 0..total {
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &CLUSTER_NODE_TIMEOUT_MS.to_string(),
                "--cluster-require-full-coverage",
                "no",
            ];
            let extra = Extra {
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                ..Extra::default()
            };
            servers.push(RedisServer::start_with(&dir.join(format!("node-{index}")), extra).await?);
        }
        let cluster = Self {
            nodes: servers,
            killed: Vec::new(),
        };
        let mut create = Command::new(paths::redis_cli()?);
        create.args(["--cluster", "create"]);
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let created = tokio::task::spawn_blocking(move || create.output())
            .await
            .context("redis-cli --cluster create did not run")?
            .context("cannot run redis-cli --cluster create")?;
        if !created.status.success() {
            cluster.print_logs();
            bail!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&created.stdout),
                String::from_utf8_lossy(&created.stderr)
            );
        }
        let ready = crate::wait::until(
            "every node to see the cluster ok and every replica in sync",
            START_TIMEOUT,
            Duration::from_millis(100),
            || cluster.settled(total, masters),
        )
        .await;
        if let Err(err) = ready {
            cluster.print_logs();
            return Err(err);
        }
        Ok(cluster)
    }

    /// `Some(())` once every live node says `cluster_state:ok` and knows
    /// `total` nodes, `masters` masters hold slots and every replica's
    /// link to its master is up.
    async fn settled(&self, total: usize, masters: usize) -> Result<Option<()>> {
        for node in &self.nodes {
            let info: String = command(node.addr(), |c| {
                c.arg("CLUSTER").arg("INFO");
            })
            .await?;
            if !info.contains("cluster_state:ok")
                || !info.contains(&format!("cluster_known_nodes:{total}"))
                || !info.contains(&format!("cluster_size:{masters}"))
            {
                return Ok(None);
            }
            let replication: String = command(node.addr(), |c| {
                c.arg("INFO").arg("replication");
            })
            .await?;
            if replication.contains("role:slave") && !replication.contains("master_link_status:up")
            {
                return Ok(None);
            }
        }
        Ok(Some(()))
    }

    /// `redis+cluster://127.0.0.1:PORT` of the first node: the client finds
    /// the others from it.
    pub fn url(&self) -> String {
        let port = self.nodes.first().map_or(0, |node| node.port);
        format!("redis+cluster://127.0.0.1:{port}")
    }

    /// The nodes as `node`'s `CLUSTER NODES` lists them.
    pub async fn roles(&self, node: usize) -> Result<Vec<ClusterNode>> {
        let addr = self
            .nodes
            .get(node)
            .map(RedisServer::addr)
            .context("no such node")?;
        let text: String = command(addr, |c| {
            c.arg("CLUSTER").arg("NODES");
        })
        .await?;
        text.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (Some(id), Some(address), Some(flags), Some(master)) =
                    (fields.first(), fields.get(1), fields.get(2), fields.get(3))
                else {
                    bail!("unexpected CLUSTER NODES line {line:?}");
                };
                let port = address
                    .split(['@', ','])
                    .next()
                    .and_then(|hp| hp.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                    .with_context(|| format!("no port in {line:?}"))?;
                Ok(ClusterNode {
                    id: (*id).to_owned(),
                    port,
                    master: flags.split(',').any(|f| f == "master"),
                    master_id: (*master != "-").then(|| (*master).to_owned()),
                    failed: flags.split(',').any(|f| f == "fail"),
                })
            })
            .collect()
    }

    /// The port of the master serving `key`'s slot, as a live node's
    /// `CLUSTER SLOTS` says.
    pub async fn master_port_of(&self, key: &str) -> Result<u16> {
        let addr = self.live_addr()?;
        let slot: u64 = command(addr, |c| {
            c.arg("CLUSTER").arg("KEYSLOT").arg(key);
        })
        .await?;
        let ranges: Vec<redis::Value> = command(addr, |c| {
            c.arg("CLUSTER").arg("SLOTS");
        })
        .await?;
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let number = |value: Option<&redis::Value>| match value {
                Some(redis::Value::Int(n)) => u64::try_from(*n).ok(),
                _ => None,
            };
            let (Some(first), Some(last)) = (number(fields.first()), number(fields.get(1))) else {
                continue;
            };
            if (first..=last).contains(&slot)
                && let Some(redis::Value::Array(master)) = fields.get(2)
                && let Some(port) = number(master.get(1))
            {
                return u16::try_from(port).context("port out of range");
            }
        }
        bail!("no master serves slot {slot} of {key:?}")
    }

    /// `GET key` on the master serving it.
    pub async fn get(&self, key: impl AsRef<str>) -> Result<Option<String>> {
        let port = self.master_port_of(key.as_ref()).await?;
        command(SocketAddr::from(([127, 0, 0, 1], port)), |c| {
            c.arg("GET").arg(key.as_ref());
        })
        .await
    }

    /// SIGKILLs the node on `port` (a master: a replica of it takes over).
    pub fn kill_port(&mut self, port: u16) -> Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.port == port)
            .context("no node on that port")?;
        node.kill()?;
        self.killed.push(port);
        Ok(())
    }

    /// Waits until a node other than the one killed on `killed_port`
    /// serves `key`'s slot and the cluster says it is ok; that node's
    /// port.
    pub async fn wait_for_failover(&self, key: &str, killed_port: u16) -> Result<u16> {
        let result = crate::wait::until(
            "a replica of the killed master to take over its slots",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || async {
                let port = self.master_port_of(key).await?;
                let info: String = command(self.live_addr()?, |c| {
                    c.arg("CLUSTER").arg("INFO");
                })
                .await?;
                Ok((port != killed_port && info.contains("cluster_state:ok")).then_some(port))
            },
        )
        .await;
        if result.is_err() {
            self.print_logs();
        }
        result
    }

    /// A node that was not killed.
    fn live_addr(&self) -> Result<SocketAddr> {
        self.nodes
            .iter()
            .find(|node| !self.killed.contains(&node.port))
            .map(RedisServer::addr)
            .context("every node was killed")
    }

    /// How many keys each node holds (`DBSIZE`), in node order (0 for a
    /// node that was killed).
    pub async fn keys_per_node(&self) -> Result<Vec<u64>> {
        let mut sizes = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            if self.killed.contains(&node.port) {
                sizes.push(0);
                continue;
            }
            sizes.push(
                command(node.addr(), |c| {
                    c.arg("DBSIZE");
                })
                .await?,
            );
        }
        Ok(sizes)
    }

    /// Prints every node's log tail.
    pub fn print_logs(&self) {
        for node in &self.nodes {
            node.print_log();
        }
    }
}

/// A master, one replica of it and one Redis Sentinel watching them (a
/// quorum of one, 1 s to call the master down), each on an ephemeral
/// loopback port; stopped with the test.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The master at start.
    pub master: RedisServer,
    /// Its replica, the master after a failover.
    pub replica: RedisServer,
    /// The sentinel.
    pub sentinel: RedisServer,
}

/// The master's name in the sentinel.
pub const SENTINEL_SERVICE: &str = "main";

impl RedisSentinel {
    /// Starts the three in `dir` and waits until the replica is in sync
    /// and the sentinel knows it.
    pub async fn start(dir: &Path) -> Result<Self> {
        let master = RedisServer::start(&dir.join("master")).await?;
        let replica = RedisServer::start_with(
            &dir.join("replica"),
            Extra {
                args: vec![
                    "--replicaof".to_owned(),
                    "127.0.0.1".to_owned(),
                    master.port.to_string(),
                ],
                ..Extra::default()
            },
        )
        .await?;
        let (sentinel_dir, config) = sentinel_config(dir, master.port, None)?;
        let sentinel = RedisServer::start_with(
            &sentinel_dir,
            Extra {
                config_file: Some(config),
                args: vec!["--sentinel".to_owned()],
                ..Extra::default()
            },
        )
        .await?;
        let set = Self {
            master,
            replica,
            sentinel,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let info: String = command(set.replica.addr(), |c| {
                c.arg("INFO").arg("replication");
            })
            .await?;
            let replicas: Vec<redis::Value> = command(set.sentinel.addr(), |c| {
                c.arg("SENTINEL").arg("REPLICAS").arg(SENTINEL_SERVICE);
            })
            .await?;
            if info.contains("master_link_status:up") && !replicas.is_empty() {
                return Ok(set);
            }
            if Instant::now() > deadline {
                set.print_logs();
                bail!("the replica or the sentinel did not come up within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// As [`Self::start`], every server speaking only TLS with `certs`'
    /// server certificate: the master and its replica require `password`,
    /// the sentinel `sentinel_password` (and knows the master's). Readiness
    /// is read from the logs (the plain-text probes cannot speak TLS).
    pub async fn start_tls(
        dir: &Path,
        certs: &DevCerts,
        password: &str,
        sentinel_password: &str,
    ) -> Result<Self> {
        let master = RedisServer::start_tls(&dir.join("master"), certs, password).await?;
        let mut replica_args = tls_args(certs, password, false);
        replica_args.extend(
            [
                "--replicaof",
                "127.0.0.1",
                &master.port.to_string(),
                "--masterauth",
                password,
                "--tls-replication",
                "yes",
            ]
            .map(str::to_owned),
        );
        let replica = RedisServer::start_with(
            &dir.join("replica"),
            Extra {
                args: replica_args,
                tls: true,
                config_file: None,
            },
        )
        .await?;
        let (sentinel_dir, config) = sentinel_config(dir, master.port, Some(password))?;
        let mut sentinel_args = tls_args(certs, sentinel_password, false);
        sentinel_args.extend(["--tls-replication", "yes", "--sentinel"].map(str::to_owned));
        let sentinel = RedisServer::start_with(
            &sentinel_dir,
            Extra {
                config_file: Some(config),
                args: sentinel_args,
                tls: true,
            },
        )
        .await?;
        let set = Self {
            master,
            replica,
            sentinel,
        };
        let ready = crate::wait::until(
            "the TLS replica in sync and the sentinel knowing it",
            START_TIMEOUT,
            Duration::from_millis(100),
            || {
                let synced = set
                    .replica
                    .log_tail()
                    .contains("MASTER <-> REPLICA sync: Finished with success");
                let known = set.sentinel.log_tail().contains("+slave slave");
                async move { Ok((synced && known).then_some(())) }
            },
        )
        .await;
        if let Err(err) = ready {
            set.print_logs();
            return Err(err);
        }
        Ok(set)
    }

    /// `rediss+sentinel://localhost:PORT/main`, for a set from
    /// [`Self::start_tls`] (the name on the test certificate).
    pub fn tls_url(&self) -> String {
        format!(
            "rediss+sentinel://localhost:{}/{SENTINEL_SERVICE}",
            self.sentinel.port
        )
    }

    /// `redis+sentinel://127.0.0.1:PORT/main`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{SENTINEL_SERVICE}",
            self.sentinel.port
        )
    }

    /// The master's port as the sentinel names it now.
    pub async fn master_port(&self) -> Result<u16> {
        let (_, port): (String, u16) = command(self.sentinel.addr(), |c| {
            c.arg("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(SENTINEL_SERVICE);
        })
        .await?;
        Ok(port)
    }

    /// The replica's port.
    pub fn replica_port(&self) -> u16 {
        self.replica.port
    }

    /// `GET key` on the master the sentinel names now.
    pub async fn get(&self, key: impl AsRef<str>) -> Result<Option<String>> {
        let port = self.master_port().await?;
        command(SocketAddr::from(([127, 0, 0, 1], port)), |c| {
            c.arg("GET").arg(key.as_ref());
        })
        .await
    }

    /// Prints the three logs' tails.
    pub fn print_logs(&self) {
        self.master.print_log();
        self.replica.print_log();
        self.sentinel.print_log();
    }
}

/// Writes the sentinel's configuration under `dir`: it monitors the master
/// on `master_port` (with `password`, if it has one), quorum 1, down after
/// 1 s. Returns the sentinel's directory and the file.
fn sentinel_config(
    dir: &Path,
    master_port: u16,
    password: Option<&str>,
) -> Result<(PathBuf, PathBuf)> {
    let sentinel_dir = dir.join("sentinel");
    std::fs::create_dir_all(&sentinel_dir)?;
    let config = sentinel_dir.join("sentinel.conf");
    let auth = password.map_or(String::new(), |password| {
        format!("sentinel auth-pass {SENTINEL_SERVICE} {password}\n")
    });
    std::fs::write(
        &config,
        format!(
            "sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {master_port} 1\n\
             {auth}\
             sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n\
             sentinel failover-timeout {SENTINEL_SERVICE} 3000\n"
        ),
    )?;
    Ok((sentinel_dir, config))
}

/// The arguments of a server that speaks only TLS with `certs`' server
/// certificate and requires `password` (and, with `client_certs`, a client
/// certificate `certs`' CA signed).
fn tls_args(certs: &DevCerts, password: &str, client_certs: bool) -> Vec<String> {
    let file = |name| certs.path(name).display().to_string();
    vec![
        "--tls-cert-file".to_owned(),
        file(certs::SERVER_CERT),
        "--tls-key-file".to_owned(),
        file(certs::SERVER_KEY),
        "--tls-ca-cert-file".to_owned(),
        file(certs::CA),
        "--tls-auth-clients".to_owned(),
        if client_certs { "yes" } else { "no" }.to_owned(),
        "--requirepass".to_owned(),
        password.to_owned(),
    ]
}

/// One command to the server at `addr`, built by `build`.
async fn command<T: redis::FromRedisValue>(
    addr: SocketAddr,
    build: impl FnOnce(&mut redis::Cmd),
) -> Result<T> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let mut cmd = redis::Cmd::new();
    build(&mut cmd);
    Ok(cmd.query_async(&mut connection).await?)
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

async fn spawn(
    binary: &Path,
    dir: &Path,
    port: u16,
    start: u32,
    extra: &Extra,
) -> Result<ChildGuard> {
    let mut command = Command::new(binary);
    if let Some(file) = &extra.config_file {
        command.arg(file);
    }
    if extra.tls {
        command.args(["--port", "0", "--tls-port", &port.to_string()]);
    } else {
        command.args(["--port", &port.to_string()]);
    }
    command
        .args(&extra.args)
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir);
    let log = dir.join(format!("redis-{start}.log"));
    let mut guard = ChildGuard::spawn(&format!("redis-server:{port}"), command, &log)?;
    guard.set_grace(Duration::from_secs(1));
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if !guard.is_running() {
            bail!(
                "redis-server on port {port} exited at start:\n{}",
                guard.log_tail()
            );
        }
        let ready = if extra.tls {
            // A sentinel logs no "ready" line: it is up once it monitors.
            let log = guard.log_tail();
            log.contains("Ready to accept connections") || log.contains("+monitor master")
        } else {
            ping(port)
        };
        if ready {
            return Ok(guard);
        }
        if Instant::now() > deadline {
            bail!(
                "redis-server on port {port} did not answer PING within {START_TIMEOUT:?}:\n{}",
                guard.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An inline `PING` (Redis's plain-text command form) answered `+PONG`.
fn ping(port: u16) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        stream.write_all(b"PING\r\n")?;
        let mut answer = [0_u8; 7];
        stream.read_exact(&mut answer)?;
        Ok(&answer == b"+PONG\r\n")
    };
    attempt().unwrap_or(false)
}
