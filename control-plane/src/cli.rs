//! The `sluice` command line: `serve`, `check-config`, `ctl` and `config`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::Config;
pub(crate) use crate::serve::command::ServeArgs;
use crate::serve::command::serve;

/// Global rate limiting for Envoy: the control plane.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC server for filters, the control loop and the admin API.
    Serve(Box<ServeArgs>),
    /// Validate a limits file and exit.
    CheckConfig(CheckConfigArgs),
    /// Read and change a running control plane through its admin API.
    #[cfg(feature = "ctl")]
    Ctl(crate::ctl::CtlArgs),
    /// Export or import the configuration replicas share in `--store`.
    Config(crate::replicas::transfer::ConfigArgs),
}

/// `sluice check-config`.
#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Limits file (YAML).
    #[arg(value_name = "FILE", required_unless_present = "quotas")]
    pub(crate) file: Option<PathBuf>,
    /// A quota file or directory in envoyproxy/ratelimit's format (what
    /// `sluice serve --quotas` reads), checked without starting a server.
    #[arg(long, value_name = "FILE_OR_DIR")]
    pub(crate) quotas: Option<PathBuf>,
    /// With `--quotas`: merge files that name the same domain
    /// (MERGE_DOMAIN_CONFIG), as `sluice serve --quota-merge-domains`.
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = crate::quotas::cli::parse_bool)]
    pub(crate) quota_merge_domains: bool,
}

/// Runs a parsed command line; the exit code is 0 on success, 1 on failure.
pub async fn execute(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => match serve(*args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!(%err, "sluice serve failed");
                eprintln!("sluice: {err}");
                ExitCode::FAILURE
            }
        },
        Command::CheckConfig(args) => {
            let mut code = ExitCode::SUCCESS;
            if let Some(file) = &args.file {
                code = check_config(file);
            }
            if let Some(quotas) = &args.quotas {
                let options = crate::quotas::LoadOptions {
                    merge_domains: args.quota_merge_domains,
                };
                if crate::quotas::cli::check(quotas, options) != ExitCode::SUCCESS {
                    code = ExitCode::FAILURE;
                }
            }
            code
        }
        #[cfg(feature = "ctl")]
        Command::Ctl(args) => crate::ctl::execute(args).await,
        Command::Config(args) => match crate::replicas::transfer::execute(&args).await {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("sluice config: {err}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `sluice check-config FILE`: prints `OK` or the error.
pub(crate) fn check_config(file: &Path) -> ExitCode {
    match Config::from_file(file) {
        Ok(_) => {
            println!("OK");
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
    use clap::CommandFactory;

    use super::*;
    use crate::serve::command::probation_ticks;
    use crate::types::ControlInterval;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_defaults_and_overrides() {
        let cli = Cli::try_parse_from(["sluice", "serve", "--config", "l.yaml"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.grpc_listen, "127.0.0.1:50051".parse().unwrap());
        assert_eq!(args.admin_listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(args.control_interval_ms, None);

        let cli = Cli::try_parse_from([
            "sluice",
            "serve",
            "--config",
            "l.yaml",
            "--grpc-listen",
            "127.0.0.1:0",
            "--control-interval-ms",
            "100",
            "--ready-file",
            "r.json",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.grpc_listen.port(), 0);
        assert_eq!(args.control_interval_ms.unwrap().as_millis(), 100);
        assert_eq!(args.ready_file.unwrap(), PathBuf::from("r.json"));
    }

    #[test]
    fn listener_caps_have_defaults_and_bounds() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["sluice", "serve", "--config", "l.yaml"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Serve(args) => args,
                _ => panic!("not serve"),
            })
        };
        let args = parse(&[]).unwrap();
        assert_eq!(args.grpc_max_streams_per_connection, 16);
        assert_eq!(args.grpc_max_connections_per_ip, 1_024);
        assert_eq!(args.grpc_max_connections_per_identity, 1_024);
        assert_eq!(args.grpc_max_proxy_id_len, 512);
        assert_eq!(args.grpc_max_zone_len, 128);
        assert_eq!(args.proxy_probation_ms, 30_000);
        let args = parse(&[
            "--grpc-max-streams-per-connection",
            "4",
            "--grpc-max-connections-per-ip",
            "8",
            "--grpc-max-proxy-id-len",
            "64",
            "--proxy-probation-ms",
            "0",
        ])
        .unwrap();
        assert_eq!(args.grpc_max_streams_per_connection, 4);
        assert_eq!(args.grpc_max_connections_per_ip, 8);
        assert_eq!(args.grpc_max_proxy_id_len, 64);
        assert_eq!(args.proxy_probation_ms, 0);
        for bad in [
            ["--grpc-max-streams-per-connection", "0"],
            ["--grpc-max-proxy-id-len", "0"],
            ["--proxy-probation-ms", "-1"],
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
        // Connections per identity mean something with client certificates
        // only.
        assert!(parse(&["--grpc-max-connections-per-identity", "4"]).is_err());
        // The probation in control intervals, rounded up.
        let interval = ControlInterval::from_millis(500).unwrap();
        assert_eq!(probation_ticks(30_000, interval), 60);
        assert_eq!(probation_ticks(1, interval), 1);
        assert_eq!(probation_ticks(0, interval), 0);
    }

    #[test]
    fn interval_out_of_range_is_a_usage_error() {
        let err = Cli::try_parse_from([
            "sluice",
            "serve",
            "--config",
            "l",
            "--control-interval-ms",
            "10",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("between 50 and 60000"), "{err}");
    }
}
