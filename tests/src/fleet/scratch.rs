//! A test's scratch directory (kept for a post-mortem when the test
//! fails) and free loopback addresses.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};

/// A temp dir for a test's configs and logs. Dropped, it is removed, but
/// not when the thread panics (a failed assertion): then it stays, and its
/// path is printed.
#[derive(Debug)]
pub struct TestDir {
    dir: tempfile::TempDir,
    what: &'static str,
}

impl TestDir {
    /// A new temp dir named `<prefix>…`; `what` names it in the message
    /// printed on failure.
    pub fn new(prefix: &str, what: &'static str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("cannot create a temp dir")?;
        Ok(Self { dir, what })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("{} files kept in {}", self.what, self.dir.path().display());
        }
    }
}

/// A loopback address with a port free right now (nobody listens on it:
/// a control plane that is not there, or a port reserved for one).
pub fn free_loopback_addr() -> Result<SocketAddr> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?)
}
