//! Page content derived from (key, version, offset), so every page is distinct, every byte
//! checkable, and a reader can tell which write it saw.

use tier_core::{Bytes, PageKey};

fn mix(mut z: u64) -> u64 {
    // splitmix64 finaliser
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn seed(key: &PageKey, version: u64) -> u64 {
    // FNV-1a over the key, then mixed with the version.
    let h = key.as_str().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    mix(h ^ mix(version.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Fills `buf` with the content of `key` at `version`.
pub fn fill(key: &PageKey, version: u64, buf: &mut [u8]) {
    let s = seed(key, version);
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = mix(s ^ (i as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// A new page of `len` bytes with the content of `key` at `version`.
pub fn page(key: &PageKey, version: u64, len: usize) -> Bytes {
    let mut buf = vec![0u8; len];
    fill(key, version, &mut buf);
    Bytes::from(buf)
}

/// Compares every byte of `got` with the content of `key` at `version`; on a mismatch names the
/// first differing offset and how many bytes differ.
pub fn verify(key: &PageKey, version: u64, got: &[u8]) -> Result<(), String> {
    let want = page(key, version, got.len());
    let mut first = None;
    let mut wrong = 0usize;
    for (i, (a, b)) in got.iter().zip(want.iter()).enumerate() {
        if a != b {
            first.get_or_insert(i);
            wrong += 1;
        }
    }
    match first {
        None => Ok(()),
        Some(at) => Err(format!(
            "page {key} (version {version}, {} bytes): {wrong} bytes differ, first at offset {at}",
            got.len()
        )),
    }
}

/// Which of `versions` `got` holds exactly, if any.
pub fn which_version(key: &PageKey, versions: &[u64], got: &[u8]) -> Option<u64> {
    versions
        .iter()
        .copied()
        .find(|v| verify(key, *v, got).is_ok())
}
