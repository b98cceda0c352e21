//! A multipart upload not yet completed, aborted in the background if its call ends first.

use std::time::Duration;

use object_store::MultipartUpload;

/// A multipart upload not yet completed: dropped so (its call cancelled or timed out), it is
/// aborted in the background, so the store frees its parts: each attempt bounded by
/// [`ABORT_WAIT`], made again after a pause while the store does not answer (it may be the
/// stall that cut the upload), [`ABORT_ATTEMPTS`] times at most.
pub(crate) struct Unfinished(pub(crate) Option<Box<dyn MultipartUpload>>);

/// The bound on one attempt to abort a multipart upload.
const ABORT_WAIT: Duration = Duration::from_secs(3);
/// Attempts to abort a multipart upload before it is left to the store's own expiry.
const ABORT_ATTEMPTS: u32 = 6;

impl Unfinished {
    /// The upload (taken only as its call ends).
    pub(crate) fn get(&mut self) -> object_store::Result<&mut Box<dyn MultipartUpload>> {
        self.0.as_mut().ok_or_else(|| object_store::Error::Generic {
            store: "kvtier",
            source: "a multipart upload used after it ended".into(),
        })
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let (Some(mut upload), Ok(runtime)) =
            (self.0.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(async move {
                let mut last = String::new();
                for attempt in 0..ABORT_ATTEMPTS {
                    match tokio::time::timeout(ABORT_WAIT, upload.abort()).await {
                        Ok(Ok(())) => return,
                        Ok(Err(e)) => last = e.to_string(),
                        Err(_) => last = format!("no answer within {ABORT_WAIT:?}"),
                    }
                    tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
                }
                tracing::warn!(error = %last, "cannot abort a multipart upload");
            });
        }
    }
}
