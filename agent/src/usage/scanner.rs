//! A streaming JSON scanner that keeps only the objects under the keys
//! `usage` and `usageMetadata` (at most [`MAX_KEY_DEPTH`] levels deep),
//! whatever the chunking: strings, numbers and every other value pass
//! without being stored. It decides byte by byte on quotes, brackets and
//! the bytes of a possible key, and passes the runs between them in one
//! search ([`Scanner::run`]). Malformed input is never an error: it only
//! yields no usage.

use memchr::{memchr_iter, memchr2};

/// Keys whose object value is captured.
const TARGETS: [&[u8]; 2] = [b"usage", b"usageMetadata"];
/// The longest target: every target is a prefix of it, so a key may still
/// be a target exactly while it is a prefix of this one, which the scanner
/// checks one byte at a time.
const LONGEST_TARGET: &[u8] = b"usageMetadata";
/// Longest key compared (longer ones are not targets).
const KEY_BYTES: usize = 16;
/// Usage objects deeper than this are not captured (OpenAI's and Gemini's
/// are at depth 1, Anthropic's `message.usage` at 2, a Gemini JSON array's
/// at 2).
const MAX_KEY_DEPTH: u32 = 3;

/// Bytes a usage object of one of the three providers takes, about.
const USUAL_CAPTURE: usize = 256;

/// What one byte did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing to report.
    Continue,
    /// A usage object was completed: its bytes are in the capture.
    Captured,
    /// The capture would exceed its cap.
    Overflow,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scanner {
    /// Open containers (saturating: only compared with small depths).
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The last string's first bytes, while it may still be a target.
    key: [u8; KEY_BYTES],
    key_len: usize,
    /// The string is no target (too long, escaped, or no target starts
    /// as it does).
    key_too_long: bool,
    /// A string just ended (a key if `:` follows).
    after_string: bool,
    /// A target key and its `:` were read: the next value may be captured.
    value_of_target: bool,
    /// Capturing: the depth the captured object closes back to.
    capture_depth: Option<u32>,
    capture: Vec<u8>,
    cap: usize,
    /// A capture began since the last [`Self::forget_captures_begun`].
    began_capture: bool,
}

impl Scanner {
    /// Captures at most `cap` bytes per usage object.
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            depth: 0,
            in_string: false,
            escaped: false,
            key: [0; KEY_BYTES],
            key_len: 0,
            key_too_long: false,
            after_string: false,
            value_of_target: false,
            capture_depth: None,
            capture: Vec::new(),
            cap,
            began_capture: false,
        }
    }

    /// Starts a new JSON document (the next SSE event); an unfinished
    /// capture is dropped.
    pub(crate) fn reset(&mut self) {
        let cap = self.cap;
        let mut capture = std::mem::take(&mut self.capture);
        capture.clear();
        *self = Self::new(cap);
        self.capture = capture;
    }

    /// The last completed usage object's bytes.
    pub(crate) fn captured(&self) -> &[u8] {
        &self.capture
    }

    /// Bytes held.
    pub(crate) fn held(&self) -> usize {
        self.capture.len()
    }

    fn is_target(&self) -> bool {
        !self.key_too_long
            && self
                .key
                .get(..self.key_len)
                .is_some_and(|key| TARGETS.contains(&key))
    }

    /// Whether the scanner stands between documents: everything it
    /// decides by from here is as after [`Self::reset`] (only the last
    /// capture may still be held).
    pub(crate) fn at_rest(&self) -> bool {
        self.depth == 0
            && self.capture_depth.is_none()
            && !self.in_string
            && !self.escaped
            && !self.after_string
            && !self.value_of_target
    }

    /// Starts watching for a capture beginning ([`Self::began_capture`]).
    pub(crate) fn forget_captures_begun(&mut self) {
        self.began_capture = false;
    }

    /// Whether a capture began since [`Self::forget_captures_begun`].
    pub(crate) fn began_capture(&self) -> bool {
        self.began_capture
    }

    /// Reads `bytes` up to the first step that is not
    /// [`Step::Continue`]: how many it read, and that step (or
    /// `Continue`, having read them all). The same as [`Self::byte`] on
    /// each, but the runs of bytes that change nothing (a string that is
    /// no key, what lies between values) or that a capture only copies are
    /// passed in one search each, so a document's bytes cost about one
    /// step per quote and bracket.
    pub(crate) fn run(&mut self, bytes: &[u8]) -> (usize, Step) {
        let mut read = 0;
        while let Some(rest) = bytes.get(read..).filter(|rest| !rest.is_empty()) {
            read += self.plain_run(rest);
            let Some(&b) = bytes.get(read) else {
                break;
            };
            read += 1;
            let step = self.byte(b);
            if step != Step::Continue {
                return (read, step);
            }
        }
        (read, Step::Continue)
    }

    /// How many of `bytes`' first bytes change nothing but the capture,
    /// which takes them here (never beyond its cap: the byte that would
    /// exceed it is left to [`Self::byte`]).
    #[inline]
    fn plain_run(&mut self, bytes: &[u8]) -> usize {
        let structural = |b: &u8| matches!(b, b'"' | b'{' | b'}' | b'[' | b']');
        if self.capture_depth.is_some() {
            let run = if self.in_string {
                if self.escaped {
                    return 0;
                }
                memchr2(b'"', b'\\', bytes)
            } else {
                bytes.iter().position(structural)
            }
            .unwrap_or(bytes.len())
            .min(self.cap.saturating_sub(self.capture.len()));
            self.capture
                .extend_from_slice(bytes.get(..run).unwrap_or_default());
            return run;
        }
        if self.in_string {
            // A string that may still be a key is compared byte by byte.
            if self.escaped || !self.key_too_long {
                return 0;
            }
            return memchr2(b'"', b'\\', bytes).unwrap_or(bytes.len());
        }
        if self.after_string || self.value_of_target {
            return 0;
        }
        // Numbers, literals, commas, colons and blanks only count depth
        // and strings, which they do not open or close.
        bytes.iter().position(structural).unwrap_or(bytes.len())
    }

    /// Reads one byte.
    #[inline]
    pub(crate) fn byte(&mut self, b: u8) -> Step {
        if let Some(close_at) = self.capture_depth {
            if self.capture.len() >= self.cap {
                self.capture_depth = None;
                self.capture.clear();
                return Step::Overflow;
            }
            self.capture.push(b);
            self.structure(b);
            if !self.in_string && self.depth == close_at {
                self.capture_depth = None;
                return Step::Captured;
            }
            return Step::Continue;
        }
        if self.in_string {
            self.string_byte(b);
            return Step::Continue;
        }
        if b.is_ascii_whitespace() {
            return Step::Continue;
        }
        let after_string = std::mem::take(&mut self.after_string);
        let value_of_target = std::mem::take(&mut self.value_of_target);
        if after_string && b == b':' {
            self.value_of_target = self.is_target() && self.depth <= MAX_KEY_DEPTH;
            return Step::Continue;
        }
        if value_of_target && b == b'{' {
            // A cap of 0 holds nothing, not even the opening brace.
            if self.cap == 0 {
                return Step::Overflow;
            }
            self.capture.clear();
            // One allocation for a usage object of the usual size, rather
            // than growing it byte by byte.
            self.capture.reserve(self.cap.min(USUAL_CAPTURE));
            self.capture.push(b);
            self.capture_depth = Some(self.depth);
            self.began_capture = true;
            self.depth = self.depth.saturating_add(1);
            return Step::Continue;
        }
        self.structure(b);
        Step::Continue
    }

    /// Depth and string state (outside a capture, a string's bytes go to
    /// `string_byte`).
    #[inline]
    fn structure(&mut self, b: u8) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
            }
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.key_len = 0;
                self.key_too_long = false;
            }
            b'{' | b'[' => self.depth = self.depth.saturating_add(1),
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
    }

    #[inline]
    fn string_byte(&mut self, b: u8) {
        if self.escaped {
            // An escaped key is never a target.
            self.escaped = false;
            self.key_too_long = true;
            return;
        }
        match b {
            b'\\' => self.escaped = true,
            b'"' => {
                self.in_string = false;
                self.after_string = true;
            }
            _ if self.key_too_long => {}
            _ => match self.key.get_mut(self.key_len) {
                // Once no target starts so, the rest of the string is
                // skipped.
                Some(slot) if LONGEST_TARGET.get(self.key_len) == Some(&b) => {
                    *slot = b;
                    self.key_len += 1;
                }
                _ => self.key_too_long = true,
            },
        }
    }
}

/// Whether reading `bytes` from rest could begin a capture: they hold a
/// target key, quoted, then `:` and `{` (blanks between). A capture begins
/// on nothing else (the converse need not hold: the quote may stand in a
/// string, or deeper than targets are read), so bytes without one can
/// pass unscanned. Found from each `{` backwards: a JSON event holds a few
/// of them, while a search for the key's first bytes stops at every quote.
pub(crate) fn may_begin_capture(bytes: &[u8]) -> bool {
    memchr_iter(b'{', bytes).any(|brace| {
        let before = bytes.get(..brace).unwrap_or_default().trim_ascii_end();
        let Some(key) = before
            .strip_suffix(b":")
            .map(<[u8]>::trim_ascii_end)
            .and_then(|key| key.strip_suffix(b"\""))
        else {
            return false;
        };
        TARGETS.iter().any(|target| {
            key.strip_suffix(*target)
                .is_some_and(|opened| opened.last() == Some(&b'"'))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_target_is_a_prefix_of_the_longest() {
        assert!(
            TARGETS
                .iter()
                .all(|target| LONGEST_TARGET.starts_with(target))
        );
        assert!(TARGETS.contains(&LONGEST_TARGET));
        assert!(LONGEST_TARGET.len() <= KEY_BYTES);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod properties {
    #![allow(clippy::indexing_slicing)]

    use proptest::prelude::*;

    use super::*;

    /// Pieces of JSON around usage keys, and bytes that are none.
    const PIECES: [&[u8]; 18] = [
        b"\"usage\":{",
        b"\"usageMetadata\" :\t{",
        b"\"usage\"",
        b"\"usageMetadata\"",
        b"\"usag\"",
        b"\"text\\\"usage\\\"\"",
        b"\"a \\\\\"",
        b":",
        b" : ",
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b"\"",
        b"\\",
        b"12",
        b"\n",
    ];

    /// Every step that is not `Continue`, where it came and what was
    /// captured then, and the scanner at the end.
    type Trace = (Vec<(usize, Step, Vec<u8>)>, Scanner);

    fn byte_by_byte(bytes: &[u8], cap: usize) -> Trace {
        let mut scanner = Scanner::new(cap);
        let mut steps = Vec::new();
        for (at, &b) in bytes.iter().enumerate() {
            let step = scanner.byte(b);
            if step != Step::Continue {
                steps.push((at + 1, step, scanner.captured().to_vec()));
            }
        }
        (steps, scanner)
    }

    fn in_runs(bytes: &[u8], cap: usize) -> Trace {
        let mut scanner = Scanner::new(cap);
        let mut steps = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let (read, step) = scanner.run(&bytes[at..]);
            assert!(read > 0, "a run read nothing");
            at += read;
            if step != Step::Continue {
                steps.push((at, step, scanner.captured().to_vec()));
            }
        }
        (steps, scanner)
    }

    proptest! {
        /// Runs read as the bytes one by one do: the same steps at the
        /// same places, the same captures, the same scanner after.
        #[test]
        fn runs_read_as_bytes_one_by_one_do(
            pieces in proptest::collection::vec(
                prop_oneof![
                    (0_usize..PIECES.len()).prop_map(|i| PIECES[i].to_vec()),
                    proptest::collection::vec(any::<u8>(), 1..4),
                ],
                0..48,
            ),
            cap in 0_usize..48,
        ) {
            let bytes: Vec<u8> = pieces.concat();
            prop_assert_eq!(in_runs(&bytes, cap), byte_by_byte(&bytes, cap));
        }
    }
}
