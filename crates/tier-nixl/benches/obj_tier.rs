//! Object tiers on a real S3 server (s3s-fs on loopback), measured in one run: the NIXL OBJ
//! tier and the object_store tier beside a direct object_store client loop doing the same
//! requests with the same concurrency (the baseline). Rounds interleave; medians are quoted.
//! CPU seconds of the client process and of the server show what limits each. Last, the
//! tiers' `exists` (a HEAD per key) beside plain HEADs.
//!
//! `cargo bench -p tier-nixl --bench obj_tier` (rounds: `$KVTIER_BENCH_ROUNDS`, default 3;
//! the server keeps objects in `$TMPDIR`, e.g. `TMPDIR=/dev/shm` to take the disk out).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tier_core::{Bytes, StorageTier};
use tier_nixl::{NixlObjConfig, NixlObjTier};
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::s3::S3Server;

mod common;

use common::{get_batches, put_batches, Workload};

/// Requests in flight: the tiers' default, and the baseline's.
const CONCURRENCY: usize = 16;

/// CPU seconds used so far by a process (utime + stime from /proc).
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    // SAFETY: plain sysconf query.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Elapsed time and CPU seconds of client and server for one run.
#[derive(Clone, Copy)]
struct Sample {
    elapsed: Duration,
    client_cpu: f64,
    server_cpu: f64,
}

async fn measure<F: std::future::Future<Output = ()>>(server: &S3Server, run: F) -> Sample {
    let pid = server.pid().unwrap().to_string();
    let (c0, s0) = (cpu_seconds("self"), cpu_seconds(&pid));
    let t = Instant::now();
    run.await;
    let elapsed = t.elapsed();
    Sample {
        elapsed,
        client_cpu: cpu_seconds("self") - c0,
        server_cpu: cpu_seconds(&pid) - s0,
    }
}

/// The objects the direct client writes `w`'s pages to under `prefix`.
fn direct_paths(prefix: &str, w: &Workload) -> Vec<Path> {
    w.keys
        .iter()
        .map(|k| Path::from(format!("{prefix}/{}", k.as_str())))
        .collect()
}

async fn direct_put(store: &Arc<dyn ObjectStore>, prefix: &str, w: &Workload) {
    let paths = direct_paths(prefix, w);
    let results: Vec<_> = futures::stream::iter(paths.iter().zip(&w.data))
        .map(|(p, d)| store.put(p, PutPayload::from(d.clone())))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    for r in results {
        r.unwrap();
    }
}

async fn direct_get(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    w: &Workload,
    bufs: &mut [Vec<u8>],
) {
    let batch = bufs.len();
    for keys in w.keys.chunks(batch) {
        let paths: Vec<Path> = keys
            .iter()
            .map(|k| Path::from(format!("{prefix}/{}", k.as_str())))
            .collect();
        let fetched: Vec<Bytes> = futures::stream::iter(&paths)
            .map(|p| async move { store.get(p).await.unwrap().bytes().await.unwrap() })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        for (buf, bytes) in bufs.iter_mut().zip(&fetched) {
            buf.copy_from_slice(bytes);
        }
    }
    let last = w.keys.len() - 1;
    assert_eq!(bufs[last % batch][..], w.data[last][..]);
}

/// HEADs of every key, `CONCURRENCY` in flight.
async fn direct_heads(store: &Arc<dyn ObjectStore>, prefix: &str, w: &Workload) {
    let paths = direct_paths(prefix, w);
    let found: Vec<_> = futures::stream::iter(&paths)
        .map(|p| store.head(p))
        .buffered(CONCURRENCY)
        .collect()
        .await;
    assert!(found.iter().all(|r| r.is_ok()));
}

/// `exists` of every key, `batch` keys a call.
async fn exists_batches(tier: &dyn StorageTier, w: &Workload, batch: usize) {
    for keys in w.keys.chunks(batch) {
        assert_eq!(tier.exists(keys).await.unwrap(), keys.len());
    }
}

fn median(mut v: Vec<Sample>) -> Sample {
    v.sort_by_key(|s| s.elapsed);
    v[v.len() / 2]
}

fn row(w: &Workload, name: &str, s: Sample, base: Sample, base_name: &str) {
    let n = w.keys.len() as f64;
    let secs = s.elapsed.as_secs_f64();
    println!(
        "{:>6} KiB  {name:<22} {:>8.0} pages/s {:>6.2} GB/s {:>5.2} x {base_name}   cpu client {:>4.2} s, server {:>4.2} s",
        w.page >> 10,
        n / secs,
        n * w.page as f64 / secs / 1e9,
        base.elapsed.as_secs_f64() / secs,
        s.client_cpu,
        s.server_cpu,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::var("KVTIER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let server = S3Server::start();
    let settings = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    );
    let store = settings.build().unwrap();
    let plain = ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new("tier")).unwrap();
    let nixl = NixlObjTier::open(NixlObjConfig::new(settings.clone(), "nixl"))
        .await
        .unwrap();
    println!(
        "s3s-fs on 127.0.0.1, {CONCURRENCY} requests in flight, {rounds} rounds, medians; 2 cores shared by client and server"
    );
    for (w, batch) in [
        (Workload::new(64 << 10, 48 << 20, 1), 128),
        (Workload::new(2 << 20, 128 << 20, 2), 16),
    ] {
        let mut samples: Vec<[Sample; 8]> = Vec::new();
        let mut bufs = common::buffers(&w, batch);
        for _ in 0..rounds {
            samples.push([
                measure(&server, direct_put(&store, "direct", &w)).await,
                measure(&server, put_batches(&plain, &w, batch)).await,
                measure(&server, put_batches(&nixl, &w, batch)).await,
                measure(&server, direct_get(&store, "direct", &w, &mut bufs)).await,
                measure(&server, get_batches(&plain, &w, &mut bufs)).await,
                measure(&server, get_batches(&nixl, &w, &mut bufs)).await,
                measure(&server, direct_heads(&store, "direct", &w)).await,
                measure(&server, exists_batches(&plain, &w, batch)).await,
            ]);
        }
        let m: Vec<Sample> = (0..8)
            .map(|i| median(samples.iter().map(|s| s[i]).collect()))
            .collect();
        row(&w, "direct put (baseline)", m[0], m[0], "direct put");
        row(&w, "object_store tier put", m[1], m[0], "direct put");
        row(&w, "NIXL OBJ tier put", m[2], m[0], "direct put");
        row(&w, "direct get (baseline)", m[3], m[3], "direct get");
        row(&w, "object_store tier get", m[4], m[3], "direct get");
        row(&w, "NIXL OBJ tier get", m[5], m[3], "direct get");
        row(&w, "direct HEAD (baseline)", m[6], m[6], "direct HEAD");
        row(&w, "object tiers' exists", m[7], m[6], "direct HEAD");
    }
}
