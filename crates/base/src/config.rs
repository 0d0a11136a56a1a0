//! The `CONFIG` record `lode mkfs` writes into a target directory, and the checks a
//! server makes before it serves that directory.

use std::fmt::Write as _;
use std::path::Path;

/// Format version of target directories written by this build.
pub const FORMAT_VERSION: u32 = 1;

/// Name of the config record inside a target directory.
pub const CONFIG_FILE: &str = "CONFIG";

/// What a target directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Management service.
    Mgs,
    /// Metadata target.
    Mdt,
    /// Object storage target.
    Ost,
}

impl Role {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Mgs => "mgs",
            Role::Mdt => "mdt",
            Role::Ost => "ost",
        }
    }
}

/// A formatted target directory's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetConfig {
    /// Format version.
    pub format: u32,
    /// Role.
    pub role: Role,
    /// File system name.
    pub fsname: String,
    /// Target index.
    pub index: u32,
    /// Target UUID.
    pub uuid: String,
    /// MGS address (`host:port`), for MDTs and OSTs.
    pub mgsnode: String,
    /// Shared key, hex (empty: none).
    pub key_hex: String,
    /// This target's own secret, hex (MDTs and OSTs; empty: formatted before there
    /// was one): it proves to the MGS that a registration comes from this target.
    pub secret_hex: String,
}

/// Why a target directory cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No CONFIG record.
    #[error("{0}: not formatted (run lode mkfs first)")]
    Unformatted(String),
    /// Unreadable or malformed record.
    #[error("{0}: bad CONFIG: {1}")]
    Bad(String, String),
    /// Written by a newer lode.
    #[error("{0}: format version {1} is newer than this lode ({FORMAT_VERSION})")]
    Newer(String, u32),
    /// Another role or file system.
    #[error("{0}: {1}")]
    Foreign(String, String),
}

impl TargetConfig {
    /// Target name: `FSNAME-MDT0000`, `FSNAME-OST0001`, `MGS`.
    pub fn name(&self) -> String {
        match self.role {
            Role::Mgs => "MGS".to_string(),
            Role::Mdt => format!("{}-MDT{:04x}", self.fsname, self.index),
            Role::Ost => format!("{}-OST{:04x}", self.fsname, self.index),
        }
    }

    /// The key as bytes.
    pub fn key(&self) -> Vec<u8> {
        from_hex(&self.key_hex)
    }

    /// The target secret as bytes.
    pub fn secret(&self) -> Vec<u8> {
        from_hex(&self.secret_hex)
    }

    /// The text record.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "format={}", self.format);
        let _ = writeln!(s, "role={}", self.role.name());
        let _ = writeln!(s, "fsname={}", self.fsname);
        let _ = writeln!(s, "index={}", self.index);
        let _ = writeln!(s, "uuid={}", self.uuid);
        let _ = writeln!(s, "mgsnode={}", self.mgsnode);
        let _ = writeln!(s, "key={}", self.key_hex);
        if !self.secret_hex.is_empty() {
            let _ = writeln!(s, "secret={}", self.secret_hex);
        }
        s
    }

    /// Parses a text record.
    pub fn parse(text: &str, dir: &str) -> Result<TargetConfig, ConfigError> {
        let bad = |m: &str| ConfigError::Bad(dir.to_string(), m.to_string());
        let get = |k: &str| -> Option<String> {
            text.lines().find_map(|l| {
                l.strip_prefix(k)
                    .and_then(|r| r.strip_prefix('='))
                    .map(|v| v.trim().to_string())
            })
        };
        let format: u32 = get("format")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("no format"))?;
        if format > FORMAT_VERSION {
            return Err(ConfigError::Newer(dir.to_string(), format));
        }
        let role = match get("role").as_deref() {
            Some("mgs") => Role::Mgs,
            Some("mdt") => Role::Mdt,
            Some("ost") => Role::Ost,
            _ => return Err(bad("no role")),
        };
        Ok(TargetConfig {
            format,
            role,
            fsname: get("fsname").ok_or_else(|| bad("no fsname"))?,
            index: get("index")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| bad("no index"))?,
            uuid: get("uuid").ok_or_else(|| bad("no uuid"))?,
            mgsnode: get("mgsnode").unwrap_or_default(),
            key_hex: get("key").unwrap_or_default(),
            secret_hex: get("secret").unwrap_or_default(),
        })
    }

    /// Loads and checks the record of `dir` for `role`.
    pub fn load(dir: &Path, role: Role) -> Result<TargetConfig, ConfigError> {
        let d = dir.display().to_string();
        let text = match std::fs::read_to_string(dir.join(CONFIG_FILE)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConfigError::Unformatted(d))
            }
            Err(e) => return Err(ConfigError::Bad(d, e.to_string())),
        };
        let c = TargetConfig::parse(&text, &d)?;
        if !c.key_hex.is_empty() || !c.secret_hex.is_empty() {
            check_secret(&dir.join(CONFIG_FILE)).map_err(|e| ConfigError::Bad(d.clone(), e))?;
        }
        if c.role != role {
            return Err(ConfigError::Foreign(
                d,
                format!("formatted as {}, not {}", c.role.name(), role.name()),
            ));
        }
        Ok(c)
    }
}

/// Bytes from hex digits (pairs that are not hex are skipped).
fn from_hex(h: &str) -> Vec<u8> {
    (0..h.len() / 2)
        .filter_map(|i| u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// Hex digits of `b`.
pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Refuses a file holding a secret (a key, or a CONFIG with one) that users other than
/// its owner may read or change: anyone who can read it can join the file system.
pub fn check_secret(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = m.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} holds a key and others may read it (mode {mode:o}): chmod 600 it",
            path.display()
        ));
    }
    Ok(())
}

/// Reads a key file, refusing one others may read (see [`check_secret`]) or an empty
/// one.
pub fn read_key_file(path: &Path) -> Result<Vec<u8>, String> {
    check_secret(path)?;
    let k = std::fs::read(path).map_err(|e| format!("key file {}: {e}", path.display()))?;
    if k.is_empty() {
        return Err(format!("key file {} is empty", path.display()));
    }
    Ok(k)
}

/// Writes a file holding a secret: mode 0600 from its creation, synced, and renamed
/// into place so a crash leaves the old one or the new one.
pub fn write_secret(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_durable(path, bytes, 0o600)
}

/// Writes `bytes` to `path` so that a crash at any point leaves the old file or the new
/// one, never a torn or empty one: a temporary file, synced, renamed over `path`, and
/// the directory synced.
pub fn write_durable(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new("")))
}

/// Syncs the directory `dir`, so that the entries made, renamed or removed in it so far
/// survive a power cut (syncing a file makes its bytes durable, not its name).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let d = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::fs::File::open(d)?.sync_all()
}

/// Creates the directory `path` and any missing parents, like `create_dir_all`, and
/// syncs the directory above each one it made: once it returns, a power cut cannot
/// take them away. A no-op for a directory that exists.
pub fn create_dir_durable(path: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut p = path;
    while !p.as_os_str().is_empty() {
        match std::fs::symlink_metadata(p) {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing.push(p);
                p = p.parent().unwrap_or(Path::new(""));
            }
            Err(e) => return Err(e),
        }
    }
    std::fs::create_dir_all(path)?;
    // Top down, so that each sync finds its directory's own entry already durable.
    for d in missing.iter().rev() {
        sync_dir(d.parent().unwrap_or(Path::new("")))?;
    }
    Ok(())
}

/// Checks a file system name: 1..=8 characters of `[A-Za-z0-9_]`.
pub fn check_fsname(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > crate::limits::FSNAME_MAX {
        return Err(format!(
            "file system name {s:?} must be 1 to {} characters",
            crate::limits::FSNAME_MAX
        ));
    }
    if !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "file system name {s:?} may only contain letters, digits and '_'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_directories_are_made_with_their_parents_and_refused_over_a_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let deep = d.path().join("a/b/c");
        create_dir_durable(&deep).expect("create");
        assert!(deep.is_dir());
        create_dir_durable(&deep).expect("again: a no-op");
        std::fs::write(d.path().join("f"), b"x").expect("write");
        assert!(create_dir_durable(&d.path().join("f/g")).is_err());
        sync_dir(&d.path().join("a")).expect("sync");
    }

    #[test]
    fn secrets_are_written_0600_and_a_key_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tempdir");
        let k = d.path().join("key");
        write_secret(&k, b"sekrit").expect("write");
        let mode = std::fs::metadata(&k).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read_key_file(&k), Ok(b"sekrit".to_vec()));
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(read_key_file(&k).unwrap_err().contains("chmod 600"));
        write_secret(&k, b"").expect("write");
        assert!(read_key_file(&k).unwrap_err().contains("empty"));
    }

    #[test]
    fn record_round_trips() {
        let c = TargetConfig {
            format: 1,
            role: Role::Ost,
            fsname: "lode".into(),
            index: 1,
            uuid: "u".into(),
            mgsnode: "127.0.0.1:9880".into(),
            key_hex: "0aff".into(),
            secret_hex: "01".into(),
        };
        assert_eq!(TargetConfig::parse(&c.render(), "d").unwrap(), c);
        assert_eq!(c.secret(), vec![1]);
        assert_eq!(c.name(), "lode-OST0001");
        assert_eq!(c.key(), vec![0x0a, 0xff]);
    }

    #[test]
    fn newer_format_is_refused() {
        let t = "format=9\nrole=mdt\nfsname=x\nindex=0\nuuid=u\n";
        assert!(matches!(
            TargetConfig::parse(t, "d"),
            Err(ConfigError::Newer(_, 9))
        ));
        assert!(check_fsname("lode").is_ok());
        assert!(check_fsname("toolongname").is_err());
        assert!(check_fsname("a-b").is_err());
    }
}
