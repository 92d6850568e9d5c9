//! The `service` argument of proxy-wasm's gRPC stream call: the control
//! plane's cluster, and the `:authority` Envoy sends with it.
//!
//! Envoy takes the argument either as a cluster name or as a serialized
//! `envoy.config.core.v3.GrpcService`; given a bare name it sends the name
//! itself as `:authority`. Istio names the cluster of a service
//! `outbound|PORT|SUBSET|FQDN`, which is no valid authority: a gRPC server
//! (the control plane's HTTP/2 stack) resets such a stream as a protocol
//! error, so every report failed. For a cluster name that is not a valid
//! authority the filter therefore sends a `GrpcService` naming the cluster
//! and an authority: `FQDN:PORT` for Istio's names, the name with its
//! invalid characters replaced otherwise.

/// `GrpcService.envoy_grpc` (field 1, length-delimited).
const ENVOY_GRPC_TAG: u8 = 0x0a;
/// `EnvoyGrpc.cluster_name` (field 1, length-delimited).
const CLUSTER_NAME_TAG: u8 = 0x0a;
/// `EnvoyGrpc.authority` (field 2, length-delimited).
const AUTHORITY_TAG: u8 = 0x12;
/// Lengths below this take one varint byte, which keeps the encoding
/// ASCII (the host call takes a `&str`).
const ONE_BYTE_VARINT: usize = 0x80;

/// What to pass to the host's gRPC stream call for `cluster`.
pub(crate) fn stream_target(cluster: &str) -> String {
    if is_valid_authority(cluster) {
        return cluster.to_owned();
    }
    let authority = authority_for(cluster);
    encode_envoy_grpc(cluster, &authority).unwrap_or_else(|| cluster.to_owned())
}

/// Whether Envoy may send `name` as `:authority` (RFC 3986 `reg-name`
/// characters and a port).
fn is_valid_authority(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'.'
                        | b'_'
                        | b'~'
                        | b'!'
                        | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'*'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                        | b':'
                        | b'%'
                )
        })
}

/// `FQDN:PORT` for Istio's `outbound|PORT|SUBSET|FQDN`, else the name with
/// every character an authority may not hold replaced by `-`.
fn authority_for(cluster: &str) -> String {
    let parts: Vec<&str> = cluster.split('|').collect();
    if let [_direction, port, _subset, host] = parts.as_slice()
        && !host.is_empty()
        && is_valid_authority(host)
        && port.parse::<u16>().is_ok()
    {
        return format!("{host}:{port}");
    }
    cluster
        .chars()
        .map(|c| {
            if is_valid_authority(c.encode_utf8(&mut [0; 4])) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// `GrpcService { envoy_grpc { cluster_name, authority } }`, or `None` when
/// a length needs more than one varint byte.
fn encode_envoy_grpc(cluster: &str, authority: &str) -> Option<String> {
    let inner_len = 2 + cluster.len() + 2 + authority.len();
    if cluster.len() >= ONE_BYTE_VARINT
        || authority.len() >= ONE_BYTE_VARINT
        || inner_len >= ONE_BYTE_VARINT
    {
        return None;
    }
    let mut bytes = Vec::with_capacity(2 + inner_len);
    bytes.extend([ENVOY_GRPC_TAG, u8::try_from(inner_len).ok()?]);
    bytes.extend([CLUSTER_NAME_TAG, u8::try_from(cluster.len()).ok()?]);
    bytes.extend_from_slice(cluster.as_bytes());
    bytes.extend([AUTHORITY_TAG, u8::try_from(authority.len()).ok()?]);
    bytes.extend_from_slice(authority.as_bytes());
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISTIO: &str = "outbound|50051||sluice.sluice-system.svc.cluster.local";

    #[test]
    fn a_plain_cluster_name_is_passed_as_is() {
        assert_eq!(
            stream_target("sluice_control_plane"),
            "sluice_control_plane"
        );
    }

    #[test]
    fn istios_cluster_is_sent_with_its_service_as_authority() {
        let target = stream_target(ISTIO);
        let bytes = target.as_bytes();
        let authority = "sluice.sluice-system.svc.cluster.local:50051";
        let mut expected = vec![
            0x0a,
            u8::try_from(4 + ISTIO.len() + authority.len()).unwrap(),
        ];
        expected.extend([0x0a, u8::try_from(ISTIO.len()).unwrap()]);
        expected.extend_from_slice(ISTIO.as_bytes());
        expected.extend([0x12, u8::try_from(authority.len()).unwrap()]);
        expected.extend_from_slice(authority.as_bytes());
        assert_eq!(bytes, expected.as_slice());
    }

    #[test]
    fn other_invalid_names_get_their_invalid_characters_replaced() {
        assert_eq!(authority_for("a|b c"), "a-b-c");
        assert_eq!(authority_for("outbound|x||host"), "outbound-x--host");
    }

    #[test]
    fn names_too_long_for_one_byte_lengths_are_passed_as_is() {
        let long = format!("outbound|50051||{}.svc.cluster.local", "a".repeat(100));
        assert_eq!(stream_target(&long), long);
    }
}
