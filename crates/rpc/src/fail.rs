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
/// Make the store's next WAL sync fail (the target must stop).
pub const STORE_SYNC_FAIL: u32 = 0x201;
/// Make the store's next batch write fail (the target must stop).
pub const STORE_WRITE_FAIL: u32 = 0x202;
/// Stall each WAL sync of the store by `fail_val` milliseconds (a slow disk).
pub const STORE_SYNC_DELAY: u32 = 0x203;
/// Flag bit: act once, then clear `fail_loc` (Lustre's `CFS_FAIL_ONCE`).
pub const ONCE: u32 = 0x8000_0000;

static FAIL_LOC: AtomicU32 = AtomicU32::new(0);
static FAIL_VAL: AtomicU32 = AtomicU32::new(0);
static RPC_DELAY_US: AtomicU64 = AtomicU64::new(0);

/// Sets `fail_loc`.
pub fn set_loc(v: u32) {
    FAIL_LOC.store(v, Ordering::SeqCst);
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

/// True if point `id` should fail now; a `ONCE` location fires exactly once.
pub fn check(id: u32) -> bool {
    let cur = FAIL_LOC.load(Ordering::Relaxed);
    if cur == 0 || cur & !ONCE != id {
        return false;
    }
    if cur & ONCE != 0 {
        return FAIL_LOC
            .compare_exchange(cur, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_fires_once() {
        set_loc(DROP_REPLY | ONCE);
        assert!(!check(DROP_REQUEST));
        assert!(check(DROP_REPLY));
        assert!(!check(DROP_REPLY));
        assert_eq!(loc(), 0);
    }
}
