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
pub(crate) fn getxattr(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
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

/// Parses `1M`, `64k`, `4194304` ([`lode_base::units::parse_size`]).
pub fn parse_size(s: &str) -> Result<u64> {
    lode_base::units::parse_size(s).map_err(|e| anyhow!(e))
}

/// Arguments of `lode setstripe`, parsed in order as `lfs setstripe` does.
#[derive(Args)]
pub struct SetstripeArgs {
    /// `[-c COUNT] [-S SIZE] [-i INDEX] FILE|DIR` for a plain layout, or components
    /// `-E END [-c COUNT] [-S SIZE] [-i INDEX] [-L mdt|raid0] -E ...` (END: bytes with
    /// k/M/G, or -1/eof; options before the first -E belong to the first component).
    /// COUNT -1: every OST, 0: default; SIZE a multiple of 64 KiB; INDEX -1: any.
    /// A missing FILE is created empty; a directory gets a default for new files.
    #[arg(
        allow_hyphen_values = true,
        trailing_var_arg = true,
        required = true,
        value_name = "OPTIONS... PATH"
    )]
    args: Vec<String>,
}

/// One component as `setstripe` options describe it.
#[derive(Default, Debug)]
struct CompOpts {
    end: Option<u64>,
    count: Option<i32>,
    size: Option<u64>,
    index: Option<i32>,
    mdt: bool,
}

/// Parses `setstripe`'s options into a layout (a template: nothing instantiated) and
/// the path. `is_dir`: a plain directory default keeps count 0 (inherit).
pub fn parse_setstripe(args: &[String], is_dir: bool) -> Result<(Layout, PathBuf)> {
    let (path, opts) = args
        .split_last()
        .ok_or_else(|| anyhow!("setstripe: no file or directory given"))?;
    let mut comps: Vec<CompOpts> = Vec::new();
    let mut cur = CompOpts::default();
    let mut composite = false;
    let mut i = 0;
    while i < opts.len() {
        let tok = opts[i].as_str();
        // `-c4` as well as `-c 4`, `--stripe-count=4` as well as `--stripe-count 4`.
        let (flag, glued) = if let Some(eq) = tok.strip_prefix("--").and_then(|t| t.find('=')) {
            (&tok[..eq + 2], Some(&tok[eq + 3..]))
        } else if !tok.starts_with("--") && tok.len() > 2 && tok.starts_with('-') {
            (&tok[..2], Some(&tok[2..]))
        } else {
            (tok, None)
        };
        let mut value = || -> Result<&str> {
            if let Some(v) = glued {
                return Ok(v);
            }
            i += 1;
            opts.get(i)
                .map(String::as_str)
                .ok_or_else(|| anyhow!("setstripe: option {flag} needs a value"))
        };
        match flag {
            "-E" | "--component-end" => {
                let v = value()?;
                let end = match v {
                    "-1" | "eof" | "EOF" => lode_base::layout::EOF,
                    v => parse_size(v).map_err(|e| anyhow!("setstripe: bad component end: {e}"))?,
                };
                if cur.end.is_some() {
                    comps.push(std::mem::take(&mut cur));
                }
                cur.end = Some(end);
                composite = true;
            }
            "-c" | "--stripe-count" => {
                let v = value()?;
                cur.count = Some(
                    v.parse()
                        .map_err(|_| anyhow!("setstripe: invalid stripe count {v:?}"))?,
                );
            }
            "-S" | "--stripe-size" => {
                let v = value()?;
                cur.size = Some(parse_size(v).map_err(|e| anyhow!("setstripe: {e}"))?);
            }
            "-i" | "--stripe-index" => {
                let v = value()?;
                cur.index = Some(
                    v.parse()
                        .map_err(|_| anyhow!("setstripe: invalid stripe index {v:?}"))?,
                );
            }
            "-L" | "--layout" => match value()? {
                "mdt" => cur.mdt = true,
                "raid0" => cur.mdt = false,
                v => bail!("setstripe: unknown layout {v:?} (mdt or raid0)"),
            },
            _ => bail!("setstripe: unknown option {tok:?}"),
        }
        i += 1;
    }
    let path = PathBuf::from(path);
    if !composite {
        if cur.mdt {
            bail!("setstripe: error: 'mdt' layout needs a component end (-E)");
        }
        let count = cur.count.unwrap_or(0);
        if count < -1 {
            bail!("setstripe: invalid stripe count {count}");
        }
        let mut size = cur.size.unwrap_or(0);
        if size != 0 && size % lode_base::limits::STRIPE_SIZE_UNIT != 0 {
            bail!("setstripe: stripe size {size} is not a multiple of 65536");
        }
        if size == 0 {
            // 0 inherits: the file system default (1 MiB, lod.*.stripesize).
            size = 1 << 20;
        }
        let count = if count == 0 && !is_dir { 1 } else { count };
        return Ok((Layout::plain(count, size, cur.index.unwrap_or(-1)), path));
    }
    if cur.end.is_some() {
        comps.push(cur);
    } else if cur.count.is_some() || cur.size.is_some() || cur.index.is_some() || cur.mdt {
        bail!("setstripe: options after the last component end (-E) belong to no component");
    }
    let mut layout = Layout {
        gen: 0,
        components: Vec::new(),
    };
    let mut start = 0;
    for (n, c) in comps.iter().enumerate() {
        let end = c.end.unwrap_or(lode_base::layout::EOF);
        let pattern = if c.mdt {
            if n != 0 {
                bail!("setstripe: error: 'mdt' layout can be only the first one");
            }
            for (given, name) in [
                (c.count.is_some(), "stripe-count"),
                (c.size.is_some(), "stripe-size"),
                (c.index.is_some(), "stripe-offset"),
            ] {
                if given {
                    bail!(
                        "setstripe: Option '{name}' can't be specified with Data-on-MDT component: {end}"
                    );
                }
            }
            Pattern::Mdt
        } else {
            // Unsaid, the stripe size is the default, or 64 KiB where 1 MiB would not
            // divide the component.
            let size = c
                .size
                .unwrap_or(if end == lode_base::layout::EOF || end % (1 << 20) == 0 {
                    1 << 20
                } else {
                    lode_base::limits::STRIPE_SIZE_UNIT
                });
            Pattern::Raid0 {
                stripe_size: size,
                stripe_count: c.count.unwrap_or(0),
                stripe_offset: c.index.unwrap_or(-1),
                osts: Vec::new(),
            }
        };
        layout.components.push(lode_base::Component {
            id: n as u32 + 1,
            start,
            end,
            pattern,
        });
        start = end;
    }
    layout
        .check(u32::MAX, lode_base::limits::DOM_SIZE_MAX)
        .map_err(|e| {
            anyhow!(
                "setstripe: cannot create composite file '{}': {} ({})",
                path.display(),
                std::io::Error::from_raw_os_error(e.errno.0),
                e.reason
            )
        })?;
    Ok((layout, path))
}

/// Runs `lode setstripe`.
pub fn setstripe(a: SetstripeArgs) -> Result<()> {
    let target = a.args.last().map(PathBuf::from).unwrap_or_default();
    let is_dir = std::fs::metadata(&target)
        .map(|m| m.is_dir())
        .unwrap_or(false);
    let (layout, path) = parse_setstripe(&a.args, is_dir)?;
    let dom = layout.dom_end() > 0;
    let created = !path.exists();
    if created {
        // mknod, not open for writing: a file opened for writing may hold data, and
        // a layout only changes while a file has none.
        let c = cpath(&path)?;
        // SAFETY: a valid C string.
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFREG | 0o644, 0) } < 0 {
            bail!(
                "setstripe: {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    let set = setxattr(&path, "lustre.lov", &encode_xattr(&layout));
    if set.is_err() && created {
        // Refused: nothing is left behind.
        let _ = std::fs::remove_file(&path);
    }
    set.map_err(|e| match e.raw_os_error() {
        Some(libc::EBUSY) => anyhow!(
            "setstripe: {}: file has data, its layout cannot change",
            path.display()
        ),
        Some(libc::EINVAL) if dom => anyhow!(
            "setstripe: cannot create composite file '{}': Invalid argument (the 'mdt' component is larger than the MDT's lod.*.dom_stripesize, or Data-on-MDT is disabled there)",
            path.display()
        ),
        Some(libc::EINVAL) => anyhow!("setstripe: {}: invalid layout", path.display()),
        _ => anyhow!("setstripe: {}", not_lode(&path, e)),
    })
}

/// Arguments of `lode migrate`.
#[derive(Args)]
pub struct MigrateArgs {
    /// The new layout, as `setstripe` takes it (`-c`, `-S`, `-i`, or components
    /// `-E END [-L mdt] ...`; none: the file system default), then one or more files.
    #[arg(
        allow_hyphen_values = true,
        trailing_var_arg = true,
        required = true,
        value_name = "OPTIONS... FILE..."
    )]
    args: Vec<String>,
}

/// Splits `migrate`'s arguments into the layout options and the files after them.
fn split_options(args: &[String]) -> (&[String], &[String]) {
    let mut i = 0;
    while i < args.len() {
        let t = args[i].as_str();
        if !t.starts_with('-') || t == "-" {
            break;
        }
        let takes_value = matches!(
            t,
            "-E" | "-c"
                | "-S"
                | "-i"
                | "-L"
                | "--component-end"
                | "--stripe-count"
                | "--stripe-size"
                | "--stripe-index"
                | "--layout"
        );
        i += if takes_value { 2 } else { 1 };
    }
    let i = i.min(args.len());
    (&args[..i], &args[i..])
}

/// Runs `lode migrate` (lfs migrate): each file's data moves into the new layout
/// while it stays readable, and the layouts are swapped at the end. The copying is
/// done by the mount the file is on (through the `lustre.migrate` virtual xattr), so
/// this needs no connection of its own.
pub fn migrate(a: MigrateArgs) -> Result<()> {
    let (opts, files) = split_options(&a.args);
    if files.is_empty() {
        bail!("migrate: no file given");
    }
    let mut failed = 0;
    for f in files {
        let mut args = opts.to_vec();
        args.push(f.clone());
        // Unsaid counts stay 0: the file system default, as a new file gets.
        let (layout, path) = parse_setstripe(&args, true)
            .map_err(|e| anyhow!("{}", e.to_string().replacen("setstripe", "migrate", 1)))?;
        if let Err(e) = setxattr(&path, "lustre.migrate", &encode_xattr(&layout)) {
            failed += 1;
            let why = match e.raw_os_error() {
                Some(libc::EBUSY) => format!(
                    "{}: the file was opened for writing or truncated, or its MDT restarted, during the migration: {e}; its layout is unchanged",
                    path.display()
                ),
                Some(libc::EFBIG) => format!(
                    "{}: the new layout cannot hold the file: {e}",
                    path.display()
                ),
                Some(libc::EINVAL) if layout.dom_end() > 0 => format!(
                    "{}: {e} (the 'mdt' component is larger than the MDT's lod.*.dom_stripesize, or Data-on-MDT is disabled there, or this is not a regular file)",
                    path.display()
                ),
                _ => format!("{}", not_lode(&path, e)),
            };
            eprintln!("migrate: cannot migrate '{}': {why}", path.display());
        }
    }
    if failed > 0 {
        bail!("migrate: {failed} of {} file(s) not migrated", files.len());
    }
    Ok(())
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
    /// Only the component with this id.
    #[arg(short = 'I', long = "component-id")]
    component_id: Option<u32>,
    /// `--component-end=END`: only the component ending there (k/M/G, or -1/eof);
    /// alone, each component's end.
    #[arg(long = "component-end", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    component_end: Option<String>,
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
    let plain = l.is_plain() && a.component_id.is_none() && a.component_end.is_none();
    let Some((count, size, _, osts)) = raid0(l).filter(|_| plain) else {
        return format_composite(name, fid, l, a, false);
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
#[derive(Default)]
pub struct GetstripeFlags {
    /// `-v`.
    pub verbose: bool,
    /// `-y`.
    pub yaml: bool,
    /// `-c`.
    pub count: bool,
    /// `-S`.
    pub size: bool,
    /// `-i`.
    pub index: bool,
    /// `-I ID`.
    pub component_id: Option<u32>,
    /// `--component-end[=END]`: `Some(None)` prints each component's end.
    pub component_end: Option<Option<u64>>,
}

/// A component's `lmm_stripe_count`, `lmm_stripe_size`, pattern name and
/// `lmm_stripe_offset` as `getstripe` prints them.
fn comp_fields(c: &lode_base::Component) -> (i64, u64, &'static str, i64) {
    match &c.pattern {
        Pattern::Mdt => (0, c.end, "mdt", 0),
        Pattern::Raid0 {
            stripe_count,
            stripe_size,
            stripe_offset,
            osts,
        } => {
            // A template's 0 is the file system default: one stripe.
            let count = if *stripe_count == 0 {
                1
            } else {
                i64::from(*stripe_count)
            };
            let offset = osts
                .first()
                .map_or(i64::from(*stripe_offset), |o| i64::from(*o));
            (count, *stripe_size, "raid0", offset)
        }
    }
}

fn fmt_end(e: u64) -> String {
    if e == lode_base::layout::EOF {
        "EOF".to_string()
    } else {
        e.to_string()
    }
}

/// Lustre's composite `getstripe` text (`template`: a directory default, whose
/// components print `N/A` ids and one-line sub-layouts).
pub fn format_composite(
    name: &str,
    fid: Option<Fid>,
    l: &Layout,
    a: &GetstripeFlags,
    template: bool,
) -> String {
    let mut s = String::new();
    let picked: Vec<&lode_base::Component> = l
        .components
        .iter()
        .filter(|c| a.component_id.is_none_or(|id| c.id == id))
        .filter(|c| match a.component_end {
            Some(Some(e)) => c.end == e,
            _ => true,
        })
        .collect();
    // `-c`/`-S`/`-i` alone: the last instantiated component's (Lustre's default).
    if a.count || a.size || a.index {
        let c = picked.iter().rev().find(|c| c.is_init()).or(picked.last());
        let Some(c) = c else { return String::new() };
        let (count, size, _, offset) = comp_fields(c);
        if a.count {
            let _ = writeln!(s, "{count}");
        }
        if a.size {
            let _ = writeln!(s, "{size}");
        }
        if a.index {
            let _ = writeln!(s, "{offset}");
        }
        return s;
    }
    let _ = writeln!(s, "{name}");
    if a.component_end == Some(None) {
        for c in &picked {
            let _ = writeln!(s, "lcme_extent.e_end:   {}", fmt_end(c.end));
        }
        return s;
    }
    if a.verbose {
        let _ = writeln!(s, "composite_header:");
        let _ = writeln!(s, "  lcm_magic:         0x0BD60BD0");
        let _ = writeln!(s, "  lcm_size:          {}", 32 + 48 * l.components.len());
        let _ = writeln!(s, "  lcm_flags:         0");
    }
    let _ = writeln!(
        s,
        "  lcm_layout_gen:    {}",
        if template { 0 } else { l.gen }
    );
    let _ = writeln!(s, "  lcm_mirror_count:  1");
    let _ = writeln!(s, "  lcm_entry_count:   {}", l.components.len());
    if a.verbose {
        let _ = writeln!(s, "components:");
    }
    for c in picked {
        let (count, size, pattern, offset) = comp_fields(c);
        if template {
            let _ = writeln!(s, "    lcme_id:             N/A");
            let _ = writeln!(s, "    lcme_mirror_id:      N/A");
        } else {
            let _ = writeln!(s, "    lcme_id:             {}", c.id);
            let _ = writeln!(s, "    lcme_mirror_id:      0");
        }
        let init = !template && c.is_init();
        let _ = writeln!(
            s,
            "    lcme_flags:          {}",
            if init { "init" } else { "0" }
        );
        let _ = writeln!(s, "    lcme_extent.e_start: {}", c.start);
        let _ = writeln!(s, "    lcme_extent.e_end:   {}", fmt_end(c.end));
        if template {
            let _ = writeln!(
                s,
                "      stripe_count:  {count}       stripe_size:   {size}       pattern:       {pattern}       stripe_offset: {}",
                if c.pattern == Pattern::Mdt { -1 } else { offset }
            );
            s.push('\n');
            continue;
        }
        if a.verbose {
            let _ = writeln!(
                s,
                "    lcme_offset:         {}",
                32 + 48 * l.components.len()
            );
            let _ = writeln!(s, "    lcme_size:           {}", 32 + 24 * count.max(0));
            let _ = writeln!(s, "    sub_layout:");
            let _ = writeln!(s, "      lmm_magic:         0x0BD10BD0");
            if let Some(f) = fid {
                let _ = writeln!(s, "      lmm_seq:           {:#x}", f.seq);
                let _ = writeln!(s, "      lmm_object_id:     {:#x}", f.oid);
                let _ = writeln!(s, "      lmm_fid:           {f}");
            }
        }
        let _ = writeln!(s, "      lmm_stripe_count:  {count}");
        let _ = writeln!(s, "      lmm_stripe_size:   {size}");
        let _ = writeln!(s, "      lmm_pattern:       {pattern}");
        let _ = writeln!(s, "      lmm_layout_gen:    0");
        let _ = writeln!(
            s,
            "      lmm_stripe_offset: {}",
            if init { offset } else { -1 }
        );
        if let Pattern::Raid0 { osts, .. } = &c.pattern {
            if !osts.is_empty() {
                let _ = writeln!(s, "      lmm_objects:");
                for (i, o) in osts.iter().enumerate() {
                    let l_fid = fid.map_or_else(
                        || "[0x0:0x0:0x0]".to_string(),
                        |f| format!("[{:#x}:{:#x}:{:#x}]", f.seq, f.oid, (c.id << 16) | i as u32),
                    );
                    if a.yaml {
                        let _ = writeln!(s, "      - l_ost_idx: {o}");
                        let _ = writeln!(s, "        l_fid:     {l_fid}");
                    } else {
                        let _ =
                            writeln!(s, "      - {i:>3}: {{ l_ost_idx: {o:>3}, l_fid: {l_fid} }}");
                    }
                }
            }
        }
        s.push('\n');
    }
    s
}

fn format_dir_default(name: &str, l: Option<&Layout>, a: &GetstripeFlags) -> String {
    if let Some(l) = l.filter(|l| !l.is_plain()) {
        return format_composite(name, None, l, a, true);
    }
    let head = format!("{name}\n");
    let (count, size, offset) = l
        .and_then(raid0)
        .map_or((1, 1 << 20, -1), |(c, s, o, _)| (c, s, o));
    if a.count {
        return format!("{head}{count}\n");
    }
    if a.size {
        return format!("{head}{size}\n");
    }
    if a.index {
        return format!("{head}{offset}\n");
    }
    format!("{head}stripe_count:  {count} stripe_size:   {size} pattern:       raid0 stripe_offset: {offset}\n\n")
}

fn fid_of(p: &Path) -> Option<Fid> {
    String::from_utf8(getxattr(p, "lustre.fid").ok()?)
        .ok()?
        .parse()
        .ok()
}

/// Runs `lode getstripe`.
pub fn getstripe(a: GetstripeArgs) -> Result<()> {
    let component_end = match a.component_end.as_deref() {
        None => None,
        Some("") => Some(None),
        Some("-1" | "eof" | "EOF") => Some(Some(lode_base::layout::EOF)),
        Some(v) => Some(Some(
            parse_size(v).map_err(|e| anyhow!("getstripe: --component-end: {e}"))?,
        )),
    };
    let f = GetstripeFlags {
        verbose: a.verbose,
        yaml: a.yaml,
        count: a.count,
        size: a.size,
        index: a.index,
        component_id: a.component_id,
        component_end,
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
            out.push_str(&format_dir_default(
                &p.display().to_string(),
                layout.as_ref(),
                &f,
            ));
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
        let mut counted = std::collections::HashSet::new();
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
            // Space is the OSTs' sum, inodes the MDTs' (as lfs df); OSTs sharing
            // one file system share its space, counted once (as df counts it).
            let shared = is_ost && st.space_id != 0 && !counted.insert(st.space_id);
            if is_ost != a.inodes && !shared {
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
    fn migrate_options_end_where_the_files_begin() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = v(&["-E", "-1", "-c", "2", "-L", "mdt", "f1", "-g"]);
        let (o, f) = split_options(&a);
        assert_eq!((o.len(), f), (6, &v(&["f1", "-g"])[..]));
        let a = v(&["-c2", "--stripe-size", "1M", "a", "b"]);
        let (o, f) = split_options(&a);
        assert_eq!((o.len(), f.len()), (3, 2));
        let a = v(&["f"]);
        assert_eq!(split_options(&a), (&a[..0], &a[..]));
        // A value missing at the end is left to the layout parser to refuse.
        let a = v(&["-c"]);
        assert_eq!(split_options(&a).1.len(), 0);
    }

    #[test]
    fn plain_file_getstripe_matches_lustre() {
        let mut l = Layout::plain(2, 1 << 20, -1);
        if let Pattern::Raid0 { osts, .. } = &mut l.components[0].pattern {
            *osts = vec![1, 0];
        }
        let f = GetstripeFlags::default();
        let out = format_file("plain_file", Some(Fid::new(0x200000400, 2, 0)), &l, &f);
        let want = "plain_file\nlmm_stripe_count:  2\nlmm_stripe_size:   1048576\nlmm_pattern:       raid0\nlmm_layout_gen:    0\nlmm_stripe_offset: 1\n\tobdidx\t\t objid\t\t objid\t\t group\n\t     1\t             2\t          0x2\t   0x200000400\n\t     0\t             2\t          0x2\t   0x200000400\n\n";
        assert_eq!(out, want);
        let c = GetstripeFlags {
            count: true,
            ..Default::default()
        };
        assert_eq!(format_file("x", None, &l, &c), "2\n");
    }

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// The seed's four-component layout as `setstripe` parses it and `getstripe` prints
    /// it, once its second component has data (golden, in Lustre 2.16's format).
    #[test]
    fn the_seeds_four_component_layout_round_trips() {
        let (mut l, path) = parse_setstripe(
            &args(&[
                "-E",
                "1M",
                "-L",
                "mdt",
                "-E",
                "64M",
                "-c1",
                "-S",
                "1M",
                "-E",
                "8G",
                "-c4",
                "-E",
                "-1",
                "-c",
                "-1",
                "-S",
                "4M",
                "DoM.PFL.file1",
            ]),
            false,
        )
        .expect("the seed's layout parses");
        assert_eq!(path, PathBuf::from("DoM.PFL.file1"));
        l.gen = 3;
        if let Pattern::Raid0 {
            osts, stripe_count, ..
        } = &mut l.components[1].pattern
        {
            *osts = vec![1];
            *stripe_count = 1;
        }
        let out = format_file(
            "DoM.PFL.file1",
            Some(Fid::new(0x200000401, 0x2a, 0)),
            &l,
            &GetstripeFlags::default(),
        );
        let want = "DoM.PFL.file1
  lcm_layout_gen:    3
  lcm_mirror_count:  1
  lcm_entry_count:   4
    lcme_id:             1
    lcme_mirror_id:      0
    lcme_flags:          init
    lcme_extent.e_start: 0
    lcme_extent.e_end:   1048576
      lmm_stripe_count:  0
      lmm_stripe_size:   1048576
      lmm_pattern:       mdt
      lmm_layout_gen:    0
      lmm_stripe_offset: 0

    lcme_id:             2
    lcme_mirror_id:      0
    lcme_flags:          init
    lcme_extent.e_start: 1048576
    lcme_extent.e_end:   67108864
      lmm_stripe_count:  1
      lmm_stripe_size:   1048576
      lmm_pattern:       raid0
      lmm_layout_gen:    0
      lmm_stripe_offset: 1
      lmm_objects:
      -   0: { l_ost_idx:   1, l_fid: [0x200000401:0x2a:0x20000] }

    lcme_id:             3
    lcme_mirror_id:      0
    lcme_flags:          0
    lcme_extent.e_start: 67108864
    lcme_extent.e_end:   8589934592
      lmm_stripe_count:  4
      lmm_stripe_size:   1048576
      lmm_pattern:       raid0
      lmm_layout_gen:    0
      lmm_stripe_offset: -1

    lcme_id:             4
    lcme_mirror_id:      0
    lcme_flags:          0
    lcme_extent.e_start: 8589934592
    lcme_extent.e_end:   EOF
      lmm_stripe_count:  -1
      lmm_stripe_size:   4194304
      lmm_pattern:       raid0
      lmm_layout_gen:    0
      lmm_stripe_offset: -1

";
        assert_eq!(out, want);
        let last = GetstripeFlags {
            size: true,
            ..Default::default()
        };
        assert_eq!(format_file("x", None, &l, &last), "1048576\n");
    }

    #[test]
    fn setstripe_refuses_with_lustres_messages() {
        let err = |v: &[&str]| parse_setstripe(&args(v), false).unwrap_err().to_string();
        assert!(
            err(&["-E", "1M", "-E", "2M", "-L", "mdt", "f"]).contains("can be only the first one")
        );
        assert!(err(&["-E", "1M", "-L", "mdt", "-i", "0", "f"])
            .contains("Option 'stripe-offset' can't be specified with Data-on-MDT component"));
        assert!(err(&["-E", "2G", "-L", "mdt", "f"]).contains("File too large"));
        assert!(err(&["-E", "1M", "-c", "x", "f"]).contains("invalid stripe count"));
        assert!(
            err(&["-E", "1M", "f", "-c"]).contains("unknown option")
                || err(&["-E", "1M", "-c"]).contains("needs a value")
        );
        // Plain options still make a plain layout.
        let (l, _) = parse_setstripe(&args(&["-c", "2", "-S", "128k", "f"]), false).unwrap();
        assert!(l.is_plain());
        assert_eq!(
            l.components[0].pattern,
            Pattern::Raid0 {
                stripe_size: 128 << 10,
                stripe_count: 2,
                stripe_offset: -1,
                osts: Vec::new()
            }
        );
    }
}
