//! Moving a prefix of the flat layout (pages directly under the prefix, as kvtier stored them
//! before prefixes had buckets) into its buckets, so that a tier can open it.

use futures::StreamExt;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use tier_core::{PageKey, TierError};

use crate::names::MARKER;
use crate::objects::Objects;

/// What [`crate::ObjectTier::move_flat_layout`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlatMove {
    /// Pages moved into their buckets.
    pub moved: u64,
    /// Flat pages removed because their bucket already held the page (stored there later).
    pub superseded: u64,
}

enum Moved {
    Moved,
    Superseded,
}

impl Objects {
    /// Moves every page directly under the prefix into its bucket: copied where the bucket
    /// does not hold the page yet, then removed (a page already in its bucket was stored by a
    /// later kvtier and stays). Each request is bounded by `op_timeout`; run it while no node
    /// uses the prefix.
    pub(crate) async fn move_flat_layout(&self) -> Result<FlatMove, TierError> {
        let top = self.list_level(&self.prefix).await?;
        let depth = self.prefix.parts().count();
        let flat: Vec<(Path, PageKey)> = top
            .objects
            .into_iter()
            .filter(|m| m.location.parts().count() == depth + 1)
            .filter_map(|m| {
                let key = PageKey::from_escaped_name(m.location.filename()?, MARKER)?;
                Some((m.location, key))
            })
            .collect();
        let mut moves = futures::stream::iter(flat)
            .map(|(from, key)| async move { self.move_page(&from, &key).await })
            .buffer_unordered(self.config.concurrency.max(1));
        let mut done = FlatMove::default();
        while let Some(moved) = moves.next().await {
            match moved? {
                Moved::Moved => done.moved += 1,
                Moved::Superseded => done.superseded += 1,
            }
        }
        Ok(done)
    }

    async fn move_page(&self, from: &Path, key: &PageKey) -> Result<Moved, TierError> {
        let to = self.object_path(key)?;
        let store = &self.store;
        let held = self
            .bounded("object head", async {
                match store.head(&to).await {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::NotFound { .. }) => Ok(false),
                    Err(e) => Err(self.error(Some(key), e)),
                }
            })
            .await?;
        if !held {
            self.bounded("object copy", async {
                store
                    .copy(from, &to)
                    .await
                    .map_err(|e| self.error(Some(key), e))
            })
            .await?;
        }
        self.bounded("object delete", async {
            match store.delete(from).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.error(Some(key), e)),
            }
        })
        .await?;
        Ok(if held {
            Moved::Superseded
        } else {
            Moved::Moved
        })
    }
}
