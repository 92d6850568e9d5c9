//! TLS for the gRPC listener: a server certificate, and optionally a CA
//! whose client certificates the listener requires (mutual TLS), so that
//! only the operator's Envoys can report counts and receive directives.
//!
//! Files are read and checked once at start-up; a missing or malformed file
//! stops the control plane with the path in the error. Key material is never
//! logged.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Where the PEM files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GrpcTlsFiles {
    /// Server certificate chain (PEM).
    pub(crate) cert: PathBuf,
    /// Private key of the server certificate (PEM).
    pub(crate) key: PathBuf,
    /// CA bundle (PEM) that client certificates must chain to; `None`
    /// accepts clients without a certificate.
    pub(crate) client_ca: Option<PathBuf>,
}

/// Why the TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file holds no PEM block of the expected kind.
    #[error("{}: no PEM {expected} found", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What was expected, e.g. "CERTIFICATE".
        expected: &'static str,
    },
}

impl GrpcTlsFiles {
    /// Reads the files into tonic's server TLS configuration.
    pub(crate) fn load(&self) -> Result<ServerTlsConfig, TlsError> {
        let cert = read_pem(&self.cert, &["CERTIFICATE"], "CERTIFICATE")?;
        let key = read_pem(
            &self.key,
            &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"],
            "PRIVATE KEY",
        )?;
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(ca) = &self.client_ca {
            let ca = read_pem(ca, &["CERTIFICATE"], "CERTIFICATE")?;
            config = config
                .client_ca_root(Certificate::from_pem(ca))
                .client_auth_optional(false);
        }
        Ok(config)
    }
}

/// Reads a file and checks it has a PEM block with one of `labels`; the
/// TLS library's own errors come only at the first handshake, far from the
/// misconfiguration, so the obvious mistakes are caught here.
fn read_pem(path: &Path, labels: &[&str], expected: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let has_block = labels
        .iter()
        .any(|label| text.contains(&format!("-----BEGIN {label}-----")));
    if has_block {
        Ok(bytes)
    } else {
        Err(TlsError::NotPem {
            path: path.to_path_buf(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn missing_file_names_the_path() {
        let files = GrpcTlsFiles {
            cert: PathBuf::from("/nonexistent/cert.pem"),
            key: PathBuf::from("/nonexistent/key.pem"),
            client_ca: None,
        };
        let err = files.load().unwrap_err();
        assert!(
            err.to_string().starts_with("/nonexistent/cert.pem: "),
            "{err}"
        );
    }

    #[test]
    fn a_key_in_the_certificate_slot_is_refused() {
        let dir = temp_dir("swapped");
        let key = write(
            &dir,
            "key.pem",
            "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
        );
        let files = GrpcTlsFiles {
            cert: key.clone(),
            key,
            client_ca: None,
        };
        let err = files.load().unwrap_err();
        assert!(
            err.to_string().ends_with("no PEM CERTIFICATE found"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn pem_files_load() {
        let dir = temp_dir("good");
        let cert = write(
            &dir,
            "cert.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let key = write(
            &dir,
            "key.pem",
            "-----BEGIN EC PRIVATE KEY-----\nAA==\n-----END EC PRIVATE KEY-----\n",
        );
        let files = GrpcTlsFiles {
            cert: cert.clone(),
            key,
            client_ca: Some(cert),
        };
        assert!(files.load().is_ok());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
