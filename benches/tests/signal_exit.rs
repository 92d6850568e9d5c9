//! A benchmark stopped by SIGTERM stops the processes it started: the
//! signal drops its work, and the work's guards kill their children. Its
//! own test binary, since the signal handler stays for the process's life.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;
use std::time::Duration;

use sluice_benches::exit::{TERMINATED, run_to_exit};
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

/// Whether `pid` is gone or a zombie (killed, not yet reaped).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

#[tokio::test]
async fn sigterm_drops_the_work_and_kills_what_it_started() {
    // From here on SIGTERM reaches tokio, not the default action, even
    // before `run_to_exit` listens.
    let _installed = signal(SignalKind::terminate()).unwrap();
    let child = Command::new("sleep")
        .arg("600")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let work = async move {
        let _child = child;
        std::future::pending::<()>().await;
        Ok(())
    };
    // Until `run_to_exit` returns: one signal could land before it listens.
    let me = std::process::id().to_string();
    let sender = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = Command::new("kill").args(["-TERM", &me]).status().await;
        }
    });
    let code = tokio::time::timeout(Duration::from_secs(30), run_to_exit("test", work))
        .await
        .expect("SIGTERM did not stop the work");
    sender.abort();
    assert_eq!(code, ExitCode::from(TERMINATED));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ended(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the work's child {pid} is still running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn work_that_ends_is_its_exit_code() {
    assert_eq!(
        run_to_exit("test", async { Ok(()) }).await,
        ExitCode::SUCCESS
    );
    let failed = run_to_exit("test", async { anyhow::bail!("no Envoy") }).await;
    assert_eq!(failed, ExitCode::FAILURE);
}
