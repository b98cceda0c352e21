//! The helper threads that move parts of big batches beside the calling thread.

use std::sync::OnceLock;

/// The threads that move the other parts of big batches while the calling thread moves the
/// first: started once, one per core, kept for the process (a thread started per batch often
/// began on its caller's core, and after an idle pause ran the batch up to half again slower);
/// `None` if none could be started.
fn io_helpers() -> Option<&'static rayon::ThreadPool> {
    static HELPERS: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    HELPERS
        .get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
                .thread_name(|_| "kvtier-io".into())
                .build()
                .ok()
        })
        .as_ref()
}

/// Runs `first` on the calling thread while the helper threads run `others`, and returns when
/// all are done: `first`'s result, and each other's or why it has none (it panicked or could
/// not run). Without helper threads, the others run after `first`, here.
pub(super) fn run_split<T: Send, F: FnOnce() -> T + Send>(
    first: impl FnOnce() -> T,
    others: Vec<F>,
) -> (T, Vec<Result<T, String>>) {
    let Some(helpers) = io_helpers() else {
        return (first(), others.into_iter().map(|f| Ok(f())).collect());
    };
    let mut results: Vec<Option<Result<T, String>>> = others.iter().map(|_| None).collect();
    let first = helpers.in_place_scope(|scope| {
        for (f, out) in others.into_iter().zip(results.iter_mut()) {
            scope.spawn(move |_| {
                *out = Some(
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                        .map_err(|_| "a kvtier-io helper thread panicked".to_string()),
                );
            });
        }
        first()
    });
    let others = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a kvtier-io helper did not run".to_string())))
        .collect();
    (first, others)
}
