//! Replays every kept input of every fuzz target on stable: the seeds under
//! `fuzz/seeds/<target>/` and the inputs that once found a bug under
//! `fuzz/regressions/<target>/`. A crash file from `just fuzz` becomes a
//! regression test by moving it into the latter.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::path::Path;

use sluice_fuzz::TARGETS;

fn replay(kind: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind);
    let mut replayed = 0;
    for (target, check) in TARGETS {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            println!("{kind}/{target}: {}", path.display());
            check(&data);
            replayed += 1;
        }
    }
    replayed
}

#[test]
fn seeds_pass_every_check() {
    assert!(replay("seeds") >= TARGETS.len(), "every target has seeds");
}

#[test]
fn past_findings_stay_fixed() {
    replay("regressions");
}

/// A cheap stand-in for fuzzing in every test run: mutated seeds through
/// every check, from a fixed xorshift stream so failures reproduce.
#[test]
fn mutated_seeds_pass_every_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (target, check) in TARGETS {
        let seeds: Vec<Vec<u8>> = std::fs::read_dir(root.join(target))
            .unwrap()
            .map(|entry| std::fs::read(entry.unwrap().path()).unwrap())
            .collect();
        for round in 0..2_000 {
            let mut data = seeds[round % seeds.len()].clone();
            for _ in 0..=(next() % 8) {
                let op = next() % 3;
                let at = if data.is_empty() {
                    0
                } else {
                    (next() as usize) % data.len()
                };
                match op {
                    0 if !data.is_empty() => data[at] = next() as u8,
                    1 => data.insert(at, next() as u8),
                    _ if !data.is_empty() => {
                        data.remove(at);
                    }
                    _ => data.push(next() as u8),
                }
            }
            check(&data);
        }
    }
}
