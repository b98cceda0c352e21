//! Where a read puts a page: the caller's buffer ([`PageBuf`], one or more regions filled in
//! order), a key with its buffer ([`ReadSlot`]), and what a read found ([`Lookup`]).

use std::sync::atomic::Ordering::Relaxed;

use crate::page::FILLED;
use crate::{PageData, PageKey, StatsRecorder, TierError};

/// Where a page's bytes are read to: one or more of the caller's regions, filled in order.
#[derive(Debug)]
pub struct PageBuf<'a> {
    regions: Vec<&'a mut [u8]>,
    len: usize,
}

impl<'a> PageBuf<'a> {
    /// The given regions, filled in order.
    pub fn new(regions: Vec<&'a mut [u8]>) -> Self {
        let len = regions.iter().map(|r| r.len()).sum();
        Self { regions, len }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no room.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The regions in order.
    pub fn regions(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.regions.iter().map(|r| &**r)
    }

    /// The regions in order, writable.
    pub fn regions_mut(&mut self) -> impl ExactSizeIterator<Item = &mut [u8]> + use<'_, 'a> {
        self.regions.iter_mut().map(|r| &mut **r)
    }

    /// Each region's address and length (for registering the memory with a transfer engine).
    pub fn ranges(&mut self) -> Vec<(usize, usize)> {
        self.regions
            .iter_mut()
            .map(|r| (r.as_mut_ptr() as usize, r.len()))
            .collect()
    }

    /// Scatters `src` (exactly [`PageBuf::len`] bytes) across the regions.
    ///
    /// # Panics
    /// If `src` has another length: callers check lengths first.
    pub fn fill_from(&mut self, src: &[u8]) {
        assert_eq!(src.len(), self.len, "page buffer length");
        FILLED.fetch_add(src.len() as u64, Relaxed);
        let mut at = 0;
        for r in self.regions.iter_mut() {
            let n = r.len();
            r.copy_from_slice(&src[at..at + n]);
            at += n;
        }
    }

    /// Fills the regions from a page's content of the same length (region boundaries may
    /// differ).
    ///
    /// # Panics
    /// If the lengths differ: callers check lengths first.
    pub fn fill_from_page(&mut self, src: &PageData<'_>) {
        assert_eq!(src.len(), self.len, "page buffer length");
        FILLED.fetch_add(src.len() as u64, Relaxed);
        let mut dst = self.regions.iter_mut().map(|r| &mut **r);
        let mut cur: &mut [u8] = dst.next().unwrap_or_default();
        for mut part in src.regions() {
            while !part.is_empty() {
                while cur.is_empty() {
                    cur = dst.next().unwrap_or_default();
                }
                let n = part.len().min(cur.len());
                let (head, tail) = std::mem::take(&mut cur).split_at_mut(n);
                head.copy_from_slice(&part[..n]);
                cur = tail;
                part = &part[n..];
            }
        }
    }

    /// The content gathered into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        for r in self.regions() {
            out.extend_from_slice(r);
        }
        out
    }

    /// The same regions, borrowed for a shorter time (to hand to another tier).
    pub fn reborrow(&mut self) -> PageBuf<'_> {
        PageBuf {
            regions: self.regions.iter_mut().map(|r| &mut **r).collect(),
            len: self.len,
        }
    }
}

/// One key to read and the caller's buffer to read it into. The buffer's length must equal
/// the stored page's length; its region boundaries need not match the stored page's.
#[derive(Debug)]
pub struct ReadSlot<'a> {
    /// The page's key.
    pub key: PageKey,
    /// Where its bytes go.
    pub buf: PageBuf<'a>,
}

impl<'a> ReadSlot<'a> {
    /// A slot of one contiguous buffer.
    pub fn new(key: PageKey, buf: &'a mut [u8]) -> Self {
        Self {
            key,
            buf: PageBuf::new(vec![buf]),
        }
    }

    /// A slot of several regions, filled in order.
    pub fn regions(key: PageKey, regions: Vec<&'a mut [u8]>) -> Self {
        Self {
            key,
            buf: PageBuf::new(regions),
        }
    }

    /// The same slot, borrowed for a shorter time.
    pub fn reborrow(&mut self) -> ReadSlot<'_> {
        ReadSlot {
            key: self.key.clone(),
            buf: self.buf.reborrow(),
        }
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
                self.buf.fill_from(data);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_scatter_across_other_boundaries() {
        let a: Vec<u8> = (0..10).collect();
        let b: Vec<u8> = (10..25).collect();
        let page = PageData::lent([&a[..], &b[..]]);
        assert_eq!(page.len(), 25);
        let mut x = [0u8; 7];
        let mut y = [0u8; 18];
        let mut buf = PageBuf::new(vec![&mut x, &mut y]);
        buf.fill_from_page(&page);
        assert_eq!(buf.to_vec(), (0..25).collect::<Vec<u8>>());
        assert_eq!(page.to_vec(), buf.to_vec());
    }

    #[test]
    fn empty_regions_are_skipped() {
        let a = [1u8, 2];
        let page = PageData::lent([&[][..], &a[..], &[][..]]);
        let mut out = [0u8; 2];
        let mut buf = PageBuf::new(vec![&mut [][..], &mut out[..]]);
        buf.fill_from_page(&page);
        assert_eq!(out, [1, 2]);
    }
}
