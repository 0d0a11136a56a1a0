//! Arbitrary bytes never panic the decoders and never make them allocate beyond
//! `rpc_size_max`.

use lode_base::limits::RPC_SIZE_MAX;
use lode_proto::frame::check_len;
use lode_proto::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Frame::decode(&bytes);
    }

    #[test]
    fn random_bodies_never_panic(op in 0u16..80, bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Request::decode(op, &bytes);
        let _ = Reply::decode(op, &bytes);
    }

    #[test]
    fn truncated_frames_are_refused(cut in 0usize..72) {
        let f = Frame::encode(&Header { opcode: 3, xid: 7, ..Default::default() }, &[]);
        prop_assert!(Frame::decode(&f[..cut]).is_err());
    }

    #[test]
    fn flipped_bits_are_caught(pos in 4usize..72, bit in 0u8..8) {
        let mut f = Frame::encode(&Header { opcode: 3, xid: 7, ..Default::default() }, &[]);
        f[pos] ^= 1 << bit;
        prop_assert!(Frame::decode(&f).is_err());
    }

    #[test]
    fn huge_vec_lengths_do_not_allocate(len in 1u64 << 40..u64::MAX) {
        // A body whose vec length claims terabytes must fail, not allocate.
        let mut b = vec![0u8, 0u8]; // uid 0, gid 0, then the groups length
        let mut v = len;
        while v >= 0x80 { b.push((v as u8) | 0x80); v >>= 7; }
        b.push(v as u8);
        prop_assert!(Request::decode(Opcode::Getattr as u16, &b).is_err());
    }
}

#[test]
fn oversized_length_is_refused_before_allocation() {
    assert!(check_len((RPC_SIZE_MAX + 1) as u32).is_err());
    assert!(check_len(u32::MAX).is_err());
    assert!(check_len(3).is_err());
    let mut f = (u32::MAX).to_le_bytes().to_vec();
    f.extend_from_slice(&[0; 80]);
    assert!(matches!(Frame::decode(&f), Err(FrameError::Length(_))));
}
