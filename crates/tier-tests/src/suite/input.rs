//! Bad input and hostile keys: typed errors, no panics, nothing written outside the tier's place.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tier_core::{Lookup, Page, PageKey, TierError};

use super::{
    check_len, exists, expect_misses, expect_pages, keys, not_applicable, open, page_len, put_all,
    read, versioned, CaseResult, TierFactory,
};
use crate::content;

/// Wrong buffer lengths, empty pages and oversized pages fail alone with typed errors, and
/// nothing stored is disturbed.
pub async fn bad_input(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("bad", 6);
    put_all(&tier, &versioned(&ks[..2], 1, len), 2).await?;

    let (bufs, results) = read(
        &tier,
        &[
            (ks[0].clone(), len - 1),
            (ks[1].clone(), len),
            (ks[0].clone(), len + 1),
        ],
    )
    .await?;
    for (i, r) in [0usize, 2].into_iter().map(|i| (i, &results[i])) {
        match r {
            Err(e @ TierError::LengthMismatch { stored, .. })
                if *stored == len && e.key() == Some(&ks[0]) => {}
            other => {
                return Err(format!(
                    "a buffer of the wrong length (slot {i}) gave {other:?}"
                ))
            }
        }
    }
    match &results[1] {
        Ok(Lookup::Hit) => content::verify(&ks[1], 1, &bufs[1])?,
        other => return Err(format!("a good slot beside bad ones gave {other:?}")),
    }

    let results = tier
        .put(&[
            Page::new(ks[2].clone(), Vec::new()),
            Page::new(ks[3].clone(), content::page(&ks[3], 1, len)),
        ])
        .await;
    check_len(&results, 2, "put")?;
    match &results[0] {
        Err(TierError::EmptyPage { key }) if *key == ks[2] => {}
        other => return Err(format!("an empty page gave {other:?}")),
    }
    results[1]
        .as_ref()
        .map_err(|e| format!("a good page beside an empty one failed: {e}"))?;

    let limit = tier.info().max_page_bytes;
    if limit.is_none() {
        not_applicable("the tier has no page size limit: no page is over it");
    }
    if let Some(limit) = limit {
        let results = tier
            .put(&[
                Page::new(ks[4].clone(), vec![1u8; limit + 1]),
                Page::new(ks[5].clone(), content::page(&ks[5], 1, len)),
            ])
            .await;
        check_len(&results, 2, "put")?;
        match &results[0] {
            Err(TierError::PageTooLarge { len: l, .. }) if *l == limit + 1 => {}
            other => return Err(format!("a page over the {limit}-byte limit gave {other:?}")),
        }
        results[1]
            .as_ref()
            .map_err(|e| format!("a good page beside an oversized one failed: {e}"))?;
        if exists(&tier, &ks[4..5]).await? != 0 {
            return Err("a rejected oversized page is visible".into());
        }
        expect_pages(&tier, &versioned(&ks[5..6], 1, len), 1).await?;
    }
    if exists(&tier, &ks[2..3]).await? != 0 {
        return Err("a rejected empty page is visible".into());
    }
    expect_pages(&tier, &versioned(&ks[..2], 1, len), 2).await?;
    expect_pages(&tier, &versioned(&ks[3..4], 1, len), 1).await
}

/// Keys shaped like paths (`../../etc/passwd`, `a/b`, `/abs`, ...) are stored and read back as
/// opaque names, or rejected with `KeyRejected`; no file appears outside the tier's root.
pub async fn hostile_keys(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 4 << 10);
    let names = [
        "../../etc/passwd",
        "a/b",
        "..",
        ".",
        "/abs/kvtier-escape",
        "./x",
        "a\\b",
        "%2e%2e%2f",
        "~root",
        "-rf",
        ".hidden",
        "a/../../b",
        "*?<>|:\"",
        "CON",
        "..%2f..",
        "tmp.partial",
    ];
    let long = "z/".repeat(PageKey::MAX_LEN / 2);
    let ks: Vec<PageKey> = names
        .iter()
        .copied()
        .chain([long.as_str()])
        .map(|n| PageKey::new(n).map_err(|e| format!("suite bug: {e}")))
        .collect::<Result<_, _>>()?;
    let root = f.root();
    let outside = f.names_outside().await.transpose()?;
    if root.is_none() && outside.is_none() {
        not_applicable(
            "no folder or bucket outside which writes could be watched (the factory gives neither)",
        );
    }
    let watched = watched_dirs(root);
    let before = listings(&watched);

    let pages: Vec<Page<'static>> = ks
        .iter()
        .map(|k| Page::new(k.clone(), content::page(k, 9, len)))
        .collect();
    let results = tier.put(&pages).await;
    check_len(&results, pages.len(), "put")?;
    let mut stored = Vec::new();
    for (key, r) in ks.iter().zip(results) {
        match r {
            Ok(()) => stored.push(key.clone()),
            Err(TierError::KeyRejected { .. }) => {}
            Err(e) => {
                return Err(format!(
                    "hostile key {key:?} failed with {e} (want Ok or KeyRejected)"
                ))
            }
        }
    }
    let rejected: Vec<PageKey> = ks.iter().filter(|k| !stored.contains(k)).cloned().collect();
    expect_pages(&tier, &versioned(&stored, 9, len), 64).await?;
    for key in &rejected {
        let (_, r) = read(&tier, &[(key.clone(), len)]).await?;
        if !matches!(r[0], Ok(Lookup::Miss) | Err(TierError::KeyRejected { .. })) {
            return Err(format!("rejected key {key:?} reads as {:?}", r[0]));
        }
    }
    let n = exists(&tier, &stored).await?;
    if n != stored.len() {
        return Err(format!(
            "exists over {} stored hostile keys gave {n}",
            stored.len()
        ));
    }
    if Path::new("/abs/kvtier-escape").exists() {
        return Err("key /abs/kvtier-escape created a file at that absolute path".into());
    }
    let after = listings(&watched);
    if before != after {
        return Err(format!(
            "hostile keys changed folders outside the tier root: {before:?} -> {after:?}"
        ));
    }
    if let Some(before) = outside {
        let after = f
            .names_outside()
            .await
            .ok_or("the factory stopped listing names")??;
        if after != before {
            return Err(format!(
                "hostile keys wrote names outside the tier's prefix: {:?}",
                after.difference(&before).collect::<Vec<_>>()
            ));
        }
    }
    for r in tier.remove(&stored).await {
        r.map_err(|e| format!("removing a hostile key failed: {e}"))?;
    }
    expect_misses(&tier, &stored, len).await
}

/// The root's parent and grandparent: where `..` keys would land.
fn watched_dirs(root: Option<PathBuf>) -> Vec<PathBuf> {
    let Some(root) = root else { return Vec::new() };
    root.ancestors()
        .skip(1)
        .take(2)
        .map(Path::to_path_buf)
        .collect()
}

fn listings(dirs: &[PathBuf]) -> Vec<BTreeSet<String>> {
    dirs.iter()
        .map(|d| {
            std::fs::read_dir(d)
                .map(|it| {
                    it.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}
