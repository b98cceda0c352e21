//! Pages as they are written. A page is one or more *regions* of bytes (an
//! engine's MHA page is a K and a V region, far apart in its host pool): stored as one unit,
//! present only when whole. Its content is the concatenation of its regions.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::{Bytes, BytesMut};

use crate::{PageKey, TierError};

static LENT_COPIED: AtomicU64 = AtomicU64::new(0);
pub(crate) static FILLED: AtomicU64 = AtomicU64::new(0);

/// Bytes copied out of, and into, callers' memory in this process: the measure of zero copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopiedBytes {
    /// Bytes of lent page regions copied (to keep them, gather them, or stage them).
    pub lent: u64,
    /// Bytes copied into callers' read buffers (rather than transferred into them in place).
    pub filled: u64,
}

/// The process's copy counters.
pub fn copied_bytes() -> CopiedBytes {
    CopiedBytes {
        lent: LENT_COPIED.load(Relaxed),
        filled: FILLED.load(Relaxed),
    }
}

#[derive(Clone)]
enum Region<'a> {
    /// Shared, immutable bytes: a tier may keep them past the call.
    Shared(Bytes),
    /// The caller's memory, lent for the duration of one call.
    Lent(&'a [u8]),
}

impl Region<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Region::Shared(b) => b,
            Region::Lent(s) => s,
        }
    }
}

/// The content of a page: one or more regions.
///
/// Data lent by the caller (`PageData::lent`) is bound to the call by its lifetime: a tier
/// that keeps a page past the call must take [`PageData::into_shared`] (or
/// [`Page::to_shared`]), which copies lent regions and never copies shared ones.
#[derive(Clone)]
pub struct PageData<'a> {
    regions: Vec<Region<'a>>,
    len: usize,
}

impl<'a> PageData<'a> {
    /// The caller's regions, read during the call and never kept.
    pub fn lent(regions: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self::from_regions(regions.into_iter().map(Region::Lent).collect())
    }

    fn from_regions(regions: Vec<Region<'a>>) -> Self {
        let len = regions.iter().map(|r| r.bytes().len()).sum();
        Self { regions, len }
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the page has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The regions in order.
    pub fn regions(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.regions.iter().map(Region::bytes)
    }

    /// The content in one slice: borrowed when the page is one region, else gathered.
    pub fn contiguous(&self) -> Cow<'_, [u8]> {
        match self.regions.as_slice() {
            [only] => Cow::Borrowed(only.bytes()),
            _ => Cow::Owned(self.to_vec()),
        }
    }

    /// The content gathered into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        LENT_COPIED.fetch_add(self.lent_bytes() as u64, Relaxed);
        let mut out = Vec::with_capacity(self.len);
        for r in self.regions() {
            out.extend_from_slice(r);
        }
        out
    }

    /// Gathers the content into `dst` (exactly [`PageData::len`] bytes).
    ///
    /// # Panics
    /// If `dst` has another length: callers size it from the page.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len, "page length");
        LENT_COPIED.fetch_add(self.lent_bytes() as u64, Relaxed);
        let mut at = 0;
        for r in self.regions() {
            dst[at..at + r.len()].copy_from_slice(r);
            at += r.len();
        }
    }

    /// The content as one `Bytes`: shared without copying when the page is one shared
    /// region, gathered into a new buffer otherwise.
    pub fn to_bytes(&self) -> Bytes {
        match self.regions.as_slice() {
            [Region::Shared(b)] => b.clone(),
            _ => {
                LENT_COPIED.fetch_add(self.lent_bytes() as u64, Relaxed);
                let mut out = BytesMut::with_capacity(self.len);
                for r in self.regions() {
                    out.extend_from_slice(r);
                }
                out.freeze()
            }
        }
    }

    /// The content as shared regions a tier may keep: shared regions are kept as they are
    /// (never copied), each lent one is copied into a buffer of its own (counted in
    /// [`copied_bytes`]).
    pub fn into_shared(self) -> PageData<'static> {
        let regions = self
            .regions
            .into_iter()
            .map(|r| match r {
                Region::Shared(b) => Region::Shared(b),
                Region::Lent(l) => {
                    LENT_COPIED.fetch_add(l.len() as u64, Relaxed);
                    Region::Shared(Bytes::copy_from_slice(l))
                }
            })
            .collect();
        PageData::from_regions(regions)
    }

    /// The regions as `Bytes`: shared ones without copying, lent ones copied.
    pub fn shared_regions(&self) -> Vec<Bytes> {
        self.regions
            .iter()
            .map(|r| match r {
                Region::Shared(b) => b.clone(),
                Region::Lent(s) => {
                    LENT_COPIED.fetch_add(s.len() as u64, Relaxed);
                    Bytes::copy_from_slice(s)
                }
            })
            .collect()
    }

    /// Bytes of this page that [`PageData::into_shared`] would copy.
    pub fn lent_bytes(&self) -> usize {
        self.regions
            .iter()
            .filter(|r| matches!(r, Region::Lent(_)))
            .map(|r| r.bytes().len())
            .sum()
    }
}

impl From<Bytes> for PageData<'static> {
    fn from(b: Bytes) -> Self {
        PageData::from_regions(vec![Region::Shared(b)])
    }
}

impl FromIterator<Bytes> for PageData<'static> {
    fn from_iter<I: IntoIterator<Item = Bytes>>(regions: I) -> Self {
        PageData::from_regions(regions.into_iter().map(Region::Shared).collect())
    }
}

impl PartialEq for PageData<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.contiguous() == other.contiguous()
    }
}

impl Eq for PageData<'_> {}

impl PartialEq<[u8]> for PageData<'_> {
    fn eq(&self, other: &[u8]) -> bool {
        self.len == other.len() && *self.contiguous() == *other
    }
}

impl PartialEq<Vec<u8>> for PageData<'_> {
    fn eq(&self, other: &Vec<u8>) -> bool {
        *self == other[..]
    }
}

impl PartialEq<PageData<'_>> for [u8] {
    fn eq(&self, other: &PageData<'_>) -> bool {
        *other == *self
    }
}

impl PartialEq<PageData<'_>> for Vec<u8> {
    fn eq(&self, other: &PageData<'_>) -> bool {
        *other == self[..]
    }
}

impl std::fmt::Debug for PageData<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageData")
            .field("len", &self.len)
            .field("regions", &self.regions.len())
            .finish()
    }
}

/// A page to store: its key and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<'a> {
    /// The page's key.
    pub key: PageKey,
    /// The page's content.
    pub data: PageData<'a>,
}

impl Page<'static> {
    /// A page of one shared region (tiers may keep it without copying).
    pub fn new(key: PageKey, data: impl Into<Bytes>) -> Self {
        Self {
            key,
            data: PageData::from(data.into()),
        }
    }
}

impl<'a> Page<'a> {
    /// A page of the given content.
    pub fn with_data(key: PageKey, data: PageData<'a>) -> Self {
        Self { key, data }
    }

    /// A page of the caller's regions, lent for one call.
    pub fn lent(key: PageKey, regions: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self {
            key,
            data: PageData::lent(regions),
        }
    }

    /// This page with content a tier may keep (see [`PageData::into_shared`]).
    pub fn to_shared(&self) -> Page<'static> {
        Page {
            key: self.key.clone(),
            data: self.data.clone().into_shared(),
        }
    }

    /// For each key of a batch, the position of its last page that passes
    /// [`Page::check_len`]: the one a tier writes when a batch repeats a key. An invalid later
    /// copy (empty, too large) fails alone and never cancels a valid earlier one.
    pub fn last_valid<'p>(
        pages: &'p [Page<'a>],
        limit: Option<usize>,
    ) -> std::collections::HashMap<&'p PageKey, usize> {
        pages
            .iter()
            .enumerate()
            .filter(|(_, p)| p.check_len(limit).is_ok())
            .map(|(i, p)| (&p.key, i))
            .collect()
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A page of shared and lent regions keeps its shared regions as they are (same memory)
    /// and copies only the lent ones.
    #[test]
    fn a_mixed_page_keeps_its_shared_regions() {
        let shared = Bytes::from(vec![1u8; 64]);
        let lent = vec![2u8; 16];
        let page =
            PageData::from_regions(vec![Region::Shared(shared.clone()), Region::Lent(&lent)]);
        let kept = page.into_shared();
        let regions = kept.shared_regions();
        assert_eq!(regions.len(), 2);
        assert_eq!(
            regions[0].as_ptr(),
            shared.as_ptr(),
            "the shared region was copied"
        );
        assert_eq!(&regions[1][..], &lent[..]);
        assert_eq!(kept.lent_bytes(), 0);
    }

    #[test]
    fn into_shared_copies_only_lent_regions() {
        let lent = [1u8, 2, 3];
        let shared = PageData::lent([&lent[..]]).into_shared();
        assert_eq!(shared.lent_bytes(), 0);
        assert_eq!(shared.to_vec(), vec![1, 2, 3]);
        let b = Bytes::from_static(b"abc");
        let kept = PageData::from(b.clone()).into_shared();
        assert_eq!(
            kept.to_bytes().as_ptr(),
            b.as_ptr(),
            "a shared region is not copied"
        );
    }
}
