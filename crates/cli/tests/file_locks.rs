//! fcntl record locks and flock(2) locks across clients: the MDT keeps them for every
//! mount and native client of a file, so a lock taken on one mount blocks (or fails) a
//! conflicting one on another, a wait is granted when the holder unlocks, a signal
//! ends a wait, a cycle of waits across mounts is EDEADLK, and a holder's death
//! releases its locks. `localflock` mounts keep theirs to themselves.

mod common;

use common::*;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// fcntl(`cmd`) of bytes start..start+len: the result and the lock as returned.
fn lock(f: &File, cmd: i32, ty: i32, start: i64, len: i64) -> (Result<(), i32>, libc::flock) {
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    (l.l_type, l.l_whence, l.l_start, l.l_len) = (ty as i16, libc::SEEK_SET as i16, start, len);
    let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut l) };
    let r = if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(())
    };
    (r, l)
}

fn rw(p: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .expect("open")
}

/// Runs `f` on a thread; its result, or `None` if it has not returned within `d`.
fn within<T: Send + 'static>(d: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(d).ok()
}

/// A forked process that runs `body`, writes the byte it returns to a pipe, then waits
/// to be killed (by [`Child::kill`], or when dropped).
struct Child {
    pid: i32,
    rd: i32,
}

impl Child {
    fn fork(body: impl FnOnce() -> u8) -> Child {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let [rd, wr] = fds;
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let said = body();
            unsafe {
                libc::write(wr, [said].as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
        }
        Child { pid, rd }
    }

    /// The byte it wrote, if it did within `ms` milliseconds.
    fn said(&self, ms: i32) -> Option<u8> {
        let mut pfd = libc::pollfd {
            fd: self.rd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut said = [0u8];
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) } == 1;
        (ready && unsafe { libc::read(self.rd, said.as_mut_ptr().cast(), 1) } == 1)
            .then_some(said[0])
    }

    fn kill(&mut self) {
        if self.pid > 0 {
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
            self.pid = 0;
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
        unsafe { libc::close(self.rd) };
    }
}

#[test]
fn a_lock_on_one_mount_blocks_another_until_released() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let fa = rw(&a.path().join("f"));
    let fb = rw(&b.path().join("f"));
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 100).0, Ok(()));
    assert_eq!(
        lock(&fb, libc::F_SETLK, libc::F_RDLCK, 50, 10).0,
        Err(libc::EAGAIN)
    );
    let (r, l) = lock(&fb, libc::F_GETLK, libc::F_RDLCK, 50, 10);
    assert_eq!(r, Ok(()));
    assert_eq!(
        (l.l_type, l.l_start, l.l_len),
        (libc::F_WRLCK as i16, 0, 100)
    );
    // Bytes nobody holds are free.
    assert_eq!(lock(&fb, libc::F_SETLK, libc::F_WRLCK, 100, 10).0, Ok(()));
    // A waiting lock on B is granted when A unlocks.
    let waiter = std::thread::spawn(move || {
        let r = lock(&fb, libc::F_SETLKW, libc::F_WRLCK, 0, 10).0;
        (r, fb)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "B waits while A holds the lock");
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_UNLCK, 0, 0).0, Ok(()));
    let (r, fb) = waiter.join().expect("waiter");
    assert_eq!(r, Ok(()));
    // Now A is the one refused, and closing B's file drops B's locks.
    assert_eq!(
        lock(&fa, libc::F_SETLK, libc::F_WRLCK, 5, 1).0,
        Err(libc::EAGAIN)
    );
    drop(fb);
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 0).0, Ok(()));
}

#[test]
fn a_cycle_of_waits_across_mounts_is_edeadlk() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let (fa1, fb2) = (rw(&a.path().join("one")), rw(&b.path().join("two")));
    assert_eq!(lock(&fa1, libc::F_SETLK, libc::F_WRLCK, 0, 1).0, Ok(()));
    assert_eq!(lock(&fb2, libc::F_SETLK, libc::F_WRLCK, 0, 1).0, Ok(()));
    // A waits for B's lock on "two"...
    let fa2 = rw(&a.path().join("two"));
    let a_waits = std::thread::spawn(move || lock(&fa2, libc::F_SETLKW, libc::F_WRLCK, 0, 1).0);
    std::thread::sleep(Duration::from_millis(300));
    // ...so B waiting for A's lock on "one" would never end.
    let fb1 = rw(&b.path().join("one"));
    assert_eq!(
        lock(&fb1, libc::F_SETLKW, libc::F_WRLCK, 0, 1).0,
        Err(libc::EDEADLK)
    );
    assert_eq!(lock(&fb2, libc::F_SETLK, libc::F_UNLCK, 0, 0).0, Ok(()));
    assert_eq!(a_waits.join().expect("A's wait"), Ok(()));
}

#[test]
fn a_killed_holder_releases_its_locks_and_a_native_client_contends_too() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let path = a.path().join("f");
    drop(rw(&path));
    let cpath = cs(&path);
    // The holder: lock, say so, and wait to be killed.
    let mut holder = Child::fork(|| unsafe {
        let fd = libc::open(cpath.as_ptr(), libc::O_RDWR);
        let mut l: libc::flock = std::mem::zeroed();
        (l.l_type, l.l_whence) = (libc::F_WRLCK as i16, libc::SEEK_SET as i16);
        u8::from(fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &mut l) == 0)
    });
    assert_eq!(holder.said(-1), Some(1), "the child took the lock");
    let fb = rw(&b.path().join("f"));
    assert_eq!(
        lock(&fb, libc::F_SETLK, libc::F_WRLCK, 0, 0).0,
        Err(libc::EAGAIN)
    );
    // A native client is refused as well.
    let s = c.client();
    let fid = fid(&s, "/f").expect("fid");
    let args = lode_client::FlockArgs {
        fid,
        owner: 77,
        pid: 77,
        typ: libc::F_RDLCK as u32,
        start: 0,
        end: u64::MAX,
        wait: false,
        test: false,
    };
    assert_eq!(s.run(s.client.flock(&args)), Err(lode_base::Errno::EAGAIN));
    holder.kill();
    let got = within(Duration::from_secs(30), move || {
        lock(&fb, libc::F_SETLKW, libc::F_WRLCK, 0, 0).0
    });
    assert_eq!(got, Some(Ok(())), "the dead holder's lock was released");
}

#[test]
fn locks_held_across_an_mds_power_cut_are_held_again_and_a_wait_survives_it() {
    let mut c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let fa = rw(&a.path().join("f"));
    let fb = rw(&b.path().join("f"));
    // A holds bytes 0-39 and 60-99 (an unlock split its lock) and 200-299 shared.
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 100).0, Ok(()));
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_UNLCK, 40, 20).0, Ok(()));
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_RDLCK, 200, 100).0, Ok(()));
    let fb2 = fb.try_clone().expect("dup");
    let waiter = std::thread::spawn(move || lock(&fb2, libc::F_SETLKW, libc::F_WRLCK, 0, 10).0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "B waits while A holds the lock");

    restart_mds(&mut c, &[]);
    let status = wait_recovered(&c);
    assert_eq!(status_field(&status, "replayed_locks"), "3", "{status}");
    assert_eq!(
        status_field(&status, "completed_clients"),
        "2/2",
        "{status}"
    );

    assert!(!waiter.is_finished(), "B still waits after the restart");
    // What A held is held again; what it had let go of is free.
    assert_eq!(
        lock(&fb, libc::F_SETLK, libc::F_RDLCK, 70, 1).0,
        Err(libc::EAGAIN)
    );
    assert_eq!(
        lock(&fb, libc::F_SETLK, libc::F_WRLCK, 250, 1).0,
        Err(libc::EAGAIN)
    );
    assert_eq!(lock(&fb, libc::F_SETLK, libc::F_RDLCK, 250, 1).0, Ok(()));
    assert_eq!(lock(&fb, libc::F_SETLK, libc::F_WRLCK, 45, 10).0, Ok(()));
    // A lets go of everything: B's wait from before the restart is granted.
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_UNLCK, 0, 0).0, Ok(()));
    let granted = within(Duration::from_secs(10), move || waiter.join());
    assert!(matches!(granted, Some(Ok(Ok(())))), "B's wait: {granted:?}");
}

fn flock(f: &File, op: i32) -> Result<(), i32> {
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

#[test]
fn flock_holds_across_mounts_until_the_last_close_of_its_open_file() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let fa = rw(&a.path().join("f"));
    let fb = rw(&b.path().join("f"));
    assert_eq!(flock(&fa, libc::LOCK_SH | libc::LOCK_NB), Ok(()));
    // Shared locks share; an exclusive one waits for them.
    assert_eq!(flock(&fb, libc::LOCK_SH | libc::LOCK_NB), Ok(()));
    assert_eq!(flock(&fb, libc::LOCK_UN), Ok(()));
    assert_eq!(flock(&fa, libc::LOCK_EX | libc::LOCK_NB), Ok(()), "upgrade");
    assert_eq!(
        flock(&fb, libc::LOCK_SH | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
    // A second open file on the same mount, in the same process, is another holder.
    let fa2 = rw(&a.path().join("f"));
    assert_eq!(
        flock(&fa2, libc::LOCK_EX | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
    // B waits until A's open file is closed: the close ends its lock.
    let waiter = std::thread::spawn(move || (flock(&fb, libc::LOCK_EX), fb));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "B waits while A holds the lock");
    drop(fa);
    let (r, fb) = waiter.join().expect("waiter");
    assert_eq!(r, Ok(()));
    assert_eq!(
        flock(&fa2, libc::LOCK_SH | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
    // As on Lustre and NFS, a flock is a whole-file lock in the same space as fcntl
    // locks: B's flock refuses A's fcntl lock of any byte.
    assert_eq!(
        lock(&fa2, libc::F_SETLK, libc::F_RDLCK, 1 << 40, 1).0,
        Err(libc::EAGAIN)
    );
    // A duplicate descriptor shares the open file: closing it ends nothing.
    let dup = fb.try_clone().expect("dup");
    drop(dup);
    assert_eq!(
        flock(&fa2, libc::LOCK_SH | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
    // B's last close ends its lock. The kernel does not wait for a FUSE RELEASE, so
    // another mount may see the lock go a round trip after close(2) returned: A waits.
    drop(fb);
    let got = within(Duration::from_secs(10), move || flock(&fa2, libc::LOCK_EX));
    assert_eq!(got, Some(Ok(())));
}

#[test]
fn on_one_mount_a_flock_is_free_as_soon_as_close_returns() {
    let c = cluster(1);
    let a = c.mount();
    let p = a.path().join("f");
    let other = rw(&p);
    // Each round's locks go with an asynchronous RELEASE; the next open file's
    // attempt, on the same mount, must never see them.
    let rounds = |n: usize, take: &dyn Fn(&File) -> Result<(), i32>| {
        for round in 0..n {
            let f = rw(&p);
            assert_eq!(take(&f), Ok(()), "round {round}");
            drop(f);
            let ex = flock(&other, libc::LOCK_EX | libc::LOCK_NB);
            assert_eq!(ex, Ok(()), "round {round}");
            assert_eq!(flock(&other, libc::LOCK_UN), Ok(()));
        }
    };
    rounds(300, &|f| flock(f, libc::LOCK_EX | libc::LOCK_NB));
    // An open file holding a flock and its process's fcntl lock: the close ends both.
    rounds(50, &|f| {
        flock(f, libc::LOCK_SH | libc::LOCK_NB)?;
        lock(f, libc::F_SETLK, libc::F_RDLCK, 0, 10).0
    });
    // And a process's fcntl test sees no lock that a close ended.
    let f = rw(&p);
    assert_eq!(flock(&f, libc::LOCK_EX | libc::LOCK_NB), Ok(()));
    drop(f);
    let (r, l) = lock(&other, libc::F_GETLK, libc::F_WRLCK, 0, 0);
    assert_eq!((r, l.l_type), (Ok(()), libc::F_UNLCK as i16));
}

#[test]
fn an_ofd_lock_goes_with_the_last_close_of_its_open_file_and_only_then() {
    // xfstests generic/478: an F_OFD_SETLK lock belongs to the open file description,
    // which the kernel names in no RELEASE.
    let c = cluster(1);
    let a = c.mount();
    let p = a.path().join("f");
    let b = rw(&p);
    let ofd = |f: &File, ty: i32, start: i64| lock(f, libc::F_OFD_SETLK, ty, start, 10).0;
    for round in 0..20 {
        let f = rw(&p);
        assert_eq!(ofd(&f, libc::F_WRLCK, 0), Ok(()), "round {round}");
        // Another open file conflicts, even in the same process.
        assert_eq!(
            ofd(&b, libc::F_WRLCK, 5),
            Err(libc::EAGAIN),
            "round {round}"
        );
        drop(f);
        assert_eq!(
            ofd(&b, libc::F_WRLCK, 5),
            Ok(()),
            "round {round}: the close freed it"
        );
        assert_eq!(ofd(&b, libc::F_UNLCK, 5), Ok(()));
    }
    // A process's fcntl lock taken after it closed another open file of the file (whose
    // RELEASE follows in the background) stays.
    let m2 = c.mount();
    let other = rw(&m2.path().join("f"));
    let f1 = rw(&p);
    assert_eq!(lock(&f1, libc::F_SETLK, libc::F_WRLCK, 0, 10).0, Ok(()));
    drop(f1);
    let f2 = rw(&p);
    assert_eq!(lock(&f2, libc::F_SETLK, libc::F_WRLCK, 0, 10).0, Ok(()));
    std::thread::sleep(Duration::from_millis(200));
    let (r, l) = lock(&other, libc::F_GETLK, libc::F_WRLCK, 0, 10);
    assert_eq!((r, l.l_type), (Ok(()), libc::F_WRLCK as i16));
}

extern "C" fn on_alarm(_: i32) {}

#[test]
fn a_signal_ends_a_lock_wait_and_the_waiter_keeps_its_other_locks() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let fa = rw(&a.path().join("f"));
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 100).0, Ok(()));
    let path = cs(b.path().join("f"));
    // The waiter, on mount B: holds bytes 200-209, then waits for A's bytes until an
    // alarm (a handler without SA_RESTART) ends the wait with EINTR.
    let waiter = Child::fork(|| unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDWR);
        let mut l: libc::flock = std::mem::zeroed();
        (l.l_type, l.l_whence, l.l_start, l.l_len) =
            (libc::F_WRLCK as i16, libc::SEEK_SET as i16, 200, 10);
        let held = fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &mut l) == 0;
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as usize;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        libc::alarm(1);
        (l.l_start, l.l_len) = (0, 10);
        let r = libc::fcntl(fd, libc::F_SETLKW, &mut l);
        let e = *libc::__errno_location();
        u8::from(held) + 2 * u8::from(r < 0 && e == libc::EINTR)
    });
    let said = waiter.said(20_000);
    assert!(
        said.is_some(),
        "the waiter's F_SETLKW did not end within 20 s of its alarm"
    );
    assert_eq!(
        said,
        Some(3),
        "the waiter held its bytes (1) and got EINTR (2)"
    );
    // Its other lock is still held, and the cancelled wait never becomes a lock.
    let (r, l) = lock(&fa, libc::F_GETLK, libc::F_WRLCK, 200, 10);
    assert_eq!(r, Ok(()));
    assert_eq!((l.l_type, l.l_pid), (libc::F_WRLCK as i16, waiter.pid));
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_UNLCK, 0, 0).0, Ok(()));
    std::thread::sleep(Duration::from_millis(200));
    let (r, l) = lock(&fa, libc::F_GETLK, libc::F_WRLCK, 0, 100);
    assert_eq!((r, l.l_type), (Ok(()), libc::F_UNLCK as i16));
}

#[test]
fn a_killed_waiter_never_holds_the_lock_it_waited_for() {
    let c = cluster(1);
    let (a, b) = (c.mount(), c.mount());
    let fa = rw(&a.path().join("f"));
    assert_eq!(flock(&fa, libc::LOCK_EX), Ok(()));
    let path = cs(b.path().join("f"));
    let mut waiter = Child::fork(|| unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDWR);
        libc::flock(fd, libc::LOCK_EX);
        0
    });
    std::thread::sleep(Duration::from_millis(500));
    waiter.kill();
    std::thread::sleep(Duration::from_millis(200));
    drop(fa);
    // Nobody holds the file now: a third open file takes it as soon as A's RELEASE
    // (which the kernel does not wait for, on another mount) has reached the MDT.
    let fb = rw(&b.path().join("f"));
    let got = within(Duration::from_secs(20), move || {
        let end = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let r = flock(&fb, libc::LOCK_EX | libc::LOCK_NB);
            if r.is_ok() || std::time::Instant::now() > end {
                return (r, fb);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    assert_eq!(got.map(|g| g.0), Some(Ok(())));
}

#[test]
fn localflock_mounts_keep_their_locks_to_themselves() {
    let c = cluster(1);
    let (a, b) = (c.mount_with(&["localflock"]), c.mount());
    let fa = rw(&a.path().join("f"));
    let fb = rw(&b.path().join("f"));
    assert_eq!(flock(&fa, libc::LOCK_EX | libc::LOCK_NB), Ok(()));
    assert_eq!(lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 0).0, Ok(()));
    // Mount B does not see A's locks (its own flock and fcntl locks share the
    // cluster's lock space, so one at a time)...
    assert_eq!(flock(&fb, libc::LOCK_EX | libc::LOCK_NB), Ok(()));
    assert_eq!(flock(&fb, libc::LOCK_UN), Ok(()));
    assert_eq!(lock(&fb, libc::F_SETLK, libc::F_WRLCK, 0, 0).0, Ok(()));
    // ...but A's kernel keeps them on A.
    let fa2 = rw(&a.path().join("f"));
    assert_eq!(
        flock(&fa2, libc::LOCK_EX | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
}
