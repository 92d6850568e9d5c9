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

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let mut parts = self.source.split('*');
        // `split` always yields at least one item; no `*` means an exact match.
        let Some(first) = parts.next() else {
            return text.is_empty();
        };
        let Some(mut rest) = text.strip_prefix(first) else {
            return false;
        };
        let mut middle: Vec<&str> = parts.collect();
        let Some(last) = middle.pop() else {
            return rest.is_empty();
        };
        // Taking each middle literal at its leftmost occurrence is optimal:
        // it leaves the longest possible remainder for what follows.
        for literal in middle {
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
