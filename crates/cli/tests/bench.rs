//! `lode bench` against a real mount, the native client and a local directory.

mod common;

use common::*;
use lode_bench::report::Report;
use std::path::Path;
use std::process::Command;

fn lode() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lode"))
}

fn run_md(target: &[&str], dir: &Path, extra: &[&str]) -> (Report, String) {
    let json = dir.join(format!("r{}.json", rand::random::<u32>()));
    let out = lode()
        .args([
            "bench",
            "md",
            "--items",
            "200",
            "--iterations",
            "2",
            "--json",
        ])
        .arg(&json)
        .args(target)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (Report::read_json(&json).expect("the JSON parses"), stdout)
}

fn check(r: &Report, table: &str, creates: u64) {
    assert_eq!(r.phases.len(), 10, "every mdtest phase, and setattr");
    for p in &r.phases {
        assert!(
            p.mean > 0.0 && p.min > 0.0,
            "{} has a positive rate",
            p.name
        );
        assert_eq!(p.rates.len(), 2);
        // The table shows the JSON's figures.
        let line = table
            .lines()
            .find(|l| l.trim_start().starts_with(&p.name))
            .expect("phase in table");
        assert!(
            line.contains(&format!("{:.3}", p.mean)),
            "{line} shows mean {}",
            p.mean
        );
    }
    let c = r
        .phases
        .iter()
        .find(|p| p.name == "File creation")
        .unwrap()
        .ops;
    assert_eq!(c, creates, "items x clients x iterations");
}

fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .all(|e| !e.file_name().to_string_lossy().starts_with("lode-bench"))
}

#[test]
fn md_on_a_local_directory_a_mount_and_native() {
    let t = tempfile::tempdir().unwrap();
    let local = t.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let (r, table) = run_md(
        &["--path", local.to_str().unwrap()],
        t.path(),
        &["--threads", "2", "--depth", "1", "--branch", "2"],
    );
    check(&r, &table, 400);
    assert!(empty(&local), "the benchmark removed its tree");

    let c = cluster(2);
    let m = c.mount();
    let (r, table) = run_md(
        &["--path", m.path().to_str().unwrap()],
        t.path(),
        &["--clients", "2", "--unique-dir"],
    );
    check(&r, &table, 800);
    assert!(empty(m.path()));

    let native = format!("{}:/{}", c.mgs_addr, c.fsname);
    let (r, table) = run_md(
        &["--native", &native],
        t.path(),
        &["--write-bytes", "3901", "--read-bytes", "3901"],
    );
    check(&r, &table, 400);
    assert!(r.env.target.starts_with("native"));
    assert!(empty(m.path()), "native run cleaned up too");

    let a = t.path().join("a.json");
    r.write_json(&a).unwrap();
    let out = lode()
        .args(["bench", "compare"])
        .arg(&a)
        .arg(&a)
        .args(["--plot"])
        .arg(t.path().join("c.svg"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("1.00x"));
    assert!(std::fs::read_to_string(t.path().join("c.svg"))
        .unwrap()
        .starts_with("<svg"));
}

#[test]
fn walk_and_io_report_positive_rates_and_clean_up() {
    let c = cluster(2);
    let m = c.mount();
    let t = tempfile::tempdir().unwrap();
    // Runs `lode bench CMD` on the mount: it succeeds, every rate is positive, and
    // nothing is left behind.
    let run = |cmd: &str, args: &[&str]| {
        let json = t.path().join(format!("{cmd}.json"));
        let out = lode()
            .args(["bench", cmd, "--path"])
            .arg(m.path())
            .args(args)
            .arg("--json")
            .arg(&json)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = Report::read_json(&json).unwrap();
        assert!(
            r.phases.iter().all(|p| p.mean > 0.0),
            "{cmd}: {:?}",
            r.phases
        );
        assert!(empty(m.path()), "{cmd} cleaned up");
        r
    };
    for (cmd, args) in [
        (
            "walk",
            vec!["--dirs", "3", "--files", "50", "--walkers", "2"],
        ),
        (
            "io",
            vec!["--clients", "2", "--block", "2M", "--transfer", "256k"],
        ),
        (
            "io",
            vec![
                "--clients",
                "2",
                "--block",
                "1M",
                "--transfer",
                "64k",
                "--shared",
                "--fsync",
            ],
        ),
    ] {
        run(cmd, &args);
    }
    // One phase alone, to time or profile it.
    let r = run(
        "walk",
        &["--dirs", "2", "--files", "20", "--phases", "stat,find"],
    );
    let names: Vec<&str> = r.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["find -name", "stat walk"], "in run order");
}

#[test]
fn bad_bench_input_fails_before_any_work() {
    let t = tempfile::tempdir().unwrap();
    for (args, words) in [
        (vec!["md", "--path", "/nonexistent/dir"], "No such file"),
        (vec!["md", "--path", ".", "--items", "0"], "at least 1"),
        (vec!["md", "--path", ".", "--clients", "0"], "at least 1"),
        (vec!["md", "--native", "127.0.0.1:1:/nofs"], "no answer"),
        (vec!["md"], "--path DIR or --native"),
        (
            vec!["walk", "--path", ".", "--phases", "ls,x"],
            "no phase \"x\"",
        ),
    ] {
        let out = lode()
            .arg("bench")
            .args(&args)
            .current_dir(t.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(words), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    assert!(empty(t.path()), "nothing was created");
}

#[test]
fn a_phase_that_fails_midway_says_which_and_cleans_up() {
    // A tmpfs with room for 60 inodes: directory creation runs out of them midway.
    let t = tempfile::tempdir().unwrap();
    let small = t.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "nr_inodes=60,size=1m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(ok.success(), "mount tmpfs (tests run as root)");
    let out = lode()
        .args(["bench", "md", "--path"])
        .arg(&small)
        .args(["--items", "200"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let left = empty(&small);
    let _ = Command::new("umount").arg(&small).status();
    assert!(!out.status.success());
    assert!(
        err.contains("phase \"Directory creation\" failed after"),
        "{err}"
    );
    assert!(err.contains("No space left on device"), "{err}");
    assert!(left, "what was made is removed after the failure");
}
