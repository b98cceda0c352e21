//! Every call dropped at each of its await points in turn.
//!
//! For each kind of call (a put of new keys, an overwrite, a get that hits, a get that hits
//! and misses, `exists`, `remove`, `clear`), the call is started on a known state and dropped
//! after 0 polls, then after 1, 2, ... until it finishes before its turn to be dropped comes.
//! After each drop:
//!
//! - a read of the keys finishes within [`AFTER_DROP`] (the dropped call holds nothing later
//!   calls wait for), and finds what the dropped call may have left: per key, the state before
//!   it or the state after it, a whole page either way;
//! - a new version put over the keys is what reads see, also after a pause long enough for any
//!   work the dropped call left running to finish (nothing of it lands later).
//!
//! The descriptors the process holds are counted around the whole sweep by the caller.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};

use crate::content;

/// Bound on each call made after a drop: past it, the dropped call blocked the tier.
pub const AFTER_DROP: Duration = Duration::from_secs(30);
/// Polls past which a call is no longer dropped but run to its end (a tier that polls this
/// often per call has had every drop point up to here tried).
const MAX_POLLS: u32 = 300;
/// Pause before the final read, for work a dropped call left running to land (if it would).
const SETTLE: Duration = Duration::from_millis(30);

/// A kind of call dropped at each await point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// A put of keys not stored yet.
    PutNew,
    /// A put over stored keys.
    Overwrite,
    /// A get of stored keys.
    GetHit,
    /// A get of a stored and an absent key.
    GetMixed,
    /// `exists` of stored keys.
    Exists,
    /// A remove of stored keys.
    Remove,
    /// `clear`.
    Clear,
}

impl Call {
    /// Every kind, in the order the sweep runs them.
    pub const ALL: [Call; 7] = [
        Call::PutNew,
        Call::Overwrite,
        Call::GetHit,
        Call::GetMixed,
        Call::Exists,
        Call::Remove,
        Call::Clear,
    ];

    /// Whether the call may leave a stored key absent (it happened).
    fn may_remove(self) -> bool {
        matches!(self, Call::Remove | Call::Clear)
    }

    /// Whether the call may leave a key at version 2 (it happened).
    fn writes(self) -> bool {
        matches!(self, Call::PutNew | Call::Overwrite)
    }
}

/// Where a dropped call is dropped: after its `polls`th poll, at once (suspended at that
/// await point, what it waits for still pending) or at the wake that follows (what it waited
/// for has happened, the call has not seen it yet).
#[derive(Debug, Clone, Copy)]
struct DropPoint {
    polls: u32,
    woken: bool,
}

/// Runs `fut` up to `at`: whether it finished first (`false`: dropped there), or an error if
/// it hung past [`AFTER_DROP`].
async fn drop_at<F: Future>(at: DropPoint, fut: F) -> Result<bool, String> {
    let mut fut = std::pin::pin!(fut);
    let mut polled = 0;
    let counted = std::future::poll_fn(|cx| {
        if polled == at.polls {
            return Poll::Ready(false);
        }
        polled += 1;
        match fut.as_mut().poll(cx) {
            Poll::Ready(_) => Poll::Ready(true),
            Poll::Pending if polled == at.polls && !at.woken => Poll::Ready(false),
            Poll::Pending => Poll::Pending,
        }
    });
    tokio::time::timeout(AFTER_DROP, counted)
        .await
        .map_err(|_| format!("the call did not finish within {AFTER_DROP:?}"))
}

/// What one key holds now: a whole version (of `versions`), absent, or a problem.
async fn read_version(
    tier: &dyn StorageTier,
    key: &PageKey,
    len: usize,
    versions: &[u64],
) -> Result<Option<u64>, String> {
    let mut buf = vec![0u8; len];
    let got = tokio::time::timeout(
        AFTER_DROP,
        tier.get(&mut [ReadSlot::new(key.clone(), &mut buf)]),
    )
    .await
    .map_err(|_| format!("a get of {key} did not finish within {AFTER_DROP:?}"))?;
    match got.as_slice() {
        [Ok(Lookup::Hit)] => versions
            .iter()
            .find(|&&v| content::verify(key, v, &buf).is_ok())
            .map(|&v| Some(v))
            .ok_or_else(|| {
                format!(
                    "{key} reads as a hit on bytes of no version {versions:?} (torn or foreign)"
                )
            }),
        [Ok(Lookup::Miss)] => Ok(None),
        other => Err(format!("a get of {key} gave {other:?}")),
    }
}

async fn put_version(
    tier: &dyn StorageTier,
    keys: &[PageKey],
    version: u64,
    len: usize,
) -> Result<(), String> {
    let pages: Vec<Page<'static>> = keys
        .iter()
        .map(|k| Page::new(k.clone(), content::page(k, version, len)))
        .collect();
    let results = tokio::time::timeout(AFTER_DROP, tier.put(&pages))
        .await
        .map_err(|_| format!("a put did not finish within {AFTER_DROP:?}"))?;
    match results.iter().find(|r| r.is_err()) {
        Some(err) => Err(format!("a put of version {version} failed: {err:?}")),
        None if results.len() == keys.len() => Ok(()),
        None => Err(format!(
            "a put of {} pages gave {} results",
            keys.len(),
            results.len()
        )),
    }
}

/// Drops `call` at each await point in turn on `tier`, pages `len` bytes long, keys named
/// from `prefix`. `may_lose`: the tier may evict, so a page may also read as absent. Returns
/// how many polls the call took when it finished undropped.
pub async fn each_await_point(
    tier: &dyn StorageTier,
    call: Call,
    prefix: &str,
    len: usize,
    may_lose: bool,
) -> Result<u32, String> {
    let points =
        (0..=MAX_POLLS).flat_map(|polls| [false, true].map(|woken| DropPoint { polls, woken }));
    for (round, point) in points.enumerate() {
        let names: Vec<PageKey> = ["a", "b", "c"]
            .iter()
            .map(|n| PageKey::new(format!("{prefix}{round:03}{n}")).expect("valid key"))
            .collect();
        let (stored, absent) = (&names[..2], &names[2]);
        let at = |what: String| {
            let when = if point.woken {
                ", at the wake after"
            } else {
                ""
            };
            format!("{call:?} dropped after {} polls{when}: {what}", point.polls)
        };
        if call != Call::PutNew {
            put_version(tier, stored, 1, len).await.map_err(at)?;
        }
        let pages: Vec<Page<'static>> = stored
            .iter()
            .map(|k| Page::new(k.clone(), content::page(k, 2, len)))
            .collect();
        let mut bufs = vec![vec![0u8; len]; 2];
        let finished = match call {
            Call::PutNew | Call::Overwrite => drop_at(point, tier.put(&pages)).await,
            Call::GetHit | Call::GetMixed => {
                let keys = if call == Call::GetHit {
                    stored.to_vec()
                } else {
                    vec![stored[0].clone(), absent.clone()]
                };
                let mut slots: Vec<ReadSlot<'_>> = keys
                    .into_iter()
                    .zip(bufs.iter_mut())
                    .map(|(k, b)| ReadSlot::new(k, b))
                    .collect();
                drop_at(point, tier.get(&mut slots)).await
            }
            Call::Exists => drop_at(point, tier.exists(stored)).await,
            Call::Remove => drop_at(point, tier.remove(stored)).await,
            Call::Clear => drop_at(point, tier.clear()).await,
        }
        .map_err(at)?;
        // What the dropped (or finished) call may have left, per stored key.
        for key in stored {
            let before = if call == Call::PutNew { None } else { Some(1) };
            let found = read_version(tier, key, len, &[1, 2]).await.map_err(at)?;
            let allowed = found == before
                || (call.writes() && found == Some(2))
                || ((call.may_remove() || may_lose) && found.is_none());
            if !allowed {
                return Err(at(format!(
                    "{key} holds {found:?}: neither what it held before ({before:?}) nor what the call leaves"
                )));
            }
        }
        if let Some(v) = read_version(tier, absent, len, &[1, 2]).await.map_err(at)? {
            return Err(at(format!("{absent}, never put, reads as version {v}")));
        }
        // Later calls see only what they did.
        put_version(tier, stored, 3, len).await.map_err(at)?;
        tokio::time::sleep(SETTLE).await;
        for key in stored {
            match read_version(tier, key, len, &[1, 2, 3]).await.map_err(at)? {
                Some(3) => {}
                None if may_lose => {}
                other => {
                    return Err(at(format!(
                        "{key} holds {other:?} after version 3 was put over it (the dropped call landed later)"
                    )))
                }
            }
        }
        let _ = tokio::time::timeout(AFTER_DROP, tier.remove(&names)).await;
        if finished {
            return Ok(point.polls);
        }
    }
    Ok(MAX_POLLS)
}
