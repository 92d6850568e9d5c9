//! The fake LLM upstream on its own, for demos and benchmarks: OpenAI,
//! Anthropic and Gemini APIs on a loopback port (printed at start), token
//! counts from a seeded log-normal distribution; every `--report-every`
//! seconds (and at Ctrl-C) the usage it reported per tenant.

use std::time::Duration;

use clap::Parser;
use hyper::StatusCode;
use hyper::header::HeaderName;
use sluice_integration_tests::llm_upstream::{LlmUpstream, LlmUpstreamOptions, TokenDistribution};

#[derive(Debug, Parser)]
#[command(about = "A fake LLM provider that records the usage it reported per tenant")]
struct Args {
    /// Median output tokens of a response.
    #[arg(long, default_value_t = 500.0)]
    median: f64,
    /// 99th percentile of the output tokens.
    #[arg(long, default_value_t = 8_000.0)]
    p99: f64,
    /// Seeds the draws (tokens, aborts, errors).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output tokens per streamed chunk.
    #[arg(long, default_value_t = 16)]
    tokens_per_chunk: u64,
    /// Pause before each streamed chunk, in milliseconds.
    #[arg(long, default_value_t = 0)]
    chunk_interval_ms: u64,
    /// Fraction of streams cut before their usage.
    #[arg(long, default_value_t = 0.0)]
    abort_rate: f64,
    /// Fraction of requests answered with --error-status.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// The status of those answers.
    #[arg(long, default_value_t = 503)]
    error_status: u16,
    /// Fraction of the input tokens reported as cached.
    #[arg(long, default_value_t = 0.0)]
    cached_ratio: f64,
    /// A response header to carry each response's total tokens.
    #[arg(long)]
    usage_header: Option<String>,
    /// Where to listen (port 0: a free one, printed); `envoy/llm-budget.yaml`
    /// routes to 127.0.0.1:18081.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Seconds between reports of the usage per tenant.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    report_every: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let options = LlmUpstreamOptions {
        output_tokens: TokenDistribution::new(args.median, args.p99)?,
        seed: args.seed,
        cached_ratio: args.cached_ratio,
        tokens_per_chunk: args.tokens_per_chunk,
        chunk_interval: Duration::from_millis(args.chunk_interval_ms),
        abort_rate: args.abort_rate,
        error_rate: args.error_rate,
        error_status: StatusCode::from_u16(args.error_status)
            .map_err(|err| anyhow::anyhow!("error_status: {err}"))?,
        usage_header: args
            .usage_header
            .map(|name| HeaderName::try_from(name.as_str()))
            .transpose()
            .map_err(|err| anyhow::anyhow!("usage_header: {err}"))?,
        ..LlmUpstreamOptions::default()
    };
    let upstream = LlmUpstream::start_on(args.listen, options).await?;
    println!("fake LLM upstream at {}", upstream.base_url());
    println!(
        "  POST /v1/chat/completions, /v1/messages, /v1beta/models/M:generateContent, :streamGenerateContent?alt=sse"
    );
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut every = tokio::time::interval(Duration::from_secs(args.report_every));
    every.tick().await;
    loop {
        let last = tokio::select! {
            _ = every.tick() => false,
            _ = &mut ctrl_c => true,
        };
        let mut tenants: Vec<_> = upstream.tenants().into_iter().collect();
        tenants.sort_by(|a, b| a.0.cmp(&b.0));
        for (tenant, record) in tenants {
            println!(
                "{tenant}: {} requests, {} reported ({} tokens: {} in, {} cached, {} out), {} aborted, {} errors, {} output tokens unreported",
                record.requests,
                record.reported,
                record.usage.total(),
                record.usage.input,
                record.usage.cached_input,
                record.usage.output,
                record.aborted,
                record.errors,
                record.unreported_output
            );
        }
        if last {
            return Ok(());
        }
    }
}
