//! What became of the thread that made a request, read from `/proc/TID/status`: fuser
//! does not pass on the kernel's FUSE_INTERRUPT, so a lock wait asks for itself
//! whether its caller has a signal to take (then the kernel would have interrupted it)
//! or is gone.

/// The calling thread's state, as far as a lock wait cares.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Caller {
    /// Waiting as before.
    Waiting,
    /// A signal it takes is pending: answer `EINTR` (the kernel restarts the call
    /// after the handler if the handler asked for it).
    Signalled,
    /// Exited, or killed and exiting: nobody is there to get the answer.
    Gone,
}

const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);

/// The state of thread `tid` (in this process's PID namespace; 0: unknown, treated as
/// waiting).
pub(crate) fn caller(tid: u32) -> Caller {
    if tid == 0 {
        return Caller::Waiting;
    }
    match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(s) => parse(&s),
        // Only a thread killed while it waited can vanish; a /proc this process
        // cannot read (none mounted, or another PID namespace's) says nothing.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && proc_readable() => Caller::Gone,
        Err(_) => Caller::Waiting,
    }
}

/// Whether this process sees a /proc at all.
fn proc_readable() -> bool {
    std::fs::metadata("/proc/self/status").is_ok()
}

/// [`caller`] from the text of a status file.
fn parse(status: &str) -> Caller {
    let mut pending = 0;
    let mut shared = 0;
    let (mut blocked, mut ignored, mut threads) = (0, 0, 0);
    for line in status.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        let hex = || u64::from_str_radix(v, 16).unwrap_or(0);
        match k {
            "State" if v.starts_with('Z') || v.starts_with('X') => return Caller::Gone,
            "SigPnd" => pending = hex(),
            "ShdPnd" => shared = hex(),
            "SigBlk" => blocked = hex(),
            "SigIgn" => ignored = hex(),
            "Threads" => threads = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    if (pending | shared) & SIGKILL_BIT != 0 {
        return Caller::Gone;
    }
    // A signal sent to the whole process wakes this thread only if it is the only
    // one; in a threaded process another thread may take it, and answering EINTR to
    // a thread with nothing pending would leak ERESTARTSYS to the program.
    let mut deliverable = pending;
    if threads == 1 {
        deliverable |= shared;
    }
    if deliverable & !blocked & !ignored != 0 {
        Caller::Signalled
    } else {
        Caller::Waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: &str, threads: u32, pnd: u64, shd: u64, blk: u64, ign: u64) -> String {
        format!(
            "Name:\tflock\nState:\t{state}\nTgid:\t42\nThreads:\t{threads}\n\
             SigQ:\t0/95000\nSigPnd:\t{pnd:016x}\nShdPnd:\t{shd:016x}\n\
             SigBlk:\t{blk:016x}\nSigIgn:\t{ign:016x}\nSigCgt:\t0000000000004000\n"
        )
    }

    const ALRM: u64 = 1 << (libc::SIGALRM - 1);

    #[test]
    fn a_pending_signal_it_takes_interrupts_it_and_a_killed_caller_is_gone() {
        use Caller::*;
        let (s, kill) = ("S (sleeping)", SIGKILL_BIT);
        // (state, threads, pending, shared pending, blocked, ignored): the verdict.
        let cases = [
            ((s, 1, 0, 0, 0, 0), Waiting),
            ((s, 1, ALRM, 0, 0, 0), Signalled),
            ((s, 1, 0, ALRM, 0, 0), Signalled),
            // Blocked or ignored: the kernel would not interrupt it either.
            ((s, 1, ALRM, 0, ALRM, 0), Waiting),
            ((s, 1, 0, ALRM, 0, ALRM), Waiting),
            // Sent to a threaded process: another thread may take it.
            ((s, 3, 0, ALRM, 0, 0), Waiting),
            ((s, 3, ALRM, 0, 0, 0), Signalled),
            ((s, 1, 0, kill, 0, 0), Gone),
            ((s, 4, kill, 0, 0, 0), Gone),
            (("Z (zombie)", 1, 0, 0, 0, 0), Gone),
        ];
        for ((st, threads, pnd, shd, blk, ign), want) in cases {
            let text = status(st, threads, pnd, shd, blk, ign);
            assert_eq!(parse(&text), want, "{text}");
        }
        assert_eq!(caller(u32::MAX), Caller::Gone);
        assert_eq!(caller(0), Caller::Waiting);
        assert_eq!(caller(std::process::id()), Caller::Waiting);
    }
}
