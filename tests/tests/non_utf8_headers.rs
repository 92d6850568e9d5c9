//! Header values that are not UTF-8, in every header the filter reads, sent
//! to a real Envoy with one worker, each followed at once by good requests
//! on that worker: no 503 anywhere, no panic or trap in Envoy's log, the
//! good requests decided as before, and every such value taken as absent
//! (its part's default applies) and counted in
//! `sluice.header_values_invalid`. The wasm filter runs under its default
//! failure policy, FAIL_CLOSED, where one trap fails every later request on
//! its worker; the native module the same way.
//!
//! HTTP allows any byte above 0x7f in a header value, and Envoy passes such
//! bytes on. It refuses them in the `Host` header and the request line (400,
//! before any filter runs), but a filter before Sluice can still set such an
//! authority or path: here a few lines of Lua copy `x-set-authority` and
//! `x-set-path` into them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;
use serde_yaml_ng::Value;
use sluice_integration_tests::envoy;
use sluice_integration_tests::fleet::{DataPlane, EnvoySpec, Fleet, FleetOptions};
use sluice_integration_tests::wait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Buckets are `x-key|authority|first path segment`; each part's default
/// lands in a bucket limited to 0, so a value taken as absent is seen as a
/// 429, where a value kept (or mangled into a cell of its own) would pass.
const LIMITS: &str = r#"
limits:
  - bucket: "dflt|sluice.test|/x"
    limit_rps: 0
  - bucket: "open|dflt.host|/x"
    limit_rps: 0
  - bucket: "open|sluice.test|/dflt"
    limit_rps: 0
"#;

/// Copies `x-set-authority` and `x-set-path`, byte for byte, into the
/// request's authority and path, before Sluice reads them.
const LUA: &str = r#"
function envoy_on_request(request_handle)
  local headers = request_handle:headers()
  local authority = headers:get("x-set-authority")
  if authority then headers:replace(":authority", authority) end
  local path = headers:get("x-set-path")
  if path then headers:replace(":path", path) end
end
"#;

/// A good request of an unlimited bucket: passes.
const OPEN: &[u8] = b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\r\nx-tenant: acme\r\nx-priority: batch\r\nconnection: close\r\n\r\n";
/// A good request of a limited bucket: dropped.
const LIMITED: &[u8] =
    b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: dflt\r\nconnection: close\r\n\r\n";

/// One request that is not UTF-8 somewhere, what Envoy must answer, and how
/// many values the filter takes as absent.
struct Case {
    what: &'static str,
    request: &'static [u8],
    status: u16,
    invalid: u64,
}

const CASES: &[Case] = &[
    Case {
        what: "bucket key header",
        request: b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\xff\r\nconnection: close\r\n\r\n",
        status: 429,
        invalid: 1,
    },
    Case {
        what: "tenant",
        request: b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\r\nx-tenant: \xff\r\nconnection: close\r\n\r\n",
        status: 200,
        invalid: 1,
    },
    Case {
        what: "priority",
        request: b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\r\nx-priority: batch\xc3\r\nconnection: close\r\n\r\n",
        status: 200,
        invalid: 1,
    },
    Case {
        what: "authority set by a filter",
        request: b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\r\nx-set-authority: sluice.test\xff\r\nconnection: close\r\n\r\n",
        status: 429,
        invalid: 1,
    },
    Case {
        what: "path set by a filter",
        request: b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\r\nx-set-path: /x\xfe/y\r\nconnection: close\r\n\r\n",
        status: 429,
        invalid: 1,
    },
    Case {
        what: "every header at once",
        request: b"GET /x HTTP/1.1\r\nHost: sluice.test\r\nx-key: \xc0\xaf\r\nx-tenant: t\xed\xa0\x80\r\nx-priority: \x80\r\nconnection: close\r\n\r\n",
        status: 429,
        invalid: 3,
    },
    Case {
        what: "Host header on the wire",
        request: b"GET /x HTTP/1.1\r\nHost: sluice.test\xff\r\nx-key: open\r\nconnection: close\r\n\r\n",
        status: 400,
        invalid: 0,
    },
    Case {
        what: "path on the wire",
        request: b"GET /x\xff HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\r\nconnection: close\r\n\r\n",
        status: 400,
        invalid: 0,
    },
];

/// Good requests after each bad one.
const GOOD_AFTER_EACH: usize = 6;

/// Sends `request` on a new connection and returns the response's status,
/// once its head has arrived.
async fn send(addr: SocketAddr, request: &[u8]) -> Result<u16> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(request).await?;
        let mut response = Vec::new();
        let mut chunk = [0u8; 1024];
        while !response.windows(4).any(|w| w == b"\r\n\r\n") {
            let read = stream.read(&mut chunk).await?;
            anyhow::ensure!(read > 0, "connection closed before the response head");
            response.extend_from_slice(&chunk[..read]);
        }
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .context("no response within 5 s")??;
    let head = String::from_utf8_lossy(&response);
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("not an HTTP/1.1 response: {head:?}"))?;
    Ok(status)
}

/// The filter's configuration: the three key parts, a tenant and a
/// priority, each from a header the cases break.
fn filter_patch(data_plane: DataPlane) -> serde_json::Value {
    let id = match data_plane {
        DataPlane::Wasm => "bytes-wasm",
        DataPlane::Native => "bytes-native",
    };
    json!({
        "proxy_id": id,
        "report_interval_ms": 100,
        "bucket_key": [
            {"source": "header", "name": "x-key", "default": "dflt"},
            {"source": "authority", "default": "dflt.host"},
            {"source": "path_prefix", "segments": 1, "default": "/dflt"}
        ],
        "bucket_separator": "|",
        "tenant": {"source": "header", "name": "x-tenant", "default": "default"},
        "priority": {"header": "x-priority", "values": {"batch": "bulk"}, "default": "best_effort"}
    })
}

/// The example config of `data_plane` with the Lua filter first and, for
/// the wasm filter, its default failure policy, one worker.
fn envoy(data_plane: DataPlane) -> EnvoySpec {
    EnvoySpec::demo("envoy-bytes", data_plane)
        .filter(filter_patch(data_plane))
        .concurrency(1)
        .edit(move |config| add_lua(config, data_plane))
}

/// Puts the Lua filter first and, for the wasm filter, removes the
/// example's failure policy.
fn add_lua(config: &mut Value, data_plane: DataPlane) -> Result<()> {
    let lua: Value = serde_yaml_ng::from_str(&format!(
        "name: envoy.filters.http.lua\ntyped_config:\n  \"@type\": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua\n  default_source_code:\n    inline_string: {}\n",
        serde_json::to_string(LUA)?
    ))?;
    let mut managers = 0;
    let mut policies_removed = 0;
    envoy::visit_mappings(config, &mut |mapping| {
        if mapping.contains_key("vm_config") && mapping.remove("failure_policy").is_some() {
            policies_removed += 1;
        }
        if let Some(filters) = mapping
            .get_mut("http_filters")
            .and_then(Value::as_sequence_mut)
        {
            filters.insert(0, lua.clone());
            managers += 1;
        }
    });
    anyhow::ensure!(managers == 1, "{managers} connection managers");
    if data_plane == DataPlane::Wasm {
        // The example sets FAIL_RELOAD; the default is FAIL_CLOSED.
        anyhow::ensure!(policies_removed == 1, "no failure_policy to remove");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_values_that_are_not_utf8_never_trap_the_filter() {
    never_trap_on(DataPlane::Wasm).await;
}

/// The same with the native dynamic module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_header_values_that_are_not_utf8_are_taken_as_absent() {
    never_trap_on(DataPlane::Native).await;
}

async fn never_trap_on(data_plane: DataPlane) {
    let mut fleet = Fleet::start(FleetOptions::control_plane_only(LIMITS))
        .await
        .unwrap();
    let envoy = fleet.start_envoy(&envoy(data_plane)).await.unwrap();
    let (envoy, control_plane) = (&fleet.envoys[envoy], &fleet.control_plane);
    let addr = envoy.listener_addr();

    // Each limited bucket is directed once the control plane has seen it:
    // good requests that land there (its defaults, spelled out) until
    // every one of them is dropped.
    let warm: [&[u8]; 3] = [
        LIMITED,
        b"GET /x HTTP/1.1\r\nHost: dflt.host\r\nx-key: open\r\nconnection: close\r\n\r\n",
        b"GET /dflt HTTP/1.1\r\nHost: sluice.test\r\nx-key: open\r\nconnection: close\r\n\r\n",
    ];
    let directed = wait::until(
        "every limited bucket to be dropped",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || async move {
            let mut statuses = Vec::new();
            for request in warm {
                statuses.push(send(addr, request).await?);
            }
            Ok(statuses.iter().all(|status| *status == 429).then_some(()))
        },
    )
    .await;
    if directed.is_err() {
        control_plane.print_log();
        envoy.print_log();
    }
    directed.unwrap();

    let mut outcomes = Vec::new();
    let mut wrong = Vec::new();
    for case in CASES {
        let status = send(addr, case.request).await;
        outcomes.push(format!("{}: {status:?}", case.what));
        if status.as_ref().ok() != Some(&case.status) {
            wrong.push(format!(
                "{}: {status:?}, expected {}",
                case.what, case.status
            ));
        }
        // At once, on the same (only) worker.
        for n in 0..GOOD_AFTER_EACH {
            let (request, expected) = if n % 2 == 0 {
                (OPEN, 200)
            } else {
                (LIMITED, 429)
            };
            let status = send(addr, request).await;
            if status.as_ref().ok() != Some(&expected) {
                wrong.push(format!(
                    "good request {n} after the {}: {status:?}, expected {expected}",
                    case.what
                ));
            }
        }
    }
    let expected_invalid: u64 = CASES.iter().map(|case| case.invalid).sum();
    let name = "sluice.header_values_invalid";
    let counted = wait::until(
        "the filter to count the values that are not UTF-8",
        Duration::from_secs(3),
        Duration::from_millis(50),
        || {
            let envoy = &envoy;
            async move {
                let stats = envoy.stats(name).await?;
                let value = stats
                    .lines()
                    .find(|line| line.contains(name))
                    .and_then(|line| line.rsplit(": ").next()?.trim().parse::<u64>().ok());
                Ok(value.filter(|value| *value >= expected_invalid))
            }
        },
    )
    .await;
    let log = std::fs::read_to_string(envoy.log_path()).unwrap();
    let trapped: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("panicked") || line.contains("RuntimeError"))
        .collect();
    if !wrong.is_empty() || !trapped.is_empty() || counted.is_err() {
        control_plane.print_log();
        envoy.print_log();
    }
    assert!(
        wrong.is_empty(),
        "{}\nevery case: {outcomes:#?}",
        wrong.join("\n")
    );
    assert!(trapped.is_empty(), "Envoy's log: {trapped:#?}");
    assert_eq!(counted.unwrap(), expected_invalid, "{name}");
}
