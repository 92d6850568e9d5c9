//! The hand-off message: a follower's counts for the leader, protobuf
//! (prost) on the shared queue; fields only ever added.

/// A follower's counts as handed to the leader through the shared queue
/// (aligned to the leader's report windows by [`crate::leader::report_window`]).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Handoff {
    /// The VM's random id.
    #[prost(uint64, tag = "1")]
    pub source: u64,
    /// Start of the span the counts cover (Unix ms).
    #[prost(uint64, tag = "2")]
    pub start_ms: u64,
    /// End of that span (Unix ms).
    #[prost(uint64, tag = "3")]
    pub end_ms: u64,
    /// Counts per cell.
    #[prost(message, repeated, tag = "4")]
    pub counts: Vec<sluice_proto::v1::BucketCount>,
    /// Upstream signals per bucket ([`crate::upstream`]).
    #[prost(message, repeated, tag = "5")]
    pub upstream: Vec<sluice_proto::v1::UpstreamSignal>,
}

impl Handoff {
    /// The queued form.
    pub(crate) fn encode(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }

    /// Parses the queued form.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
        <Self as prost::Message>::decode(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn round_trips_and_refuses_garbage() {
        let handoff = Handoff {
            source: 7,
            start_ms: 1_000,
            end_ms: 1_100,
            counts: vec![sluice_proto::v1::BucketCount {
                bucket: "a".into(),
                offered: 3,
                ..Default::default()
            }],
            upstream: Vec::new(),
        };
        assert_eq!(Handoff::decode(&handoff.encode()).ok(), Some(handoff));
        assert!(Handoff::decode(&[0xff, 0xff, 0xff]).is_err());
    }
}
