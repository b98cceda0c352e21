//! Idle connections to the scrape endpoint, as many as it holds, never starve a scrape (a
//! binary of its own: the endpoint tests beside it count this process's descriptors).

use std::time::Duration;

use tokio::net::TcpStream;

mod common;
use common::ask;

/// Sixteen connections held open without a request (as many as are held at once) do not
/// starve a scrape: the oldest idle one makes way and the scrape is answered at once. (It
/// waited in the kernel's backlog until an idle one was let go, 5 s later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_never_starve_a_scrape() {
    let (addr, task) =
        tier_hierarchy::serve_metrics("127.0.0.1:0".parse().unwrap(), || "kvtier_up 1\n".into())
            .await
            .unwrap();
    let mut idle = Vec::new();
    for _ in 0..16 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let response = tokio::time::timeout(
        Duration::from_secs(2),
        ask(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
    )
    .await
    .expect("a scrape is answered while 16 idle connections are held");
    println!("answered in {:?}", started.elapsed());
    assert!(response.ends_with("kvtier_up 1\n"), "{response}");
    drop(idle);
    task.abort();
}
