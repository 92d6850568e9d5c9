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

pub(crate) use gate::{Claim, StreamGate};
pub(crate) use hello::HelloLimits;
pub(crate) use identity::{IdentityPolicy, IdentityRule, PeerIdentity};
pub(crate) use listener::{Exposure, ListenerRefused, Transport, check_listener};
pub(crate) use peers::{ConnectionSlot, PeerLedger, PeerLimits, StreamSlot};
pub(crate) use plausibility::{Ceilings, WindowLedger};
pub(crate) use refusal_log::RefusalLog;
