//! [`WriteOrder`]: per-key order for writes that may outlive their call.
//!
//! A tier whose writes run where a dropped call cannot stop them (a spawned task, a blocking
//! thread, a request the server already has) takes the keys' turn before it starts and moves
//! the [`OrderGuard`] into that work. A later put or remove of the same keys waits for the
//! turn, so a write whose caller gave up can never land over a newer one. A clear takes every
//! key's turn at once: it waits for the writes running, and writes of any key wait for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{
    Mutex as TurnLock, OwnedMutexGuard, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock,
};

use crate::PageKey;

#[derive(Default)]
struct Turns {
    /// One lock per key with a write running or waiting; gone when nobody holds it.
    keys: Mutex<HashMap<PageKey, Arc<TurnLock<()>>>>,
    /// Held shared by every turn of some keys, exclusively by a turn of all keys.
    all: Arc<RwLock<()>>,
}

/// See the module documentation.
#[derive(Default, Clone)]
pub struct WriteOrder {
    turns: Arc<Turns>,
}

/// The turn of some keys: later [`WriteOrder::turn`]s of them wait until it drops.
pub struct OrderGuard {
    turns: Arc<Turns>,
    held: Vec<(PageKey, OwnedMutexGuard<()>)>,
    _scope: Scope,
}

/// Whether a guard holds some keys (sharing the tier with other such guards) or all of them.
enum Scope {
    Some(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    All(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

impl WriteOrder {
    /// No write running.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits until no earlier write of `keys` runs, then holds their turn until the guard
    /// drops. Keys are taken in sorted order, so two batches never wait on each other in a
    /// cycle; a holder never takes a second turn (a turn of all keys waiting between the two
    /// would block both). Cancel-safe: dropped while waiting, it holds nothing.
    pub async fn turn(&self, keys: &[PageKey]) -> OrderGuard {
        let mut sorted: Vec<&PageKey> = keys.iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        let scope = Scope::Some(Arc::clone(&self.turns.all).read_owned().await);
        let mut guard = OrderGuard {
            turns: Arc::clone(&self.turns),
            held: Vec::with_capacity(sorted.len()),
            _scope: scope,
        };
        for key in sorted {
            let lock = Arc::clone(
                self.turns
                    .lock()
                    .entry(key.clone())
                    .or_insert_with(|| Arc::new(TurnLock::new(()))),
            );
            let held = lock.lock_owned().await;
            guard.held.push((key.clone(), held));
        }
        guard
    }

    /// Waits for every write running or waiting now, then holds every key's turn: later
    /// turns of any key wait until it drops (a clear, which may outlive its call, so a page
    /// put after a dropped clear is never deleted by it). Cancel-safe like [`Self::turn`].
    pub async fn turn_all(&self) -> OrderGuard {
        OrderGuard {
            turns: Arc::clone(&self.turns),
            held: Vec::new(),
            _scope: Scope::All(Arc::clone(&self.turns.all).write_owned().await),
        }
    }

    /// Keys with a write running or waiting now.
    pub fn busy_keys(&self) -> usize {
        self.turns.lock().len()
    }
}

impl Turns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PageKey, Arc<TurnLock<()>>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for OrderGuard {
    fn drop(&mut self) {
        let held = std::mem::take(&mut self.held);
        let mut keys = self.turns.lock();
        for (key, guard) in held {
            drop(guard);
            // Nobody else holds or waits for this key's lock: forget it.
            if keys
                .get(&key)
                .is_some_and(|lock| Arc::strong_count(lock) == 1)
            {
                keys.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn k(s: &str) -> PageKey {
        PageKey::new(s).unwrap()
    }

    #[tokio::test]
    async fn a_later_turn_waits_for_the_earlier_one_to_drop() {
        let order = WriteOrder::new();
        let first = order.turn(&[k("a"), k("b")]).await;
        let later = tokio::time::timeout(Duration::from_millis(50), order.turn(&[k("b")])).await;
        assert!(later.is_err(), "a turn of a busy key must wait");
        let other = tokio::time::timeout(Duration::from_millis(50), order.turn(&[k("c")])).await;
        assert!(other.is_ok(), "other keys do not wait");
        drop(other);
        drop(first);
        let again = tokio::time::timeout(Duration::from_millis(50), order.turn(&[k("b")])).await;
        assert!(again.is_ok(), "the turn is free once the guard drops");
        drop(again);
        assert_eq!(order.busy_keys(), 0, "idle keys are forgotten");
    }

    #[tokio::test]
    async fn a_guard_moved_into_a_task_holds_the_turn_past_a_dropped_call() {
        let order = WriteOrder::new();
        let guard = order.turn(&[k("a")]).await;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _guard = guard;
            let _ = rx.await;
        });
        let waiting = tokio::time::timeout(Duration::from_millis(50), order.turn(&[k("a")])).await;
        assert!(waiting.is_err());
        tx.send(()).unwrap();
        task.await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), order.turn(&[k("a")]))
                .await
                .is_ok()
        );
    }

    /// A clear dropped after it started deleted pages put after it: writes of keys no write
    /// was busy with did not wait for it.
    #[tokio::test]
    async fn the_turn_of_all_keys_waits_for_writes_and_holds_back_every_later_one() {
        let order = WriteOrder::new();
        let running = order.turn(&[k("a")]).await;
        let all = tokio::time::timeout(Duration::from_millis(50), order.turn_all()).await;
        assert!(
            all.is_err(),
            "a turn of all keys waits for the running write"
        );
        drop(running);
        let all = order.turn_all().await;
        let fresh = tokio::time::timeout(Duration::from_millis(50), order.turn(&[k("z")])).await;
        assert!(
            fresh.is_err(),
            "a write of a key nobody was busy with waits too"
        );
        drop(all);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), order.turn(&[k("z")]))
                .await
                .is_ok()
        );
    }
}
