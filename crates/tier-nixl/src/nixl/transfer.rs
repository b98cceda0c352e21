//! Transfers and what they hold. A [`Transfer`] owns a share of a [`Held`]: the registrations
//! of the memory and files its descriptors name, the tier's own memory under them, and (fd
//! mode) the open files. It lets go of its share only once NIXL says it settled. One that
//! never settles (neither the POSIX nor the OBJ plugin cancels an I/O it has started) keeps
//! it for good, so no late read or write touches freed or reused memory or a closed file;
//! its bytes count against the backend's bound. A caller's own memory cannot be given up: a
//! read into it is waited out (see [`Transfer::finish`]).

use std::fs::File;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    check, exit, sys, Backend, Desc, IoRoom, MemKind, NixlError, Registration, XferList, XferOp,
    LIVE_TRANSFERS,
};

/// Memory of the tier's own, registered with a backend: a staging buffer, a copy, pages.
pub trait Registered: Send + Sync + 'static {
    /// The registration of its bytes.
    fn registration(&self) -> Option<&Registration>;
    /// Its size, counted against the backend's bound if a transfer abandons it.
    fn bytes(&self) -> usize;
    /// Told once when a transfer that never settled keeps it for good.
    fn abandoned(&self) {}
}

/// Memory and the registration of its bytes, deregistered before the memory is freed.
pub struct Owned<M> {
    // Declared first: dropped first.
    registration: Registration,
    memory: M,
}

impl<M: Send + Sync + 'static> Owned<M> {
    /// `memory`, whose bytes `registration` registered.
    pub fn new(registration: Registration, memory: M) -> Self {
        Self {
            registration,
            memory,
        }
    }

    /// The memory.
    pub fn memory(&self) -> &M {
        &self.memory
    }
}

impl<M: Send + Sync + 'static> Registered for Owned<M> {
    fn registration(&self) -> Option<&Registration> {
        Some(&self.registration)
    }

    fn bytes(&self) -> usize {
        self.registration.dram.iter().map(|r| r.1).sum()
    }
}

/// Everything a transfer's I/O may touch, kept alive by the transfers posted over it: dropped
/// when the last settles, kept for good if one never does. Built before posting, then sealed;
/// [`Backend::post`] refuses a descriptor outside what it registered.
#[derive(Default)]
pub struct Held {
    memory: Vec<Arc<dyn Registered>>,
    registrations: Vec<Registration>,
    files: Vec<Arc<File>>,
    inner: Vec<Arc<Held>>,
    /// Registered host ranges, sorted by start once sealed.
    dram: Vec<(usize, usize)>,
    /// Registered device ids, sorted once sealed.
    devices: Vec<u64>,
    /// Holds the registration of a caller's memory, which is freed once the call returns.
    lent: bool,
    abandoned: AtomicBool,
}

impl Held {
    /// Memory of the tier's own: given up for good if a transfer over it never settles.
    pub fn own(&mut self, memory: Arc<dyn Registered>) {
        if let Some(r) = memory.registration() {
            self.dram.extend_from_slice(&r.dram);
        }
        self.memory.push(memory);
    }

    /// The registration of memory a caller owns and frees once the call returns: a read into
    /// it is waited out, never given up.
    pub fn lend(&mut self, registration: Registration) {
        self.dram.extend_from_slice(&registration.dram);
        self.lent = true;
        self.registrations.push(registration);
    }

    /// Registered files or objects, with the open files an fd-mode registration names.
    pub fn files(&mut self, registration: Registration, files: Vec<Arc<File>>) {
        self.devices.extend_from_slice(&registration.devices);
        self.dram.extend_from_slice(&registration.dram);
        self.registrations.push(registration);
        self.files.extend(files);
    }

    /// Everything `inner` holds, shared with it.
    pub fn include(&mut self, inner: &Arc<Held>) {
        self.dram.extend_from_slice(&inner.dram);
        self.devices.extend_from_slice(&inner.devices);
        self.lent |= inner.lent;
        self.inner.push(Arc::clone(inner));
    }

    /// Whether it holds memory a caller lent (see [`Self::lend`]).
    pub fn lent(&self) -> bool {
        self.lent
    }

    /// Ready to post transfers over.
    pub fn seal(mut self) -> Arc<Self> {
        self.dram.sort_unstable();
        self.devices.sort_unstable();
        self.devices.dedup();
        Arc::new(self)
    }

    /// Whether it registered `len` bytes at `addr` (in one range).
    fn holds_dram(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let starts_before = self.dram.partition_point(|r| r.0 <= addr);
        self.dram[..starts_before]
            .iter()
            .rev()
            .any(|&(at, n)| at.saturating_add(n) >= end)
    }

    fn covers(
        &self,
        local: &[Desc<'_>],
        remote_kind: MemKind,
        remote: &[Desc<'_>],
    ) -> Result<(), NixlError> {
        let outside = |side: &str, d: &Desc<'_>| {
            NixlError {
            call: "post",
            status: 0,
            detail: format!(
                "{side} descriptor ({:#x}, {} bytes, device {}) lies outside what the transfer holds registered",
                d.addr, d.len, d.dev_id
            ),
        }
        };
        if let Some(d) = local.iter().find(|d| !self.holds_dram(d.addr, d.len)) {
            return Err(outside("local", d));
        }
        let unheld = |d: &&Desc<'_>| match remote_kind {
            MemKind::Dram => !self.holds_dram(d.addr, d.len),
            MemKind::File | MemKind::Object => self.devices.binary_search(&d.dev_id).is_err(),
        };
        if let Some(d) = remote.iter().find(unheld) {
            return Err(outside("remote", d));
        }
        Ok(())
    }

    /// Counts the tier's memory it holds, once, against `backend`'s bound.
    fn abandon(&self, backend: &Backend) {
        if self.abandoned.swap(true, Relaxed) {
            return;
        }
        let bytes: usize = self.memory.iter().map(|m| m.bytes()).sum();
        backend.abandoned.fetch_add(bytes, Relaxed);
        self.memory.iter().for_each(|m| m.abandoned());
        for inner in &self.inner {
            inner.abandon(backend);
        }
    }
}

/// Transfers waiting in [`Transfer::release_later`], and the most that may.
static RELEASING: AtomicUsize = AtomicUsize::new(0);
const MAX_RELEASING: usize = 64;

impl Backend {
    /// Creates and posts a transfer between local DRAM and `remote` descriptors, all
    /// registered by `held`, which the transfer keeps (see [`Held`]), as it keeps room for
    /// its descriptors taken from `room` (see [`Backend::io_room`]). Refused while
    /// transfers that never settled hold more than the backend's bound (see
    /// [`Backend::limit_abandoned`]), and where `room` is short.
    pub fn post(
        self: &Arc<Self>,
        op: XferOp,
        local: &[Desc<'_>],
        remote_kind: MemKind,
        remote: &[Desc<'_>],
        held: &Arc<Held>,
        room: &mut IoRoom,
    ) -> Result<Transfer, NixlError> {
        held.covers(local, remote_kind, remote)?;
        if self.ios.is_some() && room.len() < local.len() {
            return Err(NixlError {
                call: "post",
                status: 0,
                detail: format!(
                    "{} descriptors posted with room for {} in the backend's pool of I/O requests",
                    local.len(),
                    room.len()
                ),
            });
        }
        let (abandoned, limit) = (
            self.abandoned.load(Relaxed),
            self.abandon_limit.load(Relaxed),
        );
        if abandoned > limit {
            return Err(NixlError {
                call: "post",
                status: 0,
                detail: format!(
                    "transfers that never finished hold {abandoned} bytes for good, over the \
                     bound of {limit}: the storage behind this {} backend stopped answering",
                    self.plugin
                ),
            });
        }
        let _call = exit::enter_or("nixl_capi_create_xfer_req")?;
        let local_len = local.len();
        let local = XferList::new(MemKind::Dram, local)?;
        let remote = XferList::new(remote_kind, remote)?;
        let mut req = ptr::null_mut();
        let raw_op = match op {
            XferOp::Read => sys::XFER_READ,
            XferOp::Write => sys::XFER_WRITE,
        };
        // SAFETY: live agent, lists and opt-args; the remote agent is this agent (local storage).
        let status = unsafe {
            sys::nixl_capi_create_xfer_req(
                self.agent.raw,
                raw_op,
                local.0,
                remote.0,
                self.agent.name.as_ptr(),
                &mut req,
                self.opt,
            )
        };
        check("nixl_capi_create_xfer_req", status)?;
        LIVE_TRANSFERS.fetch_add(1, Relaxed);
        let mut transfer = Transfer {
            backend: Arc::clone(self),
            req,
            descs: local_len,
            op,
            held: Some(Arc::clone(held)),
            room: room.split(local_len),
        };
        // SAFETY: live request.
        let status = unsafe { sys::nixl_capi_post_xfer_req(self.agent.raw, req, self.opt) };
        if status != sys::SUCCESS && status != sys::IN_PROG {
            // Nothing was started: released (or, if NIXL refuses, kept with what it holds).
            // Requests it queued before failing stay taken in its pool: so does their room.
            std::mem::take(&mut transfer.room).keep();
            if transfer.release() {
                transfer.held = None;
            }
            check("nixl_capi_post_xfer_req", status)?;
        }
        exit::watch(exit::Made::Transfer);
        Ok(transfer)
    }
}

/// A posted transfer request and its share of what its I/O may touch.
pub struct Transfer {
    backend: Arc<Backend>,
    req: sys::xfer_req_t,
    /// How many descriptors it moves: a failure of one of several says nothing of the others.
    descs: usize,
    op: XferOp,
    /// `None` once released, or once given up for good.
    held: Option<Arc<Held>>,
    /// Its descriptors' room in the backend's pool of I/O requests: given back once NIXL has
    /// released it (its requests are back in the pool then), kept for good if it never is.
    room: IoRoom,
}

// SAFETY: used only through the thread-synchronised agent.
unsafe impl Send for Transfer {}

/// How a transfer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Completion {
    /// All bytes moved.
    Done,
    /// The backend reported an error.
    Failed(NixlError),
    /// It did not finish within the bound.
    TimedOut,
}

/// How a transfer ended once [`Transfer::finish`] has waited for it.
#[derive(Debug)]
pub enum Finished {
    /// All bytes moved; nothing is in flight.
    Done,
    /// The backend reported an error and nothing of the transfer is in flight (it moved one
    /// descriptor, the one that failed).
    Failed(NixlError),
    /// Parts of the transfer may still read or write its memory: it timed out, or one of
    /// several descriptors failed (the POSIX plugin reports the first failed I/O while the
    /// others still run; the OBJ plugin's contract promises no more). Its [`Held`] is kept:
    /// for good after a timeout, one more timeout after a failure.
    Unsettled(Unsettled),
}

/// Why a transfer is [`Finished::Unsettled`].
#[derive(Debug)]
pub enum Unsettled {
    /// It did not complete within its bound.
    TimedOut,
    /// One of its descriptors failed; the others may still be moving.
    Failed(NixlError),
}

impl Transfer {
    /// Waits for completion, at most `timeout`, without spinning a core: a short spin, then
    /// sleeps growing from 5 µs to 1 ms.
    fn wait(&self, timeout: Duration) -> Completion {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(5);
        let mut spins = 0u32;
        loop {
            let Some(call) = exit::enter() else {
                exit::stay();
                return Completion::TimedOut;
            };
            // SAFETY: live agent and request.
            let status =
                unsafe { sys::nixl_capi_get_xfer_status(self.backend.agent.raw, self.req) };
            drop(call);
            match status {
                sys::SUCCESS => return Completion::Done,
                sys::IN_PROG => {}
                failed => {
                    return Completion::Failed(NixlError {
                        call: "nixl_capi_get_xfer_status",
                        status: failed,
                        detail: String::new(),
                    })
                }
            }
            if Instant::now() >= deadline {
                return Completion::TimedOut;
            }
            if spins < 20 {
                spins += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
    }

    /// Waits (bounded by `timeout`), then releases the request and what it holds, or, if it
    /// did not settle, keeps them for good.
    ///
    /// A read into a caller's memory (a [`Held::lend`]) cannot keep it: such a transfer is
    /// waited for up to ten more timeouts (a failed one, whose other descriptors NIXL no
    /// longer reports, for one more timeout; the FILE tier posts such reads one descriptor a
    /// transfer, so theirs end known), and reported as done or failed. One still running after that, or a request
    /// NIXL will not release, still owns the memory: the process aborts, as the only
    /// memory-safe way left.
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let completion = self.wait(timeout);
        self.settle(completion, timeout)
    }

    fn settle(&mut self, completion: Completion, timeout: Duration) -> Finished {
        let settled = match &completion {
            Completion::Done => true,
            Completion::Failed(_) => self.descs <= 1,
            Completion::TimedOut => false,
        };
        if settled && self.release() {
            self.held = None;
            return match completion {
                Completion::Failed(e) => Finished::Failed(e),
                _ => Finished::Done,
            };
        }
        let reads_lent = self.op == XferOp::Read && self.held.as_ref().is_some_and(|h| h.lent);
        if !reads_lent {
            if matches!(completion, Completion::Failed(_)) && self.descs > 1 {
                self.release_later(timeout);
            } else {
                self.abandon();
            }
            return Finished::Unsettled(match completion {
                Completion::Failed(e) => Unsettled::Failed(e),
                _ => Unsettled::TimedOut,
            });
        }
        let mut completion = completion;
        if let Completion::Failed(_) = completion {
            std::thread::sleep(timeout);
        } else {
            for _ in 0..10 {
                completion = self.wait(timeout);
                if completion != Completion::TimedOut {
                    break;
                }
            }
        }
        if !self.release() {
            eprintln!("kvtier: NIXL will not release a transfer into caller memory; aborting rather than corrupting it");
            std::process::abort();
        }
        self.held = None;
        match completion {
            Completion::Done => Finished::Done,
            Completion::Failed(e) => Finished::Failed(e),
            Completion::TimedOut => {
                eprintln!("kvtier: a NIXL transfer into caller memory did not finish in eleven timeouts; aborting rather than corrupting it");
                std::process::abort();
            }
        }
    }

    /// Hands the request and what it holds to a thread that releases them one `timeout`
    /// later: a failure among several descriptors ends NIXL's reports while the others'
    /// local I/O lands (or fails) soon after. Past [`MAX_RELEASING`] of them, or if no thread
    /// starts, they are kept for good instead.
    fn release_later(&mut self, after: Duration) {
        if RELEASING.fetch_add(1, Relaxed) >= MAX_RELEASING {
            RELEASING.fetch_sub(1, Relaxed);
            self.abandon();
            return;
        }
        let later = Transfer {
            backend: Arc::clone(&self.backend),
            req: std::mem::replace(&mut self.req, ptr::null_mut()),
            descs: self.descs,
            op: self.op,
            held: self.held.take(),
            room: std::mem::take(&mut self.room),
        };
        let slot = Arc::new(std::sync::Mutex::new(Some(later)));
        let theirs = Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name("kvtier-nixl-release".into())
            .spawn(move || {
                std::thread::sleep(after);
                let taken = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(mut later) = taken {
                    if later.release() {
                        later.held = None;
                    } else {
                        later.abandon();
                    }
                }
                RELEASING.fetch_sub(1, Relaxed);
            });
        if spawned.is_err() {
            RELEASING.fetch_sub(1, Relaxed);
            let taken = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(mut later) = taken {
                later.abandon();
            }
        }
    }

    /// Keeps the request, what it holds and its backend for good, counting the tier's memory
    /// against the backend's bound.
    fn abandon(&mut self) {
        std::mem::take(&mut self.room).keep();
        if let Some(held) = self.held.take() {
            held.abandon(&self.backend);
            std::mem::forget(held);
        }
        std::mem::forget(Arc::clone(&self.backend));
        self.req = ptr::null_mut();
    }

    /// Releases the request. Returns false if NIXL refused (a transfer still in flight).
    fn release(&mut self) -> bool {
        if self.req.is_null() {
            return true;
        }
        let Some(_call) = exit::enter() else {
            exit::stay();
            return false;
        };
        // SAFETY: live agent and request. On success NIXL nulls its inner handle, so destroy
        // only frees the wrapper.
        let status = unsafe { sys::nixl_capi_release_xfer_req(self.backend.agent.raw, self.req) };
        if status != sys::SUCCESS {
            tracing::error!(status, "NIXL refused to release a transfer");
            return false;
        }
        // SAFETY: released request wrapper.
        unsafe { sys::nixl_capi_destroy_xfer_req(self.req) };
        self.req = ptr::null_mut();
        LIVE_TRANSFERS.fetch_sub(1, Relaxed);
        drop(std::mem::take(&mut self.room));
        true
    }
}

impl Drop for Transfer {
    /// One dropped before [`Transfer::finish`] settles the same way, without waiting for
    /// what it may keep.
    fn drop(&mut self) {
        if self.held.is_some() {
            let completion = self.wait(Duration::ZERO);
            self.settle(completion, Duration::from_secs(30));
        } else {
            self.release();
        }
        if !self.req.is_null() {
            // Not released: NIXL may still hold its requests.
            std::mem::take(&mut self.room).keep();
        }
    }
}
