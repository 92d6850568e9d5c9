//! What a Hello may name: a proxy id and a zone of bounded length, in
//! characters that print as themselves in a log line, a metric label and a
//! JSON string.
//!
//! The proxy id becomes a key of the fleet, a label of per-proxy series,
//! an entry of `/v1/proxies` and a field of log lines, so a 4 MB id would
//! cost megabytes in each, and a newline in it would forge log lines. The
//! node ids Envoy's control planes give proxies fit easily: Istio's
//! `sidecar~10.1.2.3~pod-abc-1.ns~ns.svc.cluster.local`, Envoy Gateway's
//! `router~10.1.2.3~envoy-gw-xyz.envoy-gateway-system~…`, a SPIFFE ID, the
//! control plane's own `rlqs@127.0.0.1:43210`.

use std::fmt;

/// The longest proxy id and zone a Hello may name, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HelloLimits {
    /// Longest proxy id.
    pub(crate) max_proxy_id_len: usize,
    /// Longest zone.
    pub(crate) max_zone_len: usize,
}

impl HelloLimits {
    /// Default longest proxy id: an Istio node id holds a pod name (up to
    /// 253 bytes), an address and a namespace twice; 512 leaves room.
    pub(crate) const DEFAULT_MAX_PROXY_ID_LEN: usize = 512;
    /// Default longest zone: cloud zones are a few dozen bytes.
    pub(crate) const DEFAULT_MAX_ZONE_LEN: usize = 128;
}

impl Default for HelloLimits {
    fn default() -> Self {
        Self {
            max_proxy_id_len: Self::DEFAULT_MAX_PROXY_ID_LEN,
            max_zone_len: Self::DEFAULT_MAX_ZONE_LEN,
        }
    }
}

/// Why a Hello's names were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HelloRefusal {
    /// The proxy id is empty.
    ProxyIdEmpty,
    /// The proxy id is longer than allowed.
    ProxyIdTooLong {
        /// Its length in bytes.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// The proxy id holds a character outside [`allowed`].
    ProxyIdCharacters,
    /// The zone is longer than allowed.
    ZoneTooLong {
        /// Its length in bytes.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// The zone holds a character outside [`allowed`].
    ZoneCharacters,
}

impl HelloRefusal {
    /// The metric label.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Self::ProxyIdEmpty => "proxy_id_empty",
            Self::ProxyIdTooLong { .. } => "proxy_id_too_long",
            Self::ProxyIdCharacters => "proxy_id_characters",
            Self::ZoneTooLong { .. } => "zone_too_long",
            Self::ZoneCharacters => "zone_characters",
        }
    }

    /// Every metric label, so that each series exists at 0.
    pub(crate) const REASONS: [&'static str; 5] = [
        "proxy_id_empty",
        "proxy_id_too_long",
        "proxy_id_characters",
        "zone_too_long",
        "zone_characters",
    ];
}

impl fmt::Display for HelloRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const CHARACTERS: &str = "printable ASCII without spaces, quotes or backslashes";
        match self {
            Self::ProxyIdEmpty => f.write_str("Hello.proxy_id is empty"),
            Self::ProxyIdTooLong { len, max } => write!(
                f,
                "Hello.proxy_id is {len} bytes long, more than the {max} this control plane accepts (--grpc-max-proxy-id-len)"
            ),
            Self::ProxyIdCharacters => write!(f, "Hello.proxy_id must be {CHARACTERS}"),
            Self::ZoneTooLong { len, max } => write!(
                f,
                "Hello.zone is {len} bytes long, more than the {max} this control plane accepts (--grpc-max-zone-len)"
            ),
            Self::ZoneCharacters => write!(f, "Hello.zone must be {CHARACTERS}"),
        }
    }
}

/// Whether `byte` may appear in a proxy id or zone: printable ASCII
/// except the space, `"` and `\` (which a log line, a label value or JSON
/// would show escaped, or split on).
pub(crate) fn allowed(byte: u8) -> bool {
    byte.is_ascii_graphic() && byte != b'"' && byte != b'\\'
}

impl HelloLimits {
    /// Checks a Hello's proxy id and zone (the zone may be empty).
    pub(crate) fn check(&self, proxy_id: &str, zone: &str) -> Result<(), HelloRefusal> {
        if proxy_id.is_empty() {
            return Err(HelloRefusal::ProxyIdEmpty);
        }
        if proxy_id.len() > self.max_proxy_id_len {
            return Err(HelloRefusal::ProxyIdTooLong {
                len: proxy_id.len(),
                max: self.max_proxy_id_len,
            });
        }
        if !proxy_id.bytes().all(allowed) {
            return Err(HelloRefusal::ProxyIdCharacters);
        }
        if zone.len() > self.max_zone_len {
            return Err(HelloRefusal::ZoneTooLong {
                len: zone.len(),
                max: self.max_zone_len,
            });
        }
        if !zone.bytes().all(allowed) {
            return Err(HelloRefusal::ZoneCharacters);
        }
        Ok(())
    }
}

/// At most the first 64 bytes of `name`, escaped, for a log line about a
/// name that was refused (it may be megabytes long or hold newlines).
pub(crate) fn shown(name: &str) -> String {
    const SHOWN: usize = 64;
    let cut = name.get(..SHOWN).map_or_else(
        || name.chars().take(SHOWN).collect::<String>(),
        str::to_owned,
    );
    let mut text = cut.escape_default().to_string();
    if name.len() > cut.len() {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_node_ids_of_envoys_control_planes_are_accepted() {
        let limits = HelloLimits::default();
        for id in [
            "sidecar~10.1.2.3~pod-abc-1.ns~ns.svc.cluster.local",
            "router~10.1.2.3~envoy-gw-xyz-5d8f7c9b4-abcde.envoy-gateway-system~envoy-gateway-system.svc.cluster.local",
            "sidecar~fd00:10:244::7~reviews-v1.bookinfo~bookinfo.svc.cluster.local",
            "spiffe://cluster.local/ns/edge/sa/envoy",
            "rlqs@[::1]:43210",
            "edge-eu-1",
        ] {
            assert_eq!(limits.check(id, "europe-west1-b"), Ok(()), "{id}");
        }
        // The longest pod name (253) in an Istio node id.
        let long = format!(
            "sidecar~fd00:10:244::7~{}.ns~ns.svc.cluster.local",
            "p".repeat(253)
        );
        assert_eq!(limits.check(&long, ""), Ok(()));
    }

    #[test]
    fn lengths_and_characters_are_bounded() {
        let limits = HelloLimits {
            max_proxy_id_len: 8,
            max_zone_len: 4,
        };
        assert_eq!(limits.check("", ""), Err(HelloRefusal::ProxyIdEmpty));
        assert_eq!(
            limits.check("123456789", ""),
            Err(HelloRefusal::ProxyIdTooLong { len: 9, max: 8 })
        );
        for bad in ["a b", "a\nb", "a\"b", "a\\b", "é", "a\u{7f}", "\t"] {
            assert_eq!(
                limits.check(bad, ""),
                Err(HelloRefusal::ProxyIdCharacters),
                "{bad:?}"
            );
            assert_eq!(
                limits.check("ok", bad),
                Err(HelloRefusal::ZoneCharacters),
                "{bad:?}"
            );
        }
        assert_eq!(
            limits.check("ok", "12345"),
            Err(HelloRefusal::ZoneTooLong { len: 5, max: 4 })
        );
        let message = HelloRefusal::ProxyIdTooLong {
            len: 4_000_000,
            max: 512,
        }
        .to_string();
        assert!(message.contains("4000000") && message.contains("--grpc-max-proxy-id-len"));
    }

    #[test]
    fn a_refused_name_is_shown_short_and_escaped() {
        assert_eq!(shown("edge"), "edge");
        assert_eq!(shown("a\nb"), "a\\nb");
        let huge = "x".repeat(4_000_000);
        assert_eq!(shown(&huge), format!("{}…", "x".repeat(64)));
        // A cut inside a multi-byte character falls back to characters.
        let wide = "é".repeat(100);
        assert!(shown(&wide).ends_with('…'));
    }

    proptest! {
        /// Whatever bytes arrive, an accepted name is within the limits and
        /// prints as itself.
        #[test]
        fn accepted_names_are_plain(id in ".{0,40}", zone in ".{0,20}") {
            let limits = HelloLimits { max_proxy_id_len: 30, max_zone_len: 10 };
            if limits.check(&id, &zone).is_ok() {
                prop_assert!(!id.is_empty() && id.len() <= 30 && zone.len() <= 10);
                prop_assert_eq!(format!("{:?}", id), format!("\"{id}\""));
            }
        }
    }
}
