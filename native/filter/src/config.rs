//! The module's configuration: the wasm filter's JSON plus the one field a
//! native module needs in addition, `control_plane_uri`.

use sluice_filter::config::FilterConfig;

/// Field naming where the control plane listens (the module dials it itself).
const URI_FIELD: &str = "control_plane_uri";
/// `control_plane_cluster` is required by the wasm filter's schema; the
/// native module does not use Envoy's clusters, so a missing one is filled in.
const CLUSTER_FIELD: &str = "control_plane_cluster";
const DEFAULT_CLUSTER: &str = "sluice_control_plane";

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    /// Everything the wasm filter's configuration holds, validated by it.
    pub filter: FilterConfig,
    /// `http://HOST:PORT` of the control plane's gRPC listener.
    pub control_plane_uri: String,
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
        let uri = match object.remove(URI_FIELD) {
            Some(serde_json::Value::String(uri)) => uri,
            Some(other) => {
                return Err(ConfigError(format!(
                    "{URI_FIELD}: expected a string like \"http://127.0.0.1:18000\", got {other}"
                )));
            }
            None => {
                return Err(ConfigError(format!(
                    "{URI_FIELD}: required (the control plane's gRPC address, e.g. \
                     \"http://127.0.0.1:18000\")"
                )));
            }
        };
        let control_plane_uri = validate_uri(&uri)?;
        object
            .entry(CLUSTER_FIELD)
            .or_insert_with(|| serde_json::Value::String(DEFAULT_CLUSTER.to_owned()));
        let bytes = serde_json::to_vec(&object)
            .map_err(|error| ConfigError(format!("cannot re-encode: {error}")))?;
        let filter =
            FilterConfig::from_json(&bytes).map_err(|error| ConfigError(error.to_string()))?;
        if filter.classifier.uses_route_name() {
            return Err(ConfigError(
                "bucket_key: the route name is not available to the native module yet; \
                 use headers"
                    .to_owned(),
            ));
        }
        Ok(Self {
            filter,
            control_plane_uri,
        })
    }
}

fn validate_uri(uri: &str) -> Result<String, ConfigError> {
    let parsed: Result<tonic::transport::Uri, _> = uri.parse();
    match parsed {
        Ok(parsed) if parsed.scheme_str() == Some("http") && parsed.authority().is_some() => {
            Ok(uri.to_owned())
        }
        _ => Err(ConfigError(format!(
            "{URI_FIELD}: {uri:?} is not an http://HOST:PORT address"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wasm_filters_fields_pass_through_and_the_cluster_is_optional() {
        let config = NativeConfig::parse(
            br#"{"control_plane_uri": "http://127.0.0.1:18000",
                 "bucket_key": [{"source": "header", "name": "x-tenant"}],
                 "report_interval_ms": 100}"#,
        );
        let config = config.ok();
        assert_eq!(
            config.as_ref().map(|c| c.control_plane_uri.as_str()),
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
    }
}
