//! The filters' gRPC listener as a trust boundary: where it may listen
//! without mutual TLS, which proxy ids a client certificate may claim, and
//! how much one report may say.
//!
//! The per-bucket bound on one proxy's weight in the fleet sum is applied
//! where the sum is made, in [`crate::fleet::ShareCap`].

mod gate;
mod identity;
mod listener;
mod plausibility;
mod refusal_log;

pub use gate::StreamGate;
pub use identity::{IdentityPolicy, IdentityRule, PeerIdentity, Refusal};
pub use listener::{Exposure, ListenerRefused, Transport, check_listener};
pub use plausibility::{Ceilings, Checked, WindowLedger};
pub use refusal_log::RefusalLog;
