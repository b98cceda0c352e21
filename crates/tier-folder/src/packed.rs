//! Page keys as a sampled index holds them: a key that ends in 64 lower-case hex digits (a
//! SHA-256 hex digest, as SGLang and vLLM name blocks, behind the adapters' namespace
//! prefixes) as those digits' 32 bytes and the number of its prefix, the prefix itself kept
//! once for all its keys; any other key as itself.

use std::collections::HashMap;

use tier_core::PageKey;

/// Distinct prefixes a [`Packer`] keeps at most; keys of later prefixes are kept whole.
const PREFIXES: usize = 1 << 16;
/// Hex digits of a digest.
const DIGITS: usize = 64;

/// A key, packed by a [`Packer`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Packed {
    /// The key's prefix by number, then its digest's bytes.
    Digest { prefix: u32, digest: [u8; 32] },
    /// The key whole.
    Key(PageKey),
}

/// Packs keys and unpacks them, holding the prefixes seen (never forgotten: ids stay valid).
pub struct Packer {
    ids: HashMap<Box<str>, u32>,
    prefixes: Vec<Box<str>>,
}

impl Default for Packer {
    fn default() -> Self {
        Packer {
            ids: HashMap::from([("".into(), 0)]),
            prefixes: vec!["".into()],
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
    /// `key` packed for storing: its prefix numbered (kept if new, while there is room).
    pub fn pack(&mut self, key: &PageKey) -> Packed {
        if let Some((prefix, digest)) = split(key.as_str()) {
            let known = self.ids.get(prefix).copied();
            let id = known.or_else(|| {
                let id = u32::try_from(self.prefixes.len()).ok()?;
                (self.prefixes.len() < PREFIXES).then(|| {
                    self.prefixes.push(prefix.into());
                    self.ids.insert(prefix.into(), id);
                    id
                })
            });
            if let Some(prefix) = id {
                return Packed::Digest { prefix, digest };
            }
        }
        Packed::Key(key.clone())
    }

    /// What `key` is stored under, if it is: the prefixes are never forgotten, so a key whose
    /// prefix is numbered was packed with it, and any other was kept whole.
    pub fn find(&self, key: &PageKey) -> Packed {
        if let Some((prefix, digest)) = split(key.as_str()) {
            if let Some(&prefix) = self.ids.get(prefix) {
                return Packed::Digest { prefix, digest };
            }
        }
        Packed::Key(key.clone())
    }

    /// The key `packed` stands for.
    pub fn key(&self, packed: &Packed) -> PageKey {
        match packed {
            Packed::Digest { prefix, digest } => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let prefix = &self.prefixes[*prefix as usize];
                let mut text = String::with_capacity(prefix.len() + DIGITS);
                text.push_str(prefix);
                for b in digest {
                    text.push(HEX[usize::from(b >> 4)] as char);
                    text.push(HEX[usize::from(b & 0xf)] as char);
                }
                PageKey::new(text).unwrap_or_else(|_| unreachable!("it was a key"))
            }
            Packed::Key(key) => key.clone(),
        }
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
            assert!(matches!(packed, Packed::Digest { .. }), "{key}");
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
            assert!(matches!(packer.pack(&key), Packed::Key(_)), "{other}");
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
        assert!(matches!(packer.pack(&late), Packed::Key(_)));
        assert!(matches!(packer.find(&late), Packed::Key(_)));
        assert!(matches!(
            packer.find(&k(&format!("7-{hex}"))),
            Packed::Digest { prefix: 7, .. }
        ));
    }
}
