//! Quota counters in Redis (`--store`): every counted descriptor of one
//! ShouldRateLimit request is decided by one `EVALSHA` of
//! [`counters.lua`](counters.lua), which runs the algorithms of
//! [`super::algorithm`] inside Redis, so that any number of control-plane
//! processes count against the same counters exactly.
//!
//! - **Clock**: the script reads Redis's own clock (`TIME`), so processes
//!   on machines whose clocks disagree still share one window boundary.
//! - **Keys**: `sluice:v1:{q:<domain>}:<algorithm>:<counter>`. The hash
//!   tag is the domain (with a prefix, so an empty domain still makes one): all keys of one request share a Redis Cluster slot
//!   (one script may only touch one slot), whatever descriptors it
//!   combines. The price: one domain lives on one cluster node; domains
//!   spread over the nodes. The algorithm is part of the key because the
//!   state means something else under each (a GCRA schedule in µs, a
//!   window start in ms). `v1` versions the state's layout.
//! - **Expiry**: two windows after the last hit.
//! - **Failures**: each call is bounded by `--store-timeout-ms`; a timeout
//!   or an error fails every descriptor of the request, and the service
//!   answers by its failure policy.

use redis::Script;

use super::algorithm::{Algorithm, Decision, Quota};
use super::store::CountError;
use crate::store::{Store, StoreConnection};

/// Version of the keys' layout and the state they hold.
const KEY_VERSION: &str = "v1";

/// One descriptor to count.
#[derive(Debug, Clone)]
pub struct Count {
    /// The descriptor's counter (see `service::counter_key`).
    pub counter: String,
    /// Its quota.
    pub quota: Quota,
    /// Hits to add.
    pub hits: u32,
}

/// Counters in the shared store.
#[derive(Debug, Clone)]
pub struct RedisCounters {
    store: Store,
    script: Script,
}

impl RedisCounters {
    /// Counters in `store`; loads the script so that the first request
    /// already takes one round trip (a server that lost it, after a
    /// restart or a `SCRIPT FLUSH`, gets it again on `NOSCRIPT`).
    pub async fn new(store: Store) -> Result<Self, crate::store::StoreError> {
        let script = Script::new(include_str!("counters.lua"));
        let mut connection = store.connection();
        script.load_async(&mut connection).await.map_err(|err| {
            crate::store::StoreError::Connect {
                url: store.url().to_string(),
                reason: format!("cannot load the quota script: {err}"),
            }
        })?;
        Ok(Self { store, script })
    }

    /// Decides `counts` of a request of `domain` on Redis's clock, in one
    /// call bounded by the store's timeout, over `connection` when given
    /// (a runtime's own, [`Self::open_connection`]), else the store's.
    pub async fn decide(
        &self,
        domain: &str,
        algorithm: Algorithm,
        counts: &[Count],
        connection: Option<&StoreConnection>,
    ) -> Result<Vec<Decision>, CountError> {
        let mut connection = connection
            .cloned()
            .unwrap_or_else(|| self.store.connection());
        self.decide_on(&mut connection, domain, algorithm, counts, None)
            .await
    }

    /// A connection of its own, whose reads and writes run on the runtime
    /// that opens it: a thread with a runtime of its own
    /// ([`crate::serve::rls_listener`]) then never wakes another thread
    /// for a quota's round trip. Calls are bounded as the store's are.
    pub async fn open_connection(&self) -> Result<StoreConnection, redis::RedisError> {
        self.store.connection_bounded(self.store.timeout()).await
    }

    /// As [`Self::decide`], at `now_ms` when given instead of Redis's
    /// clock: the service never passes one; it lets the script be checked
    /// against [`super::algorithm`] on the same instants.
    pub async fn decide_at(
        &self,
        domain: &str,
        algorithm: Algorithm,
        counts: &[Count],
        now_ms: Option<u64>,
    ) -> Result<Vec<Decision>, CountError> {
        let mut connection = self.store.connection();
        self.decide_on(&mut connection, domain, algorithm, counts, now_ms)
            .await
    }

    async fn decide_on(
        &self,
        connection: &mut StoreConnection,
        domain: &str,
        algorithm: Algorithm,
        counts: &[Count],
        now_ms: Option<u64>,
    ) -> Result<Vec<Decision>, CountError> {
        if counts.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.script.prepare_invoke();
        invocation
            .arg(algorithm_name(algorithm))
            .arg(now_ms.map(|ms| ms.to_string()).unwrap_or_default());
        for count in counts {
            invocation
                .key(redis_key(domain, algorithm, &count.counter))
                .arg(count.quota.limit)
                .arg(count.quota.window_ms)
                .arg(count.quota.burst)
                .arg(count.hits);
        }
        let call = invocation.invoke_async::<Vec<(i64, i64, i64, i64)>>(connection);
        let answers = tokio::time::timeout(self.store.timeout(), call)
            .await
            .map_err(|_| CountError::Timeout)?
            .map_err(|err| {
                if err.is_timeout() {
                    CountError::Timeout
                } else {
                    CountError::Unavailable(err.to_string())
                }
            })?;
        if answers.len() != counts.len() {
            return Err(CountError::Unavailable(format!(
                "{} answers to {} descriptors",
                answers.len(),
                counts.len()
            )));
        }
        Ok(answers
            .into_iter()
            .map(|(admitted, remaining, reset_ms, used)| Decision {
                admitted: admitted == 1,
                remaining: u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
                reset_ms: u64::try_from(reset_ms).unwrap_or(0),
                used: u64::try_from(used).unwrap_or(0),
            })
            .collect())
    }
}

fn algorithm_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fixed",
        Algorithm::SlidingWindow => "sliding",
        Algorithm::Gcra => "gcra",
    }
}

/// The Redis key of `counter` in `domain` under `algorithm`.
pub fn redis_key(domain: &str, algorithm: Algorithm, counter: &str) -> String {
    format!(
        "sluice:{KEY_VERSION}:{{q:{domain}}}:{}:{counter}",
        algorithm_name(algorithm)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's hash tag: the part between the first `{` and the
    /// next `}`, if not empty; else the whole key.
    fn hash_tag(key: &str) -> &str {
        key.find('{')
            .and_then(|open| {
                let rest = key.get(open + 1..)?;
                let close = rest.find('}')?;
                (close > 0).then(|| rest.get(..close)).flatten()
            })
            .unwrap_or(key)
    }

    #[test]
    fn keys_of_one_domain_share_a_slot_and_algorithms_do_not_mix() {
        let a = redis_key("api", Algorithm::Gcra, "3:api4:user1:a");
        let b = redis_key("api", Algorithm::Gcra, "3:api4:path2:/x");
        assert_eq!(a, "sluice:v1:{q:api}:gcra:3:api4:user1:a");
        assert_eq!(hash_tag(&a), hash_tag(&b));
        assert_ne!(
            a,
            redis_key("api", Algorithm::FixedWindow, "3:api4:user1:a")
        );
        assert_ne!(
            hash_tag(&a),
            hash_tag(&redis_key("web", Algorithm::Gcra, "3:web4:user1:a"))
        );
        // A brace in a domain cuts the tag short, but the same way for every
        // key of that domain: they still share a slot.
        let odd = |counter| redis_key("a}b", Algorithm::Gcra, counter);
        assert_eq!(hash_tag(&odd("x")), hash_tag(&odd("y")));
        let empty = |counter| redis_key("", Algorithm::Gcra, counter);
        assert_eq!(hash_tag(&empty("x")), "q:");
        assert_eq!(hash_tag(&empty("x")), hash_tag(&empty("y")));
    }
}
