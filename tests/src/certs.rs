//! A throw-away PKI for mutual TLS between Envoy and the control plane: one
//! CA, a server certificate for `localhost` / `127.0.0.1`, and a client
//! certificate for the proxies. Generated fresh for each test (and by
//! `just certs` for the demo); never use these outside a test or a demo.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
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
/// The proxies' identity: the URI SAN of [`CLIENT_CERT`], SPIFFE-style.
pub const CLIENT_IDENTITY: &str = "spiffe://sluice.test/ns/demo/sa/envoy";
/// A second client certificate with another identity, for tests of
/// identity misuse.
pub const OTHER_CERT: &str = "other.pem";
/// The private key of [`OTHER_CERT`].
pub const OTHER_KEY: &str = "other-key.pem";
/// The URI SAN of [`OTHER_CERT`].
pub const OTHER_IDENTITY: &str = "spiffe://sluice.test/ns/other/sa/client";
/// A client certificate (and key) with the identity Istio gives a workload
/// of namespace `shop`.
pub const ISTIO_SHOP_CERT: &str = "istio-shop.pem";
/// Its private key.
pub const ISTIO_SHOP_KEY: &str = "istio-shop-key.pem";
/// Its URI SAN, as Istio's workload certificates name a service account.
pub const ISTIO_SHOP_IDENTITY: &str = "spiffe://cluster.local/ns/shop/sa/checkout";
/// A client certificate of a workload of namespace `billing`.
pub const ISTIO_BILLING_CERT: &str = "istio-billing.pem";
/// Its private key.
pub const ISTIO_BILLING_KEY: &str = "istio-billing-key.pem";
/// Its URI SAN.
pub const ISTIO_BILLING_IDENTITY: &str = "spiffe://cluster.local/ns/billing/sa/api";

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

        let leaf = |name: &str, sans: Vec<SanType>| -> Result<(String, String)> {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::default();
            params.subject_alt_names = sans;
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![if name.contains("control plane") {
                ExtendedKeyUsagePurpose::ServerAuth
            } else {
                ExtendedKeyUsagePurpose::ClientAuth
            }];
            let cert = params.signed_by(&key, &issuer)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let uri = |uri: &str| -> Result<SanType> { Ok(SanType::URI(Ia5String::try_from(uri)?)) };
        let (server_cert, server_key) = leaf(
            "sluice control plane",
            vec![
                SanType::DnsName(Ia5String::try_from("localhost")?),
                SanType::IpAddress([127, 0, 0, 1].into()),
            ],
        )?;
        let (client_cert, client_key) = leaf("sluice proxy", vec![uri(CLIENT_IDENTITY)?])?;
        let (other_cert, other_key) = leaf("another client", vec![uri(OTHER_IDENTITY)?])?;
        let (shop_cert, shop_key) = leaf("istio shop", vec![uri(ISTIO_SHOP_IDENTITY)?])?;
        let (billing_cert, billing_key) =
            leaf("istio billing", vec![uri(ISTIO_BILLING_IDENTITY)?])?;

        for (name, contents) in [
            (CA, ca_cert.pem()),
            (SERVER_CERT, server_cert),
            (SERVER_KEY, server_key),
            (CLIENT_CERT, client_cert),
            (CLIENT_KEY, client_key),
            (OTHER_CERT, other_cert),
            (OTHER_KEY, other_key),
            (ISTIO_SHOP_CERT, shop_cert),
            (ISTIO_SHOP_KEY, shop_key),
            (ISTIO_BILLING_CERT, billing_cert),
            (ISTIO_BILLING_KEY, billing_key),
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
    /// certificates from this CA, and lets [`CLIENT_IDENTITY`] claim any
    /// proxy id.
    pub fn serve_args(&self) -> Vec<String> {
        let mut args = self.tls_args();
        args.extend(["--grpc-identity".to_owned(), format!("{CLIENT_IDENTITY}=*")]);
        args
    }

    /// `sluice serve` arguments for a gRPC listener that requires client
    /// certificates from this CA, without any identity rule.
    pub fn tls_args(&self) -> Vec<String> {
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
