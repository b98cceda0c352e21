//! The scrape endpoint, served by hyper.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::TierError;

/// The OpenMetrics text format's media type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A connection that sends no complete request head in this long is let go.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at once: past this, new ones wait in the kernel's backlog (a flood of
/// connections cannot take the descriptors the engine in this process needs).
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// A connection is let go after this long, whatever it is doing.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// A failing `accept` (descriptors exhausted, say) is retried after this pause, not in a spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `text()` over HTTP on `addr` (`GET /metrics`, Prometheus' default path, or `/`)
/// until the returned task is aborted (its connections with it). Returns the bound address (`addr` may ask for port 0)
/// and the task. Must run inside a tokio runtime. At most 16 connections are served at once,
/// each for at most 10 s (5 s to send its request); it serves nothing but the counters. Bind
/// it to loopback (`127.0.0.1:PORT`, what the adapters default to) unless a scraper on
/// another host needs it.
pub async fn serve_metrics(
    addr: SocketAddr,
    text: impl Fn() -> String + Send + Sync + 'static,
) -> Result<(SocketAddr, JoinHandle<()>), TierError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| TierError::config("metrics_addr", format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| TierError::config("metrics_addr", format!("{addr}: {e}")))?;
    let text: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(text);
    let span = tracing::debug_span!("metrics", %bound);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let task = tokio::spawn(
        async move {
            // The connections, aborted with the endpoint: none outlives it.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                // A slot first: while all are taken, nothing is accepted.
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                while connections.try_join_next().is_some() {}
                let socket = match listener.accept().await {
                    Ok((socket, _)) => socket,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint cannot accept a connection");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let text = Arc::clone(&text);
                let service = service_fn(move |request| {
                    let text = Arc::clone(&text);
                    async move { Ok::<_, Infallible>(respond(&request, &*text)) }
                });
                connections.spawn(async move {
                    let served = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEAD_TIMEOUT)
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(socket), service);
                    match tokio::time::timeout(CONNECTION_TIMEOUT, served).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "metrics connection ended with an error")
                        }
                        Err(_) => tracing::debug!("metrics connection let go after 10 s"),
                    }
                    drop(slot);
                });
            }
        }
        .instrument(span),
    );
    Ok((bound, task))
}

fn respond(request: &Request<Incoming>, text: &dyn Fn() -> String) -> Response<Full<Bytes>> {
    let (status, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics" | "/") => (StatusCode::OK, text()),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "not found: try /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET is served\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
    response
}
