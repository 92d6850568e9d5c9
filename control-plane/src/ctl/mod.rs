//! `sluice ctl`: the admin API from the command line.
//!
//! Reads print a table (or the API's JSON with `--json`); writes print the
//! API's answer. Any error prints the problem detail on stderr and exits 1.

mod client;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use self::client::{Client, CtlError};
use crate::config::overrides::{OverrideTtl, parse_duration};

/// `sluice ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Base URL of the admin API.
    #[arg(
        long,
        env = "SLUICE_ADMIN_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub(crate) url: String,
    /// File holding the bearer token; without it, the token is read from
    /// SLUICE_ADMIN_TOKEN if that is set.
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) token_file: Option<PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Write only if the resource's entity tag (its `ETag`) is still this
    /// one; otherwise the API answers 412 and nothing changes.
    #[arg(long, value_name = "ETAG", global = true)]
    pub(crate) if_match: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: CtlCommand,
}

/// `sluice ctl` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum CtlCommand {
    /// Buckets with traffic: rates, limits, drop ratios.
    Buckets,
    /// Proxies: identity, zone, last report, directive age, connected.
    Proxies,
    /// Adaptive buckets: the limit in force, its bounds, why it moved;
    /// with `set` or `rm`, change one bucket's spec.
    Adaptive {
        /// Without one: list the adaptive buckets.
        #[command(subcommand)]
        command: Option<AdaptiveCommand>,
    },
    /// Limits in force and limit overrides.
    Limits,
    /// Set or remove a bucket's limit.
    #[command(subcommand)]
    Limit(LimitCommand),
    /// Tenant policies in force and tenant overrides.
    Tenants,
    /// Set or remove a tenant's policy.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Rollout modes, kill switch and canary fraction.
    Modes,
    /// Set modes.
    #[command(subcommand)]
    Mode(ModeCommand),
    /// Turn the kill switch on (every proxy shadows) or off.
    KillSwitch {
        /// `on` or `off`.
        state: Switch,
    },
    /// Set the fraction of proxies that enforce (0-1), or `off` for all.
    Canary {
        /// A fraction such as 0.1, or `off`.
        fraction: String,
    },
    /// Temporary overrides in force.
    Overrides,
    /// Set or remove a temporary override.
    #[command(subcommand)]
    Override(OverrideCommand),
    /// Where a descriptor's exact quota stands (needs `serve --quotas`);
    /// counts no hit.
    Quota {
        /// The quota configuration's domain.
        domain: String,
        /// The descriptor's entries, in order, as KEY=VALUE.
        #[arg(required = true, value_name = "KEY=VALUE", value_parser = parse_entry)]
        entries: Vec<(String, String)>,
    },
    /// Replay the last minutes of fleet traffic through proposed limits,
    /// tenants or modes and show what would have been admitted and
    /// dropped, per bucket, tenant and priority (changes nothing).
    Whatif {
        /// A YAML or JSON file of limits-file sections (`limits:`,
        /// `tenants:`, …) that replace the ones in force for the replay.
        file: std::path::PathBuf,
        /// Replay only the last this many seconds (default: all recorded,
        /// up to 5 minutes).
        #[arg(long, value_name = "SECONDS")]
        seconds: Option<f64>,
    },
}

fn parse_entry(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Switch {
    /// On.
    On,
    /// Off.
    Off,
}

/// `shadow` or `enforce`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ModeArg {
    /// Count would-be drops, reject nothing.
    Shadow,
    /// Reject with 429.
    Enforce,
}

impl ModeArg {
    fn as_str(self) -> &'static str {
        match self {
            Self::Shadow => "shadow",
            Self::Enforce => "enforce",
        }
    }
}

/// A cost budget given on the command line: `AMOUNT UNIT/PER`, as the
/// limits table prints it (`1200000 tokens/minute`; the space may be left
/// out). The control plane validates the values.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BudgetArg {
    amount: f64,
    unit: String,
    per: String,
}

impl BudgetArg {
    fn to_json(&self) -> Value {
        json!({ "amount": self.amount, "unit": self.unit, "per": self.per })
    }
}

fn parse_budget(text: &str) -> Result<BudgetArg, String> {
    let usage = || format!("{text:?} is not a budget such as `1200000 tokens/minute`");
    let (amount_unit, per) = text.split_once('/').ok_or_else(usage)?;
    let amount_unit = amount_unit.trim();
    let split = amount_unit
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .ok_or_else(usage)?;
    let (amount, unit) = amount_unit.split_at(split);
    let amount: f64 = amount.parse().map_err(|_| usage())?;
    let (unit, per) = (unit.trim(), per.trim());
    if unit.is_empty() || per.is_empty() {
        return Err(usage());
    }
    Ok(BudgetArg {
        amount,
        unit: unit.to_owned(),
        per: per.to_owned(),
    })
}

/// The body of a limit given as a rate or a budget (clap lets exactly one
/// through).
fn limit_body(rps: Option<f64>, budget: Option<&BudgetArg>) -> serde_json::Map<String, Value> {
    let mut body = serde_json::Map::new();
    match (budget, rps) {
        (Some(budget), _) => body.insert("budget".into(), budget.to_json()),
        (None, rps) => body.insert("limit_rps".into(), json!(rps)),
    };
    body
}

/// `sluice ctl limit`.
#[derive(Debug, Subcommand)]
pub(crate) enum LimitCommand {
    /// Set BUCKET's fleet-wide limit in requests per second, or a cost
    /// budget with `--budget`.
    Set {
        /// Exact bucket key.
        bucket: String,
        /// Requests per second (0 drops everything).
        #[arg(
            allow_negative_numbers = true,
            required_unless_present = "budget",
            conflicts_with = "budget"
        )]
        rps: Option<f64>,
        /// A cost budget instead: `AMOUNT UNIT/PER`, e.g. `1200000
        /// tokens/minute` (PER: second, minute or hour).
        #[arg(long, value_name = "BUDGET", value_parser = parse_budget)]
        budget: Option<BudgetArg>,
    },
    /// Remove BUCKET's exact limit.
    Rm {
        /// Exact bucket key.
        bucket: String,
    },
}

/// Values of a tenant policy; those not given take their defaults.
#[derive(Debug, Args)]
pub(crate) struct TenantValues {
    /// Relative weight in the fair share.
    #[arg(long)]
    pub(crate) weight: Option<f64>,
    /// Burst multiplier (1-100).
    #[arg(long)]
    pub(crate) burst: Option<f64>,
    /// Floor in requests per second, below which the tenant is never dropped.
    #[arg(long, value_name = "RPS")]
    pub(crate) floor: Option<f64>,
}

impl TenantValues {
    fn to_json(&self) -> serde_json::Map<String, Value> {
        let mut body = serde_json::Map::new();
        if let Some(weight) = self.weight {
            body.insert("weight".into(), json!(weight));
        }
        if let Some(burst) = self.burst {
            body.insert("burst".into(), json!(burst));
        }
        if let Some(floor) = self.floor {
            body.insert("min_floor_rps".into(), json!(floor));
        }
        body
    }
}

/// `sluice ctl adaptive`.
#[derive(Debug, Subcommand)]
pub(crate) enum AdaptiveCommand {
    /// Make BUCKET adaptive, or replace its spec, from FILE: one entry of
    /// the limits file's `adaptive:` section, in YAML or JSON (`bucket`
    /// may be left out; fields left out take their defaults).
    Set {
        /// Exact bucket key.
        bucket: String,
        /// The spec.
        file: PathBuf,
    },
    /// Make BUCKET's limit fixed again.
    Rm {
        /// Exact bucket key.
        bucket: String,
    },
}

/// `sluice ctl tenant`.
#[derive(Debug, Subcommand)]
pub(crate) enum TenantCommand {
    /// Set NAME's policy; values not given take their defaults (weight 1,
    /// burst 1, floor 0).
    Set {
        /// Tenant name (`default` applies to tenants not listed).
        name: String,
        /// The values.
        #[command(flatten)]
        values: TenantValues,
    },
    /// Remove NAME's policy; it falls back to `default`.
    Rm {
        /// Tenant name.
        name: String,
    },
}

/// `sluice ctl mode`.
#[derive(Debug, Subcommand)]
pub(crate) enum ModeCommand {
    /// Set BUCKET's mode.
    Set {
        /// Exact bucket key.
        bucket: String,
        /// The mode.
        mode: ModeArg,
    },
    /// Remove BUCKET's mode; it follows the default.
    Rm {
        /// Exact bucket key.
        bucket: String,
    },
    /// Set the mode of buckets without one of their own.
    Default {
        /// The mode.
        mode: ModeArg,
    },
}

/// `sluice ctl override`.
#[derive(Debug, Subcommand)]
pub(crate) enum OverrideCommand {
    /// Give BUCKET a limit for a while.
    Limit {
        /// Exact bucket key.
        bucket: String,
        /// Requests per second while the override lasts.
        #[arg(
            allow_negative_numbers = true,
            required_unless_present = "budget",
            conflicts_with = "budget"
        )]
        rps: Option<f64>,
        /// A cost budget while the override lasts, instead: `AMOUNT
        /// UNIT/PER`, e.g. `1200000 tokens/minute`.
        #[arg(long, value_name = "BUDGET", value_parser = parse_budget)]
        budget: Option<BudgetArg>,
        /// How long: 90s, 15m, 1h, 2d (at most 30 days).
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
        duration: OverrideTtl,
    },
    /// Give tenant NAME other values for a while.
    Tenant {
        /// Tenant name.
        name: String,
        /// The values (at least one).
        #[command(flatten)]
        values: TenantValues,
        /// How long: 90s, 15m, 1h, 2d (at most 30 days).
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
        duration: OverrideTtl,
    },
    /// Remove an override now; the base values apply again.
    Rm {
        /// `limit` or `tenant`.
        kind: OverrideKind,
        /// Bucket key or tenant name.
        name: String,
    },
}

/// What an override applies to.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum OverrideKind {
    /// A bucket's limit.
    Limit,
    /// A tenant's values.
    Tenant,
}

/// Runs `sluice ctl`; exit code 1 on any error.
pub(crate) async fn execute(args: CtlArgs) -> ExitCode {
    match run(&args).await {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("sluice ctl: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `sluice ctl` and returns what it prints.
pub(crate) async fn run(args: &CtlArgs) -> Result<String, CtlError> {
    let client =
        Client::new(&args.url, args.token_file.as_deref())?.with_if_match(args.if_match.clone());
    let json = args.json;
    let seg = client::segment;
    let (reply, render): (Option<Value>, fn(&Value) -> String) = match &args.command {
        CtlCommand::Buckets => (client.get("/v1/buckets").await?, table::buckets),
        CtlCommand::Proxies => (client.get("/v1/proxies").await?, table::proxies),
        CtlCommand::Adaptive { command: None } => {
            (client.get("/v1/adaptive").await?, table::adaptive)
        }
        CtlCommand::Adaptive {
            command: Some(AdaptiveCommand::Set { bucket, file }),
        } => {
            let text = std::fs::read_to_string(file)
                .map_err(|err| CtlError::Usage(format!("cannot read {}: {err}", file.display())))?;
            // JSON is YAML: one parser reads both.
            let body: Value = serde_yaml_ng::from_str(&text)
                .map_err(|err| CtlError::Usage(format!("{}: {err}", file.display())))?;
            let path = format!("/v1/adaptive/{}", seg(bucket));
            (client.put(&path, Some(body)).await?, table::written)
        }
        CtlCommand::Adaptive {
            command: Some(AdaptiveCommand::Rm { bucket }),
        } => {
            let path = format!("/v1/adaptive/{}", seg(bucket));
            (client.delete(&path).await?, table::written)
        }
        CtlCommand::Limits => (client.get("/v1/limits").await?, table::limits),
        CtlCommand::Tenants => (client.get("/v1/tenants").await?, table::tenants),
        CtlCommand::Modes => (client.get("/v1/modes").await?, table::modes),
        CtlCommand::Overrides => (client.get("/v1/overrides").await?, table::overrides),
        CtlCommand::Whatif { file, seconds } => {
            let text = std::fs::read_to_string(file)
                .map_err(|err| CtlError::Usage(format!("cannot read {}: {err}", file.display())))?;
            // JSON is YAML: one parser reads both.
            let body: Value = serde_yaml_ng::from_str(&text)
                .map_err(|err| CtlError::Usage(format!("{}: {err}", file.display())))?;
            let path = match seconds {
                Some(seconds) => format!("/v1/whatif?seconds={seconds}"),
                None => "/v1/whatif".to_owned(),
            };
            (client.post(&path, body).await?, table::whatif)
        }
        CtlCommand::Quota { domain, entries } => {
            let query: Vec<String> = entries
                .iter()
                .map(|(key, value)| format!("{}={}", seg(key), seg(value)))
                .collect();
            let path = format!("/v1/quotas/{}?{}", seg(domain), query.join("&"));
            (client.get(&path).await?, table::quota)
        }
        CtlCommand::Limit(LimitCommand::Set {
            bucket,
            rps,
            budget,
        }) => {
            let path = format!("/v1/limits/{}", seg(bucket));
            let body = Value::Object(limit_body(*rps, budget.as_ref()));
            (client.put(&path, Some(body)).await?, table::written)
        }
        CtlCommand::Limit(LimitCommand::Rm { bucket }) => {
            let path = format!("/v1/limits/{}", seg(bucket));
            (client.delete(&path).await?, table::written)
        }
        CtlCommand::Tenant(TenantCommand::Set { name, values }) => {
            let path = format!("/v1/tenants/{}", seg(name));
            let body = Value::Object(values.to_json());
            (client.put(&path, Some(body)).await?, table::written)
        }
        CtlCommand::Tenant(TenantCommand::Rm { name }) => {
            let path = format!("/v1/tenants/{}", seg(name));
            (client.delete(&path).await?, table::written)
        }
        CtlCommand::Mode(ModeCommand::Set { bucket, mode }) => {
            let path = format!("/v1/modes/buckets/{}", seg(bucket));
            let body = json!({ "mode": mode.as_str() });
            (client.put(&path, Some(body)).await?, table::modes)
        }
        CtlCommand::Mode(ModeCommand::Rm { bucket }) => {
            let path = format!("/v1/modes/buckets/{}", seg(bucket));
            (client.delete(&path).await?, table::modes)
        }
        CtlCommand::Mode(ModeCommand::Default { mode }) => {
            // Read, change one field, write back: PUT /v1/modes replaces
            // all, so the write names what it read (If-Match) and fails
            // with 412 rather than undo a change made in between.
            let (modes, tag) = client.get_tagged("/v1/modes").await?;
            let mut modes = modes.unwrap_or_default();
            if let Some(object) = modes.as_object_mut() {
                object.insert("default".into(), json!(mode.as_str()));
            }
            let tag = args.if_match.as_deref().or(tag.as_deref());
            (
                client.put_if("/v1/modes", Some(modes), tag).await?,
                table::modes,
            )
        }
        CtlCommand::KillSwitch { state } => {
            let reply = match state {
                Switch::On => client.put("/v1/kill-switch", None).await?,
                Switch::Off => client.delete("/v1/kill-switch").await?,
            };
            (reply, table::modes)
        }
        CtlCommand::Canary { fraction } => {
            let reply = if fraction == "off" {
                client.delete("/v1/canary").await?
            } else {
                let fraction: f64 = fraction.parse().map_err(|_| {
                    CtlError::Usage(format!(
                        "canary: {fraction:?} is neither a fraction nor `off`"
                    ))
                })?;
                let body = json!({ "canary_fraction": fraction });
                client.put("/v1/canary", Some(body)).await?
            };
            (reply, table::modes)
        }
        CtlCommand::Override(OverrideCommand::Limit {
            bucket,
            rps,
            budget,
            duration,
        }) => {
            let path = format!("/v1/overrides/limits/{}", seg(bucket));
            let mut body = limit_body(*rps, budget.as_ref());
            body.insert("ttl_s".into(), json!(duration.as_secs()));
            (
                client.put(&path, Some(Value::Object(body))).await?,
                table::written,
            )
        }
        CtlCommand::Override(OverrideCommand::Tenant {
            name,
            values,
            duration,
        }) => {
            let path = format!("/v1/overrides/tenants/{}", seg(name));
            let mut body = values.to_json();
            body.insert("ttl_s".into(), json!(duration.as_secs()));
            (
                client.put(&path, Some(Value::Object(body))).await?,
                table::written,
            )
        }
        CtlCommand::Override(OverrideCommand::Rm { kind, name }) => {
            let kind = match kind {
                OverrideKind::Limit => "limits",
                OverrideKind::Tenant => "tenants",
            };
            let path = format!("/v1/overrides/{kind}/{}", seg(name));
            (client.delete(&path).await?, table::written)
        }
    };
    Ok(match reply {
        None => "ok\n".to_owned(),
        Some(value) if json => format!("{value}\n"),
        Some(value) => render(&value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_read_as_the_limits_table_prints_them() {
        let budget = parse_budget("1200000 tokens/minute").unwrap();
        assert_eq!(
            budget.to_json(),
            json!({"amount": 1_200_000.0, "unit": "tokens", "per": "minute"})
        );
        assert_eq!(parse_budget("2.5e3credits/hour").unwrap().amount, 2500.0);
        // Values the control plane refuses still reach it (it says why).
        assert_eq!(parse_budget("-5 tokens/day").unwrap().per, "day");
        for bad in [
            "",
            "1200000",
            "tokens/minute",
            "1200000 /minute",
            "12 tokens/",
            "1.2.3 t/s",
        ] {
            assert!(parse_budget(bad).is_err(), "{bad:?}");
        }
    }
}
