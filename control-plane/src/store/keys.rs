//! The store keys replicas share, and the format they are written in.
//!
//! Every key carries the hash tag `{fleet}`, so they all live in one Redis
//! Cluster slot: the lease and the directive table are read and written
//! together by one script, which Redis Cluster allows only within a slot.
//! The traffic is a few commands per replica per control interval (see
//! docs/replicas.md), so one slot is not a bottleneck. `v1` versions the
//! layout; the format key lets a replica of another layout refuse the
//! store instead of misreading it.

/// The layout this build writes and reads.
pub(crate) const FORMAT: &str = "1";

/// Key names.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The format key (unversioned: it names the version).
    pub format: String,
    /// Sorted set: replica id → when it last published (Unix ms); an index
    /// of the load keys, pruned of long-gone replicas.
    pub(crate) replicas: String,
    /// The leader lease: `"<replica id> <fence>"`, expiring.
    pub leader: String,
    /// The fence counter: incremented by every new lease.
    pub(crate) fence: String,
    /// The leader's directive table ([`crate::replicas::record`]).
    pub(crate) directives: String,
    /// The shared configuration: the limits file's YAML
    /// ([`crate::config::shared`]).
    pub(crate) config: String,
    /// Its version, incremented by every write.
    pub(crate) config_version: String,
    /// The configuration's write lock (a random token, expiring).
    pub(crate) config_lock: String,
    load_prefix: String,
}

impl Default for Keys {
    fn default() -> Self {
        Self {
            format: "sluice:{fleet}:format".to_owned(),
            replicas: "sluice:v1:{fleet}:replicas".to_owned(),
            leader: "sluice:v1:{fleet}:leader".to_owned(),
            fence: "sluice:v1:{fleet}:fence".to_owned(),
            directives: "sluice:v1:{fleet}:directives".to_owned(),
            config: "sluice:v1:{fleet}:config".to_owned(),
            config_version: "sluice:v1:{fleet}:config:version".to_owned(),
            config_lock: "sluice:v1:{fleet}:config:lock".to_owned(),
            load_prefix: "sluice:v1:{fleet}:load:".to_owned(),
        }
    }
}

impl Keys {
    /// The key of one replica's load share (expiring).
    pub fn load(&self, replica: &str) -> String {
        format!("{}{replica}", self.load_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').unwrap_or(0);
        let close = key.find('}').unwrap_or(key.len());
        key.get(open + 1..close).unwrap_or(key)
    }

    #[test]
    fn every_key_shares_one_cluster_slot() {
        let keys = Keys::default();
        for key in [
            &keys.format,
            &keys.replicas,
            &keys.leader,
            &keys.fence,
            &keys.directives,
            &keys.config,
            &keys.config_version,
            &keys.config_lock,
            &keys.load("r-1"),
            &keys.load("{odd}"),
        ] {
            assert_eq!(hash_tag(key), "fleet", "{key}");
        }
    }
}
