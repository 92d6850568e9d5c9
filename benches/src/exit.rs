//! A benchmark binary's end: its work to completion, or until SIGINT or
//! SIGTERM, as an exit code.
//!
//! A benchmark starts Envoys, control planes and stand-in services, each
//! held by a guard that kills its process when dropped. An error or a
//! panic drops them; a signal's default action would end the process
//! without running any destructor and leave them running. Here a signal
//! drops the work instead, so its guards stop what it started before the
//! binary exits.

use std::future::Future;
use std::process::ExitCode;

use tokio::signal::unix::{SignalKind, signal};

/// The exit code after SIGINT, as a shell reports a process it killed.
pub const INTERRUPTED: u8 = 128 + 2;
/// The exit code after SIGTERM.
pub const TERMINATED: u8 = 128 + 15;

/// Runs `work` until it ends or a signal arrives; `name` prefixes what is
/// printed. Success is 0, an error 1 (printed), a signal
/// [`INTERRUPTED`] or [`TERMINATED`] once `work` is dropped.
pub async fn run_to_exit(name: &str, work: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(interrupt), Ok(terminate)) => (interrupt, terminate),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("{name}: cannot listen for signals: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = tokio::select! {
        // Work that has ended is its own outcome, whatever came meanwhile.
        biased;
        outcome = work => match outcome {
            Ok(()) => return ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("{name}: {err:#}");
                return ExitCode::FAILURE;
            }
        },
        _ = interrupt.recv() => INTERRUPTED,
        _ = terminate.recv() => TERMINATED,
    };
    // `work` is dropped by now, and with it every process it started.
    eprintln!("{name}: stopped by a signal; the processes it started are stopped");
    ExitCode::from(code)
}
