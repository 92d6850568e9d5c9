//! Messages exchanged between the Sluice filter and the control plane,
//! generated at build time from `sluice/v1/sluice.proto`.
//!
//! The default build has prost messages only (what the wasm filter needs);
//! the `grpc` feature adds the tonic client and server.

/// Version 1 of the Sluice protocol.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.rs"));
}

/// Fully qualified gRPC service name, as Envoy's gRPC client needs it.
pub const SERVICE_NAME: &str = "sluice.v1.DirectiveService";
/// Name of the bidirectional streaming method.
pub const STREAM_METHOD: &str = "Stream";

#[cfg(test)]
mod tests {
    use super::v1::{BucketCount, ProxyMessage, Report, proxy_message};
    use prost::Message;

    #[test]
    fn report_round_trips_through_protobuf() {
        let message = ProxyMessage {
            kind: Some(proxy_message::Kind::Report(Report {
                sequence: 7,
                window_ms: 250,
                directive_age_ms: None,
                buckets: vec![BucketCount {
                    bucket: "acme".into(),
                    offered: u64::MAX,
                    admitted: 3,
                    ..Default::default()
                }],
                upstream: vec![super::v1::UpstreamSignal {
                    bucket: "acme".into(),
                    responses: 10,
                    errors: 1,
                    latency: vec![0, 3, 7],
                }],
            })),
        };
        let bytes = message.encode_to_vec();
        let decoded = ProxyMessage::decode(bytes.as_slice());
        assert_eq!(decoded, Ok(message));
    }

    #[test]
    fn directive_age_tells_none_from_zero_and_old_reports_decode() {
        let report = |directive_age_ms| Report {
            sequence: 1,
            window_ms: 250,
            directive_age_ms,
            buckets: vec![],
            upstream: vec![],
        };
        for age in [None, Some(0), Some(1_250)] {
            let bytes = report(age).encode_to_vec();
            assert_eq!(
                Report::decode(bytes.as_slice()).unwrap().directive_age_ms,
                age
            );
        }
        // A report of a filter built before the field: fields 1 and 2 only.
        let old = [0x08, 0x01, 0x10, 0xfa, 0x01];
        assert_eq!(Report::decode(old.as_slice()), Ok(report(None)));
    }
}
