//! Golden bytes: the wire format is frozen. A failure here means the format changed;
//! that needs a PROTO_VERSION bump, not a new expected value.

use lode_base::{Cred, Fid};
use lode_proto::*;

#[test]
fn header_bytes_are_frozen() {
    let h = Header {
        opcode: Opcode::Create as u16,
        flags: frame::FLAG_RESENT,
        tag: 3,
        status: -2,
        xid: 0x0102030405060708,
        handle: 0x1112131415161718,
        last_xid: 0x21,
        transno: 0x31,
        last_committed: 0x41,
        service_us: 0x51,
        conn_cnt: 0x61,
        pre_version: 0x71,
        op_time: -0x81,
    };
    let mut b = Vec::new();
    h.write(&mut b);
    let expect: Vec<u8> = vec![
        0x45, 0x44, 0x4f, 0x4c, // magic LODE
        0x0d, 0x00, // version (13: SETATTR names the open handle it comes through)
        0x0f, 0x00, // opcode 15
        0x02, 0x00, // flags
        0x03, 0x00, // tag
        0xfe, 0xff, 0xff, 0xff, // status -2
        0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // xid
        0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, // handle
        0x21, 0, 0, 0, 0, 0, 0, 0, // last_xid
        0x31, 0, 0, 0, 0, 0, 0, 0, // transno
        0x41, 0, 0, 0, 0, 0, 0, 0, // last_committed
        0x51, 0, 0, 0, // service_us
        0x61, 0, 0, 0, // conn_cnt
        0x71, 0, 0, 0, 0, 0, 0, 0, // pre_version
        0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // op_time -0x81
    ];
    assert_eq!(b, expect);
    assert_eq!(Header::read(&b).unwrap(), h);
}

#[test]
fn frame_bytes_are_frozen() {
    let h = Header {
        opcode: Opcode::Ping as u16,
        xid: 1,
        ..Default::default()
    };
    let f = Frame::encode(&h, &[]);
    assert_eq!(&f[..4], &84u32.to_le_bytes());
    let crc = crc32c::crc32c(&f[8..]);
    assert_eq!(&f[4..8], &crc.to_le_bytes());
    assert_eq!(f.len(), 88);
    let (d, used) = Frame::decode(&f).unwrap();
    assert_eq!(used, 88);
    assert_eq!(d.header, h);
}

#[test]
fn lookup_body_bytes_are_frozen() {
    let r = Request::Lookup(LookupReq {
        cred: Cred {
            uid: 1000,
            gid: 100,
            groups: vec![4],
        },
        parent: Fid::ROOT,
        name: b"ab".to_vec(),
    });
    assert_eq!(
        r.encode(),
        vec![
            0xe8, 0x07, // uid 1000 varint
            0x64, // gid 100
            0x01, 0x04, // groups [4]
            0x87, 0x80, 0x80, 0x80, 0x20, // seq 0x200000007 varint
            0x01, 0x00, // oid 1, ver 0
            0x02, b'a', b'b', // name
        ]
    );
    assert_eq!(
        Request::decode(Opcode::Lookup as u16, &r.encode()).unwrap(),
        r
    );
}

#[test]
fn setattr_body_bytes_are_frozen() {
    let r = Request::Setattr(SetattrReq {
        cred: Cred::root(),
        fid: Fid::ROOT,
        attr: lode_base::SetAttr {
            size: Some(5),
            ..Default::default()
        },
        opened_for_write: true,
        handle: 9,
    });
    assert_eq!(
        r.encode(),
        vec![
            0x00, 0x00, 0x00, // uid 0, gid 0, no groups
            0x87, 0x80, 0x80, 0x80, 0x20, // seq 0x200000007 varint
            0x01, 0x00, // oid 1, ver 0
            0x00, 0x00, 0x00, // mode, uid, gid: none
            0x01, 0x05, // size 5
            0x00, 0x00, 0x00, // atime, mtime, flags: none
            0x01, // opened_for_write
            0x09, // handle 9
        ]
    );
    assert_eq!(
        Request::decode(Opcode::Setattr as u16, &r.encode()).unwrap(),
        r
    );
}

#[test]
fn statfs_reply_bytes_are_frozen() {
    let r = Reply::Statfs(StatfsRep {
        bsize: 4096,
        blocks: 10,
        bfree: 5,
        bavail: 4,
        files: 3,
        ffree: 2,
        namelen: 255,
        space_id: 7,
    });
    assert_eq!(r.encode(), vec![0x80, 0x20, 10, 5, 4, 3, 2, 0xff, 0x01, 7]);
}

#[test]
fn connect_body_round_trips() {
    let r = Request::Connect(ConnectReq {
        fsname: "lode".into(),
        target: "lode-MDT0000".into(),
        client_uuid: "u".into(),
        flags: CONNECT_SUPPORTED,
        max_mod_rpcs: 7,
        auth: vec![],
    });
    assert_eq!(Request::decode(1, &r.encode()).unwrap(), r);
    assert!(Request::decode(9999, &r.encode()).is_err());
}
