//! Shared folders across real processes (`access = "shared"`): child processes (this test
//! binary, running the ignored `fleet_worker`) store their own and common pages in one set of
//! folders at the same moment, read each other's, remove some, under a capacity a third of
//! what they write. Every hit must be byte-exact, the folders must stay under the capacity
//! plus one eviction step at every sample, each process must see the others' pages, and at
//! most one process may evict at a time. A second test kills the evictor with SIGKILL while
//! it holds the lease, and a writer in the middle of its writes: another process takes the
//! lease over once it expires, nothing torn is served, and no temp file outlives a restart. The
//! soak runs them in waves through restarts, threads, clears and mixed checksum settings on
//! GlusterFS, and checks the usage count at the end.

mod folder;
mod prefix;
mod soak;
mod watch;
mod worker;

/// The child processes' entry: does nothing unless the parent set `KVTIER_FLEET_DIR` (see
/// [`worker::run`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the fleet tests as their child processes"]
async fn fleet_worker() {
    if let Ok(dir) = std::env::var("KVTIER_FLEET_DIR") {
        worker::run(dir).await;
    }
}
