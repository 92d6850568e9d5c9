//! The instance id's record: a random `u64 LE` drawn by the first leader.

/// The process's id in `Hello`, the same whichever VM leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InstanceId(pub u64);

impl InstanceId {
    /// The stored form.
    pub(crate) fn encode(self) -> [u8; 8] {
        self.0.to_le_bytes()
    }

    /// Parses the stored form; `None` for anything malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        Some(Self(u64::from_le_bytes(<[u8; 8]>::try_from(bytes).ok()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn round_trips_and_refuses_other_lengths() {
        let id = InstanceId(0x0123_4567_89ab_cdef);
        assert_eq!(InstanceId::decode(&id.encode()), Some(id));
        assert_eq!(InstanceId::decode(&[0; 7]), None);
        assert_eq!(InstanceId::decode(&[0; 9]), None);
    }
}
