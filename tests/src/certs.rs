//! A throw-away PKI for mutual TLS between Envoy and the control plane: one
//! CA, a server certificate for `localhost` / `127.0.0.1`, and a client
//! certificate for the proxies. Generated fresh for each test (and by
//! `just certs` for the demo); never use these outside a test or a demo.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// File names inside the directory, as `envoy/demo-mtls.yaml` expects them
/// under `.demo/certs/`.
pub const CA: &str = "ca.pem";
/// The control plane's certificate chain.
pub const SERVER_CERT: &str = "control-plane.pem";
/// The control plane's private key.
pub const SERVER_KEY: &str = "control-plane-key.pem";
/// The proxies' client certificate.
pub const CLIENT_CERT: &str = "envoy.pem";
/// The proxies' private key.
pub const CLIENT_KEY: &str = "envoy-key.pem";

/// Where a generated set of files is.
#[derive(Debug, Clone)]
pub struct DevCerts {
    dir: PathBuf,
}

impl DevCerts {
    /// Generates a CA, a server and a client certificate into `dir`.
    pub fn generate(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;

        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Sluice test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let leaf = |name: &str, usage: ExtendedKeyUsagePurpose| -> Result<(String, String)> {
            let key = KeyPair::generate()?;
            let mut params =
                CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &issuer)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_cert, server_key) =
            leaf("sluice control plane", ExtendedKeyUsagePurpose::ServerAuth)?;
        let (client_cert, client_key) = leaf("sluice proxy", ExtendedKeyUsagePurpose::ClientAuth)?;

        for (name, contents) in [
            (CA, ca_cert.pem()),
            (SERVER_CERT, server_cert),
            (SERVER_KEY, server_key),
            (CLIENT_CERT, client_cert),
            (CLIENT_KEY, client_key),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, contents)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// One of the files by name (see the constants).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `sluice serve` arguments for a gRPC listener that requires client
    /// certificates from this CA.
    pub fn serve_args(&self) -> Vec<String> {
        [
            ("--grpc-tls-cert", SERVER_CERT),
            ("--grpc-tls-key", SERVER_KEY),
            ("--grpc-tls-client-ca", CA),
        ]
        .into_iter()
        .flat_map(|(flag, name)| [flag.to_owned(), self.path(name).display().to_string()])
        .collect()
    }
}

/// Where the repository's example configs expect the certificates.
pub const DEMO_CERT_DIR: &str = ".demo/certs/";

/// Points every file name under [`DEMO_CERT_DIR`] in an Envoy config at
/// `certs` instead; returns how many it changed.
pub fn point_config_at(config: &mut serde_yaml_ng::Value, certs: &DevCerts) -> usize {
    use serde_yaml_ng::Value;
    match config {
        Value::String(text) => match text.strip_prefix(DEMO_CERT_DIR) {
            Some(name) => {
                *text = certs.path(name).display().to_string();
                1
            }
            None => 0,
        },
        Value::Sequence(items) => items.iter_mut().map(|v| point_config_at(v, certs)).sum(),
        Value::Mapping(map) => map.iter_mut().map(|(_, v)| point_config_at(v, certs)).sum(),
        Value::Tagged(tagged) => point_config_at(&mut tagged.value, certs),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}
