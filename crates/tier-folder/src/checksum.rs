//! Page checksums: a CRC-32C of each page's bytes, kept in its file's trailer (see
//! [`super::format`]). Sealed into the temp file before the rename; read after each read,
//! between the transfer and the identity check that proves the trailer and the bytes are one
//! file's; a page whose bytes do not match (a torn or zeroed write after a power loss, disk
//! corruption, an edit by hand) or whose file records no checksum is a miss and a counted
//! error, never a hit.

/// Whether pages carry checksums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageChecksum {
    /// A CRC-32C per page, in its file's trailer, verified on every read.
    #[default]
    Crc32c,
    /// None: a page's bytes are trusted as read.
    Off,
}

/// How often a page file's bytes are checked against its checksum.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyReads {
    /// Once per file version in this process: a page file is never written in place (a put
    /// renames a new file over it), and any write to a file changes its identity (device,
    /// inode, length, mtime, ctime; ctime cannot be set from user space). A read of a version
    /// already verified, unchanged from before the read to after it, skips the checksum;
    /// pages under 64 KiB (whose checksum costs less than the two `stat`s) are always checked.
    #[default]
    Once,
    /// On every read.
    EveryRead,
}

pub use tier_format::checksum::{of, Crc};
