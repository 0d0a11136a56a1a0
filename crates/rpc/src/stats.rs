//! Per-opcode service statistics in Lustre's `stats` format and as Prometheus text.

use lode_proto::Opcode;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Default)]
struct Counter {
    count: AtomicU64,
    sum: AtomicU64,
    sumsq: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
}

/// Counters per opcode: samples, min/max/sum/sumsq of service time in µs.
pub struct OpStats {
    counters: Vec<Counter>,
    start: AtomicU64,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn slot(op: Opcode) -> usize {
    Opcode::ALL.iter().position(|o| *o == op).unwrap_or(0)
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            counters: Opcode::ALL
                .iter()
                .map(|_| Counter {
                    min: AtomicU64::new(u64::MAX),
                    ..Default::default()
                })
                .collect(),
            start: AtomicU64::new(now_ns()),
        }
    }
}

fn secs(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

impl OpStats {
    /// Records one request of `op` that took `us` microseconds.
    pub fn record(&self, op: Opcode, us: u64) {
        let c = &self.counters[slot(op)];
        c.count.fetch_add(1, Ordering::Relaxed);
        c.sum.fetch_add(us, Ordering::Relaxed);
        c.sumsq.fetch_add(us.saturating_mul(us), Ordering::Relaxed);
        c.min.fetch_min(us, Ordering::Relaxed);
        c.max.fetch_max(us, Ordering::Relaxed);
    }

    /// Samples recorded for `op`.
    pub fn count(&self, op: Opcode) -> u64 {
        self.counters[slot(op)].count.load(Ordering::Relaxed)
    }

    /// Clears every counter (writing `clear` to a stats file).
    pub fn clear(&self) {
        for c in &self.counters {
            c.count.store(0, Ordering::Relaxed);
            c.sum.store(0, Ordering::Relaxed);
            c.sumsq.store(0, Ordering::Relaxed);
            c.min.store(u64::MAX, Ordering::Relaxed);
            c.max.store(0, Ordering::Relaxed);
        }
        self.start.store(now_ns(), Ordering::Relaxed);
    }

    /// The Lustre `stats` file: header lines, then one line per non-zero counter.
    pub fn render(&self) -> String {
        let mut s = String::new();
        stats_header(&mut s, self.start.load(Ordering::Relaxed));
        for (op, c) in Opcode::ALL.iter().zip(&self.counters) {
            let n = c.count.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "{:<25} {} samples [usecs] {} {} {} {}",
                lustre_name(*op),
                n,
                c.min.load(Ordering::Relaxed),
                c.max.load(Ordering::Relaxed),
                c.sum.load(Ordering::Relaxed),
                c.sumsq.load(Ordering::Relaxed)
            );
        }
        s
    }

    /// Prometheus text lines for these counters, labelled with `target`.
    pub fn prometheus(&self, prefix: &str, target: &str, out: &mut String) {
        let _ = writeln!(out, "# TYPE {prefix}_requests_total counter");
        for (op, c) in Opcode::ALL.iter().zip(&self.counters) {
            let n = c.count.load(Ordering::Relaxed);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "{prefix}_requests_total{{target=\"{target}\",op=\"{}\"}} {n}",
                    lustre_name(*op)
                );
            }
        }
        let _ = writeln!(out, "# TYPE {prefix}_service_seconds_total counter");
        for (op, c) in Opcode::ALL.iter().zip(&self.counters) {
            let n = c.count.load(Ordering::Relaxed);
            if n > 0 {
                let sum = c.sum.load(Ordering::Relaxed) as f64 / 1e6;
                let _ = writeln!(
                    out,
                    "{prefix}_service_seconds_total{{target=\"{target}\",op=\"{}\"}} {sum}",
                    lustre_name(*op)
                );
            }
        }
    }
}

/// The MDC's `md_stats`: metadata operations asked of it, by the name of Lustre's md
/// method that does the same (count only, unit `reqs`).
pub struct MdStats {
    counts: [AtomicU64; MD_OPS.len()],
    start: AtomicU64,
}

/// Lustre's md method names, in the order `md_stats` prints them.
const MD_OPS: [&str; 14] = [
    "close",
    "create",
    "getattr",
    "getattr_name",
    "intent_lock",
    "link",
    "rename",
    "setattr",
    "fsync",
    "read_page",
    "unlink",
    "setxattr",
    "getxattr",
    "intent_getattr_async",
];

/// The md method an MDC request serves, if any.
fn md_op(op: Opcode) -> Option<usize> {
    let name = match op {
        Opcode::Close => "close",
        Opcode::Create => "create",
        Opcode::Getattr => "getattr",
        Opcode::Lookup => "getattr_name",
        Opcode::Open => "intent_lock",
        Opcode::Link => "link",
        Opcode::Rename => "rename",
        Opcode::Setattr => "setattr",
        Opcode::Sync => "fsync",
        Opcode::Readdir => "read_page",
        Opcode::Unlink => "unlink",
        Opcode::Setxattr => "setxattr",
        Opcode::Getxattr | Opcode::Listxattr => "getxattr",
        Opcode::Batch | Opcode::BatchModify => "intent_getattr_async",
        _ => return None,
    };
    MD_OPS.iter().position(|n| *n == name)
}

impl Default for MdStats {
    fn default() -> Self {
        MdStats {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            start: AtomicU64::new(now_ns()),
        }
    }
}

impl MdStats {
    /// Counts one request (opcodes that are no md method are not counted).
    pub fn record(&self, op: Opcode) {
        if let Some(i) = md_op(op) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Forgets every count.
    pub fn clear(&self) {
        for c in &self.counts {
            c.store(0, Ordering::Relaxed);
        }
        self.start.store(now_ns(), Ordering::Relaxed);
    }

    /// The `md_stats` file: the header, then one line per non-zero counter.
    pub fn render(&self) -> String {
        let mut s = String::new();
        stats_header(&mut s, self.start.load(Ordering::Relaxed));
        for (name, c) in MD_OPS.iter().zip(&self.counts) {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                let _ = writeln!(s, "{name:<25} {n} samples [reqs]");
            }
        }
        s
    }
}

/// The three header lines of a Lustre counter file.
fn stats_header(s: &mut String, start: u64) {
    let now = now_ns();
    let _ = writeln!(s, "{:<25} {} secs.nsecs", "snapshot_time", secs(now));
    let _ = writeln!(s, "{:<25} {} secs.nsecs", "start_time", secs(start));
    let _ = writeln!(
        s,
        "{:<25} {} secs.nsecs",
        "elapsed_time",
        secs(now.saturating_sub(start))
    );
}

/// The name Lustre's stats files use for an opcode.
pub fn lustre_name(op: Opcode) -> &'static str {
    match op {
        Opcode::Connect => "mds_connect",
        Opcode::Disconnect => "mds_disconnect",
        Opcode::Ping => "obd_ping",
        Opcode::Statfs => "mds_statfs",
        Opcode::SeqAlloc => "seq_query",
        Opcode::Getattr => "mds_getattr",
        Opcode::Lookup => "mds_getattr_name",
        Opcode::Readdir => "mds_readpage",
        Opcode::Batch | Opcode::BatchModify => "mds_batch",
        Opcode::Create => "mds_reint_create",
        Opcode::Open => "mds_reint_open",
        Opcode::Close => "mds_close",
        Opcode::Unlink => "mds_reint_unlink",
        Opcode::Rename => "mds_reint_rename",
        Opcode::Link => "mds_reint_link",
        Opcode::Setattr => "mds_reint_setattr",
        Opcode::Getxattr => "mds_getxattr",
        Opcode::Setxattr => "mds_reint_setxattr",
        Opcode::Listxattr => "mds_listxattr",
        Opcode::DomRead => "dom_read",
        Opcode::DomWrite => "dom_write",
        Opcode::DomSeek => "dom_seek",
        Opcode::LayoutIntent => "ldlm_intent_layout",
        Opcode::Migrate => "mds_swap_layouts",
        Opcode::Sync => "mds_sync",
        Opcode::OstRead => "ost_read",
        Opcode::OstWrite => "ost_write",
        Opcode::Punch => "ost_punch",
        Opcode::OstGetattr => "ost_getattr",
        Opcode::OstSync => "ost_sync",
        Opcode::Destroy => "ost_destroy",
        Opcode::OstSetattr => "ost_setattr",
        Opcode::OstFallocate => "ost_fallocate",
        Opcode::OstSeek => "ost_seek",
        Opcode::LdlmEnqueue => "ldlm_enqueue",
        Opcode::LdlmCancel => "ldlm_cancel",
        Opcode::CloseAhead => "mds_close_ahead",
        Opcode::AccessAhead => "mds_access_ahead",
        Opcode::LdlmBlCallback => "ldlm_bl_callback",
        Opcode::LdlmCallbackChannel => "ldlm_callback_channel",
        Opcode::AuthNonce => "sec_ctx_init",
        Opcode::Flock => "ldlm_flock_enqueue",
        Opcode::FlockGranted => "ldlm_cp_callback",
        Opcode::MgsRegister => "mgs_target_reg",
        Opcode::MgsConfig => "mgs_config_read",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_nonzero_counters_in_lustre_format() {
        let s = OpStats::default();
        s.record(Opcode::Getattr, 5);
        s.record(Opcode::Getattr, 7);
        let out = s.render();
        assert!(out.starts_with("snapshot_time             "));
        let line = out.lines().find(|l| l.starts_with("mds_getattr ")).unwrap();
        assert_eq!(
            line,
            "mds_getattr               2 samples [usecs] 5 7 12 74"
        );
        assert!(!out.contains("mds_close"));
    }
}

/// Lustre's "rpcs in flight" histogram: at each send, how many RPCs of the kind were in
/// flight, that one included.
pub struct InFlight {
    counts: parking_lot::Mutex<Vec<u64>>,
    start: AtomicU64,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            counts: parking_lot::Mutex::new(Vec::new()),
            start: AtomicU64::new(now_ns()),
        }
    }
}

impl InFlight {
    /// Counts one send that found `n` in flight (itself included).
    pub fn tally(&self, n: usize) {
        let mut c = self.counts.lock();
        if c.len() <= n {
            c.resize(n + 1, 0);
        }
        c[n] += 1;
    }

    /// Forgets every count.
    pub fn clear(&self) {
        self.counts.lock().clear();
        self.start.store(now_ns(), Ordering::Relaxed);
    }

    fn snapshot(&self) -> Vec<u64> {
        self.counts.lock().clone()
    }

    /// The largest number in flight ever counted (0 if none).
    pub fn max_seen(&self) -> usize {
        let c = self.counts.lock();
        c.iter().rposition(|&n| n > 0).unwrap_or(0)
    }

    /// How many sends found `n` in flight.
    pub fn count(&self, n: usize) -> u64 {
        self.counts.lock().get(n).copied().unwrap_or(0)
    }
}

/// Lustre's `pct()`: integer percent, 0 of nothing.
fn pct(a: u64, b: u64) -> u64 {
    (a * 100).checked_div(b).unwrap_or(0)
}

/// The header of an `rpc_stats` file (Lustre 2.14.56 and later).
pub fn rpc_stats_header(out: &mut String, since: &InFlight) {
    let now = now_ns();
    let start = since.start.load(Ordering::Relaxed);
    let _ = writeln!(out, "{:<26}{} secs.nsecs", "snapshot_time:", secs(now));
    let _ = writeln!(out, "{:<26}{} secs.nsecs", "start_time:", secs(start));
    let _ = writeln!(
        out,
        "{:<26}{} secs.nsecs",
        "elapsed_time:",
        secs(now.saturating_sub(start))
    );
}

/// One histogram table (`title` over the rows), as the MDC's "modify" table: rows up to
/// the last non-zero count (only `0:` when empty), columns rpcs, %, cum %.
pub fn rpc_stats_table(out: &mut String, title: &str, h: &InFlight) {
    let c = h.snapshot();
    let total: u64 = c.iter().sum();
    let _ = writeln!(out, "\t\t\t{title}");
    let _ = writeln!(out, "rpcs in flight        rpcs   % cum %");
    let last = c.iter().rposition(|&n| n > 0).unwrap_or(0);
    let mut cum = 0;
    for (i, &n) in c.iter().enumerate().take(last + 1) {
        cum += n;
        let _ = writeln!(
            out,
            "{i}:\t\t{n:10} {:3} {:3}",
            pct(n, total),
            pct(cum, total)
        );
    }
    if c.is_empty() {
        let _ = writeln!(out, "0:\t\t{:10} {:3} {:3}", 0, 0, 0);
    }
}

/// A read/write pair of histograms side by side, as the OSC's tables; `label` names
/// bucket `i` (the count itself, or a power of two for log2 buckets).
pub fn rpc_stats_table2(
    out: &mut String,
    rows: &str,
    read: &InFlight,
    write: &InFlight,
    label: fn(usize) -> u64,
) {
    let (r, w) = (read.snapshot(), write.snapshot());
    let (rt, wt): (u64, u64) = (r.iter().sum(), w.iter().sum());
    let _ = writeln!(out, "\t\t\tread\t\t\twrite");
    let _ = writeln!(out, "{rows:<22}rpcs   % cum % |       rpcs   % cum %");
    let last = r
        .iter()
        .rposition(|&n| n > 0)
        .unwrap_or(0)
        .max(w.iter().rposition(|&n| n > 0).unwrap_or(0));
    let (mut rc, mut wc) = (0, 0);
    for i in 0..=last {
        let rn = r.get(i).copied().unwrap_or(0);
        let wn = w.get(i).copied().unwrap_or(0);
        rc += rn;
        wc += wn;
        let _ = writeln!(
            out,
            "{}:\t\t{rn:10} {:3} {:3}   | {wn:10} {:3} {:3}",
            label(i),
            pct(rn, rt),
            pct(rc, rt),
            pct(wn, wt),
            pct(wc, wt)
        );
    }
}

#[cfg(test)]
mod in_flight_tests {
    use super::*;

    #[test]
    fn md_stats_counts_md_methods_only() {
        let m = MdStats::default();
        m.record(Opcode::Create);
        m.record(Opcode::Create);
        m.record(Opcode::Listxattr);
        m.record(Opcode::OstWrite);
        let out = m.render();
        let body: Vec<&str> = out.lines().skip(3).collect();
        assert_eq!(
            body,
            [
                "create                    2 samples [reqs]",
                "getxattr                  1 samples [reqs]"
            ]
        );
        m.clear();
        assert_eq!(m.render().lines().count(), 3);
    }

    #[test]
    fn osc_tables_label_log2_buckets_like_lustre() {
        let (r, w) = (InFlight::default(), InFlight::default());
        // Writes of 1, 2 and 256 pages: buckets fls(n - 1) = 0, 1, 8.
        w.tally(0);
        w.tally(1);
        w.tally(8);
        let mut s = String::new();
        rpc_stats_table2(&mut s, "pages per rpc", &r, &w, |i| 1 << i);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "\t\t\tread\t\t\twrite");
        assert_eq!(
            lines[1],
            "pages per rpc         rpcs   % cum % |       rpcs   % cum %"
        );
        assert_eq!(lines[2], "1:\t\t         0   0   0   |          1  33  33");
        assert_eq!(
            lines[10],
            "256:\t\t         0   0   0   |          1  33 100"
        );
        assert_eq!(lines.len(), 11);
    }

    #[test]
    fn modify_table_in_lustre_layout() {
        let h = InFlight::default();
        for n in [1, 1, 2, 2, 2, 7] {
            h.tally(n);
        }
        let mut s = String::new();
        rpc_stats_table(&mut s, "modify", &h);
        let want = "\t\t\tmodify\n\
                    rpcs in flight        rpcs   % cum %\n\
                    0:\t\t         0   0   0\n\
                    1:\t\t         2  33  33\n\
                    2:\t\t         3  50  83\n\
                    3:\t\t         0   0  83\n\
                    4:\t\t         0   0  83\n\
                    5:\t\t         0   0  83\n\
                    6:\t\t         0   0  83\n\
                    7:\t\t         1  16 100\n";
        assert_eq!(s, want);
        assert_eq!(h.max_seen(), 7);
        h.clear();
        let mut s = String::new();
        rpc_stats_table(&mut s, "modify", &h);
        assert!(s.ends_with("0:\t\t         0   0   0\n"), "{s:?}");
        assert_eq!(s.lines().count(), 3);
    }
}
