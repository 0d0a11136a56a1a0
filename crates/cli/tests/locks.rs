//! Metadata locks between real processes: a client holding a lock is called back over
//! its own callback channel before another client changes what the lock covers; a
//! client that does not give the lock back is evicted after `ldlm_timeout` and the
//! change goes ahead; a client that cannot be called back gets no lock.

mod common;

use common::*;
use lode_base::{Errno, SetAttr};
use lode_client::Session;
use lode_proto::{LdlmCancelReq, LdlmEnqueueReq, Reply, Request};
use lode_testkit::wait_for;
use std::time::{Duration, Instant};

/// Lustre's PR mode and the UPDATE|PERM bits (what a cached getattr needs).
const PR: u32 = 4;
const UPDATE_PERM: u8 = 0x02 | 0x10;

fn chmod(s: &Session, fid: lode_base::Fid, mode: u32) -> lode_client::MdtBody {
    let sa = SetAttr {
        mode: Some(mode),
        ..Default::default()
    };
    s.run(s.client.setattr(&root(), fid, sa)).expect("chmod")
}

fn create(s: &Session, name: &str) -> lode_base::Fid {
    create_in(s, lode_base::Fid::ROOT, name)
}

/// A file `name` (mode 0644) made by root in `dir`.
fn create_in(s: &Session, dir: lode_base::Fid, name: &str) -> lode_base::Fid {
    s.run(s.client.create(&root(), dir, name.as_bytes(), 0o644, None))
        .expect("create")
        .attr
        .fid
}

fn pr_lock(fid: lode_base::Fid) -> LdlmEnqueueReq {
    LdlmEnqueueReq {
        fid,
        hash: 0,
        mode: PR,
        bits: UPDATE_PERM,
    }
}

/// An enqueue by hand: the lock's handle, if granted.
fn raw_enqueue(peer: &mut RawPeer, handle: u64, req: LdlmEnqueueReq) -> Option<u64> {
    let rep = peer
        .call(&Request::LdlmEnqueue(req), handle)
        .expect("enqueue answered");
    match Reply::decode(rep.header.opcode, &rep.body) {
        Ok(Reply::LdlmEnqueue(r)) => r.handle,
        other => panic!("{other:?}"),
    }
}

/// Files made by a client that is then gone (so no cache holds locks on them).
fn made(c: &lode_testkit::Cluster, names: &[&str]) -> Vec<lode_base::Fid> {
    let maker = c.client();
    let fids = names.iter().map(|n| create(&maker, n)).collect();
    drop(maker);
    wait_for("the maker's locks to go", Duration::from_secs(10), || {
        c.get_param("ldlm.namespaces.*.lock_count") == "0"
    });
    fids
}

/// A hand-made client `uuid` with a callback channel (which it never answers): its
/// request connection, its channel's, and its export handle.
fn hand_made(c: &lode_testkit::Cluster, uuid: &str) -> (RawPeer, RawPeer, u64) {
    let mut peer = RawPeer::connect(&c.addr("mdt0"));
    let handle = peer
        .connect_as(&c.fsname, &format!("{}-MDT0000", c.fsname), uuid)
        .handle;
    let mut chan = RawPeer::connect(&c.addr("mdt0"));
    let rep = chan
        .call(&Request::LdlmCallbackChannel(Default::default()), handle)
        .expect("channel registered");
    assert_eq!(rep.header.status, 0);
    (peer, chan, handle)
}

#[test]
fn a_change_calls_back_the_lock_holder_first_and_counts_the_callback() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    channel_up(&a);
    let f = made(&c, &["f"])[0];
    let h = a
        .run(a.client.lock_enqueue(f, 0, PR, UPDATE_PERM))
        .expect("enqueue")
        .expect("granted: nothing conflicts");
    assert_eq!(a.client.locks_held().len(), 1);
    assert_eq!(
        c.get_param("ldlm.namespaces.*.lock_count"),
        "1",
        "one client lock"
    );
    // B's chmod waits for A's cancel, then runs.
    let got = chmod(&b, f, 0o600);
    assert_eq!(got.attr.mode & 0o7777, 0o600);
    assert_eq!(a.client.lock_callbacks(), 1, "A was called back once");
    assert!(
        !a.client.locks_held().contains_key(&h),
        "A dropped the lock"
    );
    // Left on the MDT: only the lock B's chmod brought back (see
    // `a_setattr_brings_back_the_attributes_lock_and_stays_coherent`).
    wait_for(
        "only B's lock left on the MDT",
        Duration::from_secs(5),
        || c.get_param("ldlm.namespaces.*.lock_count") == b.client.locks_held().len().to_string(),
    );
    let stats = c.get_param("mdt.*.stats");
    assert!(
        stats.lines().any(|l| l.starts_with("ldlm_bl_callback ")),
        "callbacks counted: {stats}"
    );
    assert!(
        stats.lines().any(|l| l.starts_with("ldlm_cancel ")),
        "{stats}"
    );
    // Compatible locks do not call each other back: two readers.
    let h1 = a.run(a.client.lock_enqueue(f, 0, PR, UPDATE_PERM)).unwrap();
    let h2 = b.run(b.client.lock_enqueue(f, 0, PR, UPDATE_PERM)).unwrap();
    assert!(h1.is_some() && h2.is_some());
    assert_eq!(a.client.lock_callbacks() + b.client.lock_callbacks(), 1);
    // A change by the holder itself calls its own lock back too, and goes ahead; A
    // then holds only the lock its chmod brought back.
    assert_eq!(chmod(&a, f, 0o640).attr.mode & 0o7777, 0o640);
    assert!(b.client.locks_held().is_empty());
    let held = a.client.locks_held();
    assert!(
        held.len() <= 1 && !held.contains_key(&h1.unwrap_or(0)),
        "{held:?}"
    );
}

#[test]
fn a_client_that_keeps_a_called_back_lock_is_evicted_and_the_change_goes_ahead() {
    let c = cluster(1);
    c.set_param("mdt.*.ldlm_timeout=2");
    let b = c.client();
    let f = create(&b, "g");
    // A hand-made client: it registers a callback channel, takes a lock and then never
    // answers the callback.
    let (mut peer, mut chan, handle) = hand_made(&c, "stubborn-client");
    let granted = raw_enqueue(&mut peer, handle, pr_lock(f)).expect("granted");
    // A cancel of a lock it does not hold is ignored; the connection stays usable.
    let rep = peer
        .call(
            &Request::LdlmCancel(LdlmCancelReq {
                handles: vec![granted + 1000],
            }),
            handle,
        )
        .expect("cancel answered");
    assert_eq!(rep.header.status, 0);
    let t = Instant::now();
    assert_eq!(chmod(&b, f, 0o600).attr.mode & 0o7777, 0o600);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "the change waited for the lock's holder: {waited:?}"
    );
    // The stubborn client got the callback on its channel, then the eviction notice.
    let cb = chan
        .next_frame(Duration::from_secs(5))
        .expect("a blocking callback on the channel");
    assert_eq!(cb.header.opcode, lode_proto::Opcode::LdlmBlCallback as u16);
    assert!(
        c.log("mdt0").contains("evicting client"),
        "the eviction is logged"
    );
    // Evicted: its handle is gone.
    let rep = peer.try_ping(handle).expect("answered");
    assert_eq!(rep.header.status, Errno::ENOTCONN.status());
    // Its lock went with it: what is left is what B's cache holds.
    assert_eq!(
        c.get_param("ldlm.namespaces.*.lock_count"),
        b.client.locks_held().len().to_string()
    );
}

#[test]
fn a_client_without_a_callback_channel_gets_no_lock() {
    let c = cluster(1);
    let mut peer = RawPeer::connect(&c.addr("mdt0"));
    let handle = peer
        .connect_as(&c.fsname, &format!("{}-MDT0000", c.fsname), "no-channel")
        .handle;
    let enq = pr_lock(lode_base::Fid::ROOT);
    assert_eq!(raw_enqueue(&mut peer, handle, enq.clone()), None);
    // A malformed request (bad mode, no bits) is refused, the connection stays usable.
    for (mode, bits) in [(3, UPDATE_PERM), (PR, 0), (PR, 0x80)] {
        let bad = LdlmEnqueueReq {
            mode,
            bits,
            ..enq.clone()
        };
        let rep = peer
            .call(&Request::LdlmEnqueue(bad), handle)
            .expect("answered");
        assert_eq!(rep.header.status, Errno::EINVAL.status());
    }
    assert_eq!(peer.ping(handle).header.status, 0);
}

/// Lustre's name resource hash (0 is replaced by 1).
fn name_hash(name: &[u8]) -> u64 {
    match lode_base::hash::name_hash(name) {
        0 => 1,
        h => h,
    }
}

#[test]
fn every_kind_of_change_calls_back_exactly_the_locks_that_cover_it() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    channel_up(&a);
    let r = root();
    let (d, other) = (
        b.run(mkdir_p(&b.client, "/d")),
        b.run(mkdir_p(&b.client, "/other")),
    );
    let file = |name: &str| create_in(&b, d, name);
    file("y");
    let (z, x) = (file("z"), file("x"));
    // A lock A takes, then B's change; whether A must be called back.
    let lock = |fid, hash, bits| {
        a.run(a.client.lock_enqueue(fid, hash, PR, bits))
            .expect("enqueue")
            .expect("granted")
    };
    let update = 0x02;
    let lookup = 0x01;
    // (what, the lock A holds, whether B's change must call it back, the change)
    type Case<'a> = (
        &'static str,
        (lode_base::Fid, u64, u8),
        bool,
        Box<dyn Fn() + 'a>,
    );
    let cases: Vec<Case> = vec![
        (
            "create in a directory whose entries A caches",
            (d, 0, update),
            true,
            Box::new(|| {
                file("new");
            }),
        ),
        (
            "create in another directory",
            (other, 0, update),
            false,
            Box::new(|| {
                file("new2");
            }),
        ),
        (
            "unlink of a name A caches",
            (d, name_hash(b"y"), lookup),
            true,
            Box::new(|| b.run(b.client.unlink(&r, d, b"y")).expect("unlink")),
        ),
        (
            "unlink moves the removed file's nlink",
            (z, 0, update),
            true,
            Box::new(|| b.run(b.client.unlink(&r, d, b"z")).expect("unlink")),
        ),
        (
            "rename onto a name A caches",
            (d, name_hash(b"w"), lookup),
            true,
            Box::new(|| {
                b.run(b.client.rename(&r, d, b"x", d, b"w", 0))
                    .expect("rename")
            }),
        ),
        (
            "link moves the file's nlink",
            (x, 0, update),
            true,
            Box::new(|| {
                b.run(b.client.link(&r, x, d, b"x2")).expect("link");
            }),
        ),
        (
            "setxattr of a file A caches",
            (x, 0, 0x20),
            true,
            Box::new(|| {
                b.run(b.client.setxattr(&r, x, b"user.k", Some(b"v"), 0))
                    .expect("setxattr")
            }),
        ),
        (
            "a change of another name's lock leaves it alone",
            (d, name_hash(b"untouched"), lookup),
            false,
            Box::new(|| {
                file("elsewhere");
            }),
        ),
    ];
    for (what, (fid, hash, bits), called, change) in cases {
        let before = a.client.lock_callbacks();
        let h = lock(fid, hash, bits);
        change();
        let got = a.client.lock_callbacks() - before;
        assert_eq!(got, u64::from(called), "{what}: callbacks");
        assert_eq!(
            a.client.locks_held().contains_key(&h),
            !called,
            "{what}: lock held afterwards"
        );
        if !called {
            a.run(a.client.lock_cancel(vec![h])).expect("cancel");
        }
    }
}

#[test]
fn a_client_that_goes_away_leaves_no_lock_behind() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    channel_up(&a);
    let f = made(&c, &["gone"])[0];
    a.run(a.client.lock_enqueue(f, 0, PR, UPDATE_PERM))
        .expect("enqueue")
        .expect("granted");
    assert_eq!(c.get_param("ldlm.namespaces.*.lock_count"), "1");
    drop(a);
    // Its callback channel closed with it: the MDT dropped its locks, so nobody waits
    // for a callback to a client that is gone (or for its eviction).
    wait_for(
        "the lock of the client that went",
        Duration::from_secs(10),
        || c.get_param("ldlm.namespaces.*.lock_count") == "0",
    );
    assert_eq!(chmod(&b, f, 0o600).attr.mode & 0o7777, 0o600);
    assert!(!c.log("mdt0").contains("evicting client"));
}

#[test]
fn many_changes_of_one_file_at_once_queue_on_its_lock_and_all_complete() {
    let c = cluster(1);
    let (a, b) = (
        std::sync::Arc::new(c.client()),
        std::sync::Arc::new(c.client()),
    );
    let f = create(&a, "hot");
    let workers: Vec<_> = (0..8)
        .map(|t| {
            let s = if t % 2 == 0 { a.clone() } else { b.clone() };
            std::thread::spawn(move || {
                for i in 0..50u32 {
                    let mode = 0o600 | (i % 8) << 3;
                    assert_eq!(chmod(&s, f, mode).attr.mode & 0o7777, mode);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    // No MDT lock is left: only what the two clients' caches still hold.
    let cached = a.client.locks_held().len() + b.client.locks_held().len();
    assert_eq!(
        c.get_param("ldlm.namespaces.*.lock_count"),
        cached.to_string()
    );
}

#[test]
fn a_client_past_its_lock_cap_gets_enolck_and_keeps_working() {
    let c = cluster(1);
    c.set_param("ldlm.namespaces.*.max_locks_per_client=2");
    let a = c.client();
    channel_up(&a);
    let fids = made(&c, &["c0", "c1", "c2"]);
    for f in &fids[..2] {
        a.run(a.client.lock_enqueue(*f, 0, PR, UPDATE_PERM))
            .expect("enqueue")
            .expect("granted under the cap");
    }
    assert_eq!(
        a.run(a.client.lock_enqueue(fids[2], 0, PR, UPDATE_PERM)),
        Err(Errno::ENOLCK)
    );
    assert_eq!(c.get_param("ldlm.namespaces.*.lock_count"), "2");
    // Still served: a change calls its locks back as usual.
    assert_eq!(chmod(&a, fids[0], 0o600).attr.mode & 0o7777, 0o600);
}

/// MDT getattrs and lookups this client has sent.
fn md_reads(s: &Session) -> u64 {
    let st = s.client.mdc().stats();
    st.count(lode_proto::Opcode::Getattr) + st.count(lode_proto::Opcode::Lookup)
}

#[test]
fn a_client_answers_from_its_cache_under_locks_and_sees_every_change_of_another() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    channel_up(&a);
    channel_up(&b);
    let r = root();
    let d = b.run(mkdir_p(&b.client, "/d"));
    let f = create_in(&b, d, "f");
    let look = |name: &[u8]| a.run(a.client.lookup(&r, d, name));
    let stat = |fid| a.run(a.client.getattr(&r, fid));

    // Cached: the second stat and lookup cost no RPC.
    a.run(a.client.getattr(&r, d)).expect("dir attrs");
    assert_eq!(stat(f).expect("stat").mode & 0o7777, 0o644);
    assert_eq!(look(b"f").expect("lookup").attr.fid, f);
    let before = md_reads(&a);
    for _ in 0..20 {
        stat(f).expect("stat");
        look(b"f").expect("lookup");
    }
    assert_eq!(md_reads(&a), before, "answered from the cache");

    // Another client's chmod: seen at once.
    chmod(&b, f, 0o600);
    assert_eq!(stat(f).expect("stat").mode & 0o7777, 0o600);
    // A hard link: nlink seen.
    b.run(b.client.link(&r, f, d, b"f2")).expect("link");
    assert_eq!(stat(f).expect("stat").nlink, 2);
    // A write through another client: the size comes from the OSTs from then on.
    let fh = b
        .run(b.client.open(&r, f, libc::O_WRONLY))
        .expect("open for write");
    b.run(b.client.write(&fh, 0, b"hello")).expect("write");
    b.run(b.client.close(&fh)).expect("close");
    assert_eq!(stat(f).expect("stat").size, 5);
    // A rename: the old name is gone, the new one found.
    look(b"f").expect("cached again");
    b.run(b.client.rename(&r, d, b"f", d, b"g", 0))
        .expect("rename");
    assert_eq!(look(b"f").unwrap_err(), Errno::ENOENT);
    assert_eq!(look(b"g").expect("new name").attr.fid, f);
    // An unlink of the last names: gone, and so is the file.
    look(b"g").expect("cached");
    b.run(b.client.unlink(&r, d, b"g")).expect("unlink");
    b.run(b.client.unlink(&r, d, b"f2")).expect("unlink");
    assert_eq!(look(b"g").unwrap_err(), Errno::ENOENT);
    assert_eq!(stat(f).unwrap_err(), Errno::ENOENT);
    // Search permission taken away: a cached lookup is not served to a user who may no
    // longer search the directory.
    let h = create_in(&b, d, "h");
    assert_eq!(
        a.run(a.client.lookup(&user(), d, b"h"))
            .expect("user lookup")
            .attr
            .fid,
        h
    );
    chmod(&b, d, 0o700);
    assert_eq!(
        a.run(a.client.lookup(&user(), d, b"h")).unwrap_err(),
        Errno::EACCES
    );
}

#[test]
fn a_clients_own_changes_cancel_its_locks_early_and_cost_no_callback() {
    let c = cluster(1);
    let a = c.client();
    channel_up(&a);
    let r = root();
    let f = create(&a, "mine");
    a.run(a.client.getattr(&r, f)).expect("stat");
    a.run(a.client.getattr(&r, lode_base::Fid::ROOT))
        .expect("stat root");
    a.run(a.client.lookup(&r, lode_base::Fid::ROOT, b"mine"))
        .expect("lookup");
    assert!(!a.client.locks_held().is_empty(), "cached under locks");
    // chmod, link, rename, unlink of what A caches: no callback to A, each seen.
    assert_eq!(chmod(&a, f, 0o600).attr.mode & 0o7777, 0o600);
    assert_eq!(
        a.run(a.client.getattr(&r, f)).expect("stat").mode & 0o7777,
        0o600
    );
    a.run(a.client.rename(
        &r,
        lode_base::Fid::ROOT,
        b"mine",
        lode_base::Fid::ROOT,
        b"ours",
        0,
    ))
    .expect("rename");
    assert_eq!(
        a.run(a.client.lookup(&r, lode_base::Fid::ROOT, b"mine"))
            .unwrap_err(),
        Errno::ENOENT
    );
    a.run(a.client.unlink(&r, lode_base::Fid::ROOT, b"ours"))
        .expect("unlink");
    assert_eq!(a.run(a.client.getattr(&r, f)).unwrap_err(), Errno::ENOENT);
    assert_eq!(a.client.lock_callbacks(), 0, "every lock cancelled early");
    // Inside the changes' own requests, not as requests of their own.
    let stats = c.get_param("mdt.*.stats");
    assert!(
        !stats.lines().any(|l| l.starts_with("ldlm_cancel ")),
        "{stats}"
    );
    // Cleared, the cache leaves no lock held (those given back early included).
    a.client.lock_cache_clear();
    assert_eq!(a.client.locks_held(), Default::default());
}

#[test]
fn threads_of_one_client_changing_one_directory_do_not_call_each_other_back() {
    // A change's reply brings back a lock on its directory's attributes only when
    // no other change of the client's is on its way there: such a lock would be
    // called back by that change (one callback per few creates, before).
    let c = cluster(1);
    let (a, b) = (std::sync::Arc::new(c.client()), c.client());
    channel_up(&a);
    let d = a.run(mkdir_p(&a.client, "/busy"));
    let (threads, each) = (8, 50);
    let run = |rm: bool| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for i in 0..each {
                        let name = format!("d{t}.{i}");
                        if rm {
                            a.run(a.client.rmdir(&root(), d, name.as_bytes()))
                                .expect("rmdir");
                        } else {
                            a.run(a.client.mkdir(&root(), d, name.as_bytes(), 0o755, None))
                                .expect("mkdir");
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
    };
    let same_as_a_new_client = |nlink: u32| {
        let mine = a.run(a.client.getattr(&root(), d)).expect("stat");
        let theirs = b.run(b.client.getattr(&root(), d)).expect("stat");
        assert_eq!(mine.nlink, nlink);
        assert_eq!(
            (mine.nlink, mine.mtime, mine.ctime),
            (theirs.nlink, theirs.mtime, theirs.ctime)
        );
    };
    run(false);
    same_as_a_new_client(2 + threads * each);
    run(true);
    same_as_a_new_client(2);
    // Only a change that set out alone, overtaken by another before its reply came
    // back, leaves a lock in the other's way.
    let changes = u64::from(2 * threads * each);
    let callbacks = a.client.lock_callbacks();
    assert!(
        callbacks <= changes / 20,
        "{callbacks} callbacks for {changes} changes"
    );
}

#[test]
fn a_cached_lookup_survives_creates_in_its_directory_but_not_a_chmod_of_it() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    channel_up(&a);
    let d = b.run(mkdir_p(&b.client, "/pd"));
    let n = create_in(&b, d, "n");
    let look = || a.run(a.client.lookup(&user(), d, b"n"));
    assert_eq!(look().expect("lookup").attr.fid, n);
    // Another name created in the directory: the cached lookup still holds.
    create_in(&b, d, "other");
    let before = md_reads(&a);
    assert_eq!(look().expect("cached lookup").attr.fid, n);
    assert_eq!(
        md_reads(&a),
        before,
        "no RPC: the search right is still locked"
    );
    // The directory closed to others: the user may no longer look names up in it.
    chmod(&b, d, 0o700);
    assert_eq!(look().unwrap_err(), Errno::EACCES);
}

#[test]
fn lru_size_clear_empties_the_cache_and_gives_its_locks_back() {
    use lode_rpc::admin::Params;
    let c = cluster(1);
    let a = c.client();
    channel_up(&a);
    let r = root();
    let f = create(&a, "cold");
    a.run(a.client.getattr(&r, f)).expect("stat");
    let p = lode_client::params::all(a.client.clone());
    let ns = p
        .names()
        .into_iter()
        .find(|n| n.starts_with("ldlm.namespaces.") && n.ends_with(".lock_count"))
        .expect("the client's lock namespace")
        .trim_end_matches(".lock_count")
        .to_string();
    let count = |p: &dyn Params| -> usize {
        p.get(&format!("{ns}.lock_count"))
            .expect("lock_count")
            .parse()
            .expect("a number")
    };
    assert!(count(&p) >= 1, "the create's locks are cached");
    assert!(p.set(&format!("{ns}.lru_size"), "0").is_err(), "0 refused");
    assert!(p.set(&format!("{ns}.lru_size"), "lots").is_err());
    p.set(&format!("{ns}.lru_size"), "clear").expect("clear");
    assert_eq!(count(&p), 0);
    // The next request gives them back to the MDT, and a stat asks the MDT again.
    let before = md_reads(&a);
    a.run(a.client.getattr(&r, f)).expect("stat");
    assert_eq!(md_reads(&a), before + 1, "a cold cache asks the MDT");
    assert_eq!(
        c.get_param("ldlm.namespaces.*.lock_count"),
        a.client.locks_held().len().to_string(),
        "the MDT holds only what the cache holds again"
    );
}

/// A setattr comes back with the lock a getattr would get, so the stat that follows a
/// chmod costs no RPC; the lock covers what it says: another client's chmod calls it
/// back and is seen at once.
#[test]
fn a_setattr_brings_back_the_attributes_lock_and_stays_coherent() {
    let c = cluster(1);
    let (a, b) = (c.client(), c.client());
    channel_up(&a);
    channel_up(&b);
    let r = root();
    let f = create(&a, "f");
    for mode in [0o600, 0o640, 0o604] {
        assert_eq!(chmod(&a, f, mode).attr.mode & 0o7777, mode);
        let before = md_reads(&a);
        let attr = a.run(a.client.getattr(&r, f)).expect("stat");
        assert_eq!(attr.mode & 0o7777, mode);
        assert_eq!(md_reads(&a), before, "answered under the setattr's lock");
    }
    let callbacks = a.client.lock_callbacks();
    chmod(&b, f, 0o611);
    assert!(
        a.client.lock_callbacks() > callbacks,
        "A's lock called back"
    );
    assert_eq!(
        a.run(a.client.getattr(&r, f)).expect("stat").mode & 0o7777,
        0o611
    );
    // A truncate: the size is the MDT's (no data yet) and cached as well.
    let sa = SetAttr {
        size: Some(4096),
        ..Default::default()
    };
    a.run(a.client.setattr(&r, f, sa)).expect("truncate");
    let before = md_reads(&a);
    assert_eq!(a.run(a.client.getattr(&r, f)).expect("stat").size, 4096);
    assert_eq!(md_reads(&a), before);
}

/// A full lock cache gives back its oldest locks: what was cached last is still
/// answered without the MDT, what was cached first is asked for again.
#[test]
fn a_full_lock_cache_gives_back_its_oldest_locks_first() {
    let c = cluster(1);
    let fids = made(
        &c,
        &(0..100)
            .map(|i| format!("f{i}"))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let a = c.client();
    channel_up(&a);
    a.client.set_lock_cache_max(64);
    let r = root();
    for f in &fids {
        a.run(a.client.getattr(&r, *f)).expect("stat");
    }
    assert!(
        a.client.locks_held().len() <= 64,
        "the cache stays within lru_size"
    );
    let before = md_reads(&a);
    for f in fids.iter().rev().take(40) {
        a.run(a.client.getattr(&r, *f)).expect("stat");
    }
    assert_eq!(md_reads(&a), before, "the 40 newest are all still cached");
    a.run(a.client.getattr(&r, fids[0])).expect("stat");
    assert_eq!(md_reads(&a), before + 1, "the oldest was given back");
}

/// A name without digits (so no numbered-pattern guess is made) for entry `i`.
fn letters(i: usize) -> String {
    let mut s = String::from("e");
    let mut n = i;
    loop {
        s.push((b'a' + (n % 26) as u8) as char);
        n /= 26;
        if n == 0 {
            return s;
        }
    }
}

/// A parallel walk has a directory per walker in progress: listings of up to eight
/// directories are kept side by side, the least recently used going first, so each
/// walker's stats are fetched ahead (one readdir+ page per directory here) and none
/// becomes a lookup of its own.
#[test]
fn listings_of_eight_directories_walked_side_by_side_are_each_fetched_ahead() {
    let c = cluster(1);
    let maker = c.client();
    let r = root();
    let dirs: Vec<(lode_base::Fid, Vec<String>)> = (0..9)
        .map(|d| {
            let fid = maker
                .run(maker.client.mkdir(
                    &r,
                    lode_base::Fid::ROOT,
                    letters(d).as_bytes(),
                    0o755,
                    None,
                ))
                .expect("mkdir")
                .attr
                .fid;
            let names: Vec<String> = (0..30).map(letters).collect();
            for n in &names {
                create_in(&maker, fid, n);
            }
            (fid, names)
        })
        .collect();
    drop(maker);
    let a = c.client();
    channel_up(&a);
    let listed = |dir: lode_base::Fid| -> Vec<Vec<u8>> {
        a.run(a.client.readdir_all(&r, dir, false))
            .expect("readdir")
            .into_iter()
            .map(|e| e.name)
            .filter(|n| n != b"." && n != b"..")
            .collect()
    };
    // The first directory listed is the least recently used when the ninth comes.
    let orders: Vec<Vec<Vec<u8>>> = dirs.iter().map(|(d, _)| listed(*d)).collect();
    for (d, names) in &dirs {
        let mut got: Vec<String> = listed(*d)
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        got.sort();
        let mut want = names.clone();
        want.sort();
        assert_eq!(got, want);
    }
    // Each walker looks its directory up before walking it.
    for d in 0..dirs.len() {
        a.run(
            a.client
                .lookup(&r, lode_base::Fid::ROOT, letters(d).as_bytes()),
        )
        .expect("lookup");
    }
    let st = a.client.mdc().stats();
    let lookups = st.count(lode_proto::Opcode::Lookup);
    let pages = st.count(lode_proto::Opcode::Readdir);
    // Directories 1-8 (listed last, in this order), their names in turn, as eight
    // walkers would.
    for i in 0..30 {
        for ((d, _), order) in dirs.iter().zip(&orders).skip(1) {
            a.run(a.client.lookup(&r, *d, &order[i])).expect("lookup");
        }
    }
    assert_eq!(
        st.count(lode_proto::Opcode::Lookup),
        lookups,
        "no lookup of its own"
    );
    assert_eq!(
        st.count(lode_proto::Opcode::Readdir),
        pages + 8,
        "one page ahead per directory"
    );
}

#[test]
fn an_open_waiting_for_locks_when_its_client_is_evicted_is_refused_and_keeps_no_handle() {
    let c = cluster(1);
    c.set_param("mdt.*.ldlm_timeout=2");
    let f = made(&c, &["held"])[0];
    let maker = c.client();
    let fid = maker.run(maker.client.alloc_fid()).expect("a FID");
    let (mut peer, _chan, handle) = hand_made(&c, "evicted-opener");
    raw_enqueue(&mut peer, handle, pr_lock(f)).expect("granted");
    // Its own open of the file wants the attributes lock it never gives back: the open
    // waits until the client is evicted for keeping it, and the eviction frees it.
    let open = Request::Create(lode_proto::CreateReq {
        dom_writeback: false,
        cred: root(),
        parent: lode_base::Fid::ROOT,
        name: b"held".to_vec(),
        fid,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        rdev: 0,
        target: Vec::new(),
        layout: None,
        open_flags: Some((libc::O_CREAT | libc::O_RDWR) as u32),
    });
    let header = lode_proto::Header {
        opcode: open.opcode() as u16,
        tag: 1,
        xid: 100,
        handle,
        ..Default::default()
    };
    peer.send_request(&header, &open);
    let rep = peer
        .next_frame(Duration::from_secs(10))
        .expect("the open answered once its client was evicted");
    assert!(
        c.log("mdt0").contains("evicting client"),
        "the eviction is logged"
    );
    // An evicted client's waiting request is not run (Lustre aborts them): had it
    // been, the MDT would hold a handle that nobody can close.
    assert_eq!(c.get_param("mdt.*.open_files"), "0", "no handle left open");
    assert_eq!(rep.header.status, Errno::ENOTCONN.status());
}
