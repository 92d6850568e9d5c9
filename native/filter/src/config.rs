//! The module's configuration: the wasm filter's JSON plus what a native
//! module needs in addition to reach the control plane itself:
//! `control_plane_uri` (one address, or a list of replicas) and, for
//! mutual TLS, `control_plane_tls`.

use serde::Deserialize;
use sluice_agent::config::FilterConfig;

/// Field naming where the control plane listens (the module dials it itself).
const URI_FIELD: &str = "control_plane_uri";
/// Field of the TLS settings of that connection.
const TLS_FIELD: &str = "control_plane_tls";
/// `control_plane_cluster` is required by the wasm filter's schema; the
/// native module does not use Envoy's clusters, so a missing one is filled in.
const CLUSTER_FIELD: &str = "control_plane_cluster";
const DEFAULT_CLUSTER: &str = "sluice_control_plane";

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    /// Everything the wasm filter's configuration holds, validated by it.
    pub filter: FilterConfig,
    /// `http://HOST:PORT` (or `https://` with [`Self::tls`]) of the
    /// control plane's gRPC listener: one, or one per replica (each new
    /// stream tries the next, so a dead replica is passed over on the next
    /// reconnect).
    pub control_plane_uris: Vec<String>,
    /// TLS to the control plane, read from the files the configuration names.
    pub tls: Option<ControlPlaneTls>,
}

/// The PEM files of `control_plane_tls`, as written in the configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    /// CA that signed the control plane's certificate.
    ca_file: String,
    /// Client certificate (mutual TLS), with `key_file`.
    #[serde(default)]
    cert_file: Option<String>,
    /// The client certificate's key.
    #[serde(default)]
    key_file: Option<String>,
    /// Name to verify the control plane's certificate against; default:
    /// the URI's host.
    #[serde(default)]
    server_name: Option<String>,
}

/// TLS to the control plane: PEM contents, read when the configuration loads.
#[derive(Debug, Clone)]
pub struct ControlPlaneTls {
    /// CA certificate(s).
    pub ca_pem: Vec<u8>,
    /// Client certificate and key, for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to verify the server's certificate against.
    pub server_name: Option<String>,
}

/// Why a configuration was refused: the field and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("sluice_native configuration: {0}")]
pub struct ConfigError(String);

impl NativeConfig {
    /// Parses the bytes Envoy hands over (the filter's `filter_config`).
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|error| ConfigError(format!("not a JSON object: {error}")))?;
        let serde_json::Value::Object(mut object) = value else {
            return Err(ConfigError("not a JSON object".to_owned()));
        };
        let uris = match object.remove(URI_FIELD) {
            Some(serde_json::Value::String(uri)) => vec![uri],
            Some(serde_json::Value::Array(items)) if !items.is_empty() => items
                .into_iter()
                .map(|item| match item {
                    serde_json::Value::String(uri) => Ok(uri),
                    other => Err(ConfigError(format!(
                        "{URI_FIELD}: expected strings like \"http://127.0.0.1:18000\", got {other}"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(ConfigError(format!(
                    "{URI_FIELD}: expected a string like \"http://127.0.0.1:18000\" or a \
                     non-empty list of them (one per replica), got {other}"
                )));
            }
            None => {
                return Err(ConfigError(format!(
                    "{URI_FIELD}: required (the control plane's gRPC address, e.g. \
                     \"http://127.0.0.1:18000\")"
                )));
            }
        };
        let tls = match object.remove(TLS_FIELD) {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => Some(read_tls(value)?),
        };
        let control_plane_uris = uris
            .iter()
            .map(|uri| validate_uri(uri, tls.is_some()))
            .collect::<Result<Vec<_>, _>>()?;
        object
            .entry(CLUSTER_FIELD)
            .or_insert_with(|| serde_json::Value::String(DEFAULT_CLUSTER.to_owned()));
        let bytes = serde_json::to_vec(&object)
            .map_err(|error| ConfigError(format!("cannot re-encode: {error}")))?;
        let filter =
            FilterConfig::from_json(&bytes).map_err(|error| ConfigError(error.to_string()))?;
        Ok(Self {
            filter,
            control_plane_uris,
            tls,
        })
    }
}

fn validate_uri(uri: &str, tls: bool) -> Result<String, ConfigError> {
    let scheme = if tls { "https" } else { "http" };
    let parsed: Result<tonic::transport::Uri, _> = uri.parse();
    match parsed {
        Ok(parsed) if parsed.scheme_str() == Some(scheme) && parsed.authority().is_some() => {
            Ok(uri.to_owned())
        }
        _ => Err(ConfigError(format!(
            "{URI_FIELD}: {uri:?} is not an {scheme}://HOST:PORT address{}",
            if tls {
                " (control_plane_tls is set)"
            } else {
                " (https:// needs control_plane_tls)"
            }
        ))),
    }
}

fn read_tls(value: serde_json::Value) -> Result<ControlPlaneTls, ConfigError> {
    let raw: RawTls = serde_path_to_error::deserialize(value)
        .map_err(|error| ConfigError(format!("{TLS_FIELD}.{error}")))?;
    let read = |field: &str, path: &str| {
        std::fs::read(path).map_err(|error| {
            ConfigError(format!("{TLS_FIELD}.{field}: cannot read {path}: {error}"))
        })
    };
    let identity = match (&raw.cert_file, &raw.key_file) {
        (Some(cert), Some(key)) => Some((read("cert_file", cert)?, read("key_file", key)?)),
        (None, None) => None,
        _ => {
            return Err(ConfigError(format!(
                "{TLS_FIELD}: cert_file and key_file go together"
            )));
        }
    };
    Ok(ControlPlaneTls {
        ca_pem: read("ca_file", &raw.ca_file)?,
        identity,
        server_name: raw.server_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_names_every_replica_and_each_is_checked() {
        let config = NativeConfig::parse(
            br#"{"control_plane_uri": ["http://10.0.0.1:50051", "http://10.0.0.2:50051"]}"#,
        );
        assert_eq!(
            config.ok().map(|c| c.control_plane_uris),
            Some(vec![
                "http://10.0.0.1:50051".to_owned(),
                "http://10.0.0.2:50051".to_owned()
            ])
        );
        for bad in [
            &br#"{"control_plane_uri": []}"#[..],
            br#"{"control_plane_uri": ["http://10.0.0.1:1", 7]}"#,
            br#"{"control_plane_uri": ["http://10.0.0.1:1", "grpc://x:1"]}"#,
        ] {
            let err = NativeConfig::parse(bad).err().map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|m| m.contains("control_plane_uri")),
                "{err:?}"
            );
        }
    }

    #[test]
    fn the_wasm_filters_fields_pass_through_and_the_cluster_is_optional() {
        let config = NativeConfig::parse(
            br#"{"control_plane_uri": "http://127.0.0.1:18000",
                 "bucket_key": [{"source": "header", "name": "x-tenant"}],
                 "report_interval_ms": 100}"#,
        );
        let config = config.ok();
        assert_eq!(
            config
                .as_ref()
                .map(|c| c.control_plane_uris.join(","))
                .as_deref(),
            Some("http://127.0.0.1:18000")
        );
        assert_eq!(config.map(|c| c.filter.report_interval_ms), Some(100));
    }

    #[test]
    fn errors_name_the_field() {
        let message = |json: &[u8]| NativeConfig::parse(json).err().map(|e| e.to_string());
        assert!(message(b"{}").is_some_and(|m| m.contains("control_plane_uri")));
        assert!(
            message(br#"{"control_plane_uri": "grpc://x:1"}"#)
                .is_some_and(|m| m.contains("control_plane_uri"))
        );
        assert!(
            message(br#"{"control_plane_uri": "http://127.0.0.1:1", "report_interval_ms": 1}"#)
                .is_some_and(|m| m.contains("report_interval_ms"))
        );
        assert!(message(b"[").is_some());
        assert!(
            message(br#"{"control_plane_uri": "https://127.0.0.1:1"}"#)
                .is_some_and(|m| m.contains("needs control_plane_tls"))
        );
        assert!(
            message(
                br#"{"control_plane_uri": "https://127.0.0.1:1",
                     "control_plane_tls": {"ca_file": "/nonexistent/ca.pem"}}"#
            )
            .is_some_and(|m| m.contains("control_plane_tls.ca_file"))
        );
        assert!(
            message(
                br#"{"control_plane_uri": "https://127.0.0.1:1",
                     "control_plane_tls": {"ca": "x"}}"#
            )
            .is_some_and(|m| m.contains("control_plane_tls"))
        );
    }
}
