//! What a tier keeps: its byte bound, its pages across a reopen, its counters.

use tier_core::{Lookup, PageKey};

use super::{
    exists, expect_pages, keys, not_applicable, open, page_len, put_all, read, versioned,
    CaseResult, TierFactory,
};
use crate::content;

/// A bounded tier never holds more bytes than its capacity once its puts and a flush have
/// returned (a flush waits for an eviction the tier runs beside its puts, as shared folders
/// and prefixes do; other tiers evict before a put returns and have nothing to flush),
/// counted independently by reading every page written (and by its own stats where it keeps
/// them); what it holds is exact.
pub async fn capacity_bound(f: &dyn TierFactory) -> CaseResult {
    const CAPACITY: u64 = 2 << 20;
    let Some(opened) = f.open_bounded(CAPACITY).await else {
        // A tier that claims a capacity must give the means to test it.
        let claimed = open(f).await?.info().capacity_bytes;
        if let Some(capacity) = claimed {
            return Err(format!(
                "the tier reports a capacity of {capacity} bytes, but its factory opens no bounded tier to test it"
            ));
        }
        not_applicable("the tier has no byte bound (its factory opens no bounded tier)");
        return Ok(());
    };
    let tier = opened.map_err(|e| format!("could not open a bounded tier: {e}"))?;
    if tier.info().capacity_bytes != Some(CAPACITY) {
        return Err(format!(
            "bounded tier reports capacity {:?}, want {CAPACITY}",
            tier.info().capacity_bytes
        ));
    }
    let len = page_len(&tier, 64 << 10);
    let ks = keys("cap", (3 * CAPACITY as usize) / len);
    let mut written = Vec::new();
    for chunk in ks.chunks(8) {
        let pages = versioned(chunk, 1, len);
        put_all(&tier, &pages, 8).await?;
        tier.flush()
            .await
            .map_err(|e| format!("flush of a bounded tier failed: {e}"))?;
        written.extend(pages);
        let want: Vec<(PageKey, usize)> = written.iter().map(|(k, _, l)| (k.clone(), *l)).collect();
        let (bufs, results) = read(&tier, &want).await?;
        let mut held = 0u64;
        for (((key, version, _), buf), r) in written.iter().zip(&bufs).zip(results) {
            match r {
                Ok(Lookup::Hit) => {
                    content::verify(key, *version, buf)?;
                    held += buf.len() as u64;
                }
                Ok(Lookup::Miss) => {}
                Err(e) => return Err(format!("get in a bounded tier failed: {e}")),
            }
        }
        if held > CAPACITY {
            return Err(format!(
                "tier holds {held} readable bytes, over its capacity of {CAPACITY}"
            ));
        }
        if let Some(resident) = tier.stats().resident_bytes.filter(|r| *r > CAPACITY) {
            return Err(format!(
                "tier reports {resident} resident bytes, over its capacity of {CAPACITY}"
            ));
        }
        if held == 0 {
            return Err("a bounded tier holds nothing after a put".into());
        }
    }
    Ok(())
}

/// A persistent tier's pages survive dropping and reopening it.
pub async fn persistence(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    if !tier.info().persistent {
        not_applicable("the tier is not persistent");
        return Ok(());
    }
    let len = page_len(&tier, 64 << 10);
    let pages = versioned(&keys("persist", 32), 4, len);
    put_all(&tier, &pages, 16).await?;
    tier.flush()
        .await
        .map_err(|e| format!("flush before the reopen: {e}"))?;
    drop(tier);
    let tier = open(f).await?;
    expect_pages(&tier, &pages, 16).await?;
    let keys: Vec<PageKey> = pages.iter().map(|(k, _, _)| k.clone()).collect();
    let n = exists(&tier, &keys).await?;
    if n != keys.len() {
        return Err(format!("after reopen exists gave {n} of {}", keys.len()));
    }
    Ok(())
}

/// Counters move by exactly what was done.
pub async fn stats_count(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 8 << 10);
    let ks = keys("stat", 4);
    let s0 = tier.stats();
    put_all(&tier, &versioned(&ks[..3], 1, len), 3).await?;
    let want = [
        (ks[0].clone(), len),
        (ks[1].clone(), len),
        (ks[3].clone(), len),
        (ks[2].clone(), len + 1),
    ];
    read(&tier, &want).await?;
    tier.remove(&ks[..1]).await;
    let s1 = tier.stats();
    let deltas = [
        ("puts", s1.puts - s0.puts, 3),
        (
            "bytes_written",
            s1.bytes_written - s0.bytes_written,
            3 * len as u64,
        ),
        ("hits", s1.hits - s0.hits, 2),
        ("bytes_read", s1.bytes_read - s0.bytes_read, 2 * len as u64),
        ("misses", s1.misses - s0.misses, 1),
        ("errors", s1.errors - s0.errors, 1),
        ("removes", s1.removes - s0.removes, 1),
    ];
    for (name, got, want) in deltas {
        if got != want {
            return Err(format!("stats.{name} moved by {got}, want {want}"));
        }
    }
    Ok(())
}
