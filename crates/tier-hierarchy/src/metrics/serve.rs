//! The scrape endpoint, served by hyper.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// The endpoint's connections, each with whether it has sent its request; aborted when
/// dropped (with the endpoint's task).
#[derive(Default)]
struct Connections(VecDeque<(JoinHandle<()>, Arc<AtomicBool>)>);

impl Drop for Connections {
    fn drop(&mut self) {
        for (task, _) in &self.0 {
            task.abort();
        }
    }
}

/// The OpenMetrics text format's media type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A connection that sends no complete request head in this long is let go.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at once: past this, a new one takes the place of the oldest that has
/// sent no request yet (a flood of connections can neither take the descriptors the engine in
/// this process needs nor starve a scrape), or is closed if every one is being served.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// A connection is let go after this long, whatever it is doing.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// A failing `accept` (descriptors exhausted, say) is retried after this pause, not in a spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `text()` over HTTP on `addr` (`GET /metrics`, Prometheus' default path, or `/`)
/// until the returned task is aborted (its connections with it). Returns the bound address (`addr` may ask for port 0)
/// and the task. Must run inside a tokio runtime. At most 16 connections are held at once (a
/// new one takes the place of the oldest idle one), each for at most 10 s (5 s to send its
/// request); it serves nothing but the counters. Bind
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
    let task = tokio::spawn(
        async move {
            // The connections, oldest first, each with whether it has sent its request yet;
            // aborted with the endpoint: none outlives it.
            let mut open = Connections::default();
            loop {
                let socket = match listener.accept().await {
                    Ok((socket, _)) => socket,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint cannot accept a connection");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                open.0.retain(|(task, _)| !task.is_finished());
                if open.0.len() >= MAX_CONNECTIONS {
                    // Full: the oldest connection that has sent no request yet goes (awaited,
                    // so its descriptor is closed before another is taken), so idle
                    // connections never starve a scrape; if every one is being served, the
                    // new one goes.
                    let idle = open
                        .0
                        .iter()
                        .position(|(_, asked)| !asked.load(Ordering::Acquire));
                    match idle.and_then(|idle| open.0.remove(idle)) {
                        Some((task, _)) => {
                            task.abort();
                            let _ = task.await;
                        }
                        None => continue,
                    }
                }
                let asked = Arc::new(AtomicBool::new(false));
                let text = Arc::clone(&text);
                let flag = Arc::clone(&asked);
                let service = service_fn(move |request| {
                    flag.store(true, Ordering::Release);
                    let text = Arc::clone(&text);
                    async move { Ok::<_, Infallible>(respond(&request, &*text)) }
                });
                let task = tokio::spawn(async move {
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
                });
                open.0.push_back((task, asked));
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
