//! What every role of one agent shares: its settings, its id, the proxy's
//! name, its PRNG and the metric counts it has not flushed yet.

use crate::directives::DirectiveTable;
use crate::metrics::Metrics;
use crate::settings::AgentSettings;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One VM's own: the roles (request path, sync, leadership) each borrow it.
#[derive(Debug)]
pub(crate) struct Vm {
    pub(crate) settings: AgentSettings,
    /// Identifies this VM in the lease and its hand-offs.
    pub(crate) id: u64,
    /// The proxy's name once known: from the start when something named
    /// it, else the one its process's instance id gives
    /// ([`crate::identity`]).
    pub(crate) name: Option<String>,
    /// Whether this VM, leading, warned that the name is made up.
    pub(crate) warned_made_up_name: bool,
    pub(crate) rng: SmallRng,
    pub(crate) metrics: Metrics,
}

impl Vm {
    /// A VM configured with `settings`, its PRNG seeded with `seed`.
    pub(crate) fn new(settings: AgentSettings, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let id = rng.next_u64();
        Self {
            name: settings.proxy_id.name().map(str::to_owned),
            warned_made_up_name: false,
            settings,
            id,
            rng,
            metrics: Metrics::default(),
        }
    }

    /// Names the proxy `name` from now on; its directives' canary
    /// membership follows the name.
    pub(crate) fn adopt_name(&mut self, name: String, directives: &mut DirectiveTable) {
        directives.set_proxy_id(&name);
        self.name = Some(name);
    }
}
