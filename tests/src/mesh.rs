//! How Istio and Envoy Gateway deliver the filter to Envoy, mirrored from
//! their sources, so that tests can feed a real Envoy exactly what they
//! would send: deploy/'s WasmPlugin through ECDS as istiod builds it, and
//! deploy/'s EnvoyExtensionPolicies (wasm and native module) inlined as
//! Envoy Gateway builds them.
//!
//! Istio (istio/istio, master of 2026-08):
//! - a WasmPlugin becomes a TrafficExtension named `<name>~istio-translated-wasmplugin`
//!   (`pilot/pkg/config/kube/extensions/translate.go`), whose ECDS resource
//!   is named `extensions.istio.io/trafficextension/<namespace>.<that name>`
//!   (`pilot/pkg/model/extensions.go`, `convertToTrafficExtensionWrapper`);
//! - the resource is an `envoy.extensions.filters.http.wasm.v3.Wasm` whose
//!   `PluginConfig` has `name` `<namespace>.<name>`, `root_id` = `pluginName`,
//!   `configuration` = a `google.protobuf.StringValue` holding `pluginConfig`
//!   as JSON (an empty `Any` when it has no fields), the V8 runtime, **no
//!   `vm_id`**, `vm_config.environment_variables` holding
//!   `ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION`, and `failure_policy` from
//!   `failStrategy` (unset when the WasmPlugin sets none, which Envoy takes
//!   as FAIL_CLOSED) (`pilot/pkg/model/extensions.go`, `buildWasmConfig`,
//!   `buildVMConfig`);
//! - a `file://` URL becomes `code.local.filename` (`buildDataSource`);
//!   other URLs are fetched by the Istio agent, which substitutes the same
//!   local file (`pkg/istio-agent/xds_proxy.go`, `pkg/wasm/convert.go`);
//! - the listener's HTTP filter is named as the resource and points at it
//!   with `config_discovery`: `config_source: {ads: {}}`, V3, an
//!   `initial_fetch_timeout` of 0 (the listener waits for it), type URLs
//!   of the wasm and RBAC HTTP filters
//!   (`pilot/pkg/networking/core/extension/extensionfilter.go`);
//! - a sidecar's node id is `sidecar~<IP>~<pod>.<namespace>~<namespace>.svc.cluster.local`,
//!   and the control plane's Service port named `grpc` gives the cluster
//!   `outbound|50051||sluice.sluice-system.svc.cluster.local`, HTTP/2.
//!
//! Envoy Gateway (envoyproxy/gateway v1.8–1.9,
//! `internal/xds/translator/wasm.go` and
//! `internal/gatewayapi/envoyextensionpolicy.go`): the filter is inlined
//! (no ECDS) into the listener, named `envoy.filters.http.wasm/<ir name>`,
//! disabled there and enabled per route; `vm_id` is the IR name
//! `envoyextensionpolicy/<namespace>/<policy>/wasm/<index>`, so each wasm
//! extension has VMs of its own; `configuration` is a StringValue of the
//! JSON `config`; `root_id` is `rootID`; the code is fetched from Envoy
//! Gateway's own HTTP server (cluster `wasm_cluster`) with its sha256;
//! `fail_open` is `failOpen`. A `dynamicModule` entry
//! (`internal/xds/translator/dynamicmodule.go`, `buildDynamicModules`)
//! becomes a `DynamicModuleFilter` named
//! `envoy.filters.http.dynamic_modules/envoyextensionpolicy/<namespace>/<policy>/dynamic-module/<index>`,
//! inlined, disabled and enabled per route alike, its `filter_name` the
//! entry's `filterName`, its `filter_config` a StringValue of the JSON
//! `config`, and its module the EnvoyProxy allow-list entry's local path
//! as `dynamic_module_config.module.local.filename`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result, bail};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AsyncDataSource, DataSource, HttpUri, RemoteDataSource, SocketAddress,
    TypedExtensionConfig, address, async_data_source, data_source, http_uri, socket_address,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, FilterConfig, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilter;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::wasm::v3::{
    EnvironmentVariables, FailurePolicy, PluginConfig, VmConfig, plugin_config,
};
use envoy_types::pb::google::protobuf::{Any, Duration as ProtoDuration, StringValue};
use http_body_util::Full;
use hyper::Response;
use hyper::body::Bytes;
use prost::{Message, Name};
use serde_json::Value as Json;
use serde_yaml_ng::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::paths;
use crate::xds::to_any;

/// The cluster Istio gives sidecars for the control plane's Service.
pub const ISTIO_CONTROL_PLANE_CLUSTER: &str =
    "outbound|50051||sluice.sluice-system.svc.cluster.local";
/// The environment variable istiod sets in every wasm VM it configures.
pub const ISTIO_RESOURCE_VERSION_ENV: &str = "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION";
/// What istiod appends to a WasmPlugin's name when it translates it.
const ISTIO_TRANSLATED_MARKER: &str = "~istio-translated-wasmplugin";
/// The prefix of istiod's ECDS resource names.
const ISTIO_RESOURCE_PREFIX: &str = "extensions.istio.io/trafficextension/";
/// istiod's only wasm runtime.
const V8: &str = "envoy.wasm.runtime.v8";
/// The cluster istiod gives a sidecar for its pod's application port.
const ISTIO_INBOUND_APP_CLUSTER: &str = "inbound|8000||";
/// The cluster the Istio bootstrap names for istiod's xDS.
const XDS_CLUSTER: &str = "xds-grpc";

/// A WasmPlugin, as read from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct WasmPlugin {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.pluginName` (empty when unset).
    pub plugin_name: String,
    /// `spec.pluginConfig` (an empty object when unset).
    pub plugin_config: Json,
    /// `spec.failStrategy`, when set.
    pub fail_strategy: Option<String>,
    /// `metadata.resourceVersion`, which the API server sets on every change.
    pub resource_version: String,
    /// `spec.selector.matchLabels`: the labels of the pods it applies to.
    pub selector: BTreeMap<String, String>,
}

impl WasmPlugin {
    /// Reads the WasmPlugin in `text` (a manifest with one document).
    pub fn from_manifest(text: &str) -> Result<Self> {
        let value: Value = serde_yaml_ng::from_str(text).context("the manifest is not YAML")?;
        let json: Json = serde_json::to_value(&value).context("the manifest is not JSON-like")?;
        if at(&json, "/kind") != "WasmPlugin" {
            bail!("not a WasmPlugin: kind {}", at(&json, "/kind"));
        }
        let text_at = |pointer: &str| {
            json.pointer(pointer)
                .and_then(Json::as_str)
                .map(str::to_owned)
        };
        Ok(Self {
            namespace: text_at("/metadata/namespace").context("metadata.namespace")?,
            name: text_at("/metadata/name").context("metadata.name")?,
            plugin_name: text_at("/spec/pluginName").unwrap_or_default(),
            plugin_config: json
                .pointer("/spec/pluginConfig")
                .cloned()
                .unwrap_or_else(|| Json::Object(serde_json::Map::new())),
            fail_strategy: text_at("/spec/failStrategy"),
            resource_version: text_at("/metadata/resourceVersion").unwrap_or_else(|| "1".into()),
            selector: json
                .pointer("/spec/selector/matchLabels")
                .and_then(Json::as_object)
                .map(|labels| {
                    labels
                        .iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// Reads `deploy/<relative>`.
    pub fn from_repo(relative: &str) -> Result<Self> {
        let path = paths::from_root(Path::new("deploy").join(relative))?;
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_manifest(&text).with_context(|| path.display().to_string())
    }

    /// The name istiod gives the translated TrafficExtension.
    fn translated_name(&self) -> String {
        format!("{}{ISTIO_TRANSLATED_MARKER}", self.name)
    }

    /// The ECDS resource name, which is also the listener filter's name.
    pub fn resource_name(&self) -> String {
        format!(
            "{ISTIO_RESOURCE_PREFIX}{}.{}",
            self.namespace,
            self.translated_name()
        )
    }

    /// `pluginConfig` as istiod serializes it: compact JSON, keys sorted
    /// (protobuf's JSON form of a Struct).
    pub fn configuration_json(&self) -> Result<String> {
        serde_json::to_string(&self.plugin_config).context("pluginConfig is not serializable")
    }

    /// The ECDS resource istiod sends for this plugin, with the module at
    /// `wasm` (a `file://` URL's path, or what the Istio agent fetched).
    pub fn extension_config(&self, wasm: &Path) -> Result<TypedExtensionConfig> {
        let has_fields = self
            .plugin_config
            .as_object()
            .is_some_and(|o| !o.is_empty());
        let configuration = if has_fields {
            to_any(&StringValue {
                value: self.configuration_json()?,
            })
        } else {
            Any::default()
        };
        let failure_policy = match self.fail_strategy.as_deref() {
            None => FailurePolicy::Unspecified,
            Some("FAIL_CLOSE") => FailurePolicy::FailClosed,
            Some("FAIL_OPEN") => FailurePolicy::FailOpen,
            Some("FAIL_RELOAD") => FailurePolicy::FailReload,
            Some(other) => bail!("unknown failStrategy {other}"),
        };
        let mut environment = EnvironmentVariables::default();
        environment.key_values.insert(
            ISTIO_RESOURCE_VERSION_ENV.to_owned(),
            self.resource_version.clone(),
        );
        let wasm = Wasm {
            config: Some(PluginConfig {
                name: format!("{}.{}", self.namespace, self.translated_name()),
                root_id: self.plugin_name.clone(),
                configuration: Some(configuration),
                failure_policy: failure_policy.into(),
                vm: Some(plugin_config::Vm::VmConfig(VmConfig {
                    runtime: V8.to_owned(),
                    code: Some(local_file(wasm)),
                    environment_variables: Some(environment),
                    ..VmConfig::default()
                })),
                ..PluginConfig::default()
            }),
        };
        Ok(TypedExtensionConfig {
            name: self.resource_name(),
            typed_config: Some(to_any(&wasm)),
        })
    }

    /// The same plugin with another `pluginConfig` and the next resource
    /// version, as after a `kubectl apply` of an edited manifest.
    pub fn updated(&self, plugin_config: Json) -> Self {
        let version = self.resource_version.parse::<u64>().unwrap_or(1) + 1;
        Self {
            plugin_config,
            resource_version: version.to_string(),
            ..self.clone()
        }
    }
}

fn local_file(path: &Path) -> AsyncDataSource {
    AsyncDataSource {
        specifier: Some(async_data_source::Specifier::Local(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.display().to_string())),
            ..DataSource::default()
        })),
    }
}

/// What an Istio proxy runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    /// A pod's sidecar (node id `sidecar~…`, an inbound listener).
    Sidecar,
    /// A gateway of its own deployment (node id `router~…`).
    Gateway,
}

/// An Istio proxy without the Istio agent, as istiod knows it: a sidecar,
/// or a gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sidecar {
    /// Sidecar or gateway.
    pub kind: ProxyKind,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod's application, which the inbound route forwards to; `None`:
    /// the route answers 200 itself.
    pub app: Option<SocketAddr>,
}

impl Sidecar {
    /// A sidecar of pod `pod` in `namespace`, labelled `app: <pod>`, whose
    /// inbound route answers 200 itself.
    pub fn new(pod: &str, namespace: &str) -> Self {
        Self {
            kind: ProxyKind::Sidecar,
            pod: pod.to_owned(),
            namespace: namespace.to_owned(),
            labels: [("app".to_owned(), pod.to_owned())].into_iter().collect(),
            app: None,
        }
    }

    /// The node id the Istio agent gives Envoy.
    pub fn node_id(&self) -> String {
        let kind = match self.kind {
            ProxyKind::Sidecar => "sidecar",
            ProxyKind::Gateway => "router",
        };
        format!(
            "{kind}~127.0.0.1~{pod}.{ns}~{ns}.svc.cluster.local",
            pod = self.pod,
            ns = self.namespace
        )
    }

    /// An Envoy bootstrap for this sidecar: ADS to `xds`, the control
    /// plane's cluster as Istio names it, and one inbound listener whose
    /// HTTP filters are the ECDS resources `extensions` (in order), then
    /// the router, forwarding to the pod's application (the cluster Istio
    /// names `inbound|<port>||`) or answering 200 itself.
    pub fn bootstrap(
        &self,
        xds: SocketAddr,
        control_plane: SocketAddr,
        extensions: &[String],
    ) -> Result<Value> {
        let mut filters: Vec<Json> = extensions
            .iter()
            .map(|name| {
                serde_json::json!({
                    "name": name,
                    "config_discovery": {
                        "config_source": {
                            "ads": {},
                            "initial_fetch_timeout": "0s",
                            "resource_api_version": "V3",
                        },
                        "type_urls": [
                            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                            "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
                        ],
                    },
                })
            })
            .collect();
        filters.push(router());
        let mut clusters = vec![
            http2_cluster(XDS_CLUSTER, xds),
            http2_cluster(ISTIO_CONTROL_PLANE_CLUSTER, control_plane),
        ];
        let route = match self.app {
            Some(app) => {
                clusters.push(http1_cluster(ISTIO_INBOUND_APP_CLUSTER, app));
                serde_json::json!({"cluster": ISTIO_INBOUND_APP_CLUSTER})
            }
            None => Json::Null,
        };
        // A gateway's listener is named after its address and port.
        let listener_name = match self.kind {
            ProxyKind::Sidecar => "virtualInbound",
            ProxyKind::Gateway => "0.0.0.0_8080",
        };
        let bootstrap = serde_json::json!({
            "node": {
                "id": self.node_id(),
                "cluster": format!("{}.{}", self.pod, self.namespace),
                "metadata": {
                    "NAMESPACE": self.namespace,
                    "LABELS": self.labels,
                    "ISTIO_VERSION": "1.30.0",
                    "CLUSTER_ID": "Kubernetes",
                    "INTERCEPTION_MODE": "NONE",
                },
            },
            "admin": admin(),
            "dynamic_resources": {
                "ads_config": {
                    "api_type": "GRPC",
                    "transport_api_version": "V3",
                    "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
                    "set_node_on_first_message_only": true,
                },
            },
            "static_resources": {
                "clusters": clusters,
                "listeners": [listener(listener_name, filters, route)],
            },
        });
        serde_json::from_value(bootstrap).context("the sidecar bootstrap")
    }
}

/// One entry of an EnvoyExtensionPolicy's `spec.wasm`, as read from a
/// manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayWasm {
    /// The policy's namespace.
    pub namespace: String,
    /// The policy's name.
    pub policy: String,
    /// The entry's index in `spec.wasm`.
    pub index: usize,
    /// `name`.
    pub name: String,
    /// `rootID`, when set.
    pub root_id: Option<String>,
    /// `config` (JSON).
    pub config: Json,
    /// `failOpen`.
    pub fail_open: bool,
}

impl GatewayWasm {
    /// Every `spec.wasm` entry of the EnvoyExtensionPolicy in `text`.
    pub fn from_manifest(text: &str) -> Result<Vec<Self>> {
        let (namespace, policy, entries) = extension_policy_entries(text, "wasm")?;
        entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                Ok(Self {
                    namespace: namespace.clone(),
                    policy: policy.clone(),
                    index,
                    name: at(entry, "/name")
                        .as_str()
                        .context("wasm[].name")?
                        .to_owned(),
                    root_id: at(entry, "/rootID").as_str().map(str::to_owned),
                    config: at(entry, "/config").clone(),
                    fail_open: at(entry, "/failOpen").as_bool().unwrap_or(false),
                })
            })
            .collect()
    }

    /// Reads `deploy/<relative>`.
    pub fn from_repo(relative: &str) -> Result<Vec<Self>> {
        let text = read_deploy(relative)?;
        Self::from_manifest(&text).with_context(|| relative.to_owned())
    }

    /// Envoy Gateway's IR name of the extension: its VMs' `vm_id`.
    pub fn vm_id(&self) -> String {
        format!(
            "envoyextensionpolicy/{}/{}/wasm/{}",
            self.namespace, self.policy, self.index
        )
    }

    /// The HTTP filter's name.
    pub fn filter_name(&self) -> String {
        format!("envoy.filters.http.wasm/{}", self.vm_id())
    }

    /// The gateway's listener as Envoy Gateway sends it over LDS: the
    /// filter inlined, disabled on the listener and enabled on the route,
    /// its code fetched from `module_server` (the cluster `wasm_cluster`)
    /// and checked against `sha256`. The route answers 200 itself, or
    /// with `backend` forwards to that cluster (an HTTPRoute's backend,
    /// [`GATEWAY_BACKEND_CLUSTER`]).
    pub fn listener(
        &self,
        module_server: SocketAddr,
        sha256: &str,
        backend: Option<&str>,
    ) -> Result<Listener> {
        #[allow(deprecated)] // `fail_open`: what Envoy Gateway sets.
        let plugin = PluginConfig {
            name: self.name.clone(),
            root_id: self.root_id.clone().unwrap_or_default(),
            configuration: Some(to_any(&StringValue {
                value: serde_json::to_string(&self.config)?,
            })),
            fail_open: self.fail_open,
            vm: Some(plugin_config::Vm::VmConfig(VmConfig {
                vm_id: self.vm_id(),
                runtime: V8.to_owned(),
                code: Some(AsyncDataSource {
                    specifier: Some(async_data_source::Specifier::Remote(RemoteDataSource {
                        http_uri: Some(HttpUri {
                            uri: format!("http://{module_server}/{sha256}.wasm"),
                            timeout: Some(ProtoDuration {
                                seconds: 10,
                                nanos: 0,
                            }),
                            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(
                                WASM_CLUSTER.to_owned(),
                            )),
                        }),
                        sha256: sha256.to_owned(),
                        ..RemoteDataSource::default()
                    })),
                }),
                ..VmConfig::default()
            })),
            ..PluginConfig::default()
        };
        let wasm_filter = HttpFilter {
            name: self.filter_name(),
            disabled: true,
            config_type: Some(http_filter::ConfigType::TypedConfig(to_any(&Wasm {
                config: Some(plugin),
            }))),
            ..HttpFilter::default()
        };
        Ok(gateway_listener(wasm_filter, backend))
    }
}

/// One entry of an EnvoyExtensionPolicy's `spec.dynamicModule`, as read
/// from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayDynamicModule {
    /// The policy's namespace.
    pub namespace: String,
    /// The policy's name.
    pub policy: String,
    /// The entry's index in `spec.dynamicModule`.
    pub index: usize,
    /// `name`: the EnvoyProxy allow-list entry it loads.
    pub name: String,
    /// `filterName`: the filter within the module.
    pub filter_name: String,
    /// `config` (JSON).
    pub config: Json,
}

impl GatewayDynamicModule {
    /// Every `spec.dynamicModule` entry of the EnvoyExtensionPolicy in
    /// `text`.
    pub fn from_manifest(text: &str) -> Result<Vec<Self>> {
        let (namespace, policy, entries) = extension_policy_entries(text, "dynamicModule")?;
        entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                let field = |name: &str| {
                    at(entry, &format!("/{name}"))
                        .as_str()
                        .map(str::to_owned)
                        .with_context(|| format!("dynamicModule[].{name}"))
                };
                Ok(Self {
                    namespace: namespace.clone(),
                    policy: policy.clone(),
                    index,
                    name: field("name")?,
                    filter_name: field("filterName")?,
                    config: at(entry, "/config").clone(),
                })
            })
            .collect()
    }

    /// Reads `deploy/<relative>`.
    pub fn from_repo(relative: &str) -> Result<Vec<Self>> {
        let text = read_deploy(relative)?;
        Self::from_manifest(&text).with_context(|| relative.to_owned())
    }

    /// The HTTP filter's name: Envoy Gateway's IR name of the extension
    /// behind the filter type.
    pub fn http_filter_name(&self) -> String {
        format!(
            "envoy.filters.http.dynamic_modules/envoyextensionpolicy/{}/{}/dynamic-module/{}",
            self.namespace, self.policy, self.index
        )
    }

    /// The gateway's listener as Envoy Gateway sends it over LDS: the
    /// `DynamicModuleFilter` inlined, disabled on the listener and enabled
    /// on the route, loading the module file at `module_path` (the
    /// allow-list entry's local path, as `module.local.filename`), the
    /// configuration a JSON StringValue.
    pub fn listener(&self, module_path: &Path, backend: Option<&str>) -> Result<Listener> {
        let filter = DynamicModuleFilter {
            filter_name: self.filter_name.clone(),
            filter_config: Some(to_any(&StringValue {
                value: serde_json::to_string(&self.config)?,
            })),
            ..DynamicModuleFilter::default()
        };
        let mut value = filter.encode_to_vec();
        // `dynamic_module_config` (field 1) holding only `module` (field 6),
        // which Envoy 1.40 has and envoy-types does not yet: encoded by
        // hand, as Envoy Gateway's go-control-plane encodes it.
        let module = AsyncDataSource {
            specifier: Some(async_data_source::Specifier::Local(DataSource {
                specifier: Some(data_source::Specifier::Filename(
                    module_path.display().to_string(),
                )),
                ..DataSource::default()
            })),
        };
        let mut config = Vec::new();
        prost::encoding::message::encode(DYNAMIC_MODULE_CONFIG_MODULE_FIELD, &module, &mut config);
        prost::encoding::bytes::encode(DYNAMIC_MODULE_FILTER_CONFIG_FIELD, &config, &mut value);
        let filter = HttpFilter {
            name: self.http_filter_name(),
            disabled: true,
            config_type: Some(http_filter::ConfigType::TypedConfig(Any {
                type_url: DynamicModuleFilter::type_url(),
                value,
            })),
            ..HttpFilter::default()
        };
        Ok(gateway_listener(filter, backend))
    }
}

/// `DynamicModuleFilter.dynamic_module_config`'s field number.
const DYNAMIC_MODULE_FILTER_CONFIG_FIELD: u32 = 1;
/// `DynamicModuleConfig.module`'s field number (Envoy 1.40).
const DYNAMIC_MODULE_CONFIG_MODULE_FIELD: u32 = 6;

/// The local path of the dynamic module the EnvoyProxy manifest in
/// `text` allow-lists as `name` (`spec.dynamicModules[].source.local.path`).
pub fn envoy_proxy_dynamic_module_path(text: &str, name: &str) -> Result<String> {
    let json = manifest_json(text)?;
    let entry = at(&json, "/spec/dynamicModules")
        .as_array()
        .and_then(|entries| entries.iter().find(|entry| at(entry, "/name") == name))
        .with_context(|| format!("no dynamic module {name:?} on the EnvoyProxy's allow-list"))?;
    at(entry, "/source/local/path")
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("the allow-list entry {name:?} has no local path"))
}

/// The gateway's listener as Envoy Gateway sends it over LDS: `filter`
/// inlined, disabled on the listener (as given) and enabled on the route
/// (Envoy Gateway's `enableFilterOnRoute`), then the router. The route
/// answers 200 itself, or with `backend` forwards to that cluster.
fn gateway_listener(filter: HttpFilter, backend: Option<&str>) -> Listener {
    let router = HttpFilter {
        name: "envoy.filters.http.router".to_owned(),
        config_type: Some(http_filter::ConfigType::TypedConfig(to_any(
            &Router::default(),
        ))),
        ..HttpFilter::default()
    };
    let action = match backend {
        Some(cluster) => route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.to_owned())),
            ..RouteAction::default()
        }),
        None => route::Action::DirectResponse(DirectResponseAction {
            status: 200,
            ..DirectResponseAction::default()
        }),
    };
    let route = Route {
        name: "httproute/default/backend/rule/0".to_owned(),
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_owned())),
            ..RouteMatch::default()
        }),
        action: Some(action),
        // Envoy Gateway's `enableFilterOnRoute`: a FilterConfig with an
        // empty `Any` (without one Envoy refuses the route).
        typed_per_filter_config: [(
            filter.name.clone(),
            to_any(&FilterConfig {
                config: Some(Any::default()),
                ..FilterConfig::default()
            }),
        )]
        .into_iter()
        .collect(),
        ..Route::default()
    };
    let manager = HttpConnectionManager {
        stat_prefix: "http-10080".to_owned(),
        route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
            name: "default/eg/http".to_owned(),
            virtual_hosts: vec![VirtualHost {
                name: "default/eg/http/www_example_com".to_owned(),
                domains: vec!["*".to_owned()],
                routes: vec![route],
                ..VirtualHost::default()
            }],
            ..RouteConfiguration::default()
        })),
        http_filters: vec![filter, router],
        ..HttpConnectionManager::default()
    };
    Listener {
        name: GATEWAY_LISTENER.to_owned(),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: "127.0.0.1".to_owned(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
                ..SocketAddress::default()
            })),
        }),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".to_owned(),
                config_type: Some(filter::ConfigType::TypedConfig(to_any(&manager))),
            }],
            ..FilterChain::default()
        }],
        ..Listener::default()
    }
}

/// The name of the gateway's listener.
pub const GATEWAY_LISTENER: &str = "default/eg/http";
/// The cluster of Envoy Gateway's module server.
const WASM_CLUSTER: &str = "wasm_cluster";
/// The type URL of LDS resources.
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// The cluster of an HTTPRoute's backend, as Envoy Gateway names it.
pub const GATEWAY_BACKEND_CLUSTER: &str = "httproute/default/backend/rule/0";

/// An Envoy bootstrap as Envoy Gateway gives its Envoys: node `node_id`,
/// listeners over ADS from `xds`, and the static `clusters` (from
/// [`gateway_module_server_cluster`], [`gateway_control_plane_cluster`],
/// [`gateway_backend_cluster`]).
pub fn gateway_bootstrap(node_id: &str, xds: SocketAddr, clusters: Vec<Json>) -> Result<Value> {
    let mut clusters = clusters;
    clusters.insert(0, http2_cluster(XDS_CLUSTER, xds));
    let bootstrap = serde_json::json!({
        "node": {"id": node_id, "cluster": "envoy-gateway-system/eg"},
        "admin": admin(),
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": XDS_CLUSTER}}],
                "set_node_on_first_message_only": true,
            },
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
        },
        "static_resources": {"clusters": clusters},
    });
    serde_json::from_value(bootstrap).context("the gateway bootstrap")
}

/// The cluster of Envoy Gateway's module server, at `addr`.
pub fn gateway_module_server_cluster(addr: SocketAddr) -> Json {
    http1_cluster(WASM_CLUSTER, addr)
}

/// `cluster` (a cluster from the EnvoyProxy's bootstrap) pointed at the
/// control plane at `addr`.
pub fn gateway_control_plane_cluster(cluster: &Json, addr: SocketAddr) -> Result<Json> {
    let mut cluster = cluster.clone();
    point_cluster_at(&mut cluster, addr)?;
    Ok(cluster)
}

/// The route's backend cluster [`GATEWAY_BACKEND_CLUSTER`] at `addr`
/// (Envoy Gateway sends it over CDS; what the filter meets is the same).
pub fn gateway_backend_cluster(addr: SocketAddr) -> Json {
    http1_cluster(GATEWAY_BACKEND_CLUSTER, addr)
}

/// The value of the response header `name` on the first 429 among up to
/// 100 requests for `tenant` to `url`, each on a new connection (so after a
/// listener update they reach the new listener); fails if none is a 429.
pub async fn header_of_a_429(url: &str, tenant: &str, name: &str) -> Result<Option<String>> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .context("cannot build an HTTP client")?;
    for _ in 0..100 {
        let response = client
            .get(url)
            .header(crate::load::TENANT_HEADER, tenant)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Ok(response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned));
        }
    }
    bail!("no 429 in 100 requests for {tenant} to {url}")
}

/// The clusters in an EnvoyProxy manifest's `spec.bootstrap.value`.
pub fn envoy_proxy_bootstrap_clusters(text: &str) -> Result<Vec<Json>> {
    let value: Value = serde_yaml_ng::from_str(text).context("the manifest is not YAML")?;
    let json: Json = serde_json::to_value(&value)?;
    let bootstrap = json
        .pointer("/spec/bootstrap/value")
        .and_then(Json::as_str)
        .context("spec.bootstrap.value")?;
    let bootstrap: Value =
        serde_yaml_ng::from_str(bootstrap).context("bootstrap.value is not YAML")?;
    let bootstrap: Json = serde_json::to_value(&bootstrap)?;
    Ok(bootstrap
        .pointer("/static_resources/clusters")
        .and_then(Json::as_array)
        .cloned()
        .unwrap_or_default())
}

/// Points a cluster's one endpoint at `addr` (a loopback test server) and
/// drops its TLS (the tests' control plane serves plaintext on loopback).
fn point_cluster_at(cluster: &mut Json, addr: SocketAddr) -> Result<()> {
    let socket = cluster
        .pointer_mut("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
        .context("the cluster has no endpoint address")?;
    let socket = socket
        .as_object_mut()
        .context("the endpoint's socket_address is not an object")?;
    socket.insert("address".into(), Json::String(addr.ip().to_string()));
    socket.insert("port_value".into(), Json::from(addr.port()));
    if let Some(cluster) = cluster.as_object_mut() {
        cluster.insert("type".into(), Json::String("STATIC".into()));
        cluster.remove("transport_socket");
    }
    Ok(())
}

/// An EnvoyExtensionPolicy manifest's namespace, name and the entries of
/// its `spec.<list>`.
fn extension_policy_entries(text: &str, list: &str) -> Result<(String, String, Vec<Json>)> {
    let json = manifest_json(text)?;
    if at(&json, "/kind") != "EnvoyExtensionPolicy" {
        bail!("not an EnvoyExtensionPolicy: kind {}", at(&json, "/kind"));
    }
    let field = |pointer: &str| {
        at(&json, pointer)
            .as_str()
            .map(str::to_owned)
            .with_context(|| pointer.to_owned())
    };
    let entries = at(&json, &format!("/spec/{list}"))
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok((
        field("/metadata/namespace")?,
        field("/metadata/name")?,
        entries,
    ))
}

/// A manifest's YAML as JSON.
fn manifest_json(text: &str) -> Result<Json> {
    let value: Value = serde_yaml_ng::from_str(text).context("the manifest is not YAML")?;
    serde_json::to_value(&value).context("the manifest is not JSON-like")
}

/// The text of `deploy/<relative>`.
fn read_deploy(relative: &str) -> Result<String> {
    let path = paths::from_root(Path::new("deploy").join(relative))?;
    std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
}

/// The value at `pointer` in `json`, `null` when absent.
fn at<'a>(json: &'a Json, pointer: &str) -> &'a Json {
    json.pointer(pointer).unwrap_or(&Json::Null)
}

fn admin() -> Json {
    serde_json::json!({"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}})
}

fn router() -> Json {
    serde_json::json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    })
}

/// A static listener with `http_filters`, whose one route takes the
/// `route` action, or answers 200 itself when that is `null`.
fn listener(name: &str, http_filters: Vec<Json>, route: Json) -> Json {
    let route = if route.is_null() {
        serde_json::json!({
            "name": "default",
            "match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}},
        })
    } else {
        serde_json::json!({"name": "default", "match": {"prefix": "/"}, "route": route})
    };
    serde_json::json!({
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "inbound",
                "route_config": {
                    "name": "local",
                    "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}],
                },
                "http_filters": http_filters,
            },
        }]}],
    })
}

fn endpoint(name: &str, addr: SocketAddr) -> Json {
    serde_json::json!({
        "cluster_name": name,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
            "address": addr.ip().to_string(),
            "port_value": addr.port(),
        }}}}]}],
    })
}

fn http2_cluster(name: &str, addr: SocketAddr) -> Json {
    serde_json::json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            },
        },
        "load_assignment": endpoint(name, addr),
    })
}

fn http1_cluster(name: &str, addr: SocketAddr) -> Json {
    serde_json::json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": endpoint(name, addr),
    })
}

/// An HTTP server on loopback that answers every GET with one file: Envoy
/// Gateway's module server, from which its Envoys fetch the wasm code.
#[derive(Debug)]
pub struct ModuleServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl ModuleServer {
    /// Serves `bytes` on `127.0.0.1:0`.
    pub async fn start(bytes: Vec<u8>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind the module server")?;
        let addr = listener.local_addr()?;
        let body = Bytes::from(bytes);
        let task = tokio::spawn(crate::http_server::serve(listener, move |_request| {
            let body = Bytes::clone(&body);
            async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
        }));
        Ok(Self { addr, task })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ModuleServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn plugin() -> WasmPlugin {
        WasmPlugin::from_repo("istio/wasmplugin-sidecars.yaml").unwrap()
    }

    #[test]
    fn the_ecds_resource_is_what_istiod_builds() {
        let plugin = plugin();
        assert_eq!(
            plugin.resource_name(),
            "extensions.istio.io/trafficextension/istio-system.sluice~istio-translated-wasmplugin"
        );
        let resource = plugin
            .extension_config(Path::new("/x/plugin.wasm"))
            .unwrap();
        assert_eq!(resource.name, plugin.resource_name());
        let any = resource.typed_config.unwrap();
        assert_eq!(
            any.type_url,
            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
        );
        let config = Wasm::decode(any.value.as_slice()).unwrap().config.unwrap();
        assert_eq!(config.root_id, "sluice");
        assert_eq!(config.failure_policy, i32::from(FailurePolicy::FailReload));
        let Some(plugin_config::Vm::VmConfig(vm)) = config.vm else {
            panic!("no vm_config");
        };
        assert_eq!(vm.vm_id, "", "istiod never sets a vm_id");
        assert_eq!(vm.runtime, V8);
        assert!(
            vm.environment_variables
                .unwrap()
                .key_values
                .contains_key(ISTIO_RESOURCE_VERSION_ENV)
        );
        let configuration = config.configuration.unwrap();
        assert_eq!(
            configuration.type_url,
            "type.googleapis.com/google.protobuf.StringValue"
        );
        let json = StringValue::decode(configuration.value.as_slice())
            .unwrap()
            .value;
        let parsed: Json = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed, plugin.plugin_config);
        assert_eq!(parsed["control_plane_cluster"], ISTIO_CONTROL_PLANE_CLUSTER);
    }

    #[test]
    fn no_fail_strategy_leaves_envoys_default_fail_closed() {
        let mut plugin = plugin();
        plugin.fail_strategy = None;
        let any = plugin
            .extension_config(Path::new("/x/plugin.wasm"))
            .unwrap()
            .typed_config
            .unwrap();
        let config = Wasm::decode(any.value.as_slice()).unwrap().config.unwrap();
        assert_eq!(config.failure_policy, i32::from(FailurePolicy::Unspecified));
    }

    #[test]
    fn envoy_gateway_names_the_vm_after_the_extension() {
        let wasms = GatewayWasm::from_repo("envoy-gateway/extension-policy-wasm.yaml").unwrap();
        assert_eq!(wasms.len(), 1);
        assert_eq!(
            wasms[0].vm_id(),
            "envoyextensionpolicy/default/sluice/wasm/0"
        );
        assert_eq!(
            wasms[0].filter_name(),
            "envoy.filters.http.wasm/envoyextensionpolicy/default/sluice/wasm/0"
        );
    }
}
