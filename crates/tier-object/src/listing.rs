//! Listing a prefix's pages: its own level first, then bucket by bucket or in one recursive
//! listing, each request bounded.

use futures::StreamExt;
use object_store::path::Path;
use tier_core::{PageKey, TierError};

use crate::names::MARKER;
use crate::objects::{bucket_of, Objects, BUCKETS};

impl Objects {
    /// The tier's pages: the objects in its buckets whose names are keys routed to that
    /// bucket. Anything else (another tier's prefix nested in this one, `models` over
    /// `models/llama`, lies deeper) is not ours. First the prefix's own level is listed (one
    /// request on S3: its buckets' names, and any page of the flat layout, which fails the
    /// listing: see [`Self::flat_layout`]). A prefix with all its buckets (about 1,500 pages
    /// or more) is then listed bucket by bucket, `concurrency` buckets at a time, in parallel
    /// where one prefix's listing would be a chain of requests; a smaller one in one
    /// recursive listing (one request per 1,000 objects on S3, as cheap as a small prefix
    /// was). Each request is bounded by `op_timeout`, so a prefix of any size lists.
    pub(crate) async fn list(&self) -> Result<Vec<Listed>, TierError> {
        let top = self.list_level(&self.prefix).await?;
        self.flat_layout(&top.objects)?;
        if top.common_prefixes.len() >= BUCKETS {
            return self.list_buckets().await;
        }
        self.list_streamed(&self.prefix).await
    }

    /// The pages under `path`, in a recursive listing whose every answer (one request on S3,
    /// 1,000 entries) is bounded by `op_timeout`, not the whole listing: a bucket or a prefix
    /// of any size lists.
    async fn list_streamed(&self, path: &Path) -> Result<Vec<Listed>, TierError> {
        let mut listing = self.store.list(Some(path));
        let mut objects = Vec::new();
        let mut entries = 0;
        while let Some(next) = self
            .bounded("object list", async {
                listing
                    .next()
                    .await
                    .transpose()
                    .map_err(|e| self.error(None, e))
            })
            .await?
        {
            entries += 1;
            if let Some((key, bucket)) = self.page_of(&next) {
                objects.push(Listed {
                    key,
                    bucket,
                    meta: next,
                });
            }
        }
        self.count_listed(entries);
        Ok(objects)
    }

    /// Counts the LIST requests a listing of `entries` took, as S3 pages them (1,000 entries
    /// a request, one at least).
    fn count_listed(&self, entries: usize) {
        let requests = entries.div_ceil(1000).max(1) as u64;
        self.list_requests
            .fetch_add(requests, std::sync::atomic::Ordering::Relaxed);
    }

    /// The objects and folders directly under `path`, in one bounded listing.
    pub(crate) async fn list_level(
        &self,
        path: &Path,
    ) -> Result<object_store::ListResult, TierError> {
        let listed = self
            .bounded("object list", async {
                self.store
                    .list_with_delimiter(Some(path))
                    .await
                    .map_err(|e| self.error(None, e))
            })
            .await?;
        self.count_listed(listed.objects.len() + listed.common_prefixes.len());
        Ok(listed)
    }

    /// [`Self::list`] bucket by bucket.
    async fn list_buckets(&self) -> Result<Vec<Listed>, TierError> {
        self.list_buckets_in(0..BUCKETS).await
    }

    /// The pages of the buckets `buckets`, listed `concurrency` buckets at a time, each
    /// request bounded (a bucket's whole listing under one `op_timeout` failed past about
    /// 100,000 objects a bucket on S3, and the prefix then grew without eviction).
    pub(crate) async fn list_buckets_in(
        &self,
        buckets: impl IntoIterator<Item = usize>,
    ) -> Result<Vec<Listed>, TierError> {
        let mut listings = futures::stream::iter(buckets)
            .map(|b| async move { self.list_streamed(&self.bucket(b)).await })
            .buffer_unordered(self.config.concurrency.max(1));
        let mut objects = Vec::new();
        while let Some(listed) = listings.next().await {
            objects.extend(listed?);
        }
        Ok(objects)
    }

    /// The key and bucket of `meta` if it is one of the tier's pages: in one of its buckets,
    /// named as a key routed to that bucket.
    fn page_of(&self, meta: &object_store::ObjectMeta) -> Option<(PageKey, usize)> {
        let depth = self.prefix.parts().count();
        let mut parts = meta.location.parts().skip(depth);
        let (Some(bucket), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        let key = PageKey::from_escaped_name(name.as_ref(), MARKER)?;
        // The bucket's name (two lowercase hex digits), compared without making it.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let b = bucket_of(&key);
        (bucket.as_ref().as_bytes() == [HEX[b >> 4], HEX[b & 15]]).then_some((key, b))
    }

    /// Refuses a prefix holding, among `listed`, a page where kvtier before bucketed prefixes
    /// put pages, directly under the prefix: it would be neither read nor counted nor evicted.
    fn flat_layout(&self, listed: &[object_store::ObjectMeta]) -> Result<(), TierError> {
        let depth = self.prefix.parts().count();
        let flat = listed.iter().find(|m| {
            m.location.parts().count() == depth + 1
                && m.location
                    .filename()
                    .and_then(|n| PageKey::from_escaped_name(n, MARKER))
                    .is_some()
        });
        match flat {
            None => Ok(()),
            Some(meta) => Err(TierError::config(
                "prefix",
                format!(
                    "{} is a page in the flat layout of an earlier kvtier (pages directly \
                     under the prefix, not in its buckets): move its pages into buckets with \
                     `kvtier move-flat CONFIG` (while no node uses the prefix {}), or give the \
                     tier another prefix",
                    meta.location, self.prefix
                ),
            )),
        }
    }
}

/// One of the tier's pages, as a listing found it.
pub(crate) struct Listed {
    /// The page's key, decoded from the object's name once.
    pub key: PageKey,
    /// Its bucket.
    pub bucket: usize,
    /// The object.
    pub meta: object_store::ObjectMeta,
}
