use bytes::Bytes;

use crate::{PageKey, TierError};

/// A page to store: its key and its bytes (shared, so tiers may keep them without copying).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The page's key.
    pub key: PageKey,
    /// The page's content.
    pub data: Bytes,
}

impl Page {
    /// Creates a page.
    pub fn new(key: PageKey, data: impl Into<Bytes>) -> Self {
        Self {
            key,
            data: data.into(),
        }
    }
}

impl Page {
    /// Checks the page's length against a tier's limit: non-empty and at most `limit` bytes.
    pub fn check_len(&self, limit: Option<usize>) -> Result<(), TierError> {
        let len = self.data.len();
        if len == 0 {
            return Err(TierError::EmptyPage {
                key: self.key.clone(),
            });
        }
        match limit {
            Some(limit) if len > limit => Err(TierError::PageTooLarge {
                key: self.key.clone(),
                len,
                limit,
            }),
            _ => Ok(()),
        }
    }
}

/// One key to read and the caller's buffer to read it into. The buffer's length must equal
/// the stored page's length.
#[derive(Debug)]
pub struct ReadSlot<'a> {
    /// The page's key.
    pub key: PageKey,
    /// Where its bytes go.
    pub buf: &'a mut [u8],
}

impl<'a> ReadSlot<'a> {
    /// Creates a slot.
    pub fn new(key: PageKey, buf: &'a mut [u8]) -> Self {
        Self { key, buf }
    }
}

/// The outcome of reading one key that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The page was found and its bytes fill the slot's buffer.
    Hit,
    /// The tier does not hold the page; the buffer's content is unspecified.
    Miss,
}
