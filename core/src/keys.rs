//! How long a bucket key and a tenant may be, and how longer ones are cut.
//!
//! The filter cuts what a request carries to these lengths before counting,
//! and the control plane refuses longer names, so every limit an operator
//! can set is one a request can match.

/// Longest bucket key in bytes. Longer keys are cut (at a character
/// boundary) so a hostile header cannot make counters or reports large.
pub const MAX_BUCKET_KEY_BYTES: usize = 256;

/// Longest tenant in bytes; longer values are cut like bucket keys.
pub const MAX_TENANT_BYTES: usize = MAX_BUCKET_KEY_BYTES;

/// The longest prefix of `value` of at most `max` bytes ending on a
/// character boundary.
#[inline]
pub fn cut(value: &str, max: usize) -> &str {
    if value.len() <= max {
        return value;
    }
    let end = (0..=max)
        .rev()
        .find(|i| value.is_char_boundary(*i))
        .unwrap_or(0);
    value.get(..end).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn short_values_are_kept_whole() {
        assert_eq!(cut("acme", 4), "acme");
        assert_eq!(cut("", 0), "");
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        assert_eq!(cut("abcdef", 3), "abc");
        // "é" is two bytes: a cut inside it backs off to before it.
        assert_eq!(cut("aé", 2), "a");
        assert_eq!(cut("éé", 3), "é");
        assert_eq!(cut("é", 1), "");
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_cut_is_the_longest_fitting_prefix(value in ".{0,40}", max in 0usize..48) {
            let kept = cut(&value, max);
            prop_assert!(kept.len() <= max || kept.len() == value.len() && value.len() <= max);
            prop_assert!(value.starts_with(kept));
            // One more character would not fit.
            if kept.len() < value.len() {
                let next = value[kept.len()..].chars().next().map_or(0, char::len_utf8);
                prop_assert!(kept.len() + next > max);
            }
        }
    }
}
