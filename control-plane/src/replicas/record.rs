//! The leader's directive table as it travels through the store: every
//! directive in force and the mode policy, stamped with the leader's fence
//! and a version.
//!
//! The record is the whole table, not a delta, so a replica that missed
//! records, joined late or follows a new leader converges by reading one.
//! It is a `DirectiveBatch` (the message proxies already receive) with the
//! fence in `epoch`; proxies never see it as such: each replica pushes the
//! difference to its own streams under its own epoch.

use std::collections::BTreeMap;

use prost::Message;
use sluice_proto::v1::{Directive, DirectiveBatch, ModePolicy};

use crate::control::controller::RetiredCell;
use sluice_core::directive::is_lift;

/// A directive's identity: bucket, tenant, priority.
type Key = (String, String, i32);

/// Why a record cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("unreadable directive record: {0}")]
pub(crate) struct RecordError(#[from] prost::DecodeError);

/// A directive table with the fence of the leader that wrote it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    /// The writing leader's fence token (0: nothing written yet).
    pub fence: u64,
    /// Increments with every record; continues across leaders.
    pub(crate) version: u64,
    directives: BTreeMap<Key, Directive>,
    /// The mode policy in force.
    pub(crate) modes: ModePolicy,
}

impl Record {
    /// The table after one control interval of the leader: `changed`
    /// upserted (a lift removes its cell), then `retired` removed; stamped
    /// with `fence` and the next version.
    pub(crate) fn next(
        &self,
        fence: u64,
        changed: &[Directive],
        retired: &[RetiredCell],
        modes: ModePolicy,
    ) -> Self {
        let mut directives = self.directives.clone();
        for directive in changed {
            let key = key_of(directive);
            if is_lift(directive) {
                directives.remove(&key);
            } else {
                directives.insert(key, directive.clone());
            }
        }
        for cell in retired {
            directives.remove(&(
                cell.bucket.as_ref().to_owned(),
                cell.tenant.as_ref().to_owned(),
                cell.priority.to_wire() as i32,
            ));
        }
        Self {
            fence,
            version: self.version.saturating_add(1),
            directives,
            modes,
        }
    }

    /// Whether `self` differs from `other` in what proxies would be told.
    pub(crate) fn same_table(&self, other: &Self) -> bool {
        self.directives == other.directives && self.modes == other.modes
    }

    /// Whether `self` was written after `other`: a later fence, or the same
    /// fence and a later version.
    pub(crate) fn is_after(&self, other: &Self) -> bool {
        (self.fence, self.version) > (other.fence, other.version)
    }

    /// Every directive, in key order.
    pub fn directives(&self) -> impl Iterator<Item = &Directive> {
        self.directives.values()
    }

    /// How many directives the table holds.
    pub fn len(&self) -> usize {
        self.directives.len()
    }

    /// The stored form.
    pub(crate) fn encode(&self) -> Vec<u8> {
        DirectiveBatch {
            epoch: self.fence,
            version: self.version,
            issued_at_unix_ms: 0,
            directives: self.directives.values().cloned().collect(),
            ttl_ms: 0,
            modes: Some(self.modes),
            aggregate_patterns: Vec::new(),
        }
        .encode_to_vec()
    }

    /// Reads the stored form.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let batch = DirectiveBatch::decode(bytes)?;
        Ok(Self {
            fence: batch.epoch,
            version: batch.version,
            directives: batch
                .directives
                .into_iter()
                .map(|directive| (key_of(&directive), directive))
                .collect(),
            modes: batch.modes.unwrap_or_default(),
        })
    }
}

fn key_of(directive: &Directive) -> Key {
    (
        directive.bucket.clone(),
        directive.tenant.clone(),
        directive.priority,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::*;
    use sluice_core::Priority;

    fn directive(bucket: &str, drop_ratio: f64) -> Directive {
        Directive {
            bucket: bucket.to_owned(),
            drop_ratio,
            limit_rps: Some(100.0),
            ..Directive::default()
        }
    }

    #[test]
    fn a_leader_interval_upserts_lifts_and_retires() {
        let first = Record::default().next(
            3,
            &[directive("a", 0.5), directive("b", 0.2)],
            &[],
            ModePolicy::default(),
        );
        assert_eq!((first.fence, first.version, first.len()), (3, 1, 2));
        let lift = Directive {
            bucket: "a".into(),
            ..Directive::default()
        };
        let retired = RetiredCell {
            bucket: Arc::from("b"),
            tenant: Arc::from(""),
            priority: Priority::Unspecified,
        };
        let second = first.next(
            3,
            &[lift, directive("c", 0.1)],
            &[retired],
            ModePolicy::default(),
        );
        assert_eq!(
            second
                .directives()
                .map(|d| d.bucket.as_str())
                .collect::<Vec<_>>(),
            ["c"]
        );
        assert!(second.is_after(&first));
    }

    #[test]
    fn a_new_fence_is_after_any_version_of_an_older_one() {
        let old = Record {
            fence: 4,
            version: 900,
            ..Record::default()
        };
        let new = Record {
            fence: 5,
            version: 901,
            ..Record::default()
        };
        assert!(new.is_after(&old));
        assert!(!old.is_after(&new));
        assert!(!old.is_after(&old));
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let record = Record::default().next(7, &[directive("a", 0.25)], &[], ModePolicy::default());
        let read = Record::decode(&record.encode()).unwrap();
        assert_eq!(read, record);
        assert!(Record::decode(&[0xff, 0xff, 0xff]).is_err());
    }
}
