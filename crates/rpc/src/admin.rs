//! The admin side of every server process: a Unix socket that `lode get-param` /
//! `set-param` talk to, and a Prometheus `/metrics` endpoint.
//!
//! Admin protocol: one request line (`get PATTERN`, `value PATTERN`, `list PATTERN` or
//! `set NAME=VALUE`), answered with lines `name=value` (multi-line values as
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
    /// Prometheus text for `/metrics`.
    fn prometheus(&self) -> String;
    /// Stores `name=value` for every process to apply at start (`set-param -P`); only
    /// the MGS keeps such parameters (`None` elsewhere).
    fn set_persistent(&self, _name: &str, _value: &str) -> Option<Result<(), String>> {
        None
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

fn answer(params: &dyn Params, line: &str) -> String {
    let mut out = String::new();
    let (verb, arg) = line.split_once(' ').unwrap_or((line, ""));
    match verb {
        "get" | "list" | "value" => {
            for n in params.names().into_iter().filter(|n| glob_match(arg, n)) {
                if verb == "list" {
                    out.push_str(&n);
                    out.push('\n');
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
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let params = params.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = sock.into_split();
            let mut line = String::new();
            let mut rd = BufReader::new(rd.take(ADMIN_LINE_MAX as u64));
            if rd.read_line(&mut line).await.is_err() {
                return;
            }
            let reply = answer(&*params, line.trim_end());
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
    use super::glob_match;

    #[test]
    fn globbing_like_lctl() {
        assert!(glob_match("mdt.*.stats", "mdt.lode-MDT0000.stats"));
        assert!(glob_match("*", "x"));
        assert!(!glob_match("mdt.*.stats", "mdt.lode-MDT0000.md_stats.x"));
        assert!(glob_match("osc.lode-OST000?.x", "osc.lode-OST0001.x"));
        assert!(!glob_match("a", "ab"));
    }
}
