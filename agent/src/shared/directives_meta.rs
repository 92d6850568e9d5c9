//! The directive table's freshness record: `sequence ‖ received_at_ms ‖
//! ttl_ms ‖ stream_lost`, each a `u64 LE` (the last one added later, so a
//! 24-byte record still reads).

const ENCODED_LEN: usize = 32;
/// The form written before `stream_lost` existed, still read.
const OLD_ENCODED_LEN: usize = 24;

/// The shared freshness record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DirectivesMeta {
    /// Increments whenever the table blob is rewritten.
    pub sequence: u64,
    /// When the last batch arrived (Unix ms, this proxy's clock).
    pub received_at_ms: u64,
    /// The TTL of that batch (0: the configured default).
    pub ttl_ms: u64,
    /// Whether the leader's stream to the control plane closed since.
    pub stream_lost: bool,
}

impl DirectivesMeta {
    /// The stored form.
    pub(crate) fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut bytes = [0; ENCODED_LEN];
        for (chunk, value) in bytes.chunks_exact_mut(8).zip([
            self.sequence,
            self.received_at_ms,
            self.ttl_ms,
            u64::from(self.stream_lost),
        ]) {
            chunk.copy_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    /// Parses the stored form; `None` for anything malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENCODED_LEN && bytes.len() != OLD_ENCODED_LEN {
            return None;
        }
        let mut values = bytes
            .chunks_exact(8)
            .map(|chunk| <[u8; 8]>::try_from(chunk).ok().map(u64::from_le_bytes));
        Some(Self {
            sequence: values.next()??,
            received_at_ms: values.next()??,
            ttl_ms: values.next()??,
            stream_lost: values.next().flatten().is_some_and(|lost| lost != 0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn meta_round_trips() {
        let meta = DirectivesMeta {
            sequence: 7,
            received_at_ms: 1_700_000_000_000,
            ttl_ms: 90_000,
            stream_lost: true,
        };
        assert_eq!(DirectivesMeta::decode(&meta.encode()), Some(meta));
        assert_eq!(DirectivesMeta::decode(&[0; 23]), None);
        // The form without `stream_lost` (another module version's leader).
        let old = &meta.encode()[..24];
        assert_eq!(
            DirectivesMeta::decode(old),
            Some(DirectivesMeta {
                stream_lost: false,
                ..meta
            })
        );
    }
}
