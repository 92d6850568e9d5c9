//! `POST /v1/whatif`: what a proposed configuration would have admitted
//! and dropped over the last minutes of fleet traffic; changes nothing.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::context::Admin;
use super::extract::Json;
use super::problem::Problem;
use crate::config::Config;
use crate::control::whatif::{self, WhatIf};

/// The longest replay one may ask for: the history keeps no more.
pub(crate) const MAX_SECONDS: f64 = crate::control::history::DEFAULT_SPAN.as_secs_f64();

/// `?seconds=N`: replay only the last N seconds (default: all recorded, at
/// most [`MAX_SECONDS`]).
#[derive(Debug, Deserialize)]
pub(crate) struct Span {
    seconds: Option<f64>,
}

/// `POST /v1/whatif`: the body holds limits-file sections (`limits`,
/// `tenants`, `adaptive`, `default_limit_rps`, …) that replace the
/// configuration's own for the replay; sections not given stay as they
/// are. Adaptive limits move on the recorded upstream signals.
pub(crate) async fn replay(
    State(admin): State<Admin>,
    span: Result<Query<Span>, QueryRejection>,
    Json(proposal): Json<Map<String, Value>>,
) -> Result<axum::Json<WhatIf>, Problem> {
    let Query(span) = span.map_err(|err| Problem::new(StatusCode::BAD_REQUEST, err.body_text()))?;
    let state = admin.state();
    let interval = state.control_interval();
    let intervals = match span.seconds {
        None => usize::MAX,
        Some(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_SECONDS => {
            let per = interval.as_duration().as_secs_f64();
            (seconds / per).ceil() as usize
        }
        Some(_) => {
            return Err(Problem::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "seconds: must be a number > 0 and at most {MAX_SECONDS} (the recorded history's span)"
                ),
            ));
        }
    };
    let config = proposed(&admin.live().config(), proposal)?;
    let recorded = state.history(intervals);
    Ok(axum::Json(whatif::replay(
        &recorded,
        &config.policy(),
        interval,
    )))
}

/// The configuration in force with the proposal's sections in place of
/// its own, validated as a limits file is.
fn proposed(current: &Config, proposal: Map<String, Value>) -> Result<Config, Problem> {
    let mut merged = match serde_json::to_value(current) {
        Ok(Value::Object(merged)) => merged,
        _ => {
            return Err(Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot read the configuration in force",
            ));
        }
    };
    merged.extend(proposal);
    // JSON is YAML: the limits file's own parser validates the result and
    // names the field at fault.
    let text = serde_json::to_string_pretty(&Value::Object(merged))
        .map_err(|err| Problem::new(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    Config::from_yaml(&text, "the proposed configuration")
        .map_err(|err| Problem::unprocessable(err.to_string()))
}
