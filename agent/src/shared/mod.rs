//! Everything the VMs of one Envoy exchange through shared data and the
//! shared queue: each record's key, layout and version, encoded and decoded
//! here and nowhere else.
//!
//! | key | written by | read by | record |
//! | --- | --- | --- | --- |
//! | [`LEASE_KEY`] | every VM (compare-and-swap) | every VM, each tick | [`Lease`] |
//! | [`INSTANCE_ID_KEY`] | the first leader | each new leader | [`InstanceId`] |
//! | [`DIRECTIVES_KEY`] | the leader | every VM, when the meta changed | the wire protocol's `DirectiveBatch` ([`crate::directives::DirectiveTable::encode`]) |
//! | [`DIRECTIVES_META_KEY`] | the leader | every VM, each short tick | [`DirectivesMeta`] |
//! | [`WORKERS_KEY`] | the leader | every VM, each slow tick | [`WorkerCount`] |
//! | [`PROCESS_RATES_KEY`] | the leader | every VM, each slow tick | [`process_rates`] |
//! | [`WINDOW_END_KEY`] | the leader | every follower, each short tick | [`WindowEnd`] |
//! | [`COUNTS_QUEUE`] (a queue) | every follower | the leader | [`Handoff`] |
//!
//! The version in a key's name is its record's layout version. VMs of two
//! builds of the module share one `vm_id` while Envoy swaps them (a
//! configuration update), so a change a reader of the previous layout
//! would misread gets a new version, and readers refuse what they do not
//! know (every `decode` fails) rather than guess. A record that only
//! grows (the meta's `stream_lost`) keeps its name and reads both lengths.

mod directives_meta;
mod handoff;
mod instance_id;
mod lease;
pub(crate) mod process_rates;
mod window_end;
mod worker_count;

pub(crate) use directives_meta::DirectivesMeta;
pub(crate) use handoff::Handoff;
pub(crate) use instance_id::InstanceId;
pub(crate) use lease::Lease;
pub(crate) use window_end::WindowEnd;
pub(crate) use worker_count::WorkerCount;

/// The directive table (an encoded `DirectiveBatch`), written by the leader.
pub(crate) const DIRECTIVES_KEY: &str = "sluice.v1.directives";
/// The table's sequence number, the arrival time of the last batch and its
/// TTL ([`DirectivesMeta`]): small, so every VM can read it on every short
/// tick and read the table only when it changed.
pub(crate) const DIRECTIVES_META_KEY: &str = "sluice.v1.directives_meta";
/// VMs serving requests ([`WorkerCount`]), written by the leader.
pub(crate) const WORKERS_KEY: &str = "sluice.v1.workers";
/// The leader lease ([`Lease`], see [`crate::tick::lease`]).
pub(crate) const LEASE_KEY: &str = "sluice.v1.leader";
/// The process-wide instance id sent in `Hello` ([`InstanceId`]).
pub(crate) const INSTANCE_ID_KEY: &str = "sluice.v1.instance_id";
/// The queue through which VMs hand their counts to the leader
/// ([`Handoff`] messages; version 2 added the span they cover).
pub(crate) const COUNTS_QUEUE: &str = "sluice.v2.counts";
/// The process's offered rate per limited cell over the last second
/// ([`process_rates`]), written by the leader on every slow tick.
pub(crate) const PROCESS_RATES_KEY: &str = "sluice.v1.process_rates";
/// When the leader closed its last report window ([`WindowEnd`]): a
/// follower that has not handed off past it does so on its next short
/// tick.
pub(crate) const WINDOW_END_KEY: &str = "sluice.v1.window_end";
