//! The baselines a bench runs beside each tier: the same work done directly on the top
//! tier's medium (memcpy, raw files, a direct object_store client).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tier_core::{Bytes, TierError};
use tier_hierarchy::config::{HierarchyConfig, TierContext};

use super::{Op, Settings};
/// The same work done directly on the top tier's medium.
pub(super) enum Baseline {
    Memcpy {
        held: Vec<Vec<u8>>,
    },
    Files {
        dir: PathBuf,
    },
    Objects {
        store: Arc<dyn ObjectStore>,
        prefix: String,
    },
}

impl Baseline {
    /// The baseline for the config's top tier, if its kind has one.
    pub(super) fn for_config(config: &HierarchyConfig) -> Result<Option<Baseline>, TierError> {
        let Some(top) = config.tiers.first() else {
            return Ok(None);
        };
        Ok(match top.kind.as_str() {
            "mem" => Some(Baseline::Memcpy { held: Vec::new() }),
            "nixl-file" => {
                let dir = top
                    .params
                    .get("dirs")
                    .and_then(|d| d.get(0))
                    .and_then(|d| d.as_str())
                    .map(|d| PathBuf::from(format!("{}-bench-baseline", d.trim_end_matches('/'))));
                match dir {
                    Some(dir) => {
                        std::fs::create_dir_all(&dir).map_err(|e| {
                            TierError::io("create baseline folder", None, Some(dir.clone()), e)
                        })?;
                        Some(Baseline::Files { dir })
                    }
                    None => None,
                }
            }
            "object" => {
                let ctx = TierContext {
                    name: "baseline".into(),
                    field: "tiers[0]".into(),
                    params: top.params.clone(),
                };
                let (store, _, prefix) = tier_builtin::store_of(&ctx)?;
                Some(Baseline::Objects {
                    store,
                    prefix: format!("{prefix}-bench-baseline"),
                })
            }
            _ => None,
        })
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Baseline::Memcpy { .. } => "memcpy",
            Baseline::Files { .. } => "plain file per page",
            Baseline::Objects { .. } => "object_store loop",
        }
    }

    /// Runs `op` on every page; `None` where this baseline has no such operation.
    pub(super) async fn run(
        &mut self,
        op: Op,
        s: &Settings,
        names: &[String],
        data: &Bytes,
        bufs: &mut [Vec<u8>],
    ) -> Result<Option<Duration>, String> {
        let t = Instant::now();
        match self {
            Baseline::Memcpy { held } => match op {
                Op::Put => {
                    held.clear();
                    held.extend(names.iter().map(|_| data.to_vec()));
                }
                Op::Get => {
                    for (buf, page) in bufs.iter_mut().zip(held.iter()) {
                        buf.copy_from_slice(page);
                    }
                }
                Op::Exists | Op::Remove => return Ok(None),
            },
            Baseline::Files { dir } => {
                // The buffers move into the blocking tasks and back (no copy, no allocation).
                let owned: Vec<Vec<Vec<u8>>> = bufs
                    .chunks_mut(s.batch)
                    .map(|c| c.iter_mut().map(std::mem::take).collect())
                    .collect();
                let t = Instant::now();
                let jobs = names.chunks(s.batch).zip(owned).map(|(names, mut owned)| {
                    let (dir, names, data) = (dir.clone(), names.to_vec(), data.clone());
                    async move {
                        tokio::task::spawn_blocking(move || -> std::io::Result<Vec<Vec<u8>>> {
                            use std::io::Read;
                            for (name, buf) in names.iter().zip(owned.iter_mut()) {
                                let path = dir.join(name);
                                match op {
                                    Op::Put => std::fs::write(&path, &data)?,
                                    Op::Get => std::fs::File::open(&path)?.read_exact(buf)?,
                                    Op::Exists => {
                                        std::fs::metadata(&path)?;
                                    }
                                    Op::Remove => std::fs::remove_file(&path)?,
                                }
                            }
                            Ok(owned)
                        })
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())
                    }
                });
                let done: Vec<Result<Vec<Vec<u8>>, String>> = futures::stream::iter(jobs)
                    .buffered(s.concurrency)
                    .collect()
                    .await;
                let elapsed = t.elapsed();
                for (chunk, got) in bufs.chunks_mut(s.batch).zip(done) {
                    for (buf, read) in chunk.iter_mut().zip(got?) {
                        *buf = read;
                    }
                }
                return Ok(Some(elapsed));
            }
            Baseline::Objects { store, prefix } => {
                // Shaped like the tier's calls: batches in flight, each with up to 16 requests
                // (the object tier's default concurrency) at once.
                let per_batch = s.batch.min(16);
                let batches =
                    names
                        .chunks(s.batch)
                        .zip(bufs.chunks_mut(s.batch))
                        .map(|(names, bufs)| {
                            let (store, prefix, data) =
                                (Arc::clone(store), prefix.clone(), data.clone());
                            async move {
                                let requests =
                                    names.iter().zip(bufs.iter_mut()).map(|(name, buf)| {
                                        let path = ObjectPath::from(format!("{prefix}/{name}"));
                                        let (store, data) = (Arc::clone(&store), data.clone());
                                        async move {
                                            match op {
                                                Op::Put => store
                                                    .put(&path, PutPayload::from_bytes(data))
                                                    .await
                                                    .map(|_| ()),
                                                Op::Get => match store.get(&path).await {
                                                    Ok(got) => got.bytes().await.map(|got| {
                                                        buf.copy_from_slice(&got);
                                                    }),
                                                    Err(e) => Err(e),
                                                },
                                                Op::Exists => store.head(&path).await.map(|_| ()),
                                                Op::Remove => store.delete(&path).await,
                                            }
                                            .map_err(|e| e.to_string())
                                        }
                                    });
                                futures::stream::iter(requests)
                                    .buffer_unordered(per_batch)
                                    .collect::<Vec<Result<(), String>>>()
                                    .await
                            }
                        });
                let done: Vec<Vec<Result<(), String>>> = futures::stream::iter(batches)
                    .buffer_unordered(s.concurrency)
                    .collect()
                    .await;
                done.into_iter()
                    .flatten()
                    .collect::<Result<Vec<()>, String>>()?;
            }
        }
        Ok(Some(t.elapsed()))
    }
}
