//! A client that claims a billion tokens, through real Envoy 1.40 for the
//! wasm filter and the native module: the token budget of
//! `token_budget.rs` (one cell, 20,000 tokens/s written per minute,
//! offered 3x in streamed completions), and in the same cell a client
//! whose requests state `x-estimated-tokens: 1000000000` and ask for 50
//! tokens, one a second until one is let through. It reads each answer to
//! its end, so its usage shows the claim false.
//!
//! The estimate is the client's to state, and the controller steers on
//! it. Counted as stated (within ten seconds of the budget), one claim let
//! through was a debt that held the cell's honest requests off for about
//! twenty seconds (80 % fewer tokens admitted over the window), and one
//! dropped was a credit its proxy's coin admitted in a burst. The
//! directive's estimate cap counts a claim as one heavy request (16 mean
//! costs), so the window holds the budget within the bound of
//! `token_budget.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::Duration;

use serde_json::json;
use sluice_integration_tests::fleet::DataPlane;
use sluice_integration_tests::token_fleet::completion;
use sluice_integration_tests::token_fleet::one_cell::{self, LOAD, MEASURE_FROM, TENANT};

/// The admitted tokens' bound, relative to the budget (`token_budget.rs`
/// says why).
const BOUND: f64 = 0.25;
/// What each claim states.
const CLAIM: u64 = 1_000_000_000;
/// What each claim asks for, and uses.
const CLAIM_TOKENS: u64 = 50;
/// Most claims sent.
const MAX_CLAIMS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wasm_filter_counts_a_false_claim_as_one_heavy_request() {
    a_false_claim_counts_as_one_heavy_request(DataPlane::Wasm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_module_counts_a_false_claim_as_one_heavy_request() {
    a_false_claim_counts_as_one_heavy_request(DataPlane::Native).await;
}

async fn a_false_claim_counts_as_one_heavy_request(data_plane: DataPlane) {
    let (fleet, load, url) = one_cell::start(data_plane, json!({}), 41).await.unwrap();

    // Once the budget is enforced, claims in the load's cell until one is
    // let through.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let client = reqwest::Client::new();
    let (mut claims, mut admitted_claims, mut claim_tokens) = (0, 0, 0);
    while admitted_claims == 0 && claims < MAX_CLAIMS {
        claims += 1;
        let response = completion(&client, &url, TENANT, CLAIM, CLAIM_TOKENS)
            .send()
            .await
            .unwrap();
        let status = response.status();
        // To the end: the filter charges the usage when the stream is over.
        let _ = response.bytes().await.unwrap();
        if status == 200 {
            admitted_claims += 1;
            claim_tokens += CLAIM_TOKENS;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let completions = load.finish().await;

    let (admitted, expected, error) = one_cell::admitted_against_budget(&completions, claim_tokens);
    let summary = format!(
        "{data_plane:?}: admitted {admitted} tokens in {:?} against a budget of {expected} \
         ({:+.1} %), {claims} claims of {CLAIM} tokens sent, {admitted_claims} let through",
        LOAD - MEASURE_FROM,
        error * 100.0
    );
    if error.abs() > BOUND {
        fleet.fleet.print_logs();
    }
    assert!(error.abs() <= BOUND, "{summary}");
    eprintln!("{summary}");
}
