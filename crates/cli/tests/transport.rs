//! Transports: a client on the servers' host connects through their local (Unix)
//! sockets, Lustre's `0@lo`, and falls back to TCP when a server has none; a server
//! restarted with or without one is reached again either way. Each connection is
//! checked from the client's `import` parameter and used for real work through a
//! mount and a native client.

mod common;

use common::*;
use std::io::{Read, Write};

/// The mount's `current_connection` for every device (MDC, OSCs) that has connected.
fn connections(c: &lode_testkit::Cluster) -> Vec<String> {
    lode_ok(c, &["get-param", "-n", "mdc.*.import", "osc.*.import"])
        .lines()
        .filter_map(|l| l.trim().strip_prefix("current_connection: "))
        .map(str::to_string)
        .collect()
}

/// Creates, writes, reads back, stats and removes a striped file through the mount.
fn work(dir: &std::path::Path, tag: &str) {
    let p = dir.join(format!("f-{tag}"));
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut f = std::fs::File::create(&p).expect("create");
    f.write_all(&data).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    let mut back = Vec::new();
    std::fs::File::open(&p)
        .expect("open")
        .read_to_end(&mut back)
        .expect("read");
    assert!(back == data, "{tag}: data read back differs");
    assert_eq!(
        std::fs::metadata(&p).expect("stat").len(),
        data.len() as u64
    );
    std::fs::remove_file(&p).expect("unlink");
}

#[test]
fn clients_on_the_servers_host_use_local_sockets_and_fall_back_to_tcp() {
    let mut c = cluster(2);
    let m = c.mount();
    lode_ok(&c, &["setstripe", "-c", "2", "-S", "1M", &arg(m.path())]);
    work(m.path(), "local");
    let conns = connections(&c);
    assert_eq!(conns.len(), 3, "MDC and two OSCs connected: {conns:?}");
    assert!(conns.iter().all(|n| n == "0@lo"), "{conns:?}");

    // The MDS restarted without a local socket: the mount reconnects over TCP, and
    // the OSTs keep theirs.
    c.kill9("mdt0");
    c.set_server_env("mdt0", "LODE_LOCAL_TRANSPORT", "off");
    c.start_target("mdt0");
    wait_recovered(&c);
    work(m.path(), "tcp");
    let conns = connections(&c);
    assert_eq!(conns[0], "127.0.0.1@tcp", "{conns:?}");
    assert!(conns[1..].iter().all(|n| n == "0@lo"), "{conns:?}");

    // A native client in this process finds the same.
    let s = c.client();
    let f = s.run(
        s.client
            .create(&root(), lode_base::Fid::ROOT, b"native", 0o644, None),
    );
    assert!(f.is_ok(), "native create over TCP: {f:?}");
    let mdc = s.client.mdc().import_info();
    assert!(mdc.contains("current_connection: 127.0.0.1@tcp"), "{mdc}");

    // Back with a local socket: the next connection uses it again.
    c.kill9("mdt0");
    c.set_server_env("mdt0", "LODE_LOCAL_TRANSPORT", "on");
    c.start_target("mdt0");
    wait_recovered(&c);
    work(m.path(), "local-again");
    assert_eq!(connections(&c)[0], "0@lo");
    m.unmount();
}
