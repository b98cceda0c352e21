//! Reading pages: in place into the caller's buffers (staged for direct I/O), each verified
//! against its checksum, pinned against eviction while read, made again if a put replaced it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;

use tier_core::{GetResult, Lookup, PageBuf, PageKey, ReadSlot, TierError};

use super::catalog::SettledRead;
use super::format::Recorded;
use super::helpers::{run_split, split_parts};
use super::index::Generation;
use super::io::{self, FileId, FileIo, Xfer};
use super::{checksum, chunks, format, perms, FileAccess, NixlFileTier, PageChecksum, Shared};
use crate::batch::{marked_bufs, run_blocking};
use crate::nixl::{Held, Registered};
use crate::staging::StagingLease;

impl NixlFileTier {
    /// Reads a batch (see [`tier_core::StorageTier::get`]).
    pub(super) async fn get_pages(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let shared = &self.shared;
        let mut results: Vec<Option<GetResult>> = (0..slots.len()).map(|_| None).collect();
        let (mut direct, mut buffered) = (Vec::new(), Vec::new());
        // Without an index a lookup stats the files: where I/O is bounded, off this thread.
        let (pins, stored) = if shared.bounded && !shared.catalog.indexed() {
            let keys: Vec<PageKey> = slots.iter().map(|s| s.key.clone()).collect();
            let looked = shared
                .bound(
                    "file lookup",
                    shared.off_thread(move |s| s.catalog.pin(&keys).1),
                )
                .await;
            match looked {
                Ok(stored) => (None, stored),
                Err(e) => {
                    let failed = slots.iter().map(|_| Some(Err(super::again(&e)))).collect();
                    return shared.stats.settle_gets(failed, slots);
                }
            }
        } else {
            let (pins, stored) = shared.catalog.pin(slots.iter().map(|s| &s.key));
            (Some(pins), stored)
        };
        let mut mismatched = Vec::new();
        for (i, (slot, stored)) in slots.iter().zip(stored).enumerate() {
            let Some(stored) = stored else {
                results[i] = Some(Ok(Lookup::Miss));
                continue;
            };
            let len = stored.len as usize;
            if len != slot.buf.len() {
                let mismatch = TierError::LengthMismatch {
                    key: slot.key.clone(),
                    stored: len,
                    buffer: slot.buf.len(),
                };
                match shared.catalog.layout().page_path(&slot.key) {
                    Ok(path) if shared.config.access == FileAccess::Shared => {
                        mismatched.push((i, path, mismatch))
                    }
                    _ => results[i] = Some(Err(mismatch)),
                }
                continue;
            }
            match shared.catalog.layout().page_path(&slot.key) {
                Ok(path) => {
                    let is_direct = shared.direct_for(&slot.key, len).unwrap_or(false);
                    let read = PlannedRead {
                        slot: i,
                        key: slot.key.clone(),
                        generation: stored.generation,
                        checksum: stored.checksum,
                        mtime_ns: stored.mtime_ns,
                        path,
                        len,
                        direct: is_direct,
                    };
                    // Bounded reads land in staging buffers, as direct ones do.
                    if is_direct || shared.bounded {
                        direct.push(read)
                    } else {
                        buffered.push(read)
                    }
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        if !mismatched.is_empty() {
            self.settle_mismatches(mismatched, &mut results).await;
        }
        let replaced = self.read_round(slots, &mut results, buffered, direct).await;
        if !replaced.is_empty() {
            // Pages a put replaced after they were planned: read again, each checked against
            // its new file's own checksum (the index's was the old file's).
            let mut again = replaced;
            for read in &mut again {
                read.checksum = None;
                read.generation = shared.catalog.generation(&read.key);
            }
            let (direct, buffered) = again.into_iter().partition(|r| r.direct || shared.bounded);
            self.read_round(slots, &mut results, buffered, direct).await;
        }
        drop(pins);
        shared.stats.settle_gets(results, slots)
    }

    /// Answers pages of shared folders whose files show another length than the caller's
    /// buffer: a whole page of that length (its trailer says so) is a `LengthMismatch`; a file
    /// that is no whole page is another client's write as this client's caches still show it
    /// (GlusterFS writes behind), a miss counted as an error.
    async fn settle_mismatches(
        &self,
        mismatched: Vec<(usize, PathBuf, TierError)>,
        results: &mut [Option<GetResult>],
    ) {
        let shared = &self.shared;
        let slots: Vec<usize> = mismatched.iter().map(|(i, _, _)| *i).collect();
        let judged = shared
            .bound(
                "file lookup",
                shared.off_thread(move |s| {
                    mismatched
                        .into_iter()
                        .map(|(_, path, mismatch)| s.judge_mismatch(&path, mismatch))
                        .collect::<Vec<_>>()
                }),
            )
            .await;
        match judged {
            Ok(judged) => {
                for (i, r) in slots.into_iter().zip(judged) {
                    results[i] = Some(r);
                }
            }
            Err(e) => {
                for i in slots {
                    results[i] = Some(Err(super::again(&e)));
                }
            }
        }
    }

    /// Reads planned pages into their slots (buffered ones in place, staged ones, direct or
    /// bounded, through staging buffers) and sets their results; returns the reads to make again (see
    /// [`Shared::verify`]).
    async fn read_round(
        &self,
        slots: &mut [ReadSlot<'_>],
        results: &mut [Option<GetResult>],
        buffered: Vec<PlannedRead>,
        direct: Vec<PlannedRead>,
    ) -> Vec<PlannedRead> {
        let shared = &self.shared;
        let mut replaced = Vec::new();
        if !buffered.is_empty() {
            let mut wanted = vec![false; slots.len()];
            for read in &buffered {
                wanted[read.slot] = true;
            }
            let mut bufs = marked_bufs(slots, &wanted);
            let outcome = run_blocking(|| shared.read_in_place(&buffered, &mut bufs));
            shared.finish_reads(&buffered, &outcome.results);
            replaced.extend(outcome.replaced.iter().map(|&i| buffered[i].clone()));
            for (read, r) in buffered.iter().zip(outcome.results) {
                results[read.slot] =
                    Some(r.map(|hit| if hit { Lookup::Hit } else { Lookup::Miss }));
            }
        }
        // Staged reads go through aligned staging in chunks: each chunk waits for a buffer of
        // its own and never holds one while waiting for another, so concurrent calls cannot
        // deadlock. The job owns its lease: a bounded call that gives up leaves it to the job.
        let lens: Vec<(usize, usize)> =
            direct.iter().enumerate().map(|(n, r)| (n, r.len)).collect();
        let mut direct: Vec<Option<PlannedRead>> = direct.into_iter().map(Some).collect();
        // Spread over the staging buffers: a batch of a few pages still uses them all.
        let total: usize = lens.iter().map(|l| crate::staging::align_up(l.1)).sum();
        let largest = lens.iter().map(|l| crate::staging::align_up(l.1)).max();
        let per_chunk = total
            .div_ceil(shared.config.staging_buffers)
            .max(largest.unwrap_or(0))
            .min(shared.staging.buf_bytes());
        let batches: Vec<Arc<[PlannedRead]>> = chunks(&lens, per_chunk)
            .into_iter()
            .map(|chunk| chunk.iter().filter_map(|&n| direct[n].take()).collect())
            .collect();
        // Up to one chunk per staging buffer at once (on lane 0, whose backend registered the
        // buffers); each chunk is copied out (and its lease let go) as it lands.
        let mut staged = futures::stream::iter(batches.into_iter().map(|reads| async move {
            let job_reads = Arc::clone(&reads);
            let job = async {
                let lease = shared.staging.acquire().await?;
                shared
                    .off_thread(move |s| s.read_staged(lease, &job_reads))
                    .await
            };
            (reads, shared.bound("file read", job).await)
        }))
        .buffer_unordered(shared.config.staging_buffers);
        while let Some((reads, outcome)) = staged.next().await {
            match outcome {
                Ok(staged) => {
                    let mut chunk_results = staged.results;
                    for ((read, &off), r) in
                        reads.iter().zip(&staged.offsets).zip(&mut chunk_results)
                    {
                        if let Ok(true) = r {
                            match &staged.lease {
                                Some(lease) => slots[read.slot]
                                    .buf
                                    .fill_from(&lease.bytes()[off..off + read.len]),
                                None => {
                                    *r = Err(TierError::Timeout {
                                        op: "NIXL transfer",
                                        after: shared.config.transfer_timeout,
                                    })
                                }
                            }
                        }
                    }
                    let versions = Versions {
                        stable: &staged.stable,
                        trusted: &staged.trusted,
                    };
                    let again = shared.verify(
                        &reads,
                        &staged.recorded,
                        versions,
                        &mut chunk_results,
                        |i| checksum::of(slots[reads[i].slot].buf.regions()),
                    );
                    replaced.extend(again.iter().map(|&i| reads[i].clone()));
                    shared.finish_reads(&reads, &chunk_results);
                    for (read, r) in reads.iter().zip(chunk_results) {
                        results[read.slot] =
                            Some(r.map(|hit| if hit { Lookup::Hit } else { Lookup::Miss }));
                    }
                }
                Err(e) => {
                    let failed: Vec<Result<bool, TierError>> =
                        reads.iter().map(|_| Err(super::again(&e))).collect();
                    shared.finish_reads(&reads, &failed);
                    for (read, r) in reads.iter().zip(failed) {
                        results[read.slot] = Some(r.map(|_| Lookup::Miss));
                    }
                }
            }
        }
        replaced
    }
}

impl Shared {
    /// Reads pages straight into the caller's buffers, on the calling thread and, for big
    /// batches, helper threads (see [`run_split`]), split as writes are ([`split_parts`]: by
    /// pages or by bytes, whichever makes more parts, up to one per lane). No await happens
    /// while NIXL may write into the buffers, so a dropped future cannot free them under a
    /// transfer.
    fn read_in_place(&self, reads: &[PlannedRead], bufs: &mut [&mut PageBuf<'_>]) -> VerifiedReads {
        let bytes: usize = reads.iter().map(|r| r.len).sum();
        let parts = split_parts(reads.len(), bytes, self.lanes.len());
        if parts <= 1 {
            return self.read_part(self.lane(0), reads, bufs);
        }
        let per_part = reads.len().div_ceil(parts);
        let mut read_parts = reads.chunks(per_part);
        let mut buf_parts = bufs.chunks_mut(per_part);
        let (first_reads, first_bufs) = match (read_parts.next(), buf_parts.next()) {
            (Some(r), Some(b)) => (r, b),
            _ => return self.read_part(self.lane(0), reads, bufs),
        };
        let others: Vec<_> = read_parts
            .zip(buf_parts)
            .enumerate()
            .map(|(n, (part, part_bufs))| move || self.read_part(self.lane(n + 1), part, part_bufs))
            .collect();
        let (mut merged, others) = run_split(
            || self.read_part(self.lane(0), first_reads, first_bufs),
            others,
        );
        let mut at = first_reads.len();
        for (part, outcome) in reads.chunks(per_part).skip(1).zip(others) {
            match outcome {
                Ok(done) => {
                    merged
                        .replaced
                        .extend(done.replaced.into_iter().map(|i| i + at));
                    merged.results.extend(done.results);
                }
                Err(msg) => merged.results.extend(
                    part.iter()
                        .map(|_| Err(TierError::Unavailable(msg.clone()))),
                ),
            }
            at += part.len();
        }
        merged
    }

    fn read_part(
        &self,
        io: &FileIo,
        reads: &[PlannedRead],
        bufs: &mut [&mut PageBuf<'_>],
    ) -> VerifiedReads {
        let ranges: Vec<Vec<(usize, usize)>> = bufs.iter_mut().map(|b| b.ranges()).collect();
        let flat: Vec<(usize, usize)> = ranges.iter().flatten().copied().collect();
        let memory = match io.lend_local(&flat) {
            Ok(memory) => memory,
            Err(e) => {
                return VerifiedReads {
                    results: reads.iter().map(|_| Err(super::again(&e))).collect(),
                    replaced: Vec::new(),
                }
            }
        };
        let mut xfers = read_xfers(reads, |i| ranges[i].clone());
        let outcome = io.read_all(&mut xfers, &memory);
        drop(memory);
        let mut results = outcome.results;
        let versions = Versions {
            stable: &outcome.stable,
            trusted: &outcome.trusted,
        };
        let replaced = self.verify(reads, &outcome.recorded, versions, &mut results, |i| {
            outcome.hashed[i].unwrap_or_else(|| checksum::of(bufs[i].regions()))
        });
        VerifiedReads { results, replaced }
    }

    /// Turns each hit whose bytes (checksummed by `crc_of`) do not match the checksum its file
    /// records, or whose file records none, into a miss: counted as an error, logged, and the
    /// page forgotten and its file removed, unless a newer put has replaced it meanwhile.
    ///
    /// The index keeps each file's checksum once this process wrote or verified it, so a read
    /// compares against it and asks the file for none. Files change only with their entry's
    /// generation (in the catalog): a mismatch while the entry is still the one the read
    /// planned with is the file's fault; after a put replaced it, the read is to be made again
    /// against the new file's own: those are returned (answered as misses meanwhile).
    fn verify(
        &self,
        reads: &[PlannedRead],
        recorded: &[Option<Recorded>],
        versions: Versions<'_>,
        results: &mut [Result<bool, TierError>],
        crc_of: impl Fn(usize) -> u32,
    ) -> Vec<usize> {
        let mut replaced = Vec::new();
        if self.config.access == FileAccess::Shared {
            // Other processes evict and replace shared files at any moment, a distributed
            // filesystem's client may still list a file another client has unlinked, and one
            // may show another client's new page short for a moment (GlusterFS): see
            // `missed_in_shared_folders`.
            for (read, result) in reads.iter().zip(results.iter_mut()) {
                if let Err(e) = result.as_ref() {
                    if !missed_in_shared_folders(e) {
                        continue;
                    }
                    tracing::debug!(key = %read.key, error = %e, "a shared page file could not be read: a miss");
                    self.stats.errors(1);
                    *result = Ok(false);
                }
            }
        }
        if self.config.page_checksum == PageChecksum::Off {
            return replaced;
        }
        let mut learned = Vec::new();
        for (i, (read, result)) in reads.iter().zip(results.iter_mut()).enumerate() {
            if result.is_err()
                && read.checksum.is_some()
                && !self.catalog.is_current(&read.key, read.generation)
            {
                // Removed or replaced while it was read (unwatched, see `FileIo::read_all`).
                *result = Ok(false);
                replaced.push(i);
                continue;
            }
            if !matches!(result, Ok(true)) || versions.trusted[i] {
                continue;
            }
            if recorded[i] == Some(Recorded::Unchecked) {
                // Written whole without a checksum (`page_checksum = "off"`): served as it is,
                // never removed for lacking one.
                continue;
            }
            let crc = crc_of(i);
            if recorded[i] == Some(Recorded::Crc(crc)) {
                if read.checksum.is_none() {
                    learned.push((&read.key, read.generation, crc));
                }
                if let (Some(version), Some(verified)) =
                    (versions.stable[i], &self.lane(0).verified)
                {
                    verified.insert(version);
                }
                continue;
            }
            *result = Ok(false);
            if read.checksum.is_some() && !self.catalog.is_current(&read.key, read.generation) {
                replaced.push(i);
                continue;
            }
            self.stats.errors(1);
            tracing::warn!(
                tier = %self.config.name, key = %read.key, path = %read.path.display(),
                recorded = ?recorded[i], read = crc,
                "page bytes do not match their checksum: answered as a miss, file removed"
            );
            self.catalog
                .discard(&read.key, read.generation, &read.path, read.mtime_ns);
        }
        self.catalog.learn_checksums(&learned);
        replaced
    }

    /// Reads a chunk into a staging lease (blocking thread), for direct I/O. The hits are
    /// verified once copied out (see [`StagedReads`]).
    fn read_staged(&self, mut lease: StagingLease, reads: &[PlannedRead]) -> StagedReads {
        let (offsets, _) = io::slots(reads.iter().map(|r| r.len));
        let base = lease.buf().addr();
        let mut xfers = read_xfers(reads, |i| vec![(base + offsets[i], reads[i].len)]);
        let lease = Arc::new(lease);
        let mut held = Held::default();
        held.own(Arc::clone(&lease) as Arc<dyn Registered>);
        let outcome = self.lane(0).read_all(&mut xfers, &held.seal());
        StagedReads {
            lease: (!outcome.poisoned).then_some(lease),
            offsets,
            results: outcome.results,
            recorded: outcome.recorded,
            stable: outcome.stable,
            trusted: outcome.trusted,
        }
    }

    /// Hits become most recent; a file that vanished under its entry is forgotten (see
    /// [`Catalog::settle_reads`](super::catalog::Catalog::settle_reads)). That may look at
    /// files (a miss's, or a sharer's hits'): where I/O is bounded, on a thread of its own,
    /// never waited for. An owner's hits touch only its index: settled here.
    fn finish_reads(self: &Arc<Self>, reads: &[PlannedRead], results: &[Result<bool, TierError>]) {
        let found: Vec<Option<bool>> = results.iter().map(|r| r.as_ref().ok().copied()).collect();
        let memory_only = self.catalog.indexed() && !found.contains(&Some(false));
        if !self.bounded || memory_only {
            return self.settle_reads(reads, &found);
        }
        if found.iter().any(Option::is_some) {
            let (shared, reads) = (Arc::clone(self), reads.to_vec());
            tokio::task::spawn_blocking(move || shared.settle_reads(&reads, &found));
        }
    }

    fn settle_reads(&self, reads: &[PlannedRead], found: &[Option<bool>]) {
        self.catalog
            .settle_reads(reads.iter().zip(found).map(|(read, &found)| SettledRead {
                key: &read.key,
                generation: read.generation,
                mtime_ns: read.mtime_ns,
                path: &read.path,
                found,
            }));
    }
}

/// Reads checked against their pages' checksums.
struct VerifiedReads {
    /// Per read: hit, miss, or the error.
    results: Vec<Result<bool, TierError>>,
    /// Reads of pages a put replaced after they were planned, to be made again (see
    /// [`Shared::verify`]).
    replaced: Vec<usize>,
}

/// What [`Shared::read_staged`] read. A batch read that failed in one page may still land
/// other pages' late reads in the lease (it is held until they have), so each hit is checked
/// against its checksum after it is copied out, where nothing else writes.
struct StagedReads {
    /// The lease read into; `None` if a transfer into it never settled.
    lease: Option<Arc<StagingLease>>,
    /// Each read's offset in the lease.
    offsets: Vec<usize>,
    /// Per read: hit, miss or error, not yet verified.
    results: Vec<Result<bool, TierError>>,
    /// Per read: the checksum its file records.
    recorded: Vec<Option<Recorded>>,
    /// Per read: its file's version, unchanged across the read (see [`io::BatchReads`]).
    stable: Vec<Option<FileId>>,
    /// Per read: a version already verified (see [`io::BatchReads`]).
    trusted: Vec<bool>,
}

/// Per read, what the file versions read say (see [`io::BatchReads`]).
#[derive(Clone, Copy)]
struct Versions<'a> {
    stable: &'a [Option<FileId>],
    trusted: &'a [bool],
}

/// A page planned for reading into slot `slot`.
#[derive(Clone)]
struct PlannedRead {
    slot: usize,
    key: PageKey,
    /// The index entry's generation when planned (0 without an index).
    generation: Generation,
    /// Its file's last use when planned, where the file was looked at (no index).
    mtime_ns: Option<i128>,
    /// The checksum the index knows for the entry's file, if any (none: read the file's).
    checksum: Option<u32>,
    path: PathBuf,
    len: usize,
    direct: bool,
}

impl Shared {
    /// See [`NixlFileTier::settle_mismatches`].
    fn judge_mismatch(&self, path: &Path, mismatch: TierError) -> GetResult {
        let Some(key) = mismatch.key() else {
            return Err(mismatch);
        };
        let stored = match &mismatch {
            TierError::LengthMismatch { stored, .. } => Some(*stored as u64),
            _ => None,
        };
        let whole = perms::open_existing(std::fs::OpenOptions::new().read(true), path, 0)
            .and_then(|f| Ok((format::read_from(&f, key)?, f.metadata()?.len())));
        match whole {
            // Whole, and still of the length the lookup saw: a page of another length.
            Ok((format::Trailer::Page(_), len))
                if stored.is_some_and(|s| format::page_len(len) == Some(s as u32)) =>
            {
                Err(mismatch)
            }
            Ok((format::Trailer::Page(_), _)) => {
                // Whole now, at another length than the lookup saw: the lookup saw another
                // client's write short (GlusterFS writes behind), or a put replaced it since.
                tracing::debug!(key = %key, path = %path.display(), "a shared page file changed length since its lookup: a miss");
                Ok(Lookup::Miss)
            }
            Ok((format::Trailer::Not(why), _)) => {
                tracing::debug!(key = %key, path = %path.display(), why, "a shared page file shows no whole page of another length: a miss");
                self.stats.errors(1);
                Ok(Lookup::Miss)
            }
            Err(e) => {
                tracing::debug!(key = %key, path = %path.display(), error = %e, "a shared page file of another length could not be read: a miss");
                self.stats.errors(1);
                Ok(Lookup::Miss)
            }
        }
    }
}

/// Whether a read's error, in shared folders, is a miss: the file could not be opened or read,
/// or its length changed between the plan and the read (replaced by another process, or a
/// distributed filesystem's client showing another client's new page short for a moment). A
/// timeout stays an error, for the tier's health. (A length the lookup already saw differ
/// from the caller's buffer is judged by the file's trailer: [`Shared::judge_mismatch`].)
fn missed_in_shared_folders(e: &TierError) -> bool {
    matches!(
        e,
        TierError::Backend { .. } | TierError::Io { .. } | TierError::LengthMismatch { .. }
    )
}

/// Transfers of `reads`; `parts` gives each read's DRAM regions.
fn read_xfers(reads: &[PlannedRead], parts: impl Fn(usize) -> Vec<(usize, usize)>) -> Vec<Xfer> {
    reads
        .iter()
        .enumerate()
        .map(|(i, r)| Xfer {
            key: r.key.clone(),
            path: r.path.clone(),
            len: r.len,
            direct: r.direct,
            parts: parts(i),
            checksum: r.checksum,
            created: None,
            opened: None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
