//! Time per run of a script with one `redis.call` (a stand-in command that answers at
//! once), to see what the VM itself costs per script: `cargo run --release -p strata-script
//! --example run_cost`.
use std::time::Instant;

use bytes::Bytes;
use strata_resp::Reply;

fn main() {
    let control = strata_script::Control::new(|| {});
    let mut vm = strata_script::Vm::new(control).expect("a VM");
    for (what, body) in [
        ("return 1", "return 1"),
        ("one call", "return redis.call('GET', KEYS[1])"),
        (
            "ten calls",
            "for i = 1, 10 do redis.call('GET', KEYS[1]) end return 1",
        ),
    ] {
        let sha = vm.load(body.as_bytes()).expect("loads");
        let keys = [Bytes::from_static(b"k")];
        let mut call = |_: &[Bytes]| Reply::Bulk(Bytes::from_static(b"v"));
        let n = 200_000;
        let t = Instant::now();
        for _ in 0..n {
            vm.run(
                &sha,
                &keys,
                &[],
                &mut call,
                Some(std::time::Duration::from_secs(5)),
            );
        }
        println!(
            "{what}: {:.2} µs per run",
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
}
