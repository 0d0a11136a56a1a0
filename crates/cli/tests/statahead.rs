//! Tree walks through a real mount. By default the kernel asks for attributes with a
//! directory's first page only, and a directory listed and then stat'ed name by name
//! (`ls -l`, `du`) has its attributes fetched ahead a page at a time by statahead,
//! counted in `llite.*.statahead_stats`. With `-o readdirplus=always` every page
//! carries attributes, so `ls -l` stats nothing through the client. Either way what
//! was fetched is kept under locks, so another client's chmod or rename is seen at
//! once; `statahead_max=0` turns statahead off.

mod common;

use common::*;
use lode_base::Fid;
use std::fs;
use std::os::unix::fs::PermissionsExt;

/// A counter of `llite.*.statahead_stats`.
fn stat_of(c: &lode_testkit::Cluster, what: &str) -> u64 {
    counter(&c.get_param("llite.*.statahead_stats"), what)
}

/// Counter `what` of a `statahead_stats` text.
fn counter(text: &str, what: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{what}: ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {what} in statahead_stats:\n{text}"))
}

/// Makes directory `name` in the root holding `n` empty files named by `file`, as
/// client `s`.
fn filled_dir(
    s: &lode_client::Session,
    name: &str,
    n: usize,
    file: impl Fn(usize) -> String,
) -> Fid {
    let r = root();
    let d = s
        .run(s.client.mkdir(&r, Fid::ROOT, name.as_bytes(), 0o755, None))
        .expect("mkdir")
        .attr
        .fid;
    for i in 0..n {
        s.run(s.client.create(&r, d, file(i).as_bytes(), 0o644, None))
            .expect("create");
    }
    d
}

/// `ls -l`'s pattern: every name first, then a stat of each (in listing order).
fn ls_l(dir: &std::path::Path) -> Vec<(String, u32)> {
    let names: Vec<String> = fs::read_dir(dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names
        .into_iter()
        .map(|n| {
            let m = fs::symlink_metadata(dir.join(&n)).expect("stat");
            (n, m.permissions().mode() & 0o7777)
        })
        .collect()
}

/// Client `s` chmods `/d/f0` and renames `/d/f1` of directory `d` (`n` entries, seen
/// by a mount at `dir`): the mount sees both at once, by name and in a new listing.
fn changed_elsewhere_is_seen(s: &lode_client::Session, d: Fid, dir: &std::path::Path, n: usize) {
    let r = root();
    let f0 = fid(s, "/d/f0").expect("f0");
    let sa = lode_base::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    s.run(s.client.setattr(&r, f0, sa)).expect("chmod");
    s.run(s.client.rename(&r, d, b"f1", d, b"f1-moved", 0))
        .expect("rename");
    let meta = |name: &str| fs::symlink_metadata(dir.join(name));
    assert_eq!(meta("f0").expect("f0").permissions().mode() & 0o7777, 0o600);
    assert!(meta("f1").is_err(), "the old name is gone");
    assert!(meta("f1-moved").is_ok(), "the new name is there");
    // A listing taken again agrees, names and modes.
    let again = ls_l(dir);
    assert_eq!(again.len(), n);
    assert!(again.contains(&("f0".to_string(), 0o600)));
    assert!(again.iter().any(|(name, _)| name == "f1-moved"));
}

#[test]
fn ls_l_of_a_directory_made_elsewhere_is_answered_by_statahead_and_never_stale() {
    let c = cluster(1);
    let s = c.client();
    // Several readdir pages: the mount reads the first with attributes (the kernel asks
    // for them on its first call), the others without.
    const N: usize = 5000;
    let d = filled_dir(&s, "d", N, |i| format!("f{i}"));
    // A mount that has seen none of it.
    let m = c.mount();
    let dir = m.path().join("d");
    let got = ls_l(&dir);
    assert_eq!(got.len(), N);
    assert!(got.iter().all(|(_, mode)| *mode == 0o644));
    let (hits, pages) = (stat_of(&c, "hits"), stat_of(&c, "pages"));
    // Beyond the first page, statahead answers all but one lookup per fetch.
    assert!(hits >= (N as u64) / 2, "hits {hits} of {N}");
    assert!(
        pages >= 1 && pages <= (N as u64) / 64,
        "{pages} pages for {N} names"
    );

    // Another client changes what statahead fetched: seen at once.
    changed_elsewhere_is_seen(&s, d, &dir, N);

    // Off: no page fetched, every stat still right.
    let m2 = c.mount();
    c.set_param("llite.*.statahead_max=0");
    c.set_param("llite.*.statahead_stats=clear");
    let listed = ls_l(&m2.path().join("d"));
    assert_eq!(listed.len(), N);
    assert_eq!(stat_of(&c, "pages"), 0, "statahead_max=0 fetches nothing");
}

/// With `readdirplus=always` the kernel gets attributes with every directory page,
/// under locks: `ls -l` of a large directory made elsewhere sends no lookup or getattr
/// at all, only pages, and another client's chmod or rename of what a page carried is
/// seen at once.
#[test]
fn ls_l_with_attributes_on_every_page_sends_no_lookups_and_is_never_stale() {
    let c = cluster(1);
    let s = c.client();
    const N: usize = 5000;
    let d = filled_dir(&s, "d", N, |i| format!("f{i}"));
    let m = c.mount_with(&["readdirplus=always"]);
    let dir = m.path().join("d");
    let _ = fs::metadata(&dir);
    c.set_param("mdc.*.md_stats=0");
    let got = ls_l(&dir);
    assert_eq!(got.len(), N);
    assert!(got.iter().all(|(_, mode)| *mode == 0o644));
    let stats = c.get_param("mdc.*.md_stats");
    assert!(md_stat(&c, "read_page") >= 2, "{stats}");
    for op in ["getattr_name", "getattr", "getattr_lock"] {
        assert_eq!(md_stat(&c, op), 0, "{op}: {stats}");
    }
    changed_elsewhere_is_seen(&s, d, &dir, N);
}

/// GNU `ls -l`: the kernel asks for attributes with every page, because stats follow
/// each (`readdirplus=auto`), and the mount reads each next page ahead with them, so
/// no page is fetched twice and no stat leaves the client. With `statahead_max=0` the
/// pages carry names only and each stat is an RPC of its own, as in Lustre with
/// statahead off; the listing is the same.
#[test]
fn gnu_ls_l_fetches_each_page_once_with_attributes_and_none_with_statahead_off() {
    let c = cluster(1);
    let s = c.client();
    const N: usize = 5000;
    filled_dir(&s, "d", N, |i| format!("f{i}"));
    let listed = |m: &lode_testkit::Mount| {
        let text = gnu_ls_l(&m.path().join("d"));
        let files: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(files.len(), N);
        assert!(files.iter().all(|l| l.starts_with("-rw-r--r--")), "{text}");
    };

    let m = c.mount();
    let _ = fs::metadata(m.path().join("d"));
    c.set_param("mdc.*.md_stats=0");
    listed(&m);
    let stats = c.get_param("mdc.*.md_stats");
    // A first page of 128 entries, then pages of 1,024: 6 pages.
    let pages = md_stat(&c, "read_page");
    assert!((5..=7).contains(&pages), "{pages} pages: {stats}");
    assert!(md_stat(&c, "getattr_name") <= 2, "{stats}");
    drop(m);

    let m2 = c.mount();
    let _ = fs::metadata(m2.path().join("d"));
    c.set_param("llite.*.statahead_max=0");
    c.set_param("mdc.*.md_stats=0");
    listed(&m2);
    let stats = c.get_param("mdc.*.md_stats");
    assert!(
        md_stat(&c, "getattr_name") >= N as u64,
        "each stat is a lookup: {stats}"
    );
}

/// gnulib's fts (`du`, `find`, `chmod -R`, `rm -r`) lists a large directory, then
/// stats its names in inode order, unrelated to the listing's: each miss fetches from
/// its name up to the first entry fetched already (and the next run of entries in
/// the background), so every entry is fetched about once (before, a page from each
/// miss: 4.4 times the directory), and every stat is right.
#[test]
fn stats_in_inode_order_fetch_each_entry_once() {
    use std::os::unix::fs::DirEntryExt;
    let c = cluster(1);
    let s = c.client();
    const N: usize = 5000;
    filled_dir(&s, "d", N, |i| format!("f{i}"));
    let m = c.mount();
    let dir = m.path().join("d");
    let mut names: Vec<(u64, std::ffi::OsString)> = fs::read_dir(&dir)
        .expect("readdir")
        .map(|e| {
            let e = e.expect("entry");
            (e.ino(), e.file_name())
        })
        .collect();
    assert_eq!(names.len(), N);
    names.sort();
    c.set_param("llite.*.statahead_stats=clear");
    for (ino, n) in &names {
        let md = fs::symlink_metadata(dir.join(n)).expect("stat");
        assert_eq!(md.permissions().mode() & 0o7777, 0o644);
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&md), *ino);
    }
    let (hits, entries) = (stat_of(&c, "hits"), stat_of(&c, "entries"));
    assert!(hits >= (N as u64) * 9 / 10, "hits {hits} of {N}");
    // A stat that overtakes a fetch in the background fetches its own entry again.
    assert!(
        entries <= (N + N / 100) as u64,
        "{entries} entries fetched for {N} names"
    );
}

/// A directory's open (an MDT open, so that a removed directory stays until its last
/// close) carries its first readdir+ page with every entry's attributes and layout
/// (Lustre 2.17's opendir with the first page): `ls -l` of a 100-entry directory on a
/// mount that has seen nothing of it is one lookup and one open (and ls's xattr
/// lookup of the directory). Listed again under the directory's lock, the kernel
/// lists it from the pages it kept, and the open asks for no page.
#[test]
fn ls_l_of_a_small_directory_is_one_lookup_and_one_open_with_its_page() {
    let c = cluster(1);
    let s = c.client();
    filled_dir(&s, "small", 100, |i| format!("f{i}"));
    let m = c.mount();
    // The mount's own start (statfs, the root) is not this test's business.
    let _ = fs::metadata(m.path());
    c.set_param("mdc.*.md_stats=0");
    assert_eq!(gnu_ls_l(&m.path().join("small")).lines().count(), 101);
    let stats = c.get_param("mdc.*.md_stats");
    assert_eq!(md_stat(&c, "intent_lock"), 1, "the open: {stats}");
    assert_eq!(
        md_stat(&c, "read_page"),
        0,
        "the page came with it: {stats}"
    );
    assert!(md_stat(&c, "getattr_name") <= 1, "{stats}");
    // ls asks for the directory's own `security.selinux` once, before its lock is held.
    assert!(md_stat(&c, "getxattr") <= 1, "{stats}");
    for op in ["getattr", "getattr_lock"] {
        assert_eq!(md_stat(&c, op), 0, "{op}: {stats}");
    }
    // Again: the open alone (its close rides ahead of it).
    c.set_param("mdc.*.md_stats=0");
    c.set_param("mdt.*.stats=clear");
    assert_eq!(gnu_ls_l(&m.path().join("small")).lines().count(), 101);
    let stats = c.get_param("mdc.*.md_stats");
    assert_eq!(md_stat(&c, "intent_lock"), 1, "{stats}");
    assert_eq!(md_stat(&c, "read_page"), 0, "{stats}");
    let served = c.get_param("mdt.*.stats");
    assert!(!served.contains("mds_readpage"), "{served}");
}

/// mdtest's stat phase: numbered names stat'ed in order with no listing. After two
/// consecutive numbers the mount looks the next ones up in one batch (Lustre 2.16's
/// pattern statahead), under locks: a few batches answer hundreds of stats, a guess
/// past the last name is counted as wrong, and another client's chmod or rename of a
/// name fetched ahead is seen at once.
#[test]
fn stats_of_numbered_names_are_fetched_ahead_in_batches_and_never_stale() {
    let c = cluster(1);
    let s = c.client();
    let r = root();
    const N: usize = 600;
    let d = filled_dir(&s, "seq", N, |i| format!("file.{i:03}"));
    let m = c.mount();
    let dir = m.path().join("seq");
    let _ = fs::metadata(&dir);
    c.set_param("mdc.*.md_stats=0");
    c.set_param("llite.*.statahead_stats=clear");
    let mode = |n: &str| {
        fs::symlink_metadata(dir.join(n))
            .map(|m| m.permissions().mode() & 0o7777)
            .map_err(|e| e.raw_os_error())
    };
    for i in 0..540 {
        assert_eq!(mode(&format!("file.{i:03}")), Ok(0o644), "file.{i:03}");
    }
    // Fetched ahead by now: changed by another client.
    let f550 = fid(&s, "/seq/file.550").expect("file.550");
    let sa = lode_base::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    s.run(s.client.setattr(&r, f550, sa)).expect("chmod");
    s.run(s.client.rename(&r, d, b"file.560", d, b"moved", 0))
        .expect("rename");
    for i in 540..N {
        let n = format!("file.{i:03}");
        let want = match i {
            550 => Ok(0o600),
            560 => Err(Some(libc::ENOENT)),
            _ => Ok(0o644),
        };
        assert_eq!(mode(&n), want, "{n}");
    }
    let stats = c.get_param("mdc.*.md_stats");
    let batches = md_stat(&c, "intent_getattr_async");
    assert!(
        (2..=8).contains(&batches),
        "{batches} batches for {N} stats:\n{stats}"
    );
    assert!(
        md_stat(&c, "getattr_name") <= 16,
        "single lookups only around the batches:\n{stats}"
    );
    assert!(stat_of(&c, "hits") >= 500, "hits counted");
    assert!(
        stat_of(&c, "wrong") >= 1,
        "the guess past file.599 is wrong"
    );
}

/// `find` reads names only: on a new mount, the kernel's first call for a directory
/// asks for attributes, but only for the first entries (a small readdir+ page), so a
/// large directory walked without stats costs the MDT about a hundred entries'
/// attributes and locks, not a full page of them.
#[test]
fn find_in_a_large_directory_takes_attributes_and_locks_for_its_first_entries_only() {
    let c = cluster(1);
    filled_dir(&c.client(), "big", 3000, |i| format!("f{i}"));
    lode_testkit::wait_for(
        "the maker's locks to go",
        std::time::Duration::from_secs(10),
        || c.get_param("ldlm.namespaces.mdt-*.lock_count") == "0",
    );
    let m = c.mount();
    let out = std::process::Command::new("find")
        .arg(m.path().join("big"))
        .args(["-name", "f2999"])
        .output()
        .expect("find");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        m.path().join("big/f2999").display().to_string()
    );
    let locks: u64 = c
        .get_param("ldlm.namespaces.mdt-*.lock_count")
        .parse()
        .expect("a count");
    assert!(
        locks <= 2 * 140,
        "{locks} locks on the MDT after a find of 3,000 names"
    );
}

/// The walks of real tools: `du` and `find -newer` (both read a directory, then stat
/// its entries) are answered by statahead on a new mount, as `ls -l` is, and counted
/// in `statahead_stats`.
#[test]
fn du_and_find_newer_on_a_new_mount_are_answered_by_statahead() {
    let c = cluster(1);
    const N: u64 = 3000;
    filled_dir(&c.client(), "tools", N as usize, |i| format!("x{i}"));
    for (tool, args) in [
        ("du", vec!["-s".to_string()]),
        (
            "find",
            vec!["-newer".to_string(), "/etc/hostname".to_string()],
        ),
    ] {
        let m = c.mount();
        c.set_param("llite.*.statahead_stats=clear");
        let mut cmd = std::process::Command::new(tool);
        if tool == "du" {
            cmd.args(&args).arg(m.path().join("tools"));
        } else {
            cmd.arg(m.path().join("tools")).args(&args);
        }
        let out = cmd.output().expect("run the tool");
        assert!(out.status.success(), "{tool}: {out:?}");
        let hits = stat_of(&c, "hits");
        assert!(hits >= N / 2, "{tool}: {hits} statahead hits for {N} names");
        drop(m);
    }
}

/// getxattr, then setxattr of `name` on `p`: each call's errno (0 for success).
fn xattr_errnos(p: &std::path::Path, name: &str) -> (i32, i32) {
    let (p, n) = (cs(p), cs(name));
    let mut buf = [0u8; 64];
    let err = |r: isize| {
        if r < 0 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            0
        }
    };
    // SAFETY: NUL-terminated names and a buffer of the length given.
    let get = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let get = err(get);
    let set = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    (get, err(set as isize))
}

/// `ls -l` asks every file for its SELinux label, a kernel round trip each, until a
/// file system says labels are "not supported". Where this machine does not run
/// SELinux, a mount says so for that one name (other `security.*` names are stored);
/// with `-o seclabel` labels are stored as any xattr.
#[test]
fn without_selinux_here_the_label_is_not_supported_unless_seclabel() {
    if std::path::Path::new("/sys/fs/selinux").exists() {
        eprintln!("SELinux runs here: labels are stored on every mount; not checked");
        return;
    }
    let c = cluster(1);
    let m = c.mount();
    let f = m.path().join("f");
    fs::write(&f, b"x").expect("create");
    assert_eq!(
        xattr_errnos(&f, "security.selinux"),
        (libc::EOPNOTSUPP, libc::EOPNOTSUPP)
    );
    assert_eq!(xattr_errnos(&f, "security.other"), (libc::ENODATA, 0));
    assert_eq!(xattr_errnos(&f, "security.other"), (0, 0));
    gnu_ls_l(m.path());
    let labelled = c.mount_with(&["seclabel"]);
    let g = labelled.path().join("f");
    assert_eq!(xattr_errnos(&g, "security.selinux"), (libc::ENODATA, 0));
    assert_eq!(xattr_errnos(&g, "security.selinux"), (0, 0));
    // The label stored there is not listed where it cannot be read.
    let names = |p: &std::path::Path| -> Vec<String> {
        let p = cs(p);
        // SAFETY: a NUL-terminated path; a null buffer of size 0 asks for the size.
        let n = unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) };
        assert!(n >= 0, "listxattr size");
        let mut buf = vec![0u8; n as usize];
        // SAFETY: a buffer of the length given.
        let got = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(got, n, "the size asked for first is the size");
        buf.split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect()
    };
    assert!(names(&g).contains(&"security.selinux".to_string()));
    let plain = names(&f);
    assert!(plain.contains(&"security.other".to_string()), "{plain:?}");
    assert!(
        !plain.contains(&"security.selinux".to_string()),
        "{plain:?}"
    );
}

/// Names read through a `DIR *` with libc, from its current position to the end.
fn read_names(dir: *mut libc::DIR) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        // SAFETY: `dir` is an open directory stream; readdir's entry is read before
        // the next call.
        let e = unsafe { libc::readdir(dir) };
        if e.is_null() {
            return names;
        }
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        names.push(name.to_string_lossy().into_owned());
    }
}

/// POSIX: after `rewinddir`, names made since the `opendir` are listed (xfstests
/// generic/471). The page that came with the directory's open is served only while
/// the directory is as it was then, and a rewind reads the directory again.
#[test]
fn names_made_after_opendir_are_listed_after_a_rewind() {
    let c = cluster(1);
    let m = c.mount();
    let d = m.path().join("d");
    fs::create_dir(&d).expect("mkdir");
    let dir = unsafe { libc::opendir(cs(&d).as_ptr()) };
    assert!(!dir.is_null(), "opendir");
    for i in 0..300 {
        fs::write(d.join(format!("f{i}")), b"").expect("create");
    }
    // SAFETY: `dir` is open until closedir below.
    unsafe { libc::rewinddir(dir) };
    assert_eq!(
        read_names(dir).len(),
        302,
        "every name made since the opendir"
    );
    for i in 300..400 {
        fs::write(d.join(format!("f{i}")), b"").expect("create");
    }
    unsafe { libc::rewinddir(dir) };
    let mut names = read_names(dir);
    unsafe { libc::closedir(dir) };
    names.sort();
    let mut want: Vec<String> = (0..400).map(|i| format!("f{i}")).collect();
    want.extend([".".to_string(), "..".to_string()]);
    want.sort();
    assert_eq!(names, want, "listed again after a second rewind");
}

/// A counter of a native client's `statahead_stats`.
fn client_stat(s: &lode_client::Session, what: &str) -> u64 {
    counter(&s.client.statahead_stats(), what)
}

/// A directory larger than the lock LRU, walked twice by one client (listed, then
/// every name looked up): the second walk finds the first one's entries given back by
/// the LRU, and statahead fetches them again a page at a time, as in the first walk.
/// (Before, the entries stayed marked as fetched, and each lookup of the second walk
/// was an RPC of its own: a warm walk ten times slower than a cold one.)
#[test]
fn a_walk_again_of_a_directory_larger_than_the_lock_lru_is_fetched_a_page_at_a_time() {
    let c = cluster(1);
    const N: usize = 2000;
    const WINDOW: usize = 64;
    let d = filled_dir(&c.client(), "big", N, |i| format!("f{i}"));
    let w = c.client();
    channel_up(&w);
    // Room for a quarter of the directory's entries (two locks each).
    w.client.set_lock_cache_max(N / 2);
    w.client.set_statahead_max(WINDOW);
    let r = root();
    let walk = || {
        let names = listed_names(&w, d);
        assert_eq!(names.len(), N);
        for n in &names {
            let b = w.run(w.client.lookup(&r, d, n)).expect("lookup");
            assert_eq!(b.attr.mode & 0o7777, 0o644);
        }
    };
    walk();
    assert!(
        w.client.locks_held().len() <= N / 2 + WINDOW * 2,
        "the cache stays within lru_size"
    );
    // Entries still cached from the first walk are answered without statahead; how
    // many the LRU has given back by the time the second walk reaches them depends on
    // the machine's load.
    let cached = (w.client.locks_held().len() / 2) as u64;
    w.client.statahead_stats_clear();
    let st = w.client.mdc().stats();
    let lookups = || st.count(lode_proto::Opcode::Lookup) + st.count(lode_proto::Opcode::Getattr);
    let before = lookups();
    walk();
    let (hits, pages) = (client_stat(&w, "hits"), client_stat(&w, "pages"));
    assert!(
        hits + cached >= (N as u64) * 9 / 10,
        "hits {hits} of {N}, {cached} cached from the first walk"
    );
    // A page per window, and a page of one entry for each stat that overtakes the
    // fetch ahead of it (how many depends on the machine's load: 30 to 230 here).
    // Before, every entry was a page of its own (2,000 here).
    assert!(
        pages <= (N / 2) as u64,
        "{pages} pages for {N} names in windows of {WINDOW}"
    );
    assert!(
        lookups() - before <= (N / 100) as u64,
        "{} lookups of their own",
        lookups() - before
    );
}

/// A walk in listing order keeps a run fetched ahead of it: its first miss fetches one
/// run for itself and the next in the background, and its lookup of the first name of
/// a run fetched in the background fetches the run after that one, before the walk
/// gets there. So the walk waits for no fetch after its first miss. (Before, every
/// other run began with a miss that waited for its own fetch.)
#[test]
fn a_walk_in_listing_order_keeps_a_run_fetched_ahead_of_it() {
    let c = cluster(1);
    const WINDOW: usize = 64;
    const N: usize = 8 * WINDOW;
    let d = filled_dir(&c.client(), "d", N, |i| format!("f{i:04}"));
    let w = c.client();
    channel_up(&w);
    w.client.set_statahead_max(WINDOW);
    let r = root();
    let names = listed_names(&w, d);
    assert_eq!(names.len(), N);
    let look = |n: &[u8]| {
        let b = w.run(w.client.lookup(&r, d, n)).expect("lookup");
        assert_eq!(b.attr.mode & 0o7777, 0o644);
    };
    let until = |what: &str, pages: u64, entries: u64| {
        lode_testkit::wait_for(what, std::time::Duration::from_secs(10), || {
            client_stat(&w, "pages") == pages && client_stat(&w, "entries") >= entries
        })
    };
    // The first miss: its own run and the next one, in the background.
    look(&names[0]);
    until("the second run to be fetched", 2, 2 * WINDOW as u64);
    for n in &names[1..WINDOW] {
        look(n);
    }
    assert_eq!(
        client_stat(&w, "pages"),
        2,
        "no fetch within the runs fetched"
    );
    // The second run's first name sets off the third run's fetch.
    look(&names[WINDOW]);
    until(
        "the third run to be fetched ahead of the walk",
        3,
        3 * WINDOW as u64,
    );
    for n in &names[WINDOW + 1..] {
        look(n);
    }
    // One run at a time all the way: each entry fetched once, each lookup answered
    // (the first by an RPC of its own here: this client holds no attributes of the
    // directory, so its cache cannot check search permission before that lookup).
    assert_eq!(client_stat(&w, "pages"), (N / WINDOW) as u64);
    let hits = client_stat(&w, "hits");
    assert!(hits >= (N as u64) * 9 / 10, "hits {hits} of {N}");
    assert_eq!(client_stat(&w, "entries"), N as u64);
}
