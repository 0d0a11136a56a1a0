//! Fault injection, Lustre's `fail_loc` / `fail_val`: named points in the code check a
//! process-wide location and act when it matches. Set with `lode set-param fail_loc=…`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Drop the next matching request without executing it (no reply).
pub const DROP_REQUEST: u32 = 0x101;
/// Execute the next matching request but drop its reply.
pub const DROP_REPLY: u32 = 0x102;
/// Delay every reply by `fail_val` milliseconds.
pub const DELAY_REPLY: u32 = 0x103;
/// Delay executing the next matching modify request by `fail_val` milliseconds, on the
/// thread that runs it (a slow MDT).
pub const DELAY_EXEC: u32 = 0x104;
/// The MDS process dies (as `kill -9`) after executing the next matching modification,
/// before it is committed or answered.
pub const MDS_ABORT_BEFORE_COMMIT: u32 = 0x105;
/// The MDS process dies after the next matching modification is committed, before it
/// is answered.
pub const MDS_ABORT_AFTER_COMMIT: u32 = 0x106;
/// The MDS process dies in recovery, before executing a replay (with `SKIP` and
/// `fail_val` N: before replay N + 1).
pub const MDS_ABORT_IN_RECOVERY: u32 = 0x107;
/// The MDS drops the next CONNECT (no answer: the client tries again).
pub const MDS_DROP_CONNECT: u32 = 0x108;
/// Make the store's next WAL sync fail (the target must stop).
pub const STORE_SYNC_FAIL: u32 = 0x201;
/// Make the store's next batch write fail (the target must stop).
pub const STORE_WRITE_FAIL: u32 = 0x202;
/// Stall each WAL sync of the store by `fail_val` milliseconds (a slow disk).
pub const STORE_SYNC_DELAY: u32 = 0x203;
/// Make the OST's next fsync of an object fail (as EIO: a disk error).
pub const OST_SYNC_FAIL: u32 = 0x204;
/// Flag bit: act once, then clear `fail_loc` (Lustre's `CFS_FAIL_ONCE`).
pub const ONCE: u32 = 0x8000_0000;
/// Flag bit: let the first `fail_val` matches pass, then act on every one after
/// (Lustre's `CFS_FAIL_SKIP`).
pub const SKIP: u32 = 0x2000_0000;
/// Flag bit: act on the first `fail_val` matches, then clear `fail_loc` (Lustre's
/// `CFS_FAIL_SOME`).
pub const SOME: u32 = 0x1000_0000;
/// Flag bit: act on every `fail_val`-th match. Lustre's `CFS_FAIL_RAND` bit, but
/// deterministic (1 in N, not at random), so a test repeats.
pub const EVERY: u32 = 0x0800_0000;
const FLAGS: u32 = ONCE | SKIP | SOME | EVERY;

static FAIL_LOC: AtomicU32 = AtomicU32::new(0);
static FAIL_VAL: AtomicU32 = AtomicU32::new(0);
/// Matches seen since `fail_loc` was last set.
static FAIL_COUNT: AtomicU64 = AtomicU64::new(0);
/// Only requests of this opcode match (0: any).
static FAIL_OPC: AtomicU32 = AtomicU32::new(0);
static RPC_DELAY_US: AtomicU64 = AtomicU64::new(0);

/// Sets `fail_loc` (and starts counting matches again).
pub fn set_loc(v: u32) {
    FAIL_COUNT.store(0, Ordering::SeqCst);
    FAIL_LOC.store(v, Ordering::SeqCst);
}

/// Sets `fail_opc`: the fault points that see a request act only on this opcode (0:
/// any).
pub fn set_opc(v: u32) {
    FAIL_OPC.store(v, Ordering::SeqCst);
}

/// Current `fail_opc`.
pub fn opc() -> u32 {
    FAIL_OPC.load(Ordering::Relaxed)
}

/// Current `fail_loc`.
pub fn loc() -> u32 {
    FAIL_LOC.load(Ordering::Relaxed)
}

/// Sets `fail_val`.
pub fn set_val(v: u32) {
    FAIL_VAL.store(v, Ordering::SeqCst);
}

/// Current `fail_val`.
pub fn val() -> u32 {
    FAIL_VAL.load(Ordering::Relaxed)
}

/// Injected latency added before every reply, emulating a network (µs).
pub fn set_rpc_delay_us(us: u64) {
    RPC_DELAY_US.store(us, Ordering::Relaxed);
}

/// The injected per-RPC latency (µs).
pub fn rpc_delay_us() -> u64 {
    RPC_DELAY_US.load(Ordering::Relaxed)
}

/// True if point `id` should fail now, by `fail_loc`'s flags: `ONCE` fires exactly
/// once, `SOME` the first `fail_val` times, `SKIP` after the first `fail_val`, `EVERY`
/// on every `fail_val`-th match; no flag, every time.
pub fn check(id: u32) -> bool {
    let cur = FAIL_LOC.load(Ordering::Relaxed);
    if cur == 0 || cur & !FLAGS != id {
        return false;
    }
    let n = FAIL_COUNT.fetch_add(1, Ordering::SeqCst) + 1;
    let val = u64::from(val());
    let fire = if cur & SKIP != 0 {
        n > val
    } else if cur & EVERY != 0 {
        val != 0 && n.is_multiple_of(val)
    } else {
        true
    };
    if !fire {
        return false;
    }
    let last = if cur & ONCE != 0 {
        true
    } else if cur & SOME != 0 {
        n >= val
    } else {
        false
    };
    if last {
        // Only one thread clears it, and only it reports the last firing.
        return FAIL_LOC
            .compare_exchange(cur, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    }
    true
}

/// Like [`check`], for a point that sees a request: with `fail_opc` set, only requests
/// of that opcode match.
pub fn check_op(id: u32, opcode: u16) -> bool {
    let want = opc();
    if want != 0 && want != u32::from(opcode) {
        return false;
    }
    check(id)
}

/// A fault-injection parameter: a number in `0..=max`.
const fn param<C: ?Sized>(
    name: &'static str,
    help: &'static str,
    max: u64,
    get: fn(&C) -> String,
    f: fn(&C, u64) -> Result<(), String>,
) -> crate::admin::Param<C> {
    crate::admin::Param {
        name,
        help,
        get,
        set: crate::admin::Set::Num { min: 0, max, f },
    }
}

/// `fail_loc`, `fail_val`, `fail_opc` and `rpc_delay_us`, the fault-injection
/// parameters every server has, for a registry over any context.
pub const fn params<C: ?Sized>() -> [crate::admin::Param<C>; 4] {
    const U32: u64 = u32::MAX as u64;
    [
        param(
            "fail_loc",
            "fault point to act on, with Lustre's ONCE/SKIP/SOME flags (0: none)",
            U32,
            |_| format!("{:#x}", loc()),
            |_, v| {
                set_loc(v as u32);
                Ok(())
            },
        ),
        param(
            "fail_val",
            "the fault point's argument (milliseconds, or a count for SKIP/SOME/EVERY)",
            U32,
            |_| val().to_string(),
            |_, v| {
                set_val(v as u32);
                Ok(())
            },
        ),
        param(
            "fail_opc",
            "only requests of this opcode meet the fault point (0: any)",
            u16::MAX as u64,
            |_| opc().to_string(),
            |_, v| {
                set_opc(v as u32);
                Ok(())
            },
        ),
        param(
            "rpc_delay_us",
            "hold every reply this long (emulated network latency, server side)",
            10_000_000,
            |_| rpc_delay_us().to_string(),
            |_, v| {
                set_rpc_delay_us(v);
                Ok(())
            },
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test for all flags: `fail_loc` is process-wide.
    #[test]
    fn flags_like_lustre() {
        set_val(3);
        set_loc(DROP_REPLY | SKIP);
        let fired: Vec<bool> = (0..5).map(|_| check(DROP_REPLY)).collect();
        assert_eq!(fired, [false, false, false, true, true], "skip 3");
        set_loc(DROP_REPLY | SOME);
        let fired: Vec<bool> = (0..5).map(|_| check(DROP_REPLY)).collect();
        assert_eq!(fired, [true, true, true, false, false], "the first 3");
        assert_eq!(loc(), 0, "SOME clears itself");
        set_loc(DROP_REPLY | EVERY);
        let fired: Vec<bool> = (0..6).map(|_| check(DROP_REPLY)).collect();
        assert_eq!(fired, [false, false, true, false, false, true], "every 3rd");
        set_opc(7);
        assert!(!check_op(DROP_REPLY, 8), "another opcode does not match");
        set_loc(DROP_REPLY | ONCE);
        assert!(!check_op(DROP_REPLY, 8));
        assert!(check_op(DROP_REPLY, 7));
        assert!(!check_op(DROP_REPLY, 7), "once");
        set_opc(0);
        set_val(0);
        once_fires_once_body();
    }

    fn once_fires_once_body() {
        set_loc(DROP_REPLY | ONCE);
        assert!(!check(DROP_REQUEST));
        assert!(check(DROP_REPLY));
        assert!(!check(DROP_REPLY));
        assert_eq!(loc(), 0);
    }
}
