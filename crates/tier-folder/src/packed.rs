//! Page keys as a sampled index holds them: a key that ends in 64 lower-case hex digits (a
//! SHA-256 hex digest, as SGLang and vLLM name blocks, behind the adapters' namespace
//! prefixes) as those digits' 32 bytes and the number of its prefix, the prefix itself kept
//! once for all its keys; any other key by a number, the key itself kept beside. Either way
//! 34 bytes aligned to 2, so that a sampled index's slot is 52 bytes.

use std::collections::HashMap;

use tier_core::PageKey;

/// Distinct prefixes a [`Packer`] keeps at most (numbered below [`WHOLE`]); keys of later
/// prefixes are kept whole.
const PREFIXES: usize = u16::MAX as usize;
/// Hex digits of a digest.
const DIGITS: usize = 64;
/// The prefix number of a key kept whole: its number is in the digest's first 4 bytes.
const WHOLE: u16 = u16::MAX;
/// The number of a key kept whole that no key has (what a key not held is found under).
const NO_KEY: u32 = u32::MAX;

/// A key, packed by a [`Packer`]: its prefix's number and its digest's bytes, or [`WHOLE`]
/// and the number of the key kept whole.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packed {
    prefix: u16,
    digest: [u8; 32],
}

impl Packed {
    fn whole(id: u32) -> Self {
        let mut digest = [0u8; 32];
        digest[..4].copy_from_slice(&id.to_le_bytes());
        Packed {
            prefix: WHOLE,
            digest,
        }
    }

    /// The number of the key kept whole it stands for, if it stands for one.
    fn whole_id(&self) -> Option<u32> {
        let mut id = [0u8; 4];
        id.copy_from_slice(&self.digest[..4]);
        (self.prefix == WHOLE).then(|| u32::from_le_bytes(id))
    }
}

/// Packs keys and unpacks them, holding the prefixes seen (never forgotten: ids stay valid)
/// and the keys kept whole (each until its entry is forgotten, see [`Packer::forget`]).
pub struct Packer {
    ids: HashMap<Box<str>, u16>,
    prefixes: Vec<Box<str>>,
    /// Keys kept whole, by number; `None` for a number free again.
    wholes: Vec<Option<PageKey>>,
    whole_ids: HashMap<PageKey, u32>,
    free: Vec<u32>,
}

impl Default for Packer {
    fn default() -> Self {
        Packer {
            ids: HashMap::from([("".into(), 0)]),
            prefixes: vec!["".into()],
            wholes: Vec::new(),
            whole_ids: HashMap::new(),
            free: Vec::new(),
        }
    }
}

/// `key` split into its prefix and the bytes of the 64 lower-case hex digits that end it.
fn split(key: &str) -> Option<(&str, [u8; 32])> {
    let at = key.len().checked_sub(DIGITS)?;
    let (prefix, digits) = (key.get(..at)?, key.get(at..)?.as_bytes());
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(digits.chunks(2)) {
        *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some((prefix, digest))
}

impl Packer {
    /// `key` packed for storing: its prefix numbered (kept if new, while there is room), or
    /// the key kept whole under a number of its own.
    pub fn pack(&mut self, key: &PageKey) -> Packed {
        if let Some((prefix, digest)) = split(key.as_str()) {
            let known = self.ids.get(prefix).copied();
            let id = known.or_else(|| {
                let id = u16::try_from(self.prefixes.len()).ok()?;
                (self.prefixes.len() < PREFIXES).then(|| {
                    self.prefixes.push(prefix.into());
                    self.ids.insert(prefix.into(), id);
                    id
                })
            });
            if let Some(prefix) = id {
                return Packed { prefix, digest };
            }
        }
        if let Some(&id) = self.whole_ids.get(key) {
            return Packed::whole(id);
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.wholes[id as usize] = Some(key.clone());
                id
            }
            None => {
                // Past 2^32 - 1 keys kept whole the last number is shared: never reached.
                let id = u32::try_from(self.wholes.len()).map_or(NO_KEY - 1, |n| n.min(NO_KEY - 1));
                self.wholes.push(Some(key.clone()));
                id
            }
        };
        self.whole_ids.insert(key.clone(), id);
        Packed::whole(id)
    }

    /// What `key` is stored under, if it is: the prefixes are never forgotten, so a key whose
    /// prefix is numbered was packed with it, and any other was kept whole (or is not held:
    /// then a number no key has).
    pub fn find(&self, key: &PageKey) -> Packed {
        if let Some((prefix, digest)) = split(key.as_str()) {
            if let Some(&prefix) = self.ids.get(prefix) {
                return Packed { prefix, digest };
            }
        }
        Packed::whole(self.whole_ids.get(key).copied().unwrap_or(NO_KEY))
    }

    /// The key `packed` stands for.
    pub fn key(&self, packed: &Packed) -> PageKey {
        if let Some(id) = packed.whole_id() {
            if let Some(Some(key)) = self.wholes.get(id as usize) {
                return key.clone();
            }
            unreachable!("a key kept whole is kept until it is forgotten");
        }
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let prefix = &self.prefixes[usize::from(packed.prefix)];
        let mut text = String::with_capacity(prefix.len() + DIGITS);
        text.push_str(prefix);
        for b in packed.digest {
            text.push(HEX[usize::from(b >> 4)] as char);
            text.push(HEX[usize::from(b & 0xf)] as char);
        }
        PageKey::new(text).unwrap_or_else(|_| unreachable!("it was a key"))
    }

    /// Lets go of the key `packed` stands for, if it was kept whole: its entry is gone.
    pub fn forget(&mut self, packed: &Packed) {
        let Some(id) = packed.whole_id() else {
            return;
        };
        if let Some(key) = self.wholes.get_mut(id as usize).and_then(Option::take) {
            self.whole_ids.remove(&key);
            self.free.push(id);
        }
    }

    /// Lets go of every key kept whole: every entry is gone.
    pub fn forget_all(&mut self) {
        self.wholes.clear();
        self.whole_ids.clear();
        self.free.clear();
    }

    /// Keys kept whole now.
    #[cfg(test)]
    pub fn kept_whole(&self) -> usize {
        self.whole_ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> PageKey {
        PageKey::new(s).unwrap()
    }

    /// Keys ending in 64 lower-case hex digits, bare or behind a namespace, are packed (their
    /// prefix kept once) and come back as they were; any other key is kept whole.
    #[test]
    fn digest_keys_are_packed_and_come_back_the_same() {
        let mut packer = Packer::default();
        let hex = "0123456789abcdef".repeat(4);
        for key in [
            hex.clone(),
            format!("sgl-model-{hex}"),
            format!("tp0-sgl-{hex}"),
        ] {
            let key = k(&key);
            let packed = packer.pack(&key);
            assert!(packed.whole_id().is_none(), "{key}");
            assert!(packer.find(&key) == packed, "{key} is found as packed");
            assert_eq!(packer.key(&packed), key);
        }
        assert_eq!(
            packer.prefixes.len(),
            3,
            "\"\", \"sgl-model-\", \"tp0-sgl-\""
        );
        for other in [
            "0123456789ABCDEF".repeat(4),
            "0123456789abcdeg".repeat(4),
            "short".to_string(),
            format!("{hex}-suffix"),
        ] {
            let key = k(&other);
            assert!(packer.pack(&key).whole_id().is_some(), "{other}");
            assert_eq!(packer.key(&packer.find(&key)), key);
        }
    }

    /// Past its room for prefixes a key of a new prefix is kept whole, and found so.
    #[test]
    fn keys_of_prefixes_past_the_room_are_kept_whole() {
        let mut packer = Packer::default();
        let hex = "ab".repeat(32);
        for i in 1..PREFIXES {
            packer.pack(&k(&format!("{i}-{hex}")));
        }
        let late = k(&format!("late-{hex}"));
        assert!(packer.pack(&late).whole_id().is_some());
        assert!(packer.find(&late) == packer.pack(&late));
        assert_eq!(packer.find(&k(&format!("7-{hex}"))).prefix, 7);
    }

    /// A key kept whole is held until its entry is forgotten, its number then free for
    /// another; a key not held is found under a number no key has.
    #[test]
    fn keys_kept_whole_are_let_go_when_forgotten() {
        let mut packer = Packer::default();
        let (a, b) = (k("page-a"), k("page-b"));
        let pa = packer.pack(&a);
        assert!(packer.pack(&a) == pa, "packed twice, kept once");
        assert_eq!(packer.kept_whole(), 1);
        assert!(packer.find(&b) != pa, "a key not held matches none held");
        packer.forget(&pa);
        assert_eq!(packer.kept_whole(), 0);
        let pb = packer.pack(&b);
        assert!(pb == pa, "the number is used again");
        assert_eq!(packer.key(&pb), b);
        packer.forget_all();
        assert_eq!(packer.kept_whole(), 0);
    }
}
