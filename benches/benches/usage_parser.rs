//! The usage parser's cost per chunk of a streamed LLM response, as the
//! filter will feed it (one call per body chunk Envoy hands over): an
//! OpenAI stream with `include_usage`, an Anthropic stream and a Gemini
//! stream of 500 output tokens in chunks of 16, and a non-streamed OpenAI
//! JSON body; throughput in body bytes.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_agent::usage::UsageParser;
use sluice_integration_tests::llm_upstream::formats::{self, Api, Usage};

const USAGE: Usage = Usage {
    input: 1_200,
    cached_input: 200,
    output: 500,
};
/// What the filter would let the parser hold per stream.
const CAP: usize = 4_096;

/// The events of one streamed response, one per chunk.
fn stream(api: Api) -> Vec<Vec<u8>> {
    let chunks = formats::chunk_sizes(USAGE.output, 16, 256);
    let sse = formats::sse_body(api, 1, "bench-model", USAGE, &chunks, true);
    [sse.head, sse.content, sse.tail]
        .concat()
        .into_iter()
        .map(String::into_bytes)
        .collect()
}

fn per_chunk(c: &mut Criterion) {
    let mut group = c.benchmark_group("usage_parser");
    for (name, api) in [
        ("openai_sse", Api::OpenAi),
        ("anthropic_sse", Api::Anthropic),
        ("gemini_sse", Api::Gemini),
    ] {
        let events = stream(api);
        let bytes: usize = events.iter().map(Vec::len).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_function(format!("{name}_{}_chunks", events.len()), |b| {
            b.iter(|| {
                let mut parser = UsageParser::new(CAP);
                for event in &events {
                    parser.feed(black_box(event));
                }
                black_box(parser.outcome())
            })
        });
    }
    let json = formats::json_body(Api::OpenAi, 1, "bench-model", USAGE)
        .to_string()
        .into_bytes();
    group.throughput(Throughput::Bytes(json.len() as u64));
    group.bench_function("openai_json_one_chunk", |b| {
        b.iter(|| {
            let mut parser = UsageParser::new(CAP);
            parser.feed(black_box(&json));
            black_box(parser.outcome())
        })
    });
    group.finish();
}

criterion_group!(benches, per_chunk);
criterion_main!(benches);
