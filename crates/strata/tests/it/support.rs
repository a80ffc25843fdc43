//! Starting the real binary and talking RESP to it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use strata_testkit::free_port;

/// Waits until `child` listens on `port`; `Err` with its status if it exits first.
fn wait_for_port(port: u16, child: &mut Child, what: &str) -> Result<(), std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(status);
        }
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// How many times a server is started on fresh ports before a test gives up: a port
/// [`free_port`] found free may be taken (by a test beside it, or as a client's source
/// port) before the server binds it.
const STARTS: usize = 3;

/// A running `strata serve` with its own data directory; killed when dropped.
pub struct Strata {
    pub child: Child,
    pub port: u16,
    pub metrics_port: u16,
    pub dir: tempfile::TempDir,
}

impl Strata {
    /// Starts the server with `--set` overrides.
    pub fn start(settings: &[(&str, &str)]) -> Strata {
        Self::start_in(tempfile::tempdir().unwrap(), settings)
    }

    pub fn start_in(dir: tempfile::TempDir, settings: &[(&str, &str)]) -> Strata {
        let mut exited = None;
        for _ in 0..STARTS {
            match Self::try_start_in(&dir, settings) {
                Ok((child, port, metrics_port)) => {
                    return Strata {
                        child,
                        port,
                        metrics_port,
                        dir,
                    }
                }
                Err(status) => exited = Some(status),
            }
        }
        panic!("strata exited before listening, {STARTS} times: {exited:?}");
    }

    /// One start on fresh ports: the child, its port and its metrics port.
    fn try_start_in(
        dir: &tempfile::TempDir,
        settings: &[(&str, &str)],
    ) -> Result<(Child, u16, u16), std::process::ExitStatus> {
        let port = free_port();
        let metrics_port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--port")
            .arg(port.to_string());
        cmd.arg("--set").arg(format!("metrics_port={metrics_port}"));
        for (k, v) in settings {
            cmd.arg("--set").arg(format!("{k}={v}"));
        }
        cmd.env("STRATA_LOG_LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("start strata");
        wait_for_port(port, &mut child, "strata")?;
        Ok((child, port, metrics_port))
    }

    /// Runs `redis-cli` against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        redis_cli(self.port, args, None)
    }

    pub fn conn(&self) -> Conn {
        Conn::connect(self.port)
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "strata did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Strata {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real `redis-server` on loopback with persistence off; killed when dropped.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let mut exited = None;
        for _ in 0..STARTS {
            let port = free_port();
            let mut child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed (Debian redis-server); scripts/install-deps does it");
            match wait_for_port(port, &mut child, "redis-server") {
                Ok(()) => return RedisServer { child, port },
                Err(status) => exited = Some(status),
            }
        }
        panic!("redis-server exited before listening, {STARTS} times: {exited:?}");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `redis-cli -p port args...`, feeding `stdin` if given.
pub fn redis_cli(port: u16, args: &[&str], stdin: Option<&[u8]>) -> String {
    let out = redis_cli_output(port, args, stdin);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn redis_cli_output(port: u16, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli must be installed (Debian redis-tools)");
    if let Some(data) = stdin {
        let mut si = child.stdin.take().unwrap();
        si.write_all(data).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// A raw RESP connection that returns replies as their exact bytes.
pub struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    pub fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.w.write_all(bytes).unwrap();
    }

    pub fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// Sends one command and reads its reply.
    pub fn cmd(&mut self, args: &[&str]) -> String {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send_raw(&Self::encode(&a));
        String::from_utf8_lossy(&self.read_reply()).into_owned()
    }

    /// Reads one whole reply (of any type) and returns its bytes.
    pub fn read_reply(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.read_into(&mut out);
        out
    }

    /// Reads until the peer closes; returns what arrived.
    pub fn read_to_close(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = self.r.read_to_end(&mut out);
        out
    }

    fn read_into(&mut self, out: &mut Vec<u8>) {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line).unwrap();
        assert!(
            !line.is_empty(),
            "connection closed while a reply was expected"
        );
        out.extend_from_slice(&line);
        let body = std::str::from_utf8(&line[1..line.len() - 2]).unwrap_or("0");
        match line[0] {
            b'$' | b'=' => {
                let n: i64 = body.parse().unwrap();
                if n >= 0 {
                    let mut buf = vec![0u8; n as usize + 2];
                    self.r.read_exact(&mut buf).unwrap();
                    out.extend_from_slice(&buf);
                }
            }
            b'*' | b'~' | b'>' => {
                let n: i64 = body.parse().unwrap();
                for _ in 0..n.max(0) {
                    self.read_into(out);
                }
            }
            b'%' => {
                let n: i64 = body.parse().unwrap();
                for _ in 0..2 * n.max(0) {
                    self.read_into(out);
                }
            }
            _ => {}
        }
    }
}
