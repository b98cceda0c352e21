//! Bounded I/O: whether a call on the folders may give up waiting for their file I/O, and
//! the bound itself.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tier_core::TierError;

/// Whether the tier may give up waiting for its file I/O (in config files: `bounded_io`).
///
/// A page read in place lands straight in the caller's memory, so it must be waited out: on a
/// mount that hangs (a network filesystem whose server is gone, a FUSE daemon that stopped)
/// the call never returns. Bounded I/O runs on threads of its own over memory of its own:
/// reads land in staging buffers and are copied out, and the call gives up after
/// `transfer_timeout` with [`TierError::Timeout`], leaving the stuck thread its memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundedIo {
    /// Bounded on filesystems that can hang (network and FUSE: any but ext2/3/4, XFS, Btrfs,
    /// tmpfs, ZFS, overlayfs, ramfs), in place on local ones.
    #[default]
    Auto,
    /// Always bounded: a copy per page read, and no call outlasts `transfer_timeout`.
    On,
    /// Never: reads in place, waited out however long the kernel takes.
    Off,
}

impl BoundedIo {
    /// Whether calls on folders `dirs` are bounded: under `Auto`, if any of them is on a
    /// filesystem that can hang ([`crate::probe::may_hang`]).
    pub fn applies_to(self, dirs: &[PathBuf]) -> bool {
        match self {
            Self::On => true,
            Self::Off => false,
            Self::Auto => dirs.iter().any(|d| crate::probe::may_hang(d)),
        }
    }
}

/// `work`, given up after `after` with a [`TierError::Timeout`] naming `op` where `bounded`;
/// awaited however long it takes otherwise. What `work` runs on other threads goes on there.
pub async fn bound<R>(
    bounded: bool,
    after: Duration,
    op: &'static str,
    work: impl Future<Output = Result<R, TierError>>,
) -> Result<R, TierError> {
    if !bounded {
        return work.await;
    }
    tokio::time::timeout(after, work)
        .await
        .unwrap_or(Err(TierError::Timeout { op, after }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bounded call that outlasts its bound answers a timeout naming its operation; an
    /// unbounded one, or one within its bound, answers what its work gives.
    #[tokio::test]
    async fn a_bounded_call_gives_up_after_its_bound_and_only_then() {
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, TierError>(7)
        };
        let after = Duration::from_millis(50);
        let started = std::time::Instant::now();
        let given_up = bound(true, after, "file read", slow()).await;
        assert!(
            matches!(
                given_up,
                Err(TierError::Timeout {
                    op: "file read",
                    ..
                })
            ),
            "{given_up:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(250),
            "it waited the work out"
        );
        assert_eq!(bound(false, after, "file read", slow()).await.ok(), Some(7));
        let long = Duration::from_secs(5);
        assert_eq!(bound(true, long, "file read", slow()).await.ok(), Some(7));
    }

    #[test]
    fn on_and_off_apply_whatever_the_folders_and_auto_only_where_they_may_hang() {
        let local = vec![std::env::temp_dir()];
        assert!(BoundedIo::On.applies_to(&local));
        assert!(!BoundedIo::Off.applies_to(&local));
        assert_eq!(
            BoundedIo::Auto.applies_to(&local),
            crate::probe::may_hang(&local[0])
        );
    }
}
