//! The thread that paces every agent's tick, as Envoy's timer paces each
//! wasm VM's: it marks each tick due every period; a worker's next request
//! runs it, and the ticker runs those of agents no request reaches.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::native_host::Shared;
use crate::stats::{Exporter, StatsSink};
use crate::workers::Workers;

/// The running ticker; dropping it stops and joins the thread.
#[derive(Debug)]
pub struct Ticker {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Ticks every agent of `workers` every `period`, then exports their
    /// metrics to `sink`.
    pub fn start(
        workers: Arc<Workers>,
        shared: Arc<Shared>,
        sink: Arc<dyn StatsSink>,
        period: Duration,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sluice-native-tick".to_owned())
            .spawn(move || {
                let mut exporter = Exporter::default();
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                    tick_all(&workers);
                    exporter.export(&shared.metrics.snapshot(), sink.as_ref());
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// One tick period: every agent's tick is marked due, and those no request
/// will tick are ticked here ([`crate::workers::WorkerSlot::mark_tick_due`]).
pub fn tick_all(workers: &Workers) {
    for slot in workers.all() {
        slot.mark_tick_due();
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread only ever waits or ticks; a panic there is already
            // reported by the runtime, so the join result carries nothing new.
            let _ = thread.join();
        }
    }
}
