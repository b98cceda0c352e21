//! The calls one by one: per-key batch outcomes, prefix `exists`, overwrite, remove, clear, and
//! writers racing on the same keys.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tier_core::{Lookup, Page, PageKey, TierError};

use super::{
    exists, expect_misses, expect_pages, keys, open, page_len, put_all, read, versioned,
    CaseResult, TierFactory,
};
use crate::content;

/// A batch with absent keys: each key gets its own hit or miss, hits byte-exact.
pub async fn partial_batch(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("part", 16);
    let present: Vec<(PageKey, u64, usize)> =
        ks.iter().step_by(2).map(|k| (k.clone(), 3, len)).collect();
    put_all(&tier, &present, 8).await?;
    let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), len)).collect();
    let (bufs, results) = read(&tier, &want).await?;
    for (i, ((key, buf), result)) in ks.iter().zip(&bufs).zip(results).enumerate() {
        match (i % 2 == 0, result) {
            (true, Ok(Lookup::Hit)) => content::verify(key, 3, buf)?,
            (false, Ok(Lookup::Miss)) => {}
            (stored, other) => {
                return Err(format!(
                    "page {key} (stored: {stored}) in a mixed batch gave {other:?}"
                ))
            }
        }
    }
    Ok(())
}

/// `exists` returns the length of the leading run of present keys.
pub async fn exists_prefix(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 4 << 10);
    let k = keys("pre", 6);
    put_all(
        &tier,
        &versioned(
            &[k[0].clone(), k[1].clone(), k[2].clone(), k[4].clone()],
            1,
            len,
        ),
        8,
    )
    .await?;
    let cases: [(Vec<PageKey>, usize); 6] = [
        (k.clone(), 3),
        (vec![k[3].clone(), k[0].clone()], 0),
        (vec![], 0),
        (vec![k[0].clone()], 1),
        (
            vec![
                k[4].clone(),
                k[0].clone(),
                k[1].clone(),
                k[5].clone(),
                k[2].clone(),
            ],
            3,
        ),
        (vec![k[5].clone()], 0),
    ];
    for (query, want) in cases {
        let got = exists(&tier, &query).await?;
        if got != want {
            return Err(format!("exists over {query:?} gave {got}, want {want}"));
        }
    }
    Ok(())
}

/// A later write replaces an earlier one whole, whatever its length, also within one batch.
pub async fn overwrite(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 64 << 10);
    let ks = keys("over", 4);
    put_all(&tier, &versioned(&ks, 1, len), 4).await?;
    put_all(&tier, &versioned(&ks, 2, len), 4).await?;
    expect_pages(&tier, &versioned(&ks, 2, len), 4).await?;
    // Shorter replacement: no stale tail, and the old length no longer fits.
    let short = len / 2;
    put_all(&tier, &versioned(&ks[..1], 3, short), 1).await?;
    expect_pages(&tier, &versioned(&ks[..1], 3, short), 1).await?;
    let (_, results) = read(&tier, &[(ks[0].clone(), len)]).await?;
    match &results[0] {
        Err(TierError::LengthMismatch { stored, .. }) if *stored == short => {}
        other => {
            return Err(format!(
                "reading a shrunk page with its old length gave {other:?}"
            ))
        }
    }
    // Same key twice in one batch: the later entry wins.
    let batch = vec![
        Page::new(ks[1].clone(), content::page(&ks[1], 4, len)),
        Page::new(ks[1].clone(), content::page(&ks[1], 5, len)),
    ];
    for r in tier.put(&batch).await {
        r.map_err(|e| format!("put of a duplicated key failed: {e}"))?;
    }
    expect_pages(&tier, &[(ks[1].clone(), 5, len)], 1).await?;
    // A valid page, then an empty copy of the same key: the empty one fails alone, and the
    // page reported stored is stored.
    let batch = [
        Page::new(ks[2].clone(), content::page(&ks[2], 6, len)),
        Page::new(ks[2].clone(), Vec::<u8>::new()),
    ];
    let results = tier.put(&batch).await;
    match results.as_slice() {
        [Ok(()), Err(TierError::EmptyPage { .. })] => {}
        other => return Err(format!("put of [page, empty copy] gave {other:?}")),
    }
    expect_pages(&tier, &[(ks[2].clone(), 6, len)], 1)
        .await
        .map_err(|e| format!("a page reported stored beside an empty copy of its key: {e}"))
}

/// Removing reports presence per key and leaves neighbours intact; a removed key can be
/// stored again.
pub async fn remove(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("rm", 4);
    let absent = keys("rm-absent", 1);
    put_all(&tier, &versioned(&ks, 1, len), 4).await?;
    let query = [ks[1].clone(), ks[3].clone(), absent[0].clone()];
    let got: Vec<String> = tier
        .remove(&query)
        .await
        .into_iter()
        .map(|r| format!("{r:?}"))
        .collect();
    if got != ["Ok(true)", "Ok(true)", "Ok(false)"] {
        return Err(format!("remove of [present, present, absent] gave {got:?}"));
    }
    expect_misses(&tier, &query[..2], len).await?;
    expect_pages(
        &tier,
        &versioned(&[ks[0].clone(), ks[2].clone()], 1, len),
        2,
    )
    .await?;
    let again: Vec<String> = tier
        .remove(&query[..1])
        .await
        .into_iter()
        .map(|r| format!("{r:?}"))
        .collect();
    if again != ["Ok(false)"] {
        return Err(format!("removing a removed page gave {again:?}"));
    }
    put_all(&tier, &versioned(&ks[1..2], 2, len), 1).await?;
    expect_pages(&tier, &versioned(&ks[1..2], 2, len), 1).await
}

/// `clear` empties the tier, which stays usable.
pub async fn clear(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("clr", 8);
    put_all(&tier, &versioned(&ks, 1, len), 8).await?;
    tier.clear()
        .await
        .map_err(|e| format!("clear failed: {e}"))?;
    expect_misses(&tier, &ks, len).await?;
    let n = exists(&tier, &ks).await?;
    if n != 0 {
        return Err(format!("exists after clear gave {n}"));
    }
    put_all(&tier, &versioned(&ks[..2], 2, len), 2).await?;
    expect_pages(&tier, &versioned(&ks[..2], 2, len), 2).await
}

/// Four writers and two readers on the same eight keys: every read is exactly one written
/// version, never a torn or mixed page.
pub async fn concurrent_writers(f: &dyn TierFactory) -> CaseResult {
    const WRITERS: u64 = 4;
    const ROUNDS: u64 = 6;
    let tier = open(f).await?;
    let len = page_len(&tier, 64 << 10);
    let ks = keys("conc", 8);
    put_all(&tier, &versioned(&ks, 0, len), 8).await?;
    let mut versions = vec![0];
    versions.extend((0..WRITERS).flat_map(|w| (0..ROUNDS).map(move |r| 1 + w * 100 + r)));
    let versions = Arc::new(versions);
    // Per writer, the rounds whose puts have returned: a read that begins after writer w's
    // round r returned may see another writer's page or a later one of w's, never an older
    // one of w's (w's puts run one after another), nor the initial version.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());

    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let (tier, ks, acked) = (tier.clone(), ks.clone(), acked.clone());
        tasks.spawn(async move {
            for r in 0..ROUNDS {
                let mut order = ks.clone();
                let shift = ((w + r) as usize) % order.len();
                order.rotate_left(shift);
                let pages = versioned(&order, 1 + w * 100 + r, len);
                put_all(&tier, &pages, 3).await?;
                acked[w as usize].store(r + 1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
            Ok(())
        });
    }
    for _ in 0..2 {
        let (tier, ks, versions, acked) =
            (tier.clone(), ks.clone(), versions.clone(), acked.clone());
        tasks.spawn(async move {
            for _ in 0..(ROUNDS * 2) {
                let done: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
                let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), len)).collect();
                let (bufs, results) = read(&tier, &want).await?;
                for ((key, buf), result) in ks.iter().zip(&bufs).zip(results) {
                    match result {
                        Ok(Lookup::Hit) => match content::which_version(key, &versions, buf) {
                            Some(0) if done.iter().any(|&d| d > 0) => {
                                return Err(format!(
                                    "page {key} read back its initial version after a writer's put of it returned (stale)"
                                ))
                            }
                            Some(v) if v > 0 && (v - 1) % 100 + 1 < done[((v - 1) / 100) as usize] => {
                                let (w, r) = ((v - 1) / 100, (v - 1) % 100);
                                return Err(format!(
                                    "page {key} read back writer {w}'s round {r} after its round {} had returned (stale)",
                                    done[w as usize] - 1
                                ));
                            }
                            Some(_) => {}
                            None => return Err(format!("page {key} read back torn or mixed")),
                        },
                        other => {
                            return Err(format!(
                                "page {key} under concurrent writes gave {other:?}"
                            ))
                        }
                    }
                }
                tokio::task::yield_now().await;
            }
            Ok(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| format!("a concurrent task panicked: {e}"))??;
    }
    // Settled: each key holds one final version, read twice the same, and it is one writer's
    // last: every writer's last round wrote every key, so anything older is a lost update.
    let last: Vec<u64> = (0..WRITERS).map(|w| 1 + w * 100 + ROUNDS - 1).collect();
    let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), len)).collect();
    let (first, _) = read(&tier, &want).await?;
    let (second, _) = read(&tier, &want).await?;
    for ((key, a), b) in ks.iter().zip(&first).zip(&second) {
        if a != b || content::which_version(key, &versions, a).is_none() {
            return Err(format!(
                "page {key} is unstable or invalid after writers finished"
            ));
        }
        if content::which_version(key, &last, a).is_none() {
            return Err(format!(
                "page {key} holds version {:?} after the writers finished, not one writer's last (stale: a lost update)",
                content::which_version(key, &versions, a)
            ));
        }
    }
    Ok(())
}
