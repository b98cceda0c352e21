//! The stored page format (version 2), one for page files and objects: a page's bytes exactly,
//! then a 32-byte trailer that says what they are, so every stored page carries its own proof
//! on every filesystem and store (no extended attributes, no object metadata). The page's
//! bytes start at offset 0, so a transfer moves them in place.
//!
//! Trailer, little-endian: `KVTP` magic (4), format version (1), flags (1: bit 0 = the page's
//! CRC-32C is present), zero (2), page length (8), the key's [`route_hash`] (8), the page's
//! CRC-32C (4), the CRC-32C of the trailer's first 28 bytes (4). Stored bytes whose trailer is
//! missing, torn, of another version, another key or another length are not a page: a miss,
//! never a hit.

pub mod checksum;

use tier_core::PageKey;

/// Bytes a stored page holds beyond the page.
pub const TRAILER: u64 = 32;
/// The format this build writes and reads.
pub const VERSION: u8 = 2;

const MAGIC: [u8; 4] = *b"KVTP";
const HAS_CRC: u8 = 1;

/// The stored length of a page of `page_len` bytes.
pub fn sealed_len(page_len: usize) -> u64 {
    page_len as u64 + TRAILER
}

/// The page length stored bytes of `sealed_len` can hold, if they can hold one.
pub fn page_len(sealed_len: u64) -> Option<u64> {
    sealed_len.checked_sub(TRAILER)
}

/// The stable hash of a key (part of the stored format: trailers and file layouts carry it).
pub fn route_hash(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in bytes {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The trailer of `key`'s page of `page_len` bytes, with its CRC-32C if taken.
pub fn encode(key: &PageKey, page_len: u64, crc: Option<u32>) -> [u8; TRAILER as usize] {
    let mut t = [0u8; TRAILER as usize];
    t[0..4].copy_from_slice(&MAGIC);
    t[4] = VERSION;
    t[5] = if crc.is_some() { HAS_CRC } else { 0 };
    t[8..16].copy_from_slice(&page_len.to_le_bytes());
    t[16..24].copy_from_slice(&route_hash(key.as_str().as_bytes()).to_le_bytes());
    t[24..28].copy_from_slice(&crc.unwrap_or(0).to_le_bytes());
    let own = checksum::of([&t[..28]]);
    t[28..32].copy_from_slice(&own.to_le_bytes());
    t
}

/// What stored bytes' last [`TRAILER`] bytes say of them, read as `key`'s page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trailer {
    /// A whole page of `key`: its CRC-32C, if it was written with one.
    Page(Option<u32>),
    /// Not a page of this format for this key (why).
    Not(&'static str),
}

/// Whether `t` is a trailer this format writes (its magic, version and own checksum), whatever
/// key and length it names: stored bytes ending so are of this format.
pub fn is_of_this_format(t: &[u8; TRAILER as usize]) -> bool {
    t[0..4] == MAGIC && t[4] == VERSION && t[28..32] == checksum::of([&t[..28]]).to_le_bytes()
}

/// Reads trailer `t` of stored bytes of `sealed_len` as `key`'s page.
pub fn decode(t: &[u8; TRAILER as usize], key: &PageKey, sealed_len: u64) -> Trailer {
    let word = |at: usize| u32::from_le_bytes(t[at..at + 4].try_into().expect("4 bytes"));
    let long = |at: usize| u64::from_le_bytes(t[at..at + 8].try_into().expect("8 bytes"));
    if t[0..4] != MAGIC {
        return Trailer::Not("no page trailer (torn, foreign, or of format 1)");
    }
    if word(28) != checksum::of([&t[..28]]) {
        return Trailer::Not("the trailer's own checksum does not match");
    }
    if t[4] != VERSION {
        return Trailer::Not("a page of another format version");
    }
    if Some(long(8)) != page_len(sealed_len) {
        return Trailer::Not("the stored length is not the page's");
    }
    if long(16) != route_hash(key.as_str().as_bytes()) {
        return Trailer::Not("the page of another key");
    }
    Trailer::Page((t[5] & HAS_CRC != 0).then(|| word(24)))
}

/// The trailer sealing `key`'s page of `regions` (its bytes, in order), with their CRC-32C.
pub fn seal<'a>(
    key: &PageKey,
    regions: impl IntoIterator<Item = &'a [u8]>,
) -> [u8; TRAILER as usize] {
    let mut crc = checksum::Crc::new();
    let mut len = 0u64;
    for region in regions {
        crc.update(region);
        len += region.len() as u64;
    }
    encode(key, len, Some(crc.value()))
}

/// The page `stored` holds as `key`'s: its bytes before the trailer, if the trailer is this
/// key's, whole, and records a CRC-32C they match; otherwise why not.
pub fn open<'a>(key: &PageKey, stored: &'a [u8]) -> Result<&'a [u8], &'static str> {
    let Some(at) = page_len(stored.len() as u64) else {
        return Err("shorter than a trailer");
    };
    let (page, t) = stored.split_at(at as usize);
    let t: &[u8; TRAILER as usize] = t.try_into().expect("a trailer's bytes");
    match decode(t, key, stored.len() as u64) {
        Trailer::Page(Some(crc)) if crc == checksum::of([page]) => Ok(page),
        Trailer::Page(Some(_)) => Err("the page's bytes do not match its checksum"),
        Trailer::Page(None) => Err("the page records no checksum"),
        Trailer::Not(why) => Err(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> PageKey {
        PageKey::new(s).unwrap()
    }

    #[test]
    fn a_trailer_reads_back_only_as_its_own_page() {
        let t = encode(&key("a"), 10, Some(7));
        assert_eq!(decode(&t, &key("a"), 42), Trailer::Page(Some(7)));
        assert_eq!(
            decode(&encode(&key("a"), 10, None), &key("a"), 42),
            Trailer::Page(None)
        );
        assert!(matches!(decode(&t, &key("b"), 42), Trailer::Not(_)));
        assert!(matches!(decode(&t, &key("a"), 43), Trailer::Not(_)));
        for byte in 0..TRAILER as usize {
            let mut torn = t;
            torn[byte] ^= 0x10;
            assert!(
                matches!(decode(&torn, &key("a"), 42), Trailer::Not(_)),
                "a flip in byte {byte} went unseen"
            );
        }
        assert!(matches!(
            decode(&[0; TRAILER as usize], &key("a"), 42),
            Trailer::Not(_)
        ));
    }

    #[test]
    fn a_sealed_page_opens_only_whole_and_as_its_own_key() {
        let page = b"0123456789";
        let mut stored = page.to_vec();
        stored.extend_from_slice(&seal(&key("k"), [&page[..4], &page[4..]]));
        assert_eq!(stored.len() as u64, sealed_len(page.len()));
        assert_eq!(open(&key("k"), &stored), Ok(&page[..]));
        assert!(open(&key("other"), &stored).is_err());
        assert!(open(&key("k"), page).is_err(), "a page of format 1");
        assert!(open(&key("k"), &stored[..stored.len() - 1]).is_err(), "cut");
        for byte in 0..stored.len() {
            let mut flipped = stored.clone();
            flipped[byte] ^= 1;
            assert!(open(&key("k"), &flipped).is_err(), "a flip in byte {byte}");
        }
        let mut unsummed = page.to_vec();
        unsummed.extend_from_slice(&encode(&key("k"), 10, None));
        assert!(open(&key("k"), &unsummed).is_err(), "no checksum");
    }

    #[test]
    fn the_route_hash_is_stable() {
        assert_eq!(route_hash(b"abc"), 0x0dd4_9049_0804_b508);
        assert_eq!(route_hash(&[b'f'; 64]), 0x8ccb_da23_24a3_634f);
    }
}
