//! `strata-fuzz <resp|segment|collections> [iterations] [seed]`: a longer fuzzing campaign.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let target = args.get(1).map(String::as_str).unwrap_or("");
    let iterations: usize = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let seed: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    eprintln!("strata-fuzz {target}: {iterations} executions, seed {seed}");
    let start = std::time::Instant::now();
    let step = (iterations / 10).max(1);
    let mut done = 0;
    while done < iterations {
        let n = step.min(iterations - done);
        done += match target {
            "resp" => strata_fuzz::fuzz_resp(n, seed.wrapping_add(done as u64)),
            "segment" => strata_fuzz::fuzz_segment(n, seed.wrapping_add(done as u64)),
            "collections" => strata_fuzz::fuzz_collections(n, seed.wrapping_add(done as u64)),
            _ => {
                eprintln!("usage: strata-fuzz <resp|segment|collections> [iterations] [seed]");
                std::process::exit(2);
            }
        };
        eprintln!(
            "  {done}/{iterations} ({:.0} exec/s)",
            done as f64 / start.elapsed().as_secs_f64()
        );
    }
}
