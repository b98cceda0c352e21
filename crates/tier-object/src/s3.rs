//! Building an S3 (or S3-compatible) store with bounded retries and timeouts, and [`Secret`],
//! the secret key that never prints.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{ClientOptions, ObjectStore, RetryConfig};
use tier_core::TierError;

/// A credential: its `Debug` and `Display` print `***`, so settings, errors and logs that
/// format it never show it. [`Secret::expose`] hands the value to the one place that needs it.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value itself.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether none was given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_string())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Where and how to reach an S3 bucket.
#[derive(Debug, Clone)]
pub struct S3Settings {
    /// Endpoint URL, e.g. `http://127.0.0.1:9000`; `None` for AWS.
    pub endpoint: Option<String>,
    /// Bucket.
    pub bucket: String,
    /// Region.
    pub region: String,
    /// Access key id (empty: from the environment, see [`S3Settings::build`]).
    pub access_key: String,
    /// Secret access key (printed as `***`).
    pub secret_key: Secret,
    /// Virtual-hosted-style addressing (`bucket.host`) instead of path style.
    pub virtual_hosted: bool,
    /// Per-request timeout (and connect timeout).
    pub request_timeout: Duration,
    /// Retries of a failed request.
    pub max_retries: usize,
    /// Bound on all retries of one request.
    pub retry_timeout: Duration,
    /// Idle connections kept per host (`None`: the HTTP client's default). Each holds an fd.
    pub max_idle_connections: Option<usize>,
    /// Deletes many objects per request (S3's `DeleteObjects`); `false` for stores that lack
    /// it (GCS's S3 API): one `DELETE` per object, concurrently. object_store sends even a
    /// single delete as a `DeleteObjects` of one, so there every remove and eviction fails.
    pub bulk_delete: bool,
}

impl S3Settings {
    /// Path-style settings for an S3-compatible endpoint.
    pub fn endpoint(endpoint: &str, bucket: &str, access_key: &str, secret_key: &str) -> Self {
        Self {
            endpoint: Some(endpoint.to_string()),
            bucket: bucket.to_string(),
            region: "us-east-1".into(),
            access_key: access_key.to_string(),
            secret_key: Secret::from(secret_key),
            virtual_hosted: false,
            request_timeout: Duration::from_secs(10),
            max_retries: 3,
            retry_timeout: Duration::from_secs(20),
            max_idle_connections: None,
            bulk_delete: true,
        }
    }

    /// Takes `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` from the environment when neither
    /// key was given.
    pub fn keys_from_env(&mut self) {
        if self.access_key.is_empty() && self.secret_key.is_empty() {
            if let (Ok(id), Ok(secret)) = (
                std::env::var("AWS_ACCESS_KEY_ID"),
                std::env::var("AWS_SECRET_ACCESS_KEY"),
            ) {
                self.access_key = id;
                self.secret_key = Secret::from(secret);
            }
        }
    }

    /// Builds the store (no request is made). With neither key given, credentials come from
    /// the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) or
    /// the providers object_store asks then (web identity, ECS task role, EC2 instance
    /// metadata); one key without the other is a config error.
    pub fn build(&self) -> Result<Arc<dyn ObjectStore>, TierError> {
        self.builder()?
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            .map_err(|e| TierError::config("s3", e.to_string()))
    }

    /// The object_store builder these settings make.
    fn builder(&self) -> Result<AmazonS3Builder, TierError> {
        if self.access_key.is_empty() != self.secret_key.is_empty() {
            return Err(TierError::config(
                "access_key",
                "give both access_key and secret_key, or neither (credentials from the environment)",
            ));
        }
        let mut client = ClientOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.request_timeout)
            .with_allow_http(true);
        if let Some(max) = self.max_idle_connections {
            client = client.with_pool_max_idle_per_host(max);
        }
        let mut builder = if self.access_key.is_empty() {
            AmazonS3Builder::from_env()
        } else {
            AmazonS3Builder::new()
                .with_access_key_id(&self.access_key)
                .with_secret_access_key(self.secret_key.expose())
        };
        builder = builder
            .with_bucket_name(&self.bucket)
            .with_region(&self.region)
            .with_virtual_hosted_style_request(self.virtual_hosted)
            .with_disable_bulk_delete(!self.bulk_delete)
            .with_retry(RetryConfig {
                max_retries: self.max_retries,
                retry_timeout: self.retry_timeout,
                ..Default::default()
            })
            .with_client_options(client);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        Ok(builder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::aws::AmazonS3ConfigKey;

    #[test]
    fn bulk_delete_reaches_the_client() {
        let mut s3 = S3Settings::endpoint("http://127.0.0.1:1", "b", "k", "s");
        let disabled = |s3: &S3Settings| {
            s3.builder()
                .expect("a builder")
                .get_config_value(&AmazonS3ConfigKey::DisableBulkDelete)
        };
        assert_eq!(disabled(&s3).as_deref(), Some("false"));
        s3.bulk_delete = false;
        assert_eq!(disabled(&s3).as_deref(), Some("true"));
    }
}
