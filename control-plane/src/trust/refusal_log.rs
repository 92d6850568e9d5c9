//! Logs a refused peer once, not once per attempt: a misconfigured Envoy
//! retries every few seconds and would otherwise fill the log.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Peers already logged; bounded, after which refusals go to debug.
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    seen: Mutex<HashSet<String>>,
}

impl RefusalLog {
    /// Most distinct peers remembered.
    pub(crate) const CAPACITY: usize = 1_024;

    /// Whether this is the first refusal of `peer` (and it should be
    /// logged at warning level).
    pub(crate) fn first(&self, peer: &str) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(peer) || seen.len() >= Self::CAPACITY {
            return false;
        }
        seen.insert(peer.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_once_and_bounded() {
        let log = RefusalLog::default();
        assert!(log.first("a"));
        assert!(!log.first("a"));
        for i in 0..RefusalLog::CAPACITY * 2 {
            let _ = log.first(&format!("p{i}"));
        }
        assert!(!log.first("new"));
    }
}
