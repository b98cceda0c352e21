//! The scrape endpoint over real sockets: the paths it serves, what it refuses, and a client
//! that never sends a request holding nobody else up.

use std::time::Duration;

use tokio::net::TcpStream;

mod common;
use common::ask;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_metrics_refuses_the_rest_and_outlasts_silent_clients() {
    let (addr, task) =
        tier_hierarchy::serve_metrics("127.0.0.1:0".parse().unwrap(), || "kvtier_up 1\n".into())
            .await
            .unwrap();
    // Connections that send nothing: the next scrape is served all the same.
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    for path in ["/metrics", "/"] {
        let response = ask(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")).await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("content-type: application/openmetrics-text"),
            "{response}"
        );
        assert!(response.ends_with("kvtier_up 1\n"), "{response}");
    }
    let missing = ask(addr, "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
        "{missing}"
    );
    let post = ask(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(
        post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
        "{post}"
    );
    let garbage = ask(addr, "\x01\x02 not http\r\n\r\n").await;
    assert!(
        garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
        "{garbage}"
    );
    drop(silent);
    task.abort();
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_connections_holds_at_most_sixteen_descriptors_and_scrapes_go_on() {
    let (addr, task) =
        tier_hierarchy::serve_metrics("127.0.0.1:0".parse().unwrap(), || "kvtier_up 1\n".into())
            .await
            .unwrap();
    let before = open_fds();
    let mut flood = Vec::new();
    for _ in 0..64 {
        flood.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Our 64 client ends, and at most 16 the server accepted (64 more without a bound).
    let held = open_fds() - before;
    println!("64 idle connections: {held} descriptors held by this process");
    assert!(
        held <= 64 + 16 + 2,
        "{held} descriptors for 64 idle connections"
    );
    // While the flood lasts, scrapes wait their turn (each idle connection is let go after
    // 5 s); once it ends, a scrape is served at once.
    drop(flood);
    let response = ask(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(response.ends_with("kvtier_up 1\n"), "{response}");
    task.abort();
}

#[tokio::test]
async fn a_taken_port_is_a_config_error_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    match tier_hierarchy::serve_metrics(addr, String::new).await {
        Err(tier_core::TierError::Config { field, message }) => {
            assert_eq!(field, "metrics_addr");
            assert!(message.contains(&addr.to_string()), "{message}");
        }
        Err(other) => panic!("not a config error: {other}"),
        Ok(_) => panic!("a taken port was bound"),
    }
}
