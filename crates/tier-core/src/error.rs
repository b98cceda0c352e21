use std::path::PathBuf;
use std::time::Duration;

use crate::PageKey;

/// Everything a tier operation can fail with. Each variant names what was wrong and, where
/// there is one, the page it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// A key failed validation (see [`PageKey`]).
    #[error("invalid page key \"{key}\": {reason}")]
    InvalidKey {
        /// The offending key, escaped and capped for display.
        key: String,
        /// What rule it broke.
        reason: &'static str,
    },
    /// A valid key that this tier cannot store (for example, too long once encoded as a file name).
    #[error("page {key}: this tier cannot store the key: {reason}")]
    KeyRejected {
        /// The key.
        key: PageKey,
        /// Why this tier refuses it.
        reason: &'static str,
    },
    /// The caller's buffer does not have the stored page's length.
    #[error("page {key}: buffer holds {buffer} bytes but the stored page has {stored}")]
    LengthMismatch {
        /// The page.
        key: PageKey,
        /// Length of the stored page.
        stored: usize,
        /// Length of the caller's buffer.
        buffer: usize,
    },
    /// A page is larger than the tier accepts.
    #[error("page {key}: {len} bytes exceeds this tier's limit of {limit} bytes")]
    PageTooLarge {
        /// The page.
        key: PageKey,
        /// Its length.
        len: usize,
        /// The tier's limit.
        limit: usize,
    },
    /// A page with no bytes: pages must hold at least one byte.
    #[error("page {key}: a page must hold at least one byte")]
    EmptyPage {
        /// The page.
        key: PageKey,
    },
    /// A page that cannot go through direct I/O: its length is not a multiple of the block size.
    #[error("page {key}: {len} bytes is not a multiple of {align}, as direct I/O requires")]
    Unaligned {
        /// The page.
        key: PageKey,
        /// Its length.
        len: usize,
        /// The required multiple.
        align: usize,
    },
    /// An operating-system I/O error.
    #[error("{op} failed{}{}: {source}", key.as_ref().map(|k| format!(" for page {k}")).unwrap_or_default(), path.as_ref().map(|p| format!(" at {}", p.display())).unwrap_or_default())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The page, if the error concerns one.
        key: Option<PageKey>,
        /// The file or folder, if any.
        path: Option<PathBuf>,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The storage backend (NIXL, an object store, ...) reported an error.
    #[error("{backend}: {message}{}", key.as_ref().map(|k| format!(" (page {k})")).unwrap_or_default())]
    Backend {
        /// Which backend.
        backend: String,
        /// The page, if the error concerns one.
        key: Option<PageKey>,
        /// What it said.
        message: String,
    },
    /// An operation did not finish within its bound.
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// The bound that expired.
        after: Duration,
    },
    /// A configuration value is missing or out of range.
    #[error("config field `{field}`: {message}")]
    Config {
        /// The field, dotted (`tiers[1].capacity`).
        field: String,
        /// What was expected.
        message: String,
    },
    /// The tier cannot serve requests (closed, or a runtime it needs is missing).
    #[error("tier unavailable: {0}")]
    Unavailable(String),
    /// A batch's arguments do not fit together.
    #[error("bad batch: {0}")]
    BadBatch(String),
}

impl TierError {
    /// The error's kind, as metrics label it (`io`, `timeout`, `length_mismatch`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            TierError::InvalidKey { .. } => "invalid_key",
            TierError::KeyRejected { .. } => "key_rejected",
            TierError::LengthMismatch { .. } => "length_mismatch",
            TierError::PageTooLarge { .. } => "page_too_large",
            TierError::EmptyPage { .. } => "empty_page",
            TierError::Unaligned { .. } => "unaligned",
            TierError::Io { .. } => "io",
            TierError::Backend { .. } => "backend",
            TierError::Timeout { .. } => "timeout",
            TierError::Config { .. } => "config",
            TierError::Unavailable(_) => "unavailable",
            TierError::BadBatch(_) => "bad_batch",
        }
    }

    /// Whether this error says the tier itself is failing (I/O, its backend, a timeout, not
    /// available), rather than what the caller passed (a key, a length, a batch, a setting).
    /// A hierarchy's tier health counts these.
    pub fn is_tier_fault(&self) -> bool {
        matches!(
            self,
            Self::Io { .. } | Self::Backend { .. } | Self::Timeout { .. } | Self::Unavailable(_)
        )
    }

    /// The page this error concerns, if any.
    pub fn key(&self) -> Option<&PageKey> {
        match self {
            Self::KeyRejected { key, .. }
            | Self::LengthMismatch { key, .. }
            | Self::PageTooLarge { key, .. }
            | Self::EmptyPage { key }
            | Self::Unaligned { key, .. } => Some(key),
            Self::Io { key, .. } | Self::Backend { key, .. } => key.as_ref(),
            _ => None,
        }
    }

    /// Builds an [`TierError::Io`] error.
    pub fn io(
        op: &'static str,
        key: Option<&PageKey>,
        path: Option<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            op,
            key: key.cloned(),
            path,
            source,
        }
    }

    /// Builds a [`TierError::Config`] error.
    pub fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Config {
            field: field.into(),
            message: message.into(),
        }
    }
}
