//! Writing pages: each to a temp file (staged for direct I/O, from the caller's memory
//! otherwise), stamped with its checksum, then renamed in by the catalog, which records it.

use std::path::PathBuf;
use std::sync::Arc;

use tier_core::{OrderGuard, Page, PageData, PageKey, PutResult, TierError};

use super::helpers::{run_split, split_parts};
use super::io::{self, Engine, FileIo, NixlEngine, Xfer};
use super::{checksum, chunks, format, Durability, FileAccess, NixlFileTier, PageChecksum, Shared};
use crate::batch::{run_blocking, send_pages, BatchOutcome};
use crate::nixl::{Held, XferOp};
use crate::staging::StagingLease;

impl NixlFileTier {
    /// Writes a batch (see [`tier_core::StorageTier::put`]).
    pub(super) async fn put_pages(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let shared = &self.shared;
        if shared.config.access == FileAccess::Reader {
            shared.stats.errors(pages.len());
            return pages
                .iter()
                .map(|p| {
                    Err(TierError::Unavailable(format!(
                        "{} is a reader: it never writes (page {})",
                        shared.config.name, p.key
                    )))
                })
                .collect();
        }
        let keys: Vec<PageKey> = pages.iter().map(|p| p.key.clone()).collect();
        if !shared.bounded {
            let turn = shared.order.turn(&keys).await;
            return self.write_in_turn(pages, turn).await;
        }
        // Bounded: the write runs on a thread of its own over pages of its own (shared ones as
        // they are, lent ones copied), holding the keys' turn to its end, so a later put of a
        // key lands after it even when this call gave up waiting.
        let owned: Vec<Page<'static>> = pages.iter().map(Page::to_shared).collect();
        let tier = NixlFileTier {
            shared: Arc::clone(shared),
        };
        let write = async {
            let turn = shared.order.turn(&keys).await;
            let runtime = tokio::runtime::Handle::current();
            shared
                .off_thread(move |_| runtime.block_on(tier.write_in_turn(&owned, turn)))
                .await
        };
        match shared.bound("file write", write).await {
            Ok(results) => results,
            Err(e) => {
                shared.stats.errors(pages.len());
                pages.iter().map(|_| Err(super::again(&e))).collect()
            }
        }
    }

    /// Writes a batch in its keys' `turn` (see [`put_pages`](Self::put_pages)).
    async fn write_in_turn(&self, pages: &[Page<'_>], _turn: OrderGuard) -> Vec<PutResult> {
        let shared = &self.shared;
        let mut results: Vec<Option<PutResult>> = (0..pages.len()).map(|_| None).collect();
        // A key repeated in the batch: only its last valid page is written.
        let last = Page::last_valid(pages, shared.limit());
        let (mut direct, mut buffered) = (Vec::new(), Vec::new());
        for (i, page) in pages.iter().enumerate() {
            let planned = page
                .check_len(shared.limit())
                .and_then(|()| shared.direct_for(&page.key, page.data.len()))
                .and_then(|direct| Ok((direct, shared.catalog.layout().page_path(&page.key)?)));
            match planned {
                Err(e) => {
                    shared.stats.errors(1);
                    results[i] = Some(Err(e));
                }
                Ok(_) if last.get(&page.key) != Some(&i) => results[i] = Some(Ok(())),
                Ok((is_direct, path)) => {
                    let write = PlannedWrite {
                        key: page.key.clone(),
                        data: page.data.clone(),
                        temp: shared.catalog.layout().temp_path(&path),
                        path,
                        direct: is_direct,
                    };
                    if is_direct {
                        direct.push((i, write))
                    } else {
                        buffered.push((i, write))
                    }
                }
            }
        }
        // Direct pages go in chunks that fit a staging buffer, one chunk at a time (a call
        // never holds a staging buffer while waiting for another); buffered pages are split
        // across the in-flight budget and written at once on as many threads, so big batches
        // use several cores. Writes run on the calling thread (no await while NIXL reads the
        // pages), so a dropped `put` has written and committed each page whole, or not at all.
        let lent = pages.iter().any(|p| p.data.lent_bytes() > 0);
        let lens: Vec<(usize, usize)> = direct
            .iter()
            .enumerate()
            .map(|(n, (_, w))| (n, w.data.len()))
            .collect();
        let mut direct: Vec<Option<(usize, PlannedWrite<'_>)>> =
            direct.into_iter().map(Some).collect();
        for chunk in chunks(&lens, shared.staging.buf_bytes()) {
            let (positions, writes): (Vec<usize>, Vec<PlannedWrite<'_>>) =
                chunk.iter().filter_map(|&n| direct[n].take()).unzip();
            let outcome = match shared.staging.acquire().await {
                Ok(lease) => Ok(run_blocking(|| {
                    shared.write_pages(0, &writes, Some(lease), false)
                })),
                Err(e) => Err(e),
            };
            settle_writes(shared, &mut results, positions, outcome);
        }
        let bytes: usize = buffered.iter().map(|(_, w)| w.data.len()).sum();
        let parts = split_parts(buffered.len(), bytes, shared.config.staging_buffers);
        let per_part = buffered.len().div_ceil(parts).max(1);
        let mut jobs: Vec<(Vec<usize>, Vec<PlannedWrite<'_>>)> = Vec::new();
        while !buffered.is_empty() {
            let rest = buffered.split_off(per_part.min(buffered.len()));
            jobs.push(std::mem::replace(&mut buffered, rest).into_iter().unzip());
        }
        if !jobs.is_empty() {
            let permits = Arc::clone(&shared.inflight)
                .acquire_many_owned(jobs.len() as u32)
                .await
                .map_err(|_| TierError::Unavailable("tier closed".into()));
            let outcomes: Vec<Result<Vec<PutResult>, TierError>> = match &permits {
                Ok(_) => run_blocking(|| {
                    let others = jobs[1..]
                        .iter()
                        .enumerate()
                        .map(|(n, (_, writes))| {
                            move || shared.write_pages(n + 1, writes, None, lent)
                        })
                        .collect();
                    let (first, others) =
                        run_split(|| shared.write_pages(0, &jobs[0].1, None, lent), others);
                    std::iter::once(Ok(first))
                        .chain(
                            others
                                .into_iter()
                                .map(|r| r.map_err(TierError::Unavailable)),
                        )
                        .collect()
                }),
                Err(e) => jobs
                    .iter()
                    .map(|_| Err(TierError::Unavailable(e.to_string())))
                    .collect(),
            };
            drop(permits);
            for ((positions, _), outcome) in jobs.into_iter().zip(outcomes) {
                settle_writes(shared, &mut results, positions, outcome);
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(TierError::Unavailable("page was not scheduled".into())))
            })
            .collect()
    }
}

impl Shared {
    /// Writes pages and commits what succeeded (blocking, on the calling thread). With a lease,
    /// pages are copied into it (direct I/O needs its alignment); without, NIXL reads each
    /// page's own regions, registered for this batch. `lent` says the pages' memory is the
    /// caller's: a transfer NIXL will not release is then never left behind (see
    /// [`crate::nixl::Transfer::finish`]).
    fn write_pages(
        &self,
        lane: usize,
        pages: &[PlannedWrite<'_>],
        lease: Option<StagingLease>,
        lent: bool,
    ) -> Vec<PutResult> {
        let finals: Vec<PathBuf> = pages.iter().map(|p| p.path.clone()).collect();
        let bytes = pages.iter().map(|p| p.data.len() as u64).sum();
        if let Err(e) = self.catalog.make_room(bytes) {
            self.stats.errors(pages.len());
            let message = e.to_string();
            return pages
                .iter()
                .map(|_| Err(TierError::Unavailable(message.clone())))
                .collect();
        }
        let (mut xfers, mut outcome) = match lease {
            Some(lease) => self.write_staged(pages, lease),
            None => self.write_zero_copy(self.lane(lane), pages, lent),
        };
        let mut checksums = vec![None; pages.len()];
        // The files of pages to be verified once per version, held open across the rename.
        let mut written: Vec<Option<std::fs::File>> = (0..pages.len()).map(|_| None).collect();
        if !outcome.poisoned {
            // On the temp file, before the rename: a page file never lacks its trailer.
            let sync = self.config.durability == Durability::Power;
            let verified = self.lane(0).verified.is_some();
            let sealed = pages.iter().zip(&mut xfers).zip(&mut outcome.results);
            for (i, (((page, xfer), result), known)) in sealed.zip(&mut checksums).enumerate() {
                if result.is_ok() {
                    *known = (self.config.page_checksum == PageChecksum::Crc32c)
                        .then(|| checksum::of(page.data.regions()));
                    let len = page.data.len();
                    let created = xfer.created.as_mut().and_then(io::Created::take);
                    match format::seal(created, &xfer.path, &page.key, len, *known, sync) {
                        Ok(file) => {
                            if verified && known.is_some() && len >= io::VERIFY_ONCE_MIN {
                                written[i] = Some(file).filter(|_| i < HELD_WRITTEN);
                            }
                        }
                        Err(e) => {
                            *result = Err(TierError::io(
                                "seal the page's file",
                                Some(&page.key),
                                Some(xfer.path.clone()),
                                e,
                            ))
                        }
                    }
                }
            }
        }
        self.catalog
            .commit(&xfers, &finals, &mut outcome, &checksums);
        self.note_verified(&written, &outcome.results);
        for (page, result) in pages.iter().zip(&outcome.results) {
            match result {
                Ok(()) => self.stats.put(page.data.len()),
                Err(_) => self.stats.errors(1),
            }
        }
        if self.config.durability == Durability::Power {
            // Outside the catalog's lock: readers need not wait for the disk.
            io::sync_folders(&xfers, &finals, &mut outcome.results);
        }
        self.enforce_capacity();
        outcome.results
    }

    /// Records the versions this process just wrote as verified (see `VerifyReads::Once`):
    /// their bytes are the ones it checksummed, and the identity of the file it held open
    /// across the rename is the one a read must find unchanged to trust them.
    fn note_verified(&self, written: &[Option<std::fs::File>], results: &[Result<(), TierError>]) {
        let Some(verified) = &self.lane(0).verified else {
            return;
        };
        for (file, result) in written.iter().zip(results) {
            if let (Some(file), Ok(())) = (file, result) {
                if let Ok(meta) = file.metadata() {
                    verified.insert(io::FileId::of(&meta));
                }
            }
        }
    }

    fn write_staged(
        &self,
        pages: &[PlannedWrite<'_>],
        mut lease: StagingLease,
    ) -> (Vec<Xfer>, BatchOutcome) {
        let (offsets, _) = io::slots(pages.iter().map(|p| p.data.len()));
        let base = lease.buf().addr();
        let buf = lease.buf().as_mut_slice();
        for (page, off) in pages.iter().zip(&offsets) {
            page.data.copy_to(&mut buf[*off..*off + page.data.len()]);
        }
        let xfers = write_xfers(pages, |i, _| vec![(base + offsets[i], pages[i].data.len())]);
        let mut held = Held::default();
        held.own(Arc::new(lease));
        let outcome = self
            .lane(0)
            .transfer_all(XferOp::Write, &xfers, &held.seal());
        (xfers, outcome)
    }

    fn write_zero_copy(
        &self,
        io: &FileIo,
        pages: &[PlannedWrite<'_>],
        lent: bool,
    ) -> (Vec<Xfer>, BatchOutcome) {
        let Engine::Nixl(NixlEngine { backend, .. }) = &io.engine else {
            let xfers = write_xfers(pages, |_, page| {
                page.data
                    .regions()
                    .map(|r| (r.as_ptr() as usize, r.len()))
                    .collect()
            });
            let outcome = io.transfer_all(XferOp::Write, &xfers, &Held::default().seal());
            return (xfers, outcome);
        };
        let regions: Vec<&[u8]> = pages.iter().flat_map(|p| p.data.regions()).collect();
        // The tier's pages are held by their transfers; a caller's are read during the call.
        let owner = (!lent).then(|| {
            let shared: Vec<_> = pages.iter().flat_map(|p| p.data.shared_regions()).collect();
            Arc::new(shared) as Arc<dyn Send + Sync>
        });
        let mut xfers = Vec::new();
        let outcome = send_pages(backend, &regions, owner, &mut |addrs, held| {
            let mut addrs = addrs.iter();
            xfers = write_xfers(pages, |_, page| {
                page.data
                    .regions()
                    .map(|r| (addrs.next().copied().unwrap_or_default(), r.len()))
                    .collect()
            });
            io.transfer_all(XferOp::Write, &xfers, held)
        });
        (xfers, outcome)
    }
}

/// A page planned for writing.
struct PlannedWrite<'a> {
    key: PageKey,
    data: PageData<'a>,
    path: PathBuf,
    temp: PathBuf,
    direct: bool,
}

/// Transfers of `pages`; `parts` gives each page's DRAM regions.
fn write_xfers<'a, 'p>(
    pages: &'p [PlannedWrite<'a>],
    mut parts: impl FnMut(usize, &'p PlannedWrite<'a>) -> Vec<(usize, usize)>,
) -> Vec<Xfer> {
    pages
        .iter()
        .enumerate()
        .map(|(i, p)| Xfer {
            key: p.key.clone(),
            path: p.temp.clone(),
            len: p.data.len(),
            direct: p.direct,
            parts: parts(i, p),
            checksum: None,
            // The files held from the write to the seal, as from the seal to the rename.
            created: (i < HELD_WRITTEN).then(Default::default),
            opened: None,
        })
        .collect()
}

/// Records a write job's per-page results at their batch positions (or its error for each).
fn settle_writes(
    shared: &Shared,
    results: &mut [Option<PutResult>],
    positions: Vec<usize>,
    outcome: Result<Vec<PutResult>, TierError>,
) {
    match outcome {
        Ok(job_results) => {
            for (pos, r) in positions.into_iter().zip(job_results) {
                results[pos] = Some(r);
            }
        }
        Err(e) => {
            shared.stats.errors(positions.len());
            let msg = e.to_string();
            for pos in positions {
                results[pos] = Some(Err(TierError::Unavailable(msg.clone())));
            }
        }
    }
}

/// The most files of one batch held open from their seal to their rename (beyond it, a page
/// is verified at its first read instead).
const HELD_WRITTEN: usize = 256;
