//! Why a configuration file was rejected, with the file, line, column and
//! field of the offending value.

use std::fmt;
use std::path::PathBuf;

/// Why a limits file was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid YAML or does not follow the schema.
    #[error("{0}")]
    Invalid(InvalidConfig),
}

/// A schema or syntax error with its position, formatted as
/// `file:line:column: field: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig {
    /// The file name as given.
    pub file: String,
    /// 1-based line and column, when the parser knows them.
    pub location: Option<(usize, usize)>,
    /// Field path such as `limits[1].limit_rps`; empty for the whole file.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl ConfigError {
    pub(crate) fn invalid(
        file: &str,
        err: serde_path_to_error::Error<serde_yaml_ng::Error>,
    ) -> Self {
        let path = err.path().to_string();
        let field = if path == "." { String::new() } else { path };
        let inner = err.into_inner();
        let location = inner.location().map(|l| (l.line(), l.column()));
        let message = bare_message(&inner.to_string(), &field, location);
        Self::Invalid(InvalidConfig {
            file: file.to_owned(),
            location,
            field,
            message,
        })
    }
}

/// serde_yaml_ng renders errors as `path: message at line L column C`; the
/// path and position are reported separately, so strip them from the text.
fn bare_message(rendered: &str, field: &str, location: Option<(usize, usize)>) -> String {
    let mut message = rendered;
    if let Some((line, column)) = location {
        let suffix = format!(" at line {line} column {column}");
        if let Some(stripped) = message.strip_suffix(suffix.as_str()) {
            message = stripped;
        }
    }
    if !field.is_empty()
        && let Some(stripped) = message
            .strip_prefix(field)
            .and_then(|m| m.strip_prefix(": "))
    {
        message = stripped;
    }
    message.to_owned()
}
