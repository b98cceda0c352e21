//! The data path: a batch of pages moved by one NIXL OBJ registration and transfer, with the
//! length checks and rereads that keep a page whole or absent.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tier_core::{Bytes, PageBuf, PageKey, TierError};

use super::Shared;
use crate::batch::{send_pages, BatchOutcome};
use crate::nixl::{
    next_dev_id, Backend, Desc, Finished, Held, IoRoom, MemKind, Owned, Registered, XferOp,
};
/// The largest object one S3 PUT may write.
pub(super) const MAX_OBJECT: usize = 5 << 30;

/// Reads of an object overwritten while it was read, before it is answered as a miss (S3
/// answers a ranged GET of whatever the name holds when the request arrives). With the pauses
/// between them (2 to 32 ms) about 0.4 s: writers busy on one key under a loaded machine
/// outlasted eight.
pub(super) const OBJ_READ_ATTEMPTS: u32 = 16;

/// One page to move: its object, its length, and the DRAM address of its bytes.
pub(super) struct ObjXfer {
    key: PageKey,
    object: String,
    len: usize,
    local: usize,
}

impl Shared {
    pub(super) fn lane(&self) -> &Arc<Backend> {
        let n = self.next_lane.fetch_add(1, Ordering::Relaxed);
        &self.lanes[n % self.lanes.len()]
    }

    pub(super) fn backend_error(&self, key: Option<&PageKey>, message: String) -> TierError {
        TierError::Backend {
            backend: format!("nixl OBJ (bucket {})", self.config.s3.bucket),
            key: key.cloned(),
            message,
        }
    }

    /// Moves every item (blocking): one registration of all their objects, then one transfer
    /// per item, all posted before any is waited for. One descriptor per transfer makes every
    /// outcome exact: NIXL's OBJ plugin reports a transfer failed as soon as one of its
    /// requests fails, while the others may still be writing into (or reading) their memory.
    /// `memory` registered the items' DRAM; each transfer holds it with the objects.
    pub(super) fn move_all(
        &self,
        backend: &Arc<Backend>,
        op: XferOp,
        items: &[ObjXfer],
        memory: &Arc<Held>,
    ) -> BatchOutcome {
        let what = match op {
            XferOp::Read => "get object",
            XferOp::Write => "put object",
        };
        let fail_all = |message: String| BatchOutcome {
            results: items
                .iter()
                .map(|item| Err(self.backend_error(Some(&item.key), message.clone())))
                .collect(),
            poisoned: false,
        };
        let remote: Vec<Desc<'_>> = items
            .iter()
            .map(|item| Desc {
                addr: 0,
                len: item.len,
                dev_id: next_dev_id(),
                meta: item.object.as_bytes(),
            })
            .collect();
        let held = match backend.register(MemKind::Object, &remote) {
            Ok(objects) => {
                let mut held = Held::default();
                held.include(memory);
                held.files(objects, Vec::new());
                held.seal()
            }
            Err(e) => return fail_all(format!("{what}: registering objects: {e}")),
        };
        let posted: Vec<_> = items
            .iter()
            .zip(&remote)
            .map(|(item, remote)| {
                backend.post(
                    op,
                    &[Desc::dram(item.local, item.len)],
                    MemKind::Object,
                    std::slice::from_ref(remote),
                    &held,
                    // The OBJ plugin keeps no pool of I/O requests.
                    &mut IoRoom::default(),
                )
            })
            .collect();
        let deadline = Instant::now() + self.config.transfer_timeout;
        let mut poisoned = false;
        let results = posted
            .into_iter()
            .zip(items)
            .map(|(posted, item)| {
                let transfer = posted.map_err(|e| {
                    self.backend_error(Some(&item.key), format!("{what}: posting: {e}"))
                })?;
                let left = deadline.saturating_duration_since(Instant::now());
                // The tier's own memory: an unsettled transfer keeps it, never waited on.
                match transfer.finish(left) {
                    Finished::Done => Ok(()),
                    Finished::Failed(e) => Err(self.backend_error(
                        Some(&item.key),
                        format!(
                            "{what}: {e} (S3 refused or was unreachable; NIXL logs the reason on stderr)"
                        ),
                    )),
                    // NIXL's S3 client may still complete a request it was told to drop (its
                    // own retries outlast ours), so memory of a timed-out batch is never reused.
                    Finished::Unsettled(_) => {
                        poisoned = true;
                        Err(TierError::Timeout {
                            op: "NIXL OBJ transfer",
                            after: self.config.transfer_timeout,
                        })
                    }
                }
            })
            .collect();
        BatchOutcome { results, poisoned }
    }

    /// Writes pages from their own bytes (blocking).
    pub(super) fn write_pages(
        &self,
        pages: &[(PageKey, String, Bytes)],
    ) -> Vec<Result<(), TierError>> {
        let backend = self.lane();
        let data: Vec<&[u8]> = pages.iter().map(|(_, _, d)| &d[..]).collect();
        let owner: Vec<Bytes> = pages.iter().map(|p| p.2.clone()).collect();
        let outcome = send_pages(backend, &data, Some(Arc::new(owner)), &mut |addrs, held| {
            let items: Vec<ObjXfer> = pages
                .iter()
                .zip(addrs)
                .map(|((key, object, data), &local)| ObjXfer {
                    key: key.clone(),
                    object: object.clone(),
                    len: data.len(),
                    local,
                })
                .collect();
            self.move_all(backend, XferOp::Write, &items, held)
        });
        outcome.results
    }

    /// Reads objects (page and trailer) into a registered buffer of the batch's own, then
    /// copies each page read whole to its caller's buffer: `Ok(true)`; `Ok(false)` when the
    /// bytes read are not one whole page of the key (see `tier_format`: overwritten while read,
    /// torn, foreign, of format 1), its buffer then left as it was. A transfer that timed out
    /// may still write into that buffer later: it keeps the buffer for good, and the caller's
    /// memory is never at risk.
    pub(super) fn read_pages(
        &self,
        reads: &[(PageKey, String)],
        bufs: &mut [&mut PageBuf<'_>],
    ) -> Vec<Result<bool, TierError>> {
        let backend = self.lane();
        let mut offsets = Vec::with_capacity(bufs.len());
        let mut total = 0;
        for buf in bufs.iter() {
            offsets.push(total);
            total += tier_format::sealed_len(buf.len()) as usize;
        }
        let staging = vec![0u8; total.max(1)].into_boxed_slice();
        let base = staging.as_ptr() as usize;
        let staging = match backend.register_dram(&[(base, staging.len())]) {
            Ok(registration) => Arc::new(Owned::new(registration, staging)),
            Err(e) => {
                return reads
                    .iter()
                    .map(|(key, _)| {
                        Err(self.backend_error(Some(key), format!("registering a buffer: {e}")))
                    })
                    .collect()
            }
        };
        let items: Vec<ObjXfer> = reads
            .iter()
            .zip(bufs.iter().zip(&offsets))
            .map(|((key, object), (buf, &off))| ObjXfer {
                key: key.clone(),
                object: object.clone(),
                len: tier_format::sealed_len(buf.len()) as usize,
                local: base + off,
            })
            .collect();
        let mut held = Held::default();
        held.own(Arc::clone(&staging) as Arc<dyn Registered>);
        let outcome = self.move_all(backend, XferOp::Read, &items, &held.seal());
        // Each page read has settled; pages whose transfer did not are errors, not copied.
        let bytes = staging.memory();
        let results = bufs.iter_mut().zip(reads).zip(&offsets);
        results
            .zip(outcome.results)
            .map(|(((buf, (key, _)), &off), r)| {
                r?;
                let stored = &bytes[off..off + tier_format::sealed_len(buf.len()) as usize];
                match tier_format::open(key, stored) {
                    Ok(page) => {
                        buf.fill_from(page);
                        Ok(true)
                    }
                    Err(why) => {
                        tracing::debug!(key = %key, why, "not a whole page object");
                        Ok(false)
                    }
                }
            })
            .collect()
    }
}

impl Shared {
    /// NIXL reports a failed S3 request only as a backend error: when a batch had any, ask the
    /// bucket through `object_store` and add its answer (e.g. an authentication failure).
    pub(super) async fn explain_failures(&self, results: &mut [Result<(), TierError>]) {
        if !results
            .iter()
            .any(|r| matches!(r, Err(TierError::Backend { .. })))
        {
            return;
        }
        if let Err(why) = self.control.check_access().await {
            for r in results.iter_mut() {
                if let Err(TierError::Backend { message, .. }) = r {
                    message.push_str(&format!("; the bucket answers: {why}"));
                }
            }
        }
    }
}
