//! Bucket-key globs, one matcher for the control plane's limit rules and
//! the filter's aggregate patterns.

/// Aggregate patterns one directive batch may carry: a filter matches each
/// request's bucket against every one of them, so they stay few.
pub const MAX_AGGREGATE_PATTERNS: usize = 32;

/// A glob where `*` matches any run of characters (including none and
/// including separators); every other character matches itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
}

impl Glob {
    /// Any string is a valid pattern.
    pub fn new(pattern: impl Into<String>) -> Self {
        Self {
            source: pattern.into(),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `text` matches the whole pattern. No allocation: the filter
    /// matches each request's bucket against its aggregate patterns.
    pub fn matches(&self, text: &str) -> bool {
        // No `*`: an exact match.
        let Some((head, tail)) = self.source.split_once('*') else {
            return text == self.source;
        };
        let Some(mut rest) = text.strip_prefix(head) else {
            return false;
        };
        // The literals between the first and the last `*`, and the one after
        // the last (what `rest` must end with).
        let (middle, last) = tail.rsplit_once('*').unwrap_or(("", tail));
        // Taking each middle literal at its leftmost occurrence is optimal:
        // it leaves the longest possible remainder for what follows.
        for literal in middle.split('*') {
            match rest.find(literal) {
                Some(at) => rest = rest.get(at + literal.len()..).unwrap_or_default(),
                None => return false,
            }
        }
        rest.ends_with(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn glob_matching() {
        let cases = [
            ("acme", "acme", true),
            ("acme", "acme2", false),
            ("free-*", "free-", true),
            ("free-*", "free-abc/def", true),
            ("free-*", "xfree-a", false),
            ("*-eu", "a-eu", true),
            ("*-eu", "a-eu-x", false),
            ("*", "", true),
            ("*", "anything", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxcyyb", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("**", "x", true),
            ("", "", true),
            ("", "x", false),
            ("a*b", "ab", true),
            ("a*b", "abab", true),
            ("ab*ba", "aba", false),
            ("*x*", "yxy", true),
            ("*x*", "yyy", false),
            ("a**b", "ab", true),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(
                Glob::new(pattern).matches(text),
                expected,
                "{pattern:?} vs {text:?}"
            );
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod proptests {
    #![allow(clippy::indexing_slicing)]
    use super::*;
    use proptest::prelude::*;

    /// A matcher written the slow, obvious way: `*` tries every split.
    fn reference(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|at| reference(rest, &text[at..])),
            Some((c, rest)) => text.first() == Some(c) && reference(rest, &text[1..]),
        }
    }

    proptest! {
        /// Against the reference over a small alphabet, where literals
        /// recur and leftmost matches are put to the test.
        #[test]
        fn matches_like_the_reference(pattern in "[ab*]{0,8}", text in "[ab]{0,10}") {
            prop_assert_eq!(
                Glob::new(pattern.as_str()).matches(&text),
                reference(pattern.as_bytes(), text.as_bytes())
            );
        }
    }
}
