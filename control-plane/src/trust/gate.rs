//! The checks every stream of the gRPC listener passes, whichever service
//! it speaks (Sluice's own stream or RLQS): who may take a proxy id, and
//! how much one report may say.

use sluice_proto::v1::Report;
use tonic::Status;

use super::{Ceilings, Checked, IdentityPolicy, PeerIdentity, Refusal, RefusalLog, WindowLedger};
use crate::fleet::{Connected, StreamId};
use crate::metrics::ProxyGuard;
use crate::serve::state::AppState;

/// Shared by the streams of one listener.
#[derive(Debug)]
pub struct StreamGate {
    identity: Option<IdentityPolicy>,
    ceilings: Ceilings,
    refusals: RefusalLog,
}

impl StreamGate {
    /// A gate with client-certificate rules (`None`: the listener has no
    /// client certificates, and any stream may claim any proxy id).
    pub fn new(identity: Option<IdentityPolicy>, ceilings: Ceilings) -> Self {
        Self {
            identity,
            ceilings,
            refusals: RefusalLog::default(),
        }
    }

    /// Takes `proxy_id` for `stream` in the fleet, if the stream's client
    /// certificate (`peer`) allows it; the refusal is counted, logged once
    /// per certificate and proxy id, and returned as `PermissionDenied`.
    pub fn admit(
        &self,
        state: &AppState,
        peer: Option<&PeerIdentity>,
        proxy_id: &str,
        instance_id: u64,
        zone: &str,
        stream: StreamId,
    ) -> Result<Connected, Status> {
        let Some(policy) = &self.identity else {
            return Ok(state
                .fleet()
                .connect_in_zone(proxy_id, instance_id, zone, stream));
        };
        let label = peer.map_or("(no certificate)", PeerIdentity::label);
        let refuse = |reason: &'static str, message: String| {
            state.metrics().identity_refused(reason);
            let key = format!("{label}\u{1f}{proxy_id}");
            if self.refusals.first(&key) {
                tracing::warn!(
                    identity = label,
                    proxy_id,
                    reason,
                    "refusing stream: {message}"
                );
            } else {
                tracing::debug!(
                    identity = label,
                    proxy_id,
                    reason,
                    "refusing stream: {message}"
                );
            }
            Status::permission_denied(message)
        };
        let Some(peer) = peer else {
            return Err(refuse(
                "no_client_certificate",
                "a client certificate is required".to_owned(),
            ));
        };
        let principal = policy.authorize(peer, proxy_id).map_err(|refusal| {
            refuse(
                refusal.as_str(),
                format!("client certificate ({peer}) may not claim proxy_id {proxy_id:?}"),
            )
        })?;
        state
            .fleet()
            .connect_as(proxy_id, principal, instance_id, zone, stream)
            .map_err(|held| {
                refuse(
                    Refusal::HeldByAnother.as_str(),
                    format!("proxy_id {proxy_id:?}: {held}"),
                )
            })
    }

    /// Clamps `report` to the ceilings and counts what changed.
    pub fn check_report(
        &self,
        state: &AppState,
        proxy_metrics: &ProxyGuard,
        report: &mut Report,
        open_for: std::time::Duration,
        ledger: &mut WindowLedger,
    ) -> Checked {
        let checked = self.ceilings.check(report, open_for, ledger);
        if checked.changed() {
            state.metrics().report_clamped(&checked);
            proxy_metrics.report_clamped();
        }
        checked
    }
}
