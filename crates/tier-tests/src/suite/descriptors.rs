//! Open file descriptors around every kind of call, succeeding and failing.

use std::future::Future;
use std::time::Duration;

use tier_core::{Lookup, Page, PageKey, TierError};

use super::{keys, not_applicable, open, page_len, read, CaseResult, DynTier, TierFactory};
use crate::{content, fd};

/// Open file descriptors counted before and after ten rounds of each operation kind,
/// successful and failing; any growth fails.
pub async fn fd_leak(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("fd", 4);
    let absent = keys("fd-absent", 2);
    // Each call with the outcome it must have on its first run (in this order), so the fds
    // are counted around calls that did what they should.
    let ops: Vec<(&str, Op, &str)> = vec![
        ("put", Op::Put(ks[..2].to_vec(), len), "ok ok"),
        ("put overwrite", Op::Put(ks[..2].to_vec(), len), "ok ok"),
        ("get hit", Op::Get(ks[..2].to_vec(), len), "hit hit"),
        ("get miss", Op::Get(absent.clone(), len), "miss miss"),
        (
            "get length mismatch",
            Op::Get(ks[..1].to_vec(), len + 1),
            "mismatch",
        ),
        ("put empty page", Op::Put(ks[2..3].to_vec(), 0), "err"),
        ("exists", Op::Exists(ks.clone()), "2"),
        (
            "remove present",
            Op::PutRemove(ks[3..].to_vec(), len),
            "true",
        ),
        ("remove absent", Op::Remove(absent.clone()), "false false"),
        ("clear", Op::Clear, "ok"),
    ];
    // Warm-up: lazily created resources (pools, registrations) are not leaks.
    for (name, op, want) in &ops {
        let got = op.run(&tier).await;
        if got != *want {
            return Err(format!(
                "fd_leak's `{name}` answered {got:?}, want {want:?}"
            ));
        }
    }
    let slack = f.fd_slack();
    let rounds = 10 + 2 * slack;
    for (name, op, _) in &ops {
        count_fds_around(name, rounds, slack, || async {
            op.run(&tier).await;
        })
        .await?;
    }
    if let Some(what) = f.break_storage().await {
        let broken = vec![
            ("put", Op::Put(ks.clone(), len)),
            ("get", Op::Get(ks.clone(), len)),
            ("exists", Op::Exists(ks.clone())),
            ("remove", Op::Remove(ks.clone())),
        ];
        for (name, op) in &broken {
            let got = op.run(&tier).await;
            // A put into broken storage must fail (the fds are counted around failing calls).
            if *name == "put" && got != "err err err err" {
                return Err(format!(
                    "a put after {what} answered {got:?}, want every page to fail"
                ));
            }
        }
        for (name, op) in &broken {
            let label = format!("{name} after {what}");
            count_fds_around(&label, rounds, slack, || async {
                op.run(&tier).await;
            })
            .await?;
        }
    } else {
        not_applicable(
            "descriptors around calls after the storage breaks: this tier's factory cannot break its storage",
        );
    }
    Ok(())
}

async fn count_fds_around<F, Fut>(name: &str, rounds: usize, slack: usize, mut op: F) -> CaseResult
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let before = open_fds()?;
    for _ in 0..rounds {
        op().await;
    }
    fds_back_to(before, slack, &format!("{rounds} rounds of `{name}`")).await
}

pub(super) fn open_fds() -> Result<usize, String> {
    fd::open_fds().map_err(|e| format!("cannot count fds: {e}"))
}

/// Whether the open descriptors came back to `before` (plus `slack`) after `what`.
pub(super) async fn fds_back_to(before: usize, slack: usize, what: &str) -> CaseResult {
    // Background work (a hierarchy's queued copies) may hold fds briefly: a leak is growth
    // that does not go away.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut after = open_fds()?;
    while after > before + slack && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        after = open_fds()?;
    }
    if after > before + slack {
        return Err(format!(
            "fd leak: {what} grew open fds from {before} to {after} (allowed: {slack})"
        ));
    }
    Ok(())
}

enum Op {
    Put(Vec<PageKey>, usize),
    Get(Vec<PageKey>, usize),
    Exists(Vec<PageKey>),
    PutRemove(Vec<PageKey>, usize),
    Remove(Vec<PageKey>),
    Clear,
}

impl Op {
    /// Runs the operation; its outcome in a few words (per key, or a count).
    async fn run(&self, tier: &DynTier) -> String {
        let put = |results: Vec<tier_core::PutResult>| -> Vec<String> {
            results
                .iter()
                .map(|r| if r.is_ok() { "ok" } else { "err" }.to_string())
                .collect()
        };
        let words: Vec<String> = match self {
            Op::Put(ks, len) => {
                let pages: Vec<Page<'static>> = ks
                    .iter()
                    .map(|k| Page::new(k.clone(), content::page(k, 1, *len)))
                    .collect();
                put(tier.put(&pages).await)
            }
            Op::Get(ks, len) => {
                let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), *len)).collect();
                match read(tier, &want).await {
                    Ok((_, results)) => results
                        .iter()
                        .map(|r| match r {
                            Ok(Lookup::Hit) => "hit",
                            Ok(Lookup::Miss) => "miss",
                            Err(TierError::LengthMismatch { .. }) => "mismatch",
                            Err(_) => "err",
                        })
                        .map(String::from)
                        .collect(),
                    Err(e) => vec![format!("failed: {e}")],
                }
            }
            Op::Exists(ks) => vec![match tier.exists(ks).await {
                Ok(n) => n.to_string(),
                Err(_) => "err".into(),
            }],
            Op::PutRemove(ks, len) => {
                let pages: Vec<Page<'static>> = ks
                    .iter()
                    .map(|k| Page::new(k.clone(), content::page(k, 1, *len)))
                    .collect();
                let _ = tier.put(&pages).await;
                removed(tier.remove(ks).await)
            }
            Op::Remove(ks) => removed(tier.remove(ks).await),
            Op::Clear => vec![if tier.clear().await.is_ok() {
                "ok"
            } else {
                "err"
            }
            .into()],
        };
        words.join(" ")
    }
}

fn removed(results: Vec<tier_core::RemoveResult>) -> Vec<String> {
    results
        .iter()
        .map(|r| match r {
            Ok(present) => present.to_string(),
            Err(_) => "err".into(),
        })
        .collect()
}
