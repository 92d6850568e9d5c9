# Every workflow of the project. `just --list` shows them all.

set shell := ["bash", "-euo", "pipefail", "-c"]

wasm_target := "wasm32-wasip1"
wasm_profile := "wasm"
wasm_out := "target/" + wasm_target + "/" + wasm_profile + "/sluice_filter.wasm"
empty_wasm_out := "target/" + wasm_target + "/" + wasm_profile + "/sluice_empty_filter.wasm"
musl_target := "x86_64-unknown-linux-musl"

# Show the recipes.
default:
    @just --list

# Install the pinned toolchain with its wasm targets, Envoy, Redis, the registry tools and the manifest validator.
setup:
    rustup toolchain install
    rustup target add wasm32-wasip1 wasm32-unknown-unknown
    ./scripts/ensure-envoy.sh >/dev/null
    ./scripts/ensure-redis.sh >/dev/null
    ./scripts/ensure-registry-tools.sh >/dev/null
    ./scripts/ensure-kubernetes-validate.sh >/dev/null

# Build the filter's .wasm (what Envoy loads).
build-wasm: setup
    cargo build -p sluice-filter --target {{wasm_target}} --profile {{wasm_profile}}
    @ls -l {{wasm_out}}

# Build the control plane binary (`target/debug/sluice`).
build-control-plane:
    cargo build -p sluice-control-plane --bin sluice

# Build the filter as a native Envoy dynamic module: `target/release/libsluice_native.so`, which Envoy loads as `sluice_native` from ENVOY_DYNAMIC_MODULES_SEARCH_PATH (see envoy/native-module.yaml).
build-native:
    cargo build --release -p sluice-envoy-module
    @ls -l target/release/libsluice_native.so

# Build everything the integration tests and the demo run.
build: build-wasm build-control-plane build-empty-filter
    cargo build -p sluice-envoy-module
    cargo build -p sluice-integration-tests --bins

# Run the demo: a control plane, two Envoys and uneven load above the limit.
demo *ARGS: build
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} \
      cargo run -q -p sluice-integration-tests --bin demo -- {{ARGS}}

# High availability: Redis, 3 control-plane replicas, 2 Envoys at 4x a limit; the leader is killed halfway and the fleet's admitted rate is printed every second (`--duration S`).
demo-ha *ARGS: build
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" REDIS_SERVER="$(./scripts/ensure-redis.sh)" SLUICE_WASM={{wasm_out}} \
      cargo run -q -p sluice-integration-tests --bin demo_ha -- {{ARGS}}

# A token budget: a control plane holding 20,000 LLM tokens/s, 3 Envoys at 60/30/10 % of 3x that in streamed completions from the fake LLM upstream (log-normal tokens), 3 tenants weighted 2:1:1; admitted tokens printed every second (`--duration S`, `--budget N`, `--offered X`, `--native`).
demo-tokens *ARGS: build
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} \
      cargo run -q -p sluice-integration-tests --bin demo_tokens -- {{ARGS}}

# Sluice as Istio delivers it, without a cluster: an xDS server serves deploy/istio's WasmPlugin over ECDS as istiod builds it to two Envoy sidecars, which hold deploy/'s limit under uneven load (`--duration S`, `--rps N`).
demo-istio *ARGS: build
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} \
      cargo run -q -p sluice-integration-tests --bin demo_istio -- {{ARGS}}

# The release artifacts in target/images/, reproducibly and without a container runtime: the filter and the control plane (a static musl binary) as OCI image layouts, and the native module with its sha256; prints each digest and how to push it.
images: build-wasm build-native
    rustup target add {{musl_target}}
    RUSTFLAGS="--remap-path-prefix={{justfile_directory()}}=/sluice --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo" \
      CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-cc}" \
      cargo build --release --locked --target {{musl_target}} -p sluice-control-plane --bin sluice --no-default-features --features ctl
    cargo build -q -p sluice-integration-tests --bin images
    target/debug/images --wasm {{wasm_out}} --sluice target/{{musl_target}}/release/sluice \
      --native target/release/libsluice_native.so --out target/images

# `just images`, then the registry round trip of tests/tests/images.rs on those artifacts, with the control plane's binary checked to be static.
test-images: images
    SLUICE_WASM={{wasm_out}} SLUICE_IMAGE_BIN=target/{{musl_target}}/release/sluice SLUICE_IMAGE_STATIC=1 \
      SLUICE_NATIVE_MODULE=target/release/libsluice_native.so \
      cargo test -p sluice-integration-tests --test images

# Validate deploy/'s manifests (Kubernetes and CRD schemas, kustomizations, the limits file, the filter configs, the control plane's flags); part of `just test`.
check-deploy: build-control-plane
    cargo test -p sluice-integration-tests --test deploy_manifests

# Everything CI checks: formatting, lints, unit tests (native and wasm32), integration tests.
test: setup fmt-check lint clippy doc-check test-unit test-wasm test-integration

# Check formatting.
fmt-check:
    cargo fmt --all -- --check

# No import loops between the files of any crate (scripts/check-module-cycles.py, tested by its own unit tests first).
lint:
    python3 -m unittest discover -s scripts -p 'test_*.py' -q
    python3 scripts/check-module-cycles.py

# Build the API docs of every crate with warnings as errors: a broken link fails.
doc-check:
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items

# Format the code.
fmt:
    cargo fmt --all

# Lint native and wasm32 builds with warnings as errors.
clippy: setup
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy -p sluice-control-plane --no-default-features -- -D warnings
    cargo clippy -p sluice-core -p sluice-agent -p sluice-filter -p sluice-empty-filter --target wasm32-wasip1 -- -D warnings
    cargo clippy -p sluice-core -p sluice-agent --target wasm32-unknown-unknown --tests -- -D warnings

# Unit and property tests, native.
test-unit:
    cargo test --workspace --exclude sluice-integration-tests

# The core and the agent library on wasm32, under wasm-bindgen-test in Node.
test-wasm: setup
    runner="$(./scripts/ensure-wasm-bindgen.sh)"; node_dir="$(./scripts/ensure-node.sh)"; \
      PATH="$node_dir:$PATH" CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$runner" \
      cargo test -p sluice-core -p sluice-agent --target wasm32-unknown-unknown

# Integration tests: real Envoy processes with the built .wasm (and the native module) and the real control plane.
test-integration: build
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" REDIS_SERVER="$(./scripts/ensure-redis.sh)" SLUICE_WASM={{wasm_out}} \
      cargo test -p sluice-integration-tests -- --test-threads=1

# Validate every config in envoy/ with `envoy --mode validate`.
validate-envoy: build-wasm
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} \
      cargo test -p sluice-integration-tests --test envoy_configs

# Run the deterministic simulator (the agent library's agents in every simulated Envoy and the real controller, simulated clock): baseline vs improved table, time series and SVG plots in target/simulate.
simulate *ARGS="--scenario all --out target/simulate":
    cargo run -q --release -p sluice-simulator --bin sluice-simulate -- {{ARGS}}

# Criterion benchmarks of the pure hot path and controller.
bench:
    cargo bench -p sluice-benches

# Build the do-nothing proxy-wasm filter the end-to-end benchmark compares Sluice with.
build-empty-filter: setup
    cargo build -p sluice-empty-filter --target {{wasm_target}} --profile {{wasm_profile}}

# End-to-end benchmark: Envoy alone, + local_ratelimit, + an empty wasm filter, + Sluice, + global ratelimit with a gRPC service, and router vs Sluice at 50% in front of a real upstream, and a streamed LLM completion with and without the usage parser; updates BENCHMARKS.md and its CPU chart (`--quick`: short run, `--output -`: print only).
bench-envoy *ARGS: build-wasm build-empty-filter build-native
    cargo build -q --release -p sluice-control-plane --bin sluice
    cargo build -q --release -p sluice-benches --bins
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} EMPTY_FILTER_WASM={{empty_wasm_out}} SLUICE_BIN=target/release/sluice \
      SLUICE_NATIVE_MODULE=target/release/libsluice_native.so target/release/bench_envoy {{ARGS}}

# Directive propagation latency to 1,000 simulated proxy streams and to one real Envoy; updates BENCHMARKS.md (`--output -`: print only, `--streams N`, `--events N`).
bench-propagation *ARGS: build-wasm
    cargo build -q --release -p sluice-control-plane --bin sluice
    cargo build -q --release -p sluice-benches --bins
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} SLUICE_BIN=target/release/sluice \
      target/release/bench_propagation {{ARGS}}

# The rate limit service (exact quotas) under load, in memory, on Redis and on a Redis Cluster (3 masters + 3 replicas) in the same run, beside a minimal always-OK service and the limitador library behind it: ShouldRateLimit calls/s, CPU per call (Redis's too), p50/p99 per algorithm; updates BENCHMARKS.md (`--output -`: print only, `--rate N`, `--seconds S`).
bench-rls *ARGS:
    cargo build -q --release -p sluice-control-plane --bin sluice
    cargo build -q --release -p sluice-benches --bins
    SLUICE_BIN=target/release/sluice REDIS_SERVER="$(./scripts/ensure-redis.sh)" target/release/bench_rls {{ARGS}}

# Sluice's fleet-wide adaptive limit against Envoy's per-instance adaptive_concurrency and admission_control: 3 Envoys (60/30/10) at 3x a capped upstream that halves mid-run; prints goodput, latency and what each class and Envoy got (three 30 s runs, not part of `just test`).
bench-adaptive: build
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} \
      cargo test -q -p sluice-integration-tests --test adaptive_side_by_side -- --ignored --nocapture

# How closely 3 Envoys (60/30/10) hold a 20,000 tokens/s budget at 3x, streamed completions with log-normal tokens (median 500, p99 8,000), 3 tenants 2:1:1: admitted tokens per 1 s and 10 s window, per tenant, and after a 0.5x -> 3x step, with the filter's defaults and with the allowance always engaged; updates BENCHMARKS.md (`--data-plane wasm|native|both`, `--seconds S`, `--constant-estimate N`: every request estimated at N tokens, its own section; `--output -`: print only). Not part of `just test`.
bench-tokens *ARGS: build-wasm build-native
    cargo build -q --release -p sluice-control-plane --bin sluice
    cargo build -q --release -p sluice-benches --bins
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" SLUICE_WASM={{wasm_out}} SLUICE_BIN=target/release/sluice \
      SLUICE_NATIVE_MODULE=target/release/libsluice_native.so target/release/bench_tokens {{ARGS}}

# Sluice's token budget beside the two-call pattern (Envoy's ratelimit filter checking with hits_addend 0, charging at stream end to the rate limit service on Redis), the same load on each in one run: 3 Envoys (60/30/10) at 3x 20,000 tokens/s, streamed completions with log-normal tokens; admitted tokens vs the budget per 1 s and 10 s window, Envoy CPU per request, p50/p99 latency, calls per request; updates BENCHMARKS.md (`--seconds S`, `--data-plane wasm|native`, `--output -`: print only). Not part of `just test`.
bench-tokens-vs-ratelimit *ARGS: build-wasm build-native
    cargo build -q --release -p sluice-control-plane --bin sluice
    cargo build -q --release -p sluice-benches --bins
    ENVOY_BIN="$(./scripts/ensure-envoy.sh)" REDIS_SERVER="$(./scripts/ensure-redis.sh)" SLUICE_WASM={{wasm_out}} SLUICE_BIN=target/release/sluice \
      SLUICE_NATIVE_MODULE=target/release/libsluice_native.so target/release/bench_tokens_vs_ratelimit {{ARGS}}

# Soak the control plane: 1,000 simulated proxies x 1,000 buckets every 500 ms for `seconds` (default 10 minutes); RSS over time, push latency, no errors. `--replicas 3 [--store URL]`: as replicas sharing Redis. Updates BENCHMARKS.md. Not part of `just test`.
soak seconds="600" *ARGS:
    cargo build -q --release -p sluice-control-plane --bin sluice
    cargo build -q --release -p sluice-benches --bins
    SLUICE_BIN=target/release/sluice REDIS_SERVER="$(./scripts/ensure-redis.sh)" target/release/soak --duration {{seconds}} {{ARGS}}

# A throw-away CA and certificates for envoy/demo-mtls.yaml, in .demo/certs/.
certs:
    cargo run -q -p sluice-integration-tests --bin certs -- .demo/certs

# Fuzz every target for SECONDS each with cargo fuzz (nightly and cargo-fuzz are
# installed on first use). Crashes land in fuzz/artifacts/<target>/; move one
# into fuzz/regressions/<target>/ to keep it as a regression test.
fuzz SECONDS="60" *TARGETS="filter_config limits_file directive_batch bucket_key report header_bytes usage_stream cost_rule":
    rustup toolchain install nightly --profile minimal
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
    for target in {{TARGETS}}; do \
      mkdir -p fuzz/corpus/$target; \
      cp -n fuzz/seeds/$target/* fuzz/regressions/$target/* fuzz/corpus/$target/ 2>/dev/null || true; \
      echo "== fuzzing $target for {{SECONDS}} s"; \
      cargo +nightly fuzz run --features libfuzzer $target fuzz/corpus/$target -- \
        -max_total_time={{SECONDS}} -rss_limit_mb=2048 -print_final_stats=1; \
    done

# Remove build output and the local tool folder.
clean:
    cargo clean
    rm -rf .tools .demo
