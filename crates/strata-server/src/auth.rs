//! Authentication: the `default` user's `requirepass`, named users with roles, and
//! constant-time password comparison.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// What a user may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read commands only.
    ReadOnly,
    /// Reads and writes, no administration (`CONFIG SET`, `FLUSHALL`, `SHUTDOWN`, ...).
    ReadWrite,
    Admin,
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "readonly" | "read" => Ok(Role::ReadOnly),
            "readwrite" | "write" => Ok(Role::ReadWrite),
            "admin" => Ok(Role::Admin),
            _ => Err(format!(
                "role must be readonly, readwrite or admin, not '{s}'"
            )),
        }
    }
}

/// A named user, written `name:password:role` in the configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AclUser {
    pub name: String,
    pub password: String,
    pub role: Role,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::ReadOnly => "readonly",
            Role::ReadWrite => "readwrite",
            Role::Admin => "admin",
        }
    }
}

impl TryFrom<String> for AclUser {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<AclUser> for String {
    fn from(u: AclUser) -> String {
        format!("{}:{}:{}", u.name, u.password, u.role.as_str())
    }
}

impl std::str::FromStr for AclUser {
    type Err = String;
    /// `name:password:role`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.splitn(3, ':');
        let (Some(name), Some(password), Some(role)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("user '{s}' must be name:password:role"));
        };
        Ok(AclUser {
            name: name.into(),
            password: password.into(),
            role: role.parse()?,
        })
    }
}

/// Failed `AUTH` attempts per client address. Past `max` failures in one minute, `AUTH`
/// from that address is refused without looking at the password until the minute ends, so a
/// password cannot be guessed at network speed. The table holds at most `ADDRS_MAX`
/// addresses; when full, windows that have ended are dropped, then the oldest.
#[derive(Default)]
pub(crate) struct AuthLimiter {
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

const WINDOW: Duration = Duration::from_secs(60);
const ADDRS_MAX: usize = 65_536;

impl AuthLimiter {
    /// `Some(seconds to wait)` when `ip` has used up its failures for this minute.
    pub(crate) fn blocked(&self, ip: IpAddr, max: u32) -> Option<u64> {
        if max == 0 {
            return None;
        }
        let f = self.failures.lock();
        let (start, n) = *f.get(&ip)?;
        let age = start.elapsed();
        (n >= max && age < WINDOW).then(|| (WINDOW - age).as_secs() + 1)
    }

    /// Counts one failed attempt from `ip`.
    pub(crate) fn failed(&self, ip: IpAddr) {
        let mut f = self.failures.lock();
        if f.len() >= ADDRS_MAX && !f.contains_key(&ip) {
            f.retain(|_, (start, _)| start.elapsed() < WINDOW);
            if f.len() >= ADDRS_MAX {
                if let Some(oldest) = f.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| *k) {
                    f.remove(&oldest);
                }
            }
        }
        let e = f.entry(ip).or_insert((Instant::now(), 0));
        if e.0.elapsed() >= WINDOW {
            *e = (Instant::now(), 0);
        }
        e.1 += 1;
    }
}

/// Whether `addr` is the loopback interface in protected mode's sense (as Redis: exactly
/// `127.0.0.1` or `::1`).
pub(crate) fn is_loopback_client(addr: &SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => {
            v6 == std::net::Ipv6Addr::LOCALHOST
                || v6.to_ipv4_mapped() == Some(std::net::Ipv4Addr::LOCALHOST)
        }
    }
}

/// Compares two secrets in time that depends only on their lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_parse_and_compare() {
        let u: AclUser = "alice:s3cret:readonly".parse().unwrap();
        assert_eq!(u.role, Role::ReadOnly);
        assert!("bob:x".parse::<AclUser>().is_err());
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn auth_failures_are_limited_per_address() {
        let l = AuthLimiter::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(l.blocked(a, 3), None);
            l.failed(a);
        }
        let wait = l.blocked(a, 3).expect("blocked after 3 failures");
        assert!((1..=61).contains(&wait), "{wait}");
        assert_eq!(l.blocked(b, 3), None, "other addresses are not affected");
        assert_eq!(l.blocked(a, 0), None, "0 disables the limit");
    }

    #[test]
    fn only_127_0_0_1_and_ipv6_loopback_are_local() {
        let local = |s: &str| is_loopback_client(&s.parse().unwrap());
        assert!(local("127.0.0.1:5000"));
        assert!(local("[::1]:5000"));
        assert!(!local("127.0.0.2:5000"));
        assert!(!local("192.168.1.4:5000"));
    }
}
