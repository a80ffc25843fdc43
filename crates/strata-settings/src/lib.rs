//! How Strata's settings are written and read. Every component declares its settings once,
//! as a struct that derives `Deserialize` and `Serialize` with its defaults in `Default`;
//! the binary composes them (`#[serde(flatten)]`) and [`load`] fills the whole from four
//! layers, each overriding the one before: defaults, a TOML file, `<PREFIX><KEY>`
//! environment variables, and `KEY=VALUE` flags. Byte sizes are written with units
//! (`64MiB`, `8GiB`) through [`size`].
//!
//! What it is not: the list of settings (each component's own struct is).
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! #[derive(Debug, Serialize, Deserialize, PartialEq)]
//! #[serde(default)]
//! struct Cache {
//!     #[serde(with = "strata_settings::size")]
//!     cache_bytes_max: u64,
//!     policy: String,
//! }
//! impl Default for Cache {
//!     fn default() -> Self {
//!         Cache { cache_bytes_max: 1 << 20, policy: "lru".into() }
//!     }
//! }
//! let env = [("APP_POLICY".to_string(), "fifo".to_string())].into_iter().collect();
//! let overrides = [("cache_bytes_max".to_string(), "64MiB".to_string())];
//! let c: Cache = strata_settings::load(None, &env, "APP_", &overrides).unwrap();
//! assert_eq!(c, Cache { cache_bytes_max: 64 << 20, policy: "fifo".into() });
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why settings could not be loaded; the message says which layer and key.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read config file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("unknown setting '{0}'; `strata config` lists them all")]
    Unknown(String),
    #[error("bad configuration: {0}")]
    Bad(String),
}

/// Parses `"64MiB"`, `"1gb"`, `"4096"` into bytes (units are powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Serde for byte sizes: reads an integer or a string with a unit (`"256MiB"`), writes
/// the integer. Use as `#[serde(with = "strata_settings::size")]` on `u64`, `usize` or
/// `i64` fields.
pub mod size {
    use serde::{Deserialize, Deserializer, Serializer};

    /// The integer types a size may be kept in.
    pub trait SizeInt: Sized + Copy {
        fn from_u64(v: u64) -> Option<Self>;
        fn to_u64(self) -> u64;
    }
    impl SizeInt for u64 {
        fn from_u64(v: u64) -> Option<Self> {
            Some(v)
        }
        fn to_u64(self) -> u64 {
            self
        }
    }
    impl SizeInt for usize {
        fn from_u64(v: u64) -> Option<Self> {
            usize::try_from(v).ok()
        }
        fn to_u64(self) -> u64 {
            self as u64
        }
    }
    impl SizeInt for i64 {
        fn from_u64(v: u64) -> Option<Self> {
            i64::try_from(v).ok()
        }
        fn to_u64(self) -> u64 {
            self.max(0) as u64
        }
    }

    pub fn serialize<T: SizeInt, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(v.to_u64())
    }

    pub fn deserialize<'de, T: SizeInt, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        let n = match Raw::deserialize(d)? {
            Raw::Int(n) => n,
            Raw::Str(s) => super::parse_size(&s).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "'{s}' is not a size; use bytes or e.g. 64MiB, 1GiB"
                ))
            })?,
        };
        T::from_u64(n).ok_or_else(|| serde::de::Error::custom(format!("size {n} is too large")))
    }
}

/// Reads a raw override (`6380`, `true`, `sync`) as the TOML value it looks like.
fn raw_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

/// The defaults of `T` as a TOML table: one entry per setting.
fn defaults<T: Serialize + Default>() -> toml::Table {
    match toml::Value::try_from(T::default()) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    }
}

/// The names of every setting of `T`, in order.
pub fn keys<T: Serialize + Default>() -> Vec<String> {
    defaults::<T>().keys().cloned().collect()
}

/// Builds `T` from its defaults, then the TOML `file` (if any), then the variables of `env`
/// named `<env_prefix><KEY>` (key in capitals), then `overrides` (`key` or `key-with-dashes`,
/// value as written on a command line). A key no layer knows is refused, as is a value of
/// the wrong kind.
pub fn load<T: Serialize + DeserializeOwned + Default>(
    file: Option<&Path>,
    env: &BTreeMap<String, String>,
    env_prefix: &str,
    overrides: &[(String, String)],
) -> Result<T, SettingsError> {
    let defaults = defaults::<T>();
    let mut table = toml::Table::new();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| SettingsError::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        table = toml::from_str(&text).map_err(|e| SettingsError::File {
            path: path.display().to_string(),
            reason: format!("not valid TOML: {e}"),
        })?;
        if let Some(k) = table.keys().find(|k| !defaults.contains_key(*k)) {
            return Err(SettingsError::Unknown(k.clone()));
        }
    }
    for key in defaults.keys() {
        if let Some(raw) = env.get(&format!("{env_prefix}{}", key.to_ascii_uppercase())) {
            table.insert(key.clone(), raw_value(raw));
        }
    }
    for (k, v) in overrides {
        let key = k.replace('-', "_");
        if !defaults.contains_key(&key) {
            return Err(SettingsError::Unknown(k.clone()));
        }
        table.insert(key, raw_value(v));
    }
    // A string setting takes what was written even when it looks like a number.
    for (k, v) in table.iter_mut() {
        if let (Some(toml::Value::String(_)), false) = (defaults.get(k), v.is_str()) {
            *v = toml::Value::String(v.to_string());
        }
    }
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| SettingsError::Bad(e.to_string().trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(default)]
    struct Inner {
        #[serde(with = "size")]
        bytes_max: u64,
        name: String,
    }
    impl Default for Inner {
        fn default() -> Self {
            Inner {
                bytes_max: 10,
                name: "x".into(),
            }
        }
    }
    #[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
    #[serde(default)]
    struct Outer {
        port: u16,
        #[serde(flatten)]
        inner: Inner,
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn layers_override_in_order_through_flattened_parts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.toml");
        std::fs::write(
            &file,
            "port = 7000\nbytes_max = \"2KiB\"\nname = \"file\"\n",
        )
        .unwrap();
        let e = env(&[("T_PORT", "7001"), ("T_NAME", "123"), ("OTHER", "1")]);
        let o: Outer = load(
            Some(&file),
            &e,
            "T_",
            &[("bytes-max".into(), "4MiB".into())],
        )
        .unwrap();
        assert_eq!(o.port, 7001);
        assert_eq!(o.inner.bytes_max, 4 << 20);
        assert_eq!(
            o.inner.name, "123",
            "a number where a string is wanted stays text"
        );
        assert_eq!(keys::<Outer>(), vec!["bytes_max", "name", "port"]);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_their_name() {
        let none = BTreeMap::new();
        let e = load::<Outer>(None, &none, "T_", &[("nope".into(), "1".into())]).unwrap_err();
        assert!(e.to_string().contains("unknown setting 'nope'"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.toml");
        std::fs::write(&file, "prot = 1\n").unwrap();
        let e = load::<Outer>(Some(&file), &none, "T_", &[]).unwrap_err();
        assert!(e.to_string().contains("'prot'"), "{e}");
        let e = load::<Outer>(None, &env(&[("T_BYTES_MAX", "lots")]), "T_", &[]).unwrap_err();
        assert!(e.to_string().contains("not a size"), "{e}");
        let e = load::<Outer>(None, &env(&[("T_PORT", "http")]), "T_", &[]).unwrap_err();
        assert!(
            e.to_string().contains("port") || e.to_string().contains("invalid"),
            "{e}"
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1gb"), Some(1 << 30));
        assert_eq!(parse_size("1.5GiB"), None);
        assert_eq!(parse_size("99999999999TiB"), None);
    }
}
