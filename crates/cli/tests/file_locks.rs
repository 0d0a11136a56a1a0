//! fcntl record locks across clients: the MDT keeps them for every mount and native
//! client of a file, so a lock taken on one mount blocks (or fails) a conflicting one
//! on another, a wait is granted when the holder unlocks, a cycle of waits across
//! mounts is EDEADLK, and a holder's death releases its locks.

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
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let [rd, wr] = fds;
    let cpath = cs(&path);
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // The holder: lock, say so, and wait to be killed.
        unsafe {
            let fd = libc::open(cpath.as_ptr(), libc::O_RDWR);
            let mut l: libc::flock = std::mem::zeroed();
            (l.l_type, l.l_whence) = (libc::F_WRLCK as i16, libc::SEEK_SET as i16);
            let ok = fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &mut l) == 0;
            libc::write(wr, [u8::from(ok)].as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
    }
    let mut said = [0u8];
    assert_eq!(unsafe { libc::read(rd, said.as_mut_ptr().cast(), 1) }, 1);
    assert_eq!(said[0], 1, "the child took the lock");
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
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
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
