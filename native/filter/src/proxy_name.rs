//! The module's name for a proxy whose configuration names none: the host
//! name, the process id and a random part, never a name two Envoys share.
//!
//! A dynamic module cannot read Envoy's node id, but unlike a wasm VM it
//! can read the host: the host name and process id say where the proxy
//! runs. They are not enough alone (containers on the host's network share
//! its name, and each runs Envoy as its process 1; one process may run two
//! configurations, each with a stream of its own), so a random part makes
//! the name unique. It changes when Envoy restarts or the configuration is
//! replaced; the module warns once with how to set a stable one
//! ([`sluice_agent::identity::made_up_name_warning`]).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// Most bytes of the host name kept in the proxy's name.
const MAX_HOST_BYTES: usize = 64;

/// The made-up name of this process's proxy: one random part per call.
pub fn made_up() -> String {
    let host = gethostname::gethostname();
    let random = RandomState::new().hash_one(std::process::id());
    compose(host.to_str(), std::process::id(), random)
}

/// `<host>-<pid>-<8 hex digits>`: the host name's letters, digits, `.` and
/// `-` (anything else becomes `-`; a missing or unreadable name is
/// `envoy`), cut to 64 bytes.
pub fn compose(host: Option<&str>, pid: u32, random: u64) -> String {
    let host: String = host
        .unwrap_or_default()
        .chars()
        .take(MAX_HOST_BYTES)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let host = if host.is_empty() { "envoy" } else { &host };
    format!("{host}-{pid}-{:08x}", random & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_where_and_differ_by_the_random_part() {
        assert_eq!(
            compose(Some("edge-1.example"), 7, 0xabcd_1234_5678),
            "edge-1.example-7-12345678"
        );
        assert_eq!(compose(None, 1, 1), "envoy-1-00000001");
        assert_eq!(compose(Some(""), 1, 1), "envoy-1-00000001");
        assert_eq!(compose(Some("a b/é"), 1, 1), "a-b---1-00000001");
        let long = "h".repeat(300);
        assert_eq!(compose(Some(&long), 1, 1).len(), MAX_HOST_BYTES + 11);
        assert_ne!(made_up(), made_up());
        assert!(made_up().contains(&format!("-{}-", std::process::id())));
    }
}
