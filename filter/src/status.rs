//! proxy-wasm `Status` → [`HostError`].

use proxy_wasm::types::Status;
use sluice_agent::host::HostError;

pub(super) fn host_error(status: Status) -> HostError {
    match status {
        Status::NotFound => HostError::NotFound,
        Status::BadArgument => HostError::BadArgument,
        Status::CasMismatch => HostError::CasMismatch,
        Status::ParseFailure => HostError::ParseFailure,
        Status::InternalFailure => HostError::InternalFailure,
        other => HostError::Other(other as u32),
    }
}
