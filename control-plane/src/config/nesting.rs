//! Bounds a YAML text's size and nesting before the limits file's parser reads it.
//!
//! serde_yaml_ng's scanner (libyaml's) spends time on every token in
//! proportion to how deeply the flow collections around it are nested, so
//! a file of nothing but `[` takes time quadratic in its size to reject.
//! Here the text's events are streamed by a safe port of the same parser,
//! which stops at the first collection nested deeper than [`MAX_DEPTH`]:
//! the whole check is linear in the size, and what passes it is no deeper
//! for the real parser, which scans it the same way.

use libyaml_safer::{EventData, Parser};

/// The largest limits file accepted, in bytes: far above any real one
/// (a hundred thousand buckets take a few megabytes).
pub(crate) const MAX_BYTES: usize = 16 * 1024 * 1024;

/// The deepest nesting of mappings and sequences accepted. The limits
/// file's own schema goes five or six levels deep.
pub(crate) const MAX_DEPTH: usize = 32;

/// Why a text was refused before it was parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TooLarge {
    /// 1-based line and column where it went too deep; `None` when the
    /// text as a whole is too large.
    pub(crate) location: Option<(usize, usize)>,
    /// What is wrong.
    pub(crate) message: String,
}

/// Checks `text`'s size and nesting. A syntax error is not reported here:
/// the real parser reports it, at the same place, after no deeper a scan.
pub(crate) fn check(text: &str) -> Result<(), TooLarge> {
    if text.len() > MAX_BYTES {
        return Err(TooLarge {
            location: None,
            message: format!(
                "the file is {} bytes; at most {MAX_BYTES} are accepted",
                text.len()
            ),
        });
    }
    let mut input = text.as_bytes();
    let mut parser = Parser::new();
    parser.set_input_string(&mut input);
    let mut depth = 0_usize;
    for event in parser {
        let Ok(event) = event else {
            return Ok(());
        };
        match event.data {
            EventData::SequenceStart { .. } | EventData::MappingStart { .. } => {
                depth += 1;
                if depth > MAX_DEPTH {
                    let mark = event.start_mark;
                    return Err(TooLarge {
                        location: Some((
                            usize::try_from(mark.line).map_or(usize::MAX, |l| l.saturating_add(1)),
                            usize::try_from(mark.column)
                                .map_or(usize::MAX, |c| c.saturating_add(1)),
                        )),
                        message: format!(
                            "mappings and sequences nested more than {MAX_DEPTH} levels deep"
                        ),
                    });
                }
            }
            EventData::SequenceEnd | EventData::MappingEnd => depth = depth.saturating_sub(1),
            EventData::StreamEnd => break,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shallow_files_pass_and_deep_ones_are_refused_where_they_go_too_deep() {
        assert_eq!(check("limits:\n  - bucket: a\n    limit_rps: 1\n"), Ok(()));
        assert_eq!(check(""), Ok(()));
        let deep = format!("limits: {}", "[".repeat(200_000));
        let err = check(&deep).unwrap_err();
        // The document itself is the first level.
        assert_eq!(err.location, Some((1, 8 + MAX_DEPTH)));
        assert!(err.message.contains("nested more than 32"), "{err:?}");
        // Hidden in quoted scalars the brackets nest nothing.
        let quoted = format!("limits: [\"{}\"]", "[".repeat(1000));
        assert_eq!(check(&quoted), Ok(()));
        // A syntax error is the real parser's to report.
        assert_eq!(check("limits: [a\n"), Ok(()));
        let block: String = (0..40)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert!(check(&block).is_err());
    }

    #[test]
    fn size_is_bounded() {
        let big = "#".repeat(MAX_BYTES + 1);
        let err = check(&big).unwrap_err();
        assert_eq!(err.location, None);
    }
}
