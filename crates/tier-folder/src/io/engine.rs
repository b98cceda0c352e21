//! The I/O engine: what moves a batch of pages between memory and their files. The folder
//! cache hands an engine whole batches; kvtier's own [`Syscalls`] is one, NIXL's FILE backend
//! (in `tier-nixl`) another.

use super::{move_by_syscalls, BatchOutcome, Xfer, XferOp};
use crate::{checksum, FolderMode};

/// Moves batches of pages between memory and their files. `M` holds a batch's memory for the
/// engine while it may be moved (NIXL's registrations; nothing for system calls).
pub trait PageEngine<M: ?Sized>: Send + Sync {
    /// What the engine is, for errors: "syscalls", "nixl POSIX (path mode)".
    fn describe(&self) -> String;

    /// Moves every item (each page's parts at the addresses in `memory`) and answers each; a
    /// batch some of whose moves may outlive the call is `poisoned`.
    fn move_all(&self, op: XferOp, items: &[Xfer], memory: &M) -> BatchOutcome;

    /// Reads every item as [`move_all`](Self::move_all) does, and puts the CRC-32C of each
    /// buffered page not `skip`ped in `hashed`, taken as its bytes land.
    fn read_hashing(
        &self,
        items: &[Xfer],
        memory: &M,
        skip: &[bool],
        hashed: &mut [Option<u32>],
    ) -> BatchOutcome;

    /// Whether a read answers for the very file the engine opened (one replaced under its name
    /// meanwhile is seen), or its caller must compare the file's identity before and after.
    fn reads_what_it_opens(&self) -> bool;
}

/// kvtier's own engine: each page moved by `preadv`/`pwritev` on the calling thread (see
/// [`move_by_syscalls`]); no memory to hold.
#[derive(Debug, Clone, Copy)]
pub struct Syscalls {
    /// Writes are synchronous (`O_DSYNC`).
    pub sync: bool,
    /// Who may use the files written (their mode).
    pub mode: FolderMode,
}

impl<M: ?Sized> PageEngine<M> for Syscalls {
    fn describe(&self) -> String {
        "syscalls".into()
    }

    fn move_all(&self, op: XferOp, items: &[Xfer], _memory: &M) -> BatchOutcome {
        BatchOutcome {
            results: items
                .iter()
                .map(|item| move_by_syscalls(op, item, self.sync, self.mode, None))
                .collect(),
            poisoned: false,
        }
    }

    /// Each buffered page is checksummed as it is read, while its bytes are in cache
    /// (checksummed after a whole batch, 512 KiB pages read about a quarter slower, measured
    /// here).
    fn read_hashing(
        &self,
        items: &[Xfer],
        _memory: &M,
        skip: &[bool],
        hashed: &mut [Option<u32>],
    ) -> BatchOutcome {
        BatchOutcome {
            results: items
                .iter()
                .zip(skip)
                .zip(hashed.iter_mut())
                .map(|((item, &skip), crc)| {
                    let mut running = (!item.direct && !skip).then(checksum::Crc::new);
                    move_by_syscalls(XferOp::Read, item, self.sync, self.mode, running.as_mut())?;
                    *crc = running.map(|c| c.value());
                    Ok(())
                })
                .collect(),
            poisoned: false,
        }
    }

    /// The file it reads is the one it opened, checked for the page's length there.
    fn reads_what_it_opens(&self) -> bool {
        true
    }
}
