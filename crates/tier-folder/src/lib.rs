//! kvtier's folder cache: pages as files under N storage folders x 256 buckets, and
//! everything about those files that is not how their bytes move.
//!
//! - [`layout`]: where a page lives (folder, bucket, escaped name), temp names, bucket
//!   pre-creation, scans. [`format`]: the page file's trailer; [`marker`]: each folder's format
//!   marker.
//! - [`catalog`]: the pages a tier stores, as files and index entries changed together;
//!   [`index`]: entries, generations, checksums, capacity and eviction order ([`packed`]
//!   keys).
//! - [`fleet`]: folders shared by many processes: the usage count, the evictor's lease,
//!   eviction windows. [`settings`]: how folders are shared.
//! - [`perms`]: folder modes and files made without following links. [`probe`]: what a
//!   folder's filesystem gives (`kvtier probe`). [`checksum`]: CRC-32C.
//! - [`io`]: what an I/O engine moves (a batch of [`io::Xfer`]) and kvtier's own engine,
//!   the system calls. NIXL's FILE engine, over the same types, is in `tier-nixl`.

pub mod bounded;
pub mod catalog;
pub mod checksum;
pub mod fleet;
pub mod format;
pub mod index;
pub mod io;
pub mod layout;
pub mod marker;
pub mod packed;
pub mod perms;
pub mod probe;
pub mod settings;

pub use bounded::BoundedIo;
pub use checksum::{PageChecksum, VerifyReads};
pub use fleet::FleetStats;
pub use format::TRAILER as PAGE_TRAILER;
pub use layout::{route_hash, BUCKETS};
pub use perms::FolderMode;
pub use probe::{probe_folder, FolderProbe, LockReach};
pub use settings::{FileAccess, SharedFolder, SharedLocks};
