//! Mooncake-format request traces: one JSON object per line with `hash_ids` (prefix-block
//! ids; identical ids are reusable blocks), and a built-in generated workload of that form.

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;

/// One request: the block ids of its prompt, in order (other fields are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    /// Prompt blocks.
    pub hash_ids: Vec<u64>,
}

/// Reads a JSONL trace; names the line of any malformed request.
pub fn load(path: &Path) -> Result<Vec<Request>, String> {
    let file = std::fs::File::open(path)
        .map_err(|e| format!("cannot open trace {}: {e}", path.display()))?;
    let mut requests = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: line {}: {e}", path.display(), n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let request: Request = serde_json::from_str(&line).map_err(|e| {
            format!(
                "{}: line {}: not a trace request ({e})",
                path.display(),
                n + 1
            )
        })?;
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(format!("{} holds no requests", path.display()));
    }
    Ok(requests)
}

/// A deterministic workload in the same form: conversations that grow turn by turn on top of
/// a few popular system prompts, plus one-off documents.
pub fn generated(requests: usize) -> Vec<Request> {
    let mut rng = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let system_prompts: Vec<Vec<u64>> = (0..8)
        .map(|s| (0..4 + s * 2).map(|b| 1_000_000 * (s + 1) + b).collect())
        .collect();
    let mut conversations: Vec<Vec<u64>> = Vec::new();
    let mut fresh = 1u64;
    let mut out = Vec::with_capacity(requests);
    for _ in 0..requests {
        let roll = next() % 100;
        let ids = if roll < 55 && !conversations.is_empty() {
            // A follow-up turn: the whole conversation so far, plus a few new blocks.
            let c = (next() as usize) % conversations.len();
            let extra = 1 + next() % 3;
            for _ in 0..extra {
                conversations[c].push(fresh);
                fresh += 1;
            }
            conversations[c].clone()
        } else if roll < 90 {
            // A new conversation on a popular system prompt (skewed towards the first ones).
            let s = ((next() % 64) as f64).sqrt() as usize;
            let mut ids = system_prompts[s.min(7)].clone();
            for _ in 0..(2 + next() % 6) {
                ids.push(fresh);
                fresh += 1;
            }
            if conversations.len() < 400 {
                conversations.push(ids.clone());
            } else {
                let slot = (next() as usize) % conversations.len();
                conversations[slot] = ids.clone();
            }
            ids
        } else {
            // A one-off document.
            (0..(4 + next() % 20))
                .map(|_| {
                    fresh += 1;
                    fresh
                })
                .collect()
        };
        out.push(Request { hash_ids: ids });
    }
    out
}
