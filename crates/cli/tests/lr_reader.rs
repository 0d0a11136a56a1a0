//! `lode lr-reader`: an MDT's server data, clients and reply records in Lustre's
//! `lr_reader` layout, read-only beside a running MDS and on a stopped one.

mod common;

use common::*;
use lode_base::{Errno, Fid};

/// The output with every number made `N`, so the layout can be pinned.
fn shape(s: &str) -> String {
    let mut out = String::new();
    let mut in_num = false;
    for ch in s.chars() {
        if ch.is_ascii_digit() || (ch == '-' && !in_num && out.ends_with(": ")) {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(ch);
        }
    }
    out
}

/// `lode lr-reader ARGS DIR`'s output; it must succeed.
fn lr_reader(c: &lode_testkit::Cluster, dir: &std::path::Path, args: &[&str]) -> String {
    let out = c
        .lode()
        .arg("lr-reader")
        .args(args)
        .arg(dir)
        .output()
        .expect("run lr-reader");
    assert!(
        out.status.success(),
        "lr-reader {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn lr_reader_prints_server_data_clients_and_reply_records_like_lustre() {
    let mut c = cluster(1);
    let s = c.client();
    let r = root();
    for name in ["a", "b", "c"] {
        s.run(s.client.create(&r, Fid::ROOT, name.as_bytes(), 0o644, None))
            .expect("create");
    }
    // A failing modification leaves a record too, with its errno.
    assert_eq!(
        s.run(s.client.mkdir(&r, Fid::ROOT, b"a", 0o755, None))
            .expect_err("a exists"),
        Errno::EEXIST
    );
    s.run(s.client.sync()).expect("sync");
    let dir = c.target_dir("mdt0");
    let uuid = s.client.uuid().to_string();

    // Without -c and -r: the server data only.
    let plain = lr_reader(&c, &dir, &[]);
    let lines: Vec<&str> = plain.lines().collect();
    assert_eq!(lines.len(), 4, "{plain}");
    assert_eq!(lines[0], "last_rcvd:");
    assert!(lines[1].starts_with("  uuid: "), "{plain}");
    assert_eq!(shape(lines[2]), "  last_transaction: N");
    assert_eq!(lines[3], "  target_index: 0");
    let last: u64 = lines[2]["  last_transaction: ".len()..]
        .parse()
        .expect("a number");
    assert!(last >= 3, "three creates committed: {plain}");

    // Live, with clients and replies.
    let full = lr_reader(&c, &dir, &["-c", "-r"]);
    let block = full
        .split("\n\n")
        .find(|b| b.contains(&uuid))
        .unwrap_or_else(|| panic!("our client is listed:\n{full}"));
    assert_eq!(
        shape(block),
        format!(
            "  {}:\n    generation: N\n    last_transaction: N\n    last_xid: N\n    last_result: N\n    last_data: N",
            shape(&uuid)
        ),
        "{full}"
    );
    let replies = full
        .split_once("reply_data:\n")
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("a reply_data section:\n{full}"));
    let records: Vec<&str> = replies.split("\n\n").collect();
    // Sequential calls reuse tag 1: one record per (client, tag), the newest kept.
    assert!(!records.is_empty(), "{full}");
    for rec in &records {
        assert_eq!(
            shape(rec.trim_end()),
            "  N:\n    client_generation: N\n    tag: N\n    last_transaction: N\n    last_xid: N\n    last_result: N\n    last_data: N",
            "{full}"
        );
    }
    assert!(
        records
            .iter()
            .any(|r| r.contains(&format!("last_result: {}", Errno::EEXIST.status()))),
        "the failed mkdir's record keeps its errno:\n{full}"
    );

    // The same on a stopped MDT.
    c.kill9("mdt0");
    let stopped = lr_reader(&c, &dir, &["-c", "-r"]);
    assert!(stopped.starts_with("last_rcvd:\n"), "{stopped}");
    assert!(stopped.contains(&uuid), "{stopped}");
}
