//! Locations of the workspace and of the binaries the harness runs.
//!
//! - `ENVOY_BIN`: Envoy with the V8 wasm runtime (`./scripts/ensure-envoy.sh` prints one).
//!   Falls back to the project-local copy in `.tools/` when it exists.
//! - `SLUICE_BIN`: the control plane, default `target/debug/sluice`.
//! - `SLUICE_WASM`: the filter, default `target/wasm32-wasip1/wasm/sluice_filter.wasm`.
//! - `SLUICE_NATIVE_MODULE`: the dynamic module, default `target/debug/libsluice_native.so`.
//! - `REDIS_SERVER`: a `redis-server`; unset, `./scripts/ensure-redis.sh` installs
//!   (or finds) the project-local copy in `.tools/` and prints it.
//!
//! Relative paths are taken from the workspace root.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Default location of the built filter, relative to the workspace root.
pub const DEFAULT_WASM: &str = "target/wasm32-wasip1/wasm/sluice_filter.wasm";
/// Default location of the built control plane, relative to the workspace root.
pub const DEFAULT_SLUICE_BIN: &str = "target/debug/sluice";
/// Where `scripts/ensure-envoy.sh` installs Envoy, relative to the workspace root.
pub const LOCAL_ENVOY: &str = ".tools/envoy-1.40.0/envoy";

const BUILD_HINT: &str = "run `just build` (or `just test-integration`, which builds first)";

/// The workspace root: the parent of this crate's directory.
pub fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .context("this crate's directory has no parent")?;
    if !root.join("Cargo.toml").is_file() {
        bail!("{} does not look like the workspace root", root.display());
    }
    Ok(root.to_path_buf())
}

/// A path from the workspace root unless it is already absolute.
pub fn from_root(path: impl AsRef<Path>) -> Result<PathBuf> {
    let path = path.as_ref();
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Ok(workspace_root()?.join(path))
    }
}

/// The Envoy binary: `$ENVOY_BIN`, else the project-local copy in `.tools/`.
pub fn envoy_bin() -> Result<PathBuf> {
    match std::env::var_os("ENVOY_BIN") {
        Some(value) if !value.is_empty() => {
            let path = from_root(PathBuf::from(value))?;
            require_file(&path, "ENVOY_BIN", "run `./scripts/ensure-envoy.sh`")
        }
        _ => {
            let local = from_root(LOCAL_ENVOY)?;
            if local.is_file() {
                Ok(local)
            } else {
                bail!(
                    "ENVOY_BIN is not set and {} does not exist: {BUILD_HINT}, or set \
                     ENVOY_BIN=\"$(./scripts/ensure-envoy.sh)\"",
                    local.display()
                )
            }
        }
    }
}

/// The control-plane binary: `$SLUICE_BIN`, default `target/debug/sluice`.
pub fn sluice_bin() -> Result<PathBuf> {
    let path = env_or_default("SLUICE_BIN", DEFAULT_SLUICE_BIN)?;
    require_file(&path, "SLUICE_BIN", BUILD_HINT)
}

/// The filter's `.wasm`: `$SLUICE_WASM`, default `target/wasm32-wasip1/wasm/sluice_filter.wasm`.
pub fn sluice_wasm() -> Result<PathBuf> {
    let path = env_or_default("SLUICE_WASM", DEFAULT_WASM)?;
    require_file(&path, "SLUICE_WASM", BUILD_HINT)
}

/// Default location of the do-nothing proxy-wasm filter.
pub const DEFAULT_EMPTY_FILTER_WASM: &str = "target/wasm32-wasip1/wasm/sluice_empty_filter.wasm";

/// The do-nothing proxy-wasm filter (`benches/empty-filter`):
/// `$EMPTY_FILTER_WASM`, default `target/wasm32-wasip1/wasm/sluice_empty_filter.wasm`.
pub fn empty_filter_wasm() -> Result<PathBuf> {
    let path = env_or_default("EMPTY_FILTER_WASM", DEFAULT_EMPTY_FILTER_WASM)?;
    require_file(&path, "EMPTY_FILTER_WASM", "run `just build-empty-filter`")
}

/// Default location of the dynamic module, relative to the workspace root.
pub const DEFAULT_NATIVE_MODULE: &str = "target/debug/libsluice_native.so";
/// The file name Envoy looks for when a config names the module `sluice_native`.
pub const NATIVE_MODULE_FILE: &str = "libsluice_native.so";

/// The dynamic module: `$SLUICE_NATIVE_MODULE`, default
/// `target/debug/libsluice_native.so`.
pub fn native_module() -> Result<PathBuf> {
    let path = env_or_default("SLUICE_NATIVE_MODULE", DEFAULT_NATIVE_MODULE)?;
    if path.file_name().and_then(|name| name.to_str()) != Some(NATIVE_MODULE_FILE) {
        bail!(
            "SLUICE_NATIVE_MODULE: {} is not named {NATIVE_MODULE_FILE}, the name Envoy loads",
            path.display()
        );
    }
    require_file(
        &path,
        "SLUICE_NATIVE_MODULE",
        "run `just build-native` (or `cargo build -p sluice-envoy-module`)",
    )
}

/// The `redis-server` to run: `$REDIS_SERVER`, else whatever
/// `./scripts/ensure-redis.sh` prints (it installs Redis into `.tools/` the
/// first time).
pub fn redis_server() -> Result<PathBuf> {
    if let Some(value) = std::env::var_os("REDIS_SERVER").filter(|v| !v.is_empty()) {
        let path = from_root(PathBuf::from(value))?;
        return require_file(&path, "REDIS_SERVER", "run `./scripts/ensure-redis.sh`");
    }
    let script = from_root("scripts/ensure-redis.sh")?;
    let output = std::process::Command::new(&script)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| {
            format!(
                "REDIS_SERVER is not set and {} cannot run",
                script.display()
            )
        })?;
    if !output.status.success() {
        bail!(
            "REDIS_SERVER is not set and {} failed: {}; set REDIS_SERVER to a redis-server",
            script.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let printed = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    require_file(
        &from_root(&printed)?,
        "REDIS_SERVER (from scripts/ensure-redis.sh)",
        "set REDIS_SERVER to a redis-server",
    )
}

/// What an `ensure-*.sh` script in `scripts/` prints: the path of the tool
/// it installs into `.tools/` the first time.
fn ensured_by(script: &str) -> Result<PathBuf> {
    let script = from_root(Path::new("scripts").join(script))?;
    let output = std::process::Command::new(&script)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("{} cannot run", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    from_root(String::from_utf8_lossy(&output.stdout).trim())
}

/// The directory holding `docker-registry` and `skopeo`:
/// `$REGISTRY_TOOLS`, else what `./scripts/ensure-registry-tools.sh`
/// prints (it installs them into `.tools/` the first time).
pub fn registry_tools() -> Result<PathBuf> {
    match std::env::var_os("REGISTRY_TOOLS").filter(|v| !v.is_empty()) {
        Some(dir) => from_root(PathBuf::from(dir)),
        None => ensured_by("ensure-registry-tools.sh"),
    }
}

/// The `PYTHONPATH` entry of the `kubernetes-validate` package:
/// `$KUBERNETES_VALIDATE_PATH`, else what
/// `./scripts/ensure-kubernetes-validate.sh` prints.
pub fn kubernetes_validate() -> Result<PathBuf> {
    match std::env::var_os("KUBERNETES_VALIDATE_PATH").filter(|v| !v.is_empty()) {
        Some(dir) => from_root(PathBuf::from(dir)),
        None => ensured_by("ensure-kubernetes-validate.sh"),
    }
}

/// The `redis-cli` beside [`redis_server`] (Debian's `redis-tools`, which
/// `./scripts/ensure-redis.sh` installs with it), else `$REDIS_CLI`.
pub fn redis_cli() -> Result<PathBuf> {
    if let Some(value) = std::env::var_os("REDIS_CLI").filter(|v| !v.is_empty()) {
        let path = from_root(PathBuf::from(value))?;
        return require_file(&path, "REDIS_CLI", "run `./scripts/ensure-redis.sh`");
    }
    let server = redis_server()?;
    let beside = server.with_file_name("redis-cli");
    require_file(
        &beside,
        "redis-cli (beside REDIS_SERVER)",
        "set REDIS_CLI to a redis-cli, or run `./scripts/ensure-redis.sh`",
    )
}

/// Directory of the Envoy configs (`envoy/`).
pub fn envoy_config_dir() -> Result<PathBuf> {
    from_root("envoy")
}

fn env_or_default(var: &str, default: &str) -> Result<PathBuf> {
    match std::env::var_os(var) {
        Some(value) if !value.is_empty() => from_root(PathBuf::from(value)),
        _ => from_root(default),
    }
}

fn require_file(path: &Path, what: &str, hint: &str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        bail!("{what}: {} does not exist: {hint}", path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_root_has_the_envoy_configs_dir() {
        let root = workspace_root().unwrap();
        assert!(root.join("justfile").is_file());
        assert_eq!(envoy_config_dir().unwrap(), root.join("envoy"));
    }

    #[test]
    fn relative_paths_are_taken_from_the_root() {
        let root = workspace_root().unwrap();
        assert_eq!(from_root("a/b").unwrap(), root.join("a/b"));
        assert_eq!(from_root("/x/y").unwrap(), PathBuf::from("/x/y"));
    }

    #[test]
    fn missing_file_error_tells_how_to_build() {
        let err = require_file(Path::new("/nonexistent/sluice"), "SLUICE_BIN", BUILD_HINT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("just build"), "{err}");
        assert!(err.contains("SLUICE_BIN"), "{err}");
    }
}
