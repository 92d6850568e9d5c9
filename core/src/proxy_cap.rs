//! A proxy's own drop ratio when the control plane counted only part of
//! the rate it reported for a bucket.
//!
//! The control plane bounds one proxy's weight in a bucket's fleet sum
//! (`--proxy-share-cap`): a claim far above the other proxies' counts only
//! up to a multiple of their median, so a lying proxy cannot make the
//! controller drop everyone's traffic. The drop ratio it computes then fits
//! the counted traffic, not the traffic the capped proxy really carries: a
//! proxy that is busy rather than lying would admit its whole rate at that
//! ratio and lift the fleet over the limit. So a capped proxy admits as if
//! it offered only its counted part (plus, while the bucket has room, a
//! share of that room for the rest), and the fleet stays within the limit
//! whichever of the two it is.

use crate::DropRatio;
use sluice_proto::v1::{Directive, DirectiveBatch};

/// The drop ratio for a proxy of which `counted_fraction` of the offered
/// rate counted in the fleet sum, when the directive says `ratio` and lets
/// `uncounted_admit` of the uncounted rest through. Both fractions are
/// clamped to [0, 1]; a fraction of 1 leaves the ratio as it is.
#[must_use]
pub fn capped_drop_ratio(
    ratio: DropRatio,
    counted_fraction: f64,
    uncounted_admit: f64,
) -> DropRatio {
    let counted = clamp_fraction(counted_fraction);
    let room = clamp_fraction(uncounted_admit);
    let admit = (1.0 - ratio.get()) * counted + room * (1.0 - counted);
    DropRatio::saturating(1.0 - admit)
}

/// A fraction in [0, 1]; NaN counts as 1 (no cap).
fn clamp_fraction(fraction: f64) -> f64 {
    if fraction.is_nan() {
        1.0
    } else {
        fraction.clamp(0.0, 1.0)
    }
}

/// Rewrites a directive for the proxy `proxy_id`: when the directive lists
/// it as counted in part, its drop ratio becomes [`capped_drop_ratio`]'s.
/// The list is cleared either way, so what is stored and shared is the
/// ratio this proxy applies.
pub fn resolve(directive: &mut Directive, proxy_id: &str) {
    if directive.counted_proxies.is_empty() {
        return;
    }
    let own = directive
        .counted_proxies
        .iter()
        .find(|counted| counted.proxy_id == proxy_id)
        .map(|counted| counted.counted_fraction);
    if let Some(counted_fraction) = own {
        let ratio = DropRatio::saturating(directive.drop_ratio);
        directive.drop_ratio =
            capped_drop_ratio(ratio, counted_fraction, directive.uncounted_admit).get();
    }
    directive.counted_proxies.clear();
    directive.uncounted_admit = 0.0;
}

/// [`resolve`] for every directive of a batch.
pub fn resolve_batch(batch: &mut DirectiveBatch, proxy_id: &str) {
    for directive in &mut batch.directives {
        resolve(directive, proxy_id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use sluice_proto::v1::CountedProxy;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn ratio(value: f64) -> DropRatio {
        DropRatio::new(value).unwrap()
    }

    #[test]
    fn a_capped_proxy_admits_its_counted_part_at_the_fleet_ratio() {
        // The simulator's hot proxy: 1,500 rps counted as 667 at a ratio of
        // 0.54 admits 0.46 x 667 = 307 rps, not 0.46 x 1,500 = 690.
        let counted = 667.0 / 1_500.0;
        let own = capped_drop_ratio(ratio(0.54), counted, 0.0);
        let admitted = (1.0 - own.get()) * 1_500.0;
        assert!((admitted - 0.46 * 667.0).abs() < 0.01, "{admitted}");
    }

    #[test]
    fn room_under_the_limit_admits_part_of_the_rest() {
        // No drops, half counted, a quarter of the rest may pass.
        let own = capped_drop_ratio(DropRatio::NEVER, 0.5, 0.25);
        assert!((own.get() - 0.375).abs() < 1e-12);
        // All the room: nothing dropped.
        assert_eq!(
            capped_drop_ratio(DropRatio::NEVER, 0.5, 1.0),
            DropRatio::NEVER
        );
        // Counted in full: the directive's ratio as it is.
        assert!((capped_drop_ratio(ratio(0.3), 1.0, 0.0).get() - 0.3).abs() < 1e-12);
        // Ignored entirely while the bucket sheds: everything dropped.
        assert_eq!(capped_drop_ratio(ratio(0.3), 0.0, 0.0), DropRatio::ALWAYS);
        // Nonsense fractions are clamped, never a panic or a NaN.
        assert!((capped_drop_ratio(ratio(0.3), f64::NAN, -4.0).get() - 0.3).abs() < 1e-12);
    }

    #[test]
    fn resolve_rewrites_only_the_listed_proxy() {
        let directive = Directive {
            bucket: "b".into(),
            drop_ratio: 0.5,
            counted_proxies: vec![CountedProxy {
                proxy_id: "hot".into(),
                counted_fraction: 0.5,
            }],
            ..Directive::default()
        };
        let mut hot = directive.clone();
        resolve(&mut hot, "hot");
        assert!((hot.drop_ratio - 0.75).abs() < 1e-12);
        assert!(hot.counted_proxies.is_empty());
        let mut other = directive.clone();
        resolve(&mut other, "cold");
        assert_eq!(other.drop_ratio, 0.5);
        assert!(other.counted_proxies.is_empty());
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// While the bucket sheds (no room), a capped proxy drops at
            /// least what the others drop, and admits exactly its counted
            /// part at their rate.
            #[test]
            fn a_capped_proxy_never_admits_more_than_its_counted_share(
                r in 0.0_f64..=1.0,
                counted in 0.0_f64..=1.0,
            ) {
                let own = capped_drop_ratio(ratio(r), counted, 0.0);
                prop_assert!(own.get() + 1e-12 >= r);
                prop_assert!(((1.0 - own.get()) - (1.0 - r) * counted).abs() < 1e-9);
            }

            /// Any input gives a valid ratio.
            #[test]
            fn always_a_ratio(r in 0.0_f64..=1.0, counted in any::<f64>(), room in any::<f64>()) {
                let own = capped_drop_ratio(ratio(r), counted, room).get();
                prop_assert!((0.0..=1.0).contains(&own));
            }
        }
    }
}
