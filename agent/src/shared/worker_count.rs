//! The worker count's record: the number of VMs serving requests, `u32 LE`.

/// How many VMs of the process serve requests, as the leader counts them
/// (sources with recent traffic); at least one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkerCount(pub u32);

impl WorkerCount {
    /// The stored form.
    pub(crate) fn encode(self) -> [u8; 4] {
        self.0.to_le_bytes()
    }

    /// Parses the stored form (a zero reads as one); `None` for anything
    /// malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = <[u8; 4]>::try_from(bytes).ok()?;
        Some(Self(u32::from_le_bytes(bytes).max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn round_trips_and_refuses_other_lengths() {
        assert_eq!(
            WorkerCount::decode(&WorkerCount(4).encode()),
            Some(WorkerCount(4))
        );
        assert_eq!(WorkerCount::decode(&[0; 4]), Some(WorkerCount(1)));
        assert_eq!(WorkerCount::decode(&[0; 3]), None);
        assert_eq!(WorkerCount::decode(&[0; 8]), None);
    }
}
