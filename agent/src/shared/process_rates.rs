//! The process rates' record: per limited cell, each VM's offered rate over
//! the last second, as the leader counts them (see [`crate::leader::process_rates`]).
//!
//! Layout: a version byte, a `u32` cell count, then per cell a `u16` key
//! length, the key bytes, a `u8` flag (1: traffic for the whole window), a
//! `u8` source count and per source its `u64` id and rate as an `f32`, all
//! little-endian.

use crate::fast_map::{self, FastMap};

/// Layout version of the published bytes.
const VERSION: u8 = 2;
/// Most cells published: the key is read by every VM on every slow tick.
pub(crate) const MAX_PUBLISHED: usize = 4_096;

/// The record being written: cells are added one by one; past
/// [`MAX_PUBLISHED`] cells, or with a key or a source list the layout cannot
/// hold, a cell is left out.
#[derive(Debug)]
pub(crate) struct PublishedRates {
    bytes: Vec<u8>,
    cells: u32,
}

impl PublishedRates {
    /// An empty record.
    pub(crate) fn new() -> Self {
        let mut bytes = vec![VERSION];
        bytes.extend_from_slice(&0u32.to_le_bytes());
        Self { bytes, cells: 0 }
    }

    /// Adds a cell: whether it had traffic for the whole window, and each
    /// source's id and rate in requests per second (under a cost budget,
    /// estimated cost per second).
    pub(crate) fn push(
        &mut self,
        key: &str,
        established: bool,
        sources: impl ExactSizeIterator<Item = (u64, f64)>,
    ) {
        let (Ok(key_len), Ok(count)) = (u16::try_from(key.len()), u8::try_from(sources.len()))
        else {
            return;
        };
        if self.cells as usize >= MAX_PUBLISHED {
            return;
        }
        self.cells += 1;
        self.bytes.extend_from_slice(&key_len.to_le_bytes());
        self.bytes.extend_from_slice(key.as_bytes());
        self.bytes.push(u8::from(established));
        self.bytes.push(count);
        for (source, rate) in sources {
            self.bytes.extend_from_slice(&source.to_le_bytes());
            self.bytes.extend_from_slice(&(rate as f32).to_le_bytes());
        }
    }

    /// The stored form.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        if let Some(count) = self.bytes.get_mut(1..5) {
            count.copy_from_slice(&self.cells.to_le_bytes());
        }
        self.bytes
    }
}

impl Default for PublishedRates {
    fn default() -> Self {
        Self::new()
    }
}

/// One VM's view of a cell's process traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessShare {
    /// The VM's part of the process's offered rate, in `[0, 1]`.
    pub share: f64,
    /// The process's offered rate, in requests per second (under a cost
    /// budget, estimated cost per second).
    pub total_rps: f64,
    /// Whether the cell has had traffic for the whole window, so that its
    /// rate says what the process offers (not a cell just starting).
    pub established: bool,
}

/// Reads the published form as `source`'s share of each cell's process
/// traffic (0 where `source` has none); `None` if the bytes are not a form
/// this build writes.
pub(crate) fn shares_of(bytes: &[u8], source: u64) -> Option<FastMap<String, ProcessShare>> {
    let (&version, rest) = bytes.split_first()?;
    if version != VERSION {
        return None;
    }
    let (count, mut rest) = rest.split_first_chunk::<4>()?;
    let count = usize::try_from(u32::from_le_bytes(*count)).ok()?;
    let mut shares = fast_map::new();
    for _ in 0..count.min(MAX_PUBLISHED) {
        let (len, tail) = rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_le_bytes(*len));
        let key = std::str::from_utf8(tail.get(..len)?).ok()?;
        let (&established, tail) = tail.get(len..)?.split_first()?;
        let (&sources, mut tail) = tail.split_first()?;
        let mut total = 0.0;
        let mut own = None;
        for _ in 0..sources {
            let (id, after_id) = tail.split_first_chunk::<8>()?;
            let (rate, after_rate) = after_id.split_first_chunk::<4>()?;
            let rate = f64::from(f32::from_le_bytes(*rate));
            if rate.is_finite() && rate >= 0.0 {
                total += rate;
                if u64::from_le_bytes(*id) == source {
                    own = Some(rate);
                }
            }
            tail = after_rate;
        }
        if total > 0.0 {
            let share = own.unwrap_or(0.0) / total;
            shares.insert(
                key.to_owned(),
                ProcessShare {
                    share,
                    total_rps: total,
                    established: established == 1,
                },
            );
        }
        rest = tail;
    }
    Some(shares)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn cells_past_the_bound_are_left_out() {
        let mut written = PublishedRates::new();
        for i in 0..MAX_PUBLISHED + 10 {
            written.push(&format!("c{i}"), true, [(1, 2.0)].into_iter());
        }
        let shares = shares_of(&written.finish(), 1).unwrap_or_default();
        assert_eq!(shares.len(), MAX_PUBLISHED);
        assert!(
            shares
                .values()
                .all(|p| p.share == 1.0 && p.total_rps == 2.0)
        );
    }

    #[test]
    fn malformed_bytes_are_refused() {
        assert!(shares_of(&[], 1).is_none());
        assert!(shares_of(&[1, 0, 0, 0, 0], 1).is_none());
        assert!(shares_of(&[2, 1, 0, 0, 0, 5, 0, b'a'], 1).is_none());
        assert!(shares_of(&[2, 1, 0, 0, 0, 1, 0, b'a', 0, 1, 1], 1).is_none());
        assert_eq!(shares_of(&[2, 0, 0, 0, 0], 1).map(|m| m.len()), Some(0));
    }
}
