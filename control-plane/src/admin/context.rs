//! What every admin handler is given: the configuration in force (and
//! through it the shared state), the auth policy and the exact quotas.

use std::sync::Arc;

use axum::extract::FromRef;

use super::auth::AuthPolicy;
use crate::config::Config;
use crate::config::live::LiveConfig;
use crate::quotas::Quotas;
use crate::state::AppState;

/// What the admin handlers share; cheap to clone.
#[derive(Debug, Clone)]
pub struct Admin {
    live: Arc<LiveConfig>,
    auth: Arc<AuthPolicy>,
    quotas: Option<Arc<Quotas>>,
}

impl Admin {
    /// An admin API over `live`, guarded by `auth`.
    pub fn new(live: Arc<LiveConfig>, auth: AuthPolicy) -> Self {
        Self {
            live,
            auth: Arc::new(auth),
            quotas: None,
        }
    }

    /// Also reads the exact quotas' counters (`GET /v1/quotas/{domain}`).
    #[must_use]
    pub(crate) fn with_quotas(mut self, quotas: Option<Arc<Quotas>>) -> Self {
        self.quotas = quotas;
        self
    }

    /// The exact quotas, when this control plane serves them.
    pub(crate) fn quotas(&self) -> Option<&Quotas> {
        self.quotas.as_deref()
    }

    /// An unauthenticated admin API whose changes live in memory only.
    pub(crate) fn in_memory(state: AppState) -> Self {
        let config = Config::from_policy(&state.policy());
        Self::new(
            Arc::new(LiveConfig::in_memory(state, config)),
            AuthPolicy::default(),
        )
    }

    /// The shared control plane state.
    pub(crate) fn state(&self) -> &AppState {
        self.live.state()
    }

    /// The configuration in force and its file.
    pub(crate) fn live(&self) -> &Arc<LiveConfig> {
        &self.live
    }

    /// Who may do what.
    pub(crate) fn auth_policy(&self) -> Arc<AuthPolicy> {
        Arc::clone(&self.auth)
    }
}

impl FromRef<Admin> for AppState {
    fn from_ref(admin: &Admin) -> Self {
        admin.state().clone()
    }
}
