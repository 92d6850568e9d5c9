//! The leader lease's record: `holder (u64 LE) ‖ expiry in Unix ms (u64 LE)`.

const ENCODED_LEN: usize = 16;

/// Which VM of the process owns the control-plane stream, and until when
/// (the election itself is [`crate::tick::lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    /// The VM holding it (a random id per VM).
    pub holder: u64,
    /// Unix milliseconds after which anyone may take it.
    pub expires_at_ms: u64,
}

impl Lease {
    /// The stored form.
    pub(crate) fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut bytes = [0; ENCODED_LEN];
        let (holder, expiry) = bytes.split_at_mut(8);
        holder.copy_from_slice(&self.holder.to_le_bytes());
        expiry.copy_from_slice(&self.expires_at_ms.to_le_bytes());
        bytes
    }

    /// Parses the stored form; `None` for anything malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; ENCODED_LEN] = bytes.try_into().ok()?;
        let (holder, expiry) = bytes.split_at(8);
        Some(Self {
            holder: u64::from_le_bytes(holder.try_into().ok()?),
            expires_at_ms: u64::from_le_bytes(expiry.try_into().ok()?),
        })
    }

    /// Whether the lease still holds at `now_ms`.
    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
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
}
