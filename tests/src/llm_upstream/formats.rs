//! The response bodies of the three provider APIs, as their SDKs parse
//! them: OpenAI chat completions (JSON; SSE chunks, with the usage chunk
//! of `stream_options.include_usage`), Anthropic messages (JSON; SSE
//! events with the input in `message_start` and the cumulative output in
//! `message_delta`) and Gemini (`usageMetadata` in JSON and in every SSE
//! chunk, cumulative).

use serde_json::{Value, json};

/// Which provider's API a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
    /// `POST /v1beta/models/{model}:generateContent` or
    /// `:streamGenerateContent?alt=sse`.
    Gemini,
}

/// A response's token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, the cached ones included.
    pub input: u64,
    /// Of `input`, those read from the provider's prompt cache.
    pub cached_input: u64,
    /// Generated tokens.
    pub output: u64,
}

impl Usage {
    /// Input and output.
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }

    /// Adds `other` to `self`.
    pub fn add(&mut self, other: Usage) {
        self.input = self.input.saturating_add(other.input);
        self.cached_input = self.cached_input.saturating_add(other.cached_input);
        self.output = self.output.saturating_add(other.output);
    }
}

/// `tokens` words of filler text.
fn text(tokens: u64) -> String {
    "tok ".repeat(usize::try_from(tokens).unwrap_or(0))
}

/// Splits `output` tokens into at most `max_chunks` chunks of about
/// `per_chunk` each (never an empty chunk, at least one).
pub fn chunk_sizes(output: u64, per_chunk: u64, max_chunks: u64) -> Vec<u64> {
    let per_chunk = per_chunk.max(1);
    let chunks = output.div_ceil(per_chunk).clamp(1, max_chunks.max(1));
    let base = output / chunks;
    let extra = output % chunks;
    (0..chunks).map(|i| base + u64::from(i < extra)).collect()
}

/// The non-streamed body.
pub fn json_body(api: Api, id: u64, model: &str, usage: Usage) -> Value {
    let content = text(usage.output);
    match api {
        Api::OpenAi => json!({
            "id": format!("chatcmpl-{id}"),
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }],
            "usage": openai_usage(usage),
        }),
        Api::Anthropic => json!({
            "id": format!("msg_{id}"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": content}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {
                "input_tokens": usage.input - usage.cached_input,
                "cache_read_input_tokens": usage.cached_input,
                "output_tokens": usage.output,
            },
        }),
        Api::Gemini => json!({
            "candidates": [{
                "content": {"parts": [{"text": content}], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }],
            "usageMetadata": gemini_usage(usage, usage.output),
            "modelVersion": model,
        }),
    }
}

fn openai_usage(usage: Usage) -> Value {
    json!({
        "prompt_tokens": usage.input,
        "completion_tokens": usage.output,
        "total_tokens": usage.total(),
        "prompt_tokens_details": {"cached_tokens": usage.cached_input},
    })
}

fn gemini_usage(usage: Usage, output_so_far: u64) -> Value {
    json!({
        "promptTokenCount": usage.input,
        "cachedContentTokenCount": usage.cached_input,
        "candidatesTokenCount": output_so_far,
        "totalTokenCount": usage.input + output_so_far,
    })
}

fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn event(name: &str, value: &Value) -> String {
    format!("event: {name}\ndata: {value}\n\n")
}

/// A streamed response as server-sent events, in order: `head` (before
/// any content), one event per content chunk, and `tail` (the end, with
/// the usage if the API reports it). A stream cut short sends `head` and
/// some of `content` only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sse {
    /// Events before the content.
    pub head: Vec<String>,
    /// One event per chunk of generated text.
    pub content: Vec<String>,
    /// Events after the content.
    pub tail: Vec<String>,
}

/// The streamed body of `usage` in `chunks` (from [`chunk_sizes`]); for
/// OpenAI the usage chunk only when `include_usage` (the request's
/// `stream_options.include_usage`).
pub fn sse_body(
    api: Api,
    id: u64,
    model: &str,
    usage: Usage,
    chunks: &[u64],
    include_usage: bool,
) -> Sse {
    let mut sse = Sse::default();
    match api {
        Api::OpenAi => {
            let chunk = |delta: Value, finish: Value| {
                let mut value = json!({
                    "id": format!("chatcmpl-{id}"),
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                });
                if let (true, Some(object)) = (include_usage, value.as_object_mut()) {
                    object.insert("usage".to_owned(), Value::Null);
                }
                data(&value)
            };
            sse.head.push(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            ));
            for &tokens in chunks {
                sse.content
                    .push(chunk(json!({"content": text(tokens)}), Value::Null));
            }
            sse.tail.push(chunk(json!({}), json!("stop")));
            if include_usage {
                sse.tail.push(data(&json!({
                    "id": format!("chatcmpl-{id}"),
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [],
                    "usage": openai_usage(usage),
                })));
            }
            sse.tail.push("data: [DONE]\n\n".to_owned());
        }
        Api::Anthropic => {
            sse.head.push(event(
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": format!("msg_{id}"), "type": "message", "role": "assistant",
                    "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {
                        "input_tokens": usage.input - usage.cached_input,
                        "cache_read_input_tokens": usage.cached_input,
                        "output_tokens": 1,
                    },
                }}),
            ));
            sse.head.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}),
            ));
            sse.head.push(event("ping", &json!({"type": "ping"})));
            for &tokens in chunks {
                sse.content.push(event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": text(tokens)}}),
                ));
            }
            sse.tail.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ));
            // Cumulative: the last one is the whole output.
            sse.tail.push(event(
                "message_delta",
                &json!({"type": "message_delta",
                        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                        "usage": {"output_tokens": usage.output}}),
            ));
            sse.tail
                .push(event("message_stop", &json!({"type": "message_stop"})));
        }
        Api::Gemini => {
            // Every chunk carries the usage so far; the last one is final.
            let mut so_far = 0;
            let last = chunks.len().saturating_sub(1);
            for (i, &tokens) in chunks.iter().enumerate() {
                so_far += tokens;
                let mut candidate = json!({
                    "content": {"parts": [{"text": text(tokens)}], "role": "model"},
                    "index": 0,
                });
                if let (true, Some(object)) = (i == last, candidate.as_object_mut()) {
                    object.insert("finishReason".to_owned(), json!("STOP"));
                }
                let value = json!({
                    "candidates": [candidate],
                    "usageMetadata": gemini_usage(usage, so_far),
                    "modelVersion": model,
                });
                if i == last {
                    sse.tail.push(data(&value));
                } else {
                    sse.content.push(data(&value));
                }
            }
        }
    }
    sse
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    const USAGE: Usage = Usage {
        input: 120,
        cached_input: 20,
        output: 37,
    };

    /// The JSON values of the `data:` lines of `events`.
    fn values(events: &[String]) -> Vec<Value> {
        events
            .iter()
            .flat_map(|e| e.lines())
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }

    fn all(sse: &Sse) -> Vec<String> {
        [sse.head.clone(), sse.content.clone(), sse.tail.clone()].concat()
    }

    #[test]
    fn chunks_add_up_and_are_bounded() {
        assert_eq!(chunk_sizes(37, 10, 100), [10, 9, 9, 9]);
        assert_eq!(chunk_sizes(1, 16, 100), [1]);
        assert_eq!(chunk_sizes(1_000, 1, 8).len(), 8);
        assert_eq!(chunk_sizes(1_000, 1, 8).iter().sum::<u64>(), 1_000);
        assert!(chunk_sizes(5, 2, 100).iter().all(|c| *c > 0));
    }

    #[test]
    fn openai_reports_the_usage_in_json_and_in_the_last_chunk_when_asked() {
        let body = json_body(Api::OpenAi, 1, "m", USAGE);
        assert_eq!(body["usage"]["total_tokens"], 157);
        assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 20);
        let chunks = chunk_sizes(37, 10, 100);
        let sse = sse_body(Api::OpenAi, 1, "m", USAGE, &chunks, true);
        assert_eq!(sse.tail.last().unwrap(), "data: [DONE]\n\n");
        let values = values(&all(&sse));
        let with_usage: Vec<_> = values.iter().filter(|v| v["usage"].is_object()).collect();
        assert_eq!(with_usage.len(), 1, "one usage chunk");
        assert_eq!(with_usage[0]["choices"], json!([]));
        assert_eq!(with_usage[0]["usage"]["completion_tokens"], 37);
        assert!(
            values[..values.len() - 1]
                .iter()
                .all(|v| v["usage"].is_null())
        );
        // Without include_usage: no usage at all.
        let plain = sse_body(Api::OpenAi, 1, "m", USAGE, &chunks, false);
        assert!(values_of(&plain).iter().all(|v| v.get("usage").is_none()));
    }

    fn values_of(sse: &Sse) -> Vec<Value> {
        values(&all(sse))
    }

    #[test]
    fn anthropic_streams_the_input_first_and_the_cumulative_output_last() {
        let chunks = chunk_sizes(37, 10, 100);
        let sse = sse_body(Api::Anthropic, 1, "m", USAGE, &chunks, false);
        let values = values_of(&sse);
        assert_eq!(values[0]["type"], "message_start");
        assert_eq!(values[0]["message"]["usage"]["input_tokens"], 100);
        assert_eq!(values[0]["message"]["usage"]["cache_read_input_tokens"], 20);
        let delta = values
            .iter()
            .find(|v| v["type"] == "message_delta")
            .unwrap();
        assert_eq!(delta["usage"]["output_tokens"], 37);
        assert_eq!(values.last().unwrap()["type"], "message_stop");
        assert!(
            sse.content
                .iter()
                .all(|e| e.starts_with("event: content_block_delta\n"))
        );
        let body = json_body(Api::Anthropic, 1, "m", USAGE);
        assert_eq!(body["usage"]["output_tokens"], 37);
    }

    #[test]
    fn gemini_carries_the_usage_so_far_in_every_chunk() {
        let chunks = chunk_sizes(37, 10, 100);
        let sse = sse_body(Api::Gemini, 1, "m", USAGE, &chunks, false);
        let values = values_of(&sse);
        assert_eq!(values.len(), 4);
        let outputs: Vec<_> = values
            .iter()
            .map(|v| v["usageMetadata"]["candidatesTokenCount"].as_u64().unwrap())
            .collect();
        assert_eq!(outputs, [10, 19, 28, 37]);
        assert_eq!(values[3]["usageMetadata"]["totalTokenCount"], 157);
        assert_eq!(values[3]["candidates"][0]["finishReason"], "STOP");
        let body = json_body(Api::Gemini, 1, "m", USAGE);
        assert_eq!(body["usageMetadata"]["totalTokenCount"], 157);
    }
}
