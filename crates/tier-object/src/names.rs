//! Object names: a checked namespace prefix, and keys escaped into one plain name part.

use object_store::path::Path;
use tier_core::{PageKey, TierError};

/// Checks a namespace prefix: `/`-separated parts of `[A-Za-z0-9._-]`, none `.` or `..`,
/// none of two hex digits (a prefix's buckets are named so).
pub fn check_prefix(prefix: &str) -> Result<(), TierError> {
    parse_prefix(prefix).map(|_| ())
}

/// Parses and checks the namespace prefix.
pub(crate) fn parse_prefix(prefix: &str) -> Result<Path, TierError> {
    let parts: Vec<&str> = prefix.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return Err(TierError::config(
            "prefix",
            "a namespace is required, so clear() cannot touch other data",
        ));
    }
    for part in &parts {
        let ok = part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && *part != "."
            && *part != "..";
        if !ok {
            return Err(TierError::config(
                "prefix",
                format!("{part:?} is not a plain name ([A-Za-z0-9._-], not . or ..)"),
            ));
        }
        if part.len() == 2 && part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TierError::config(
                "prefix",
                format!(
                    "{part:?} is named as a prefix's bucket (two hex digits): a tier's prefix \
                     inside another's bucket would mix their pages"
                ),
            ));
        }
    }
    Ok(Path::from_iter(parts))
}

/// A key as one plain object-name part (`=XX` escapes; see [`PageKey::escaped_name`]).
/// What an escaped object name writes a byte of the key as (`=` and two hex digits).
pub(crate) const MARKER: char = '=';

pub(crate) fn escape(key: &PageKey) -> String {
    key.escaped_name(MARKER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_single_plain_parts() {
        for k in ["../../etc/passwd", "a/b", "..", ".", "x=y", "%2e"] {
            let e = escape(&PageKey::new(k).unwrap());
            assert!(
                !e.contains('/') && !e.starts_with('.') && !e.contains('%'),
                "{e}"
            );
        }
        assert_ne!(
            escape(&PageKey::new("x=2F").unwrap()),
            escape(&PageKey::new("x/").unwrap())
        );
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(parse_prefix("models/llama-8b").is_ok());
        assert!(parse_prefix("kv/2024/v1").is_ok());
        for bad in ["", "/", "a/../b", "a b", ".", "models/0a", "1F/kv"] {
            assert!(
                matches!(parse_prefix(bad), Err(TierError::Config { .. })),
                "{bad}"
            );
        }
    }
}
