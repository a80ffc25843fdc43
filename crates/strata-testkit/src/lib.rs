//! Test support shared by Strata's test suites and fuzzers, and nothing else.
//!
//! Randomness comes through [`Rng`], seeded from `STRATA_SEED` when set (and printed when
//! not), so any failing run can be replayed exactly.
//!
//! ```
//! let mut a = strata_testkit::Rng::new(7);
//! let mut b = strata_testkit::Rng::new(7);
//! assert_eq!(a.next_u64(), b.next_u64());
//! ```

/// splitmix64: small, fast, and the same sequence for the same seed everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Seeded from `STRATA_SEED`, or from the clock; prints `<test>: STRATA_SEED=<seed>`.
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var("STRATA_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: STRATA_SEED={seed}");
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index in `0..n`.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// One of `xs`.
    pub fn pick<'a, T: ?Sized>(&mut self, xs: &[&'a T]) -> &'a T {
        xs[self.index(xs.len())]
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; bind promptly).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One etcd member on loopback in a temporary directory, killed when dropped. Panics if the
/// `etcd` binary is missing (`scripts/install-deps` installs Debian's `etcd-server`).
pub struct Etcd {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

impl Etcd {
    pub fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let peer = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd's log");
        let child = std::process::Command::new("etcd")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdout(log.try_clone().expect("etcd's log"))
            .stderr(log)
            .spawn()
            .expect("etcd starts (apt-get install etcd-server)");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Etcd {
            child,
            _dir: dir,
            url,
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
