//! Per-page integrity: distinct pages of many sizes and region shapes, every byte compared.

use std::collections::HashSet;

use tier_core::{Lookup, Page, PageKey, ReadSlot};

use super::{
    check_len, expect_pages, keys, open, page_len, put_all, read_page, versioned, CaseResult,
    TierFactory, PAGE,
};
use crate::content;

/// 256 distinct 64 KiB pages written in batches of 128, read back in batches of 100 into zeroed
/// buffers, every byte compared.
pub async fn integrity_batches(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, PAGE);
    let pages = versioned(&keys("int", 256), 1, len);
    let heads: HashSet<Vec<u8>> = pages
        .iter()
        .map(|(k, v, _)| content::page(k, *v, 16).to_vec())
        .collect();
    if heads.len() != pages.len() {
        return Err("suite bug: pages are not distinct".into());
    }
    put_all(&tier, &pages, 128).await?;
    expect_pages(&tier, &pages, 100).await
}

/// Pages of 4 KiB to 2 MiB, sizes interleaved within each batch.
pub async fn integrity_page_sizes(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let limit = tier.info().max_page_bytes.unwrap_or(usize::MAX);
    let sizes: Vec<usize> = [4 << 10, 16 << 10, 64 << 10, 512 << 10, 2 << 20]
        .into_iter()
        .filter(|s| *s <= limit)
        .collect();
    if sizes.is_empty() {
        return Err(format!(
            "the tier accepts no page of 4 KiB or more (limit {limit})"
        ));
    }
    let ks = keys("size", 8 * sizes.len());
    let pages: Vec<(PageKey, u64, usize)> = ks
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), 7, sizes[i % sizes.len()]))
        .collect();
    put_all(&tier, &pages, 16).await?;
    expect_pages(&tier, &pages, 13).await
}

/// Region boundaries of page `i` of `len` bytes under pattern `pattern`: one region, two
/// halves (an MHA page's K and V), or three uneven parts.
fn region_cuts(pattern: usize, len: usize) -> Vec<usize> {
    match pattern % 3 {
        0 => vec![len / 2],
        1 => vec![len / 3, len / 3 + (len / 3).min(4096) + 1],
        _ => vec![],
    }
}

fn split_at_cuts<'a>(mut buf: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let (mut out, mut at) = (Vec::new(), 0);
    for &cut in cuts {
        let (head, tail) = buf.split_at(cut - at);
        out.push(head);
        (buf, at) = (tail, cut);
    }
    out.push(buf);
    out
}

fn split_at_cuts_mut<'a>(mut buf: &'a mut [u8], cuts: &[usize]) -> Vec<&'a mut [u8]> {
    let (mut out, mut at) = (Vec::new(), 0);
    for &cut in cuts {
        let (head, tail) = buf.split_at_mut(cut - at);
        out.push(head);
        (buf, at) = (tail, cut);
    }
    out.push(buf);
    out
}

/// Pages of several regions lent from the caller's memory (an engine's K and V halves, or
/// uneven parts), put in one batch, read back into zeroed buffers split at other boundaries
/// and into one contiguous buffer: every byte equal, each page whole.
pub async fn integrity_regions(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, PAGE);
    let ks = keys("reg", 48);
    let contents: Vec<Vec<u8>> = ks
        .iter()
        .map(|k| content::page(k, 5, len).to_vec())
        .collect();
    let pages: Vec<Page<'_>> = ks
        .iter()
        .zip(&contents)
        .enumerate()
        .map(|(i, (k, c))| Page::lent(k.clone(), split_at_cuts(c, &region_cuts(i, len))))
        .collect();
    let results = tier.put(&pages).await;
    check_len(&results, pages.len(), "put")?;
    for (page, r) in pages.iter().zip(results) {
        r.map_err(|e| {
            format!(
                "put of {}-region page {} failed: {e}",
                page.data.regions().len(),
                page.key
            )
        })?;
    }
    drop(pages);
    let mut bufs: Vec<Vec<u8>> = ks.iter().map(|_| vec![0u8; len]).collect();
    let mut slots: Vec<ReadSlot<'_>> = ks
        .iter()
        .zip(bufs.iter_mut())
        .enumerate()
        .map(|(i, (k, b))| {
            ReadSlot::regions(k.clone(), split_at_cuts_mut(b, &region_cuts(i + 1, len)))
        })
        .collect();
    let results = tier.get(&mut slots).await;
    drop(slots);
    check_len(&results, ks.len(), "get")?;
    for ((key, buf), result) in ks.iter().zip(&bufs).zip(results) {
        match result {
            Ok(Lookup::Hit) => content::verify(key, 5, buf)
                .map_err(|e| format!("read into regions at other boundaries: {e}"))?,
            other => return Err(format!("multi-region page {key} read back as {other:?}")),
        }
    }
    for key in ks.iter().step_by(3) {
        match read_page(tier.as_ref(), key.clone(), len).await {
            (Ok(Lookup::Hit), buf) => {
                content::verify(key, 5, &buf).map_err(|e| format!("read into one buffer: {e}"))?
            }
            (other, _) => return Err(format!("multi-region page {key} read back as {other:?}")),
        }
    }
    Ok(())
}
