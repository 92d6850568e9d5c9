//! Whether a data plane's directives are current, and what it does once
//! they are not: the regime every request is decided in.

/// What a VM does with the directives it holds once they are older than
/// their TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Keep applying the last directives.
    KeepLast,
    /// Enforce each cell's limit locally: its stated limit over the
    /// reporting proxies, split evenly between the VMs serving requests.
    LocalLimit,
    /// Let everything through.
    Allow,
}

/// Whether the directives are current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Regime {
    /// Within the TTL.
    Fresh,
    /// Past the TTL: the configured fallback applies.
    Stale(Fallback),
}
