//! The history checker: every answer of a run held against what the calls before it, and
//! those running beside it, allow (whole pages of an acknowledged or running version, or a
//! miss where a loss is allowed; never a torn, stale, resurrected or foreign page).

use std::collections::HashMap;

use tier_core::PageKey;

use super::{Answer, Call, Event, HistoryCounts, Seen, Written};
use crate::content;

/// Checks every answer of `events` (sorted by start); returns counts and violations.
pub(crate) fn check(
    names: &[PageKey],
    events: &[Event],
    may_lose: bool,
) -> (HistoryCounts, Vec<(usize, usize, String)>) {
    let mut written: HashMap<usize, Vec<Written>> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Call::Put(pages) = &e.call {
            for (n, &(k, version, len)) in pages.iter().enumerate() {
                let acked = matches!(&e.answer, Answer::Put(errs) if errs[n].is_none());
                written.entry(k).or_default().push(Written {
                    event: i,
                    version,
                    len,
                    acked,
                });
            }
        }
    }
    let none = Vec::new();
    let versions_of = |k: usize| written.get(&k).unwrap_or(&none);
    // Whether the version written by event `w` was superseded for `key` before `at`.
    let superseded = |key: usize, w: usize, at: u64| {
        events
            .iter()
            .enumerate()
            .any(|(x, e)| x != w && e.supersedes(key) && events[w].end < e.start && e.end < at)
    };
    // The acknowledged version `key` must hold during [from, to], if any.
    // (`asking` is the call asking, which may touch the key itself.)
    let must_hold = |key: usize, asking: usize| -> Option<&Written> {
        let (from, to) = (events[asking].start, events[asking].end);
        versions_of(key).iter().filter(|w| w.acked).find(|w| {
            events[w.event].end < from
                && !events.iter().enumerate().any(|(y, e)| {
                    y != w.event
                        && y != asking
                        && e.touches(key)
                        && e.end > events[w.event].start
                        && e.start < to
                })
        })
    };
    let mut counts = HistoryCounts::default();
    let mut bad = Vec::new();
    for (asking, e) in events.iter().enumerate() {
        counts.calls += 1;
        let at = format!("task {} call at [{}, {}]", e.task, e.start, e.end);
        match (&e.call, &e.answer) {
            (_, Answer::Dropped) => counts.cancelled += 1,
            (Call::Put(pages), Answer::Put(errs)) => {
                for ((k, v, _), err) in pages.iter().zip(errs) {
                    if let Some(err) = err {
                        counts.errors += 1;
                        if !may_lose {
                            bad.push((
                                *k,
                                asking,
                                format!("{at}: put of {} v{v} failed: {err}", names[*k]),
                            ));
                        }
                    }
                }
            }
            (Call::Get(slots), Answer::Get(seen)) => {
                for (&(k, len), s) in slots.iter().zip(seen) {
                    let key = &names[k];
                    match s {
                        Seen::Hit(buf) => {
                            counts.hits += 1;
                            let found = versions_of(k).iter().find(|w| {
                                w.len == len
                                    && events[w.event].start < e.end
                                    && content::verify(key, w.version, buf).is_ok()
                            });
                            match found {
                                None => bad.push((k, asking, format!(
                                    "{at}: get of {key} ({len} B) is a hit on bytes no put wrote (torn or foreign)"
                                ))),
                                Some(w) if superseded(k, w.event, e.start) => bad.push((k, asking, format!(
                                    "{at}: get of {key} returned v{} (put at [{}, {}]), superseded before the get began (stale or resurrected)",
                                    w.version, events[w.event].start, events[w.event].end
                                ))),
                                Some(_) => {}
                            }
                        }
                        Seen::Mismatch(stored) => {
                            let possible = versions_of(k).iter().any(|w| {
                                w.len == *stored
                                    && events[w.event].start < e.end
                                    && !superseded(k, w.event, e.start)
                            });
                            if !possible {
                                bad.push((k, asking, format!(
                                    "{at}: get of {key} says {stored} B are stored: no current version has that length"
                                )));
                            }
                        }
                        Seen::Miss | Seen::Error(_) => {
                            if let Seen::Error(err) = s {
                                counts.errors += 1;
                                if !may_lose {
                                    bad.push((
                                        k,
                                        asking,
                                        format!("{at}: get of {key} failed: {err}"),
                                    ));
                                }
                            } else {
                                counts.misses += 1;
                            }
                            if let (false, Some(w)) = (may_lose, must_hold(k, asking)) {
                                bad.push((k, asking, format!(
                                    "{at}: get of {key} ({len} B) found nothing, but v{} ({} B) was acknowledged at {} and untouched since (lost write)",
                                    w.version, w.len, events[w.event].end
                                )));
                            }
                        }
                    }
                }
            }
            (Call::Exists(keys), Answer::Exists(r)) => match r {
                Err(err) => {
                    counts.errors += 1;
                    if !may_lose {
                        bad.push((usize::MAX, asking, format!("{at}: exists failed: {err}")));
                    }
                }
                Ok(n) if *n > keys.len() => bad.push((
                    usize::MAX,
                    asking,
                    format!("{at}: exists of {} keys answered {n}", keys.len()),
                )),
                Ok(n) => {
                    for &k in &keys[..*n] {
                        let live = versions_of(k).iter().any(|w| {
                            events[w.event].start < e.end && !superseded(k, w.event, e.start)
                        });
                        if !live {
                            bad.push((
                                k,
                                asking,
                                format!(
                                    "{at}: exists counts {}, removed or never put (resurrected)",
                                    names[k]
                                ),
                            ));
                        }
                    }
                    if let Some(&k) = keys.get(*n) {
                        if let (false, Some(w)) = (may_lose, must_hold(k, asking)) {
                            bad.push((k, asking, format!(
                                "{at}: exists stops at {}, whose v{} was acknowledged and untouched since (lost write)",
                                names[k], w.version
                            )));
                        }
                    }
                }
            },
            (Call::Remove(keys), Answer::Remove(rs)) => {
                for (&k, r) in keys.iter().zip(rs) {
                    match r {
                        Err(err) => {
                            counts.errors += 1;
                            if !may_lose {
                                bad.push((k, asking, format!("{at}: remove of {} failed: {err}", names[k])));
                            }
                        }
                        Ok(false) if !may_lose && must_hold(k, asking).is_some() => {
                            bad.push((k, asking, format!(
                                "{at}: remove of {} found nothing, but an acknowledged version was there (lost write)",
                                names[k]
                            )))
                        }
                        Ok(_) => {}
                    }
                }
            }
            (Call::Clear, Answer::Clear(Err(err))) => {
                counts.errors += 1;
                if !may_lose {
                    bad.push((usize::MAX, asking, format!("{at}: clear failed: {err}")));
                }
            }
            _ => {}
        }
    }
    (counts, bad)
}
