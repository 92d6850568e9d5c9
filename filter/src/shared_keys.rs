//! Names of the shared-data keys and the shared queue every VM of the
//! `vm_id` uses. Versioned so an incompatible future layout cannot be
//! misread during a rolling upgrade of the module.

/// The directive table (an encoded `DirectiveBatch`), written by the leader.
pub const DIRECTIVES_KEY: &str = "sluice.v1.directives";
/// The table's sequence number, the arrival time of the last batch and its
/// TTL (see [`crate::freshness::DirectivesMeta`]): small, so every VM can
/// read it on every short tick and read the table only when it changed.
pub const DIRECTIVES_META_KEY: &str = "sluice.v1.directives_meta";
/// VMs serving requests (u32 LE), written by the leader.
pub const WORKERS_KEY: &str = "sluice.v1.workers";
/// The leader lease (see [`crate::lease`]).
pub const LEASE_KEY: &str = "sluice.v1.leader";
/// The process-wide instance id sent in `Hello`.
pub const INSTANCE_ID_KEY: &str = "sluice.v1.instance_id";
/// The queue through which VMs hand their counts to the leader
/// ([`crate::report_window::Handoff`] messages).
pub const COUNTS_QUEUE: &str = "sluice.v2.counts";
/// The process's offered rate per limited cell over the last second
/// ([`crate::process_rates`]), written by the leader on every slow tick.
pub const PROCESS_RATES_KEY: &str = "sluice.v1.process_rates";
