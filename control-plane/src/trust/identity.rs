//! Which proxy ids a client certificate may claim.
//!
//! A peer's identity is the names in its certificate's subject alternative
//! names: URI SANs (a SPIFFE ID such as
//! `spiffe://cluster.local/ns/edge/sa/envoy`) and DNS SANs. A Hello may
//! claim a `proxy_id` that is one of those names, or that a rule allows:
//! `--grpc-identity 'IDENTITY=PROXY_IDS'`, both sides globs where `*`
//! matches any run of characters. The matching name becomes the stream's
//! principal: a stream may only supersede a stream of the same principal.

use std::fmt;
use std::sync::Arc;

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::config::limits::Glob;

/// The names a client certificate proves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct PeerIdentity {
    names: Vec<String>,
}

impl PeerIdentity {
    /// The URI SANs, then the DNS SANs, of a DER certificate; no names when
    /// it cannot be parsed (the TLS library has already verified it, so
    /// that only happens with extensions this parser does not know).
    pub(crate) fn from_der(der: &[u8]) -> Self {
        let Ok((_, cert)) = X509Certificate::from_der(der) else {
            return Self::default();
        };
        let Ok(Some(san)) = cert.subject_alternative_name() else {
            return Self::default();
        };
        let mut uris = Vec::new();
        let mut dns = Vec::new();
        for name in &san.value.general_names {
            match name {
                GeneralName::URI(uri) => uris.push((*uri).to_owned()),
                GeneralName::DNSName(host) => dns.push((*host).to_owned()),
                _ => {}
            }
        }
        uris.extend(dns);
        Self { names: uris }
    }

    /// An identity with these names (tests and tools).
    #[cfg(test)]
    pub(crate) fn from_names<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        Self {
            names: names.into_iter().map(Into::into).collect(),
        }
    }

    /// The names, URIs first.
    #[cfg(test)]
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// A short label for logs: the first name, or `(no SAN)`.
    pub(crate) fn label(&self) -> &str {
        self.names.first().map_or("(no SAN)", String::as_str)
    }
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.names.is_empty() {
            return f.write_str("(no URI or DNS SAN)");
        }
        f.write_str(&self.names.join(", "))
    }
}

/// `IDENTITY=PROXY_IDS`: a peer with a name matching `identity` may claim
/// a proxy id matching `proxy_ids`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdentityRule {
    identity: Glob,
    proxy_ids: Glob,
}

/// A rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--grpc-identity {rule:?}: expected IDENTITY=PROXY_IDS with neither side empty")]
pub(crate) struct InvalidIdentityRule {
    rule: String,
}

impl std::str::FromStr for IdentityRule {
    type Err = InvalidIdentityRule;

    fn from_str(rule: &str) -> Result<Self, Self::Err> {
        // SPIFFE IDs and DNS names hold no `=`; proxy ids may.
        match rule.split_once('=') {
            Some((identity, proxy_ids)) if !identity.is_empty() && !proxy_ids.is_empty() => {
                Ok(Self {
                    identity: Glob::new(identity),
                    proxy_ids: Glob::new(proxy_ids),
                })
            }
            _ => Err(InvalidIdentityRule {
                rule: rule.to_owned(),
            }),
        }
    }
}

/// Why a Hello's `proxy_id` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The certificate names nothing that may claim the proxy id.
    NotAllowed,
    /// A live stream of another principal holds the proxy id.
    HeldByAnother,
}

impl Refusal {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::NotAllowed => "proxy_id_not_allowed",
            Self::HeldByAnother => "proxy_id_held_by_another_identity",
        }
    }
}

/// The rules in force.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct IdentityPolicy {
    rules: Vec<IdentityRule>,
}

impl IdentityPolicy {
    /// A policy from `--grpc-identity` rules; none: a certificate may claim
    /// only its own names.
    pub(crate) fn new(rules: Vec<IdentityRule>) -> Self {
        Self { rules }
    }

    /// The principal (the certificate name that allows it) under which
    /// `peer` may claim `proxy_id`.
    pub(crate) fn authorize(
        &self,
        peer: &PeerIdentity,
        proxy_id: &str,
    ) -> Result<Arc<str>, Refusal> {
        let allowed = |name: &str| {
            name == proxy_id
                || self
                    .rules
                    .iter()
                    .any(|rule| rule.identity.matches(name) && rule.proxy_ids.matches(proxy_id))
        };
        peer.names
            .iter()
            .find(|name| allowed(name))
            .map(|name| Arc::from(name.as_str()))
            .ok_or(Refusal::NotAllowed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const SPIFFE: &str = "spiffe://cluster.local/ns/edge/sa/envoy";

    #[test]
    fn without_rules_a_certificate_claims_its_own_names() {
        let policy = IdentityPolicy::default();
        let peer = PeerIdentity::from_names(["envoy-a.example.com"]);
        assert_eq!(
            policy
                .authorize(&peer, "envoy-a.example.com")
                .unwrap()
                .as_ref(),
            "envoy-a.example.com"
        );
        assert_eq!(
            policy.authorize(&peer, "envoy-b.example.com"),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(
            policy.authorize(&PeerIdentity::default(), ""),
            Err(Refusal::NotAllowed)
        );
    }

    #[test]
    fn rules_map_an_identity_to_a_pattern_of_proxy_ids() {
        let policy = IdentityPolicy::new(vec![
            format!("{SPIFFE}=edge-*").parse().unwrap(),
            "spiffe://cluster.local/ns/batch/*=batch-*".parse().unwrap(),
        ]);
        let edge = PeerIdentity::from_names([SPIFFE]);
        assert_eq!(policy.authorize(&edge, "edge-7").unwrap().as_ref(), SPIFFE);
        assert_eq!(policy.authorize(&edge, "batch-1"), Err(Refusal::NotAllowed));
        let batch = PeerIdentity::from_names(["spiffe://cluster.local/ns/batch/sa/worker"]);
        assert!(policy.authorize(&batch, "batch-1").is_ok());
        assert_eq!(policy.authorize(&batch, "edge-7"), Err(Refusal::NotAllowed));
    }

    #[test]
    fn malformed_rules_are_refused() {
        for rule in ["", "=x", "x=", "no-equals"] {
            let err = rule.parse::<IdentityRule>().unwrap_err();
            assert!(err.to_string().contains("IDENTITY=PROXY_IDS"), "{err}");
        }
    }

    #[test]
    fn names_come_from_the_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["envoy-a.example.com".to_owned()]).unwrap();
        params.subject_alt_names.push(rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(SPIFFE).unwrap(),
        ));
        let cert = params.self_signed(&key).unwrap();
        let peer = PeerIdentity::from_der(cert.der());
        assert_eq!(peer.names(), [SPIFFE, "envoy-a.example.com"]);
        assert_eq!(
            PeerIdentity::from_der(b"not a certificate"),
            PeerIdentity::default()
        );
    }
}
