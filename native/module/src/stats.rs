//! [`StatsSink`] over Envoy's stats: the filter's metrics, defined when the
//! configuration is created and updated from the module's ticker thread.

use std::collections::HashMap;

use sluice_native_filter::{MetricKind, StatsSink, metric_names};

use crate::abi::{self, EnvoyPtr, ModuleBuffer};

/// The filter configuration's stats.
pub struct EnvoyStats {
    config: EnvoyPtr,
    ids: HashMap<&'static str, usize>,
}

// SAFETY: `config` is Envoy's filter configuration, which outlives this
// value (the module drops it in `config_destroy`, after the ticker thread,
// the only other user, has been joined). Envoy's counters and gauges are
// atomic and their ids are fixed once defined, so updating them from the
// ticker thread is what the config-level callbacks are for.
unsafe impl Send for EnvoyStats {}
// SAFETY: as for `Send`: only atomic updates through `&self`.
unsafe impl Sync for EnvoyStats {}

impl EnvoyStats {
    /// Defines every metric of the filter in the configuration being
    /// created. Metrics Envoy refuses are left out (and reported once).
    ///
    /// # Safety
    /// `config` must be the `config_envoy_ptr` of the running
    /// `config_new` hook, and the value must be dropped before Envoy
    /// destroys that configuration.
    pub unsafe fn define(config: EnvoyPtr) -> Self {
        let mut ids = HashMap::new();
        for (kind, name) in metric_names() {
            let mut id = 0_usize;
            let buffer = ModuleBuffer::of(name.as_bytes());
            // SAFETY: `config` is live (see above), the name is borrowed for
            // the call and copied by Envoy, no labels, and `id` is a local
            // Envoy writes once.
            let result = unsafe {
                match kind {
                    MetricKind::Counter => {
                        abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                            config,
                            buffer,
                            std::ptr::null(),
                            0,
                            &mut id,
                        )
                    }
                    MetricKind::Gauge => {
                        abi::envoy_dynamic_module_callback_http_filter_config_define_gauge(
                            config,
                            buffer,
                            std::ptr::null(),
                            0,
                            &mut id,
                        )
                    }
                }
            };
            if result == abi::METRICS_SUCCESS {
                ids.insert(name, id);
            } else {
                eprintln!("sluice_native: Envoy refused the metric {name} ({result})");
            }
        }
        Self { config, ids }
    }
}

impl StatsSink for EnvoyStats {
    fn add_counter(&self, name: &str, delta: u64) {
        if let Some(id) = self.ids.get(name) {
            // SAFETY: the configuration is live (see the `Send` impl) and
            // `id` is one Envoy handed out for it; no labels.
            unsafe {
                abi::envoy_dynamic_module_callback_http_filter_config_increment_counter(
                    self.config,
                    *id,
                    std::ptr::null(),
                    0,
                    delta,
                );
            }
        }
    }

    fn set_gauge(&self, name: &str, value: u64) {
        if let Some(id) = self.ids.get(name) {
            // SAFETY: as for `add_counter`.
            unsafe {
                abi::envoy_dynamic_module_callback_http_filter_config_set_gauge(
                    self.config,
                    *id,
                    std::ptr::null(),
                    0,
                    value,
                );
            }
        }
    }
}
