//! The leader lease: which VM of the process owns the control-plane stream.
//!
//! The lease lives in one shared-data key ([`crate::shared::Lease`]). Every
//! VM reads it each tick and decides:
//! - its own lease: renew it (compare-and-swap on the value it read) and lead;
//! - someone else's unexpired lease: follow;
//! - absent, expired or unreadable: try to take it (compare-and-swap).
//!
//! A VM leads only after it has *read back* a lease naming it. This matters
//! because the host ignores the CAS token when the key does not exist yet,
//! so two VMs can both "win" the first write; the last writer's value is what
//! everybody reads next tick, so exactly one of them goes on to lead.

/// Ticks a lease outlives its last renewal; covers a late tick or two.
pub(crate) const LEASE_TTL_TICKS: u64 = 3;

use crate::shared::Lease;

/// What a VM does with the lease this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseStep {
    /// It holds the lease: extend it and act as leader.
    Renew,
    /// Another VM holds a live lease: follow it.
    Follow,
    /// Nobody holds a live lease: write one naming this VM (leader from the
    /// next tick if the write sticks).
    Acquire,
}

/// Decides the lease step from what was read (`None`: absent or unreadable).
pub(crate) fn next_step(current: Option<Lease>, me: u64, now_ms: u64) -> LeaseStep {
    match current {
        Some(lease) if lease.holder == me => LeaseStep::Renew,
        Some(lease) if lease.is_live(now_ms) => LeaseStep::Follow,
        _ => LeaseStep::Acquire,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn steps() {
        let mine = Lease {
            holder: 1,
            expires_at_ms: 1000,
        };
        let theirs = Lease {
            holder: 2,
            expires_at_ms: 1000,
        };
        assert_eq!(next_step(None, 1, 500), LeaseStep::Acquire);
        assert_eq!(next_step(Some(mine), 1, 500), LeaseStep::Renew);
        // An expired lease of one's own is still renewed: nobody took it.
        assert_eq!(next_step(Some(mine), 1, 5000), LeaseStep::Renew);
        assert_eq!(next_step(Some(theirs), 1, 999), LeaseStep::Follow);
        assert_eq!(next_step(Some(theirs), 1, 1000), LeaseStep::Acquire);
    }
}
