//! Deliberately broken tiers. The suite's own tests assert that each one fails the case that
//! should catch it: a suite that passes everything proves nothing.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tier_core::{
    async_trait, GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats,
};

use crate::factory::{DynTier, TierFactory};
use crate::model::ModelTier;

mod hierarchy;

pub use hierarchy::{FlawedHierarchy, HierarchyFlaw};

/// The fault a [`BrokenTier`] has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Opens a file on every read (its first 64) and never closes it.
    LeaksFd,
    /// Flips one bit of one byte in the 200th page it returns.
    FlipsByte,
    /// Reports a hit, with an untouched buffer, for a key it does not hold.
    PhantomHit,
    /// `exists` counts every present key instead of the leading run.
    CountsAllInExists,
    /// A put writes from a task of its own that outlives the call: a put dropped before it
    /// returned still lands, 10 ms after it would have, over whatever was put meanwhile.
    LandsAfterDrop,
    /// A shorter rewrite keeps the old page's tail: the page keeps its old length.
    KeepsStaleTail,
    /// A key repeated in one batch keeps its first page instead of its last.
    KeepsFirstDuplicate,
    /// An empty page is stored (and reported stored) instead of refused.
    AcceptsEmptyPages,
    /// Counts every put twice in its stats.
    MiscountsPuts,
    /// Reports the capacity it is opened with but never evicts.
    IgnoresCapacity,
    /// Says it is persistent, but every open starts empty.
    ForgetsOnReopen,
    /// `remove` answers as if it removed a present page, and keeps it.
    IgnoresRemove,
    /// `clear` answers Ok and keeps every page.
    IgnoresClear,
    /// A page of more than 1 MiB reads back with its last 4 KiB zeroed: a read cut short.
    TearsLargePages,
    /// A page of several regions is stored with its regions in reverse order.
    ReversesRegions,
    /// Every other read of a rewritten key serves its first version (when of the same length):
    /// an older version after a newer put returned.
    ServesOlderVersion,
    /// A key holding `..` also leaves a file beside the tier's root: a write outside it.
    WritesOutsideRoot,
    /// Once its storage is broken, every call fails as it should, and leaks a descriptor.
    LeaksFdOnFailure,
    /// A put dropped before it returns leaves the descriptor it opened open.
    LeaksFdOnDrop,
}

fn broken_storage() -> TierError {
    TierError::Unavailable("storage broken".into())
}

/// A correct [`ModelTier`] with one [`Fault`].
pub struct BrokenTier {
    inner: Arc<ModelTier>,
    fault: Fault,
    /// The capacity it claims (only [`Fault::IgnoresCapacity`]).
    claimed_capacity: Option<u64>,
    hits_returned: AtomicU64,
    leaked: Mutex<Vec<File>>,
    /// Per rewritten key, its first version ([`Fault::ServesOlderVersion`]).
    older: Mutex<std::collections::HashMap<PageKey, Vec<u8>>>,
    /// Where the tier's files would live ([`Fault::WritesOutsideRoot`]).
    root: Option<PathBuf>,
    /// Set by [`TierFactory::break_storage`] ([`Fault::LeaksFdOnFailure`]).
    storage_broken: AtomicBool,
}

impl BrokenTier {
    /// A fresh, empty tier with `fault`.
    pub fn new(fault: Fault) -> Self {
        Self {
            inner: Arc::default(),
            fault,
            claimed_capacity: None,
            hits_returned: AtomicU64::new(0),
            leaked: Mutex::new(Vec::new()),
            older: Mutex::default(),
            root: None,
            storage_broken: AtomicBool::new(false),
        }
    }

    /// Keeps a descriptor open for good (at most 64: enough for the fd-leak case to see, too
    /// few to starve the test process).
    fn leak_fd(&self) {
        let mut leaked = self.leaked.lock().unwrap_or_else(|e| e.into_inner());
        if leaked.len() < 64 {
            if let Ok(f) = File::open("/dev/null") {
                leaked.push(f);
            }
        }
    }

    /// With its storage broken ([`Fault::LeaksFdOnFailure`]): `true`, after leaking a
    /// descriptor; every call then fails with [`broken_storage`].
    fn failing(&self) -> bool {
        if !self.storage_broken.load(Ordering::SeqCst) {
            return false;
        }
        self.leak_fd();
        true
    }

    fn older(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<PageKey, Vec<u8>>> {
        self.older.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl BrokenTier {
    /// A put holding a descriptor while it runs, closed when it returns and kept for good if
    /// the call is dropped first ([`Fault::LeaksFdOnDrop`]).
    async fn put_holding_fd(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        struct Held<'a> {
            file: Option<File>,
            leaked: &'a Mutex<Vec<File>>,
        }
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                if let Some(file) = self.file.take() {
                    self.leaked
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(file);
                }
            }
        }
        let mut held = Held {
            file: File::open("/dev/null").ok(),
            leaked: &self.leaked,
        };
        let results = self.inner.put(pages).await;
        held.file = None;
        results
    }

    /// Puts `pages` one at a time, with this tier's wrong idea of a put.
    async fn put_wrongly(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let mut results = Vec::with_capacity(pages.len());
        let mut seen = std::collections::HashSet::new();
        for page in pages {
            if self.fault == Fault::KeepsFirstDuplicate && !seen.insert(page.key.clone()) {
                results.push(Ok(()));
                continue;
            }
            let mut bytes = page.data.to_bytes().to_vec();
            if self.fault == Fault::ReversesRegions {
                let regions: Vec<&[u8]> = page.data.regions().collect();
                bytes = regions.into_iter().rev().flatten().copied().collect();
            }
            if self.fault == Fault::KeepsStaleTail {
                if let Some(old) = self.inner.peek(&page.key) {
                    if old.len() > bytes.len() {
                        bytes.extend_from_slice(&old[bytes.len()..]);
                    }
                }
            }
            if bytes.is_empty() && self.fault == Fault::AcceptsEmptyPages {
                // Stored as a one-byte page: the model itself refuses empty ones.
                bytes.push(0);
            }
            let stored = Page::new(page.key.clone(), bytes);
            results.extend(self.inner.put(std::slice::from_ref(&stored)).await);
        }
        results
    }
}

#[async_trait]
impl StorageTier for BrokenTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            kind: format!("broken-{:?}", self.fault),
            capacity_bytes: self.claimed_capacity,
            persistent: self.fault == Fault::ForgetsOnReopen,
            ..self.inner.info()
        }
    }

    fn stats(&self) -> TierStats {
        let mut s = self.inner.stats();
        if self.fault == Fault::MiscountsPuts {
            s.puts *= 2;
        }
        s
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        if self.failing() {
            return pages.iter().map(|_| Err(broken_storage())).collect();
        }
        if self.fault == Fault::ServesOlderVersion {
            let mut older = self.older();
            for page in pages {
                if let Some(current) = self.inner.peek(&page.key) {
                    older
                        .entry(page.key.clone())
                        .or_insert_with(|| current.to_vec());
                }
            }
        }
        if let (Fault::WritesOutsideRoot, Some(root)) = (self.fault, &self.root) {
            if let Some(beside) = root.parent() {
                for page in pages.iter().filter(|p| p.key.as_str().contains("..")) {
                    let _ = std::fs::write(beside.join("escaped"), page.key.as_str());
                }
            }
        }
        if self.fault == Fault::LeaksFdOnDrop {
            return self.put_holding_fd(pages).await;
        }
        match self.fault {
            Fault::LandsAfterDrop => {}
            Fault::KeepsStaleTail
            | Fault::KeepsFirstDuplicate
            | Fault::AcceptsEmptyPages
            | Fault::ReversesRegions => return self.put_wrongly(pages).await,
            _ => return self.inner.put(pages).await,
        }
        let (inner, pages) = (
            Arc::clone(&self.inner),
            pages.iter().map(Page::to_shared).collect::<Vec<_>>(),
        );
        let n = pages.len();
        // Set if this call is dropped before its writer answers: the writer then lands late,
        // after a newer put of the same key (deterministically, not by timer order).
        struct Abandoned {
            flag: Arc<AtomicBool>,
            armed: bool,
        }
        impl Drop for Abandoned {
            fn drop(&mut self) {
                if self.armed {
                    self.flag.store(true, Ordering::SeqCst);
                }
            }
        }
        let abandoned = Arc::new(AtomicBool::new(false));
        let mut guard = Abandoned {
            flag: Arc::clone(&abandoned),
            armed: true,
        };
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            if abandoned.load(Ordering::SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            inner.put(&pages).await
        });
        let results = writer.await;
        guard.armed = false;
        results.unwrap_or_else(|e| {
            (0..n)
                .map(|_| Err(TierError::Unavailable(format!("writer task: {e}"))))
                .collect()
        })
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        if self.failing() {
            return slots.iter().map(|_| Err(broken_storage())).collect();
        }
        if self.fault == Fault::LeaksFd {
            self.leak_fd();
        }
        let mut results = self.inner.get(slots).await;
        for (slot, result) in slots.iter_mut().zip(results.iter_mut()) {
            match (self.fault, &result) {
                (Fault::PhantomHit, Ok(Lookup::Miss)) => *result = Ok(Lookup::Hit),
                (Fault::FlipsByte, Ok(Lookup::Hit))
                    if self.hits_returned.fetch_add(1, Ordering::Relaxed) == 199 =>
                {
                    let mut bytes = slot.buf.to_vec();
                    let mid = bytes.len() / 2;
                    bytes[mid] ^= 0x10;
                    slot.buf.fill_from(&bytes);
                }
                (Fault::ServesOlderVersion, Ok(Lookup::Hit))
                    if self.hits_returned.fetch_add(1, Ordering::Relaxed) % 2 == 1 =>
                {
                    if let Some(old) = self.older().get(&slot.key) {
                        if old.len() == slot.buf.len() {
                            slot.buf.fill_from(old);
                        }
                    }
                }
                (Fault::TearsLargePages, Ok(Lookup::Hit)) if slot.buf.len() > 1 << 20 => {
                    let mut bytes = slot.buf.to_vec();
                    let cut = bytes.len() - 4096;
                    bytes[cut..].fill(0);
                    slot.buf.fill_from(&bytes);
                }
                _ => {}
            }
        }
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        if self.failing() {
            return Err(broken_storage());
        }
        if self.fault != Fault::CountsAllInExists {
            return self.inner.exists(keys).await;
        }
        let mut present = 0;
        for key in keys {
            present += self.inner.exists(std::slice::from_ref(key)).await?;
        }
        Ok(present)
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.inner.touch(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        if self.failing() {
            return keys.iter().map(|_| Err(broken_storage())).collect();
        }
        self.older().retain(|k, _| !keys.contains(k));
        if self.fault == Fault::IgnoresRemove {
            return keys
                .iter()
                .map(|k| Ok(self.inner.peek(k).is_some()))
                .collect();
        }
        self.inner.remove(keys).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        if self.failing() {
            return Err(broken_storage());
        }
        self.older().clear();
        if self.fault == Fault::IgnoresClear {
            return Ok(());
        }
        self.inner.clear().await
    }
}

/// Opens the suite's known-good reference: one [`ModelTier`] that every open reaches again
/// (storage that survives a reopen, as the factory contract asks), and bounded models for the
/// capacity case.
pub struct ModelFactory(Arc<ModelTier>);

impl Default for ModelFactory {
    fn default() -> Self {
        Self(Arc::new(ModelTier::persistent()))
    }
}

#[async_trait]
impl TierFactory for ModelFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::clone(&self.0) as DynTier)
    }

    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        Some(Ok(Arc::new(ModelTier::bounded(capacity_bytes, None))))
    }
}

/// Opens fresh [`BrokenTier`]s with one fault, each (for the faults about files) with a root
/// folder of its own under a temp folder the factory removes when dropped.
pub struct BrokenFactory {
    fault: Fault,
    base: PathBuf,
    last: Mutex<Option<Arc<BrokenTier>>>,
}

impl BrokenFactory {
    /// A factory of tiers with `fault`.
    pub fn new(fault: Fault) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir().join(format!(
            "kvtier-broken-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        Self {
            fault,
            base,
            last: Mutex::new(None),
        }
    }

    fn tier(&self) -> Arc<BrokenTier> {
        let mut tier = BrokenTier::new(self.fault);
        tier.root = self.root();
        if let Some(root) = &tier.root {
            let _ = std::fs::create_dir_all(root);
        }
        let tier = Arc::new(tier);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&tier));
        tier
    }
}

impl Drop for BrokenFactory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[async_trait]
impl TierFactory for BrokenFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(self.tier())
    }

    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        if self.fault != Fault::IgnoresCapacity {
            return None;
        }
        let mut tier = BrokenTier::new(self.fault);
        tier.claimed_capacity = Some(capacity_bytes);
        Some(Ok(Arc::new(tier)))
    }

    fn root(&self) -> Option<PathBuf> {
        (self.fault == Fault::WritesOutsideRoot).then(|| self.base.join("tier").join("root"))
    }

    async fn break_storage(&self) -> Option<String> {
        if self.fault != Fault::LeaksFdOnFailure {
            return None;
        }
        let last = self
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        last.storage_broken.store(true, Ordering::SeqCst);
        Some("breaking its storage".into())
    }
}
