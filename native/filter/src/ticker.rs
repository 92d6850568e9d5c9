//! The thread that drives every agent's tick, as Envoy's timer drives each
//! wasm VM's: it hands each agent what its control-plane streams received,
//! then ticks it.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::control_stream::StreamEvent;
use crate::native_host::Shared;
use crate::stats::{Exporter, StatsSink};
use crate::workers::{WorkerState, Workers, now_ms};

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

/// One tick of every agent.
pub fn tick_all(workers: &Workers) {
    for slot in workers.all() {
        let now = now_ms();
        let mut state = slot.lock();
        let WorkerState { agent, host } = &mut *state;
        for (token, event) in host.take_stream_events() {
            match event {
                StreamEvent::Message(bytes, received_ms) => {
                    agent.on_stream_message(host, token, &bytes, received_ms.min(now));
                }
                StreamEvent::Closed(status) => agent.on_stream_close(host, token, status, now),
            }
        }
        agent.on_tick(host, now);
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
