//! The quota options of `sluice serve` and `sluice check-config --quotas`:
//! envoyproxy/ratelimit's settings where Sluice has them, read from the
//! same environment variables where the name is its own
//! (`NEAR_LIMIT_RATIO`, `LIMIT_RESPONSE_HEADERS_ENABLED`, …).

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::algorithm::Algorithm;
use super::settings::{NearLimitRatio, QuotaSettings, ResponseHeaders, StoreFailure};
use crate::config::quota_file::{LoadOptions, QuotaConfig};

/// How `sluice serve` counts and answers exact quotas.
#[derive(Debug, Clone, Args)]
pub(crate) struct QuotaArgs {
    /// The algorithm of every quota: fixed_window (envoyproxy/ratelimit's,
    /// the default), sliding_window or gcra (no boundary bursts).
    #[arg(long, value_name = "NAME", default_value = "fixed_window", value_parser = parse_algorithm)]
    pub(crate) quota_algorithm: Algorithm,
    /// What a hit that cannot be counted (the store is full, down or
    /// slower than `--store-timeout-ms`) is answered: error (a gRPC error,
    /// as envoyproxy/ratelimit answers: the `ratelimit` filter's
    /// failure_mode_deny decides), allow (OK) or deny (over limit); allow
    /// and deny add `x-ratelimit-error`.
    #[arg(long, value_name = "ANSWER", default_value = "error", value_parser = parse_store_failure)]
    pub(crate) quota_store_failure: StoreFailure,
    /// Same as `--quota-store-failure deny` (kept for existing command
    /// lines).
    #[arg(long, hide = true, conflicts_with = "quota_store_failure")]
    pub(crate) quota_fail_closed: bool,
    /// With `--store`: keep up to this many bytes of fixed-window counters
    /// known to be over their limit, and answer them without a round trip
    /// until their window ends. 0 (the default) turns it off; other
    /// algorithms are never cached.
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = 0,
        env = "LOCAL_CACHE_SIZE_IN_BYTES"
    )]
    pub(crate) quota_local_cache_bytes: usize,
    /// Hits past this share of their quota count as near the limit
    /// (`sluice_quota_near_limit_total`); between 0 and 1.
    #[arg(long, value_name = "RATIO", default_value = "0.8", value_parser = parse_near_limit_ratio, env = "NEAR_LIMIT_RATIO")]
    pub(crate) quota_near_limit_ratio: NearLimitRatio,
    /// When a request would take a fixed window over its limit, count its
    /// hits only in the windows that go over (its other descriptors are
    /// not charged for a refused request). It costs after-the-fact charges
    /// (`apply_on_stream_done`): a charge that takes one of its descriptors
    /// over is not counted in the others.
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub(crate) quota_stop_increment_when_over_limit: bool,
    /// With sliding_window or gcra: count the hits a quota refuses too (the
    /// fixed window always does), so that a cost charged after the fact
    /// (tokens charged when a stream ends) is never dropped because its
    /// quota is already spent. Requests refused then keep a quota spent
    /// while they are retried, as a fixed window's do.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub(crate) quota_count_refused_hits: bool,
    /// Add the tightest limit's quota, remaining hits and seconds to reset
    /// to every answer, as response headers (named by the next three
    /// options). Off by default: Envoy's `enable_x_ratelimit_headers` adds
    /// its own from the answer.
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub(crate) quota_response_headers: bool,
    /// The quota header's name.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "RateLimit-Limit",
        env = "LIMIT_LIMIT_HEADER"
    )]
    pub(crate) quota_header_limit: String,
    /// The remaining-hits header's name.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "RateLimit-Remaining",
        env = "LIMIT_REMAINING_HEADER"
    )]
    pub(crate) quota_header_remaining: String,
    /// The seconds-to-reset header's name.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "RateLimit-Reset",
        env = "LIMIT_RESET_HEADER"
    )]
    pub(crate) quota_header_reset: String,
    /// Answer every request OK, counting as usual (envoyproxy/ratelimit's
    /// SHADOW_MODE; not read from the environment: the name is too common
    /// to trust with turning every limit off).
    #[arg(long)]
    pub(crate) quota_global_shadow_mode: bool,
    /// Treat every descriptor as `quota_mode: true` (QUOTA_MODE; not read
    /// from the environment either).
    #[arg(long)]
    pub(crate) quota_global_quota_mode: bool,
    /// Answer with dynamic metadata: the domain, the descriptors and the
    /// `metadata` of the limits that passed.
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub(crate) quota_response_dynamic_metadata: bool,
    /// Merge files that name the same domain (a descriptor in two of them
    /// is still an error); by default a domain in two files is an error.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub(crate) quota_merge_domains: bool,
}

impl QuotaArgs {
    /// The settings these options give.
    pub(crate) fn settings(&self) -> QuotaSettings {
        QuotaSettings {
            algorithm: self.quota_algorithm,
            store_failure: if self.quota_fail_closed {
                StoreFailure::Deny
            } else {
                self.quota_store_failure
            },
            local_cache_bytes: self.quota_local_cache_bytes,
            near_limit_ratio: self.quota_near_limit_ratio,
            stop_increment_when_over_limit: self.quota_stop_increment_when_over_limit,
            count_refused_hits: self.quota_count_refused_hits,
            response_headers: self.quota_response_headers.then(|| ResponseHeaders {
                limit: self.quota_header_limit.clone(),
                remaining: self.quota_header_remaining.clone(),
                reset: self.quota_header_reset.clone(),
            }),
            global_shadow_mode: self.quota_global_shadow_mode,
            global_quota_mode: self.quota_global_quota_mode,
            dynamic_metadata: self.quota_response_dynamic_metadata,
            load: LoadOptions {
                merge_domains: self.quota_merge_domains,
            },
            ..QuotaSettings::default()
        }
    }
}

/// A boolean as envoyproxy/ratelimit reads one from its environment (Go's
/// `strconv.ParseBool`): `1`, `t`, `true` … or `0`, `f`, `false` ….
pub(crate) fn parse_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("not a boolean: {value:?} (true or false, 1 or 0)")),
    }
}

fn parse_algorithm(value: &str) -> Result<Algorithm, String> {
    match value {
        "gcra" => Ok(Algorithm::Gcra),
        "sliding_window" => Ok(Algorithm::SlidingWindow),
        "fixed_window" => Ok(Algorithm::FixedWindow),
        _ => Err("one of fixed_window, sliding_window, gcra".to_owned()),
    }
}

fn parse_store_failure(value: &str) -> Result<StoreFailure, String> {
    match value {
        "error" => Ok(StoreFailure::Error),
        "allow" => Ok(StoreFailure::Allow),
        "deny" => Ok(StoreFailure::Deny),
        _ => Err("one of error, allow, deny".to_owned()),
    }
}

fn parse_near_limit_ratio(value: &str) -> Result<NearLimitRatio, String> {
    let ratio = value
        .parse::<f64>()
        .map_err(|_| format!("not a number: {value:?}"))?;
    NearLimitRatio::new(ratio)
}

/// `sluice check-config --quotas PATH`: loads the quota file or directory
/// as `sluice serve` would, prints what it holds (or every problem's
/// `file:line:column: field: message`) and exits 0 (valid) or 1.
pub(crate) fn check(path: &Path, options: LoadOptions) -> ExitCode {
    let files = match QuotaConfig::read_files(path) {
        Ok(files) => files,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::FAILURE;
        }
    };
    if files.is_empty() {
        eprintln!(
            "{}: no *.yaml or *.yml file: no quota would be served",
            path.display()
        );
        return ExitCode::FAILURE;
    }
    // Each file on its own first, so that every broken file is named.
    let mut failed = false;
    for file in &files {
        if let Err(err) = QuotaConfig::from_files_with(std::slice::from_ref(file), options) {
            eprintln!("{err}");
            failed = true;
        }
    }
    if failed {
        return ExitCode::FAILURE;
    }
    match QuotaConfig::from_files_with(&files, options) {
        Ok(config) => {
            let mut domains: Vec<&String> = config.domains.keys().collect();
            domains.sort();
            for (name, _) in &files {
                println!("loaded {name}");
            }
            println!(
                "OK: {} domain(s): {}",
                domains.len(),
                domains
                    .iter()
                    .map(|d| d.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        quota: QuotaArgs,
        #[arg(long)]
        quotas: Option<std::path::PathBuf>,
    }

    fn settings(args: &[&str]) -> Result<QuotaSettings, String> {
        Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .map(|serve| serve.quota.settings())
            .map_err(|err| err.to_string())
    }

    #[test]
    fn defaults_are_envoyproxy_ratelimits() {
        let defaults = settings(&[]).unwrap();
        assert_eq!(defaults.algorithm, Algorithm::FixedWindow);
        assert_eq!(defaults.store_failure, StoreFailure::Error);
        assert_eq!(defaults.response_headers, None);
        assert!(!defaults.stop_increment_when_over_limit && !defaults.load.merge_domains);
        assert!(!defaults.count_refused_hits);
        assert!(
            settings(&["--quota-count-refused-hits"])
                .unwrap()
                .count_refused_hits
        );
    }

    #[test]
    fn switches_take_a_value_only_after_an_equals_sign() {
        let set = settings(&[
            "--quota-merge-domains",
            "--quota-response-headers=false",
            "--quota-stop-increment-when-over-limit=1",
            "--quotas",
            "dir",
        ])
        .unwrap();
        assert!(set.load.merge_domains);
        assert_eq!(set.response_headers, None);
        assert!(set.stop_increment_when_over_limit);
        assert!(settings(&["--quota-merge-domains=maybe"]).is_err());
        // The old switch still answers over limit; with the new one it is
        // refused as a contradiction.
        assert_eq!(
            settings(&["--quota-fail-closed"]).unwrap().store_failure,
            StoreFailure::Deny
        );
        assert!(settings(&["--quota-fail-closed", "--quota-store-failure", "allow"]).is_err());
        let headers = settings(&[
            "--quota-response-headers",
            "--quota-header-limit",
            "X-Limit",
        ])
        .unwrap()
        .response_headers
        .unwrap();
        assert_eq!(
            (headers.limit.as_str(), headers.remaining.as_str()),
            ("X-Limit", "RateLimit-Remaining")
        );
    }

    #[test]
    fn booleans_read_as_go_reads_them() {
        for yes in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_bool(yes), Ok(true), "{yes}");
        }
        for no in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_bool(no), Ok(false), "{no}");
        }
        assert!(parse_bool("yes").is_err());
    }
}
