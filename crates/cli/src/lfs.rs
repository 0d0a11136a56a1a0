//! The `lfs`-like user commands: setstripe, getstripe, df, path2fid, fid2path.
//!
//! Layouts travel through the `lustre.lov` virtual xattr of a file on the mount (so
//! `getfattr -n lustre.lov` users see the same thing), FIDs through `lustre.fid`
//! (answered by the mount), names through `lustre.link` (read from the MDT).

use crate::mount::source_of;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use lode_base::layout::{decode_xattr, encode_xattr};
use lode_base::{Fid, Layout, Pattern};
use std::ffi::CString;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| anyhow!("{}: path contains NUL", p.display()))
}

/// getxattr(2) of a whole value.
fn getxattr(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let c = cpath(p).map_err(std::io::Error::other)?;
    let n = CString::new(name).map_err(std::io::Error::other)?;
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C strings and a buffer of the stated length.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// setxattr(2).
fn setxattr(p: &Path, name: &str, v: &[u8]) -> std::io::Result<()> {
    let c = cpath(p).map_err(std::io::Error::other)?;
    let n = CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: valid C strings and a value of the stated length.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn not_lode(p: &Path, e: std::io::Error) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::EOPNOTSUPP)
        || e.raw_os_error() == Some(libc::ENODATA) && source_of(p).is_none()
    {
        anyhow!("{}: not on a lode file system", p.display())
    } else {
        anyhow!("{}: {e}", p.display())
    }
}

/// Parses `1M`, `64k`, `4194304`.
pub fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last().map(|c| c.to_ascii_lowercase()) {
        Some('k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| anyhow!("invalid size {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| anyhow!("size {s:?} too large"))
}

/// Arguments of `lode setstripe`.
#[derive(Args)]
pub struct SetstripeArgs {
    /// Stripe count (-1: all OSTs, 0: default).
    #[arg(
        short = 'c',
        long = "stripe-count",
        allow_hyphen_values = true,
        default_value_t = 0
    )]
    count: i32,
    /// Stripe size (multiple of 64 KiB; k/M/G suffixes).
    #[arg(short = 'S', long = "stripe-size", default_value = "0")]
    size: String,
    /// First OST index (-1: any).
    #[arg(short = 'i', long = "stripe-index", allow_hyphen_values = true, default_value_t = -1)]
    index: i32,
    /// File (created empty if missing) or directory (sets its default layout).
    path: PathBuf,
}

/// Runs `lode setstripe`.
pub fn setstripe(a: SetstripeArgs) -> Result<()> {
    let mut size = parse_size(&a.size).map_err(|e| anyhow!("setstripe: {e}"))?;
    if a.count < -1 {
        bail!("setstripe: invalid stripe count {}", a.count);
    }
    if size != 0 && size % lode_base::limits::STRIPE_SIZE_UNIT != 0 {
        bail!("setstripe: stripe size {size} is not a multiple of 65536");
    }
    let is_dir = std::fs::metadata(&a.path)
        .map(|m| m.is_dir())
        .unwrap_or(false);
    if size == 0 {
        // 0 inherits: the file system default (1 MiB, lod.*.stripesize).
        size = 1 << 20;
    }
    let count = if a.count == 0 && !is_dir { 1 } else { a.count };
    let layout = Layout::plain(count, size, a.index);
    if !a.path.exists() {
        // mknod, not open for writing: a file opened for writing may hold data, and
        // a layout only changes while a file has none.
        let c = cpath(&a.path)?;
        // SAFETY: a valid C string.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFREG | 0o644, 0) } < 0 {
            bail!(
                "setstripe: {}: {}",
                a.path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    setxattr(&a.path, "lustre.lov", &encode_xattr(&layout)).map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => anyhow!(
            "setstripe: {}: file has data, its layout cannot change",
            a.path.display()
        ),
        Some(libc::EINVAL) => anyhow!("setstripe: {}: invalid layout", a.path.display()),
        _ => anyhow!("setstripe: {}", not_lode(&a.path, e)),
    })
}

/// Arguments of `lode getstripe`.
#[derive(Args)]
pub struct GetstripeArgs {
    /// Verbose: also print the magic, FID and object sequence.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// YAML output.
    #[arg(short = 'y', long)]
    yaml: bool,
    /// Stripe count only.
    #[arg(short = 'c', long = "stripe-count")]
    count: bool,
    /// Stripe size only.
    #[arg(short = 'S', long = "stripe-size")]
    size: bool,
    /// Stripe offset (first OST) only.
    #[arg(short = 'i', long = "stripe-index")]
    index: bool,
    /// A directory's own default layout, not its entries.
    #[arg(short = 'd', long)]
    directory: bool,
    /// Files or directories.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

fn raid0(l: &Layout) -> Option<(i32, u64, i32, &[u32])> {
    match &l.components.first()?.pattern {
        Pattern::Raid0 {
            stripe_count,
            stripe_size,
            stripe_offset,
            osts,
        } => Some((*stripe_count, *stripe_size, *stripe_offset, osts.as_slice())),
        Pattern::Mdt => None,
    }
}

/// Lustre's `getstripe` text for one file.
pub fn format_file(name: &str, fid: Option<Fid>, l: &Layout, a: &GetstripeFlags) -> String {
    let mut s = String::new();
    let Some((count, size, _, osts)) = raid0(l) else {
        return format!("{name}\n(composite layout)\n");
    };
    let first = osts.first().map_or(-1, |o| *o as i64);
    if a.count {
        return format!("{count}\n");
    }
    if a.size {
        return format!("{size}\n");
    }
    if a.index {
        return format!("{first}\n");
    }
    let _ = writeln!(s, "{name}");
    if a.verbose {
        let _ = writeln!(s, "lmm_magic:         0x0BD10BD0");
        if let Some(f) = fid {
            let _ = writeln!(s, "lmm_seq:           {:#x}", f.seq);
            let _ = writeln!(s, "lmm_object_id:     {:#x}", f.oid);
            let _ = writeln!(s, "lmm_fid:           {f}");
        }
    }
    let _ = writeln!(s, "lmm_stripe_count:  {count}");
    let _ = writeln!(s, "lmm_stripe_size:   {size}");
    let _ = writeln!(s, "lmm_pattern:       raid0");
    let _ = writeln!(s, "lmm_layout_gen:    {}", l.gen);
    let _ = writeln!(s, "lmm_stripe_offset: {first}");
    if a.yaml {
        let _ = writeln!(s, "lmm_objects:");
        for (i, o) in osts.iter().enumerate() {
            let _ = writeln!(s, "      - l_ost_idx: {o}");
            if let Some(f) = fid {
                let _ = writeln!(s, "        l_fid:     [{:#x}:{:#x}:{:#x}]", f.seq, f.oid, i);
            }
        }
        return s;
    }
    let _ = writeln!(s, "\tobdidx\t\t objid\t\t objid\t\t group");
    for o in osts {
        let (oid, seq) = fid.map_or((0, 0), |f| (u64::from(f.oid), f.seq));
        let group = if seq == 0 {
            "0".to_string()
        } else {
            format!("{seq:#x}")
        };
        let _ = writeln!(
            s,
            "\t{:>6}\t{:>14}\t{:>13}\t{:>14}",
            o,
            oid,
            format!("{:#x}", oid),
            group
        );
    }
    s.push('\n');
    s
}

/// Which parts of the layout to print.
pub struct GetstripeFlags {
    verbose: bool,
    yaml: bool,
    count: bool,
    size: bool,
    index: bool,
}

fn format_dir_default(l: Option<&Layout>, a: &GetstripeFlags) -> String {
    let (count, size, offset) = l
        .and_then(raid0)
        .map_or((1, 1 << 20, -1), |(c, s, o, _)| (c, s, o));
    if a.count {
        return format!("{count}\n");
    }
    if a.size {
        return format!("{size}\n");
    }
    if a.index {
        return format!("{offset}\n");
    }
    format!("stripe_count:  {count} stripe_size:   {size} pattern:       raid0 stripe_offset: {offset}\n\n")
}

fn fid_of(p: &Path) -> Option<Fid> {
    String::from_utf8(getxattr(p, "lustre.fid").ok()?)
        .ok()?
        .parse()
        .ok()
}

/// Runs `lode getstripe`.
pub fn getstripe(a: GetstripeArgs) -> Result<()> {
    let f = GetstripeFlags {
        verbose: a.verbose,
        yaml: a.yaml,
        count: a.count,
        size: a.size,
        index: a.index,
    };
    let mut out = String::new();
    for p in &a.paths {
        let md = std::fs::metadata(p).map_err(|e| anyhow!("getstripe: {}: {e}", p.display()))?;
        let layout = match getxattr(p, "lustre.lov") {
            Ok(v) => Some(
                decode_xattr(&v)
                    .ok_or_else(|| anyhow!("getstripe: {}: bad layout", p.display()))?,
            ),
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) && source_of(p).is_some() => None,
            Err(e) => return Err(anyhow!("getstripe: {}", not_lode(p, e))),
        };
        if md.is_dir() {
            out.push_str(&format!("{}\n", p.display()));
            out.push_str(&format_dir_default(layout.as_ref(), &f));
            if a.directory {
                continue;
            }
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)?
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .collect();
            entries.sort();
            for e in entries {
                if e.is_file() {
                    if let Ok(v) = getxattr(&e, "lustre.lov") {
                        if let Some(l) = decode_xattr(&v) {
                            out.push_str(&format_file(
                                &e.display().to_string(),
                                fid_of(&e),
                                &l,
                                &f,
                            ));
                        }
                    }
                }
            }
        } else {
            let l = layout.ok_or_else(|| anyhow!("getstripe: {}: has no layout", p.display()))?;
            out.push_str(&format_file(&p.display().to_string(), fid_of(p), &l, &f));
        }
    }
    print!("{out}");
    Ok(())
}

/// Arguments of `lode path2fid`.
#[derive(Args)]
pub struct Path2fidArgs {
    /// Paths on a lode mount.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
}

/// Runs `lode path2fid`.
pub fn path2fid(a: Path2fidArgs) -> Result<()> {
    let many = a.paths.len() > 1;
    for p in &a.paths {
        let v = getxattr(p, "lustre.fid").map_err(|e| anyhow!("path2fid: {}", not_lode(p, e)))?;
        let fid = String::from_utf8_lossy(&v).to_string();
        if many {
            println!("{}: {fid}", p.display());
        } else {
            println!("{fid}");
        }
    }
    Ok(())
}

/// Arguments of `lode fid2path`.
#[derive(Args)]
pub struct Fid2pathArgs {
    /// Mount point of the file system.
    mountpoint: PathBuf,
    /// FIDs, `[0xSEQ:0xOID:0xVER]`.
    #[arg(required = true)]
    fids: Vec<String>,
}

/// The mount point of the lode mount holding `mnt`.
fn mount_of(mnt: &Path) -> Result<PathBuf> {
    let (_, mp) = source_of(mnt).ok_or_else(|| anyhow!("{}: not a lode mount", mnt.display()))?;
    Ok(mp)
}

/// Runs `lode fid2path`.
pub fn fid2path(a: Fid2pathArgs) -> Result<()> {
    let mp = mount_of(&a.mountpoint).map_err(|e| anyhow!("fid2path: {e}"))?;
    let mut failed = None;
    for f in &a.fids {
        let fid: Fid = f.parse().map_err(|e| anyhow!("fid2path: {e}"))?;
        // The mount answers (as root only): no connection of this command's own.
        let name = format!(
            "{}{fid}",
            String::from_utf8_lossy(lode_fuse::FID2PATH_XATTR)
        );
        match getxattr(&mp, &name) {
            Ok(paths) => {
                for p in paths.split(|b| *b == b'\n') {
                    let rel = String::from_utf8_lossy(p);
                    println!(
                        "{}",
                        if rel.is_empty() {
                            mp.display().to_string()
                        } else {
                            format!("{}/{rel}", mp.display())
                        }
                    );
                }
            }
            Err(e) => failed = Some(anyhow!("fid2path: {fid}: {e}")),
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Human-readable size, as `lfs df -h`.
pub fn human(bytes: u64) -> String {
    let units = ["B", "K", "M", "G", "T", "P"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes}")
    } else {
        format!("{v:.1}{}", units[i])
    }
}

/// Arguments of `lode df`.
#[derive(Args)]
pub struct DfArgs {
    /// Inodes instead of blocks.
    #[arg(short = 'i', long)]
    inodes: bool,
    /// Human-readable sizes.
    #[arg(short = 'H', long = "human-readable", short_alias = 'h')]
    human: bool,
    /// A lode mount point (default: every lode mount).
    mountpoint: Option<PathBuf>,
}

/// Runs `lode df` (like `lfs df`).
pub fn df(a: DfArgs) -> Result<()> {
    let mounts: Vec<PathBuf> = match &a.mountpoint {
        Some(m) => vec![m.clone()],
        None => {
            let m = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
            m.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(' ').collect();
                    (f.len() > 2
                        && f[2].starts_with("fuse")
                        && lode_client::parse_source(f[0]).is_ok())
                    .then(|| PathBuf::from(f[1]))
                })
                .collect()
        }
    };
    if mounts.is_empty() {
        bail!("df: no lode file system is mounted");
    }
    let (c1, c2, c3) = if a.inodes {
        ("Inodes", "IUsed", "IFree")
    } else {
        ("1K-blocks", "Used", "Available")
    };
    println!(
        "{:<20} {:>12} {:>12} {:>12} {:>4} Mounted on",
        "UUID",
        c1,
        c2,
        c3,
        if a.inodes { "IUse%" } else { "Use%" }
    );
    for m in mounts {
        let mp = mount_of(&m).map_err(|e| anyhow!("df: {e}"))?;
        let report = getxattr(&mp, &String::from_utf8_lossy(lode_fuse::STATFS_XATTR))
            .map_err(|e| anyhow!("df: {}: {e}", mp.display()))?;
        let mut sum = (0u64, 0u64, 0u64);
        for (name, r) in lode_client::parse_statfs_report(&report) {
            let Ok(st) = r else {
                println!("{:<20} inactive device", format!("{name}_UUID"));
                continue;
            };
            let (total, used, avail) = if a.inodes {
                (st.files, st.files.saturating_sub(st.ffree), st.ffree)
            } else {
                let k = u64::from(st.bsize) / 1024;
                let k = k.max(1);
                (
                    st.blocks * k,
                    st.blocks.saturating_sub(st.bfree) * k,
                    st.bavail * k,
                )
            };
            let is_ost = name.contains("-OST");
            let idx = name
                .rsplit("OST")
                .next()
                .or_else(|| name.rsplit("MDT").next())
                .unwrap_or("0");
            let idx = u32::from_str_radix(idx, 16).unwrap_or(0);
            let tag = if is_ost {
                format!("[OST:{idx}]")
            } else {
                format!("[MDT:{idx}]")
            };
            // Space is the OSTs' sum, inodes the MDTs' (as lfs df).
            if is_ost != a.inodes {
                sum = (sum.0 + total, sum.1 + used, sum.2 + avail);
            }
            print_row(
                &format!("{name}_UUID"),
                total,
                used,
                avail,
                &format!("{}{tag}", mp.display()),
                a.human && !a.inodes,
            );
        }
        println!();
        print_row(
            "filesystem_summary:",
            sum.0,
            sum.1,
            sum.2,
            &mp.display().to_string(),
            a.human && !a.inodes,
        );
        println!();
    }
    Ok(())
}

fn print_row(name: &str, total: u64, used: u64, avail: u64, at: &str, human_sizes: bool) {
    let pct = if used + avail > 0 {
        (used * 100).div_ceil(used + avail)
    } else {
        0
    };
    let f = |v: u64| {
        if human_sizes {
            human(v * 1024)
        } else {
            v.to_string()
        }
    };
    println!(
        "{:<20} {:>12} {:>12} {:>12} {:>3}% {}",
        name,
        f(total),
        f(used),
        f(avail),
        pct,
        at
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("4194304").unwrap(), 4 << 20);
        assert!(parse_size("x").is_err());
        assert_eq!(human(1536), "1.5K");
    }

    #[test]
    fn plain_file_getstripe_matches_lustre() {
        let mut l = Layout::plain(2, 1 << 20, -1);
        if let Pattern::Raid0 { osts, .. } = &mut l.components[0].pattern {
            *osts = vec![1, 0];
        }
        let f = GetstripeFlags {
            verbose: false,
            yaml: false,
            count: false,
            size: false,
            index: false,
        };
        let out = format_file("plain_file", Some(Fid::new(0x200000400, 2, 0)), &l, &f);
        let want = "plain_file\nlmm_stripe_count:  2\nlmm_stripe_size:   1048576\nlmm_pattern:       raid0\nlmm_layout_gen:    0\nlmm_stripe_offset: 1\n\tobdidx\t\t objid\t\t objid\t\t group\n\t     1\t             2\t          0x2\t   0x200000400\n\t     0\t             2\t          0x2\t   0x200000400\n\n";
        assert_eq!(out, want);
        let c = GetstripeFlags {
            verbose: false,
            yaml: false,
            count: true,
            size: false,
            index: false,
        };
        assert_eq!(format_file("x", None, &l, &c), "2\n");
    }
}
