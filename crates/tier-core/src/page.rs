use bytes::Bytes;

use crate::{PageKey, StatsRecorder, TierError};

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

    /// Answers the slot from a page held in memory, or from its absence: copies the bytes in
    /// (a hit), reports a miss, or a [`TierError::LengthMismatch`]; records it in `stats`.
    pub fn answer(
        &mut self,
        page: Option<&[u8]>,
        stats: &StatsRecorder,
    ) -> Result<Lookup, TierError> {
        match page {
            None => {
                stats.miss();
                Ok(Lookup::Miss)
            }
            Some(data) if data.len() != self.buf.len() => {
                stats.errors(1);
                Err(TierError::LengthMismatch {
                    key: self.key.clone(),
                    stored: data.len(),
                    buffer: self.buf.len(),
                })
            }
            Some(data) => {
                self.buf.copy_from_slice(data);
                stats.hit(data.len());
                Ok(Lookup::Hit)
            }
        }
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
