//! The process's one tokio runtime, shared by every store and adapter; a child forked from a
//! process that used it gets a runtime of its own.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Mutex;

/// The one runtime of the process, shared by every store and adapter. A child forked from a
/// process that used it gets a runtime of its own (the parent's threads do not cross a fork:
/// its runtime is left untouched, never dropped).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static CURRENT: AtomicPtr<tokio::runtime::Runtime> = AtomicPtr::new(std::ptr::null_mut());
    static OWNER: AtomicU32 = AtomicU32::new(0);
    static STARTING: Mutex<()> = Mutex::new(());
    let pid = std::process::id();
    // OWNER is stored after CURRENT: seeing this process as the owner, CURRENT is its runtime.
    let ours = || {
        (OWNER.load(Ordering::Acquire) == pid).then(|| {
            // SAFETY: a runtime stored in CURRENT is leaked, so it lives for the process.
            unsafe { &*CURRENT.load(Ordering::Acquire) }
        })
    };
    if let Some(runtime) = ours() {
        return runtime;
    }
    let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(runtime) = ours() {
        return runtime;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8)))
        .thread_name("kvtier")
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("kvtier cannot start its runtime: {e}"));
    let runtime: &'static tokio::runtime::Runtime = Box::leak(Box::new(runtime));
    CURRENT.store(std::ptr::from_ref(runtime).cast_mut(), Ordering::Release);
    OWNER.store(pid, Ordering::Release);
    runtime
}
