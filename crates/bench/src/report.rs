//! Results: the mdtest-like table, JSON files, phase-by-phase comparisons and SVG plots.

use crate::stats::summary;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// One phase over every iteration.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseReport {
    /// mdtest's name for the phase.
    pub name: String,
    /// Unit of the rates (`ops/s`, `MB/s`, `entries/s`).
    pub unit: String,
    /// Rate of each iteration.
    pub rates: Vec<f64>,
    /// Largest rate.
    pub max: f64,
    /// Smallest rate.
    pub min: f64,
    /// Mean rate.
    pub mean: f64,
    /// Standard deviation of the rates.
    pub stddev: f64,
    /// Operations over all iterations.
    pub ops: u64,
    /// Median operation latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// Largest latency, µs.
    pub max_us: f64,
}

impl PhaseReport {
    /// Builds a phase report from per-iteration rates and pooled latencies (ns).
    pub fn new(
        name: &str,
        unit: &str,
        rates: Vec<f64>,
        ops: u64,
        lat: &mut crate::stats::Latencies,
    ) -> PhaseReport {
        let (max, min, mean, stddev) = summary(&rates);
        PhaseReport {
            name: name.to_string(),
            unit: unit.to_string(),
            rates,
            max,
            min,
            mean,
            stddev,
            ops,
            p50_us: lat.quantile(0.5) as f64 / 1e3,
            p99_us: lat.quantile(0.99) as f64 / 1e3,
            max_us: lat.max() as f64 / 1e3,
        }
    }
}

/// Where and how a benchmark ran.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Env {
    /// lode commit the binary was built from.
    pub lode_commit: String,
    /// CPUs online.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// What was measured.
    pub target: String,
    /// When (seconds since the epoch).
    pub unix_time: u64,
}

impl Env {
    /// The environment of this run.
    pub fn here(target: String) -> Env {
        Env {
            lode_commit: env!("LODE_COMMIT").to_string(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            target,
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// A whole benchmark run, as written by `--json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// `md`, `walk` or `io`.
    pub kind: String,
    /// Environment.
    pub env: Env,
    /// The options, as given.
    pub options: serde_json::Value,
    /// Results per phase.
    pub phases: Vec<PhaseReport>,
}

impl Report {
    /// The mdtest-like summary tables.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let iters = self.phases.first().map_or(0, |p| p.rates.len());
        let _ = writeln!(
            s,
            "SUMMARY rate: (of {iters} iterations; {})",
            self.env.target
        );
        let _ = writeln!(
            s,
            "   {:<24} {:>14} {:>14} {:>14} {:>14}  unit",
            "Operation", "Max", "Min", "Mean", "Std Dev"
        );
        let _ = writeln!(
            s,
            "   {:<24} {:>14} {:>14} {:>14} {:>14}",
            "---------", "---", "---", "----", "-------"
        );
        for p in &self.phases {
            let _ = writeln!(
                s,
                "   {:<24}: {:>13.3} {:>14.3} {:>14.3} {:>14.3}  {}",
                p.name, p.max, p.min, p.mean, p.stddev, p.unit
            );
        }
        let _ = writeln!(s, "\nSUMMARY latency: (per operation, all iterations)");
        let _ = writeln!(
            s,
            "   {:<24} {:>12} {:>12} {:>12}",
            "Operation", "p50 us", "p99 us", "max us"
        );
        for p in &self.phases {
            let _ = writeln!(
                s,
                "   {:<24}: {:>11.1} {:>12.1} {:>12.1}",
                p.name, p.p50_us, p.p99_us, p.max_us
            );
        }
        s
    }

    /// Writes the JSON file.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let s = serde_json::to_string_pretty(self)?;
        std::fs::write(path, s).with_context(|| format!("{}", path.display()))
    }

    /// Reads a JSON file.
    pub fn read_json(path: &Path) -> Result<Report> {
        let s = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        serde_json::from_str(&s)
            .map_err(|e| anyhow!("{}: not a lode bench result: {e}", path.display()))
    }
}

/// Phase-by-phase ratios of each report's mean to the first one's.
pub fn compare(reports: &[(String, Report)]) -> Result<String> {
    let Some((base_name, base)) = reports.first() else {
        bail!("compare: give at least two result files")
    };
    if reports.len() < 2 {
        bail!("compare: give at least two result files");
    }
    let mut s = String::new();
    let _ = write!(s, "{:<24} {:>14}", "Operation", short(base_name));
    for (n, _) in &reports[1..] {
        let _ = write!(s, " {:>14} {:>8}", short(n), "ratio");
    }
    s.push('\n');
    for p in &base.phases {
        let _ = write!(s, "{:<24} {:>14.1}", p.name, p.mean);
        for (_, r) in &reports[1..] {
            match r.phases.iter().find(|q| q.name == p.name) {
                Some(q) => {
                    let ratio = if p.mean > 0.0 { q.mean / p.mean } else { 0.0 };
                    let _ = write!(s, " {:>14.1} {:>7.2}x", q.mean, ratio);
                }
                None => {
                    let _ = write!(s, " {:>14} {:>8}", "-", "-");
                }
            }
        }
        s.push('\n');
    }
    Ok(s)
}

fn short(p: &str) -> String {
    let n = Path::new(p)
        .file_stem()
        .map_or(p.to_string(), |s| s.to_string_lossy().into_owned());
    n.chars().take(14).collect()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Client count of an md report (1 for others).
fn clients(r: &Report) -> u64 {
    r.options
        .get("clients")
        .and_then(|c| c.as_u64())
        .unwrap_or(1)
}

/// An SVG chart: with several runs at different client counts, ops/s against clients
/// (one line per phase); otherwise phases on the x axis, one bar per report.
pub fn plot(reports: &[(String, Report)], path: &Path) -> Result<()> {
    let mut counts: Vec<u64> = reports.iter().map(|(_, r)| clients(r)).collect();
    counts.sort_unstable();
    counts.dedup();
    if reports.len() > 1 && counts.len() == reports.len() {
        return plot_scaling(reports, path);
    }
    let first = &reports
        .first()
        .ok_or_else(|| anyhow!("plot: nothing to plot"))?
        .1;
    let phases: Vec<&str> = first.phases.iter().map(|p| p.name.as_str()).collect();
    let max = reports
        .iter()
        .flat_map(|(_, r)| r.phases.iter().map(|p| p.mean))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let (w, h, left, bottom, top) = (120 + phases.len() * 110, 420, 80.0, 120.0, 30.0);
    let plot_h = h as f64 - bottom - top;
    let colors = [
        "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
    ];
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="18" font-size="13">{} (mean {})</text>"#,
        esc(&first.kind),
        esc(&first
            .phases
            .first()
            .map_or(String::new(), |p| p.unit.clone()))
    );
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        let y = top + plot_h - plot_h * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            w as f64 - 20.0,
            left - 4.0,
            y + 4.0
        );
    }
    let group = 110.0;
    let bar = (group - 20.0) / reports.len() as f64;
    for (pi, name) in phases.iter().enumerate() {
        let gx = left + 10.0 + pi as f64 * group;
        for (ri, (_, r)) in reports.iter().enumerate() {
            let v = r
                .phases
                .iter()
                .find(|p| p.name == *name)
                .map_or(0.0, |p| p.mean);
            let bh = plot_h * v / max;
            let x = gx + ri as f64 * bar;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{v:.1}</title></rect>"#,
                top + plot_h - bh,
                bar - 2.0,
                colors[ri % colors.len()]
            );
        }
        // Horizontal labels on two lines: renderers disagree on rotated text.
        let lx = gx + (group - 20.0) / 2.0;
        let (l1, l2) = name.split_once(' ').unwrap_or((name, ""));
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text><text x="{lx:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
            top + plot_h + 14.0,
            esc(l1),
            top + plot_h + 26.0,
            esc(l2)
        );
    }
    for (ri, (n, _)) in reports.iter().enumerate() {
        let y = h as f64 - 12.0 - (reports.len() - 1 - ri) as f64 * 14.0;
        let _ = writeln!(
            s,
            r#"<rect x="{left}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            y - 9.0,
            colors[ri % colors.len()],
            left + 14.0,
            y,
            esc(n)
        );
    }
    s.push_str("</svg>\n");
    std::fs::write(path, s).with_context(|| format!("{}", path.display()))
}

fn plot_scaling(reports: &[(String, Report)], path: &Path) -> Result<()> {
    let mut runs: Vec<&Report> = reports.iter().map(|(_, r)| r).collect();
    runs.sort_by_key(|r| clients(r));
    let phases: Vec<String> = runs[0].phases.iter().map(|p| p.name.clone()).collect();
    let max = runs
        .iter()
        .flat_map(|r| r.phases.iter().map(|p| p.mean))
        .fold(1.0f64, f64::max);
    let max_c = clients(runs[runs.len() - 1]).max(1) as f64;
    let (w, h, left, bottom, top, right) = (640.0, 420.0, 80.0, 50.0, 30.0, 170.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let x = |c: u64| left + pw * (c as f64 - 1.0).max(0.0) / (max_c - 1.0).max(1.0);
    let y = |v: f64| top + ph - ph * v / max;
    let colors = [
        "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
        "#9c755f",
    ];
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{left}" y="18" font-size="13">ops/s against clients</text>"#
    );
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            left + pw,
            y(v),
            y(v),
            left - 4.0,
            y(v) + 4.0
        );
    }
    for r in &runs {
        let c = clients(r);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{c}</text>"#,
            x(c),
            top + ph + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">clients</text>"#,
        left + pw / 2.0,
        h - 10.0
    );
    for (pi, name) in phases.iter().enumerate() {
        let color = colors[pi % colors.len()];
        let pts: Vec<String> = runs
            .iter()
            .filter_map(|r| {
                r.phases
                    .iter()
                    .find(|p| &p.name == name)
                    .map(|p| format!("{:.1},{:.1}", x(clients(r)), y(p.mean)))
            })
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = top + 14.0 * pi as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + pw + 10.0,
            ly,
            left + pw + 24.0,
            ly + 9.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    std::fs::write(path, s).with_context(|| format!("{}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rep(mean: f64) -> Report {
        let mut lat = crate::stats::Latencies(vec![1000, 2000, 3000]);
        Report {
            kind: "md".into(),
            env: Env::here("x".into()),
            options: serde_json::json!({}),
            phases: vec![PhaseReport::new(
                "File creation",
                "ops/s",
                vec![mean, mean],
                10,
                &mut lat,
            )],
        }
    }

    #[test]
    fn compare_prints_ratios_and_json_round_trips() {
        let a = rep(100.0);
        let b = rep(250.0);
        let c = compare(&[("a.json".into(), a.clone()), ("b.json".into(), b)]).unwrap();
        assert!(c.contains("2.50x"), "{c}");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("r.json");
        a.write_json(&d).unwrap();
        assert_eq!(Report::read_json(&d).unwrap(), a);
        let svg = dir.path().join("p.svg");
        plot(&[("a".into(), a.clone())], &svg).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains("<rect"));
        let mut two = a.clone();
        two.options = serde_json::json!({"clients": 2});
        plot(&[("a".into(), a), ("b".into(), two)], &svg).unwrap();
        assert!(std::fs::read_to_string(&svg)
            .unwrap()
            .contains("ops/s against clients"));
    }
}
