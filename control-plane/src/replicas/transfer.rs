//! `sluice config export|import`: the configuration replicas share, to and
//! from a limits file. With a store the file is an import/export format,
//! not the source of truth.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::config::Config;
use crate::config::shared::SharedConfig;
use crate::store::{Store, StoreOptions};

/// `sluice config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: ConfigCommand,
    /// The shared store: `redis://HOST:PORT[/DB]`, `rediss://…`, or one
    /// node of a Redis Cluster (`redis+cluster://HOST:PORT`), or the
    /// sentinels of a master (`redis[s]+sentinel://HOST:PORT/MASTER`).
    #[arg(long, value_name = "URL", global = true)]
    pub(crate) store: Option<String>,
    /// File holding the store's password (else SLUICE_STORE_PASSWORD).
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) store_password_file: Option<PathBuf>,
    /// With sentinels that require a password: the file holding it (else
    /// SLUICE_STORE_SENTINEL_PASSWORD).
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) store_sentinel_password_file: Option<PathBuf>,
    /// With a `rediss://` store: trust this CA (PEM).
    #[arg(long, value_name = "FILE", global = true)]
    pub(crate) store_tls_ca: Option<PathBuf>,
    /// With a `rediss://` store: this client certificate (PEM).
    #[arg(long, value_name = "FILE", global = true, requires = "store_tls_key")]
    pub(crate) store_tls_cert: Option<PathBuf>,
    /// The private key of `--store-tls-cert` (PEM).
    #[arg(long, value_name = "FILE", global = true, requires = "store_tls_cert")]
    pub(crate) store_tls_key: Option<PathBuf>,
}

/// `sluice config` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print the shared configuration (a limits file) and its version.
    Export {
        /// Write it here instead of standard output.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Validate a limits file and make it the shared configuration; every
    /// replica applies it within one control interval.
    Import {
        /// The limits file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

/// Why an export or import failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransferError {
    /// `--store` is missing.
    #[error("--store is required")]
    NoStore,
    /// The store cannot be used.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Reading or writing the shared configuration failed.
    #[error("shared configuration: {0}")]
    Shared(#[from] crate::config::shared::SharedConfigError),
    /// The store holds no configuration yet.
    #[error("the store holds no configuration yet (a replica seeds it from its file)")]
    Empty,
    /// The file to import is invalid.
    #[error(transparent)]
    Invalid(#[from] crate::config::ConfigError),
    /// The configuration could not be rendered as YAML.
    #[error("cannot render the configuration: {0}")]
    Render(#[from] serde_yaml_ng::Error),
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Runs `sluice config …`; returns what to print on success.
pub(crate) async fn execute(args: &ConfigArgs) -> Result<String, TransferError> {
    let url = args.store.as_deref().ok_or(TransferError::NoStore)?;
    let options = StoreOptions::from_args(
        url,
        args.store_password_file.as_deref(),
        crate::store::DEFAULT_TIMEOUT,
    )?
    .with_tls_ca(args.store_tls_ca.clone())?
    .with_tls_client(args.store_tls_cert.clone(), args.store_tls_key.clone())?
    .with_sentinel_password(args.store_sentinel_password_file.as_deref())?;
    let shared = SharedConfig::new(Store::connect(&options).await?);
    match &args.command {
        ConfigCommand::Export { output } => export(&shared, output.as_deref()).await,
        ConfigCommand::Import { file } => import(&shared, file).await,
    }
}

async fn export(shared: &SharedConfig, output: Option<&Path>) -> Result<String, TransferError> {
    let stored = shared.read().await?.ok_or(TransferError::Empty)?;
    let text = format!(
        "# Exported from the shared store, version {}.\n{}",
        stored.version, stored.yaml
    );
    match output {
        None => Ok(text),
        Some(path) => {
            crate::config::persist::write_atomic(path, text.as_bytes()).map_err(|source| {
                TransferError::Write {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            Ok(format!(
                "wrote version {} to {}\n",
                stored.version,
                path.display()
            ))
        }
    }
}

async fn import(shared: &SharedConfig, file: &Path) -> Result<String, TransferError> {
    // Validated first: a bad file names its line and field and changes
    // nothing.
    let config = Config::from_file(file)?;
    let yaml = config.to_yaml()?;
    let lock = shared.lock().await?;
    let written = async {
        let expected = shared.read().await?.map_or(0, |stored| stored.version);
        shared.write(expected, &yaml, expected).await
    }
    .await;
    shared.unlock(lock).await;
    let version = written?;
    Ok(format!(
        "imported {} as version {version}; every replica applies it within one control interval\n",
        file.display()
    ))
}
