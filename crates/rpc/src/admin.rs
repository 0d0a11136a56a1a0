//! The admin side of every server process: a Unix socket that `lode get-param` /
//! `set-param` talk to, and a Prometheus `/metrics` endpoint.
//!
//! Admin protocol: one request line (`get PATTERN`, `value PATTERN`, `list PATTERN`,
//! `help PATTERN`, `set NAME=VALUE` or `setp NAME=VALUE`), answered with lines `name=value` (multi-line values as
//! `name=` then the value), ending with a line `.`; errors are one line `error: …`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener};
use tracing::warn;

/// Longest admin request line accepted.
const ADMIN_LINE_MAX: usize = 4096;

/// A process's tunables and counters, by Lustre-style name (`type.instance.param`).
pub trait Params: Send + Sync + 'static {
    /// Every parameter name.
    fn names(&self) -> Vec<String>;
    /// A parameter's current value.
    fn get(&self, name: &str) -> Option<String>;
    /// Sets a parameter; the error is a one-line reason.
    fn set(&self, name: &str, value: &str) -> Result<(), String>;
    /// Whether it can be written, its range, and a line on what it is.
    fn help(&self, _name: &str) -> Option<String> {
        None
    }
    /// Prometheus text for `/metrics`.
    fn prometheus(&self) -> String;
    /// Stores `name=value` for every process to apply at start (`set-param -P`); only
    /// the MGS keeps such parameters (`None` elsewhere).
    fn set_persistent(&self, _name: &str, _value: &str) -> Option<Result<(), String>> {
        None
    }
}

/// How a parameter takes a new value.
pub enum Set<C: ?Sized + 'static> {
    /// Read-only.
    No,
    /// Writing anything clears it (statistics, as in Lustre).
    Clear(fn(&C)),
    /// A whole number (decimal or `0x` hex) in `min..=max`, checked here; `f` may still
    /// refuse it for a reason that depends on other values.
    Num {
        /// Smallest value accepted.
        min: u64,
        /// Largest value accepted.
        max: u64,
        /// Applies the value.
        f: fn(&C, u64) -> Result<(), String>,
    },
    /// Free text, which `f` checks.
    Text(fn(&C, &str) -> Result<(), String>),
}

/// One parameter of a kind of device: the declarative entry a process's registry is
/// made of, so that names, reading, writing, range and help live in one place.
pub struct Param<C: ?Sized + 'static> {
    /// The last component of the name (`max_rpcs_in_flight`).
    pub name: &'static str,
    /// One line for `lode list-param -v`.
    pub help: &'static str,
    /// Reads the value.
    pub get: fn(&C) -> String,
    /// Writes it.
    pub set: Set<C>,
}

/// A device of a process: its object name (`mdt.lode-MDT0000`), what its parameters
/// read from, and their table.
pub struct Device<C: ?Sized + 'static> {
    /// `type.instance`.
    pub obj: String,
    /// The state the parameters read and write.
    pub ctx: Arc<C>,
    /// Its parameters.
    pub params: &'static [Param<C>],
}

/// A process's parameter registry: its devices, each with a table of [`Param`]s. Every
/// registry is a [`Params`].
pub trait Registry: Send + Sync + 'static {
    /// What the parameters read and write.
    type Ctx: ?Sized + Send + Sync + 'static;
    /// The devices now (a client's OSCs come and go).
    fn devices(&self) -> Vec<Device<Self::Ctx>>;
    /// Prometheus text for `/metrics`.
    fn prometheus(&self) -> String;
    /// See [`Params::set_persistent`].
    fn set_persistent(&self, _name: &str, _value: &str) -> Option<Result<(), String>> {
        None
    }
}

impl<C: ?Sized> Device<C> {
    fn find(&self, name: &str) -> Option<&'static Param<C>> {
        let (obj, p) = name.rsplit_once('.')?;
        if obj != self.obj {
            return None;
        }
        self.params.iter().find(|x| x.name == p)
    }
}

fn set_one<C: ?Sized>(ctx: &C, p: &Param<C>, value: &str) -> Result<(), String> {
    match &p.set {
        Set::No => Err("Permission denied: read-only parameter".into()),
        Set::Clear(f) => {
            f(ctx);
            Ok(())
        }
        Set::Text(f) => f(ctx, value),
        Set::Num { min, max, f } => {
            let n = parse_num(value)
                .map_err(|_| format!("Invalid argument: {value:?} is not a number"))?;
            if n < *min || n > *max {
                return Err(format!(
                    "Numerical result out of range: {} must be {min}..{max}",
                    p.name
                ));
            }
            f(ctx, n)
        }
    }
}

impl<R: Registry> Params for R {
    fn names(&self) -> Vec<String> {
        self.devices()
            .iter()
            .flat_map(|d| {
                d.params
                    .iter()
                    .map(move |p| format!("{}.{}", d.obj, p.name))
            })
            .collect()
    }

    fn get(&self, name: &str) -> Option<String> {
        self.devices()
            .iter()
            .find_map(|d| d.find(name).map(|p| (p.get)(&*d.ctx)))
    }

    fn set(&self, name: &str, value: &str) -> Result<(), String> {
        let devices = self.devices();
        let Some((d, p)) = devices.iter().find_map(|d| d.find(name).map(|p| (d, p))) else {
            return Err("No such file or directory".into());
        };
        set_one(&*d.ctx, p, value)
    }

    fn help(&self, name: &str) -> Option<String> {
        self.devices().iter().find_map(|d| {
            d.find(name).map(|p| {
                let how = match &p.set {
                    Set::No => "ro".to_string(),
                    Set::Clear(_) => "rw, a write clears".to_string(),
                    Set::Num { min, max, .. } => format!("rw, {min}..{max}"),
                    Set::Text(_) => "rw".to_string(),
                };
                format!("({how}) {}", p.help)
            })
        })
    }

    fn prometheus(&self) -> String {
        Registry::prometheus(self)
    }

    fn set_persistent(&self, name: &str, value: &str) -> Option<Result<(), String>> {
        Registry::set_persistent(self, name, value)
    }
}

/// Two sets of parameters served as one (e.g. a process's registries over different
/// kinds of state).
pub struct Chain<A, B>(pub A, pub B);

impl<A: Params, B: Params> Params for Chain<A, B> {
    fn names(&self) -> Vec<String> {
        let mut v = self.0.names();
        v.extend(self.1.names());
        v
    }

    fn get(&self, name: &str) -> Option<String> {
        self.0.get(name).or_else(|| self.1.get(name))
    }

    fn set(&self, name: &str, value: &str) -> Result<(), String> {
        if self.0.names().iter().any(|n| n == name) {
            self.0.set(name, value)
        } else {
            self.1.set(name, value)
        }
    }

    fn help(&self, name: &str) -> Option<String> {
        self.0.help(name).or_else(|| self.1.help(name))
    }

    fn prometheus(&self) -> String {
        self.0.prometheus() + &self.1.prometheus()
    }

    fn set_persistent(&self, name: &str, value: &str) -> Option<Result<(), String>> {
        self.0
            .set_persistent(name, value)
            .or_else(|| self.1.set_persistent(name, value))
    }
}

/// Shell-style matching with `*` and `?` (lctl's globbing).
pub fn glob_match(pat: &str, s: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pat.chars().collect(), s.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            pi += 1;
            mark = ti;
        } else if let Some(sp) = star {
            pi = sp + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// A peer that may not change parameters (`may_set` false) is refused every `set`,
/// with nothing changed.
fn answer(params: &dyn Params, line: &str, may_set: bool) -> String {
    if !may_set && (line.starts_with("set ") || line.starts_with("setp ")) {
        return "error: set_param: Permission denied (only root, or the server's own user, may set parameters)\n.\n".into();
    }
    let mut out = String::new();
    let (verb, arg) = line.split_once(' ').unwrap_or((line, ""));
    match verb {
        "get" | "list" | "value" | "help" => {
            for n in params.names().into_iter().filter(|n| glob_match(arg, n)) {
                if verb == "list" {
                    out.push_str(&n);
                    out.push('\n');
                    continue;
                }
                if verb == "help" {
                    let h = params.help(&n).unwrap_or_default();
                    out.push_str(&format!("{n} {h}\n"));
                    continue;
                }
                if let Some(v) = params.get(&n) {
                    if verb == "value" {
                        out.push_str(&v);
                        if !v.ends_with('\n') {
                            out.push('\n');
                        }
                    } else if v.contains('\n') {
                        out.push_str(&format!("{n}=\n{}", v));
                        if !v.ends_with('\n') {
                            out.push('\n');
                        }
                    } else {
                        out.push_str(&format!("{n}={v}\n"));
                    }
                }
            }
        }
        "setp" => {
            let Some((name, value)) = arg.split_once('=') else {
                return "error: expected NAME=VALUE\n.\n".into();
            };
            match params.set_persistent(name, value) {
                None => return ".\n".into(),
                Some(Ok(())) => out.push_str(&format!("{name}={value}\n")),
                Some(Err(e)) => out.push_str(&format!(
                    "error: set_param: setting -P {name}={value}: {e}\n"
                )),
            }
        }
        "set" => {
            let Some((name, value)) = arg.split_once('=') else {
                return "error: expected NAME=VALUE\n.\n".into();
            };
            let mut hit = false;
            for n in params.names().into_iter().filter(|n| glob_match(name, n)) {
                hit = true;
                match params.set(&n, value) {
                    Ok(()) => out.push_str(&format!("{n}={value}\n")),
                    Err(e) => {
                        out.push_str(&format!("error: set_param: setting {n}={value}: {e}\n"))
                    }
                }
            }
            if !hit {
                return ".\n".into();
            }
        }
        _ => return format!("error: unknown admin request {verb:?}\n.\n"),
    }
    out.push_str(".\n");
    out
}

/// Applies the persistent parameters (`set-param -P`, from the MGS) that name
/// parameters of this process, in the order they were set; returns a line per refusal.
pub fn apply_persistent(params: &dyn Params, list: &[(String, String)]) -> Vec<String> {
    let names = params.names();
    let mut refused = Vec::new();
    for (pat, value) in list {
        for n in names.iter().filter(|n| glob_match(pat, n)) {
            if let Err(e) = params.set(n, value) {
                refused.push(format!("{n}={value}: {e}"));
            }
        }
    }
    refused
}

/// Serves the admin socket at `path` (replacing a stale one).
pub async fn serve_admin(path: PathBuf, params: Arc<dyn Params>) {
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            warn!("admin socket {}: {e}", path.display());
            return;
        }
    };
    // Anyone on the node may read parameters (as Lustre's get_param); only root and
    // the server's own user may change them, which the peer's credentials decide.
    {
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)) {
            warn!("admin socket {}: {e}", path.display());
        }
    }
    let me = nix::unistd::geteuid().as_raw();
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let may_set = sock
            .peer_cred()
            .is_ok_and(|c| c.uid() == 0 || c.uid() == me);
        let params = params.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = sock.into_split();
            let mut line = String::new();
            let mut rd = BufReader::new(rd.take(ADMIN_LINE_MAX as u64));
            if rd.read_line(&mut line).await.is_err() {
                return;
            }
            let reply = answer(&*params, line.trim_end(), may_set);
            let _ = wr.write_all(reply.as_bytes()).await;
        });
    }
}

/// Sends one admin request to the socket at `path` and returns the answer lines.
pub fn admin_request(path: &Path, line: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    s.write_all(line.as_bytes())?;
    s.write_all(b"\n")?;
    let mut out = String::new();
    s.take(64 << 20).read_to_string(&mut out)?;
    Ok(out.strip_suffix(".\n").unwrap_or(&out).to_string())
}

/// Serves `GET /metrics` in Prometheus text format.
pub async fn serve_metrics(listener: TcpListener, params: Arc<dyn Params>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let params = params.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let n =
                match tokio::time::timeout(std::time::Duration::from_secs(5), sock.read(&mut buf))
                    .await
                {
                    Ok(Ok(n)) => n,
                    _ => return,
                };
            let req = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if req.starts_with("GET /metrics") || req.starts_with("GET / ") {
                ("200 OK", params.prometheus())
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
        });
    }
}

/// Parses a decimal or `0x` hexadecimal number given to set-param.
pub fn parse_num(v: &str) -> Result<u64, String> {
    let v = v.trim();
    let r = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    r.map_err(|_| format!("invalid value {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Thing(AtomicU64);
    struct Reg(Arc<Thing>);

    static THING: [Param<Thing>; 3] = [
        Param {
            name: "size",
            help: "how big",
            get: |t| t.0.load(Ordering::Relaxed).to_string(),
            set: Set::Num {
                min: 1,
                max: 10,
                f: |t, v| {
                    if v == 7 {
                        return Err("Invalid argument: not seven".into());
                    }
                    t.0.store(v, Ordering::Relaxed);
                    Ok(())
                },
            },
        },
        Param {
            name: "stats",
            help: "counts",
            get: |_| "x\ny\n".into(),
            set: Set::Clear(|t| t.0.store(0, Ordering::Relaxed)),
        },
        Param {
            name: "uuid",
            help: "who",
            get: |_| "u".into(),
            set: Set::No,
        },
    ];

    impl Registry for Reg {
        type Ctx = Thing;
        fn devices(&self) -> Vec<Device<Thing>> {
            vec![Device {
                obj: "thing.T0".into(),
                ctx: self.0.clone(),
                params: &THING,
            }]
        }
        fn prometheus(&self) -> String {
            String::new()
        }
    }

    #[test]
    fn a_registry_checks_ranges_keeps_the_old_value_and_says_why() {
        let r = Reg(Arc::new(Thing(AtomicU64::new(3))));
        assert_eq!(
            r.names(),
            ["thing.T0.size", "thing.T0.stats", "thing.T0.uuid"]
        );
        assert_eq!(answer(&r, "get thing.*.size", true), "thing.T0.size=3\n.\n");
        assert_eq!(
            answer(&r, "get *.stats", true),
            "thing.T0.stats=\nx\ny\n.\n"
        );
        let e = answer(&r, "set thing.T0.size=11", true);
        assert!(
            e.contains("Numerical result out of range: size must be 1..10"),
            "{e}"
        );
        assert!(answer(&r, "set thing.T0.size=x", true).contains("Invalid argument"));
        assert!(answer(&r, "set thing.T0.size=7", true).contains("not seven"));
        assert!(answer(&r, "set thing.T0.uuid=v", true).contains("read-only"));
        assert!(answer(&r, "set thing.T0.size=4", false).contains("Permission denied"));
        assert!(answer(&r, "setp thing.T0.size=4", false).contains("Permission denied"));
        assert_eq!(
            answer(&r, "get thing.*.size", false),
            "thing.T0.size=3\n.\n"
        );
        assert_eq!(r.get("thing.T0.size").as_deref(), Some("3"), "kept");
        assert_eq!(
            answer(&r, "set thing.T0.size=0x5", true),
            "thing.T0.size=0x5\n.\n"
        );
        assert_eq!(r.get("thing.T0.size").as_deref(), Some("5"));
        answer(&r, "set thing.T0.stats=clear", true);
        assert_eq!(r.get("thing.T0.size").as_deref(), Some("0"), "cleared");
        assert_eq!(
            answer(&r, "help thing.T0.*", true),
            "thing.T0.size (rw, 1..10) how big\n\
             thing.T0.stats (rw, a write clears) counts\n\
             thing.T0.uuid (ro) who\n.\n"
        );
        assert_eq!(
            r.set("thing.T1.size", "1"),
            Err("No such file or directory".into())
        );
    }

    #[test]
    fn globbing_like_lctl() {
        assert!(glob_match("mdt.*.stats", "mdt.lode-MDT0000.stats"));
        assert!(glob_match("*", "x"));
        assert!(!glob_match("mdt.*.stats", "mdt.lode-MDT0000.md_stats.x"));
        assert!(glob_match("osc.lode-OST000?.x", "osc.lode-OST0001.x"));
        assert!(!glob_match("a", "ab"));
    }
}
