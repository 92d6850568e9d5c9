//! The stand-in global rate limit service as its own process, so the
//! end-to-end benchmark can read its CPU time from `/proc` apart from
//! Envoy's and the load client's.
//!
//! ```text
//! rls_server --ready-file PATH
//! ```
//!
//! Listens on an ephemeral loopback port, writes `host:port` to the ready
//! file (atomically, by rename) and serves until SIGTERM or SIGINT.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use sluice_benches::rls;
use tokio::signal::unix::{SignalKind, signal};

// One thread: one core's worth of work at most, like one RLS replica.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rls_server: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let ready = match (args.next().as_deref(), args.next()) {
        (Some("--ready-file"), Some(path)) => std::path::PathBuf::from(path),
        _ => bail!("usage: rls_server --ready-file PATH"),
    };
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let (listener, addr) = rls::bind().await?;
    let partial = ready.with_extension("partial");
    std::fs::write(&partial, addr.to_string())
        .with_context(|| format!("cannot write {}", partial.display()))?;
    std::fs::rename(&partial, &ready)
        .with_context(|| format!("cannot write {}", ready.display()))?;
    rls::serve(listener, async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
    .await
}
