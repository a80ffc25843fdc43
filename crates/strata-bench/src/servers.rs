//! Servers started for a benchmark: a free loopback port, waiting for it, and a child
//! process that is killed when dropped.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits up to a minute for something to listen on `port`.
pub fn wait_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The baseline: a real `redis-server` on `port` with persistence off, as every benchmark
/// compares against it.
pub fn redis_server(port: u16) -> anyhow::Result<Proc> {
    redis_server_with(port, &["--appendonly", "no"])
}

/// A `redis-server` on loopback with snapshots off and `extra` settings on top.
pub fn redis_server_with(port: u16, extra: &[&str]) -> anyhow::Result<Proc> {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .context("redis-server must be installed (Debian redis-server)")?;
    Ok(Proc(child))
}

/// `strata serve` from `bin` on `port` with its data in `dir`, metrics off, and `settings`
/// (`key=value` each) on top.
pub fn strata_server(
    bin: &Path,
    dir: &Path,
    port: u16,
    settings: impl IntoIterator<Item = impl AsRef<str>>,
) -> anyhow::Result<Proc> {
    anyhow::ensure!(
        bin.exists(),
        "{} not found; run `cargo build --release -p strata` first",
        bin.display()
    );
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--data-dir"]).arg(dir).args([
        "--port",
        &port.to_string(),
        "--set",
        "metrics_port=0",
    ]);
    for kv in settings {
        cmd.args(["--set", kv.as_ref()]);
    }
    let child = cmd
        .env("STRATA_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    Ok(Proc(child))
}

/// Restricts every thread of process `pid` (0: this process) to CPU `core`, as the
/// benchmarks' protocol asks (servers on one core, clients on the other); threads started
/// later inherit it. Does nothing on a machine with a single CPU or without `taskset`.
pub fn pin(pid: u32, core: usize) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        return;
    }
    let pid = if pid == 0 { std::process::id() } else { pid };
    let _ = Command::new("taskset")
        .args(["-a", "-p", "-c", &core.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
