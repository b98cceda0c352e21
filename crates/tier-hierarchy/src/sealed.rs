//! Keyed page integrity for tiers others can write (a shared folder or bucket prefix): each page
//! is stored with a 32-byte MAC (BLAKE3 keyed) of its key and bytes under a secret the fleet's
//! processes share. A page whose MAC does not verify (written without the secret, altered, or
//! stored under another key) is a miss, never a hit.
//!
//! A checksum (CRC-32C) catches torn writes; only a keyed MAC stops a writer who lacks the key.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use tier_core::{
    async_trait, GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats,
};

/// Bytes of the MAC stored after each page.
pub const TAG_BYTES: usize = 32;
/// Bytes of a batch worth spreading its MACs over several cores.
const PARALLEL_BYTES: usize = 1 << 20;
/// The shortest secret accepted.
const MIN_SECRET: usize = 16;

/// Where a tier's integrity secret comes from (in config files: `integrity = { ... }` on a
/// tier). Exactly one of the two.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntegrityConfig {
    /// An environment variable holding the secret.
    pub key_env: Option<String>,
    /// A file holding the secret, readable by its owner only.
    pub key_file: Option<PathBuf>,
}

impl IntegrityConfig {
    /// The MAC key, derived from the secret; `field` names the setting in errors.
    pub fn key(&self, field: &str) -> Result<[u8; 32], TierError> {
        Ok(blake3::derive_key(
            "kvtier 2026 page MAC v1",
            &self.secret(field)?,
        ))
    }

    /// The secret itself (trimmed, at least [`MIN_SECRET`] bytes), read from `key_env` or
    /// `key_file`; `field` names the setting in errors, which never quote it.
    pub fn secret(&self, field: &str) -> Result<Vec<u8>, TierError> {
        let secret = match (&self.key_env, &self.key_file) {
            (Some(var), None) => std::env::var_os(var)
                .map(|v| v.into_encoded_bytes())
                .ok_or_else(|| {
                    TierError::config(
                        format!("{field}.key_env"),
                        format!("the environment has no {var}"),
                    )
                })?,
            (None, Some(path)) => read_key_file(path, field)?,
            _ => {
                return Err(TierError::config(
                    field,
                    "give the secret by key_env or key_file (exactly one)",
                ))
            }
        };
        let secret = secret.trim_ascii();
        if secret.len() < MIN_SECRET {
            return Err(TierError::config(
                field,
                format!(
                    "the secret has {} bytes; at least {MIN_SECRET} are needed",
                    secret.len()
                ),
            ));
        }
        Ok(secret.to_vec())
    }
}

/// A tenant's own secret, derived from an operator's `master` secret and the tenant's name
/// (64 hex digits, a secret in itself). Each tenant is handed its own and never the master, so
/// no tenant can compute another's: pages one writes fail every other tenant's MAC, and their
/// names and namespaces differ. (A key derived inside each engine from a secret every tenant
/// holds would stop no one: each could derive the others'.)
pub fn tenant_secret(master: &[u8], tenant: &str) -> String {
    let mut hasher = blake3::Hasher::new_derive_key("kvtier 2026 tenant secret v1");
    hasher.update(&(master.len() as u64).to_le_bytes());
    hasher.update(master);
    hasher.update(tenant.as_bytes());
    hasher.finalize().to_hex().to_string()
}

/// The largest key file read: a secret is a line, not a file of data.
const MAX_KEY_FILE: u64 = 4096;

/// Reads the secret at `path` from the one descriptor whose file was checked: opened without
/// following a link or waiting on a FIFO, a regular file of this process's user (or root),
/// readable by its owner only, at most [`MAX_KEY_FILE`] bytes. Errors never quote it.
fn read_key_file(path: &std::path::Path, field: &str) -> Result<Vec<u8>, TierError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let refuse = |why: String| {
        TierError::config(
            format!("{field}.key_file"),
            format!("{} {why}", path.display()),
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse("is a link: give the secret's own file".into()),
            _ => refuse(format!("cannot be read: {e}")),
        })?;
    let meta = file
        .metadata()
        .map_err(|e| refuse(format!("cannot be read: {e}")))?;
    if !meta.is_file() {
        return Err(refuse("is not a regular file".into()));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(refuse(format!(
            "belongs to user {}, not to this process's user {me} (or root): another user \
             could have chosen the secret",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "has mode {:o}: a secret must be readable by its owner only (chmod 600)",
            meta.mode() & 0o777
        )));
    }
    let mut secret = Vec::new();
    file.take(MAX_KEY_FILE + 1)
        .read_to_end(&mut secret)
        .map_err(|e| refuse(format!("cannot be read: {e}")))?;
    if secret.len() as u64 > MAX_KEY_FILE {
        return Err(refuse(format!(
            "holds over {MAX_KEY_FILE} bytes: a secret file holds one secret"
        )));
    }
    Ok(secret)
}

/// A tier whose pages carry a MAC under a shared secret (see the module docs).
pub struct Sealed {
    inner: Arc<dyn StorageTier>,
    key: [u8; 32],
    /// Pages found whose MAC did not verify.
    forged: AtomicU64,
}

impl Sealed {
    /// Seals `inner`'s pages with `key` (from [`IntegrityConfig::key`]).
    pub fn new(inner: Arc<dyn StorageTier>, key: [u8; 32]) -> Self {
        Self {
            inner,
            key,
            forged: AtomicU64::new(0),
        }
    }

    /// Pages read whose MAC did not verify (answered as misses).
    pub fn forged(&self) -> u64 {
        self.forged.load(Relaxed)
    }

    fn tag(&self, key: &PageKey, regions: &[&[u8]]) -> [u8; 32] {
        let mut mac = blake3::Hasher::new_keyed(&self.key);
        mac.update(&(key.as_str().len() as u64).to_le_bytes());
        mac.update(key.as_str().as_bytes());
        for region in regions {
            mac.update(region);
        }
        *mac.finalize().as_bytes()
    }

    /// The MACs of `pages` (key, regions), on as many cores as the machine has once a batch
    /// holds more than [`PARALLEL_BYTES`].
    fn tags(&self, pages: &[(&PageKey, Vec<&[u8]>)]) -> Vec<[u8; 32]> {
        let bytes: usize = pages
            .iter()
            .map(|(_, r)| r.iter().map(|r| r.len()).sum::<usize>())
            .sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(pages.len());
        if bytes < PARALLEL_BYTES || threads < 2 {
            return pages.iter().map(|(k, r)| self.tag(k, r)).collect();
        }
        let per = pages.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let parts: Vec<_> = pages
                .chunks(per)
                .map(|part| {
                    scope
                        .spawn(move || part.iter().map(|(k, r)| self.tag(k, r)).collect::<Vec<_>>())
                })
                .collect();
            parts
                .into_iter()
                .flat_map(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    }

    async fn put_sealed(&self, pages: &[Page<'_>], deadline: Option<Instant>) -> Vec<PutResult> {
        // The caller's limits, checked here: the inner tier sees every page 32 bytes longer.
        let limit = self.info().max_page_bytes;
        let mut results: Vec<Option<PutResult>> = pages
            .iter()
            .map(|p| p.check_len(limit).err().map(Err))
            .collect();
        let valid: Vec<&Page<'_>> = pages
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_none())
            .map(|(p, _)| p)
            .collect();
        let tags = self.tags(
            &valid
                .iter()
                .map(|p| (&p.key, p.data.regions().collect()))
                .collect::<Vec<_>>(),
        );
        let sealed: Vec<Page<'_>> = valid
            .iter()
            .zip(&tags)
            .map(|(p, tag)| {
                Page::lent(
                    p.key.clone(),
                    p.data.regions().chain(std::iter::once(&tag[..])),
                )
            })
            .collect();
        let mut stored = match deadline {
            Some(d) => self.inner.put_by(&sealed, d).await,
            None => self.inner.put(&sealed).await,
        }
        .into_iter();
        results
            .iter_mut()
            .map(|r| match r.take() {
                Some(refused) => refused,
                None => stored
                    .next()
                    .unwrap_or_else(|| Err(TierError::Unavailable("no result".into()))),
            })
            .collect()
    }

    async fn get_sealed(
        &self,
        slots: &mut [ReadSlot<'_>],
        deadline: Option<Instant>,
    ) -> Vec<GetResult> {
        let mut tags = vec![[0u8; TAG_BYTES]; slots.len()];
        let mut results = {
            let mut sealed: Vec<ReadSlot<'_>> = slots
                .iter_mut()
                .zip(tags.iter_mut())
                .map(|(slot, tag)| {
                    let mut regions: Vec<&mut [u8]> = slot.buf.regions_mut().collect();
                    regions.push(&mut tag[..]);
                    ReadSlot::regions(slot.key.clone(), regions)
                })
                .collect();
            match deadline {
                Some(d) => self.inner.get_by(&mut sealed, d).await,
                None => self.inner.get(&mut sealed).await,
            }
        };
        let hits: Vec<usize> = (0..slots.len())
            .filter(|&i| matches!(results[i], Ok(Lookup::Hit)))
            .collect();
        let wanted = self.tags(
            &hits
                .iter()
                .map(|&i| (&slots[i].key, slots[i].buf.regions().collect()))
                .collect::<Vec<_>>(),
        );
        let mut wanted = hits.into_iter().zip(wanted).peekable();
        for (i, ((slot, tag), result)) in
            slots.iter().zip(&tags).zip(results.iter_mut()).enumerate()
        {
            match result {
                Ok(Lookup::Hit) => {
                    let Some((_, want)) = wanted.next_if(|(hit, _)| *hit == i) else {
                        continue;
                    };
                    // Constant-time comparison: a forger learns nothing from the timing.
                    if blake3::Hash::from(want) != blake3::Hash::from(*tag) {
                        self.forged.fetch_add(1, Relaxed);
                        tracing::warn!(key = %slot.key, tier = %self.inner.info().name, "a page whose MAC does not verify is a miss");
                        *result = Ok(Lookup::Miss);
                    }
                }
                Err(TierError::LengthMismatch {
                    key,
                    stored,
                    buffer,
                }) => {
                    *result = Err(TierError::LengthMismatch {
                        key: key.clone(),
                        stored: stored.saturating_sub(TAG_BYTES),
                        buffer: buffer.saturating_sub(TAG_BYTES),
                    });
                }
                _ => {}
            }
        }
        results
    }
}

#[async_trait]
impl StorageTier for Sealed {
    fn info(&self) -> TierInfo {
        let mut info = self.inner.info();
        info.max_page_bytes = info.max_page_bytes.map(|m| m.saturating_sub(TAG_BYTES));
        info
    }

    /// The inner tier's counters, its bytes moved counted without the MACs.
    fn stats(&self) -> TierStats {
        let mut stats = self.inner.stats();
        let tags = |pages: u64| pages.saturating_mul(TAG_BYTES as u64);
        stats.bytes_written = stats.bytes_written.saturating_sub(tags(stats.puts));
        stats.bytes_read = stats.bytes_read.saturating_sub(tags(stats.hits));
        stats
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        self.put_sealed(pages, None).await
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        self.get_sealed(slots, None).await
    }

    /// Presence as the inner tier knows it: a page without a valid MAC is present here and a
    /// miss when read.
    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.inner.exists(keys).await
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.inner.touch(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        self.inner.remove(keys).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.inner.clear().await
    }

    async fn flush(&self) -> Result<(), TierError> {
        self.inner.flush().await
    }

    async fn get_by(&self, slots: &mut [ReadSlot<'_>], deadline: Instant) -> Vec<GetResult> {
        self.get_sealed(slots, Some(deadline)).await
    }

    async fn exists_by(&self, keys: &[PageKey], deadline: Instant) -> Result<usize, TierError> {
        self.inner.exists_by(keys, deadline).await
    }

    async fn put_by(&self, pages: &[Page<'_>], deadline: Instant) -> Vec<PutResult> {
        self.put_sealed(pages, Some(deadline)).await
    }
}
