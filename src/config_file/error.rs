//! [`ConfigFileError`]: what is wrong with a config file, and where.

use std::fmt;

use crate::error::ConfigError;

/// A config file was rejected: its syntax, an unknown key, a value of the
/// wrong type, or a value out of range. The message starts with the key
/// path when the error is about one key:
///
/// ```text
/// scopes."api.example".backoff.delay_factor: must be finite and at least 1.0, got 0.5
/// ```
///
/// Scope names that are not bare TOML keys (`api.example`) are quoted in
/// the path, as a TOML file writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigFileError {
    key_path: String,
    message: String,
}

impl ConfigFileError {
    pub(crate) fn new(key_path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigFileError {
            key_path: key_path.into(),
            message: message.into(),
        }
    }

    /// A value the registry's validation rejected, found under `prefix`
    /// (`""` for the top level, `default_scope`, `scopes."api"`). The
    /// validation names fields as space-separated words (`backoff
    /// delay_factor`), which are the file's nested keys.
    pub(crate) fn invalid(prefix: &str, err: &ConfigError) -> Self {
        let field = err.field().split_whitespace().collect::<Vec<_>>().join(".");
        let key_path = if prefix.is_empty() {
            field
        } else {
            format!("{prefix}.{field}")
        };
        ConfigFileError::new(key_path, format!("{}, got {}", err.reason(), err.value()))
    }

    /// The path of the key the error is about, such as
    /// `scopes."api.example".backoff.delay_factor`; empty when the error is
    /// not about one key (a syntax error).
    pub fn key_path(&self) -> &str {
        &self.key_path
    }

    /// What is wrong, without the key path.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key_path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key_path, self.message)
        }
    }
}

impl std::error::Error for ConfigFileError {}

/// A key as a TOML file writes it: bare when it can be, quoted otherwise.
pub(crate) fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// The dotted path of where a deserializer failed.
pub(crate) fn key_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&toml_key(key));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}

/// Line and column (from 1) of byte `offset` in `text`.
pub(crate) fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_quoted_only_when_they_must_be() {
        assert_eq!(toml_key("api"), "api");
        assert_eq!(toml_key("api-v2_x"), "api-v2_x");
        assert_eq!(toml_key("api.example"), "\"api.example\"");
        assert_eq!(toml_key(""), "\"\"");
        assert_eq!(toml_key("a\"b"), "\"a\\\"b\"");
    }

    #[test]
    fn positions_count_from_one() {
        assert_eq!(line_and_column("a = 1\nb = x", 10), (2, 5));
        assert_eq!(line_and_column("", 0), (1, 1));
        assert_eq!(line_and_column("é = 1", 1), (1, 1));
    }
}
