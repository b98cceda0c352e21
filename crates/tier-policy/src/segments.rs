//! A dense array kept in segments of a fixed size rather than one block grown by doubling.
//!
//! A vector of millions of slots grows by copying into a block twice its size: the pair is
//! held at once, a quarter of the last block is unused on average, and glibc serves blocks of
//! such sizes from its own maps while raising the size below which later frees stay in the
//! process. Segments of [`SEGMENT`] slots are each allocated once, never copied; the array is
//! at most one segment larger than its slots (plus the first segment's doubling, for small
//! arrays), and a segment fits in memory an allocator has freed (an index turned sampled
//! reuses what its exact order left behind).

use std::ops::{Index, IndexMut};

/// Slots per segment: a power of two, so that a slot's segment is a shift away.
const SEGMENT_SHIFT: u32 = 14;
/// Slots per segment (16,384: under a MiB for slots of up to 64 bytes).
pub(crate) const SEGMENT: usize = 1 << SEGMENT_SHIFT;

/// A dense array of `T` in segments of [`SEGMENT`]: every segment but the last is full, and a
/// last one emptied by removals is kept until the one before it is emptied too (so pushes and
/// removals at a boundary never free and allocate a segment each time).
pub(crate) struct Segments<T> {
    segments: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Segments<T> {
    fn default() -> Self {
        Segments {
            segments: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Segments<T> {
    /// Slots held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes the segments (and the list of them) are allocated.
    pub(crate) fn allocated_bytes(&self) -> usize {
        let slots: usize = self.segments.iter().map(Vec::capacity).sum();
        slots * std::mem::size_of::<T>() + self.segments.capacity() * std::mem::size_of::<Vec<T>>()
    }

    /// Appends `value` as slot `len()`.
    pub(crate) fn push(&mut self, value: T) {
        match self.segments.last_mut() {
            // The first segment grows by doubling, up to a segment: a small array stays small.
            Some(last) if last.len() < SEGMENT => last.push(value),
            _ => {
                let mut segment =
                    Vec::with_capacity(if self.segments.is_empty() { 0 } else { SEGMENT });
                segment.push(value);
                self.segments.push(segment);
            }
        }
        self.len += 1;
    }

    /// Removes slot `i`, moving the last slot into its place; `None` past the end.
    pub(crate) fn swap_remove(&mut self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        let last = self.pop_last()?;
        if i == self.len {
            return Some(last);
        }
        Some(std::mem::replace(&mut self[i], last))
    }

    fn pop_last(&mut self) -> Option<T> {
        if self.segments.last().is_some_and(Vec::is_empty) {
            // The spare segment kept at the last removal: the one before it empties now.
            self.segments.pop();
        }
        let value = self.segments.last_mut()?.pop()?;
        self.len -= 1;
        Some(value)
    }

    /// Every slot, to change.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.segments.iter_mut().flatten()
    }

    /// Takes every slot out, leaving no segment allocated.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> {
        self.len = 0;
        std::mem::take(&mut self.segments).into_iter().flatten()
    }
}

impl<T> Index<usize> for Segments<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        &self.segments[i >> SEGMENT_SHIFT][i & (SEGMENT - 1)]
    }
}

impl<T> IndexMut<usize> for Segments<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.segments[i >> SEGMENT_SHIFT][i & (SEGMENT - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_hold_slots_in_order_across_segment_boundaries() {
        let mut s = Segments::default();
        let n = 2 * SEGMENT + 5;
        for i in 0..n {
            s.push(i);
        }
        assert_eq!(s.len(), n);
        assert!((0..n).all(|i| s[i] == i));
        // The first slot of the second segment goes; the last takes its place.
        assert_eq!(s.swap_remove(SEGMENT), Some(SEGMENT));
        assert_eq!(s[SEGMENT], n - 1);
        assert_eq!(s.len(), n - 1);
        assert_eq!(s.swap_remove(n), None);
        s[3] = 42;
        assert_eq!(s[3], 42);
        assert_eq!(s.iter_mut().count(), n - 1);
        assert_eq!(s.drain().count(), n - 1);
        assert_eq!((s.len(), s.allocated_bytes()), (0, 0));
    }

    #[test]
    fn segments_are_allocated_once_and_one_spare_is_kept() {
        let mut s = Segments::default();
        for i in 0..SEGMENT {
            s.push(i as u64);
        }
        // The first segment grew by doubling to exactly a segment.
        let one = SEGMENT * 8;
        assert_eq!(s.allocated_bytes() - s.segments.capacity() * 24, one);
        s.push(0);
        assert_eq!(s.segments.len(), 2);
        assert_eq!(s.segments[1].capacity(), SEGMENT);
        // Emptied by a removal, the second segment is kept as a spare ...
        assert_eq!(s.swap_remove(SEGMENT), Some(0));
        assert_eq!(s.segments.len(), 2);
        s.push(1);
        assert_eq!(s.swap_remove(SEGMENT), Some(1));
        // ... and let go once the first one loses a slot too.
        assert_eq!(s.swap_remove(0), Some(0));
        assert_eq!(s.segments.len(), 1);
        assert_eq!(s[0], SEGMENT as u64 - 1);
    }
}
