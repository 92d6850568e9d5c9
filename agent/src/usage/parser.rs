//! [`UsageParser`]: fed a response body's chunks as they pass, it finds
//! the format (JSON, or server-sent events whose `data:` lines are JSON)
//! and the provider (by the usage's field names) and yields the usage.
//!
//! It never holds the body: SSE lines are recognised by their first five
//! bytes and their data streamed through the JSON scanner, which stores
//! only the usage object being read, at most `cap` bytes. A `data:` line
//! that starts a document and holds no usage key before an object (most
//! events of a stream) is passed over in one search when the chunk holds
//! all of it, and forgotten at its end when it does not, so that both
//! ways leave the scanner as it was. An object larger
//! than that, or a body that is neither JSON nor SSE, makes it give up
//! (it then ignores the rest); a usage repeated later in the stream
//! (Anthropic's cumulative `message_delta`, Gemini's every chunk) replaces
//! what came before, field by field.

use serde::Deserialize;

use memchr::{memchr, memrchr_iter};

use super::scanner::{Scanner, Step, may_begin_capture};
use super::tokens::Usage;

/// How the body carried the usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI's `usage {prompt_tokens, completion_tokens, total_tokens}`
    /// in one JSON body.
    OpenAiJson,
    /// OpenAI's usage chunk of `stream_options.include_usage`.
    OpenAiSse,
    /// Anthropic's `usage {input_tokens, output_tokens}` in one JSON body.
    AnthropicJson,
    /// Anthropic's `message_start` and cumulative `message_delta` events.
    AnthropicSse,
    /// Gemini's `usageMetadata` in a JSON body (or a JSON array of them).
    GeminiJson,
    /// Gemini's `usageMetadata` in `alt=sse` events.
    GeminiSse,
}

/// Where the parser stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A usage was read (more may replace it until the stream ends).
    Usage(Usage, Format),
    /// No usage so far.
    NoUsage,
    /// The body is neither JSON nor server-sent events.
    NotRecognised,
    /// A usage object was larger than the cap.
    OverCap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Nothing but whitespace yet.
    Unknown,
    Json,
    Sse(Line),
    GaveUp(Outcome),
}

/// Where an SSE line stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Its first bytes, until they say what it is.
    Start { prefix: [u8; 5], len: usize },
    /// Just after `data:`: whether the line can be passed over is
    /// decided on its first byte.
    DataStart,
    /// A `data:` line: its bytes go to the scanner. `from_rest`: the
    /// scanner stood between documents when it began.
    Data { from_rest: bool },
    /// Another field or a comment: skipped to its end.
    Skip,
}

const LINE_START: Line = Line::Start {
    prefix: [0; 5],
    len: 0,
};

/// Field names of the three providers' usage objects.
#[derive(Debug, Default, Deserialize)]
struct RawUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    total_tokens: Option<u64>,
    prompt_tokens_details: Option<OpenAiDetails>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    #[serde(rename = "promptTokenCount")]
    prompt_token_count: Option<u64>,
    #[serde(rename = "candidatesTokenCount")]
    candidates_token_count: Option<u64>,
    #[serde(rename = "totalTokenCount")]
    total_token_count: Option<u64>,
    #[serde(rename = "cachedContentTokenCount")]
    cached_content_token_count: Option<u64>,
    #[serde(rename = "thoughtsTokenCount")]
    thoughts_token_count: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct OpenAiDetails {
    cached_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    OpenAi,
    Anthropic,
    Gemini,
}

/// The fields seen so far (a later object replaces the fields it has).
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    provider: Option<Provider>,
    input: Option<u64>,
    cached_input: Option<u64>,
    cache_creation: Option<u64>,
    output: Option<u64>,
    thoughts: Option<u64>,
    total: Option<u64>,
}

impl Seen {
    fn merge(&mut self, raw: RawUsage) {
        let provider = if raw.prompt_tokens.is_some() || raw.completion_tokens.is_some() {
            Provider::OpenAi
        } else if raw.input_tokens.is_some() || raw.output_tokens.is_some() {
            Provider::Anthropic
        } else if raw.prompt_token_count.is_some()
            || raw.candidates_token_count.is_some()
            || raw.total_token_count.is_some()
        {
            Provider::Gemini
        } else {
            return;
        };
        if self.provider.is_some_and(|seen| seen != provider) {
            // Two providers' shapes in one body: keep the first.
            return;
        }
        self.provider = Some(provider);
        let set = |slot: &mut Option<u64>, value: Option<u64>| {
            if value.is_some() {
                *slot = value;
            }
        };
        match provider {
            Provider::OpenAi => {
                set(&mut self.input, raw.prompt_tokens);
                set(&mut self.output, raw.completion_tokens);
                set(&mut self.total, raw.total_tokens);
                set(
                    &mut self.cached_input,
                    raw.prompt_tokens_details.and_then(|d| d.cached_tokens),
                );
            }
            Provider::Anthropic => {
                // Anthropic's input_tokens leaves out the cached ones.
                set(&mut self.input, raw.input_tokens);
                set(&mut self.cached_input, raw.cache_read_input_tokens);
                set(&mut self.cache_creation, raw.cache_creation_input_tokens);
                set(&mut self.output, raw.output_tokens);
            }
            Provider::Gemini => {
                set(&mut self.input, raw.prompt_token_count);
                set(&mut self.cached_input, raw.cached_content_token_count);
                set(&mut self.output, raw.candidates_token_count);
                set(&mut self.thoughts, raw.thoughts_token_count);
                set(&mut self.total, raw.total_token_count);
            }
        }
    }

    fn usage(&self) -> Option<(Usage, Provider)> {
        let provider = self.provider?;
        let cached_input = self.cached_input.unwrap_or(0);
        let input = match provider {
            Provider::Anthropic => self
                .input
                .unwrap_or(0)
                .saturating_add(cached_input)
                .saturating_add(self.cache_creation.unwrap_or(0)),
            _ => self.input.unwrap_or(0),
        };
        let output = self
            .output
            .unwrap_or(0)
            .saturating_add(self.thoughts.unwrap_or(0));
        let total = self
            .total
            .unwrap_or_else(|| input.saturating_add(output))
            .max(input.saturating_add(output));
        Some((
            Usage {
                input,
                cached_input: cached_input.min(input),
                output,
                total,
            },
            provider,
        ))
    }
}

/// Reads the usage of one response body, chunk by chunk.
#[derive(Debug, Clone)]
pub struct UsageParser {
    framing: Framing,
    scanner: Scanner,
    seen: Seen,
}

impl UsageParser {
    /// Holds at most `cap` bytes of the response at a time.
    pub fn new(cap: usize) -> Self {
        Self {
            framing: Framing::Unknown,
            scanner: Scanner::new(cap),
            seen: Seen::default(),
        }
    }

    /// Reads the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        let chunk = self.framing_of_first_bytes(chunk);
        let mut rest = self.whole_events_without_usage(chunk);
        while let Some((&b, after)) = rest.split_first() {
            if let Framing::Sse(Line::DataStart) = self.framing {
                rest = self.data_line_start(rest);
                continue;
            }
            if let Some(end) = self.document_bytes(rest) {
                let (read, step) = self.scanner.run(rest.get(..end).unwrap_or_default());
                rest = rest.get(read..).unwrap_or_default();
                self.take_step(step);
                continue;
            }
            if let Framing::Sse(Line::Skip) = self.framing {
                let end = memchr(b'\n', rest).unwrap_or(rest.len());
                if end > 0 {
                    rest = rest.get(end..).unwrap_or_default();
                    continue;
                }
            }
            rest = after;
            match self.framing {
                Framing::GaveUp(_) => return,
                Framing::Unknown => {
                    if b.is_ascii_whitespace() {
                        continue;
                    }
                    self.framing = match b {
                        b'{' | b'[' => Framing::Json,
                        // `data:`, `event:`, `id:`, `retry:` or a comment.
                        b'd' | b'e' | b'i' | b'r' | b':' => Framing::Sse(LINE_START),
                        _ => Framing::GaveUp(Outcome::NotRecognised),
                    };
                    self.byte(b);
                }
                _ => self.byte(b),
            }
        }
    }

    /// Recognises server-sent events by the body's first byte that is no
    /// blank, before the chunk's events are looked at: what is left of
    /// `chunk` from that byte, which is read as the first of a line. Any
    /// other body is recognised byte by byte.
    fn framing_of_first_bytes<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        if self.framing != Framing::Unknown {
            return chunk;
        }
        let first = chunk.trim_ascii_start();
        match first.first() {
            // `data:`, `event:`, `id:`, `retry:` or a comment.
            Some(b'd' | b'e' | b'i' | b'r' | b':') => {
                self.framing = Framing::Sse(LINE_START);
                first
            }
            _ => chunk,
        }
    }

    /// What is left of `chunk` once the events it ends, up to its last
    /// blank line, are passed over, when nothing in them can begin a
    /// capture and the scanner stands at rest; else all of it. Scanned,
    /// each of those lines would leave the scanner at rest (a line that
    /// begins no capture is forgotten at its end) and the blank line would
    /// reset it: passed over, the scanner is reset and the next line
    /// begins. Most chunks of a stream are whole events without a usage,
    /// so they cost two searches each.
    fn whole_events_without_usage<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        if !matches!(self.framing, Framing::Sse(_)) || !self.scanner.at_rest() {
            return chunk;
        }
        // The last line end that follows another; the common chunk ends
        // with one.
        let Some(end) = memrchr_iter(b'\n', chunk)
            .find(|&at| at > 0 && chunk.get(at - 1) == Some(&b'\n'))
            .map(|at| at + 1)
        else {
            return chunk;
        };
        match chunk.get(..end) {
            Some(events) if !may_begin_capture(events) => {
                self.scanner.reset();
                self.framing = Framing::Sse(LINE_START);
                chunk.get(end..).unwrap_or_default()
            }
            _ => chunk,
        }
    }

    /// The first bytes of a `data:` line (`rest`, not empty): the scanner
    /// watches for a capture; a line that starts a document, lies whole in
    /// `rest` and cannot begin one is passed over to its line end (whose
    /// byte then forgets it, as it would have after scanning it).
    fn data_line_start<'a>(&mut self, rest: &'a [u8]) -> &'a [u8] {
        let from_rest = self.scanner.at_rest();
        self.scanner.forget_captures_begun();
        self.framing = Framing::Sse(Line::Data { from_rest });
        if from_rest
            && let Some(end) = memchr(b'\n', rest)
            && !may_begin_capture(rest.get(..end).unwrap_or_default())
        {
            return rest.get(end..).unwrap_or_default();
        }
        rest
    }

    /// How many of `bytes`' first bytes are the JSON document's and go
    /// to the scanner as they are, in bulk: all of a JSON body, the rest
    /// of a `data:` line up to its end (whose byte ends the line); `None`
    /// when there are none.
    #[inline]
    fn document_bytes(&self, bytes: &[u8]) -> Option<usize> {
        let end = match self.framing {
            Framing::Json => bytes.len(),
            Framing::Sse(Line::Data { .. }) => memchr(b'\n', bytes).unwrap_or(bytes.len()),
            Framing::Unknown | Framing::Sse(_) | Framing::GaveUp(_) => return None,
        };
        (end > 0).then_some(end)
    }

    #[inline]
    fn byte(&mut self, b: u8) {
        match self.framing {
            Framing::Json => self.json_byte(b),
            Framing::Sse(line) => {
                let next = self.sse_byte(line, b);
                if let Framing::Sse(_) = self.framing {
                    self.framing = Framing::Sse(next);
                }
            }
            Framing::Unknown | Framing::GaveUp(_) => {}
        }
    }

    #[inline]
    fn json_byte(&mut self, b: u8) {
        let step = self.scanner.byte(b);
        self.take_step(step);
    }

    #[inline]
    fn take_step(&mut self, step: Step) {
        match step {
            Step::Continue => {}
            Step::Captured => self.take_capture(),
            Step::Overflow => self.framing = Framing::GaveUp(Outcome::OverCap),
        }
    }

    #[inline]
    fn sse_byte(&mut self, line: Line, b: u8) -> Line {
        match line {
            Line::Start { mut prefix, len } => {
                if b == b'\n' {
                    if len == 0 {
                        // A blank line ends the event.
                        self.scanner.reset();
                    }
                    return LINE_START;
                }
                if b == b'\r' && len == 0 {
                    return line;
                }
                if let Some(slot) = prefix.get_mut(len) {
                    *slot = b;
                }
                let len = len + 1;
                if len < prefix.len() && prefix.get(..len) == b"data:".get(..len) {
                    return Line::Start { prefix, len };
                }
                if &prefix == b"data:" {
                    Line::DataStart
                } else {
                    Line::Skip
                }
            }
            // `feed` turns `DataStart` into `Data` before the line's first
            // byte; were it still here, the line would be read from where
            // the scanner stands, never forgotten.
            Line::DataStart | Line::Data { .. } => {
                let from_rest = matches!(line, Line::Data { from_rest: true });
                self.json_byte(b);
                if b != b'\n' {
                    return line;
                }
                if from_rest
                    && !self.scanner.began_capture()
                    && matches!(self.framing, Framing::Sse(_))
                {
                    // What a line that began no capture left is forgotten,
                    // as when it was passed over unscanned.
                    self.scanner.reset();
                }
                LINE_START
            }
            Line::Skip => {
                if b == b'\n' {
                    LINE_START
                } else {
                    Line::Skip
                }
            }
        }
    }

    fn take_capture(&mut self) {
        if let Ok(raw) = serde_json::from_slice::<RawUsage>(self.scanner.captured()) {
            self.seen.merge(raw);
        }
    }

    /// Bytes held now (never more than the cap).
    pub fn held(&self) -> usize {
        self.scanner.held()
    }

    /// The usage so far, or why there is none.
    pub fn outcome(&self) -> Outcome {
        if let Framing::GaveUp(outcome) = self.framing {
            return outcome;
        }
        match self.seen.usage() {
            Some((usage, provider)) => {
                let sse = matches!(self.framing, Framing::Sse(_));
                let format = match (provider, sse) {
                    (Provider::OpenAi, false) => Format::OpenAiJson,
                    (Provider::OpenAi, true) => Format::OpenAiSse,
                    (Provider::Anthropic, false) => Format::AnthropicJson,
                    (Provider::Anthropic, true) => Format::AnthropicSse,
                    (Provider::Gemini, false) => Format::GeminiJson,
                    (Provider::Gemini, true) => Format::GeminiSse,
                };
                Outcome::Usage(usage, format)
            }
            None => Outcome::NoUsage,
        }
    }

    /// The usage so far.
    pub fn usage(&self) -> Option<Usage> {
        match self.outcome() {
            Outcome::Usage(usage, _) => Some(usage),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    pub(crate) const OPENAI_SSE: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"the \\\"usage\\\": {\\\"total_tokens\\\": 9}\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":37,\"total_tokens\":157,\"prompt_tokens_details\":{\"cached_tokens\":20}}}\n\n",
        "data: [DONE]\n\n",
    );
    pub(crate) const ANTHROPIC_SSE: &str = concat!(
        "event: message_start\r\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":20,\"output_tokens\":1}}}\r\n\r\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        ": a comment\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":15}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":37}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    pub(crate) const GEMINI_SSE: &str = concat!(
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]}}],\"usageMetadata\":{\"promptTokenCount\":120,\"candidatesTokenCount\":10,\"totalTokenCount\":130}}\n\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"b\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":120,\"cachedContentTokenCount\":20,\"candidatesTokenCount\":37,\"totalTokenCount\":157}}\n\n",
    );
    pub(crate) const OPENAI_JSON: &str = "{\"id\":\"c\",\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"{\\\"usage\\\":{\\\"prompt_tokens\\\":1}}\"}}],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":37,\"total_tokens\":157,\"prompt_tokens_details\":{\"cached_tokens\":20}}}";
    pub(crate) const GEMINI_JSON_ARRAY: &str = "[{\"usageMetadata\":{\"promptTokenCount\":120,\"candidatesTokenCount\":5}},\n{\"usageMetadata\":{\"promptTokenCount\":120,\"cachedContentTokenCount\":20,\"candidatesTokenCount\":37,\"totalTokenCount\":157}}]";

    const EXPECTED: Usage = Usage {
        input: 120,
        cached_input: 20,
        output: 37,
        total: 157,
    };

    fn parse(body: &str, cap: usize) -> Outcome {
        let mut parser = UsageParser::new(cap);
        parser.feed(body.as_bytes());
        parser.outcome()
    }

    #[test]
    fn every_format_yields_its_usage() {
        for (body, format) in [
            (OPENAI_SSE, Format::OpenAiSse),
            (ANTHROPIC_SSE, Format::AnthropicSse),
            (GEMINI_SSE, Format::GeminiSse),
            (OPENAI_JSON, Format::OpenAiJson),
            (GEMINI_JSON_ARRAY, Format::GeminiJson),
        ] {
            assert_eq!(
                parse(body, 1024),
                Outcome::Usage(EXPECTED, format),
                "{body}"
            );
        }
        let anthropic_json = "{\"type\":\"message\",\"content\":[],\"usage\":{\"input_tokens\":90,\"cache_creation_input_tokens\":10,\"cache_read_input_tokens\":20,\"output_tokens\":37}}";
        assert_eq!(
            parse(anthropic_json, 1024),
            Outcome::Usage(EXPECTED, Format::AnthropicJson)
        );
        // Gemini's reasoning tokens are output.
        let thoughts = "{\"usageMetadata\":{\"promptTokenCount\":10,\"candidatesTokenCount\":5,\"thoughtsTokenCount\":7,\"totalTokenCount\":22}}";
        let Outcome::Usage(usage, _) = parse(thoughts, 1024) else {
            panic!("no usage")
        };
        assert_eq!((usage.output, usage.total), (12, 22));
    }

    #[test]
    fn streams_without_usage_say_so() {
        // OpenAI without include_usage, a stream cut before its usage.
        let plain = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(parse(plain, 1024), Outcome::NoUsage);
        let cut = &OPENAI_SSE[..OPENAI_SSE.find("{\"id\":\"c\",\"choices\":[]").unwrap() + 30];
        assert_eq!(parse(cut, 1024), Outcome::NoUsage);
        assert_eq!(parse("", 1024), Outcome::NoUsage);
        assert_eq!(parse("   \n", 1024), Outcome::NoUsage);
        assert_eq!(parse("<html>", 1024), Outcome::NotRecognised);
        // An event's usage object left unfinished is dropped at its end.
        let unfinished = "data: {\"usage\":{\"prompt_tokens\":5\n\ndata: {\"x\":1}\n\n";
        assert_eq!(parse(unfinished, 1024), Outcome::NoUsage);
    }

    #[test]
    fn a_usage_larger_than_the_cap_gives_up_and_holds_no_more() {
        let mut parser = UsageParser::new(40);
        parser.feed(OPENAI_JSON.as_bytes());
        assert_eq!(parser.outcome(), Outcome::OverCap);
        assert!(parser.held() <= 40);
        // What follows is ignored.
        parser.feed(GEMINI_SSE.as_bytes());
        assert_eq!(parser.outcome(), Outcome::OverCap);
        // The content never counts against the cap: only the usage does.
        let long = format!(
            "{{\"choices\":[{{\"message\":{{\"content\":\"{}\"}}}}],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":2}}}}",
            "x".repeat(100_000)
        );
        assert!(matches!(
            parse(&long, 64),
            Outcome::Usage(_, Format::OpenAiJson)
        ));
    }

    #[test]
    fn only_usage_keys_at_shallow_depths_are_read() {
        let deep = "{\"a\":{\"b\":{\"c\":{\"usage\":{\"prompt_tokens\":9}}}}}";
        assert_eq!(parse(deep, 1024), Outcome::NoUsage);
        // A key that merely starts like one, or an escaped one.
        let near = "{\"usages\":{\"prompt_tokens\":9},\"usag\\u0065\":{\"prompt_tokens\":9}}";
        assert_eq!(parse(near, 1024), Outcome::NoUsage);
        // `usage` as a value is not a key.
        let value = "{\"k\":\"usage\",\"v\":{\"prompt_tokens\":9}}";
        assert_eq!(parse(value, 1024), Outcome::NoUsage);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod properties {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use proptest::prelude::*;

    use super::tests::{ANTHROPIC_SSE, GEMINI_JSON_ARRAY, GEMINI_SSE, OPENAI_JSON, OPENAI_SSE};
    use super::*;

    /// Lines for [`events_passed_over_or_scanned_byte_by_byte_agree`].
    const LINES: [&str; 16] = [
        "data: {\"usage\":null,\"x\":1}\n",
        "data: {\"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 4}}\n",
        "data: {\"usageMetadata\" :\t{\"promptTokenCount\":5}}\n",
        "data: {\"a\":{\"b\":{\"c\":{\"usage\":{\"input_tokens\":9}}}}}\n",
        "data: {\"t\":\"\\\"usage\\\": {\\\"output_tokens\\\": 2}\"}\n",
        "data: {\"k\":\"usage\",\"v\":{\"output_tokens\":7}}\n",
        "data: {\"a\":[1,\n",
        "data: {\"usage\":{\"output_tokens\":8\n",
        "data: }}\n",
        "data: \"usage\":{\"output_tokens\":6}}\n",
        "data: {\"x\":\"{[\"\n",
        "event: message_delta\n",
        ": comment \"usage\":{\n",
        "\n",
        "\r\n",
        "data:\n",
    ];

    fn in_pieces(body: &[u8], cuts: &[usize], cap: usize) -> Outcome {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut parser = UsageParser::new(cap);
        let mut from = 0;
        for cut in cuts {
            parser.feed(&body[from..cut]);
            from = cut;
        }
        parser.feed(&body[from..]);
        parser.outcome()
    }

    proptest! {
        /// Any split of a valid body into chunks gives the same usage as
        /// the whole body.
        #[test]
        fn any_split_gives_the_same_usage(
            which in 0_usize..5,
            cuts in proptest::collection::vec(any::<usize>(), 0..40),
        ) {
            let body = [OPENAI_SSE, ANTHROPIC_SSE, GEMINI_SSE, OPENAI_JSON, GEMINI_JSON_ARRAY][which];
            let whole = in_pieces(body.as_bytes(), &[], 1024);
            prop_assert!(matches!(whole, Outcome::Usage(..)));
            prop_assert_eq!(in_pieces(body.as_bytes(), &cuts, 1024), whole);
        }

        /// Any bytes, in any chunks: no panic, never more held than the cap.
        #[test]
        fn any_bytes_stay_within_the_cap(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..32),
            cap in 0_usize..128,
        ) {
            let mut parser = UsageParser::new(cap);
            for chunk in &chunks {
                parser.feed(chunk);
                prop_assert!(parser.held() <= cap);
            }
            let _ = parser.outcome();
        }

        /// Streams of lines that do and do not carry usage keys (deep,
        /// inside strings, as values, documents over several `data:`
        /// lines, blank lines anywhere), fed whole (which passes over whole
        /// events unscanned), in any chunks and one byte at a time (where
        /// no chunk holds a whole event, so none is passed over before it
        /// is scanned): the same outcome.
        #[test]
        fn events_passed_over_or_scanned_byte_by_byte_agree(
            lines in proptest::collection::vec(0_usize..LINES.len(), 0..24),
            cuts in proptest::collection::vec(any::<usize>(), 0..16),
            cap in 0_usize..96,
        ) {
            let body: Vec<u8> = lines.iter().flat_map(|&i| LINES[i].bytes()).collect();
            let every_byte: Vec<usize> = (0..body.len()).collect();
            let by_bytes = in_pieces(&body, &every_byte, cap);
            prop_assert_eq!(in_pieces(&body, &cuts, cap), by_bytes);
            prop_assert_eq!(in_pieces(&body, &[], cap), by_bytes);
        }

        /// Valid streams with bytes spliced in: no panic, bounded.
        #[test]
        fn corrupted_streams_stay_within_the_cap(
            which in 0_usize..5,
            at in any::<usize>(),
            noise in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let body = [OPENAI_SSE, ANTHROPIC_SSE, GEMINI_SSE, OPENAI_JSON, GEMINI_JSON_ARRAY][which].as_bytes();
            let at = at % (body.len() + 1);
            let mut corrupted = body[..at].to_vec();
            corrupted.extend_from_slice(&noise);
            corrupted.extend_from_slice(&body[at..]);
            let mut parser = UsageParser::new(256);
            parser.feed(&corrupted);
            prop_assert!(parser.held() <= 256);
            let _ = parser.outcome();
        }
    }
}
