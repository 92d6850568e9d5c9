//! The checks every stream of the gRPC listener passes, whichever service
//! it speaks (Sluice's own stream or RLQS): how many streams its
//! connection and its identity may hold, what its Hello may name, who may
//! take a proxy id, and how much one report may say.

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_proto::v1::Report;
use tonic::Status;

use super::hello::{HelloLimits, shown};
use super::identity::{IdentityPolicy, PeerIdentity, Refusal};
use super::peers::{PeerLedger, PeerLimits, StreamSlot};
use super::plausibility::{Ceilings, Checked, WindowLedger};
use super::refusal_log::RefusalLog;
use crate::fleet::{Connected, StreamId};
use crate::metrics::ProxyGuard;
use crate::state::AppState;

/// Shared by the streams of one listener.
#[derive(Debug)]
pub(crate) struct StreamGate {
    identity: Option<IdentityPolicy>,
    ceilings: Ceilings,
    hello: HelloLimits,
    peers: Arc<PeerLedger>,
    refusals: RefusalLog,
}

/// What a Hello (or an RLQS stream's metadata) says about its proxy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    /// The proxy id.
    pub(crate) proxy_id: &'a str,
    /// The process's instance id (0: unknown, as for RLQS).
    pub(crate) instance_id: u64,
    /// The failure domain; empty when none.
    pub(crate) zone: &'a str,
}

impl StreamGate {
    /// A gate with client-certificate rules (`None`: the listener has no
    /// client certificates, and any stream may claim any proxy id), report
    /// ceilings, Hello limits and peer limits.
    pub(crate) fn new(
        identity: Option<IdentityPolicy>,
        ceilings: Ceilings,
        hello: HelloLimits,
        peers: PeerLimits,
    ) -> Self {
        Self {
            identity,
            ceilings,
            hello,
            peers: PeerLedger::new(peers),
            refusals: RefusalLog::default(),
        }
    }

    /// The connections and streams peers hold, which the listener's accept
    /// loop shares.
    pub(crate) fn peers(&self) -> &Arc<PeerLedger> {
        &self.peers
    }

    /// Logs `message` at warning level the first time for `key`, at debug
    /// level after that (a misconfigured Envoy retries every few seconds).
    fn log_first(&self, key: &str, message: &str) {
        if self.refusals.first(key) {
            tracing::warn!("{message}");
        } else {
            tracing::debug!("{message}");
        }
    }

    /// A place for a new proxy stream on the connection from `connection`
    /// (its client's address), for the client certificate `peer`; refused
    /// with `RESOURCE_EXHAUSTED`, counted and logged, beyond the caps.
    pub(crate) fn open_stream(
        &self,
        state: &AppState,
        connection: Option<SocketAddr>,
        peer: Option<&PeerIdentity>,
    ) -> Result<StreamSlot, Status> {
        let identity = self.identity.as_ref().and(peer).map(PeerIdentity::label);
        self.peers
            .open_stream(connection, identity)
            .map_err(|refusal| {
                state.metrics().stream_refused(refusal.reason());
                let from = connection.map_or_else(|| "?".to_owned(), |addr| addr.ip().to_string());
                self.log_first(
                    &format!(
                        "{}\u{1f}{from}\u{1f}{}",
                        refusal.reason(),
                        identity.unwrap_or("")
                    ),
                    &format!("refusing stream from {from}: {refusal}"),
                );
                Status::resource_exhausted(refusal.to_string())
            })
    }

    /// Takes `claim.proxy_id` for `stream` in the fleet, if the Hello's
    /// names are within the limits and the stream's client certificate
    /// (`peer`) allows it. A stream this one supersedes is closed with
    /// `ABORTED`; a live instance of another process with the same id is
    /// admitted beside it, both counting as proxies (a conflict once both
    /// report, see [`crate::fleet::Fleet::take_conflicts`]). Refusals
    /// are counted, logged once per peer and reason, and returned as
    /// `INVALID_ARGUMENT` (names) or `PERMISSION_DENIED` (identity).
    pub(crate) fn admit(
        &self,
        state: &AppState,
        peer: Option<&PeerIdentity>,
        claim: Claim<'_>,
        stream: StreamId,
    ) -> Result<Connected, Status> {
        let Claim {
            proxy_id,
            instance_id,
            zone,
        } = claim;
        let label = peer.map_or("(no certificate)", PeerIdentity::label);
        if let Err(refusal) = self.hello.check(proxy_id, zone) {
            state.metrics().stream_rejected();
            state.metrics().stream_refused(refusal.reason());
            self.log_first(
                &format!("{}\u{1f}{label}", refusal.reason()),
                &format!(
                    "refusing stream of proxy_id \"{}\" (identity {label}): {refusal}",
                    shown(proxy_id)
                ),
            );
            return Err(Status::invalid_argument(refusal.to_string()));
        }
        let connected = self.connect(state, peer, label, claim, stream)?;
        match connected {
            Connected::New => {}
            Connected::Replaced { previous: None, .. } => {}
            Connected::Replaced {
                previous: Some(previous),
                previous_instance,
            } => {
                state.metrics().stream_superseded();
                let status = if previous_instance == instance_id {
                    Status::aborted(format!(
                        "superseded by a newer stream of the same proxy (proxy_id \"{proxy_id}\", instance {instance_id:#018x})"
                    ))
                } else {
                    Status::aborted(format!(
                        "superseded: instance {instance_id:#018x} of proxy_id \"{proxy_id}\" took over from this instance ({previous_instance:#018x}), which was silent"
                    ))
                };
                tracing::info!(
                    proxy_id,
                    superseded_stream = previous.0,
                    "closing the stream this one supersedes"
                );
                state.close_stream(previous, status);
            }
            Connected::Conflict { holder } => {
                // Counted and warned about once both report (see
                // `Fleet::take_conflicts`): a restarted Envoy whose frozen
                // predecessor's connection lingers looks the same here.
                tracing::info!(
                    proxy_id,
                    instance = format_args!("{instance_id:#018x}"),
                    holder = format_args!("{holder:#018x}"),
                    "Hello beside a live instance of the same proxy id: counted as a proxy of its own"
                );
            }
        }
        Ok(connected)
    }

    /// The fleet's side of [`Self::admit`], with the identity rules.
    fn connect(
        &self,
        state: &AppState,
        peer: Option<&PeerIdentity>,
        label: &str,
        claim: Claim<'_>,
        stream: StreamId,
    ) -> Result<Connected, Status> {
        let Claim {
            proxy_id,
            instance_id,
            zone,
        } = claim;
        let Some(policy) = &self.identity else {
            return Ok(state
                .fleet()
                .connect_in_zone(proxy_id, instance_id, zone, stream));
        };
        let refuse = |reason: &'static str, message: String| {
            state.metrics().identity_refused(reason);
            self.log_first(
                &format!("{label}\u{1f}{proxy_id}"),
                &format!(
                    "refusing stream (identity {label}, proxy_id {proxy_id}, {reason}): {message}"
                ),
            );
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
    pub(crate) fn check_report(
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
