//! A real OCI registry on loopback (Debian's `docker-registry`,
//! distribution 2.8) and the two clients the image tests use: `skopeo`
//! to push an OCI layout, and plain HTTP to pull a manifest and blobs by
//! digest, as Istio's and Envoy Gateway's fetchers do.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::oci;
use crate::paths;
use crate::process::ChildGuard;

/// How long the registry gets to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// What the registry accepts and answers for manifests.
const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// A running registry; dropping it stops it.
#[derive(Debug)]
pub struct Registry {
    guard: ChildGuard,
    addr: SocketAddr,
    http: reqwest::Client,
}

/// A manifest as the registry served it.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The bytes, exactly as served.
    pub bytes: Vec<u8>,
    /// `Content-Type`.
    pub content_type: String,
    /// `Docker-Content-Digest`.
    pub digest_header: String,
}

impl Registry {
    /// Starts one with its storage, config and log in `dir`, on a free
    /// loopback port.
    pub async fn start(dir: &Path) -> Result<Self> {
        let tools = paths::registry_tools()?;
        let storage = dir.join("registry-data");
        std::fs::create_dir_all(&storage).context("cannot create the registry's storage")?;
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:0\n  secret: sluice-tests\n",
                storage.display()
            ),
        )
        .context("cannot write the registry's config")?;
        let mut command = Command::new(tools.join("docker-registry"));
        command.arg("serve").arg(&config);
        let log = dir.join("registry.log");
        let mut guard = ChildGuard::spawn("docker-registry", command, &log)?;
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        let addr = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addr) = text
                .split("listening on ")
                .nth(1)
                .and_then(|rest| rest.split(['"', ' ', '\n']).next())
                .and_then(|addr| addr.parse::<SocketAddr>().ok())
            {
                break addr;
            }
            if let Some(status) = guard.try_exit_status()? {
                guard.print_log();
                bail!("docker-registry exited with {status} during start-up");
            }
            if tokio::time::Instant::now() >= deadline {
                guard.print_log();
                bail!("docker-registry did not listen within {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("cannot build an HTTP client")?;
        Ok(Self { guard, addr, http })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Pushes the OCI layout `layout` (tag `tag`) as `name:tag` with skopeo.
    pub fn push(&self, layout: &Path, tag: &str, name: &str) -> Result<()> {
        let skopeo = paths::registry_tools()?.join("skopeo");
        let output = Command::new(&skopeo)
            .arg("copy")
            .arg("--dest-tls-verify=false")
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{name}:{tag}", self.addr))
            .output()
            .context("cannot run skopeo")?;
        if !output.status.success() {
            bail!(
                "skopeo copy failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// The digest skopeo reports for `name:tag` in the registry.
    pub fn inspect_digest(&self, name: &str, tag: &str) -> Result<String> {
        let skopeo = paths::registry_tools()?.join("skopeo");
        let output = Command::new(&skopeo)
            .arg("inspect")
            .arg("--tls-verify=false")
            .arg("--format")
            .arg("{{.Digest}}")
            .arg(format!("docker://{}/{name}:{tag}", self.addr))
            .output()
            .context("cannot run skopeo")?;
        if !output.status.success() {
            bail!(
                "skopeo inspect failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// GETs the manifest `name@reference` (a digest or a tag).
    pub async fn manifest(&self, name: &str, reference: &str) -> Result<Pulled> {
        let url = format!("http://{}/v2/{name}/manifests/{reference}", self.addr);
        let response = self
            .http
            .get(&url)
            .header("accept", MANIFEST_ACCEPT)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if !response.status().is_success() {
            bail!("GET {url}: {}", response.status());
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let content_type = header("content-type");
        let digest_header = header("docker-content-digest");
        let bytes = response.bytes().await?.to_vec();
        Ok(Pulled {
            bytes,
            content_type,
            digest_header,
        })
    }

    /// GETs the blob `digest` of `name`, checking its digest.
    pub async fn blob(&self, name: &str, digest: &str) -> Result<Vec<u8>> {
        let url = format!("http://{}/v2/{name}/blobs/{digest}", self.addr);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if !response.status().is_success() {
            bail!("GET {url}: {}", response.status());
        }
        let bytes = response.bytes().await?.to_vec();
        if oci::digest(&bytes) != digest {
            bail!("GET {url}: the blob's digest is {}", oci::digest(&bytes));
        }
        Ok(bytes)
    }

    /// Prints the registry's log tail.
    pub fn print_log(&self) {
        self.guard.print_log();
    }
}
