//! Integration-test harness for Sluice.
//!
//! The tests in `tests/` and the `demo` binary drive real processes: the
//! control plane (`sluice serve`), Envoy with the built filter (`.wasm`), and
//! an open-loop HTTP load generator. Each module does one thing:
//!
//! - [`adaptive`]: the overload scenario of the adaptive-limit tests (skewed fleet, capped upstream).
//! - [`oci`]: reproducible OCI images of the filter and the control plane (`just images`).
//! - [`paths`]: where the workspace, Envoy, Redis, the control plane and the `.wasm` are.
//! - [`process`]: a child-process guard that logs to a file and cleans up on drop.
//! - [`certs`]: a throw-away CA with server and client certificates for mutual TLS.
//! - [`control_plane`]: start/restart `sluice serve` and talk to its admin API.
//! - [`envoy`]: rewrite an `envoy/*.yaml` for a test, start Envoy, validate configs.
//! - [`fault_proxy`]: a TCP proxy that can cut one process off from a server (a partition).
//! - [`fake_proxy`]: a gRPC client that says Hello as any proxy and reports any counts.
//! - [`fleet`]: a control plane plus the Envoys of a test (`FleetOptions`, `EnvoySpec`), and a scratch dir kept on failure.
//! - [`llm_upstream`]: a fake LLM provider (OpenAI, Anthropic, Gemini; streamed or not) that records the usage it reported.
//! - [`load`]: paced load with per-response records and rate arithmetic.
//! - [`mesh`]: Istio's and Envoy Gateway's delivery of the wasm filter, as their sources build it.
//! - [`quotas`]: Envoys with the Sluice filter and Envoy's `ratelimit` filter (exact quotas).
//! - [`prometheus`]: the Prometheus text format, parsed once for every test crate.
//! - [`raw_grpc`]: a gRPC codec for message bytes as they are (malformed, or of a newer protocol).
//! - [`redis`]: a real `redis-server` on an ephemeral port, killable and restartable.
//! - [`registry`]: a real OCI registry on loopback, skopeo to push, HTTP to pull by digest.
//! - [`replicas`]: control-plane replicas sharing one Redis, and Envoys pointed at all of them.
//! - [`rlqs`]: Envoys with their own `rate_limit_quota` filter and the control plane as RLQS.
//! - [`sidecars`]: Istio sidecars without Istio: xDS, the control plane and Envoys fed deploy/'s WasmPlugin through ECDS.
//! - [`stalled`]: a gRPC server that accepts streams and never answers.
//! - [`token_fleet`]: a fleet holding a token budget, and open-loop load of streamed completions.
//! - [`two_call`]: Envoy's `ratelimit` filter holding a token budget by check-then-charge on the rate limit service and Redis.
//! - [`wait`]: polling with timeouts.
//! - [`xds`]: an ADS server (state of the world) that serves Envoy what a test sets and records its ACKs.

pub mod adaptive;
pub mod capped_upstream;
pub mod certs;
pub mod control_plane;
pub mod envoy;
pub mod fake_proxy;
pub mod fault_proxy;
pub mod fleet;
pub mod http_server;
pub mod llm_upstream;
pub mod load;
pub mod mesh;
pub mod oci;
pub mod paths;
pub mod process;
pub mod prometheus;
pub mod quotas;
pub mod raw_grpc;
pub mod redis;
pub mod registry;
pub mod replicas;
pub mod rlqs;
pub mod sidecars;
pub mod stalled;
pub mod token_fleet;
pub mod two_call;
pub mod wait;
pub mod xds;
