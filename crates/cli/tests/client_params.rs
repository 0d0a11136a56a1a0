//! A client's tunables and statistics, as a Lustre admin reads and sets them: the MDC's
//! `max_rpcs_in_flight`, `max_mod_rpcs_in_flight` and `rpc_stats`, the OSCs'
//! `max_rpcs_in_flight` and `rpc_stats`, through the mount's admin socket with
//! `lode get-param/set-param`, and through the library for a native client.

mod common;

use common::*;
use lode_base::Fid;
use lode_client::Session;
use std::process::Output;
use std::sync::Arc;

/// Eight threads creating files at once on one client.
fn eight_threads_create(s: &Arc<Session>, dir: Fid, tag: &str) -> u64 {
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            let tag = tag.to_string();
            std::thread::spawn(move || {
                for i in 0..60 {
                    let name = format!("{tag}-{t}-{i}");
                    s.run(s.client.create(&root(), dir, name.as_bytes(), 0o644, None))
                        .unwrap_or_else(|e| panic!("create {name}: {e}"));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    8 * 60
}

#[test]
fn rpc_stats_shows_up_to_seven_modify_rpcs_in_flight_then_exactly_one() {
    let c = cluster(1);
    let s = Arc::new(c.client());
    let dir = s.run(mkdir_p(&s.client, "/inflight"));
    let mdc = s.client.mdc().clone();
    assert_eq!(mdc.max_mod_rpcs_in_flight(), 7, "Lustre's default");

    mdc.clear_rpc_stats();
    eight_threads_create(&s, dir, "seven");
    let (most, _) = mdc.mod_rpcs_seen(0);
    assert!(
        most <= 7,
        "never more than 7 modify RPCs in flight, saw {most}"
    );
    assert!(
        most > 1,
        "8 threads overlap their creates: saw only {most} in flight"
    );

    mdc.set_max_mod_rpcs_in_flight(1).expect("1 is allowed");
    mdc.clear_rpc_stats();
    let n = eight_threads_create(&s, dir, "one");
    let (most, at_one) = mdc.mod_rpcs_seen(1);
    assert_eq!(most, 1, "exactly one modify RPC in flight at max 1");
    assert_eq!(at_one, n, "every create counted, each alone in flight");
    let text = mdc.rpc_stats();
    assert!(
        text.contains(&format!("1:\t\t{n:10} 100 100\n")),
        "the table says so too:\n{text}"
    );
}

/// The rows of one table of an OSC's `rpc_stats` (`title` is its first column's name).
fn section<'a>(stats: &'a str, title: &str) -> Vec<&'a str> {
    stats
        .lines()
        .skip_while(|l| !l.starts_with(&format!("{title} ")))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

fn lode(c: &lode_testkit::Cluster, args: &[&str]) -> Output {
    c.lode().args(args).output().expect("run lode")
}

fn value(c: &lode_testkit::Cluster, name: &str) -> String {
    let out = lode(c, &["get-param", "-n", name]);
    assert!(out.status.success(), "get-param {name}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn mount_tunables_follow_lustres_rules_through_get_param_and_set_param() {
    let c = cluster(2);
    let m = c.mount();
    std::fs::write(m.path().join("warm"), b"x").expect("write through the mount");
    assert_eq!(value(&c, "mdc.*.max_rpcs_in_flight"), "8");
    assert_eq!(value(&c, "mdc.*.max_mod_rpcs_in_flight"), "7");
    let osc = value(&c, "osc.*.max_rpcs_in_flight");
    assert_eq!(osc.lines().count(), 2, "one OSC per OST: {osc:?}");
    // The import file: connected to the MDT, at its address.
    let imp = value(&c, "mdc.*.import");
    for want in [
        "state: FULL".to_string(),
        "current_connection: 127.0.0.1@tcp".to_string(),
        format!("address: {}", c.addr("mdt0")),
    ] {
        assert!(imp.contains(&want), "{want} in {imp}");
    }

    // Refused, with Lustre's errno and a reason; the old value stays.
    for (bad, why) in [
        (
            "mdc.*.max_mod_rpcs_in_flight=8",
            "must be less than max_rpcs_in_flight",
        ),
        ("mdc.*.max_mod_rpcs_in_flight=0", "must be 1.."),
        ("mdc.*.max_rpcs_in_flight=1", "must be 2..512"),
        ("osc.*.max_rpcs_in_flight=513", "must be 1..512"),
    ] {
        let out = lode(&c, &["set-param", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} must be refused");
        assert!(
            err.contains("Numerical result out of range") && err.contains(why),
            "{bad}: {err}"
        );
    }
    assert_eq!(value(&c, "mdc.*.max_mod_rpcs_in_flight"), "7");
    assert_eq!(value(&c, "mdc.*.max_rpcs_in_flight"), "8");

    // Lowering max_rpcs_in_flight to max_mod or below lowers max_mod to one less.
    c.set_param("mdc.*.max_rpcs_in_flight=4");
    assert_eq!(value(&c, "mdc.*.max_mod_rpcs_in_flight"), "3");
    c.set_param("mdc.*.max_mod_rpcs_in_flight=2");
    assert_eq!(value(&c, "mdc.*.max_mod_rpcs_in_flight"), "2");
    c.set_param("osc.*.max_rpcs_in_flight=3");
    assert_eq!(value(&c, "osc.*.max_rpcs_in_flight"), "3\n3");

    // rpc_stats in Lustre's layout; writing clears it.
    c.set_param("mdc.*.rpc_stats=clear");
    for i in 0..20 {
        std::fs::write(m.path().join(format!("f{i}")), b"data").expect("write");
    }
    // The kernel does not wait for a close (FUSE RELEASE) before `write`
    // returns, so the last file's close may still be on the wire: wait for it.
    lode_testkit::wait_for(
        "the last close to be answered",
        std::time::Duration::from_secs(10),
        || value(&c, "mdc.*.rpc_stats").contains("modify_RPCs_in_flight:  0\n"),
    );
    let stats = value(&c, "mdc.*.rpc_stats");
    let lines: Vec<&str> = stats.lines().collect();
    assert!(
        lines[0].starts_with("snapshot_time:            "),
        "{stats}"
    );
    assert!(lines[0].ends_with(" secs.nsecs"), "{stats}");
    assert!(
        lines[1].starts_with("start_time:               "),
        "{stats}"
    );
    assert!(
        lines[2].starts_with("elapsed_time:             "),
        "{stats}"
    );
    assert_eq!(lines[3], "modify_RPCs_in_flight:  0");
    assert_eq!(lines[4], "");
    assert_eq!(lines[5], "\t\t\tmodify");
    assert_eq!(lines[6], "rpcs in flight        rpcs   % cum %");
    assert_eq!(lines[7], "0:\t\t         0   0   0");
    assert!(lines[8].starts_with("1:\t\t"), "{stats}");
    assert!(lines.last().is_some_and(|l| l.ends_with(" 100")), "{stats}");
    assert!(
        lines.len() <= 8 + 3,
        "at most 3 in flight (2 + one close): {stats}"
    );
    let osc = value(&c, "osc.*.rpc_stats");
    assert!(
        osc.contains("read RPCs in flight:  0\nwrite RPCs in flight: 0\n"),
        "{osc}"
    );
    assert!(
        osc.contains(
            "\t\t\tread\t\t\twrite\nrpcs in flight        rpcs   % cum % |       rpcs   % cum %\n"
        ),
        "{osc}"
    );
    // Lustre's three OSC tables: the 4-byte writes are one page each, at offset 0.
    let pages = section(&osc, "pages per rpc");
    assert!(
        pages.first().is_some_and(
            |l| l.starts_with("1:\t\t         0   0   0   |") && l.ends_with(" 100 100")
        ),
        "every write one page: {osc}"
    );
    let offset = section(&osc, "offset");
    assert!(
        offset
            .first()
            .is_some_and(|l| l.starts_with("0:\t\t") && l.ends_with(" 100 100")),
        "every write at offset 0: {osc}"
    );
    assert!(!section(&osc, "rpcs in flight").is_empty(), "{osc}");
    // md_stats: the metadata operations asked, by Lustre's md method names.
    let md = value(&c, "mdc.*.md_stats");
    assert!(md.starts_with("snapshot_time"), "{md}");
    assert!(
        md.lines()
            .any(|l| l.starts_with("close ") && l.ends_with(" samples [reqs]")),
        "closes counted: {md}"
    );
    // list-param -v says what each parameter is and what it takes.
    let out = lode(&c, &["list-param", "-v", "mdc.*.max_mod_rpcs_in_flight"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && help.contains(".max_mod_rpcs_in_flight (rw, 1..512) "),
        "{help}"
    );
    let out = lode(&c, &["list-param", "mdc.*.md_stats"]);
    assert!(String::from_utf8_lossy(&out.stdout)
        .trim_end()
        .ends_with(".md_stats"));
    // An emulated network: every request held this long before it is sent.
    c.set_param("mdc.*.net_delay_us=300");
    c.set_param("osc.*.net_delay_us=300");
    assert_eq!(value(&c, "mdc.*.net_delay_us"), "300");
    std::fs::write(m.path().join("slow"), b"data").expect("write with a delay");
    let out = lode(&c, &["set-param", "mdc.*.net_delay_us=20000000"]);
    assert!(!out.status.success(), "more than 10 s of delay is refused");
    assert_eq!(value(&c, "mdc.*.net_delay_us"), "300");
    c.set_param("mdc.*.net_delay_us=0");
    let st = value(&c, "mdc.*.stats");
    assert!(st.starts_with("snapshot_time"), "{st}");
    assert!(
        st.lines()
            .any(|l| l.starts_with("mds_reint_create") && l.contains(" samples [usecs] ")),
        "creates counted with their times: {st}"
    );
    c.set_param("mdc.*.stats=clear");
    assert!(!value(&c, "mdc.*.stats").contains("mds_reint_create"));
    c.set_param("mdc.*.rpc_stats=0");
    let cleared = value(&c, "mdc.*.rpc_stats");
    assert!(cleared.ends_with("0:\t\t         0   0   0"), "{cleared}");
    drop(m);
}

#[test]
fn max_mod_rpcs_in_flight_is_capped_by_what_the_mdt_granted() {
    let c = cluster(1);
    c.set_param("mdt.*.max_mod_rpcs_in_flight=2");
    // Applies to new connections: this client connects after it.
    let s = c.client();
    assert_eq!(s.client.mdc().max_mod_rpcs_in_flight(), 2, "granted 2");
    let (errno, msg) = s
        .client
        .mdc()
        .set_max_mod_rpcs_in_flight(3)
        .expect_err("above the grant");
    assert_eq!(errno, lode_base::Errno::ERANGE);
    assert!(
        msg.contains(
            "higher than mdt.*.max_mod_rpcs_in_flight=2 returned by the MDT server at connection"
        ),
        "{msg}"
    );
    assert_eq!(s.client.mdc().max_mod_rpcs_in_flight(), 2);
    s.client
        .mdc()
        .set_max_mod_rpcs_in_flight(1)
        .expect("below the grant");
    let dir = s.run(mkdir_p(&s.client, "/capped"));
    s.run(s.client.create(&root(), dir, b"f", 0o644, None))
        .expect("create with one tag");
}

#[test]
fn set_param_p_is_kept_by_the_mgs_and_applied_by_every_process_at_start() {
    let mut c = cluster(1);
    let out = lode(
        &c,
        &[
            "set-param",
            "-P",
            "mdc.*.max_mod_rpcs_in_flight=3",
            "mdt.*.commit_interval_ms=250",
        ],
    );
    assert!(
        out.status.success(),
        "set-param -P: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Applied at once where it runs (the MDT), stored on the MGS.
    assert_eq!(value(&c, "mdt.*.commit_interval_ms"), "250");
    let stored = value(&c, "mgs.MGS.params");
    assert_eq!(
        stored,
        "mdc.*.max_mod_rpcs_in_flight=3\nmdt.*.commit_interval_ms=250"
    );
    // A client connecting now applies what names its devices.
    let s = c.client();
    assert_eq!(s.client.mdc().max_mod_rpcs_in_flight(), 3);
    drop(s);
    // A restarted MGS still has them; a restarted MDT applies its own.
    c.kill9("mgs");
    c.start_target("mgs");
    lode_testkit::wait_for(
        "the restarted MGS to list its parameters",
        std::time::Duration::from_secs(20),
        || c.get_param("mgs.MGS.params").lines().count() == 2,
    );
    c.kill9("mdt0");
    c.start_target("mdt0");
    lode_testkit::wait_for(
        "the restarted MDT to apply commit_interval_ms",
        std::time::Duration::from_secs(20),
        || c.get_param("mdt.*.commit_interval_ms") == "250",
    );
    // A bad name or value is refused by the MGS with a reason.
    let out = lode(&c, &["set-param", "-P", "bad name=1"]);
    assert!(!out.status.success());
}
