//! The leader lease: which VM of the process owns the control-plane stream.
//!
//! The lease lives in one shared-data key as `holder (u64 LE) ‖ expiry in
//! Unix ms (u64 LE)`. Every VM reads it each tick and decides:
//! - its own lease: renew it (compare-and-swap on the value it read) and lead;
//! - someone else's unexpired lease: follow;
//! - absent, expired or unreadable: try to take it (compare-and-swap).
//!
//! A VM leads only after it has *read back* a lease naming it. This matters
//! because the host ignores the CAS token when the key does not exist yet,
//! so two VMs can both "win" the first write; the last writer's value is what
//! everybody reads next tick, so exactly one of them goes on to lead.

/// Ticks a lease outlives its last renewal; covers a late tick or two.
pub const LEASE_TTL_TICKS: u64 = 3;

const ENCODED_LEN: usize = 16;

/// A decoded lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The VM holding it (a random id per VM).
    pub holder: u64,
    /// Unix milliseconds after which anyone may take it.
    pub expires_at_ms: u64,
}

impl Lease {
    /// The stored form.
    pub fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut bytes = [0; ENCODED_LEN];
        let (holder, expiry) = bytes.split_at_mut(8);
        holder.copy_from_slice(&self.holder.to_le_bytes());
        expiry.copy_from_slice(&self.expires_at_ms.to_le_bytes());
        bytes
    }

    /// Parses the stored form; `None` for anything malformed.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; ENCODED_LEN] = bytes.try_into().ok()?;
        let (holder, expiry) = bytes.split_at(8);
        Some(Self {
            holder: u64::from_le_bytes(holder.try_into().ok()?),
            expires_at_ms: u64::from_le_bytes(expiry.try_into().ok()?),
        })
    }

    /// Whether the lease still holds at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }
}

/// What a VM does with the lease this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStep {
    /// It holds the lease: extend it and act as leader.
    Renew,
    /// Another VM holds a live lease: follow it.
    Follow,
    /// Nobody holds a live lease: write one naming this VM (leader from the
    /// next tick if the write sticks).
    Acquire,
}

/// Decides the lease step from what was read (`None`: absent or unreadable).
pub fn next_step(current: Option<Lease>, me: u64, now_ms: u64) -> LeaseStep {
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
    fn round_trips() {
        let lease = Lease {
            holder: 0xdead_beef_0123_4567,
            expires_at_ms: 1_700_000_000_300,
        };
        assert_eq!(Lease::decode(&lease.encode()), Some(lease));
    }

    #[test]
    fn malformed_bytes_are_no_lease() {
        assert_eq!(Lease::decode(b""), None);
        assert_eq!(Lease::decode(&[0; 15]), None);
        assert_eq!(Lease::decode(&[0; 17]), None);
    }

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
