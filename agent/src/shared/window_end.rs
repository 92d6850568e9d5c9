//! The report window's record: when the leader last closed one, `u64 LE`
//! Unix milliseconds.

/// When the leader closed its last report window, so that followers hand
/// their counts over at once instead of at their next slow tick: the
/// window is sent as soon as every VM has handed off past its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowEnd(pub u64);

impl WindowEnd {
    /// The stored form.
    pub(crate) fn encode(self) -> [u8; 8] {
        self.0.to_le_bytes()
    }

    /// Parses the stored form; `None` for anything malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = <[u8; 8]>::try_from(bytes).ok()?;
        Some(Self(u64::from_le_bytes(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn round_trips_and_refuses_other_lengths() {
        let end = WindowEnd(1_700_000_000_250);
        assert_eq!(WindowEnd::decode(&end.encode()), Some(end));
        assert_eq!(WindowEnd::decode(&[0; 4]), None);
        assert_eq!(WindowEnd::decode(&[0; 9]), None);
    }
}
