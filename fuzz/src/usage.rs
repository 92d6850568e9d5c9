//! Checks of the LLM usage parser and its cost rule
//! (`sluice_agent::usage`).

use sluice_agent::usage::{CostRule, Outcome, UsageParser};

/// The usage parser on any body in any chunks: the first byte sets the cap
/// (0..=255 bytes ×4), the second the chunk size; it never panics, never
/// holds more than the cap, and the chunks give what the whole body gives.
pub fn usage_stream(data: &[u8]) {
    let (cap, chunk, body) = match data {
        [cap, chunk, body @ ..] => (usize::from(*cap) * 4, usize::from(*chunk).max(1), body),
        _ => return,
    };
    let mut whole = UsageParser::new(cap);
    whole.feed(body);
    assert!(whole.held() <= cap, "{} held, cap {cap}", whole.held());
    let mut chunked = UsageParser::new(cap);
    for piece in body.chunks(chunk) {
        chunked.feed(piece);
        assert!(chunked.held() <= cap, "{} held, cap {cap}", chunked.held());
    }
    assert_eq!(chunked.outcome(), whole.outcome());
    if let Outcome::Usage(usage, _) = whole.outcome() {
        assert!(usage.cached_input <= usage.input, "{usage:?}");
        assert!(
            usage.total >= usage.input.saturating_add(usage.output),
            "{usage:?}"
        );
    }
}

/// The cost rule parser: any bytes give a rule or an error naming a field
/// under `cost`; a rule's charges are never 0 without usage.
pub fn cost_rule(data: &[u8]) {
    match CostRule::from_json(data) {
        Ok(rule) => {
            let estimate = rule.estimate(Some(b"12"), 1_000);
            assert!(estimate >= 1);
            assert!(rule.charge(None, estimate).cost >= 1);
        }
        Err(err) => assert!(err.field.starts_with("cost"), "{err}"),
    }
}
