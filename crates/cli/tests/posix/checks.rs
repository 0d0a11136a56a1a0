use common::*;
use libc::{c_char, EACCES, EEXIST, EINVAL, ENAMETOOLONG, ENODATA, ENOENT, ENOTDIR, EPERM};
use libc::{O_CREAT, O_DIRECTORY, O_EXCL, O_NOFOLLOW, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};
use lode_testkit::{wait_for, Cluster, Mount};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{chown, symlink, DirBuilderExt};
use std::os::unix::prelude::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A cluster and a mount of it (the mount is dropped first).
struct Fx {
    m: Mount,
    _c: Cluster,
}

impl Fx {
    fn p(&self, rel: &str) -> PathBuf {
        self.m.path().join(rel)
    }
}

fn fx() -> Fx {
    unsafe { libc::umask(0o022) };
    let c = cluster(2);
    let m = c.mount_with(MOUNT_OPTIONS);
    if DOM_DEFAULT {
        // Small files wholly on the MDT, larger ones across the DoM end onto OSTs.
        let o = c
            .lode()
            .args(["setstripe", "-E", "64k", "-L", "mdt", "-E", "1M", "-c", "1"])
            .args(["-E", "-1", "-c", "2"])
            .arg(m.path())
            .output()
            .expect("lode runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    Fx { m, _c: c }
}

/// A libc return value as Ok(value) or Err(errno).
fn sys<T: TryInto<i64>>(r: T) -> Result<i64, i32> {
    let r: i64 = r.try_into().ok().unwrap();
    match r {
        0.. => Ok(r),
        _ => Err(std::io::Error::last_os_error().raw_os_error().unwrap()),
    }
}

/// A libc call on a path.
fn call(p: impl AsRef<Path>, f: impl FnOnce(*const c_char) -> i32) -> Result<i64, i32> {
    let c = cs(p);
    sys(f(c.as_ptr()))
}

/// The errno of a failed std call.
fn ioe<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().unwrap()
}

/// open(2) with mode 0644.
fn open(p: impl AsRef<Path>, flags: i32) -> Result<File, i32> {
    let fd = call(p, |c| unsafe {
        libc::open(c, flags | libc::O_CLOEXEC, 0o644)
    })?;
    Ok(unsafe { File::from_raw_fd(fd as i32) })
}

fn rw(p: impl AsRef<Path>) -> File {
    open(p, O_RDWR | O_CREAT | O_TRUNC).unwrap()
}

fn md(p: impl AsRef<Path>) -> fs::Metadata {
    fs::symlink_metadata(p).unwrap()
}

fn mode(p: impl AsRef<Path>) -> u32 {
    md(p).mode() & 0o7777
}

fn chmod(p: impl AsRef<Path>, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

fn ns(sec: i64, nsec: i64) -> i128 {
    sec as i128 * 1_000_000_000 + nsec as i128
}

/// True if a (sec, nsec) time is within 10 s of now.
fn recent(sec: i64, nsec: i64) -> bool {
    (now_ns() - ns(sec, nsec)).abs() < 10_000_000_000
}

fn set_times(p: &Path, a: (i64, i64), m: (i64, i64)) {
    let ts = [
        libc::timespec {
            tv_sec: a.0,
            tv_nsec: a.1,
        },
        libc::timespec {
            tv_sec: m.0,
            tv_nsec: m.1,
        },
    ];
    let r = call(p, |c| unsafe {
        libc::utimensat(libc::AT_FDCWD, c, ts.as_ptr(), 0)
    });
    assert_eq!(r, Ok(0));
}

// ---- open flags ----

#[test]
fn open_creat_excl_on_existing_name_gives_eexist() {
    let f = fx();
    fs::write(f.p("x"), b"1").unwrap();
    fs::create_dir(f.p("d")).unwrap();
    symlink("target", f.p("dangling")).unwrap();
    for n in ["x", "d", "dangling"] {
        let r = open(f.p(n), O_CREAT | O_EXCL | O_WRONLY).err();
        assert_eq!(r, Some(EEXIST), "{n}");
    }
    assert!(!f.p("target").exists());
    open(f.p("new"), O_CREAT | O_EXCL | O_WRONLY).unwrap();
    // O_CREAT without O_EXCL through a dangling symlink creates its target.
    open(f.p("dangling"), O_CREAT | O_WRONLY).unwrap();
    assert!(f.p("target").is_file() && f.p("new").is_file());
}

#[test]
fn open_trunc_empties_the_file() {
    let f = fx();
    fs::write(f.p("t"), b"hello world").unwrap();
    let mut file = open(f.p("t"), O_WRONLY | O_TRUNC).unwrap();
    assert_eq!(md(f.p("t")).len(), 0);
    file.write_all(b"ab").unwrap();
    drop(file);
    assert_eq!(fs::read(f.p("t")).unwrap(), b"ab");
}

#[test]
fn open_append_writes_at_the_current_end() {
    let f = fx();
    fs::write(f.p("log"), b"abc").unwrap();
    let mut a = open(f.p("log"), O_WRONLY | libc::O_APPEND).unwrap();
    let mut b = open(f.p("log"), O_WRONLY | libc::O_APPEND).unwrap();
    a.write_all(b"12").unwrap();
    b.write_all(b"34").unwrap();
    a.write_all(b"56").unwrap();
    // On Linux pwrite on an O_APPEND descriptor appends too, ignoring the offset.
    a.write_at(b"X", 0).unwrap();
    assert_eq!(fs::read(f.p("log")).unwrap(), b"abc123456X");
}

#[test]
fn open_directory_on_a_file_gives_enotdir() {
    let f = fx();
    fs::write(f.p("file"), b"").unwrap();
    fs::create_dir(f.p("dir")).unwrap();
    let r = open(f.p("file"), O_RDONLY | O_DIRECTORY).err();
    assert_eq!(r, Some(ENOTDIR));
    open(f.p("dir"), O_RDONLY | O_DIRECTORY).unwrap();
}

#[test]
fn open_nofollow_on_a_symlink_gives_eloop() {
    let f = fx();
    fs::write(f.p("file"), b"x").unwrap();
    symlink("file", f.p("link")).unwrap();
    let r = open(f.p("link"), O_RDONLY | O_NOFOLLOW).err();
    assert_eq!(r, Some(libc::ELOOP));
    open(f.p("file"), O_RDONLY | O_NOFOLLOW).unwrap();
}

// ---- create, mkdir, mknod, symlink, link ----

#[test]
fn create_and_mkdir_make_entries_with_the_given_mode() {
    let f = fx();
    fs::DirBuilder::new().mode(0o750).create(f.p("d")).unwrap();
    let fd = call(f.p("d/f"), |c| unsafe { libc::creat(c, 0o640) }).unwrap();
    unsafe { libc::close(fd as i32) };
    assert!(md(f.p("d")).is_dir() && md(f.p("d/f")).is_file());
    assert_eq!((mode(f.p("d")), mode(f.p("d/f"))), (0o750, 0o640));
    assert_eq!(md(f.p("d/f")).len(), 0);
    assert_eq!(ioe(fs::create_dir(f.p("d"))), EEXIST);
    assert_eq!(ioe(fs::create_dir(f.p("d/f"))), EEXIST);
    assert_eq!(ioe(File::create(f.p("nope/f"))), ENOENT);
    assert_eq!(ioe(fs::create_dir(f.p("d/f/x"))), ENOTDIR);
}

#[test]
fn mkdir_in_setgid_dir_inherits_group_and_setgid() {
    let f = fx();
    fs::create_dir(f.p("g")).unwrap();
    chown(f.p("g"), None, Some(777)).unwrap();
    chmod(f.p("g"), 0o2775);
    fs::create_dir(f.p("g/sub")).unwrap();
    File::create(f.p("g/file")).unwrap();
    let gids = (md(f.p("g/sub")).gid(), md(f.p("g/file")).gid());
    assert_eq!(gids, (777, 777));
    assert_eq!(mode(f.p("g/sub")) & 0o2000, 0o2000);
}

#[test]
fn mknod_makes_fifos_and_unix_sockets() {
    let f = fx();
    let r = call(f.p("fifo"), |c| unsafe {
        libc::mknod(c, libc::S_IFIFO | 0o644, 0)
    });
    assert_eq!(r, Ok(0));
    assert!(md(f.p("fifo")).file_type().is_fifo());
    let mut r = open(f.p("fifo"), O_RDONLY | libc::O_NONBLOCK).unwrap();
    open(f.p("fifo"), O_WRONLY)
        .unwrap()
        .write_all(b"piped")
        .unwrap();
    let mut buf = [0u8; 5];
    r.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"piped");

    let l = std::os::unix::net::UnixListener::bind(f.p("sock")).unwrap();
    assert!(md(f.p("sock")).file_type().is_socket());
    let mut c = std::os::unix::net::UnixStream::connect(f.p("sock")).unwrap();
    c.write_all(b"hi").unwrap();
    let mut buf = [0u8; 2];
    l.accept().unwrap().0.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hi");
}

#[test]
fn mknod_char_device_as_root() {
    let f = fx();
    let dev = libc::makedev(1, 3);
    let r = call(f.p("null"), |c| unsafe {
        libc::mknod(c, libc::S_IFCHR | 0o600, dev)
    });
    assert_eq!(r, Ok(0));
    let m = md(f.p("null"));
    assert!(m.file_type().is_char_device());
    assert_eq!((m.rdev(), m.mode() & 0o7777), (dev, 0o600));
}

#[test]
fn symlink_and_readlink() {
    let f = fx();
    fs::write(f.p("file"), b"content").unwrap();
    symlink("file", f.p("l1")).unwrap();
    let long = "x/".repeat(500) + "end";
    symlink(&long, f.p("l2")).unwrap();
    assert_eq!(fs::read_link(f.p("l1")).unwrap(), Path::new("file"));
    assert_eq!(fs::read_link(f.p("l2")).unwrap(), Path::new(&long));
    assert!(md(f.p("l2")).file_type().is_symlink());
    assert_eq!(md(f.p("l2")).len(), long.len() as u64);
    assert_eq!(fs::read(f.p("l1")).unwrap(), b"content");
    assert_eq!(ioe(fs::read(f.p("l2"))), ENOENT);
    assert_eq!(ioe(fs::read_link(f.p("file"))), EINVAL);
    assert_eq!(ioe(symlink("x", f.p("l1"))), EEXIST);
    symlink("l3", f.p("l3")).unwrap();
    assert_eq!(ioe(fs::read(f.p("l3"))), libc::ELOOP);
}

#[test]
fn hard_links_share_data_and_count_nlink() {
    let f = fx();
    let nl = |n: &str| md(f.p(n)).nlink();
    fs::write(f.p("a"), b"one").unwrap();
    fs::hard_link(f.p("a"), f.p("b")).unwrap();
    assert_eq!((nl("a"), nl("b")), (2, 2));
    assert_eq!(md(f.p("a")).ino(), md(f.p("b")).ino());
    fs::write(f.p("b"), b"two").unwrap();
    assert_eq!(fs::read(f.p("a")).unwrap(), b"two");
    fs::create_dir(f.p("d")).unwrap();
    fs::hard_link(f.p("a"), f.p("d/c")).unwrap();
    assert_eq!(nl("b"), 3);
    fs::remove_file(f.p("a")).unwrap();
    assert_eq!(nl("b"), 2);
    assert_eq!(ioe(fs::hard_link(f.p("d"), f.p("dl"))), EPERM);
    assert_eq!(ioe(fs::hard_link(f.p("b"), f.p("d/c"))), EEXIST);
    // Directories: 2 + one per subdirectory.
    let root0 = nl("");
    assert_eq!(nl("d"), 2);
    fs::create_dir(f.p("d/s1")).unwrap();
    fs::create_dir(f.p("d/s2")).unwrap();
    assert_eq!(nl("d"), 4);
    fs::remove_dir(f.p("d/s1")).unwrap();
    fs::rename(f.p("d/s2"), f.p("s2")).unwrap();
    assert_eq!((nl("d"), nl("")), (2, root0 + 1));
}

// ---- rename ----

#[test]
fn rename_over_a_file_replaces_it() {
    let f = fx();
    fs::write(f.p("a"), b"A").unwrap();
    fs::write(f.p("b"), b"B").unwrap();
    fs::hard_link(f.p("b"), f.p("b2")).unwrap();
    fs::rename(f.p("a"), f.p("b")).unwrap();
    assert_eq!(fs::read(f.p("b")).unwrap(), b"A");
    assert!(!f.p("a").exists());
    assert_eq!(
        (fs::read(f.p("b2")).unwrap(), md(f.p("b2")).nlink()),
        (b"B".to_vec(), 1)
    );
    // Renaming onto another link of the same file does nothing.
    fs::hard_link(f.p("b"), f.p("b3")).unwrap();
    fs::rename(f.p("b"), f.p("b3")).unwrap();
    assert!(f.p("b").exists() && f.p("b3").exists());
}

#[test]
fn rename_dir_over_an_empty_dir() {
    let f = fx();
    fs::create_dir_all(f.p("d1/sub")).unwrap();
    fs::write(f.p("d1/f"), b"x").unwrap();
    fs::create_dir(f.p("d2")).unwrap();
    fs::rename(f.p("d1"), f.p("d2")).unwrap();
    assert!(!f.p("d1").exists());
    assert_eq!(fs::read(f.p("d2/f")).unwrap(), b"x");
    assert_eq!(md(f.p("d2/sub/..")).ino(), md(f.p("d2")).ino());
}

#[test]
fn rename_dir_over_a_nonempty_dir_gives_enotempty() {
    let f = fx();
    fs::create_dir(f.p("d1")).unwrap();
    fs::create_dir(f.p("d2")).unwrap();
    fs::write(f.p("d2/f"), b"").unwrap();
    assert_eq!(ioe(fs::rename(f.p("d1"), f.p("d2"))), libc::ENOTEMPTY);
    assert!(f.p("d1").is_dir() && f.p("d2/f").is_file());
}

#[test]
fn rename_between_file_and_dir_gives_eisdir_or_enotdir() {
    let f = fx();
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("f"), b"").unwrap();
    assert_eq!(ioe(fs::rename(f.p("f"), f.p("d"))), libc::EISDIR);
    assert_eq!(ioe(fs::rename(f.p("d"), f.p("f"))), ENOTDIR);
    assert_eq!(ioe(fs::rename(f.p("missing"), f.p("x"))), ENOENT);
}

#[test]
fn rename_dir_into_its_own_subtree_gives_einval() {
    let f = fx();
    fs::create_dir_all(f.p("d/sub")).unwrap();
    assert_eq!(ioe(fs::rename(f.p("d"), f.p("d/sub/x"))), EINVAL);
    assert_eq!(ioe(fs::rename(f.p("d"), f.p("d/x"))), EINVAL);
    assert!(f.p("d/sub").is_dir());
}

fn renameat2(from: PathBuf, to: PathBuf, flags: libc::c_uint) -> Result<i64, i32> {
    let (a, b) = (cs(from), cs(to));
    let fdcwd = libc::AT_FDCWD;
    let (a, b) = (a.as_ptr(), b.as_ptr());
    sys(unsafe { libc::syscall(libc::SYS_renameat2, fdcwd, a, fdcwd, b, flags) })
}

#[test]
fn renameat2_noreplace_refuses_an_existing_target() {
    let f = fx();
    fs::write(f.p("a"), b"A").unwrap();
    fs::write(f.p("b"), b"B").unwrap();
    let r = renameat2(f.p("a"), f.p("b"), libc::RENAME_NOREPLACE);
    assert_eq!(
        (r, fs::read(f.p("b")).unwrap()),
        (Err(EEXIST), b"B".to_vec())
    );
    assert_eq!(renameat2(f.p("a"), f.p("c"), libc::RENAME_NOREPLACE), Ok(0));
    assert_eq!(fs::read(f.p("c")).unwrap(), b"A");
    assert!(!f.p("a").exists());
}

#[test]
fn renameat2_exchange_swaps_two_entries() {
    let f = fx();
    fs::write(f.p("a"), b"A").unwrap();
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("d/in"), b"I").unwrap();
    assert_eq!(renameat2(f.p("a"), f.p("d"), libc::RENAME_EXCHANGE), Ok(0));
    assert_eq!(fs::read(f.p("d")).unwrap(), b"A");
    assert_eq!(fs::read(f.p("a/in")).unwrap(), b"I");
    let r = renameat2(f.p("a"), f.p("none"), libc::RENAME_EXCHANGE);
    assert_eq!(r, Err(ENOENT));
}

// ---- unlink, rmdir ----

#[test]
fn unlink_and_rmdir_errors() {
    let f = fx();
    fs::create_dir(f.p("d")).unwrap();
    fs::write(f.p("d/f"), b"").unwrap();
    assert_eq!(ioe(fs::remove_dir(f.p("d"))), libc::ENOTEMPTY);
    assert_eq!(ioe(fs::remove_file(f.p("d"))), libc::EISDIR);
    assert_eq!(ioe(fs::remove_dir(f.p("d/f"))), ENOTDIR);
    assert_eq!(ioe(fs::remove_file(f.p("d/nope"))), ENOENT);
    fs::remove_file(f.p("d/f")).unwrap();
    fs::remove_dir(f.p("d")).unwrap();
    assert_eq!(fs::read_dir(f.m.path()).unwrap().count(), 0);
}

#[test]
fn unlinked_open_file_stays_usable() {
    let f = fx();
    let mut file = rw(f.p("tmp"));
    file.write_all(b"before").unwrap();
    fs::remove_file(f.p("tmp")).unwrap();
    assert!(!f.p("tmp").exists());
    file.write_all(b" after").unwrap();
    let mut buf = [0u8; 12];
    file.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before after");
    assert_eq!(file.metadata().unwrap().nlink(), 0);
}

#[test]
fn a_removed_directory_stays_usable_through_its_open_handle() {
    let f = fx();
    for d in ["gone", "over", "src"] {
        fs::create_dir(f.p(d)).unwrap();
    }
    // Removed by rmdir, and replaced by a rename over it (xfstests generic/035).
    let gone = File::open(f.p("gone")).unwrap();
    let over = File::open(f.p("over")).unwrap();
    fs::remove_dir(f.p("gone")).unwrap();
    fs::rename(f.p("src"), f.p("over")).unwrap();
    for d in [&gone, &over] {
        let m = d.metadata().unwrap();
        assert!(m.is_dir());
        assert_eq!(m.nlink(), 0, "no name, no link");
    }
    assert!(!f.p("gone").exists());
    assert_eq!(md(f.p("over")).nlink(), 2, "the directory renamed in is whole");
    drop((gone, over));
    // Closed on the MDT by the kernel's RELEASEDIR, which then destroys them.
    wait_for("the directories closed", Duration::from_secs(10), || {
        f._c.get_param("mdt.*.open_files") == "0"
    });
}

#[test]
fn file_handles_open_what_the_kernel_has_forgotten_and_are_stale_once_removed() {
    // xfstests generic/426, 467, 477: open_by_handle_at after the kernel dropped the
    // inodes, which the mount then looks up by number (a directory's parent too).
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        data: [u8; 128],
    }
    let f = fx();
    fs::create_dir_all(f.p("d/sub")).unwrap();
    fs::write(f.p("d/sub/f"), b"x").unwrap();
    let handle = |rel: &str| {
        let mut h = Handle {
            bytes: 128,
            kind: 0,
            data: [0; 128],
        };
        let mut mnt = 0;
        let p = cs(f.p(rel));
        let r = unsafe {
            let h = (&mut h as *mut Handle).cast();
            libc::name_to_handle_at(libc::AT_FDCWD, p.as_ptr(), h, &mut mnt, 0)
        };
        assert_eq!(r, 0, "{rel}: {}", std::io::Error::last_os_error());
        h
    };
    let root = File::open(f.m.path()).unwrap();
    let open = |h: &mut Handle| unsafe {
        let fd = libc::open_by_handle_at(root.as_raw_fd(), (h as *mut Handle).cast(), O_RDONLY);
        if fd >= 0 {
            libc::close(fd);
        }
        sys(fd)
    };
    let forget = || fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    let mut handles: Vec<_> = ["d", "d/sub", "d/sub/f"]
        .into_iter()
        .map(|rel| (rel, handle(rel)))
        .collect();
    forget();
    for (rel, h) in &mut handles {
        assert!(open(h).is_ok(), "{rel}: {:?}", open(h));
    }
    // A removed file's handle is stale once its last close reached the MDT (the
    // kernel's RELEASE comes after close(2) returns, and a file removed while still
    // open there stays until then).
    fs::write(f.p("d/sub/g"), b"x").unwrap();
    let mut file = handle("d/sub/g");
    fs::remove_file(f.p("d/sub/g")).unwrap();
    wait_for("a removed file's handle to be stale", Duration::from_secs(10), || {
        forget();
        open(&mut file) == Err(libc::ESTALE)
    });
}

// ---- attributes and times ----

#[test]
fn chmod_chown_and_fchown() {
    let f = fx();
    let ids = || (md(f.p("f")).uid(), md(f.p("f")).gid());
    fs::write(f.p("f"), b"x").unwrap();
    chmod(f.p("f"), 0o640);
    assert_eq!(mode(f.p("f")), 0o640);
    chown(f.p("f"), Some(4242), Some(4243)).unwrap();
    assert_eq!(ids(), (4242, 4243));
    let file = File::open(f.p("f")).unwrap();
    std::os::unix::fs::fchown(&file, Some(1), None).unwrap();
    assert_eq!(ids(), (1, 4243));
    file.set_permissions(fs::Permissions::from_mode(0o604))
        .unwrap();
    assert_eq!(mode(f.p("f")), 0o604);
}

#[test]
fn chown_clears_setuid_and_setgid_of_files() {
    let f = fx();
    // Setgid without group execute (a locking marker) survives; directories keep both.
    for (n, before, after) in [
        ("exe", 0o6755, 0o755),
        ("lk", 0o2644, 0o2644),
        ("d", 0o6755, 0o6755),
    ] {
        if n == "d" {
            fs::create_dir(f.p(n)).unwrap();
        } else {
            fs::write(f.p(n), b"x").unwrap();
        }
        chmod(f.p(n), before);
        chown(f.p(n), Some(4242), None).unwrap();
        assert_eq!(mode(f.p(n)), after, "{n}");
    }
}

#[test]
fn write_by_another_user_clears_setuid_and_setgid() {
    let f = fx();
    fs::write(f.p("exe"), b"x").unwrap();
    chmod(f.p("exe"), 0o6777);
    let open_w = |n| unsafe { libc::open(n, O_WRONLY) };
    assert_eq!(as_user(f.m.path(), "exe", open_w), 0, "open as uid {UID}");
    let e = as_user(f.m.path(), "exe", |n| unsafe {
        libc::write(libc::open(n, O_WRONLY), b"y".as_ptr().cast(), 1) as i32
    });
    assert_eq!(e, 0, "write as uid {UID}");
    assert_eq!(fs::read(f.p("exe")).unwrap(), b"y");
    assert_eq!(mode(f.p("exe")), 0o777);
}

#[test]
fn writes_and_fallocate_without_cap_fsetid_drop_set_id_bits_as_linux_does() {
    // The mount drops them itself (FUSE_HANDLE_KILLPRIV_V2), so that the kernel need
    // not ask for security.capability before every write: what is dropped must stay
    // what Linux drops.
    let f = fx();
    let write = |n| unsafe { libc::write(libc::open(n, O_WRONLY), b"y".as_ptr().cast(), 1) as i32 };
    let falloc = |n| unsafe { libc::fallocate(libc::open(n, O_WRONLY), 0, 0, 8192) };
    for (n, before, after) in [
        ("suid", 0o6755, 0o755),
        // Set-group-ID without group execute, written by a member of the group.
        ("lock", 0o2745, 0o2745),
        ("alloc", 0o4755, 0o755),
    ] {
        fs::write(f.p(n), b"x").unwrap();
        chown(f.p(n), Some(UID), Some(UID)).unwrap();
        chmod(f.p(n), before);
        let op = if n == "alloc" { falloc } else { write };
        assert_eq!(as_user(f.m.path(), n, op), 0, "{n} as uid {UID}");
        assert_eq!(mode(f.p(n)), after, "{n}");
    }
    // Root (CAP_FSETID) keeps them, and a second write by the owner finds none left.
    fs::write(f.p("root"), b"x").unwrap();
    chmod(f.p("root"), 0o6755);
    fs::OpenOptions::new()
        .append(true)
        .open(f.p("root"))
        .unwrap()
        .write_all(b"y")
        .unwrap();
    assert_eq!(mode(f.p("root")), 0o6755);
    assert_eq!(as_user(f.m.path(), "suid", write), 0);
    assert_eq!(mode(f.p("suid")), 0o755);
    assert_eq!(fs::read(f.p("suid")).unwrap(), b"y");
}

#[test]
fn a_program_runs_with_execute_permission_alone() {
    // xfstests generic/126: exec opens a program without asking to read it.
    let f = fx();
    fs::copy("/bin/true", f.p("prog")).unwrap();
    let run = |n: *const c_char| unsafe {
        let argv = [n, std::ptr::null()];
        libc::execv(n, argv.as_ptr())
    };
    chmod(f.p("prog"), 0o001);
    assert_eq!(as_user(f.m.path(), "./prog", run), 0, "--x runs");
    chmod(f.p("prog"), 0o004);
    assert_eq!(
        as_user(f.m.path(), "./prog", run),
        EACCES,
        "r-- does not run"
    );
}

#[test]
fn chmod_setgid_by_non_member_drops_setgid() {
    let f = fx();
    fs::write(f.p("mine"), b"x").unwrap();
    chown(f.p("mine"), Some(UID), Some(0)).unwrap();
    let e = as_user(f.m.path(), "mine", |n| unsafe { libc::chmod(n, 0o2755) });
    assert_eq!(e, 0);
    assert_eq!(mode(f.p("mine")), 0o755);
}

#[test]
fn truncate_and_ftruncate_up_and_down() {
    let f = fx();
    let p = f.p("t");
    let data: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8 + 1).collect();
    fs::write(&p, &data).unwrap();
    let trunc = |len| call(&p, |c| unsafe { libc::truncate(c, len) });
    assert_eq!(trunc(1_500_000), Ok(0));
    assert_eq!(fs::read(&p).unwrap(), &data[..1_500_000]);
    assert_eq!(trunc(3 << 20), Ok(0));
    let got = fs::read(&p).unwrap();
    assert_eq!(
        (got.len(), &got[..1_500_000]),
        (3 << 20, &data[..1_500_000])
    );
    let zeros = got[1_500_000..].iter().all(|&b| b == 0);
    assert!(zeros, "old data after shrink+grow");
    let file = open(&p, O_WRONLY).unwrap();
    file.set_len(10).unwrap();
    assert_eq!(fs::read(&p).unwrap(), &data[..10]);
    file.set_len(100).unwrap();
    let got = fs::read(&p).unwrap();
    assert_eq!((&got[..10], got.len()), (&data[..10], 100));
    assert!(got[10..].iter().all(|&b| b == 0));
    file.set_len(0).unwrap();
    assert_eq!(md(&p).len(), 0);
    assert_eq!(trunc(-1), Err(EINVAL));
    fs::create_dir(f.p("d")).unwrap();
    let r = call(f.p("d"), |c| unsafe { libc::truncate(c, 0) });
    assert_eq!(r, Err(libc::EISDIR));
}

#[test]
fn utimensat_sets_times_with_utime_now_and_utime_omit() {
    let f = fx();
    let p = f.p("f");
    fs::write(&p, b"x").unwrap();
    set_times(&p, (1_000_000, 5), (2_000_000, 7));
    let m = md(&p);
    let got = (m.atime(), m.atime_nsec(), m.mtime(), m.mtime_nsec());
    assert_eq!(got, (1_000_000, 5, 2_000_000, 7));
    set_times(&p, (0, libc::UTIME_OMIT), (0, libc::UTIME_NOW));
    let m = md(&p);
    assert_eq!((m.atime(), m.atime_nsec()), (1_000_000, 5));
    assert!(recent(m.mtime(), m.mtime_nsec()), "mtime {}", m.mtime());
    set_times(&p, (0, libc::UTIME_NOW), (0, libc::UTIME_OMIT));
    let m2 = md(&p);
    assert!(recent(m2.atime(), m2.atime_nsec()), "atime {}", m2.atime());
    assert_eq!((m2.mtime(), m2.mtime_nsec()), (m.mtime(), m.mtime_nsec()));
}

#[test]
fn create_unlink_and_rename_update_parent_dir_mtime() {
    let f = fx();
    let d = f.p("d");
    fs::create_dir(&d).unwrap();
    let old = (1_000_000, 0);
    let changed = |what: &str| {
        let m = md(&d);
        let newer = m.mtime() > old.0 && m.ctime() > old.0;
        assert!(newer, "dir times not updated by {what}");
        set_times(&d, old, old);
    };
    set_times(&d, old, old);
    File::create(d.join("f")).unwrap();
    changed("create");
    fs::create_dir(d.join("sub")).unwrap();
    changed("mkdir");
    fs::rename(d.join("f"), d.join("g")).unwrap();
    changed("rename");
    fs::remove_file(d.join("g")).unwrap();
    changed("unlink");
    fs::remove_dir(d.join("sub")).unwrap();
    changed("rmdir");
}

#[test]
fn chmod_updates_ctime_but_not_mtime() {
    let f = fx();
    let p = f.p("f");
    fs::write(&p, b"x").unwrap();
    let m0 = md(&p);
    let c0 = ns(m0.ctime(), m0.ctime_nsec());
    // Let the clock pass the ctime so a change shows at any timestamp granularity.
    wait_for("the clock to pass ctime", Duration::from_secs(5), || {
        now_ns() > c0 + 1_100_000_000
    });
    chmod(&p, 0o600);
    let m1 = md(&p);
    assert!(ns(m1.ctime(), m1.ctime_nsec()) > c0, "ctime unchanged");
    assert_eq!((m1.mtime(), m1.mtime_nsec()), (m0.mtime(), m0.mtime_nsec()));
}

#[test]
fn write_and_truncate_update_mtime() {
    let f = fx();
    let p = f.p("f");
    fs::write(&p, b"x").unwrap();
    set_times(&p, (1_000_000, 0), (1_000_000, 0));
    open(&p, O_WRONLY).unwrap().write_all(b"abc").unwrap();
    assert!(recent(md(&p).mtime(), 0), "after write: {}", md(&p).mtime());
    set_times(&p, (1_000_000, 0), (1_000_000, 0));
    open(&p, O_WRONLY).unwrap().set_len(1).unwrap();
    assert!(
        recent(md(&p).mtime(), 0),
        "after truncate: {}",
        md(&p).mtime()
    );
}

// ---- xattrs, statfs, sync, fallocate, locks, mmap ----

#[test]
fn xattrs_set_get_list_remove() {
    let f = fx();
    fs::write(f.p("f"), b"").unwrap();
    let p = cs(f.p("f"));
    let p = p.as_ptr();
    let set = |n: &str, v: &[u8], fl| {
        let n = cs(n);
        sys(unsafe { libc::setxattr(p, n.as_ptr(), v.as_ptr().cast(), v.len(), fl) })
    };
    let get = |n: &str, b: &mut [u8]| {
        let n = cs(n);
        sys(unsafe { libc::getxattr(p, n.as_ptr(), b.as_mut_ptr().cast(), b.len()) })
    };
    let rm = |n: &str| {
        let n = cs(n);
        sys(unsafe { libc::removexattr(p, n.as_ptr()) })
    };
    let list = |b: &mut [u8]| sys(unsafe { libc::listxattr(p, b.as_mut_ptr().cast(), b.len()) });
    assert_eq!(set("user.color", b"blue", 0), Ok(0));
    assert_eq!(set("user.empty", b"", 0), Ok(0));
    assert_eq!(get("user.color", &mut []), Ok(4));
    let mut buf = [0u8; 16];
    assert_eq!(
        (get("user.color", &mut buf), &buf[..4]),
        (Ok(4), &b"blue"[..])
    );
    assert_eq!(get("user.color", &mut buf[..2]), Err(libc::ERANGE));
    assert_eq!(get("user.empty", &mut buf), Ok(0));
    assert_eq!(get("user.missing", &mut buf), Err(ENODATA));
    assert_eq!(set("user.color", b"x", libc::XATTR_CREATE), Err(EEXIST));
    assert_eq!(set("user.missing", b"x", libc::XATTR_REPLACE), Err(ENODATA));
    assert_eq!(set("user.color", b"green", libc::XATTR_REPLACE), Ok(0));
    assert_eq!(
        (get("user.color", &mut buf), &buf[..5]),
        (Ok(5), &b"green"[..])
    );
    let n = list(&mut []).unwrap() as usize;
    let mut names = vec![0u8; n];
    assert_eq!(list(&mut names), Ok(n as i64));
    let mut user: Vec<&[u8]> = names
        .split(|&b| b == 0)
        .filter(|s| s.starts_with(b"user."))
        .collect();
    user.sort();
    assert_eq!(user, [&b"user.color"[..], b"user.empty"]);
    assert_eq!(list(&mut names[..3]), Err(libc::ERANGE));
    assert_eq!((rm("user.color"), rm("user.color")), (Ok(0), Err(ENODATA)));
    assert_eq!(get("user.color", &mut buf), Err(ENODATA));
}

#[test]
fn statvfs_reports_blocks_and_namemax() {
    let f = fx();
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = call(f.m.path(), |c| unsafe { libc::statvfs(c, &mut s) });
    assert_eq!(r, Ok(0));
    assert!(s.f_blocks > 0 && s.f_bsize > 0 && s.f_frsize > 0);
    assert!(s.f_bfree <= s.f_blocks && s.f_bavail <= s.f_bfree);
    assert_eq!(s.f_namemax, 255);
}

#[test]
fn fsync_and_fdatasync_succeed() {
    let f = fx();
    let mut file = File::create(f.p("f")).unwrap();
    file.write_all(&[7u8; 100_000]).unwrap();
    file.sync_all().unwrap();
    file.write_all(b"more").unwrap();
    file.sync_data().unwrap();
    File::open(f.m.path()).unwrap().sync_all().unwrap();
    assert_eq!(md(f.p("f")).len(), 100_004);
}

#[test]
fn fallocate_preallocates_punches_and_zeroes_as_lustre_does() {
    let f = fx();
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(f.p("f"))
        .unwrap();
    let fd = file.as_raw_fd();
    let falloc = |mode, off, len| sys(unsafe { libc::fallocate(fd, mode, off, len) });
    assert_eq!(falloc(0, 0, 1 << 20), Ok(0));
    assert_eq!(md(f.p("f")).len(), 1 << 20);
    assert!(fs::read(f.p("f")).unwrap().iter().all(|&b| b == 0));
    file.write_all_at(&[7u8; 1 << 20], 0).unwrap();
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(falloc(libc::FALLOC_FL_PUNCH_HOLE | keep, 4096, 8192), Ok(0));
    assert_eq!(falloc(libc::FALLOC_FL_ZERO_RANGE | keep, 1_000_000, 100_000), Ok(0));
    assert_eq!(falloc(keep, 2 << 20, 4096), Ok(0), "beyond the end, size kept");
    let data = fs::read(f.p("f")).unwrap();
    assert_eq!(data.len(), 1 << 20);
    let zero = |i: usize| (4096..12288).contains(&i) || i >= 1_000_000;
    assert!(data.iter().enumerate().all(|(i, &b)| b == if zero(i) { 0 } else { 7 }));
    // Zeroing past the end extends the file; what Lustre lacks is refused.
    assert_eq!(falloc(libc::FALLOC_FL_ZERO_RANGE, (1 << 20) - 10, 20), Ok(0));
    assert_eq!(md(f.p("f")).len(), (1 << 20) + 10);
    assert_eq!(falloc(libc::FALLOC_FL_PUNCH_HOLE, 0, 4096), Err(libc::EOPNOTSUPP));
    assert_eq!(falloc(libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096), Err(libc::EOPNOTSUPP));
}

/// `FS_IOC_GETFLAGS` of a path (what lsattr shows), or the errno.
fn get_iflags(p: &Path) -> Result<i32, i32> {
    let f = File::open(p).unwrap();
    let mut v: libc::c_int = 0;
    // SAFETY: the kernel writes one int.
    sys(unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut v) }).map(|_| v)
}

/// `FS_IOC_SETFLAGS` of a path (chattr), or the errno.
fn set_iflags(p: &Path, v: i32) -> Result<i64, i32> {
    let f = File::open(p).unwrap();
    // SAFETY: the kernel reads one int.
    sys(unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &v) })
}

#[test]
fn immutable_and_append_only_files_refuse_what_linux_refuses() {
    const I: i32 = 0x10; // FS_IMMUTABLE_FL
    const A: i32 = 0x20; // FS_APPEND_FL
    let f = fx();
    fs::write(f.p("i"), b"fixed").unwrap();
    fs::write(f.p("a"), b"log\n").unwrap();
    fs::create_dir(f.p("d")).unwrap();
    fs::create_dir(f.p("ad")).unwrap();
    fs::write(f.p("ad/old"), b"").unwrap();
    fs::write(f.p("x"), b"").unwrap();
    assert_eq!(get_iflags(&f.p("i")), Ok(0));
    for (p, v) in [("i", I), ("a", A), ("d", I), ("ad", A)] {
        assert_eq!(set_iflags(&f.p(p), v), Ok(0), "chattr {p}");
    }
    assert_eq!(get_iflags(&f.p("i")), Ok(I));
    assert_eq!(get_iflags(&f.p("ad")), Ok(A));
    // Only root may set them (the kernel checks CAP_LINUX_IMMUTABLE too), and only
    // those lode keeps.
    fs::set_permissions(f.p("x"), fs::Permissions::from_mode(0o666)).unwrap();
    let chattr_i = |c: *const c_char| unsafe {
        let v: libc::c_int = I;
        libc::ioctl(libc::open(c, O_RDONLY), libc::FS_IOC_SETFLAGS, &v)
    };
    assert_eq!(as_user(f.m.path(), "x", chattr_i), EPERM);
    assert_eq!(set_iflags(&f.p("x"), 0x40), Err(libc::EOPNOTSUPP), "nodump");
    let open = |p: &str, flags: i32| call(f.p(p), |c| unsafe { libc::open(c, flags) });
    // Immutable: read, nothing else.
    assert_eq!(fs::read(f.p("i")).unwrap(), b"fixed");
    for flags in [O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC, O_WRONLY | libc::O_APPEND] {
        assert_eq!(open("i", flags), Err(EPERM), "open {flags:#o}");
    }
    assert_eq!(ioe(fs::remove_file(f.p("i"))), EPERM);
    assert_eq!(ioe(fs::rename(f.p("i"), f.p("i2"))), EPERM);
    assert_eq!(ioe(fs::hard_link(f.p("i"), f.p("i3"))), EPERM);
    assert_eq!(ioe(fs::set_permissions(f.p("i"), fs::Permissions::from_mode(0o600))), EPERM);
    assert_eq!(ioe(File::open(f.p("i")).unwrap().set_modified(SystemTime::now())), EPERM);
    assert_eq!(call(f.p("i"), |c| unsafe { libc::truncate(c, 0) }), Err(EPERM));
    let setx = |p: &str| {
        call(f.p(p), |c| unsafe { libc::setxattr(c, c"user.k".as_ptr(), b"v".as_ptr().cast(), 1, 0) })
    };
    assert_eq!(setx("i"), Err(EPERM));
    // Append-only: appending, and setting the times to now, only.
    assert_eq!(open("a", O_WRONLY), Err(EPERM));
    assert_eq!(open("a", O_WRONLY | libc::O_APPEND | O_TRUNC), Err(EPERM));
    let mut log = OpenOptions::new().append(true).open(f.p("a")).unwrap();
    log.write_all(b"more\n").unwrap();
    drop(log);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"log\nmore\n");
    assert_eq!(call(f.p("a"), |c| unsafe { libc::utimes(c, std::ptr::null()) }), Ok(0));
    assert_eq!(ioe(fs::remove_file(f.p("a"))), EPERM);
    assert_eq!(call(f.p("a"), |c| unsafe { libc::truncate(c, 0) }), Err(EPERM));
    assert_eq!(setx("a"), Err(EPERM));
    // Preallocation only: no hole punched in what was appended.
    let log = OpenOptions::new().append(true).open(f.p("a")).unwrap();
    let falloc = |mode| sys(unsafe { libc::fallocate(log.as_raw_fd(), mode, 0, 4096) });
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(falloc(libc::FALLOC_FL_PUNCH_HOLE | keep), Err(EPERM));
    assert_eq!(falloc(keep), Ok(0));
    drop(log);
    assert_eq!(fs::read(f.p("a")).unwrap(), b"log\nmore\n");
    // An immutable directory takes no new entry; an append-only one gives none up.
    assert_eq!(ioe(File::create(f.p("d/new"))), EPERM);
    assert_eq!(ioe(fs::create_dir(f.p("d/sub"))), EPERM);
    File::create(f.p("ad/new")).unwrap();
    assert_eq!(ioe(fs::remove_file(f.p("ad/old"))), EPERM);
    assert_eq!(ioe(fs::rename(f.p("ad/old"), f.p("moved"))), EPERM);
    // Made immutable while open for writing: the open file writes no more either
    // (xfstests generic/553), as on Linux.
    let mut w = OpenOptions::new().write(true).open(f.p("x")).unwrap();
    w.write_all(b"before").unwrap();
    assert_eq!(set_iflags(&f.p("x"), I), Ok(0));
    assert_eq!(ioe(w.write_all(b"after")), EPERM);
    assert_eq!(set_iflags(&f.p("x"), 0), Ok(0));
    w.write_all(b" after").unwrap();
    drop(w);
    assert_eq!(fs::read(f.p("x")).unwrap(), b"before after");
    // Cleared, all is allowed again.
    for p in ["i", "a", "d", "ad"] {
        assert_eq!(set_iflags(&f.p(p), 0), Ok(0));
    }
    assert_eq!(get_iflags(&f.p("i")), Ok(0));
    fs::remove_file(f.p("i")).unwrap();
    fs::remove_file(f.p("ad/old")).unwrap();
    File::create(f.p("d/new")).unwrap();
}

/// A file's access, modification and change times, in ns.
fn amc(p: &Path) -> (i128, i128, i128) {
    let m = md(p);
    (
        ns(m.atime(), m.atime_nsec()),
        ns(m.mtime(), m.mtime_nsec()),
        ns(m.ctime(), m.ctime_nsec()),
    )
}

#[test]
fn reads_move_access_times_as_relatime_does() {
    let f = fx();
    let (p, d) = (f.p("f"), f.p("d"));
    fs::write(&p, b"data").unwrap();
    fs::create_dir(&d).unwrap();
    File::create(d.join("x")).unwrap();
    let (a0, m0, _) = amc(&p);
    // A read after the last change moves it (Linux's relatime), on this mount at once.
    assert_eq!(fs::read(&p).unwrap(), b"data");
    let (a1, _, c1) = amc(&p);
    assert!(a1 > a0 && a1 > m0, "read: atime {a0} -> {a1}, mtime {m0}");
    // Read again, nothing changed since: relatime leaves it.
    assert_eq!(fs::read(&p).unwrap(), b"data");
    assert_eq!(amc(&p).0, a1, "a second read moved it");
    // Written since, read again: it moves past the new mtime; the ctime stays the write's.
    fs::write(&p, b"more").unwrap();
    let (_, m2, c2) = amc(&p);
    assert!(c2 >= m2 && c2 > c1, "a write moves the ctime with the mtime: {c2} < {m2}");
    assert_eq!(fs::read(&p).unwrap(), b"more");
    let (a3, m3, c3) = amc(&p);
    assert!(a3 > m2, "after a write: atime {a3}, mtime {m2}");
    assert_eq!((m3, c3), (m2, c2), "a read changed mtime or ctime");
    // Listing a directory changed since its last listing moves its access time.
    let (da0, dm0, _) = amc(&d);
    assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
    let (da1, _, _) = amc(&d);
    assert!(da1 > da0 && da1 > dm0, "listing: atime {da0} -> {da1}");
    // The MDT has it too (it rides ahead of the mount's next request, or a PING soon
    // after): another client's next fetch sees it. As on Lustre, an access time calls
    // no lock back, so that client's copy is dropped first.
    let fid = lode_base::Fid::from_ino(md(&p).ino()).unwrap();
    let s = f._c.client();
    let mdt_atime = || {
        s.client.lock_cache_clear();
        i128::from(s.run(s.client.getattr_md(&root(), fid)).unwrap().attr.atime)
    };
    wait_for("the MDT to have the access time", Duration::from_secs(10), || {
        mdt_atime() == a3
    });
    // A noatime mount moves nothing.
    let m = f._c.mount_with(&["noatime"]);
    set_times(&p, (1_000_000, 0), (1_000_000, 0));
    let q = m.path().join("f");
    let before = amc(&q).0;
    assert_eq!(fs::read(&q).unwrap(), b"more");
    assert_eq!(fs::read_dir(m.path().join("d")).unwrap().count(), 1);
    assert_eq!(amc(&q).0, before, "noatime: a read moved it");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(mdt_atime(), before, "noatime: the MDT moved it");
}

#[test]
fn birth_time_is_set_at_creation_and_kept() {
    let f = fx();
    let before = SystemTime::now() - Duration::from_millis(10);
    File::create(f.p("f")).unwrap();
    fs::create_dir(f.p("d")).unwrap();
    symlink("f", f.p("l")).unwrap();
    let after = SystemTime::now() + Duration::from_millis(10);
    // std reads the birth time with statx(STATX_BTIME), which the mount answers
    // with a FUSE_STATX reply.
    let born = |p: &str| fs::symlink_metadata(f.p(p)).unwrap().created().unwrap();
    for p in ["f", "d", "l"] {
        let b = born(p);
        assert!(before <= b && b <= after, "{p}: born {b:?}");
    }
    let b = born("f");
    std::thread::sleep(Duration::from_millis(20));
    fs::write(f.p("f"), b"data").unwrap();
    fs::set_permissions(f.p("f"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::rename(f.p("f"), f.p("g")).unwrap();
    let m = md(f.p("g"));
    assert_eq!(m.created().unwrap(), b, "a write, chmod and rename keep it");
    assert!(m.modified().unwrap() > b);
}

/// `linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, to, AT_SYMLINK_FOLLOW)`: the way an
/// unprivileged program names an `O_TMPFILE` file.
fn link_fd(file: &File, to: &Path) -> Result<i64, i32> {
    let from = cs(format!("/proc/self/fd/{}", file.as_raw_fd()));
    call(to, |t| unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            t,
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

#[test]
fn o_tmpfile_makes_a_file_with_no_name_until_linkat_names_it() {
    let f = fx();
    fs::create_dir(f.p("d")).unwrap();
    let tmp = |flags| open(f.p("d"), libc::O_TMPFILE | flags);
    assert_eq!(tmp(O_RDONLY).err(), Some(EINVAL), "it must be writable");
    let file = tmp(O_RDWR).unwrap();
    file.write_all_at(b"no name yet", 0).unwrap();
    let m = file.metadata().unwrap();
    assert_eq!((m.nlink(), m.len(), m.mode()), (0, 11, 0o100644));
    assert_eq!(fs::read_dir(f.p("d")).unwrap().count(), 0, "nothing to list");
    assert_eq!(link_fd(&file, &f.p("d/named")), Ok(0));
    assert_eq!(file.metadata().unwrap().nlink(), 1);
    assert_eq!(fs::read(f.p("d/named")).unwrap(), b"no name yet");
    assert_eq!(md(f.p("d/named")).ino(), m.ino());
    // Once its names are gone again, it is an ordinary open-unlinked file, which its
    // holder may open again (as any process may through /proc).
    fs::remove_file(f.p("d/named")).unwrap();
    assert_eq!(link_fd(&file, &f.p("d/again")), Err(ENOENT));
    let again = format!("/proc/self/fd/{}", file.as_raw_fd());
    assert_eq!(fs::read(&again).unwrap(), b"no name yet");
    drop(file);
    let nameless = tmp(O_RDWR).unwrap();
    nameless.write_all_at(b"still nameless", 0).unwrap();
    let again = format!("/proc/self/fd/{}", nameless.as_raw_fd());
    assert_eq!(fs::read(&again).unwrap(), b"still nameless");
    drop(nameless);
    // Made with O_EXCL: no name may ever reach it.
    let excl = tmp(O_WRONLY | O_EXCL).unwrap();
    assert_eq!(link_fd(&excl, &f.p("d/excl")), Err(ENOENT));
    drop(excl);
    assert_eq!(fs::read_dir(f.p("d")).unwrap().count(), 0);
    // Creating in a directory needs writing it, a file with no name too.
    fs::set_permissions(f.p("d"), fs::Permissions::from_mode(0o555)).unwrap();
    let e = as_user(f.m.path(), "d", |n| unsafe {
        libc::open(n, libc::O_TMPFILE | O_RDWR, 0o600)
    });
    assert_eq!(e, EACCES);
    assert_eq!(tmp(O_RDWR).err(), None, "root may");
    assert_eq!(open(f.p("d/nope"), libc::O_TMPFILE | O_RDWR).err(), Some(ENOENT));
}

#[test]
fn seek_data_and_seek_hole_find_what_was_written() {
    let f = fx();
    const M: u64 = 1 << 20;
    let file = File::create(f.p("f")).unwrap();
    file.write_all_at(&[1u8; 4096], 0).unwrap();
    file.write_all_at(&[2u8; 4096], M).unwrap();
    file.write_all_at(&[3u8; 10], 3 * M + 100).unwrap();
    let size = 3 * M + 110;
    let seek = |file: &File, off: u64, whence| {
        sys(unsafe { libc::lseek(file.as_raw_fd(), off as i64, whence) })
    };
    let (data, hole) = (libc::SEEK_DATA, libc::SEEK_HOLE);
    // Asked through a handle open for writing, as LTP's lseek11 asks.
    assert_eq!(seek(&file, 0, hole), Ok(4096));
    // A page written through a shared mapping and not yet written back is data too:
    // the mount has the kernel write such pages back before it answers.
    let mapped = OpenOptions::new().read(true).write(true).open(f.p("f")).unwrap();
    // SAFETY: a shared mapping of 4 KiB of an open file, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            mapped.as_raw_fd(),
            2 * M as i64,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: within the mapping.
    unsafe { *(map as *mut u8).add(7) = 9 };
    // (Asked through a handle opened before: an open makes the kernel write back
    // and drop the file's pages.)
    assert_eq!(seek(&file, M + 4096, data), Ok(2 * M as i64));
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, 4096) };
    drop((file, mapped));
    let file = File::open(f.p("f")).unwrap();
    // Holes and data at 4 KiB granularity (an OST object's file system block, a
    // Data-on-MDT chunk), across stripes and components.
    let expect = [
        (0, data, Ok(0)),
        (0, hole, Ok(4096)),
        (100, hole, Ok(4096)),
        (4096, data, Ok(M)),
        (M + 10, data, Ok(M + 10)),
        (M, hole, Ok(M + 4096)),
        (M + 4096, data, Ok(2 * M)),
        (2 * M, hole, Ok(2 * M + 4096)),
        (2 * M + 4096, data, Ok(3 * M)),
        (3 * M, hole, Ok(size)),
        (3 * M + 105, data, Ok(3 * M + 105)),
        (size - 1, hole, Ok(size)),
    ];
    for (off, whence, want) in expect {
        let want = want.map(|w: u64| w as i64);
        assert_eq!(seek(&file, off, whence), want, "lseek({off}, {whence})");
    }
    assert_eq!(seek(&file, size, data), Err(libc::ENXIO));
    assert_eq!(seek(&file, size, hole), Err(libc::ENXIO));
    assert_eq!(seek(&file, 0, 5), Err(libc::EINVAL));
    // A file that is all hole: no data, the hole at once.
    let sparse = File::create(f.p("sparse")).unwrap();
    sparse.set_len(8 * M).unwrap();
    drop(sparse);
    let sparse = File::open(f.p("sparse")).unwrap();
    assert_eq!(seek(&sparse, 0, data), Err(libc::ENXIO));
    assert_eq!(seek(&sparse, 5 * M, hole), Ok(5 * M as i64));
    // An empty file has neither.
    File::create(f.p("empty")).unwrap();
    let empty = File::open(f.p("empty")).unwrap();
    assert_eq!(seek(&empty, 0, data), Err(libc::ENXIO));
    assert_eq!(seek(&empty, 0, hole), Err(libc::ENXIO));
}

/// fcntl(F_SETLK/F_GETLK) of bytes start..start+len; the result and the lock as returned.
fn lock(fd: i32, cmd: i32, ty: i32, start: i64, len: i64) -> (Result<i64, i32>, libc::flock) {
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    (l.l_type, l.l_whence, l.l_start, l.l_len) = (ty as i16, libc::SEEK_SET as i16, start, len);
    (sys(unsafe { libc::fcntl(fd, cmd, &mut l) }), l)
}

#[test]
fn flock_and_fcntl_locks_work() {
    let f = fx();
    let a = File::create(f.p("f")).unwrap().into_raw_fd();
    let b = File::open(f.p("f")).unwrap().into_raw_fd();
    let fl = |fd, op| sys(unsafe { libc::flock(fd, op) });
    assert_eq!(fl(a, libc::LOCK_EX | libc::LOCK_NB), Ok(0));
    assert_eq!(fl(b, libc::LOCK_EX | libc::LOCK_NB), Err(libc::EWOULDBLOCK));
    assert_eq!(fl(a, libc::LOCK_UN), Ok(0));
    assert_eq!(fl(b, libc::LOCK_SH | libc::LOCK_NB), Ok(0));
    // On lode, as on Lustre and NFS, flock and fcntl locks share one lock space (a
    // local file system keeps them apart), so the two kinds are checked one at a time.
    assert_eq!(fl(b, libc::LOCK_UN), Ok(0));
    assert_eq!(lock(a, libc::F_SETLK, libc::F_WRLCK, 0, 100).0, Ok(0));
    // A process's own locks never conflict with it.
    let (r, l) = lock(b, libc::F_GETLK, libc::F_RDLCK, 0, 10);
    assert_eq!((r, l.l_type), (Ok(0), libc::F_UNLCK as i16));
    assert_eq!(lock(a, libc::F_SETLK, libc::F_UNLCK, 0, 0).0, Ok(0));
    unsafe { (libc::close(a), libc::close(b)) };
}

#[test]
fn fcntl_lock_conflicts_across_processes() {
    let f = fx();
    let a = rw(f.p("f"));
    let fd = a.as_raw_fd();
    assert_eq!(lock(fd, libc::F_SETLK, libc::F_WRLCK, 0, 100).0, Ok(0));
    let seen = in_child(f.m.path(), false, || {
        let (_, l) = lock(fd, libc::F_GETLK, libc::F_WRLCK, 50, 10);
        let theirs = l.l_type == libc::F_WRLCK as i16 && l.l_pid == unsafe { libc::getppid() };
        let r = lock(fd, libc::F_SETLK, libc::F_WRLCK, 50, 10).0;
        if theirs && (r == Err(libc::EAGAIN) || r == Err(EACCES)) {
            0
        } else {
            -1
        }
    });
    assert_eq!(seen, 0, "child did not see the parent's write lock");
    let free = in_child(f.m.path(), false, || {
        lock(fd, libc::F_SETLK, libc::F_WRLCK, 200, 10)
            .0
            .unwrap_or(-1)
    });
    assert_eq!(free, 0);
}

#[test]
fn mmap_shared_writes_reach_the_file() {
    let f = fx();
    let file = rw(f.p("m"));
    file.set_len(8192).unwrap();
    file.write_all_at(b"written by write", 0).unwrap();
    unsafe {
        let (prot, fd) = (libc::PROT_READ | libc::PROT_WRITE, file.as_raw_fd());
        let p = libc::mmap(std::ptr::null_mut(), 8192, prot, libc::MAP_SHARED, fd, 0);
        let e = std::io::Error::last_os_error();
        assert_ne!(p, libc::MAP_FAILED, "mmap: {e}");
        let s = std::slice::from_raw_parts_mut(p.cast::<u8>(), 8192);
        assert_eq!(&s[..16], b"written by write");
        s[4106..4116].copy_from_slice(b"hello mmap");
        assert_eq!(sys(libc::msync(p, 8192, libc::MS_SYNC)), Ok(0));
        assert_eq!(libc::munmap(p, 8192), 0);
    }
    let mut buf = [0u8; 10];
    file.read_exact_at(&mut buf, 4106).unwrap();
    assert_eq!(&buf, b"hello mmap");
    drop(file);
    let all = fs::read(f.p("m")).unwrap();
    assert_eq!((all.len(), &all[4106..4116]), (8192, &b"hello mmap"[..]));
}

// ---- sizes, holes, big directories, long names and paths ----

#[test]
fn sparse_file_reads_zeros_in_the_hole() {
    let f = fx();
    let file = rw(f.p("s"));
    file.write_all_at(b"end", 10 << 20).unwrap();
    let m = file.metadata().unwrap();
    assert_eq!(m.len(), (10 << 20) + 3);
    assert!(m.blocks() * 512 < 1 << 20, "hole allocated: {}", m.blocks());
    let all = fs::read(f.p("s")).unwrap();
    assert!(all[..10 << 20].iter().all(|&b| b == 0));
    assert_eq!(&all[10 << 20..], b"end");
}

#[test]
fn file_larger_than_4gib() {
    let f = fx();
    let file = rw(f.p("big"));
    let (g4, g5) = (4u64 << 30, 5u64 << 30);
    file.write_all_at(b"tail", g5).unwrap();
    file.write_all_at(b"abcd", g4 - 2).unwrap();
    drop(file);
    let file = File::open(f.p("big")).unwrap();
    assert_eq!(file.metadata().unwrap().len(), g5 + 4);
    let mut buf = [1u8; 4];
    file.read_exact_at(&mut buf, g5).unwrap();
    assert_eq!(&buf, b"tail");
    file.read_exact_at(&mut buf, g4 - 2).unwrap();
    assert_eq!(&buf, b"abcd");
    let mut hole = vec![1u8; 1 << 16];
    file.read_exact_at(&mut hole, g4 + 12345).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    assert_eq!(file.read_at(&mut hole, g5 + 2).unwrap(), 2);
    assert_eq!(&hole[..2], b"il");
}

#[test]
fn directory_with_100000_entries() {
    let f = fx();
    let d = f.p("big");
    fs::create_dir(&d).unwrap();
    for i in 0..100_000 {
        File::create(d.join(format!("f{i:06}"))).unwrap();
    }
    let names: std::collections::HashSet<_> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 100_000);
    assert!(names.contains(&*std::ffi::OsString::from("f099999")));
    assert_eq!(fs::read_dir(&d).unwrap().count(), 100_000);
    assert!(d.join("f054321").is_file());
}

#[test]
fn name_of_255_bytes_works_and_256_gives_enametoolong() {
    let f = fx();
    let (ok, bad) = ("n".repeat(255), "n".repeat(256));
    fs::write(f.p(&ok), b"x").unwrap();
    assert_eq!(fs::read(f.p(&ok)).unwrap(), b"x");
    fs::create_dir(f.p(&"d".repeat(255))).unwrap();
    let lens: Vec<_> = fs::read_dir(f.m.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().len())
        .collect();
    assert_eq!(lens, [255, 255]);
    assert_eq!(ioe(File::create(f.p(&bad))), ENAMETOOLONG);
    assert_eq!(ioe(fs::create_dir(f.p(&bad))), ENAMETOOLONG);
    assert_eq!(ioe(fs::metadata(f.p(&bad))), ENAMETOOLONG);
    assert_eq!(ioe(fs::rename(f.p(&ok), f.p(&bad))), ENAMETOOLONG);
    assert_eq!(ioe(symlink("x", f.p(&bad))), ENAMETOOLONG);
}

#[test]
fn deep_paths_near_path_max() {
    let f = fx();
    let comp = "d".repeat(200);
    let mut p = f.m.path().to_path_buf();
    while p.as_os_str().len() + 201 <= 4000 {
        p.push(&comp);
        fs::create_dir(&p).unwrap();
    }
    assert!(p.as_os_str().len() > 3700);
    fs::write(p.join("file"), b"deep").unwrap();
    assert_eq!(fs::read(p.join("file")).unwrap(), b"deep");
    // Two levels more by descriptor: the tree goes deeper than PATH_MAX...
    let (e, n) = (cs("e".repeat(255)), cs("file"));
    let mut dir = open(&p, O_RDONLY | O_DIRECTORY).unwrap().into_raw_fd();
    for _ in 0..2 {
        assert_eq!(sys(unsafe { libc::mkdirat(dir, e.as_ptr(), 0o755) }), Ok(0));
        let sub = sys(unsafe { libc::openat(dir, e.as_ptr(), O_DIRECTORY) }).unwrap();
        unsafe { libc::close(dir) };
        dir = sub as i32;
    }
    let fd = sys(unsafe { libc::openat(dir, n.as_ptr(), O_CREAT | O_WRONLY, 0o644) }).unwrap();
    let r = sys(unsafe { libc::write(fd as i32, b"deeper".as_ptr().cast(), 6) });
    assert_eq!(r, Ok(6));
    unsafe { (libc::close(fd as i32), libc::close(dir)) };
    // ...but a path over PATH_MAX is refused.
    let too_long = p.join("e".repeat(255)).join("e".repeat(255)).join("file");
    assert!(too_long.as_os_str().len() > 4096);
    assert_eq!(ioe(fs::metadata(&too_long)), ENAMETOOLONG);
    assert_eq!(ioe(File::create(&too_long)), ENAMETOOLONG);
}

// ---- permission denials as uid 4242 ----

#[test]
fn user_cannot_create_in_root_owned_0755_dir() {
    let f = fx();
    fs::create_dir(f.p("d")).unwrap();
    chmod(f.p("d"), 0o755);
    let creat = |n| unsafe { libc::creat(n, 0o644) };
    assert_eq!(as_user(&f.p("d"), "f", creat), EACCES);
    let e = as_user(&f.p("d"), "sub", |n| unsafe { libc::mkdir(n, 0o755) });
    assert_eq!(e, EACCES);
    assert_eq!(fs::read_dir(f.p("d")).unwrap().count(), 0);
}

#[test]
fn user_cannot_read_root_0600_file() {
    let f = fx();
    fs::write(f.p("secret"), b"s").unwrap();
    chmod(f.p("secret"), 0o600);
    for fl in [O_RDONLY, O_WRONLY] {
        let e = as_user(f.m.path(), "secret", |n| unsafe { libc::open(n, fl) });
        assert_eq!(e, EACCES, "flags {fl}");
    }
}

#[test]
fn user_cannot_chmod_or_chown_root_file() {
    let f = fx();
    fs::write(f.p("f"), b"").unwrap();
    chmod(f.p("f"), 0o644);
    let e = as_user(f.m.path(), "f", |n| unsafe { libc::chmod(n, 0o777) });
    assert_eq!(e, EPERM);
    let e = as_user(f.m.path(), "f", |n| unsafe { libc::chown(n, UID, UID) });
    assert_eq!(e, EPERM);
    assert_eq!(mode(f.p("f")), 0o644);
}

#[test]
fn user_cannot_unlink_root_file_in_sticky_dir() {
    let f = fx();
    let s = f.p("s");
    fs::create_dir(&s).unwrap();
    chmod(&s, 0o1777);
    fs::write(f.p("s/f"), b"").unwrap();
    chmod(f.p("s/f"), 0o666);
    assert_eq!(as_user(&s, "f", |n| unsafe { libc::unlink(n) }), EPERM);
    let m = cs("mine");
    let e = as_user(&s, "f", |n| unsafe { libc::rename(n, m.as_ptr()) });
    assert_eq!(e, EPERM);
    assert!(f.p("s/f").exists());
    // Its own files it can remove.
    let own = |n| unsafe {
        if libc::close(libc::creat(n, 0o644)) < 0 {
            -1
        } else {
            libc::unlink(n)
        }
    };
    assert_eq!(as_user(&s, "mine", own), 0);
}

#[test]
fn user_can_create_in_0777_dir_and_owns_the_file() {
    let f = fx();
    let d = f.p("pub");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o777);
    assert_eq!(as_user(&d, "f", |n| unsafe { libc::creat(n, 0o640) }), 0);
    assert_eq!(as_user(&d, "d", |n| unsafe { libc::mkdir(n, 0o750) }), 0);
    for (n, m) in [("pub/f", 0o640), ("pub/d", 0o750)] {
        let got = md(f.p(n));
        let ids = (got.uid(), got.gid(), got.mode() & 0o7777);
        assert_eq!(ids, (UID, UID, m), "{n}");
    }
}
