//! The directive table's tests: merging batches, lookups, aggregates, modes
//! and the 429s rendered per cell.

use super::*;
use sluice_proto::v1::{Mode, ModePolicy, Reason};
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

pub(crate) fn directive(bucket: &str, drop_ratio: f64) -> Directive {
    Directive {
        bucket: bucket.into(),
        drop_ratio,
        limit_rps: Some(10.0),
        ..Default::default()
    }
}

fn cell_directive(bucket: &str, tenant: &str, priority: Priority, drop_ratio: f64) -> Directive {
    Directive {
        tenant: tenant.into(),
        priority: priority as i32,
        ..directive(bucket, drop_ratio)
    }
}

fn batch(epoch: u64, version: u64, directives: Vec<Directive>) -> DirectiveBatch {
    DirectiveBatch {
        epoch,
        version,
        issued_at_unix_ms: 1,
        directives,
        ..Default::default()
    }
}

#[test]
fn merge_keeps_unnamed_buckets() {
    let mut table = DirectiveTable::new(100);
    table.merge(batch(1, 1, vec![directive("a", 0.5), directive("b", 0.25)]));
    let outcome = table.merge(batch(1, 2, vec![directive("a", 0.75)]));
    assert_eq!(
        outcome,
        MergeOutcome {
            applied: 1,
            rejected: 0
        }
    );
    assert_eq!(table.drop_ratio("a").map(DropRatio::get), Some(0.75));
    assert_eq!(table.drop_ratio("b").map(DropRatio::get), Some(0.25));
    assert_eq!(table.provenance().version, 2);
}

#[test]
fn zero_is_kept_but_never_drops() {
    let mut table = DirectiveTable::new(100);
    table.merge(batch(1, 1, vec![directive("a", 1.0)]));
    assert_eq!(table.threshold("a"), DropRatio::ALWAYS.threshold());
    assert_eq!(table.shedding(), 1);
    table.merge(batch(1, 2, vec![directive("a", 0.0)]));
    assert_eq!(table.threshold("a"), DropThreshold::NEVER);
    assert_eq!(table.len(), 1, "a known bucket is not a new bucket");
    assert_eq!(table.shedding(), 0);
}

#[test]
fn a_new_epoch_is_merged_not_rejected() {
    let mut table = DirectiveTable::new(100);
    table.merge(batch(7, 40, vec![directive("a", 0.5), directive("b", 0.5)]));
    table.merge(batch(8, 1, vec![directive("b", 0.1)]));
    assert_eq!(table.drop_ratio("a").map(DropRatio::get), Some(0.5));
    assert_eq!(table.drop_ratio("b").map(DropRatio::get), Some(0.1));
    assert_eq!(table.provenance().epoch, 8);
}

#[test]
fn invalid_directives_are_counted_and_skipped() {
    let mut table = DirectiveTable::new(100);
    let outcome = table.merge(batch(
        1,
        1,
        vec![
            directive("", 0.5),
            directive(&"x".repeat(MAX_BUCKET_KEY_BYTES + 1), 0.5),
            directive("nan", f64::NAN),
            directive("neg", -0.1),
            directive("big", 1.5),
            directive("inf", f64::INFINITY),
            Directive {
                limit_rps: Some(-1.0),
                ..directive("neg-limit", 0.5)
            },
            Directive {
                share_rps: f64::NAN,
                ..directive("nan-share", 0.5)
            },
            Directive {
                tenant: "t".repeat(sluice_core::MAX_TENANT_BYTES + 1),
                ..directive("long-tenant", 0.5)
            },
            directive("ok", 0.5),
        ],
    ));
    assert_eq!(
        outcome,
        MergeOutcome {
            applied: 1,
            rejected: 9
        }
    );
    assert_eq!(table.len(), 1);
}

#[test]
fn the_table_is_bounded() {
    let mut table = DirectiveTable::new(2);
    let outcome = table.merge(batch(
        1,
        1,
        vec![
            directive("a", 0.5),
            directive("b", 0.5),
            directive("c", 0.5),
        ],
    ));
    assert_eq!(
        outcome,
        MergeOutcome {
            applied: 2,
            rejected: 1
        }
    );
    let outcome = table.merge(batch(1, 2, vec![directive("a", 0.9)]));
    assert_eq!(outcome.applied, 1);
}

#[test]
fn exact_cell_then_bucket_wide() {
    let mut table = DirectiveTable::new(100);
    table.merge(batch(
        1,
        1,
        vec![
            directive("api", 0.1),
            cell_directive("api", "acme", Priority::Bulk, 0.9),
            cell_directive("api", "", Priority::Critical, 0.0),
        ],
    ));
    let exact = key_of("api", "acme", Priority::Bulk);
    let i = table.find(Some(&exact), "api").unwrap();
    assert_eq!(table.entry_mut(i).unwrap().directive.drop_ratio.get(), 0.9);
    // Another tenant falls back to the bucket-wide directive.
    let other = key_of("api", "globex", Priority::Bulk);
    let i = table.find(Some(&other), "api").unwrap();
    assert_eq!(table.entry_mut(i).unwrap().directive.drop_ratio.get(), 0.1);
    let critical = key_of("api", "", Priority::Critical);
    let i = table.find(Some(&critical), "api").unwrap();
    assert_eq!(table.entry_mut(i).unwrap().directive.drop_ratio.get(), 0.0);
    assert_eq!(table.find(None, "unknown"), None);
    assert!(table.cell("api", "acme", Priority::Bulk).is_some());
    assert!(table.cell("api", "acme", Priority::Critical).is_none());
}

#[test]
fn responses_are_rendered_per_cell_when_applied() {
    let mut table = DirectiveTable::new(100);
    table.merge(batch(
        1,
        1,
        vec![Directive {
            share_rps: 40.0,
            reason: Reason::TenantQuotaExceeded as i32,
            retry_after_ms: 2500,
            ..cell_directive("api", "acme", Priority::Unspecified, 0.5)
        }],
    ));
    let entry = table.cell("api", "acme", Priority::Unspecified).unwrap();
    assert_eq!(entry.response.header("x-ratelimit-limit"), Some("40"));
    assert_eq!(entry.response.header("retry-after"), Some("3"));
    assert_eq!(
        entry.response.header("x-ratelimit-reason"),
        Some("tenant_quota_exceeded")
    );
    assert_eq!(
        entry.fallback_response.header("x-ratelimit-reason"),
        Some("local_fallback_limit")
    );
}

#[test]
fn modes_are_resolved_when_applied_and_when_the_policy_changes() {
    let mut table = DirectiveTable::with_settings(100, Arc::default(), "envoy-a");
    table.merge(batch(
        1,
        1,
        vec![
            directive("inherit", 0.5),
            Directive {
                mode: Mode::Shadow as i32,
                ..directive("shadow", 0.5)
            },
            Directive {
                mode: Mode::Enforce as i32,
                ..directive("enforce", 0.5)
            },
        ],
    ));
    let enforced =
        |t: &DirectiveTable, b: &str| t.cell(b, "", Priority::Unspecified).unwrap().enforce;
    assert!(
        enforced(&table, "inherit") && !enforced(&table, "shadow") && enforced(&table, "enforce")
    );
    let mut shadow_default = batch(1, 2, vec![]);
    shadow_default.modes = Some(ModePolicy {
        default_mode: Mode::Shadow as i32,
        ..Default::default()
    });
    assert!(table.changes_with(&shadow_default));
    table.merge(shadow_default.clone());
    assert!(!table.changes_with(&shadow_default));
    assert!(!enforced(&table, "inherit") && enforced(&table, "enforce"));
    let mut kill = batch(1, 3, vec![]);
    kill.modes = Some(ModePolicy {
        kill_switch: true,
        ..Default::default()
    });
    table.merge(kill);
    assert!(!enforced(&table, "enforce"));
    // A batch without a policy means "enforce, no kill switch".
    table.merge(batch(1, 4, vec![]));
    assert!(enforced(&table, "inherit"));
}

#[test]
fn canary_membership_follows_a_name_learnt_later() {
    use crate::modes::canary_point;
    let (unnamed, named) = (canary_point(""), canary_point("envoy-a"));
    assert_ne!(unnamed < 0.5, named < 0.5, "the two points straddle 0.5");
    let mut table = DirectiveTable::new(100);
    let mut b = batch(1, 1, vec![directive("a", 0.5)]);
    b.modes = Some(ModePolicy {
        canary_fraction: Some(0.5),
        ..Default::default()
    });
    table.merge(b);
    let enforced = |t: &DirectiveTable| t.cell("a", "", Priority::Unspecified).unwrap().enforce;
    assert_eq!(enforced(&table), unnamed < 0.5);
    table.set_proxy_id("envoy-a");
    assert_eq!(enforced(&table), named < 0.5);
    assert_eq!(table.modes().canary_fraction, Some(0.5));
    // A VM's next read of the shared table keeps the name.
    let (reread, _) = DirectiveTable::decode_replacing(&table.encode(), &table).unwrap();
    assert_eq!(enforced(&reread), named < 0.5);
}

#[test]
fn encode_decode_round_trips() {
    let mut table = DirectiveTable::new(100);
    let mut b = batch(
        3,
        9,
        vec![
            directive("b", 0.5),
            directive("a", 0.125),
            cell_directive("a", "t", Priority::Bulk, 0.25),
        ],
    );
    b.ttl_ms = 5000;
    b.modes = Some(ModePolicy {
        kill_switch: false,
        default_mode: Mode::Shadow as i32,
        canary_fraction: Some(0.5),
    });
    table.merge(b);
    let bytes = table.encode();
    let (decoded, outcome) = DirectiveTable::decode(&bytes, 100).unwrap();
    assert_eq!(decoded, table);
    assert_eq!(decoded.ttl_ms(), 5000);
    assert_eq!(decoded.modes(), table.modes());
    assert_eq!(
        outcome,
        MergeOutcome {
            applied: 3,
            rejected: 0
        }
    );
    assert_eq!(decoded.encode(), bytes);
    // The bytes are a `DirectiveBatch` any protobuf reader takes: the
    // table's fields and its directives sorted by cell.
    let read = DirectiveBatch::decode(bytes.as_slice()).unwrap();
    assert_eq!((read.epoch, read.version, read.ttl_ms), (3, 9, 5000));
    assert_eq!(read.modes, table.modes().to_policy());
    let cells: Vec<(&str, &str)> = read
        .directives
        .iter()
        .map(|d| (d.bucket.as_str(), d.tenant.as_str()))
        .collect();
    assert_eq!(cells, [("a", ""), ("a", "t"), ("b", "")]);
}

#[test]
fn aggregate_patterns_are_validated_kept_and_shared() {
    let mut table = DirectiveTable::new(100);
    assert_eq!(table.aggregate_of("free-a"), None);
    let mut b = batch(1, 1, vec![directive("free-*", 0.5)]);
    let too_long = format!("{}*", "x".repeat(MAX_BUCKET_KEY_BYTES));
    b.aggregate_patterns = vec!["free-*".into(), String::new(), too_long, "*-eu".into()];
    let generation = table.generation();
    assert!(table.changes_with(&b));
    let outcome = table.merge(b.clone());
    assert_eq!(outcome.rejected, 2, "the empty and the oversized pattern");
    assert_ne!(table.generation(), generation);
    // First match first; the pattern's own name matches itself.
    assert_eq!(table.aggregate_of("free-a"), Some("free-*"));
    assert_eq!(table.aggregate_of("free-eu"), Some("free-*"));
    assert_eq!(table.aggregate_of("paid-eu"), Some("*-eu"));
    assert_eq!(table.aggregate_of("free-*"), Some("free-*"));
    assert_eq!(table.aggregate_of("paid"), None);
    // Other VMs read them from the shared form.
    let (decoded, _) = DirectiveTable::decode(&table.encode(), 100).unwrap();
    assert_eq!(decoded.aggregate_of("free-a"), Some("free-*"));
    // A batch with the same patterns changes nothing; without them, it
    // takes them away (each batch carries the list, as the modes).
    b.directives.clear();
    assert!(!table.changes_with(&b));
    b.aggregate_patterns.clear();
    assert!(table.changes_with(&b));
    table.merge(b);
    assert_eq!(table.aggregate_of("free-a"), None);

    let mut many = batch(1, 2, Vec::new());
    many.aggregate_patterns = (0..40).map(|i| format!("p{i}-*")).collect();
    let outcome = table.merge(many);
    assert_eq!(outcome.rejected, 40 - MAX_AGGREGATE_PATTERNS);
    assert_eq!(table.aggregate_of("p31-x"), Some("p31-*"));
    assert_eq!(table.aggregate_of("p32-x"), None);
}

#[test]
fn state_is_adopted_across_rebuilds() {
    let mut old = DirectiveTable::new(100);
    old.merge(batch(
        1,
        1,
        vec![
            directive("a", 0.5),
            cell_directive("a", "t", Priority::Bulk, 0.5),
        ],
    ));
    for i in 0..old.len() {
        old.entry_mut(i).unwrap().state.fallback = Some(Gcra::per_second(5.0, 42));
    }
    let (mut new, _) = DirectiveTable::decode(&old.encode(), 100).unwrap();
    new.adopt_state(&mut old);
    for i in 0..new.len() {
        assert!(new.entry_mut(i).unwrap().state.fallback.is_some());
    }
}

#[test]
fn garbage_is_an_error() {
    assert!(DirectiveTable::decode(&[0xff, 0xff, 0xff], 100).is_err());
}

#[cfg(not(target_arch = "wasm32"))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok((table, _)) = DirectiveTable::decode(&bytes, 16) {
                prop_assert!(table.len() <= 16);
            }
        }

        #[test]
        fn decoded_ratios_are_always_valid(ratios in proptest::collection::vec(any::<f64>(), 0..32)) {
            let directives = ratios
                .iter()
                .enumerate()
                .map(|(i, r)| Directive { bucket: format!("b{i}"), drop_ratio: *r, ..Default::default() })
                .collect();
            let bytes = DirectiveBatch { epoch: 1, version: 1, directives, ..Default::default() }.encode_to_vec();
            let (table, outcome) = DirectiveTable::decode(&bytes, 1000)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(outcome.applied + outcome.rejected, ratios.len());
            for i in 0..ratios.len() {
                if let Some(ratio) = table.drop_ratio(&format!("b{i}")) {
                    prop_assert!((0.0..=1.0).contains(&ratio.get()));
                }
            }
        }
    }
}

#[test]
fn every_change_of_what_find_returns_changes_the_generation() {
    let mut table = DirectiveTable::new(10);
    let mut seen = vec![table.generation()];
    table.merge(batch(1, 1, vec![directive("a", 0.5)]));
    seen.push(table.generation());
    // Even a batch naming no directive: its mode policy may change.
    table.merge(batch(1, 2, vec![]));
    seen.push(table.generation());
    let mut replacement = table.empty_like();
    replacement.merge(batch(1, 3, vec![directive("b", 0.5)]));
    replacement.adopt_state(&mut table);
    seen.push(replacement.generation());
    let distinct: std::collections::HashSet<u64> = seen.iter().copied().collect();
    assert_eq!(distinct.len(), seen.len(), "{seen:?}");
}

fn lift(bucket: &str, tenant: &str, priority: Priority) -> Directive {
    Directive {
        bucket: bucket.into(),
        tenant: tenant.into(),
        priority: priority as i32,
        ..Default::default()
    }
}

#[test]
fn a_lift_frees_the_slot_and_needs_none() {
    let mut table = DirectiveTable::new(2);
    table.merge(batch(
        1,
        1,
        vec![
            directive("a", 0.5),
            cell_directive("a", "t", Priority::Bulk, 0.25),
        ],
    ));
    // Full: a lift of a cell it does not hold still applies.
    let outcome = table.merge(batch(1, 2, vec![lift("x", "", Priority::Unspecified)]));
    assert_eq!(outcome.applied, 1);
    assert_eq!(table.len(), 2);
    table.merge(batch(1, 3, vec![lift("a", "", Priority::Unspecified)]));
    assert_eq!(table.len(), 1);
    assert_eq!(table.drop_ratio("a"), None);
    // The moved entry is still found through its index.
    let key = key_of("a", "t", Priority::Bulk);
    let index = table.find(Some(&key), "a").unwrap();
    assert_eq!(
        table.entry_mut(index).unwrap().directive.drop_ratio.get(),
        0.25
    );
    // The freed slot takes a new limited cell.
    let outcome = table.merge(batch(1, 4, vec![directive("b", 0.1)]));
    assert_eq!(outcome.applied, 1);
    assert_eq!(table.len(), 2);
}

#[test]
fn a_mode_without_a_limit_is_kept() {
    let mut table = DirectiveTable::new(4);
    let shadow = Directive {
        mode: Mode::Shadow as i32,
        ..lift("a", "", Priority::Unspecified)
    };
    table.merge(batch(1, 1, vec![shadow]));
    assert_eq!(table.len(), 1);
}

#[cfg(not(target_arch = "wasm32"))]
mod lift_proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any sequence of upserts and lifts leaves the table equal to a
        /// plain map of the cells last set and not lifted since, every
        /// index pointing at its own cell.
        #[test]
        fn lifts_and_upserts_match_a_model(
            ops in proptest::collection::vec((0u8..6, 0u8..3, any::<bool>()), 0..60),
        ) {
            let mut table = DirectiveTable::new(64);
            let mut model = std::collections::BTreeMap::new();
            for (version, (bucket, tenant, set)) in ops.into_iter().enumerate() {
                let bucket = format!("b{bucket}");
                let tenant = if tenant == 0 { String::new() } else { format!("t{tenant}") };
                let priority = Priority::Unspecified;
                let wire = if set {
                    let ratio = f64::from(u8::try_from(version % 10).unwrap_or(0)) / 10.0;
                    model.insert((bucket.clone(), tenant.clone()), ratio);
                    cell_directive(&bucket, &tenant, priority, ratio)
                } else {
                    model.remove(&(bucket.clone(), tenant.clone()));
                    lift(&bucket, &tenant, priority)
                };
                table.merge(batch(1, version as u64 + 1, vec![wire]));
                prop_assert_eq!(table.len(), model.len());
                for ((bucket, tenant), ratio) in &model {
                    let entry = table.cell(bucket, tenant, priority).map(|e| e.directive.drop_ratio.get());
                    prop_assert_eq!(entry, Some(*ratio));
                }
            }
        }
    }
}

#[test]
fn a_cells_responses_are_rendered_again_only_when_their_facts_change() {
    let responses = |table: &DirectiveTable, bucket: &str| {
        let entry = table.entry_of(true, bucket).unwrap();
        (
            Arc::clone(&entry.response),
            Arc::clone(&entry.fallback_response),
        )
    };
    let mut table = DirectiveTable::new(100);
    table.merge(batch(1, 1, vec![directive("a", 0.5), directive("b", 0.5)]));
    let (a, a_fallback) = responses(&table, "a");
    let (b, _) = responses(&table, "b");
    // A new ratio says nothing new to a client: the same responses.
    table.merge(batch(1, 2, vec![directive("a", 0.75)]));
    assert!(Arc::ptr_eq(&a, &responses(&table, "a").0));
    assert!(Arc::ptr_eq(&a_fallback, &responses(&table, "a").1));
    // A new retry hint does.
    table.merge(batch(
        1,
        3,
        vec![Directive {
            retry_after_ms: 5_000,
            ..directive("a", 0.75)
        }],
    ));
    let (a_later, _) = responses(&table, "a");
    assert!(!Arc::ptr_eq(&a, &a_later));
    assert_eq!(a_later.header("retry-after"), Some("5"));

    // A VM re-reading the shared table renders only what changed in it.
    let mut writer = table.clone();
    writer.merge(batch(
        1,
        4,
        vec![Directive {
            limit_rps: Some(20.0),
            ..directive("b", 0.5)
        }],
    ));
    let (read, outcome) = DirectiveTable::decode_replacing(&writer.encode(), &table).unwrap();
    assert_eq!(outcome.rejected, 0);
    assert!(Arc::ptr_eq(&a_later, &responses(&read, "a").0));
    let (b_read, _) = responses(&read, "b");
    assert!(!Arc::ptr_eq(&b, &b_read));
    assert_eq!(b_read.header("x-ratelimit-limit"), Some("20"));
    // Other response settings (a reload): everything rendered again.
    let other = DirectiveTable::with_settings(100, Arc::new(ResponseSettings::default()), "");
    let (fresh, _) = DirectiveTable::decode_replacing(&writer.encode(), &other).unwrap();
    assert!(!Arc::ptr_eq(&a_later, &responses(&fresh, "a").0));
    assert_eq!(fresh, read);
}

#[test]
fn a_budget_s_rates_reach_the_allowance_in_estimates() {
    // 1,000 charged tokens a second, each estimated token charged 4: the
    // allowance compares 250 estimated tokens a second with what it counts.
    let budget = |charge_factor| Directive {
        cost_unit: "tokens".into(),
        limit_rps: Some(1_000.0),
        offered_rps: 600.0,
        charge_factor,
        ..directive("llm", 0.0)
    };
    let mut table = DirectiveTable::new(100);
    table.merge(batch(1, 1, vec![budget(4.0), directive("api", 0.0)]));
    let rates = table
        .rates_for_cell(&key_of("llm", "", Priority::Unspecified))
        .unwrap();
    assert_eq!(
        (rates.limit_rps, rates.fleet_offered_rps),
        (Some(250.0), 600.0)
    );
    let requests = table
        .rates_for_cell(&key_of("api", "", Priority::Unspecified))
        .unwrap();
    assert_eq!(requests.limit_rps, Some(10.0), "requests ignore it");
    // A new factor renders the budget's 429s again.
    let rendered = |table: &DirectiveTable| {
        table
            .entry_of(true, "llm")
            .unwrap()
            .budget_responses
            .clone()
    };
    let before = rendered(&table);
    table.merge(batch(1, 2, vec![budget(4.0)]));
    assert_eq!(rendered(&table), before);
    table.merge(batch(1, 3, vec![budget(2.0)]));
    assert_ne!(rendered(&table), before);
}
