//! Latency summaries and report files.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of latencies, in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

pub fn summarize(mut xs: Vec<Duration>) -> Summary {
    xs.sort();
    let at = |q: f64| {
        xs.get(((xs.len() as f64 * q) as usize).min(xs.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    let mean = xs.iter().map(|d| d.as_secs_f64()).sum::<f64>() / xs.len().max(1) as f64 * 1e6;
    Summary {
        count: xs.len(),
        mean_us: mean,
        p50_us: at(0.50),
        p99_us: at(0.99),
    }
}

/// Writes `<name>.md` and `<name>.json` into `dir` and prints the Markdown.
pub fn write(dir: &Path, name: &str, markdown: &str, json: &impl Serialize) -> anyhow::Result<()> {
    std::fs::write(dir.join(format!("{name}.md")), markdown)?;
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(json)?,
    )?;
    println!("{markdown}");
    eprintln!("wrote {}/{name}.md and {name}.json", dir.display());
    Ok(())
}

/// Draws `<name>.png` from `<name>.json` with a matplotlib script; says so if it cannot.
pub fn plot(dir: &Path, script: &str, name: &str) {
    let status = std::process::Command::new("python3")
        .arg(script)
        .arg(dir.join(format!("{name}.json")))
        .arg(dir.join(format!("{name}.png")))
        .status();
    if !matches!(status, Ok(s) if s.success()) {
        eprintln!("chart not drawn (needs python3 with matplotlib)");
    }
}

/// A progress line on stderr.
pub fn progress(step: usize, total: usize, what: &str) {
    eprintln!("[{step}/{total}] {what}");
}
