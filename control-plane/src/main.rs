//! `sluice`: the Sluice control plane binary.
// The CLI's nested futures take rustc past its default query depth (128)
// while laying them out in release builds.
#![recursion_limit = "256"]

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use sluice_control_plane::cli::{self, Cli};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Logs usually end up in files (tests, service managers): no colour codes there.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    cli::execute(cli).await
}
