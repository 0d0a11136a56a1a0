//! Opcodes and message bodies. Each opcode has one request and one reply struct; the
//! [`Request`] and [`Reply`] enums tie them together and do the postcard coding.

use lode_base::{Attr, Cred, Fid, Layout, SetAttr};
use serde::{Deserialize, Serialize};

/// Connect flag: several modify RPCs in flight, one reply record per tag.
pub const CONNECT_MULTIMODRPCS: u64 = 0x1;
/// Connect flag: Data-on-MDT.
pub const CONNECT_DOM: u64 = 0x2;
/// Connect flag: READDIR may return attributes (readdir+).
pub const CONNECT_READDIR_PLUS: u64 = 0x4;
/// Connect flag: BATCH_GETATTR.
pub const CONNECT_BATCH_GETATTR: u64 = 0x8;
/// Connect flag: lock callbacks (reserved).
pub const CONNECT_LOCKS: u64 = 0x10;
/// Flags this build understands; a server answers with the intersection.
pub const CONNECT_SUPPORTED: u64 =
    CONNECT_MULTIMODRPCS | CONNECT_READDIR_PLUS | CONNECT_BATCH_GETATTR;

/// Readdir / getattr body for one inode: attributes plus layout, one read on the MDT.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdtBody {
    /// Attributes.
    pub attr: Attr,
    /// The file's layout (regular files), or a directory's default layout.
    pub layout: Option<Layout>,
    /// True if OST objects may hold data, so the size needs a glimpse.
    pub glimpse: bool,
    /// Another client held the file open for writing when `lock` was granted (false
    /// without a lock): that lock does not vouch for the file's bytes (there are no
    /// extent locks; an open for writing calls back the attributes locks granted
    /// before it, not those granted while it lasts), so the holder keeps no pages
    /// under it.
    pub written: bool,
    /// Symlink target (empty for other types).
    #[serde(with = "serde_bytes")]
    pub symlink: Vec<u8>,
    /// The lock granted with this reply on the object's attributes (PR UPDATE|PERM),
    /// asked for with `FLAG_INTENT`; 0 if none.
    pub lock: u64,
    /// The lock granted on the name a lookup followed (PR LOOKUP on `(dir, name)`);
    /// 0 if none.
    pub name_lock: u64,
    /// The lock granted on the permissions of the directory a lookup searched (PR
    /// PERM): the caller may search it for as long as this is held; 0 if none.
    pub dir_lock: u64,
    /// The inode has no stored xattr (`user.*`, `trusted.*`, `security.*`): while
    /// `lock` is held, looking one up needs no RPC.
    pub no_xattrs: bool,
    /// The inode has an access ACL: its mode bits alone do not say who may access it.
    pub acl: bool,
}

/// Who connects to what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectReq {
    /// File system name.
    pub fsname: String,
    /// Target name, e.g. `lode-MDT0000`.
    pub target: String,
    /// The client's UUID, stable for the client's life.
    pub client_uuid: String,
    /// `CONNECT_*` flags the client wants.
    pub flags: u64,
    /// Modify slots the client wants.
    pub max_mod_rpcs: u16,
    /// On a keyed file system, the proof of this connection's handshake (HMAC-SHA256
    /// under the key over both nonces, the client UUID and the target; see
    /// `lode_rpc::auth`); empty without a key.
    #[serde(with = "serde_bytes")]
    pub auth: Vec<u8>,
}

/// A handshake nonce (see `lode_rpc::auth`).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NonceMsg {
    /// Random bytes, fresh for each connection.
    #[serde(with = "serde_bytes")]
    pub nonce: Vec<u8>,
}

/// Makes a connection the callback channel of an export.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CallbackChannelReq {
    /// On a keyed file system, the proof of this connection's handshake for the
    /// export's client (empty without a key).
    #[serde(with = "serde_bytes")]
    pub auth: Vec<u8>,
}

/// What the target granted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectRep {
    /// Handle to put in every later header.
    pub handle: u64,
    /// Granted flags.
    pub flags: u64,
    /// Granted modify slots.
    pub max_mod_rpcs: u16,
    /// The target's UUID.
    pub target_uuid: String,
    /// Target index.
    pub index: u32,
    /// Changes on every start of the target: a client that sees it change knows the
    /// target restarted, and whatever it had not committed is gone unless replayed.
    pub instance: u64,
    /// The target is in recovery and expects this client: it must replay its
    /// uncommitted changes (`FLAG_REPLAY`) and then say it is done (`FLAG_REPLAY_DONE`)
    /// before anything else.
    pub recovering: bool,
}

/// Nothing.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Empty {}

/// statfs of one target.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StatfsRep {
    /// Block size.
    pub bsize: u32,
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Blocks available to users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Longest name.
    pub namelen: u32,
    /// The backing file system's [`lode_base::sys::space_id`] (0: unknown). Targets
    /// sharing one file system (`lode up` puts every OST in one directory tree) share
    /// its space: a client's statfs counts it once.
    pub space_id: u64,
}

impl From<lode_base::sys::FsSpace> for StatfsRep {
    fn from(s: lode_base::sys::FsSpace) -> StatfsRep {
        StatfsRep {
            bsize: s.bsize,
            blocks: s.blocks,
            bfree: s.bfree,
            bavail: s.bavail,
            files: s.files,
            ffree: s.ffree,
            namelen: lode_base::limits::NAME_MAX as u32,
            space_id: s.space_id,
        }
    }
}

/// A sequence grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqAllocRep {
    /// The granted sequence.
    pub seq: u64,
    /// Object ids usable in it, from 1.
    pub width: u32,
}

/// A lock request: on an object (`hash` 0) or one name of a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LdlmEnqueueReq {
    /// The object, or the directory of the name.
    pub fid: Fid,
    /// 0, or the name's hash.
    pub hash: u64,
    /// Lustre's mode value (EX 1, PW 2, PR 4, CW 8, CR 16, NL 32).
    pub mode: u32,
    /// Inode bits.
    pub bits: u8,
}

/// The lock granted, if it could be at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LdlmEnqueueRep {
    /// Its handle; `None`: something conflicts, do not cache.
    pub handle: Option<u64>,
}

/// Lock handles (cancels and blocking callbacks), at most
/// [`lode_base::limits::LOCKS_PER_RPC_MAX`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LdlmCancelReq {
    /// The locks.
    pub handles: Vec<u64>,
}

/// Open handles the client has closed, told to the MDT ahead of another request in
/// the same write (at most [`lode_base::limits::CLOSES_AHEAD_MAX`] in all): those it
/// wrote nothing through (read-only ones, and writers that wrote nothing) or only
/// bytes on the MDT, and those that made a file on OSTs and alone wrote it, each with
/// the size its writes' answers said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseAheadReq {
    /// The handles with nothing to say.
    pub handles: Vec<u64>,
    /// The handles that wrote to OST objects, each with the file's size, blocks and
    /// mtime as its writes left them (what `CloseReq::attrs` says), if known to be
    /// current.
    pub written: Vec<(u64, Option<CloseAttrs>)>,
}

/// Reads through open handles that moved their files' access times (lode's), told to
/// the MDT ahead of another request in the same write, as a close ahead is (at
/// most [`lode_base::limits::ACCESS_AHEAD_MAX`]). Lustre's client sends the access
/// time with the close; here the handle may stay open (the open cache), so the time
/// goes on its own, ahead of whatever the client sends next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessAheadReq {
    /// Each handle with the access time its read gave the file (ns since the epoch).
    pub items: Vec<(u64, i64)>,
}

/// A file lock request (Lustre's LDLM_FLOCK): POSIX `fcntl` and BSD `flock` locks,
/// whole-file or byte-range, kept by the MDT for every client of the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlockReq {
    /// The file.
    pub fid: Fid,
    /// Who holds it on the client (a process's files, or an open file description for
    /// `flock`); with the client, the lock's owner.
    pub owner: u64,
    /// The process, for `F_GETLK` answers.
    pub pid: u32,
    /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
    pub typ: u32,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive; `u64::MAX`/`i64::MAX`: to the end of the file).
    pub end: u64,
    /// Wait for a conflicting lock to go (`F_SETLKW`): the reply then says "queued"
    /// and the grant comes later as a `FlockGranted` callback. With `F_UNLCK`: cancel
    /// only the owner's wait on the file (an interrupted wait), keeping its locks.
    pub wait: bool,
    /// Only test (`F_GETLK`): the reply names a conflicting lock, if any.
    pub test: bool,
}

/// A file lock as `F_GETLK` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlockDesc {
    /// `F_RDLCK` or `F_WRLCK`.
    pub typ: u32,
    /// First byte.
    pub start: u64,
    /// Last byte (inclusive).
    pub end: u64,
    /// Holding process (on its client).
    pub pid: u32,
}

/// Reply to a file lock request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlockRep {
    /// Granted now (or unlocked).
    pub granted: bool,
    /// Queued: a `FlockGranted` callback follows.
    pub queued: bool,
    /// For a test: the conflicting lock, if any.
    pub conflict: Option<FlockDesc>,
}

/// From the MDT to a client that waits for a file lock: granted, or (`granted` false)
/// the wait ended without it (its owner unlocked meanwhile).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlockGrantedReq {
    /// The file.
    pub fid: Fid,
    /// The waiting owner.
    pub owner: u64,
    /// Granted; false: the wait was cancelled.
    pub granted: bool,
}

/// getattr by FID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetattrReq {
    /// Caller.
    pub cred: Cred,
    /// The inode.
    pub fid: Fid,
}

/// lookup of a name in a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupReq {
    /// Caller (needs search permission on `parent`).
    pub cred: Cred,
    /// Directory.
    pub parent: Fid,
    /// Name.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
}

/// One readdir page request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaddirReq {
    /// Caller (needs read permission).
    pub cred: Cred,
    /// Directory.
    pub fid: Fid,
    /// First cookie wanted (0 = start).
    pub cookie: u64,
    /// Return attributes with each entry (readdir+).
    pub plus: bool,
    /// At most about this many entries (0: a full page). A hash group is never split,
    /// so a page may hold a few more.
    pub count: u32,
}

/// One directory entry in a readdir page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Name.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// Child FID.
    pub fid: Fid,
    /// `d_type`.
    pub dtype: u8,
    /// Cookie of this entry (its name hash).
    pub cookie: u64,
    /// Attributes, in readdir+ pages.
    pub body: Option<Box<MdtBody>>,
}

/// A readdir page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaddirRep {
    /// Entries in cookie order; never a partial hash group.
    pub entries: Vec<DirEntry>,
    /// Cookie to ask for next; `END_COOKIE` at the end.
    pub next: u64,
}

/// One sub-request of a batch: an opcode and its body, decoded on its own so that a
/// malformed one fails alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubReq {
    /// Its opcode (`Getattr`, `Lookup`; in a modifying batch also `Create`, `Unlink`,
    /// `Setattr`).
    pub opcode: u16,
    /// Its body, as the opcode's own request would carry it.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// Several requests in one RPC (Lustre's `MDS_BATCH`), executed in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReq {
    /// At most `BATCH_SUBS_MAX`.
    pub subs: Vec<SubReq>,
}

/// The outcome of one sub-request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubRep {
    /// 0 or a negative errno.
    pub status: i32,
    /// The transno of a change it made (0: none).
    pub transno: u64,
    /// Its reply body, as the opcode's own reply would carry it (empty on error).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// One outcome per sub-request, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRep {
    /// As many as the batch had sub-requests.
    pub results: Vec<SubRep>,
}

/// create of any inode type, optionally opened (regular files).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateReq {
    /// Caller.
    pub cred: Cred,
    /// Directory.
    pub parent: Fid,
    /// Name.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// FID chosen by the client from its sequence.
    pub fid: Fid,
    /// Full mode (type and permissions) as the caller asked for it.
    pub mode: u32,
    /// The caller's umask, applied by the MDT unless the directory has a default ACL
    /// (which then limits the mode instead, as on Linux). 0 from callers that applied
    /// their umask to `mode` themselves.
    pub umask: u32,
    /// Device number for char/block nodes.
    pub rdev: u64,
    /// Symlink target.
    #[serde(with = "serde_bytes")]
    pub target: Vec<u8>,
    /// Explicit layout (regular files) or default layout (directories).
    pub layout: Option<Layout>,
    /// Open the new file with these `O_*` flags (open intent); `O_EXCL` semantics apply.
    /// With `O_TMPFILE` (`perm::O_TMPFILE_BIT`), `name` is empty and the file gets no
    /// name: `parent` only lends it permissions, group, ACLs and layout.
    pub open_flags: Option<u32>,
    /// With `open_flags` for writing: ask for a PW DOM lock on the new file, granted
    /// (`CreateRep::dom_lock`) only if its every byte will be on the MDT. Under it the
    /// creator may keep its first write back past `write(2)` (write-back): any other
    /// access to the file's data or size calls the lock back first.
    pub dom_writeback: bool,
}

/// Result of a create or open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateRep {
    /// The inode.
    pub body: MdtBody,
    /// Open handle, if opened.
    pub handle: Option<u64>,
    /// With `FLAG_INTENT` on a create: the directory after it.
    pub parent: Option<ParentAttrs>,
    /// Read-on-open: an open for reading of a Data-on-MDT file with no writer gets its
    /// first bytes (up to `mdt.*.dom_read_on_open`), so a small file's read needs no
    /// RPC. Never kept in a reply record (a reconstructed reply comes without).
    pub dom_data: Option<DomPrefetch>,
    /// A read-only open of a Data-on-MDT file with no writer: this start of the MDT's
    /// name for the file's data as it is now (0: none).
    pub data_token: u64,
    /// The request's `cached` token still names the file's data (only its attributes
    /// changed since, if anything): the caller's copy is current, and `dom_data` is
    /// left out.
    pub cache_current: bool,
    /// With an open handle: a PR LAYOUT lock on the file (0: none could be granted),
    /// held by the MDT for the handle's life unless called back. While it is held the
    /// handle's layout is current; its callback means the layout changed (a
    /// migration), and I/O in flight with the old one must be done again.
    pub layout_lock: u64,
    /// With `OpenReq::open_lock`: a PR OPEN lock on the file (0: none could be
    /// granted), which the client gives back after closing the handle, and which an
    /// unlink or a rename over the file calls back.
    pub open_lock: u64,
    /// With `OpenReq::first_page`, of a directory: its first readdir page (none if it
    /// could not be read). Never kept in a reply record (a reconstructed reply comes
    /// without, and the client reads the page itself).
    pub dir_page: Option<ReaddirRep>,
    /// With `CreateReq::dom_writeback`: the PW DOM lock on the new file (0: none).
    /// The MDT lets it go itself at the first DOM_WRITE that names it; the client
    /// gives it back at close if it wrote nothing.
    pub dom_lock: u64,
}

/// The first bytes of a Data-on-MDT file, sent with its open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomPrefetch {
    /// Bytes from offset 0.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// The file ends where `data` does.
    pub eof: bool,
}

/// A directory's attributes after a change in it, handed to the client that made the
/// change, so it need not ask again (the kernel does, for its permission checks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentAttrs {
    /// The directory after the change; `lock` is its PR UPDATE|PERM lock, 0 if the
    /// MDT gave none (other clients are busy in it).
    pub body: MdtBody,
    /// Its ctime just before the change: a client copy with this ctime was current
    /// (nothing else changed the directory in between). [`NO_COPY_CTIME`] when
    /// another change came between this one and the lock in `body`: no copy is.
    pub pre_ctime: i64,
}

/// [`ParentAttrs::pre_ctime`] when no client copy of the directory can be current.
pub const NO_COPY_CTIME: i64 = i64::MIN;

/// Reply to an unlink or rmdir.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnlinkRep {
    /// With `FLAG_INTENT`: the directory after the removal.
    pub parent: Option<ParentAttrs>,
}

/// Reply to a rename.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameRep {
    /// With `FLAG_INTENT`: the source directory after the rename (the only one, for a
    /// rename within one directory).
    pub parent: Option<ParentAttrs>,
    /// With `FLAG_INTENT`, for a rename between two directories: the destination
    /// directory after it.
    pub dst_parent: Option<ParentAttrs>,
    /// With `FLAG_INTENT`, for a rename that neither exchanges nor leaves a whiteout:
    /// the object under its new name, with a PR LOOKUP lock on that name
    /// (`name_lock`) and a PR UPDATE|PERM lock on its attributes (`lock`), 0 where
    /// none could be granted. The kernel keeps the entry it moved; this lock vouches
    /// for it.
    pub moved: Option<MdtBody>,
}

/// Reply to a hard link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkRep {
    /// The inode, with its new link count; with `FLAG_INTENT`, with a PR LOOKUP lock on
    /// the new name (`name_lock`) and a PR UPDATE|PERM lock on its attributes (`lock`)
    /// where they could be granted.
    pub body: MdtBody,
    /// With `FLAG_INTENT`: the directory after the link.
    pub parent: Option<ParentAttrs>,
}

/// open of an existing inode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenReq {
    /// Caller.
    pub cred: Cred,
    /// Inode.
    pub fid: Fid,
    /// `O_*` flags.
    pub flags: u32,
    /// A read-only open by a caller that still holds the file's bytes as an earlier
    /// reply's `data_token` described them (0: none). If they are still the file's,
    /// the reply says so (`cache_current`) and carries no read-on-open bytes.
    pub cached: u64,
    /// A read-only open of a regular file asks for an OPEN lock (Lustre's open
    /// cache): while the client holds it, it keeps the handle after the last close
    /// and opens the file again without an RPC.
    pub open_lock: bool,
    /// An open of a directory asks for its first readdir page in the reply (Lustre
    /// 2.17's opendir with the first pages): a small directory is then listed with
    /// no RPC besides its open.
    pub first_page: Option<FirstPage>,
}

/// The first readdir page an opendir wants (see [`OpenReq::first_page`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstPage {
    /// With attributes (readdir+).
    pub plus: bool,
    /// At most about this many entries (0: a full page), as [`ReaddirReq::count`].
    pub count: u32,
}

/// close of an open handle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseReq {
    /// Handle from open/create.
    pub handle: u64,
    /// Whether anything was written (or may have been) through this handle. A handle
    /// whose open marked the file as holding OST data, and that wrote nothing with no
    /// other writer meanwhile, closes with the mark taken back: the MDT's size is
    /// exact again and stat needs no glimpse (Lustre's lazy size on MDT, for the
    /// commonest case: files created and closed empty).
    pub wrote: bool,
    /// After writes to OST objects: the file's size, blocks and mtime as the closer
    /// glimpsed them just before. If no other writer overlapped this handle, the MDT
    /// keeps them and the size needs no glimpse until the next writer (Lustre's lazy
    /// size on MDT, exact here).
    pub attrs: Option<CloseAttrs>,
}

/// A file's size as a closing writer saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseAttrs {
    /// Size.
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Modification time, ns.
    pub mtime: i64,
}

/// Reply to a close.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseRep {
    /// The close took back the "data on OSTs" mark: the MDT's size is exact again.
    pub exact_size: bool,
    /// With `exact_size` after writes (a Data-on-MDT file's last writer closing): the
    /// attributes now, for the closer's cached copy, which predates its writes.
    pub attr: Option<Attr>,
    /// The last writer of a Data-on-MDT file closing, with nobody else having written
    /// or truncated it since its open: the file's data is what the file held at that
    /// open plus this handle's writes, and this token names it (see `OpenReq::cached`);
    /// 0 otherwise.
    pub data_token: u64,
}

/// unlink or rmdir.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnlinkReq {
    /// Caller.
    pub cred: Cred,
    /// Directory.
    pub parent: Fid,
    /// Name.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// rmdir (the entry must be an empty directory) instead of unlink.
    pub rmdir: bool,
}

/// rename, with Linux `renameat2` flags.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameReq {
    /// Caller.
    pub cred: Cred,
    /// Source directory.
    pub src_parent: Fid,
    /// Source name.
    #[serde(with = "serde_bytes")]
    pub src_name: Vec<u8>,
    /// Target directory.
    pub dst_parent: Fid,
    /// Target name.
    #[serde(with = "serde_bytes")]
    pub dst_name: Vec<u8>,
    /// `RENAME_NOREPLACE` (1) / `RENAME_EXCHANGE` (2).
    pub flags: u32,
}

/// Hard link `fid` as `parent/name`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkReq {
    /// Caller.
    pub cred: Cred,
    /// Inode to link.
    pub fid: Fid,
    /// Directory.
    pub parent: Fid,
    /// New name.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
}

/// setattr.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetattrReq {
    /// Caller.
    pub cred: Cred,
    /// Inode.
    pub fid: Fid,
    /// Changes.
    pub attr: SetAttr,
    /// True if the caller holds the file open for writing (ftruncate skips the
    /// write-permission check, as Linux does).
    pub opened_for_write: bool,
    /// The MDT open handle a truncate comes through (`ftruncate`, `O_TRUNC`; 0: none,
    /// as for `truncate(2)` by path). Through the file's only writer, the truncate
    /// is ordered before that writer's close, which can then still settle the size
    /// (lazy size on MDT).
    pub handle: u64,
}

/// getxattr / listxattr.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetxattrReq {
    /// Caller.
    pub cred: Cred,
    /// Inode.
    pub fid: Fid,
    /// Name (ignored by LISTXATTR).
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// Caller's buffer size; 0 asks for the size only.
    pub size: u32,
}

/// getxattr / listxattr result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XattrRep {
    /// Value (or NUL-separated names); empty when only the size was asked.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Full size of the value.
    pub size: u32,
}

/// setxattr / removexattr.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetxattrReq {
    /// Caller.
    pub cred: Cred,
    /// Inode.
    pub fid: Fid,
    /// Name.
    #[serde(with = "serde_bytes")]
    pub name: Vec<u8>,
    /// Value; `None` removes.
    pub value: Option<serde_bytes::ByteBuf>,
    /// `XATTR_CREATE` (1) / `XATTR_REPLACE` (2).
    pub flags: u32,
}

/// Data-on-MDT read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomReadReq {
    /// Inode.
    pub fid: Fid,
    /// Offset.
    pub offset: u64,
    /// Length.
    pub len: u32,
}

/// Data-on-MDT `SEEK_DATA`/`SEEK_HOLE` (Lustre's `OST_SEEK`, which the MDT answers
/// for Data-on-MDT too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomSeekReq {
    /// Inode.
    pub fid: Fid,
    /// Where the search starts.
    pub offset: u64,
    /// The next hole (`SEEK_HOLE`), else the next data (`SEEK_DATA`).
    pub hole: bool,
}

/// Data-on-MDT write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomWriteReq {
    /// Inode.
    pub fid: Fid,
    /// The writer's open handle (opened for writing): a write after close or
    /// eviction is refused, as the handle is gone.
    pub handle: u64,
    /// Offset (ignored for an append).
    pub offset: u64,
    /// Bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// `O_APPEND`: written at the file's end, found under the inode's lock, so appends
    /// by several clients each land whole and none overwrites another. Only where
    /// every byte of the file is on the MDT and the bytes fit in its DoM component;
    /// otherwise refused with `ERANGE` and nothing written (the client then finds the
    /// end and writes there).
    pub append: bool,
    /// The writer's PW DOM lock (`CreateRep::dom_lock`; 0: none): the write is the one
    /// kept back under it, so it is not called back, and goes with the write.
    pub dom_lock: u64,
}

impl DomWriteReq {
    /// The open handle a DOM_WRITE body names, read without copying its bytes (the
    /// fields before `data`, decoded alone); `None` if the body is not one.
    pub fn handle_of(body: &[u8]) -> Option<u64> {
        #[derive(Deserialize)]
        struct Head {
            _fid: Fid,
            handle: u64,
        }
        postcard::take_from_bytes::<Head>(body)
            .ok()
            .map(|(h, _)| h.handle)
    }
}

/// What a DOM_WRITE did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomWriteRep {
    /// Where the bytes went (an append's end of file; else the request's offset).
    pub offset: u64,
    /// The file's size, blocks and mtime (which is also its ctime) as this write left
    /// them on the MDT: the writer that made a Data-on-MDT-only file knows its
    /// attributes at close from these, with no round trip (see `Client::close_ahead`).
    pub attrs: CloseAttrs,
    /// The data token the file's bytes will have once its writer's close takes the
    /// data mark back, if nothing changes them before (see `CloseRep::data_token`;
    /// the MDT checks it at the next open, so a stale one only costs a cache miss).
    pub data_token: u64,
}

/// One step of an online layout migration (`lode migrate`, Lustre's `lfs migrate`
/// with a layout swap), all on one open handle of the migrating client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateReq {
    /// Caller: swapping a file's layout needs write permission on it (as Lustre's
    /// layout swap).
    pub cred: Cred,
    /// The file.
    pub fid: Fid,
    /// The migrating client's open handle on it; closing it abandons the migration.
    pub handle: u64,
    /// What to do.
    pub step: MigrateStep,
}

/// The steps of a migration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrateStep {
    /// Begin: the MDT checks `layout` (a template) and instantiates it with component
    /// ids no layout of the file has used, for a file of `size` bytes, and keeps it as
    /// the pending layout. Refused with EBUSY while the file is open for writing. A
    /// replay brings the pending layout its reply gave, OSTs and all.
    Start {
        /// The new layout.
        layout: Layout,
        /// The bytes to copy.
        size: u64,
    },
    /// Data-on-MDT bytes of the pending layout, at or past `MigrateRep::dom_from`
    /// (below it the bytes already are where the new layout wants them).
    Dom {
        /// Offset.
        offset: u64,
        /// Bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Swap: the pending layout becomes the file's (layout generation bumped, every
    /// client's layout lock called back), the old one's objects are destroyed once
    /// this commits. EBUSY if the file was opened for writing or truncated since
    /// `Start` (the pending layout is then dropped).
    Commit {
        /// The file's size (as copied).
        size: u64,
        /// Its modification time (as the copy found it), kept when the new layout
        /// holds every byte on the MDT.
        mtime: i64,
    },
}

/// Reply to a migration step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateRep {
    /// `Start`: the pending layout, instantiated; `Commit`: the file's new layout.
    pub layout: Option<Layout>,
    /// `Start`: where the old layout's Data-on-MDT bytes end (the new layout's below
    /// this are the same records and need no copy).
    pub dom_from: u64,
}

/// Layout intent (Lustre's `IT_LAYOUT` with a write extent): instantiate the
/// components a write to `[start, end)` reaches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutIntentReq {
    /// Inode.
    pub fid: Fid,
    /// The writer's open handle (opened for writing).
    pub handle: u64,
    /// First byte to be written.
    pub start: u64,
    /// One past the last byte to be written.
    pub end: u64,
    /// Set in a replay: the layout the original reply gave, whose OST choices the
    /// restarted MDT keeps (data may already be in those objects).
    pub layout: Option<Layout>,
}

/// Bytes read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataRep {
    /// Bytes; shorter than asked at end of object.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Result of SYNC: what is now durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRep {
    /// The target's last committed transno after the sync.
    pub committed: u64,
}

/// Names one OST object: `(file FID, component id, stripe index)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjId {
    /// The file.
    pub fid: Fid,
    /// Component id.
    pub comp: u32,
    /// Stripe index.
    pub stripe: u32,
}

/// OST read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstReadReq {
    /// Object.
    pub obj: ObjId,
    /// Offset in the object.
    pub offset: u64,
    /// Bytes wanted (≤ BULK_MAX).
    pub len: u32,
}

/// OST write; creates the object on first write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstWriteReq {
    /// Object.
    pub obj: ObjId,
    /// Offset in the object.
    pub offset: u64,
    /// Bytes (≤ BULK_MAX).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// An O_APPEND write of a file that is this one object: the OST writes at the
    /// object's end, found under the object's lock, so appends by several clients
    /// never overwrite each other (`offset` is ignored; the reply says where the bytes
    /// went, and a replay writes there).
    pub append: bool,
}

/// OST write's answer: the object as the write left it (`None` when the OST cannot
/// say, as for a replay), so a client that made the file and wrote all of it knows
/// its size at close without a glimpse.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OstWriteRep {
    /// Size, blocks and mtime after the write.
    pub attr: Option<ObjAttr>,
    /// Where the bytes went (an append's end of object; else the request's offset).
    pub offset: u64,
}

/// OST punch: set the object's size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PunchReq {
    /// Object.
    pub obj: ObjId,
    /// New object size.
    pub size: u64,
}

/// OST fallocate (Lustre's `OST_FALLOCATE`): preallocate, punch a hole in or zero a
/// byte range of an object; without `FALLOC_FL_KEEP_SIZE` the object grows to the
/// range's end if shorter (never shrinks), so the file's size follows as after a
/// write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallocateReq {
    /// Object.
    pub obj: ObjId,
    /// `FALLOC_FL_*` flags: none, `KEEP_SIZE`, `PUNCH_HOLE | KEEP_SIZE`, `ZERO_RANGE`
    /// or `ZERO_RANGE | KEEP_SIZE`.
    pub mode: u32,
    /// First byte, in the object.
    pub offset: u64,
    /// Bytes (at least one).
    pub len: u64,
}

/// OST seek (Lustre's `OST_SEEK`): where the next data or hole of an object starts
/// (its file's `lseek(SEEK_DATA|SEEK_HOLE)`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeekReq {
    /// Object.
    pub obj: ObjId,
    /// Where the search starts, in the object.
    pub offset: u64,
    /// The next hole (`SEEK_HOLE`), else the next data (`SEEK_DATA`).
    pub hole: bool,
}

/// The answer to a seek. A search that stopped at its bound (a Data-on-MDT hole
/// search reads each chunk it passes) says where, and the caller asks again from
/// there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeekRep {
    /// Where what was asked for starts (at or after the offset asked), or `None`:
    /// no data at or after it, or nothing found before `scanned_to`.
    pub found: Option<u64>,
    /// Where the search stopped without an answer: `u64::MAX` when it went to the end.
    pub scanned_to: u64,
}

/// Object attributes (glimpse).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ObjAttr {
    /// Object size (0 if it does not exist).
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Modification time, ns.
    pub mtime: i64,
}

/// Glimpse or sync or destroy of several objects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjsReq {
    /// Objects.
    pub objs: Vec<ObjId>,
}

/// Glimpse results, one per object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjAttrsRep {
    /// One per requested object.
    pub attrs: Vec<ObjAttr>,
}

/// Set the modification time of OST objects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OstSetattrReq {
    /// Objects (absent ones are skipped: they hold no data).
    pub objs: Vec<ObjId>,
    /// New mtime, ns since the epoch.
    pub mtime: i64,
}

/// What kind of target registers with the MGS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TargetKind {
    /// Metadata target.
    Mdt,
    /// Object storage target.
    Ost,
}

/// One target in the MGS config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    /// Kind.
    pub kind: TargetKind,
    /// Index.
    pub index: u32,
    /// Name, e.g. `lode-OST0001`.
    pub name: String,
    /// `host:port` it serves on.
    pub addr: String,
    /// Target UUID.
    pub uuid: String,
}

/// A server registers its target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgsRegisterReq {
    /// File system.
    pub fsname: String,
    /// Target.
    pub target: TargetInfo,
    /// When the registration was made (ns since the epoch): the MGS takes a target's
    /// registrations only in increasing order, so an old one cannot be replayed.
    pub stamp: u64,
    /// HMAC-SHA256 under the target's secret of its name, address, UUID and `stamp`
    /// (empty: a target formatted before targets had secrets).
    #[serde(with = "serde_bytes")]
    pub proof: Vec<u8>,
    /// The secret itself, sent only when the MGS has none for the target yet (it asks
    /// with ENOKEY): the first registration binds the name to it.
    #[serde(with = "serde_bytes")]
    pub secret: Vec<u8>,
}

/// The file system config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MgsConfigRep {
    /// File system.
    pub fsname: String,
    /// Every registered target.
    pub targets: Vec<TargetInfo>,
    /// Persistent parameters (`set-param -P`), in order.
    pub params: Vec<(String, String)>,
}

/// Encodes an inode's names (parent FID, entry name) as the `lustre.link` xattr value.
pub fn encode_links(links: &[(Fid, Vec<u8>)]) -> Vec<u8> {
    let mut v = b"LNK1".to_vec();
    v.extend_from_slice(&postcard::to_stdvec(links).unwrap_or_default());
    v
}

/// Decodes a `lustre.link` xattr value.
pub fn decode_links(v: &[u8]) -> Option<Vec<(Fid, Vec<u8>)>> {
    postcard::from_bytes(v.strip_prefix(b"LNK1")?).ok()
}

/// The service that answers an opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceKind {
    /// Every target answers it (connection management, statfs).
    Any,
    /// The metadata target.
    Mdt,
    /// An object storage target.
    Ost,
    /// The management service.
    Mgs,
    /// A client (callbacks from a target).
    Client,
}

macro_rules! messages {
    ($( $(#[$doc:meta])* $op:ident = $code:literal, $svc:ident, $modify:literal : $req:ty => $rep:ty ,)*) => {
        /// Every opcode of every service.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum Opcode { $( $(#[$doc])* $op = $code, )* }

        impl Opcode {
            /// The opcode with this wire value.
            pub fn from_u16(v: u16) -> Option<Opcode> {
                match v { $( $code => Some(Opcode::$op), )* _ => None }
            }

            /// Lower-case name, as stats files print it.
            pub fn name(self) -> &'static str {
                match self { $( Opcode::$op => stringify!($op), )* }
            }

            /// Every opcode.
            pub const ALL: &'static [Opcode] = &[ $( Opcode::$op, )* ];

            /// True if the request changes state on its target: it takes a modify tag
            /// and the target keeps a reply record for it.
            pub fn is_modify(self) -> bool {
                match self { $( Opcode::$op => $modify, )* }
            }

            /// The service that answers it.
            pub fn service(self) -> ServiceKind {
                match self { $( Opcode::$op => ServiceKind::$svc, )* }
            }
        }

        /// The request body type of each opcode, for the per-service request enums.
        pub mod req_ty {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[doc = concat!("Body of a `", stringify!($op), "` request.")]
                pub type $op = $req;
            )*
        }

        /// A request body, tagged by its opcode.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Request { $( $(#[$doc])* $op($req), )* }

        /// A reply body, tagged by the opcode of its request.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Reply { $( $(#[$doc])* $op($rep), )* }

        impl Request {
            /// The opcode.
            pub fn opcode(&self) -> Opcode {
                match self { $( Request::$op(_) => Opcode::$op, )* }
            }

            /// postcard bytes of the body.
            pub fn encode(&self) -> Vec<u8> {
                let r = match self { $( Request::$op(b) => postcard::to_stdvec(b), )* };
                r.expect("encoding to a Vec cannot fail")
            }

            /// Decodes a body for `opcode`; errors on unknown opcodes or bad bytes.
            pub fn decode(opcode: u16, body: &[u8]) -> Result<Request, DecodeError> {
                let op = Opcode::from_u16(opcode).ok_or(DecodeError::Opcode(opcode))?;
                Ok(match op { $( Opcode::$op => Request::$op(postcard::from_bytes(body)?), )* })
            }
        }

        impl Reply {
            /// The opcode of the request this answers.
            pub fn opcode(&self) -> Opcode {
                match self { $( Reply::$op(_) => Opcode::$op, )* }
            }

            /// postcard bytes of the body.
            pub fn encode(&self) -> Vec<u8> {
                let r = match self { $( Reply::$op(b) => postcard::to_stdvec(b), )* };
                r.expect("encoding to a Vec cannot fail")
            }

            /// Decodes a body for `opcode`.
            pub fn decode(opcode: u16, body: &[u8]) -> Result<Reply, DecodeError> {
                let op = Opcode::from_u16(opcode).ok_or(DecodeError::Opcode(opcode))?;
                Ok(match op { $( Opcode::$op => Reply::$op(postcard::from_bytes(body)?), )* })
            }
        }
    };
}

messages! {
    /// Connect to a target.
    Connect = 1, Any, false: ConnectReq => ConnectRep,
    /// Disconnect.
    Disconnect = 2, Any, false: Empty => Empty,
    /// Liveness.
    Ping = 3, Any, false: Empty => Empty,
    /// The first step of a keyed connection's handshake: nonces both ways (answered by
    /// the RPC layer, before any service sees the connection).
    AuthNonce = 5, Any, false: NonceMsg => NonceMsg,
    /// Space and inodes of a target.
    Statfs = 4, Any, false: Empty => StatfsRep,
    /// Grant a FID sequence.
    SeqAlloc = 10, Mdt, false: Empty => SeqAllocRep,
    /// Attributes by FID.
    Getattr = 11, Mdt, false: GetattrReq => MdtBody,
    /// Name to FID, attributes and layout.
    Lookup = 12, Mdt, false: LookupReq => MdtBody,
    /// One page of a directory.
    Readdir = 13, Mdt, false: ReaddirReq => ReaddirRep,
    /// Several lookups and getattrs in one RPC (Lustre's `MDS_BATCH` of reads).
    Batch = 14, Mdt, false: BatchReq => BatchRep,
    /// Create (with optional open intent).
    Create = 15, Mdt, true: CreateReq => CreateRep,
    /// Open by FID.
    Open = 16, Mdt, true: OpenReq => CreateRep,
    /// Close a handle.
    Close = 17, Mdt, true: CloseReq => CloseRep,
    /// Unlink or rmdir.
    Unlink = 18, Mdt, true: UnlinkReq => UnlinkRep,
    /// Rename.
    Rename = 19, Mdt, true: RenameReq => RenameRep,
    /// Hard link.
    Link = 20, Mdt, true: LinkReq => LinkRep,
    /// Change attributes.
    Setattr = 21, Mdt, true: SetattrReq => MdtBody,
    /// Read an xattr.
    Getxattr = 22, Mdt, false: GetxattrReq => XattrRep,
    /// Set or remove an xattr.
    Setxattr = 23, Mdt, true: SetxattrReq => Empty,
    /// List xattr names.
    Listxattr = 24, Mdt, false: GetxattrReq => XattrRep,
    /// Read Data-on-MDT bytes.
    DomRead = 25, Mdt, false: DomReadReq => DataRep,
    /// Write Data-on-MDT bytes.
    DomWrite = 26, Mdt, true: DomWriteReq => DomWriteRep,
    /// Make everything so far durable.
    Sync = 27, Mdt, false: Empty => SyncRep,
    /// A batch with changes among its sub-requests (Lustre's `MDS_BATCH` with reint
    /// sub-requests): each change exactly once, answered once they are all committed.
    BatchModify = 28, Mdt, true: BatchReq => BatchRep,
    /// Instantiate the layout components a write reaches (Lustre's layout intent):
    /// OSTs chosen, `layout_gen` bumped; the new layout comes back.
    LayoutIntent = 29, Mdt, true: LayoutIntentReq => MdtBody,
    /// A step of an online layout migration (Lustre's `lfs migrate` layout swap).
    Migrate = 30, Mdt, true: MigrateReq => MigrateRep,
    /// Where the next data or hole of a file's Data-on-MDT bytes starts.
    DomSeek = 31, Mdt, false: DomSeekReq => SeekRep,
    /// Read from an OST object.
    OstRead = 40, Ost, false: OstReadReq => DataRep,
    /// Write to an OST object.
    OstWrite = 41, Ost, false: OstWriteReq => OstWriteRep,
    /// Truncate an OST object.
    Punch = 42, Ost, false: PunchReq => Empty,
    /// Glimpse OST objects.
    OstGetattr = 43, Ost, false: ObjsReq => ObjAttrsRep,
    /// fsync OST objects (all if empty).
    OstSync = 44, Ost, false: ObjsReq => Empty,
    /// Destroy OST objects.
    Destroy = 45, Ost, false: ObjsReq => Empty,
    /// Set OST objects' modification time (explicit mtime, utimes).
    OstSetattr = 46, Ost, false: OstSetattrReq => Empty,
    /// Preallocate, punch or zero a range of an OST object.
    OstFallocate = 47, Ost, false: FallocateReq => Empty,
    /// Where the next data or hole of an OST object starts (Lustre's `OST_SEEK`).
    OstSeek = 48, Ost, false: SeekReq => SeekRep,
    /// Ask for a lock (Lustre's LDLM_ENQUEUE): granted at once or not at all.
    LdlmEnqueue = 101, Mdt, false: LdlmEnqueueReq => LdlmEnqueueRep,
    /// Give locks back (LDLM_CANCEL).
    LdlmCancel = 103, Mdt, false: LdlmCancelReq => Empty,
    /// Close handles nothing was written through (lode's): a frame nobody answers,
    /// sent just before another request on the same connection, so such a close
    /// costs no round trip of its own. Idempotent: a handle that is not open is
    /// skipped.
    CloseAhead = 110, Mdt, false: CloseAheadReq => Empty,
    /// Move access times after reads through open handles (lode's): a frame nobody
    /// answers, sent ahead of another request as `CloseAhead` is. Only forward: an
    /// older time, or a handle that is not the sender's, is skipped.
    AccessAhead = 111, Mdt, false: AccessAheadReq => Empty,
    /// From the MDT to a client on its callback channel: give these locks back
    /// (LDLM_BL_CALLBACK).
    LdlmBlCallback = 104, Client, false: LdlmCancelReq => Empty,
    /// Makes this connection the callback channel of the export named in the header
    /// (lode's; Lustre calls back over LNet to the client's NID).
    LdlmCallbackChannel = 107, Mdt, false: CallbackChannelReq => Empty,
    /// Take, test or drop a file lock (`fcntl`/`flock`; Lustre's LDLM_FLOCK enqueue).
    Flock = 108, Mdt, false: FlockReq => FlockRep,
    /// From the MDT on the callback channel: a waited-for file lock is granted (Lustre's
    /// completion AST), or the wait is over.
    FlockGranted = 109, Client, false: FlockGrantedReq => Empty,
    /// Register a target with the MGS.
    MgsRegister = 60, Mgs, false: MgsRegisterReq => Empty,
    /// Fetch the file system config.
    MgsConfig = 61, Mgs, false: Empty => MgsConfigRep,
}

/// One service's requests: decoding refuses every opcode the service does not answer,
/// so its dispatch matches every variant with no catch-all, and a new opcode for the
/// service does not compile until it is answered.
macro_rules! service_requests {
    ($(#[$doc:meta])* $name:ident, $kind:ident: $($op:ident),* $(,)?) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum $name {
            $(
                #[doc = concat!("A `", stringify!($op), "` request.")]
                $op(req_ty::$op),
            )*
        }

        impl $name {
            /// The opcodes this service answers.
            pub const OPCODES: &'static [Opcode] = &[ $( Opcode::$op, )* ];
            /// The service.
            pub const KIND: ServiceKind = ServiceKind::$kind;

            /// Decodes a body for `opcode`; an opcode of another service is refused.
            pub fn decode(opcode: u16, body: &[u8]) -> Result<$name, DecodeError> {
                let op = Opcode::from_u16(opcode).ok_or(DecodeError::Opcode(opcode))?;
                Ok(match op {
                    $( Opcode::$op => $name::$op(postcard::from_bytes(body)?), )*
                    other => return Err(DecodeError::Service(other)),
                })
            }

            /// The opcode.
            pub fn opcode(&self) -> Opcode {
                match self { $( $name::$op(_) => Opcode::$op, )* }
            }
        }
    };
}

service_requests! {
    /// What a metadata target answers.
    MdtRequest, Mdt: Connect, Disconnect, Ping, Statfs, SeqAlloc, Getattr, Lookup, Readdir,
    Batch, BatchModify, Create, Open, Close, Unlink, Rename, Link, Setattr, Getxattr, Setxattr,
    Listxattr, DomRead, DomSeek, DomWrite, LayoutIntent, Migrate, Sync, LdlmEnqueue, LdlmCancel, LdlmCallbackChannel, Flock,
    CloseAhead, AccessAhead,
}

service_requests! {
    /// What an object storage target answers.
    OstRequest, Ost: Connect, Disconnect, Ping, Statfs, OstRead, OstWrite, Punch, OstGetattr,
    OstSync, Destroy, OstSetattr, OstFallocate, OstSeek,
}

service_requests! {
    /// What the management service answers.
    MgsRequest, Mgs: Connect, Ping, MgsRegister, MgsConfig,
}

impl MdtRequest {
    /// The caller's credentials, for the requests that carry them (root squash
    /// rewrites them before the request runs).
    pub fn cred_mut(&mut self) -> Option<&mut Cred> {
        match self {
            MdtRequest::Getattr(r) => Some(&mut r.cred),
            MdtRequest::Lookup(r) => Some(&mut r.cred),
            MdtRequest::Readdir(r) => Some(&mut r.cred),
            MdtRequest::Create(r) => Some(&mut r.cred),
            MdtRequest::Open(r) => Some(&mut r.cred),
            MdtRequest::Unlink(r) => Some(&mut r.cred),
            MdtRequest::Rename(r) => Some(&mut r.cred),
            MdtRequest::Link(r) => Some(&mut r.cred),
            MdtRequest::Setattr(r) => Some(&mut r.cred),
            MdtRequest::Getxattr(r) | MdtRequest::Listxattr(r) => Some(&mut r.cred),
            MdtRequest::Setxattr(r) => Some(&mut r.cred),
            MdtRequest::Migrate(r) => Some(&mut r.cred),
            _ => None,
        }
    }
}

/// A body that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The opcode is not known.
    #[error("unknown opcode {0}")]
    Opcode(u16),
    /// The body bytes are malformed.
    #[error("malformed body: {0}")]
    Body(#[from] postcard::Error),
    /// The opcode belongs to another service.
    #[error("{0:?} is not answered by this service")]
    Service(Opcode),
}

#[cfg(test)]
mod service_table_tests {
    use super::*;

    /// The opcode table's service column and the per-service request types agree: every
    /// opcode a service owns is in its type, and its type holds no other service's.
    #[test]
    fn service_types_match_the_opcode_table() {
        for (kind, ops) in [
            (MdtRequest::KIND, MdtRequest::OPCODES),
            (OstRequest::KIND, OstRequest::OPCODES),
            (MgsRequest::KIND, MgsRequest::OPCODES),
        ] {
            for op in Opcode::ALL {
                if op.service() == kind {
                    assert!(
                        ops.contains(op),
                        "{op:?} belongs to {kind:?} but its type lacks it"
                    );
                }
            }
            for op in ops {
                assert!(
                    op.service() == kind || op.service() == ServiceKind::Any,
                    "{op:?} is in {kind:?}'s type but the table gives {:?}",
                    op.service()
                );
            }
        }
    }

    #[test]
    fn a_service_refuses_another_services_opcode() {
        let body = Request::Ping(Empty {}).encode();
        assert!(MdtRequest::decode(Opcode::Ping as u16, &body).is_ok());
        assert!(matches!(
            OstRequest::decode(Opcode::MgsConfig as u16, &body),
            Err(DecodeError::Service(Opcode::MgsConfig))
        ));
        assert!(matches!(
            MgsRequest::decode(9999, &body),
            Err(DecodeError::Opcode(9999))
        ));
    }
}

#[cfg(test)]
mod dom_write_tests {
    use super::*;

    /// The handle is read from a DOM_WRITE body whatever its bytes; anything else,
    /// or a body cut short before the handle, names none.
    #[test]
    fn a_dom_writes_handle_is_read_from_its_body_alone() {
        for data in [Vec::new(), vec![7u8; 100_000]] {
            let body = Request::DomWrite(DomWriteReq {
                dom_lock: 0,
                fid: Fid::ROOT,
                handle: 0x1234_5678_9abc,
                offset: 4096,
                data,
                append: false,
            })
            .encode();
            assert_eq!(DomWriteReq::handle_of(&body), Some(0x1234_5678_9abc));
            assert_eq!(DomWriteReq::handle_of(&body[..3]), None);
        }
    }
}
