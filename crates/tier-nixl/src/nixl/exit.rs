//! NIXL and the process's exit. `exit` (a return from `main`, `sys.exit` in Python) destroys
//! NIXL's C++ statics (its plugin manager, its plugins' globals) while other threads may still
//! be in NIXL, and a tier dropped after that (by a thread, an `atexit` handler, a static's
//! destructor) tears down an agent whose statics are gone: a use after free, the process dead
//! of SIGSEGV after it did everything right.
//!
//! Every call into NIXL is counted while it runs ([`enter`]). A handler registered with
//! `atexit` once NIXL has made its statics (so it runs before they are destroyed) closes the
//! door: it waits for the calls under way, at most [`EXIT_WAIT`]; no call reaches NIXL after
//! that. A teardown is skipped (the process is ending: nothing outlives it); a new call fails;
//! a transfer's thread that could only go on into NIXL waits for the exit to end it
//! ([`stay`]), touching nothing.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use super::NixlError;

/// How long the exit waits for calls into NIXL under way.
pub const EXIT_WAIT: Duration = Duration::from_secs(2);

/// Calls into NIXL under way, and [`CLOSED`] once the process exits.
static CALLS: AtomicUsize = AtomicUsize::new(0);
const CLOSED: usize = 1 << (usize::BITS - 1);

/// The thread that runs the exit (0 before).
static EXITING: AtomicI32 = AtomicI32::new(0);

/// What NIXL had made when the handler was registered: registered again after each first
/// (an agent makes the plugin manager, a backend loads a plugin and its globals, a transfer
/// may start a plugin's queues), so it runs before any of them is destroyed.
#[derive(Debug, Clone, Copy)]
pub(super) enum Made {
    Agent,
    Backend,
    Transfer,
}

static REGISTERED: [Once; 3] = [Once::new(), Once::new(), Once::new()];

/// Registers the exit's handler after the first `made` of this process.
pub(super) fn watch(made: Made) {
    REGISTERED[made as usize].call_once(|| {
        // SAFETY: registers a plain function taking nothing; it runs once the process exits.
        if unsafe { libc::atexit(close) } != 0 {
            tracing::warn!(
                "could not register NIXL's exit guard: a tier dropped at exit may crash"
            );
        }
    });
}

/// A call into NIXL under way: the exit waits for it.
pub(super) struct Call(());

impl Drop for Call {
    fn drop(&mut self) {
        CALLS.fetch_sub(1, Ordering::Release);
    }
}

/// A call into NIXL may begin: `None` once the process exits.
pub(super) fn enter() -> Option<Call> {
    if CALLS.fetch_add(1, Ordering::Acquire) & CLOSED != 0 {
        CALLS.fetch_sub(1, Ordering::Release);
        return None;
    }
    Some(Call(()))
}

/// [`enter`], or the error of a call refused because the process exits.
pub(super) fn enter_or(call: &'static str) -> Result<Call, NixlError> {
    enter().ok_or_else(|| NixlError {
        call,
        status: 0,
        detail: "the process is exiting: NIXL is no longer called".into(),
    })
}

/// For a thread that can go on only by calling NIXL once the process exits (a transfer whose
/// I/O may still touch its memory): waits for the exit to end the process, unless it runs the
/// exit itself (then returns, and the caller keeps what the transfer holds).
pub(super) fn stay() {
    // SAFETY: gettid takes nothing and cannot fail.
    let me = unsafe { libc::gettid() };
    if EXITING.load(Ordering::Acquire) != me {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

/// The `atexit` handler: closes the door, waits for the calls under way (bounded).
extern "C" fn close() {
    // SAFETY: as in `stay`.
    EXITING.store(unsafe { libc::gettid() }, Ordering::Release);
    CALLS.fetch_or(CLOSED, Ordering::AcqRel);
    let deadline = Instant::now() + EXIT_WAIT;
    while CALLS.load(Ordering::Acquire) & !CLOSED != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}
