//! Hierarchies from a file: a TOML or JSON document listing tiers by `kind` with their
//! parameters, and the policy. Kinds come from a [`Registry`]: built-in backends register
//! themselves, and a user adds a kind with one [`Registry::register`] call.
//!
//! ```toml
//! [hierarchy]
//! write = "write-through"   # or "write-back"
//! promote = true
//!
//! [[tiers]]
//! kind = "mem"
//! name = "dram"
//! capacity = "8GiB"
//!
//! [[tiers]]
//! kind = "nixl-file"
//! dirs = ["/mnt/nvme0/kv"]
//! ```
//!
//! Errors name the tier, the field and what was expected (`tiers[1].capacity: ...`).

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use crate::sealed::IntegrityConfig;
use crate::{HealthPolicy, HierarchyPolicy, TierError, WritePolicy};

mod registry;

pub use registry::{
    KindFactory, NamedPlan, OpenFuture, Registry, TierContext, TierPlan, OPEN_TIMEOUT,
};

/// A byte count written as a number or with a unit: `4096`, `"64KiB"`, `"8GiB"`, `"1.5GB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `"8GiB"`-style text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num
            .parse()
            .map_err(|_| format!("{text:?} is not a size: expected a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"))?;
        let scale: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            "TiB" | "T" => 1 << 40,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            other => return Err(format!("unknown size unit {other:?} in {text:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")),
        };
        let bytes = value * scale as f64;
        if !bytes.is_finite() || bytes > (1u64 << 60) as f64 {
            return Err(format!("{text:?} is larger than 1 EiB"));
        }
        Ok(Self(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            ("TiB", 1u64 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (name, scale) in units {
            if self.0 >= scale && self.0.is_multiple_of(scale) {
                return write!(f, "{}{name}", self.0 / scale);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Float(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) if n >= 0 => Ok(Self(n as u64)),
            Raw::Int(n) => Err(serde::de::Error::custom(format!(
                "a size cannot be negative ({n})"
            ))),
            Raw::Float(x) => Err(serde::de::Error::custom(format!(
                "a size in bytes must be a whole number, not {x}"
            ))),
            Raw::Text(t) => Self::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// A duration in seconds (`30`, `0.5`) or with a unit (`"500ms"`, `"2s"`, `"1m"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSpan(pub Duration);

impl TimeSpan {
    /// Parses `"30"`, `"0.5"`, `"500ms"`, `"2s"` or `"1m"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
            (n, 0.001)
        } else if let Some(n) = t.strip_suffix('s') {
            (n, 1.0)
        } else if let Some(n) = t.strip_suffix('m') {
            (n, 60.0)
        } else {
            (t, 1.0)
        };
        let secs =
            num.trim().parse::<f64>().map_err(|_| {
                format!("{t:?} is not a duration (e.g. 30, \"500ms\", \"2s\", \"1m\")")
            })? * scale;
        Self::from_secs(secs)
    }

    fn from_secs(secs: f64) -> Result<Self, String> {
        if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
            return Err(format!(
                "a duration must be positive and finite, not {secs}"
            ));
        }
        if secs < 1e-6 {
            return Err(format!(
                "a duration of {secs} s is below the 1 microsecond kvtier can wait"
            ));
        }
        Ok(Self(Duration::from_secs_f64(secs)))
    }
}

impl<'de> Deserialize<'de> for TimeSpan {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(x) => Self::from_secs(x),
            Raw::Text(t) => Self::parse(&t),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// The `[hierarchy]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `"write-through"` or `"write-back"`.
    pub write: WritePolicy,
    /// Copy lower hits into upper tiers.
    pub promote: bool,
    /// Bytes of pages the background queue holds before puts wait (default: a quarter of the
    /// top tier's capacity, or 1 GiB).
    pub queue_bytes: Option<ByteSize>,
    /// Bound on flush and close.
    pub flush_timeout: Option<TimeSpan>,
    /// Bound on opening each tier that can open in the background (a FILE tier: its mount
    /// may hang): past it, the hierarchy opens without it and it comes up once opened
    /// (default 10 s).
    pub open_timeout: Option<TimeSpan>,
    /// Requests of a key before its page is written below (default 1: every page).
    pub admit_after: u32,
    /// `[hierarchy.health]`: when a tier counts as slow or down.
    pub health: HealthConfig,
}

/// The `[hierarchy.health]` table; every field optional (see [`HealthPolicy`]).
///
/// ```toml
/// [hierarchy.health]
/// trip_after = 3          # failed calls in a row before a tier is down (0: no breaker)
/// stall_after = "2s"      # a call unanswered this long marks its tier down
/// slow_after = "1s"       # 90th percentile of recent calls over which a tier is slow
/// probe_backoff = "500ms" # first wait before a down tier is probed (doubles)
/// probe_backoff_max = "30s"
/// probe_timeout = "2s"
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Failed calls in a row before a tier is down (a timeout counts at once); 0: never.
    pub trip_after: Option<u32>,
    /// A call unanswered this long marks its tier down.
    pub stall_after: Option<TimeSpan>,
    /// The 90th percentile of recent calls over which a tier is slow.
    pub slow_after: Option<TimeSpan>,
    /// The first wait before a down tier is probed.
    pub probe_backoff: Option<TimeSpan>,
    /// The longest wait between probes.
    pub probe_backoff_max: Option<TimeSpan>,
    /// Bound on one probe.
    pub probe_timeout: Option<TimeSpan>,
}

impl HealthConfig {
    /// The policy these settings give, over the defaults.
    pub fn policy(&self) -> HealthPolicy {
        let d = HealthPolicy::default();
        HealthPolicy {
            trip_after: self.trip_after.unwrap_or(d.trip_after),
            stall_after: self.stall_after.map_or(d.stall_after, |t| t.0),
            slow_after: self.slow_after.map(|t| t.0).or(d.slow_after),
            probe_backoff: self.probe_backoff.map_or(d.probe_backoff, |t| t.0),
            probe_backoff_max: self.probe_backoff_max.map_or(d.probe_backoff_max, |t| t.0),
            probe_timeout: self.probe_timeout.map_or(d.probe_timeout, |t| t.0),
        }
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        let d = HierarchyPolicy::default();
        Self {
            write: WritePolicy::WriteThrough,
            promote: d.promote,
            queue_bytes: None,
            flush_timeout: None,
            open_timeout: None,
            admit_after: d.admit_after,
            health: HealthConfig::default(),
        }
    }
}

/// One `[[tiers]]` entry: its kind, optional name, and the kind's own parameters.
#[derive(Debug, Clone, Deserialize)]
pub struct TierSpec {
    /// Registered kind, e.g. `"mem"`.
    pub kind: String,
    /// Instance name; defaults to the kind.
    pub name: Option<String>,
    /// Keyed page integrity for a tier others can write (see [`crate::sealed`]).
    #[serde(default)]
    pub integrity: Option<IntegrityConfig>,
    /// Everything else in the entry, for the kind's factory.
    #[serde(flatten)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// A whole config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HierarchyConfig {
    /// Policy.
    #[serde(default)]
    pub hierarchy: PolicyConfig,
    /// Tiers, fastest first.
    pub tiers: Vec<TierSpec>,
}

impl HierarchyConfig {
    /// Reads a `.toml` or `.json` file.
    pub fn from_file(path: &Path) -> Result<Self, TierError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TierError::io("read config", None, Some(path.to_path_buf()), e))?;
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Self::from_json(&text),
            _ => Self::from_toml(&text),
        }
    }

    /// Parses TOML.
    pub fn from_toml(text: &str) -> Result<Self, TierError> {
        // The message and position only: toml's own text quotes the line, which may hold a
        // secret key.
        let value: toml::Value = toml::from_str(text).map_err(|e| {
            let at = e.span().map_or_else(String::new, |span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(" at line {line}, column {column}")
            });
            TierError::config("(file)", format!("not valid TOML{at}: {}", e.message()))
        })?;
        let json =
            serde_json::to_value(value).map_err(|e| TierError::config("(file)", e.to_string()))?;
        Self::from_value(json)
    }

    /// Parses JSON.
    pub fn from_json(text: &str) -> Result<Self, TierError> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| TierError::config("(file)", format!("not valid JSON: {e}")))?;
        Self::from_value(value)
    }

    fn from_value(value: serde_json::Value) -> Result<Self, TierError> {
        let config: Self = deserialize_at("", value)?;
        if config.tiers.is_empty() {
            return Err(TierError::config("tiers", "list at least one tier"));
        }
        if config.hierarchy.admit_after == 0 {
            return Err(TierError::config(
                "hierarchy.admit_after",
                "must be at least 1 (1: every page is written below)",
            ));
        }
        if config.hierarchy.queue_bytes == Some(ByteSize(0)) {
            return Err(TierError::config(
                "hierarchy.queue_bytes",
                "the queue must hold at least one byte",
            ));
        }
        Ok(config)
    }

    /// The hierarchy policy.
    pub fn policy(&self) -> HierarchyPolicy {
        let d = HierarchyPolicy::default();
        HierarchyPolicy {
            write: self.hierarchy.write,
            promote: self.hierarchy.promote,
            queue_bytes: self.hierarchy.queue_bytes.map(|b| b.0),
            flush_timeout: self
                .hierarchy
                .flush_timeout
                .map_or(d.flush_timeout, |s| s.0),
            admit_after: self.hierarchy.admit_after,
            health: self.hierarchy.health.policy(),
        }
    }
}

/// Deserialises `value` into `T`, naming the failing field under `prefix`.
pub fn deserialize_at<T: DeserializeOwned>(
    prefix: &str,
    value: serde_json::Value,
) -> Result<T, TierError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = match (prefix.is_empty(), path.as_str()) {
            (true, p) => p.to_string(),
            (false, ".") => prefix.to_string(),
            (false, p) => format!("{prefix}.{p}"),
        };
        TierError::config(field, e.into_inner().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toml_syntax_error_names_its_place_without_quoting_the_line() {
        let text = "[[tiers]]\nkind = \"object\"\nsecret_key = \"hunter2-secret\" oops\n";
        let e = HierarchyConfig::from_toml(text).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        assert!(!e.contains("hunter2"), "the secret is quoted: {e}");
    }

    #[test]
    fn sizes_parse_with_units_and_reject_nonsense() {
        assert_eq!(ByteSize::parse("8GiB").unwrap().0, 8 << 30);
        assert_eq!(ByteSize::parse("64KiB").unwrap().0, 64 << 10);
        assert_eq!(ByteSize::parse("1.5GB").unwrap().0, 1_500_000_000);
        assert_eq!(ByteSize::parse("4096").unwrap().0, 4096);
        assert!(ByteSize::parse("8XB").unwrap_err().contains("unit"));
        assert!(ByteSize::parse("-1GiB").is_err());
        assert!(ByteSize::parse("99999999TiB")
            .unwrap_err()
            .contains("1 EiB"));
        assert_eq!(ByteSize(8 << 30).to_string(), "8GiB");
    }

    #[test]
    fn absurd_queues_and_vanishing_durations_are_refused() {
        let err =
            HierarchyConfig::from_toml("[hierarchy]\nqueue_bytes = 0\n[[tiers]]\nkind = \"mem\"\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("hierarchy.queue_bytes"), "{err}");
        for field in ["flush_timeout = \"1e-10s\"", "flush_timeout = 1e-10"] {
            let err = HierarchyConfig::from_toml(&format!(
                "[hierarchy]\n{field}\n[[tiers]]\nkind = \"mem\"\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("1 microsecond"), "{field}: {err}");
        }
        HierarchyConfig::from_toml(
            "[hierarchy]\nflush_timeout = \"5ms\"\n[[tiers]]\nkind = \"mem\"\n",
        )
        .unwrap();
    }

    #[test]
    fn errors_name_the_tier_and_field() {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct MemParams {
            capacity: ByteSize,
        }
        let config = HierarchyConfig::from_toml(
            "[[tiers]]\nkind = \"mem\"\n\n[[tiers]]\nkind = \"mem\"\ncapacity = -5\n",
        )
        .unwrap();
        let ctx = TierContext {
            name: "m".into(),
            field: "tiers[1]".into(),
            params: config.tiers[1].params.clone(),
        };
        match ctx.params::<MemParams>() {
            Err(TierError::Config { field, message }) => {
                assert_eq!(field, "tiers[1].capacity");
                assert!(message.contains("negative"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let unknown = Registry::default().plan(&config).err().unwrap();
        assert!(
            unknown.to_string().contains("tiers[0].kind")
                && unknown.to_string().contains("unknown kind"),
            "{unknown}"
        );
        match HierarchyConfig::from_toml(
            "[hierarchy]\nwrite = \"sideways\"\n[[tiers]]\nkind = \"mem\"\n",
        ) {
            Err(TierError::Config { field, .. }) => assert_eq!(field, "hierarchy.write"),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(HierarchyConfig::from_json("{\"tiers\": []}"), Err(TierError::Config { field, .. }) if field == "tiers")
        );
    }
}
