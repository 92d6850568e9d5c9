//! `GET /v1/proxies`: the proxies the control plane knows.

use axum::extract::State;
use serde::Serialize;

use crate::fleet::ProxyStatus;
use crate::state::AppState;

/// `GET /v1/proxies` reply.
#[derive(Debug, Serialize)]
pub(crate) struct ProxiesReply {
    /// Proxies with an open stream.
    pub(crate) connected: usize,
    /// Every tracked proxy, sorted by id: connected ones and disconnected
    /// ones whose rates are still carried.
    pub(crate) proxies: Vec<ProxyStatus>,
}

/// `GET /v1/proxies`.
pub(crate) async fn list(State(state): State<AppState>) -> axum::Json<ProxiesReply> {
    let proxies = state.fleet().proxies();
    axum::Json(ProxiesReply {
        connected: proxies.iter().filter(|p| p.connected).count(),
        proxies,
    })
}
