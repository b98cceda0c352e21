use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use crate::TierError;

/// The name of a page: an opaque, validated, cheaply clonable string.
///
/// Keys are 1..=[`PageKey::MAX_LEN`] bytes of printable ASCII without spaces (`0x21..=0x7E`),
/// typically a hex chain hash. A key may contain `/` or `..`: tiers that map keys to paths or
/// object names must encode them so no key escapes the tier's root.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageKey(Arc<str>);

impl PageKey {
    /// Longest accepted key, in bytes.
    pub const MAX_LEN: usize = 200;

    /// Validates `key` and wraps it.
    pub fn new(key: impl AsRef<str>) -> Result<Self, TierError> {
        let key = key.as_ref();
        Self::check(key.as_bytes())?;
        Ok(Self(Arc::from(key)))
    }

    /// Validates raw bytes (which need not be UTF-8) and wraps them.
    pub fn from_bytes(key: &[u8]) -> Result<Self, TierError> {
        Self::check(key)?;
        // `check` admits only ASCII, so this conversion cannot fail.
        let key = std::str::from_utf8(key).map_err(|_| invalid(key, "not ASCII"))?;
        Ok(Self(Arc::from(key)))
    }

    /// The key as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key's length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: an empty key is rejected at construction.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key as one plain file or object name: `[A-Za-z0-9_-]` and non-leading `.` kept,
    /// every other byte written as `marker` and two uppercase hex digits. The result never
    /// holds `/`, never starts with `.`, and differs for different keys (given a marker
    /// outside the kept set).
    pub fn escaped_name(&self, marker: char) -> String {
        let mut out = String::with_capacity(self.len());
        for (i, b) in self.0.bytes().enumerate() {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
                out.push(char::from(b));
            } else {
                out.push(marker);
                out.push_str(&format!("{b:02X}"));
            }
        }
        out
    }

    /// The key a name made by [`PageKey::escaped_name`] with `marker` stands for; `None` for
    /// a name no key escapes to (a foreign file or object).
    pub fn from_escaped_name(name: &str, marker: char) -> Option<PageKey> {
        let bytes = name.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if name[i..].starts_with(marker) {
                let hex = name.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        let key = PageKey::from_bytes(&out).ok()?;
        (key.escaped_name(marker) == name).then_some(key)
    }

    fn check(key: &[u8]) -> Result<(), TierError> {
        if key.is_empty() {
            return Err(invalid(key, "key is empty"));
        }
        if key.len() > Self::MAX_LEN {
            return Err(invalid(key, "key is longer than 200 bytes"));
        }
        if !key.iter().all(u8::is_ascii_graphic) {
            return Err(invalid(
                key,
                "key holds a byte that is not printable ASCII (0x21..=0x7E)",
            ));
        }
        Ok(())
    }
}

fn invalid(key: &[u8], reason: &'static str) -> TierError {
    TierError::InvalidKey {
        key: key_preview(key),
        reason,
    }
}

/// An escaped, length-capped rendering of a rejected key for error messages.
fn key_preview(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    let mut out: String = key
        .iter()
        .take(SHOWN)
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect();
    if key.len() > SHOWN {
        out.push_str(&format!("...({} bytes)", key.len()));
    }
    out
}

impl fmt::Display for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageKey({:?})", &*self.0)
    }
}

impl AsRef<str> for PageKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for PageKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for PageKey {
    type Error = TierError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl TryFrom<String> for PageKey {
    type Error = TierError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_hashes_and_odd_but_printable_keys() {
        for k in ["0123abcd", "../../etc/passwd", "a/b", "..", "model@1@0@ff"] {
            assert_eq!(PageKey::new(k).unwrap().as_str(), k);
        }
    }

    #[test]
    fn rejects_bad_keys_with_a_reason() {
        let long = "a".repeat(4096);
        let cases: [(&[u8], &str); 6] = [
            (b"", "empty"),
            (long.as_bytes(), "longer"),
            (b"a\0b", "printable"),
            (b"a b", "printable"),
            (b"tab\there", "printable"),
            (&[0x66, 0xff, 0x66], "printable"),
        ];
        for (key, reason) in cases {
            match PageKey::from_bytes(key) {
                Err(TierError::InvalidKey {
                    reason: r,
                    key: shown,
                }) => {
                    assert!(r.contains(reason), "{r} lacks {reason}");
                    assert!(shown.len() < 100, "error shows a capped key");
                }
                other => panic!("{key:?} gave {other:?}"),
            }
        }
    }
}
