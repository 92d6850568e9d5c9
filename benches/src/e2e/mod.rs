//! The end-to-end benchmark behind the `bench_envoy` binary: Envoy with
//! `--concurrency 1` in eighteen variants (filter chains, two with a real
//! upstream, Envoy's `rate_limit_quota` with the real control plane as
//! RLQS server, the native module, and five streaming an LLM completion
//! from the fake provider), a closed-loop HTTP/1.1 client in-process, and
//! Envoy's own CPU time read from `/proc`.
//!
//! - [`config`]: the Envoy configs, derived from `envoy/demo-a.yaml`.
//! - [`directives`]: a stand-in control plane pushing one fixed directive.
//! - [`client`]: a fixed number of requests at a fixed concurrency.
//! - [`measure`]: process CPU time and machine facts.
//! - [`report`]: medians, ranges, ratios and the Markdown table.
//! - [`chart`]: CPU per request per variant as an SVG chart.
//! - [`service`]: the stand-in rate limit service and upstreams as child
//!   processes.

pub mod chart;
pub mod client;
pub mod config;
pub mod directives;
pub mod measure;
pub mod report;
pub mod service;
