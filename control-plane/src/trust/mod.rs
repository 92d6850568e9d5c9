//! The filters' gRPC listener as a trust boundary: where it may listen
//! without mutual TLS, how much of the listener one peer may hold, what a
//! Hello may name, which proxy ids a client certificate may claim, and how
//! much one report may say.
//!
//! The per-bucket bound on one proxy's weight in the fleet sum (and the
//! probation of new proxies) is applied where the sum is made, in
//! [`crate::fleet::ShareCap`].

mod gate;
pub(crate) mod hello;
pub(crate) mod identity;
mod listener;
mod peers;
pub(crate) mod plausibility;
mod refusal_log;

pub use gate::{Claim, StreamGate};
pub use hello::HelloLimits;
pub use identity::{IdentityPolicy, IdentityRule, PeerIdentity};
pub use listener::{Exposure, ListenerRefused, Transport, check_listener};
pub use peers::{ConnectionSlot, PeerLedger, PeerLimits, StreamSlot};
pub use plausibility::{Ceilings, WindowLedger};
pub use refusal_log::RefusalLog;
