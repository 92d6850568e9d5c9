//! The root context: configuration, the ticks and the control-plane stream
//! callbacks, all forwarded to the VM's [`Agent`].

use crate::envoy_host::{self, EnvoyHost, log, now_ms};
use crate::http::{PassThrough, SluiceHttp};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};
use sluice_agent::agent::Agent;
use sluice_agent::config::{FilterConfig, RequestPolicy};
use sluice_agent::identity::ProxyIdentity;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

pub(super) struct SluiceRoot {
    seed: u64,
    host: EnvoyHost,
    configured: Option<Configured>,
    /// Last clock reading, used if the host clock fails.
    last_now_ms: u64,
}

struct Configured {
    agent: Rc<RefCell<Agent>>,
    policy: Rc<RequestPolicy>,
}

impl SluiceRoot {
    pub(super) fn new(context_id: u32) -> Self {
        Self {
            seed: envoy_host::seed(context_id),
            host: EnvoyHost,
            configured: None,
            last_now_ms: 0,
        }
    }

    fn now_ms(&mut self) -> u64 {
        if let Some(now) = now_ms() {
            self.last_now_ms = now;
        }
        self.last_now_ms
    }

    /// Runs `f` on the agent, if configured and not already borrowed.
    fn with_agent(&mut self, f: impl FnOnce(&mut Agent, &mut EnvoyHost)) {
        if let Some(configured) = &self.configured
            && let Ok(mut agent) = configured.agent.try_borrow_mut()
        {
            f(&mut agent, &mut self.host);
        }
    }
}

impl Context for SluiceRoot {
    fn on_grpc_stream_message(&mut self, token_id: u32, message_size: usize) {
        let message = match hostcalls::get_buffer(BufferType::GrpcReceiveBuffer, 0, message_size) {
            Ok(message) => message.unwrap_or_default(),
            Err(status) => {
                log(
                    LogLevel::Warn,
                    &format!("cannot read a control-plane message: {status:?}"),
                );
                return;
            }
        };
        let now = self.now_ms();
        self.with_agent(|agent, host| agent.on_stream_message(host, token_id, &message, now));
    }

    fn on_grpc_stream_close(&mut self, token_id: u32, status_code: u32) {
        let now = self.now_ms();
        self.with_agent(|agent, host| agent.on_stream_close(host, token_id, status_code, now));
    }

    fn on_done(&mut self) -> bool {
        self.with_agent(|agent, host| agent.shut_down(host));
        true
    }
}

impl RootContext for SluiceRoot {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(
            BufferType::PluginConfiguration,
            0,
            plugin_configuration_size,
        ) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                log(
                    LogLevel::Error,
                    &format!("cannot read the plugin configuration: {status:?}"),
                );
                return false;
            }
        };
        let config = match FilterConfig::from_json(&bytes) {
            Ok(config) => config,
            Err(err) => {
                log(
                    LogLevel::Error,
                    &format!("invalid sluice plugin configuration: {err}"),
                );
                return false;
            }
        };
        let parts = config.into_parts(node_id, node_zone);
        if let Err(status) =
            hostcalls::set_tick_period(Duration::from_millis(parts.directive_poll_ms))
        {
            log(
                LogLevel::Error,
                &format!("cannot start the tick: {status:?}"),
            );
            return false;
        }
        // Envoy may configure a root context more than once: release the
        // previous agent's stream and lease before replacing it.
        self.with_agent(|agent, host| agent.shut_down(host));
        log(
            LogLevel::Debug,
            &format!(
                "configured: proxy {} reports to cluster {}",
                parts.agent.proxy_id, parts.agent.control_plane_cluster
            ),
        );
        self.configured = Some(Configured {
            agent: Rc::new(RefCell::new(Agent::new(parts.agent, self.seed))),
            policy: Rc::new(parts.request),
        });
        true
    }

    fn on_tick(&mut self) {
        let now = self.now_ms();
        self.with_agent(|agent, host| agent.on_tick(host, now));
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(match &self.configured {
            Some(configured) => Box::new(SluiceHttp {
                agent: Rc::clone(&configured.agent),
                policy: Rc::clone(&configured.policy),
                followed: None,
                charge: None,
            }),
            None => Box::new(PassThrough),
        })
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The Envoy node's locality zone (`--service-zone` or `node.locality`), the
/// proxy's failure domain unless the config names one; empty when unset.
fn node_zone() -> String {
    node_property(&["locality", "zone"]).unwrap_or_default()
}

/// The Envoy node id (`--service-node` or `node.id`; Istio names every
/// sidecar `sidecar~IP~pod.namespace~…`), which identifies the proxy unless
/// the config does; without one, the process's own name
/// ([`sluice_agent::identity`]).
fn node_id() -> ProxyIdentity {
    node_property(&["id"])
        .filter(|id| !id.is_empty())
        .map_or(ProxyIdentity::PerProcess, ProxyIdentity::Named)
}

/// A field of the Envoy node as text: `xds.node.…`, where Envoy 1.40 keeps
/// it (it answers nothing for the older `node.…`, which is still read after
/// it for older Envoys). Read as bytes; `None` when absent or not UTF-8
/// (a node id or zone like that names nothing).
fn node_property(field: &[&str]) -> Option<String> {
    let nodes: [&[&str]; 2] = [&["xds", "node"], &["node"]];
    nodes.into_iter().find_map(|node| {
        let path = node.iter().chain(field).copied().collect();
        let bytes = hostcalls::get_property(path).ok().flatten()?;
        String::from_utf8(bytes).ok()
    })
}
