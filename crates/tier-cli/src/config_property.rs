//! Generated configs, every field with ordinary, extreme and malformed values, through what
//! `kvtier check` runs (parse and plan) and what `replay` runs (open, one page round trip,
//! close): each answers a typed error naming a field or the file, or a hierarchy that works;
//! never a panic, never a hang; and a config that `check` accepts opens (or fails on the
//! machine, such as a folder that cannot be created, never on a value `check` let through).

use std::time::Duration;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_hierarchy::config::HierarchyConfig;

use crate::registry;

/// A small deterministic generator (xorshift), seeded per case so a failure replays.
struct Gen(u64);

impl Gen {
    fn pick<'a>(&mut self, values: &[&'a str]) -> &'a str {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        values[(self.0 % values.len() as u64) as usize]
    }
}

/// A field's values: ordinary ones, and extreme or malformed ones (picked one time in eight).
struct Values {
    good: &'static [&'static str],
    bad: &'static [&'static str],
}

const SIZES: Values = Values {
    good: &["4096", "\"64KiB\"", "\"512MiB\"", "1048576", "\"2MiB\""],
    bad: &[
        "1",
        "0",
        "\"0B\"",
        "-1",
        "\"8XB\"",
        "\"1e-10GiB\"",
        "\"nan\"",
        "18446744073709551615",
        "\"100TiB\"",
        "1.5",
        "\"\"",
    ],
};
const DURATIONS: Values = Values {
    good: &["\"10m\"", "\"30s\"", "\"1ms\""],
    bad: &[
        "\"1e-10s\"",
        "\"0s\"",
        "\"-1s\"",
        "\"100000000000h\"",
        "\"x\"",
        "5",
        "true",
    ],
};
const POLICIES: Values = Values {
    good: &[
        "\"auto\"",
        "\"lru\"",
        "\"prefix\"",
        "\"s3fifo\"",
        "\"radix\"",
        "\"sampled\"",
    ],
    bad: &["\"tinylfu\"", "\"bogus\"", "3"],
};
const COUNTS: Values = Values {
    good: &["1", "2", "16"],
    bad: &["0", "-3", "4000000000000000000", "\"many\""],
};

fn value(g: &mut Gen, values: &Values) -> &'static str {
    if g.pick(&[
        "bad", "good", "good", "good", "good", "good", "good", "good",
    ]) == "bad"
    {
        g.pick(values.bad)
    } else {
        g.pick(values.good)
    }
}

fn one_of(good: &'static [&'static str], bad: &'static [&'static str]) -> Values {
    Values { good, bad }
}

/// One field line, or nothing (the field left to its default).
fn field(g: &mut Gen, name: &str, values: &Values) -> String {
    match g.pick(&["set", "set", "unset"]) {
        "set" => format!("{name} = {}\n", value(g, values)),
        _ => String::new(),
    }
}

fn tier(g: &mut Gen, dir: &std::path::Path, n: usize) -> String {
    let mut t = String::new();
    match value(g, &one_of(&["mem", "nixl-file", "object"], &["nonsense"])) {
        "mem" => {
            t += "[[tiers]]\nkind = \"mem\"\n";
            t += &format!("capacity = {}\n", value(g, &SIZES));
            t += &field(g, "policy", &POLICIES);
            t += &field(g, "ttl", &DURATIONS);
            t += &field(g, "tti", &DURATIONS);
        }
        "nixl-file" => {
            t += "[[tiers]]\nkind = \"nixl-file\"\n";
            let folder = dir.join(format!("file{n}"));
            t += &format!(
                "dirs = {}\n",
                value(
                    g,
                    &one_of(&["FOLDER"], &["[]", "[\"/proc/kvtier-nowhere\"]", "\"x\""])
                )
                .replace("FOLDER", &format!("[{:?}]", folder.display().to_string()))
            );
            t += &field(g, "capacity", &SIZES);
            t += &field(g, "policy", &POLICIES);
            t += &field(g, "staging_bytes", &SIZES);
            t += &field(g, "staging_buffers", &COUNTS);
            t += &field(g, "transfer_timeout", &DURATIONS);
            t += &field(g, "max_abandoned", &SIZES);
            t += &field(
                g,
                "engine",
                &one_of(&["\"nixl\"", "\"syscalls\""], &["\"fast\""]),
            );
            let modes = one_of(&["\"auto\"", "\"on\"", "\"off\""], &["\"maybe\""]);
            t += &field(g, "path_mode", &modes);
            let direct = one_of(&["\"off\"", "\"preferred\""], &["\"always\""]);
            t += &field(g, "direct_io", &direct);
            let durability = one_of(&["\"process\"", "\"power\""], &["\"disk\""]);
            t += &field(g, "durability", &durability);
        }
        "object" => {
            t += "[[tiers]]\nkind = \"object\"\n";
            t += &format!(
                "store = {}\n",
                value(g, &one_of(&["\"memory\"", "\"local\""], &["\"ftp\""]))
            );
            t += &format!(
                "dir = {:?}\n",
                dir.join(format!("obj{n}")).display().to_string()
            );
            let prefixes = one_of(&["\"p\"", "\"a/b\""], &["\"\"", "\"../up\""]);
            t += &format!("prefix = {}\n", value(g, &prefixes));
            t += &field(g, "capacity", &SIZES);
            t += &field(g, "policy", &POLICIES);
            t += &field(g, "concurrency", &COUNTS);
            t += &field(g, "op_timeout", &DURATIONS);
        }
        _ => t += "[[tiers]]\nkind = \"tape\"\n",
    }
    t += &format!("name = \"t{n}\"\n");
    t
}

fn config(g: &mut Gen, dir: &std::path::Path) -> String {
    let mut text = String::new();
    if g.pick(&["with", "without"]) == "with" {
        text += "[hierarchy]\n";
        let writes = one_of(&["\"write-through\"", "\"write-back\""], &["\"sideways\""]);
        text += &field(g, "write", &writes);
        text += &field(g, "promote", &one_of(&["true", "false"], &["\"yes\""]));
        text += &field(g, "queue_bytes", &SIZES);
        text += &field(g, "flush_timeout", &DURATIONS);
        let admit = one_of(&["1", "2"], &["0", "4294967295", "4294967296", "-1"]);
        text += &field(g, "admit_after", &admit);
    }
    let tiers = value(g, &one_of(&["1", "2", "3"], &["0"]))
        .parse()
        .unwrap_or(1);
    for n in 0..tiers {
        text += &tier(g, dir, n);
    }
    text
}

/// A typed error must say what was wrong: a field (or the file), and a reason.
fn clear(e: &TierError, text: &str) {
    let message = e.to_string();
    assert!(
        message.len() > 10 && !message.contains("panicked"),
        "unclear error {message:?} for\n{text}"
    );
    if let TierError::Config { field, .. } = e {
        assert!(
            !field.is_empty(),
            "a config error names no field: {message}\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_configs_answer_an_error_or_a_working_hierarchy() {
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..300u64 {
        let dir = tempfile::tempdir().unwrap();
        let mut g = Gen(0x9e37_79b9_7f4a_7c15 ^ (case + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let text = config(&mut g, dir.path());
        let planned =
            HierarchyConfig::from_toml(&text).and_then(|c| registry().plan(&c).map(|_| c));
        let config = match planned {
            Err(e) => {
                clear(&e, &text);
                refused += 1;
                continue;
            }
            Ok(config) => config,
        };
        // `check` accepted it: it opens, works and closes, each within a bound.
        let bound = Duration::from_secs(30);
        let opened = tokio::time::timeout(bound, registry().build(&config))
            .await
            .unwrap_or_else(|_| panic!("case {case}: open hung\n{text}"));
        let hierarchy = match opened {
            Ok(hierarchy) => hierarchy,
            // The machine, not the config: a folder that cannot be created, or a listing
            // slower than a 1 ms `op_timeout` on a loaded machine.
            Err(e @ (TierError::Io { .. } | TierError::Timeout { .. })) => {
                clear(&e, &text);
                refused += 1;
                continue;
            }
            Err(e) => panic!("case {case}: check accepted, open failed: {e}\n{text}"),
        };
        let key = PageKey::new("k").unwrap();
        let page = Page::new(key.clone(), vec![7u8; 4096]);
        let stored = tokio::time::timeout(bound, hierarchy.put(&[page]))
            .await
            .unwrap_or_else(|_| panic!("case {case}: put hung\n{text}"));
        let mut buf = vec![0u8; 4096];
        let read = {
            let mut slots = [ReadSlot::new(key, &mut buf)];
            tokio::time::timeout(bound, hierarchy.get(&mut slots))
                .await
                .unwrap_or_else(|_| panic!("case {case}: get hung\n{text}"))
        };
        match (&stored[0], &read[0]) {
            (Ok(()), Ok(Lookup::Hit)) => assert!(buf.iter().all(|b| *b == 7), "case {case}"),
            // A page larger than a tiny tier is refused, or evicted at once.
            (Err(e), _) => clear(e, &text),
            (Ok(()), Ok(Lookup::Miss)) => {}
            // A 1 ms bound may expire under load: a typed timeout, not a wrong page.
            (Ok(()), Err(e @ TierError::Timeout { .. })) => clear(e, &text),
            (Ok(()), Err(e)) => panic!("case {case}: stored, then {e}\n{text}"),
        }
        // A flush bound of a millisecond may expire: a typed timeout, not a hang.
        let closed = tokio::time::timeout(bound, hierarchy.close())
            .await
            .unwrap_or_else(|_| panic!("case {case}: close hung\n{text}"));
        if let Err(e) = closed {
            assert!(
                matches!(e, TierError::Timeout { .. }),
                "case {case}: {e}\n{text}"
            );
        }
        accepted += 1;
    }
    println!("{accepted} configs opened and worked, {refused} refused with a clear error");
    assert!(
        accepted >= 20 && refused >= 20,
        "{accepted} accepted, {refused} refused"
    );
}
