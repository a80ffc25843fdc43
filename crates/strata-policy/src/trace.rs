//! Trace files: the Mooncake FAST'25 JSON-lines format, or one key per line.

use std::collections::HashMap;
use std::io::BufRead;

/// One request: the ids of its blocks, in prefix order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub blocks: Vec<u64>,
}

/// Reads a trace. Lines starting with `{` are Mooncake requests (`hash_ids`); any other
/// non-empty line is one key, read as a one-block request (keys are numbered by first use).
pub fn load_trace(path: &std::path::Path) -> Result<Vec<Request>, String> {
    let f = std::fs::File::open(path)
        .map_err(|e| format!("cannot open trace {}: {e}", path.display()))?;
    let mut out = Vec::new();
    let mut ids: HashMap<String, u64> = HashMap::new();
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: line {}: {e}", path.display(), n + 1))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| format!("{}: line {}: {e}", path.display(), n + 1))?;
            let blocks = v
                .get("hash_ids")
                .and_then(|h| h.as_array())
                .ok_or_else(|| format!("{}: line {}: no hash_ids array", path.display(), n + 1))?
                .iter()
                .map(|x| {
                    x.as_u64().ok_or_else(|| {
                        format!(
                            "{}: line {}: hash id is not an integer",
                            path.display(),
                            n + 1
                        )
                    })
                })
                .collect::<Result<Vec<u64>, String>>()?;
            out.push(Request { blocks });
        } else {
            let next = ids.len() as u64;
            let id = *ids.entry(line.to_string()).or_insert(next);
            out.push(Request { blocks: vec![id] });
        }
    }
    Ok(out)
}
