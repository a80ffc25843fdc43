//! Authentication: the `default` user's `requirepass`, named users with roles, and
//! constant-time password comparison.

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclUser {
    pub name: String,
    pub password: String,
    pub role: Role,
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
}
