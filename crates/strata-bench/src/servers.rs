//! Servers started for a benchmark: a free loopback port, waiting for it, and a child
//! process that is killed when dropped.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use std::sync::Arc;
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

/// The arguments of a `redis-server` on loopback `port` with snapshots off.
pub fn redis_args(port: u16) -> [String; 6] {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ]
    .map(String::from)
}

/// A `redis-server` on loopback with snapshots off and `extra` settings on top.
pub fn redis_server_with(port: u16, extra: &[&str]) -> anyhow::Result<Proc> {
    let child = Command::new("redis-server")
        .args(redis_args(port))
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

/// The CPUs the machine has online (`/sys/devices/system/cpu/online`, such as `0-1` or
/// `0,2-5`), whatever this process is restricted to: after [`pin`] the process itself sees
/// one CPU (`available_parallelism` follows its affinity).
pub fn cpus_online() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|list| count_cpus(list.trim()))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How many CPUs a kernel CPU list (`0-3,6`) names; `None` if it is not one.
fn count_cpus(list: &str) -> Option<usize> {
    list.split(',').try_fold(0, |n, part| {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let cpu = part.parse::<usize>().ok()?;
                (cpu, cpu)
            }
        };
        (lo <= hi).then(|| n + hi - lo + 1)
    })
}

/// Restricts every thread of process `pid` (0: this process) to CPU `core`, as the
/// benchmarks' protocol asks (servers on one core, clients on the other); threads started
/// later inherit it. Does nothing on a machine with a single CPU or without `taskset`.
/// Whether the machine has two CPUs is asked of the machine ([`cpus_online`]), not of this
/// process: once pinned to CPU 0 it sees only that one, and must still move to CPU 1.
pub fn pin(pid: u32, core: usize) {
    if cpus_online() < 2 {
        return;
    }
    let pid = if pid == 0 { std::process::id() } else { pid };
    let _ = Command::new("taskset")
        .args(["-a", "-p", "-c", &core.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Starts a server with `start` on CPU 0, the servers' CPU of the benchmarks' protocol (a
/// child inherits this process's CPUs, so it sizes its threads for one CPU, as under
/// `taskset -c 0`), then moves this process, and the clients it starts after, to CPU 1.
pub fn on_server_core<T>(start: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    pin(0, 0);
    let started = start();
    pin(0, 1);
    started
}

/// The bucket every benchmark's S3-compatible server holds.
pub const BUCKET: &str = "strata-bench";
pub const S3_REGION: &str = "us-east-1";
/// moto accepts any credentials; this one serves as key id and secret.
pub const S3_KEY: &str = "test";

/// An S3-compatible server on loopback (moto, in memory) with the bucket created.
pub struct Moto {
    pub port: u16,
    _proc: Proc,
}

impl Moto {
    pub fn start() -> anyhow::Result<Moto> {
        let port = free_port()?;
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("moto_server must be installed (pip install 'moto[server]')")?;
        let moto = Moto {
            port,
            _proc: Proc(child),
        };
        wait_port(port)?;
        moto.create_bucket()?;
        Ok(moto)
    }

    /// Creates the bucket with one unsigned PUT (moto accepts it).
    fn create_bucket(&self) -> anyhow::Result<()> {
        use std::io::{Read, Write};
        let port = self.port;
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        write!(
            s,
            "PUT /{BUCKET} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        anyhow::ensure!(reply.starts_with("HTTP/1.1 200"), "bucket: {reply}");
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self._proc.0.id()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Strata's `cold_url` for objects under `prefix` in the bucket.
    pub fn cold_url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// Strata's settings (`key=value`) for a cold tier under `prefix` on this server.
    pub fn strata_settings(&self, prefix: &str) -> Vec<String> {
        vec![
            format!("cold_url={}", self.cold_url(prefix)),
            format!("s3_endpoint={}", self.endpoint()),
            format!("s3_region={S3_REGION}"),
            format!("s3_access_key_id={S3_KEY}"),
            format!("s3_secret_access_key={S3_KEY}"),
            "s3_allow_http=true".into(),
        ]
    }

    /// A client of the bucket, as the benchmarks' baselines read it.
    pub fn store(&self) -> anyhow::Result<Arc<dyn object_store::ObjectStore>> {
        Ok(Arc::new(
            object_store::aws::AmazonS3Builder::new()
                .with_bucket_name(BUCKET)
                .with_endpoint(self.endpoint())
                .with_region(S3_REGION)
                .with_access_key_id(S3_KEY)
                .with_secret_access_key(S3_KEY)
                .with_allow_http(true)
                .build()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPUs a thread may run on, as the kernel lists them (`0`, `0-1`).
    fn allowed(status: &str) -> String {
        std::fs::read_to_string(status)
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|l| l.trim().to_string())
            .unwrap()
    }

    #[test]
    fn cpu_lists_count_their_cpus() {
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("0-1"), Some(2));
        assert_eq!(count_cpus("0,2-5,7"), Some(6));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus("zero"), None);
        assert!(cpus_online() >= 1);
    }

    /// The benchmarks' protocol: the server started on CPU 0, this process (the client)
    /// moved to CPU 1 afterwards. Pinning this process to CPU 0 first must not make it
    /// think the machine has one CPU (it did: `strata-bench redis` and `tails` ran their
    /// clients on the servers' core).
    #[test]
    fn a_server_starts_on_cpu_0_and_its_client_moves_to_cpu_1() {
        let cpus = cpus_online();
        let has_taskset = Command::new("taskset")
            .arg("-V")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if cpus < 2 || !has_taskset {
            eprintln!("skipped: needs two CPUs and taskset ({cpus} CPUs online)");
            return;
        }
        let server = on_server_core(|| Ok(Proc(Command::new("sleep").arg("30").spawn()?))).unwrap();
        let (server_cpus, client_cpus) = (
            allowed(&format!("/proc/{}/status", server.0.id())),
            allowed("/proc/self/status"),
        );
        // Back on every CPU before any assertion can fail.
        let _ = Command::new("taskset")
            .args(["-a", "-p", "-c", &format!("0-{}", cpus - 1)])
            .arg(std::process::id().to_string())
            .stdout(Stdio::null())
            .status();
        assert_eq!(server_cpus, "0");
        assert_eq!(client_cpus, "1");
    }
}
