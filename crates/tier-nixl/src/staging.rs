//! Registered DRAM staging buffers, allocated on first use, registered with the backend once,
//! reused for every batch. The pool bounds memory: at most `buffers x bytes` are ever live,
//! and a batch waits (asynchronously) for a free buffer.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use tier_core::TierError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::nixl::{Backend, Desc, MemKind, Registered, Registration};

/// Alignment of buffers and of page slots inside them (direct I/O needs 4 KiB).
pub const ALIGN: usize = 4096;

/// Rounds `n` up to a multiple of [`ALIGN`].
pub fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// One registered, aligned buffer.
pub struct StagingBuf {
    // Declared first: deregistered before the memory is freed.
    registration: Option<Registration>,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value.
unsafe impl Send for StagingBuf {}
// SAFETY: shared access only reads it.
unsafe impl Sync for StagingBuf {}

impl StagingBuf {
    /// A buffer of `len` bytes, registered with `backend` where there is one (the syscalls
    /// engine registers nothing).
    fn new(backend: Option<&Arc<Backend>>, len: usize) -> Result<Self, TierError> {
        let layout = Layout::from_size_align(len, ALIGN)
            .map_err(|_| TierError::config("staging_bytes", "must be a positive size"))?;
        // SAFETY: non-zero size (checked by config), valid alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            TierError::Unavailable(format!("cannot allocate a {len}-byte staging buffer"))
        })?;
        let mut buf = Self {
            registration: None,
            ptr,
            len,
        };
        let Some(backend) = backend else {
            return Ok(buf);
        };
        let desc = Desc::dram(buf.addr(), len);
        let registration =
            backend
                .register(MemKind::Dram, &[desc])
                .map_err(|e| TierError::Backend {
                    backend: format!("nixl {}", backend.plugin()),
                    key: None,
                    message: format!("registering a staging buffer: {e}"),
                })?;
        buf.registration = Some(registration);
        Ok(buf)
    }

    /// Start address, for transfer descriptors.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        drop(self.registration.take());
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, ALIGN),
            )
        };
    }
}

/// A bounded pool of staging buffers.
pub struct StagingPool {
    backend: Option<Arc<Backend>>,
    buf_bytes: usize,
    free: Mutex<Vec<StagingBuf>>,
    permits: Arc<Semaphore>,
}

impl StagingPool {
    /// A pool of at most `buffers` buffers of `buf_bytes` each.
    pub fn new(backend: Option<Arc<Backend>>, buffers: usize, buf_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            backend,
            buf_bytes: align_up(buf_bytes),
            free: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(buffers.max(1))),
        })
    }

    /// Bytes per buffer.
    pub fn buf_bytes(&self) -> usize {
        self.buf_bytes
    }

    /// Waits for a free buffer.
    pub async fn acquire(self: &Arc<Self>) -> Result<StagingLease, TierError> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| TierError::Unavailable("staging pool closed".into()))?;
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let buf = match reused {
            Some(buf) => buf,
            None => {
                let (backend, bytes) = (self.backend.clone(), self.buf_bytes);
                tokio::task::spawn_blocking(move || StagingBuf::new(backend.as_ref(), bytes))
                    .await
                    .map_err(|e| {
                        TierError::Unavailable(format!("staging allocation task failed: {e}"))
                    })??
            }
        };
        Ok(StagingLease {
            buf: Some(buf),
            pool: Arc::clone(self),
            permit: Mutex::new(Some(permit)),
        })
    }
}

/// A buffer borrowed from the pool; returned on drop.
pub struct StagingLease {
    buf: Option<StagingBuf>,
    pool: Arc<StagingPool>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl StagingLease {
    /// The buffer.
    pub fn buf(&mut self) -> &mut StagingBuf {
        self.buf
            .as_mut()
            .expect("a lease holds its buffer until dropped or leaked")
    }

    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], StagingBuf::as_slice)
    }
}

/// A transfer that never settles keeps its lease, and so its buffer, for good; its permit
/// comes back, and the pool allocates a replacement on demand (the backend bounds how much
/// such transfers may keep).
impl Registered for StagingLease {
    fn registration(&self) -> Option<&Registration> {
        self.buf.as_ref()?.registration.as_ref()
    }

    fn bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len)
    }

    fn abandoned(&self) {
        drop(self.permit.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

impl Drop for StagingLease {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(buf);
        }
    }
}
