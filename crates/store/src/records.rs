//! On-disk keys and records of the MDT. Every record starts with a format byte;
//! golden tests pin the bytes.

use crate::engine::StoreError;
use lode_base::perm::map_bits;
use lode_base::{Attr, Fid, Layout};
use serde::{Deserialize, Serialize};

/// Format byte of every record written by this version.
pub const RECORD_V1: u8 = 1;

/// Inode flag: the file was opened for writing or truncated, so OST objects may hold
/// data and its size needs a glimpse.
pub const INODE_DATA: u32 = 0x1;

/// Inode flag: OST objects may exist (data was written to them once), kept when lazy
/// size on MDT takes `INODE_DATA` back, so that unlink still destroys them and the
/// layout still cannot change.
pub const INODE_OBJECTS: u32 = 0x4;

/// Inode flag: known to have no stored xattr (set at create, cleared by the first one
/// stored), so a client holding its attributes answers their lookups itself. Inodes
/// written before the flag existed lack it and are always asked.
pub const INODE_NO_XATTRS: u32 = 0x2;

/// Inode flag: it has an access ACL (`system.posix_acl_access`), which every
/// permission check on it then reads; without the flag the mode bits decide alone.
pub const INODE_ACL: u32 = 0x8;

/// Inode flag (directories): it has a default ACL (`system.posix_acl_default`), which
/// what is made in it inherits; without the flag a create reads no xattr.
pub const INODE_DEFACL: u32 = 0x10;

/// Inode flag: immutable (`chattr +i`, `FS_IMMUTABLE_FL`).
pub const INODE_IMMUTABLE: u32 = 0x20;

/// Inode flag: append only (`chattr +a`, `FS_APPEND_FL`).
pub const INODE_APPEND: u32 = 0x40;

/// Inode flag: a file made by `O_TMPFILE` without `O_EXCL` that no name has reached
/// yet: `linkat` may give it its first (Linux's `I_LINKABLE`); any other file with no
/// link left is gone for `link`.
pub const INODE_LINKABLE: u32 = 0x80;

/// The inode flags `FS_IOC_GETFLAGS` reports, each with the `INODE_*` flag that
/// stores it.
const FS_FLAGS: [(u32, u32); 2] = [
    (lode_base::perm::FS_IMMUTABLE_FL, INODE_IMMUTABLE),
    (lode_base::perm::FS_APPEND_FL, INODE_APPEND),
];

/// An inode as the `inode` keyspace holds it: attributes plus layout inline, so one
/// read serves getattr and layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeRec {
    /// Full mode.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Links.
    pub nlink: u32,
    /// Size (directories: entry bytes; files: lazy size).
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Access time, ns.
    pub atime: i64,
    /// Modification time, ns.
    pub mtime: i64,
    /// Change time, ns.
    pub ctime: i64,
    /// Device number.
    pub rdev: u64,
    /// `INODE_*` flags.
    pub flags: u32,
    /// Transno of the last change.
    pub version: u64,
    /// Directories: the parent directory (`..`).
    pub parent: Fid,
    /// Files: the layout; directories: the default layout for new files.
    pub layout: Option<Layout>,
    /// Symlink target.
    #[serde(with = "serde_bytes")]
    pub symlink: Vec<u8>,
    /// Names of this inode (Lustre's linkEA), for fid2path; at most [`LINKS_MAX`].
    pub links: Vec<Link>,
    /// Creation ("birth") time, ns; 0: unknown (made before lode kept it). Stored
    /// after the fields above (see [`InodeRec::encode`]).
    #[serde(skip)]
    pub btime: i64,
}

/// What inode records carry after the first format's fields: a record written
/// before they existed simply ends sooner.
#[derive(Serialize, Deserialize)]
struct InodeExt {
    btime: i64,
}

/// Most names kept per inode in its link list (Lustre's linkEA is bounded too).
pub const LINKS_MAX: usize = 64;

/// One name of an inode: its directory and the entry name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Directory holding the entry.
    pub parent: Fid,
    /// Entry name.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
}

impl InodeRec {
    /// Records a new name (dropped silently past [`LINKS_MAX`]).
    pub fn add_link(&mut self, parent: Fid, name: &[u8]) {
        if self.links.len() < LINKS_MAX {
            self.links.push(Link {
                parent,
                name: name.to_vec(),
            });
        }
    }

    /// Forgets a name.
    pub fn remove_link(&mut self, parent: Fid, name: &[u8]) {
        self.links
            .retain(|l| !(l.parent == parent && l.name == name));
    }
}

impl InodeRec {
    /// Encodes the record: the first format's fields, then [`InodeExt`].
    pub fn encode(&self) -> Vec<u8> {
        let mut out = encode(self);
        let ext = InodeExt { btime: self.btime };
        out.extend_from_slice(&postcard::to_stdvec(&ext).expect("plain fields encode"));
        out
    }

    /// Decodes a record [`InodeRec::encode`] wrote, or one written before
    /// [`InodeExt`] existed (its fields then 0).
    pub fn decode(b: &[u8]) -> Result<InodeRec, StoreError> {
        let corrupt = |e: postcard::Error| StoreError::Corrupt("inode", e.to_string());
        match b.split_first() {
            Some((&RECORD_V1, rest)) => {
                let (mut rec, ext) =
                    postcard::take_from_bytes::<InodeRec>(rest).map_err(corrupt)?;
                if !ext.is_empty() {
                    let ext: InodeExt = postcard::from_bytes(ext).map_err(corrupt)?;
                    rec.btime = ext.btime;
                }
                Ok(rec)
            }
            _ => decode("inode", b),
        }
    }

    /// Its flags as `FS_IOC_GETFLAGS` reports them.
    pub fn fs_flags(&self) -> u32 {
        map_bits(self.flags, FS_FLAGS.map(|(f, i)| (i, f)))
    }

    /// Sets its flags from `FS_IOC_SETFLAGS` flags (those lode keeps).
    pub fn set_fs_flags(&mut self, fs: u32) {
        let kept = map_bits(u32::MAX, FS_FLAGS);
        self.flags = self.flags & !kept | map_bits(fs, FS_FLAGS);
    }

    /// The attributes `stat` reports.
    pub fn attr(&self, fid: Fid) -> Attr {
        Attr {
            fid,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            nlink: lode_base::limits::shown_nlink(self.mode, self.nlink),
            size: self.size,
            blocks: self.blocks,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            btime: self.btime,
            rdev: self.rdev,
            flags: self.fs_flags(),
        }
    }
}

/// Encodes a record with its format byte.
pub fn encode<T: Serialize>(rec: &T) -> Vec<u8> {
    let mut out = vec![RECORD_V1];
    // Encoding into a Vec only fails for unsupported serde types; ours are plain.
    let body = postcard::to_stdvec(rec).expect("record types are postcard-encodable");
    out.extend_from_slice(&body);
    out
}

/// Decodes a record, refusing unknown formats.
pub fn decode<'a, T: Deserialize<'a>>(what: &'static str, b: &'a [u8]) -> Result<T, StoreError> {
    match b.split_first() {
        Some((&RECORD_V1, rest)) => {
            postcard::from_bytes(rest).map_err(|e| StoreError::Corrupt(what, e.to_string()))
        }
        Some((v, _)) => Err(StoreError::Corrupt(
            what,
            format!("unknown record format {v}"),
        )),
        None => Err(StoreError::Corrupt(what, "empty record".into())),
    }
}

/// A directory entry's value: the child and its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirentRec {
    /// Child FID.
    pub fid: Fid,
    /// `d_type`.
    pub dtype: u8,
}

/// Key of a directory entry: parent ‖ hash (BE) ‖ name, so a directory is one
/// contiguous range in hash order.
pub fn dirent_key(parent: Fid, hash: u64, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(24 + name.len());
    k.extend_from_slice(&parent.to_bytes());
    k.extend_from_slice(&hash.to_be_bytes());
    k.extend_from_slice(name);
    k
}

/// Splits a dirent key into (hash, name).
pub fn parse_dirent_key(k: &[u8]) -> Option<(u64, &[u8])> {
    if k.len() < 24 {
        return None;
    }
    let hash = u64::from_be_bytes(k[16..24].try_into().ok()?);
    Some((hash, &k[24..]))
}

/// Key of an xattr.
pub fn xattr_key(fid: Fid, name: &[u8]) -> Vec<u8> {
    let mut k = fid.to_bytes().to_vec();
    k.extend_from_slice(name);
    k
}

/// Key of a reply record: client slot ‖ tag (‖ sub-request number, in a batch).
pub fn reply_key(slot: u32, tag: u16, sub: u16) -> Vec<u8> {
    let mut k = slot.to_be_bytes().to_vec();
    k.extend_from_slice(&tag.to_be_bytes());
    // A batch's sub-request k has its own record, (slot, tag, k + 1); a whole
    // request's key stays six bytes.
    if sub != 0 {
        k.extend_from_slice(&sub.to_be_bytes());
    }
    k
}

/// Key of a destroy record: the FID. A record is acted on only once the transno
/// that wrote it is committed (the destroy thread syncs before acting).
pub fn destroy_key(fid: Fid) -> Vec<u8> {
    fid.to_bytes().to_vec()
}

/// A known client (Lustre's last_rcvd client area).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRec {
    /// Slot, the first part of its reply record keys.
    pub slot: u32,
}

/// Key of the destroy record for the objects of one of `fid`'s layouts that a
/// migration replaced (or abandoned): the file's key and the layout generation, so it
/// never overwrites the file's own record (nor another migration's).
pub fn destroy_key_gen(fid: Fid, gen: u32) -> Vec<u8> {
    let mut k = fid.to_bytes().to_vec();
    k.extend_from_slice(&gen.to_be_bytes());
    k
}

/// A migration under way (`Cf::Migrate`): what to undo if it never commits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateRec {
    /// The pending layout, instantiated: its objects, and its Data-on-MDT bytes at or
    /// past `dom_from`, are the migration's own.
    pub layout: Layout,
    /// Where the file's Data-on-MDT bytes ended when the migration began.
    pub dom_from: u64,
    /// The file's layout generation when it began (bumped then, so that no two
    /// migrations ever name objects alike).
    pub gen: u32,
    /// The migrating client's open handle: after a restart, the migration stays
    /// attached (refused at its swap) to that handle if recovery opens it again, and
    /// is abandoned when it closes, after its client stopped copying.
    pub handle: u64,
}

/// OST objects of an unlinked file, waiting for DESTROY.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestroyRec {
    /// The layout whose objects go.
    pub layout: Layout,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_record_bytes_are_frozen() {
        let r = InodeRec {
            mode: 0o100644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 3,
            blocks: 0,
            atime: 4,
            mtime: 5,
            ctime: 6,
            rdev: 0,
            flags: 0,
            version: 7,
            parent: Fid::ZERO,
            layout: None,
            symlink: vec![],
            links: vec![Link {
                parent: Fid::new(2, 3, 0),
                name: b"n".to_vec(),
            }],
            btime: 9,
        };
        let b = r.encode();
        let first = vec![
            1, 0xa4, 0x83, 0x02, 1, 2, 1, 3, 0, 8, 10, 12, 0, 0, 7, 0, 0, 0, 0, 0, 1, 2, 3, 0, 1,
            b'n',
        ];
        assert_eq!(b[..first.len()], first[..], "the first format's bytes");
        assert_eq!(b[first.len()..], [18], "then the birth time");
        assert_eq!(InodeRec::decode(&b).unwrap(), r);
        // A record of the first format: no birth time.
        let old = InodeRec::decode(&first).unwrap();
        assert_eq!(old, InodeRec { btime: 0, ..r });
        assert!(InodeRec::decode(&[9, 0]).is_err());
        assert!(InodeRec::decode(&[]).is_err());
        assert!(InodeRec::decode(&[first.clone(), vec![0x80]].concat()).is_err());
    }

    #[test]
    fn dirent_keys_sort_by_parent_then_hash() {
        let a = dirent_key(Fid::ROOT, 5, b"zz");
        let b = dirent_key(Fid::ROOT, 6, b"aa");
        assert!(a < b);
        assert_eq!(parse_dirent_key(&a), Some((5, &b"zz"[..])));
    }
}
