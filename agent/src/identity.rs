//! Who the proxy is to the control plane: the configured `proxy_id`, else
//! Envoy's node id, else a name of the process's own, never one that two
//! Envoys share by default.
//!
//! Two live proxies with one name replace each other at the control plane,
//! and the fleet then admits up to twice its limit. The wasm filter cannot
//! read the host's name or process id, so an Envoy without a configured id
//! or node id is named after its process's instance id: a random number the
//! first leader VM draws and keeps in shared data (`sluice.v1.instance_id`),
//! which every VM of the process reads, so they all agree on the name. The
//! native module can read the host, and names itself after it
//! (`native/filter`). Either way the name changes when Envoy restarts, and
//! the leader warns once with how to set a stable one.

use std::fmt;

/// How the proxy names itself in `Hello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyIdentity {
    /// Named by the configuration's `proxy_id`, Envoy's node id, or (the
    /// native module) the host.
    Named(String),
    /// Nothing names it: the process's instance id does
    /// ([`process_proxy_id`]).
    PerProcess,
}

impl ProxyIdentity {
    /// The name, when something gave one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Named(name) => Some(name),
            Self::PerProcess => None,
        }
    }
}

impl fmt::Display for ProxyIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Named(name) => f.write_str(name),
            Self::PerProcess => f.write_str("(named after the Envoy process)"),
        }
    }
}

/// The name of an unnamed proxy whose process drew `instance_id`:
/// `envoy-` and 16 lower-case hex digits.
pub fn process_proxy_id(instance_id: u64) -> String {
    format!("envoy-{instance_id:016x}")
}

/// The warning a proxy that had to make up its name logs once.
pub fn made_up_name_warning(name: &str) -> String {
    format!(
        "no proxy_id in the configuration and no Envoy node id: this Envoy reports as {name}, \
         a name that changes when it restarts; set proxy_id in the filter's configuration, or \
         Envoy's node id (--service-node or node.id), for a stable one"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn process_names_differ_by_instance_and_keep_their_width() {
        assert_eq!(process_proxy_id(0x2a), "envoy-000000000000002a");
        assert_eq!(process_proxy_id(u64::MAX), "envoy-ffffffffffffffff");
        assert_ne!(process_proxy_id(1), process_proxy_id(2));
        assert_eq!(ProxyIdentity::Named("a".into()).name(), Some("a"));
        assert_eq!(ProxyIdentity::PerProcess.name(), None);
        assert!(made_up_name_warning("envoy-1").contains("proxy_id"));
    }
}
