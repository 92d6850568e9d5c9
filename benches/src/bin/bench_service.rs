//! The end-to-end benchmark's stand-in services, each as its own process so
//! `bench_envoy` can read their CPU time from `/proc` apart from Envoy's and
//! the load client's.
//!
//! ```text
//! bench_service rls|upstream|llm|limitador --ready-file PATH
//! ```
//!
//! - `rls`: Envoy's rate limit service API answering OK ([`sluice_benches::rls`]);
//! - `upstream`: an HTTP/1.1 server answering `200 ok` ([`sluice_benches::upstream`]);
//! - `llm`: the harness's fake LLM provider
//!   ([`sluice_integration_tests::llm_upstream`]), its output tokens taken
//!   from the request's `x-output-tokens` header, so every request of the
//!   benchmark gets the same stream;
//! - `limitador`: the rate limit service API over Kuadrant's `limitador`
//!   library in memory, domain `bench`, a counter per `tenant`
//!   ([`sluice_benches::limitador_rls`]).
//!
//! Listens on an ephemeral loopback port, writes `host:port` to the ready
//! file (atomically, by rename) and serves until SIGTERM or SIGINT.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use sluice_benches::{limitador_rls, rls, upstream};
use sluice_integration_tests::llm_upstream::{LlmUpstream, LlmUpstreamOptions};
use sluice_integration_tests::token_fleet::OUTPUT_TOKENS_HEADER;
use tokio::signal::unix::{SignalKind, signal};

// One thread: one core's worth of work at most, like one replica.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench_service: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (kind, ready) = match (args.next(), args.next().as_deref(), args.next()) {
        (Some(kind), Some("--ready-file"), Some(path)) => (kind, std::path::PathBuf::from(path)),
        _ => bail!("usage: bench_service rls|upstream|llm|limitador --ready-file PATH"),
    };
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    if kind == "llm" {
        // It binds its own loopback port and serves until dropped.
        let llm = LlmUpstream::start(LlmUpstreamOptions {
            output_tokens_header: Some(hyper::header::HeaderName::from_static(
                OUTPUT_TOKENS_HEADER,
            )),
            ..LlmUpstreamOptions::default()
        })
        .await?;
        write_ready(&ready, llm.addr())?;
        shutdown.await;
        drop(llm);
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("cannot bind")?;
    write_ready(&ready, listener.local_addr().context("no local address")?)?;
    match kind.as_str() {
        "rls" => rls::serve(listener, shutdown).await,
        "upstream" => upstream::serve(listener, shutdown).await,
        "limitador" => limitador_rls::serve("bench", listener, shutdown).await,
        other => bail!("unknown service {other:?}: rls, upstream, llm or limitador"),
    }
}

/// Writes `addr` to `ready` atomically (by rename).
fn write_ready(ready: &std::path::Path, addr: std::net::SocketAddr) -> Result<()> {
    let partial = ready.with_extension("partial");
    std::fs::write(&partial, addr.to_string())
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, ready).with_context(|| format!("cannot write {}", ready.display()))
}
