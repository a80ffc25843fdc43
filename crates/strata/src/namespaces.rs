//! `strata trace replay --namespace NAME=TRACE[@RATE] ... [--quota NAME=BLOCKS|PERCENT%]`:
//! namespaces sharing one pool (`strata_policy::replay_tenants`), each namespace's hit rate
//! alone, sharing the pool without quotas, and with the quotas given; the cost of sharing
//! is a namespace's loss against its run alone.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use strata_policy::{load_trace, replay_tenants, rounds_to_send_all, Request, Tenant};

/// One `--namespace`: its name, trace and requests per round.
struct Space {
    name: String,
    trace_path: PathBuf,
    trace: Vec<Request>,
    rate: usize,
}

/// A `--quota`: blocks, or a share of the pool's capacity.
#[derive(Clone, Copy)]
enum Quota {
    Blocks(usize),
    Percent(f64),
}

impl Quota {
    fn blocks(self, capacity: usize) -> usize {
        match self {
            Quota::Blocks(b) => b,
            Quota::Percent(p) => (capacity as f64 * p / 100.0).round() as usize,
        }
    }
}

#[derive(serde::Serialize)]
struct Row {
    capacity_blocks: usize,
    namespace: String,
    rate: usize,
    quota_blocks: Option<usize>,
    alone: f64,
    shared: f64,
    shared_with_quotas: f64,
}

fn parse_space(s: &str) -> Result<Space> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| anyhow!("--namespace takes NAME=TRACE[@RATE], not '{s}'"))?;
    let (path, rate) = match rest.rsplit_once('@') {
        Some((p, r)) => (p, r.parse().with_context(|| format!("rate in '{s}'"))?),
        None => (rest, 1),
    };
    if rate == 0 {
        bail!("a namespace's rate is at least 1 request per round ('{s}')");
    }
    let trace = load_trace(Path::new(path)).map_err(anyhow::Error::msg)?;
    Ok(Space {
        name: name.to_string(),
        trace_path: path.into(),
        trace,
        rate,
    })
}

fn parse_quota(s: &str) -> Result<(String, Quota)> {
    let bad = || anyhow!("--quota takes NAME=BLOCKS or NAME=PERCENT%, not '{s}'");
    let (name, q) = s.split_once('=').ok_or_else(bad)?;
    let quota = match q.strip_suffix('%') {
        Some(p) => Quota::Percent(p.parse().map_err(|_| bad())?),
        None => Quota::Blocks(q.parse().map_err(|_| bad())?),
    };
    Ok((name.to_string(), quota))
}

/// Runs the shared replays at each capacity and writes `trace-namespaces.{md,json}` to `out`
/// (or prints JSON lines with `json`).
pub fn replay(
    spaces: &[String],
    quotas: &[String],
    caps: &[usize],
    json: bool,
    out: &Path,
) -> Result<()> {
    let spaces: Vec<Space> = spaces
        .iter()
        .map(|s| parse_space(s))
        .collect::<Result<_>>()?;
    let quotas: Vec<(String, Quota)> = quotas
        .iter()
        .map(|q| parse_quota(q))
        .collect::<Result<_>>()?;
    if let Some((n, _)) = quotas
        .iter()
        .find(|(n, _)| !spaces.iter().any(|s| &s.name == n))
    {
        bail!("--quota names '{n}', which no --namespace is");
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    for (i, &cap) in caps.iter().enumerate() {
        if !json {
            eprintln!(
                "[{}/{}] {} namespaces at {cap} blocks",
                i + 1,
                caps.len(),
                spaces.len()
            );
        }
        rows.extend(at_capacity(&spaces, &quotas, cap));
    }
    if json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    let md = report(&spaces, &quotas, &rows, started.elapsed().as_secs_f64());
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("trace-namespaces.md"), &md)?;
    std::fs::write(
        out.join("trace-namespaces.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    print!("{md}");
    Ok(())
}

/// Each namespace's hit rates at capacity `cap`: alone, shared, shared with quotas.
fn at_capacity(spaces: &[Space], quotas: &[(String, Quota)], cap: usize) -> Vec<Row> {
    let quota_of = |s: &Space| {
        quotas
            .iter()
            .find(|(n, _)| n == &s.name)
            .map(|(_, q)| q.blocks(cap))
    };
    let tenants = |with_quotas: bool| -> Vec<Tenant<'_>> {
        spaces
            .iter()
            .map(|s| Tenant {
                trace: &s.trace,
                rate: s.rate,
                quota_blocks: if with_quotas { quota_of(s) } else { None },
            })
            .collect()
    };
    // Alone, a namespace sends what it sends beside the others: as many rounds.
    let rounds = rounds_to_send_all(&tenants(false));
    let shared = replay_tenants(&tenants(false), cap, rounds);
    let capped = replay_tenants(&tenants(true), cap, rounds);
    spaces
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let alone = replay_tenants(&tenants(false)[i..=i], cap, rounds)[0];
            Row {
                capacity_blocks: cap,
                namespace: s.name.clone(),
                rate: s.rate,
                quota_blocks: quota_of(s),
                alone: alone.hit_rate(),
                shared: shared[i].hit_rate(),
                shared_with_quotas: capped[i].hit_rate(),
            }
        })
        .collect()
}

fn report(spaces: &[Space], quotas: &[(String, Quota)], rows: &[Row], secs: f64) -> String {
    let pct = |x: f64| format!("{:.1}%", x * 100.0);
    let points = |x: f64| format!("{:+.1}", x * 100.0);
    let mut md = String::from(
        "# Trace replay: namespaces sharing one pool\n\nEach namespace replays its trace at its rate (requests per round) into one pool of the capacity given; the replay ends when every namespace has sent its trace once (a faster one replays its trace again with fresh blocks; alone, a namespace sends as many requests as beside the others). Without quotas the pool is one LRU; with quotas a namespace past its quota drops its own least recently used blocks first, as `KVC.QUOTA` does. A block hits only if every earlier block of its request hit. *Cost* is the hit-rate points a namespace loses against its run alone in the whole pool.\n\n| capacity (blocks) | namespace | rate | quota (blocks) | alone | shared | cost | shared, quotas | cost |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.capacity_blocks,
            r.namespace,
            r.rate,
            r.quota_blocks.map_or("none".into(), |q| q.to_string()),
            pct(r.alone),
            pct(r.shared),
            points(r.shared - r.alone),
            pct(r.shared_with_quotas),
            points(r.shared_with_quotas - r.alone),
        ));
    }
    let mut cmd = String::from("strata trace replay");
    for s in spaces {
        cmd.push_str(&format!(
            " --namespace {}={}@{}",
            s.name,
            s.trace_path.display(),
            s.rate
        ));
    }
    for (n, q) in quotas {
        match q {
            Quota::Blocks(b) => cmd.push_str(&format!(" --quota {n}={b}")),
            Quota::Percent(p) => cmd.push_str(&format!(" --quota {n}={p}%")),
        }
    }
    let caps: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.capacity_blocks).collect();
    for c in caps {
        cmd.push_str(&format!(" --capacity-blocks {c}"));
    }
    md.push_str(&format!("\nCommand: `{cmd}` ({secs:.1} s).\n"));
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_and_quotas_parse_and_a_quota_protects_the_quiet_one() {
        let dir = tempfile::tempdir().unwrap();
        // One key per line: quiet uses a set of 20 keys again and again, noisy never
        // uses a key twice.
        let write = |name: &str, keys: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, keys).unwrap();
            path.display().to_string()
        };
        let p = write(
            "quiet.txt",
            (0..400).map(|i| format!("k{}\n", i % 20)).collect(),
        );
        let n = write("noisy.txt", (0..400).map(|i| format!("k{i}\n")).collect());
        let quiet = parse_space(&format!("quiet={p}")).unwrap();
        let noisy = parse_space(&format!("noisy={n}@10")).unwrap();
        assert_eq!((quiet.rate, noisy.rate), (1, 10));
        assert!(parse_space(&format!("x={p}@0")).is_err());
        assert!(parse_space("no-equals").is_err());
        let (name, q) = parse_quota("noisy=25%").unwrap();
        assert_eq!((name.as_str(), q.blocks(40)), ("noisy", 10));
        assert!(matches!(
            parse_quota("noisy=7").unwrap().1,
            Quota::Blocks(7)
        ));
        assert!(parse_quota("noisy=lots").is_err());
        let rows = at_capacity(
            &[quiet, noisy],
            &[("noisy".into(), Quota::Percent(25.0))],
            40,
        );
        let quiet = &rows[0];
        assert_eq!(rows[1].quota_blocks, Some(10));
        // Noisy's fresh blocks flush quiet's set from a shared LRU; capped, they cannot.
        assert!(quiet.shared < quiet.alone - 0.5, "{}", quiet.shared);
        assert!(quiet.shared_with_quotas > quiet.alone - 0.01);
    }
}
