//! Extended attributes with Linux's namespace rules, and the `lustre.lov` virtual
//! xattr through which layouts are read and set (so `getfattr`/`setfattr` work too).

use crate::inode::{is_dir, now_ns, put_inode};
use crate::{Ctx, Namespace, OpResult};
use lode_base::acl::{self, Acl};
use lode_base::limits::{XATTR_INODE_VALUES_MAX, XATTR_LIST_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX};
use lode_base::perm::{is_owner_or_root, MAY_READ, MAY_WRITE};
use lode_base::{Cred, Errno, Fid, Layout};
use lode_proto::{Empty, Reply, XattrRep};
use lode_store::records::{
    xattr_key, InodeRec, INODE_ACL, INODE_DATA, INODE_DEFACL, INODE_NO_XATTRS,
};
use lode_store::{Batch, Cf};

/// The bytes one inode's stored xattrs take: their names (each with its NUL, as
/// listed) and their values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct XattrSizes {
    names: usize,
    values: usize,
}

impl XattrSizes {
    /// The sizes after `name` (`old` bytes if it is set) is set to `new` bytes, or
    /// removed (`None`).
    fn with(self, name: &[u8], old: Option<usize>, new: Option<usize>) -> XattrSizes {
        let name = name.len() + 1;
        let names = match (old, new) {
            (None, Some(_)) => self.names + name,
            (Some(_), None) => self.names.saturating_sub(name),
            _ => self.names,
        };
        XattrSizes {
            names,
            values: (self.values + new.unwrap_or(0)).saturating_sub(old.unwrap_or(0)),
        }
    }

    /// ENOSPC, as a file system out of xattr room answers, past what can be listed
    /// ([`XATTR_LIST_MAX`] of names) or past [`XATTR_INODE_VALUES_MAX`] of values:
    /// without a bound, one client could grow an inode without limit and make every
    /// listing of it fail.
    fn check(self) -> Result<(), Errno> {
        if self.names > XATTR_LIST_MAX || self.values > XATTR_INODE_VALUES_MAX {
            return Err(Errno::ENOSPC);
        }
        Ok(())
    }
}

/// The virtual xattr holding a file's layout (a directory's default layout).
pub const LOV_XATTR: &[u8] = b"lustre.lov";
/// The virtual, read-only xattr listing an inode's names (Lustre's linkEA).
pub const LINK_XATTR: &[u8] = b"lustre.link";

const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;

enum Ns {
    User,
    /// `system.posix_acl_access`.
    AclAccess,
    /// `system.posix_acl_default`.
    AclDefault,
    Trusted,
    Security,
    Lov,
    Link,
}

fn namespace(name: &[u8]) -> Result<Ns, Errno> {
    if name.is_empty() {
        return Err(Errno::EINVAL);
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    if name == LOV_XATTR {
        return Ok(Ns::Lov);
    }
    if name == LINK_XATTR {
        return Ok(Ns::Link);
    }
    if name == acl::ACCESS {
        return Ok(Ns::AclAccess);
    }
    if name == acl::DEFAULT {
        return Ok(Ns::AclDefault);
    }
    if name.starts_with(b"user.") && name.len() > 5 {
        Ok(Ns::User)
    } else if name.starts_with(b"trusted.") && name.len() > 8 {
        Ok(Ns::Trusted)
    } else if name.starts_with(b"security.") && name.len() > 9 {
        Ok(Ns::Security)
    } else {
        // The rest of system.* and unknown namespaces are not supported.
        Err(Errno::EOPNOTSUPP)
    }
}

impl Namespace {
    fn check_xattr_access(
        &self,
        ns: &Ns,
        rec: &InodeRec,
        fid: Fid,
        cred: &Cred,
        want: u32,
    ) -> Result<(), Errno> {
        let attr = rec.attr(fid);
        match ns {
            Ns::User => {
                let ft = rec.mode & libc::S_IFMT;
                if ft != libc::S_IFREG && ft != libc::S_IFDIR {
                    return Err(if want == MAY_WRITE {
                        Errno::EPERM
                    } else {
                        Errno::ENODATA
                    });
                }
                if !self.may(fid, rec, cred, want) {
                    return Err(Errno::EACCES);
                }
                if want == MAY_WRITE
                    && is_dir(rec.mode)
                    && rec.mode & libc::S_ISVTX != 0
                    && !is_owner_or_root(&attr, cred)
                {
                    return Err(Errno::EPERM);
                }
            }
            Ns::Trusted => {
                if cred.uid != 0 {
                    return Err(if want == MAY_WRITE {
                        Errno::EPERM
                    } else {
                        Errno::ENODATA
                    });
                }
            }
            Ns::Security => {
                // Linux asks CAP_SYS_ADMIN (CAP_SETFCAP for security.capability): a
                // file's owner may not give it capabilities or labels.
                if want == MAY_WRITE && cred.uid != 0 {
                    return Err(Errno::EPERM);
                }
            }
            Ns::Lov => {
                if want == MAY_WRITE && !is_owner_or_root(&attr, cred) {
                    return Err(Errno::EPERM);
                }
            }
            Ns::Link => {
                if want == MAY_WRITE {
                    return Err(Errno::EPERM);
                }
            }
            // Anyone may read an ACL; only the owner may set it. Symlinks have none
            // (Linux has no ACL operations for them).
            Ns::AclAccess | Ns::AclDefault => {
                if rec.mode & libc::S_IFMT == libc::S_IFLNK {
                    return Err(Errno::EOPNOTSUPP);
                }
                if want == MAY_WRITE && !is_owner_or_root(&attr, cred) {
                    return Err(Errno::EPERM);
                }
            }
        }
        Ok(())
    }

    pub(crate) fn getxattr(
        &self,
        cred: &Cred,
        fid: Fid,
        name: &[u8],
        size: u32,
    ) -> OpResult<XattrRep> {
        let ns = namespace(name)?;
        let rec = self.inode(fid)?;
        self.check_xattr_access(&ns, &rec, fid, cred, MAY_READ)?;
        let value = match ns {
            Ns::Lov => match &rec.layout {
                Some(l) => lode_base::layout::encode_xattr(l),
                None => return Err(Errno::ENODATA.into()),
            },
            Ns::Link => {
                let links: Vec<(Fid, Vec<u8>)> = rec
                    .links
                    .iter()
                    .map(|l| (l.parent, l.name.clone()))
                    .collect();
                lode_proto::encode_links(&links)
            }
            _ => self
                .store
                .engine()
                .get(Cf::Xattr, &xattr_key(fid, name))?
                .ok_or(Errno::ENODATA)?,
        };
        size_reply(value, size)
    }

    pub(crate) fn listxattr(&self, cred: &Cred, fid: Fid, size: u32) -> OpResult<XattrRep> {
        let rec = self.inode(fid)?;
        let mut out = Vec::new();
        let mut over = false;
        self.store
            .engine()
            .scan(Cf::Xattr, &fid.to_bytes(), b"", &mut |k, _| {
                let name = &k[16..];
                if name.starts_with(b"trusted.") && cred.uid != 0 {
                    return true;
                }
                out.extend_from_slice(name);
                out.push(0);
                if out.len() > XATTR_LIST_MAX {
                    over = true;
                    return false;
                }
                true
            })?;
        if over {
            return Err(Errno::E2BIG.into());
        }
        if rec.layout.is_some() && (rec.mode & libc::S_IFMT == libc::S_IFREG) {
            out.extend_from_slice(LOV_XATTR);
            out.push(0);
        }
        size_reply(out, size)
    }

    pub(crate) fn setxattr(
        &self,
        ctx: &Ctx,
        cred: &Cred,
        fid: Fid,
        name: &[u8],
        value: Option<Vec<u8>>,
        flags: u32,
    ) -> OpResult<u64> {
        let ns = namespace(name)?;
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
            return Err(Errno::EINVAL.into());
        }
        if value.as_ref().is_some_and(|v| v.len() > XATTR_SIZE_MAX) {
            return Err(Errno::E2BIG.into());
        }
        if value.is_some() {
            self.check_space()?;
        }
        let mut held = self.pdo.lock(&[], &[]);
        self.pdo.lock_inodes(&mut held, &[fid]);
        let mut rec = self.inode(fid)?;
        self.check_xattr_access(&ns, &rec, fid, cred, MAY_WRITE)?;
        if lode_base::perm::iflags::forbid_xattr_change(rec.fs_flags()) {
            return Err(Errno::EPERM.into());
        }
        let now = now_ns();
        let mut b = Batch::new();
        let mut sizes = None;
        if let Ns::Link = ns {
            return Err(Errno::EPERM.into());
        }
        if let Ns::Lov = ns {
            if self.opens.lock().migrations.contains_key(&fid) {
                // Its pending layout's bytes would be confused with the new one's.
                return Err(Errno::EBUSY.into());
            }
            self.set_layout_xattr(&mut rec, value)?;
        } else if let Ns::AclAccess | Ns::AclDefault = ns {
            self.set_acl(
                &mut b,
                fid,
                &mut rec,
                cred,
                matches!(ns, Ns::AclAccess),
                value,
            )?;
        } else {
            let key = xattr_key(fid, name);
            let old = self.store.engine().get(Cf::Xattr, &key)?.map(|v| v.len());
            let exists = old.is_some();
            if flags & XATTR_CREATE != 0 && exists {
                return Err(Errno::EEXIST.into());
            }
            if (flags & XATTR_REPLACE != 0 || value.is_none()) && !exists {
                return Err(Errno::ENODATA.into());
            }
            let after = self
                .stored_xattr_sizes(fid)?
                .with(name, old, value.as_ref().map(Vec::len));
            if value.is_some() {
                after.check()?;
            }
            match value {
                Some(v) => {
                    rec.flags &= !lode_store::records::INODE_NO_XATTRS;
                    b.put(Cf::Xattr, key, v)
                }
                None => b.delete(Cf::Xattr, key),
            }
            sizes = Some(after);
        }
        rec.ctime = now;
        put_inode(&mut b, fid, &rec);
        let r = self.commit(ctx, b, &Reply::Setxattr(Empty {}));
        // What is remembered must be what is stored: the sizes this change left, or
        // (an ACL's change, or a failed commit) nothing, to be read again.
        let mut known = self.xattr_sizes.lock();
        match sizes.filter(|_| r.is_ok()) {
            Some(after) => {
                if known.len() >= crate::XATTR_SIZES_MAX {
                    known.clear();
                }
                known.insert(fid, after);
            }
            None => {
                known.remove(&fid);
            }
        }
        r
    }

    /// May `cred` access inode `fid` (`rec`) for `want` (MAY_* bits)? Its mode bits
    /// decide, with its access ACL if it has one and Linux would consult it (read only
    /// then: see `acl::consulted`). An ACL that cannot be read refuses.
    pub(crate) fn may(&self, fid: Fid, rec: &InodeRec, cred: &Cred, want: u32) -> bool {
        let attr = rec.attr(fid);
        if rec.flags & INODE_ACL == 0 || !acl::consulted(&attr, cred) {
            return lode_base::perm::may_access(&attr, cred, want);
        }
        match self.stored_acl(fid, acl::ACCESS) {
            Ok(a) => acl::may_access(&attr, a.as_ref(), cred, want),
            Err(e) => {
                tracing::warn!(%fid, "reading the access ACL: {e:?}");
                false
            }
        }
    }

    /// The ACL stored as `name` (`None`: none).
    fn stored_acl(&self, fid: Fid, name: &[u8]) -> OpResult<Option<Acl>> {
        match self.store.engine().get(Cf::Xattr, &xattr_key(fid, name))? {
            Some(v) => Ok(Acl::parse(&v)?),
            None => Ok(None),
        }
    }

    /// What a new inode (`rec`, its mode as asked, umask not applied) made in
    /// directory `parent` gets: with a default ACL there, `posix_acl_create`'s mode and
    /// ACLs (a new directory inherits the default ACL itself too), added to `b`;
    /// without one, the mode less `umask`. Symlinks take neither.
    pub(crate) fn inherit_acls(
        &self,
        b: &mut Batch,
        parent: Fid,
        dir: &InodeRec,
        fid: Fid,
        rec: &mut InodeRec,
        umask: u32,
    ) -> OpResult<()> {
        if rec.mode & libc::S_IFMT == libc::S_IFLNK {
            return Ok(());
        }
        let def = if dir.flags & INODE_DEFACL != 0 {
            self.stored_acl(parent, acl::DEFAULT)?
        } else {
            None
        };
        let Some(def) = def else {
            rec.mode &= !(umask & 0o777);
            return Ok(());
        };
        let (bits, access) = def.inherit(rec.mode);
        rec.mode = (rec.mode & !0o777) | bits;
        if let Some(a) = access {
            b.put(Cf::Xattr, xattr_key(fid, acl::ACCESS), a.to_xattr());
            rec.flags |= INODE_ACL;
            rec.flags &= !INODE_NO_XATTRS;
        }
        if is_dir(rec.mode) {
            b.put(Cf::Xattr, xattr_key(fid, acl::DEFAULT), def.to_xattr());
            rec.flags |= INODE_DEFACL;
            rec.flags &= !INODE_NO_XATTRS;
        }
        Ok(())
    }

    /// A chmod of an inode with an access ACL: the ACL's owner, mask and other entries
    /// follow the new mode (`posix_acl_chmod`), in the same batch.
    pub(crate) fn chmod_acl(&self, b: &mut Batch, fid: Fid, rec: &InodeRec) -> OpResult<()> {
        if rec.flags & INODE_ACL == 0 {
            return Ok(());
        }
        if let Some(mut a) = self.stored_acl(fid, acl::ACCESS)? {
            // Only its entries' bits change, not its size (`xattr_sizes` holds).
            a.chmod(rec.mode);
            b.put(Cf::Xattr, xattr_key(fid, acl::ACCESS), a.to_xattr());
        }
        Ok(())
    }

    /// Sets (`value`) or removes an access or default ACL, as Linux's `set_posix_acl`:
    /// an access ACL sets the mode's bits (and is not stored when the mode says it
    /// all), dropping set-group-ID for a caller outside the file's group; a default
    /// ACL only on a directory. XATTR_CREATE/XATTR_REPLACE do not apply to ACLs.
    fn set_acl(
        &self,
        b: &mut Batch,
        fid: Fid,
        rec: &mut InodeRec,
        cred: &Cred,
        access: bool,
        value: Option<Vec<u8>>,
    ) -> OpResult<()> {
        let parsed = match &value {
            Some(v) => Acl::parse(v)?,
            None => None,
        };
        let (name, flag) = if access {
            (acl::ACCESS, INODE_ACL)
        } else {
            if !is_dir(rec.mode) {
                return match parsed {
                    Some(_) => Err(Errno::EACCES.into()),
                    None => Ok(()),
                };
            }
            (acl::DEFAULT, INODE_DEFACL)
        };
        let key = xattr_key(fid, name);
        if let Some(a) = parsed.as_ref().filter(|_| access) {
            rec.mode = (rec.mode & !0o777) | a.mode_bits();
            if cred.uid != 0 && !cred.in_group(rec.gid) {
                rec.mode &= !libc::S_ISGID;
            }
        }
        // Removed, or an access ACL the mode now says all of.
        let Some(a) = parsed.filter(|a| !(access && a.is_minimal())) else {
            b.delete(Cf::Xattr, key);
            rec.flags &= !flag;
            return Ok(());
        };
        let bytes = a.to_xattr();
        let old = self.store.engine().get(Cf::Xattr, &key)?.map(|v| v.len());
        self.stored_xattr_sizes(fid)?
            .with(name, old, Some(bytes.len()))
            .check()?;
        b.put(Cf::Xattr, key, bytes);
        rec.flags |= flag;
        rec.flags &= !INODE_NO_XATTRS;
        Ok(())
    }

    /// The name and value bytes of the xattrs stored for inode `fid`: as its last
    /// change left them if that is remembered, else read.
    fn stored_xattr_sizes(&self, fid: Fid) -> OpResult<XattrSizes> {
        if let Some(s) = self.xattr_sizes.lock().get(&fid) {
            return Ok(*s);
        }
        self.read_xattr_sizes(fid)
    }

    /// The name and value bytes of the xattrs stored for inode `fid`, read from the
    /// store (every one of them: the reason to remember them).
    pub(crate) fn read_xattr_sizes(&self, fid: Fid) -> OpResult<XattrSizes> {
        let mut s = XattrSizes::default();
        self.store
            .engine()
            .scan(Cf::Xattr, &fid.to_bytes(), b"", &mut |k, v| {
                s.names += k.len() - 16 + 1;
                s.values += v.len();
                true
            })?;
        Ok(s)
    }

    /// setstripe through the xattr: a directory's default layout (removed with an
    /// empty value), or a regular file's layout while it has no data yet.
    fn set_layout_xattr(&self, rec: &mut InodeRec, value: Option<Vec<u8>>) -> OpResult<()> {
        let ft = rec.mode & libc::S_IFMT;
        let parsed = match &value {
            Some(v) if !v.is_empty() => {
                Some(lode_base::layout::decode_xattr(v).ok_or(Errno::EINVAL)?)
            }
            _ => None,
        };
        if ft == libc::S_IFDIR {
            if let Some(l) = &parsed {
                self.check_template(l)?;
            }
            rec.layout = parsed;
            return Ok(());
        }
        if ft != libc::S_IFREG {
            return Err(Errno::EINVAL.into());
        }
        let Some(l) = parsed else {
            return Err(Errno::EINVAL.into());
        };
        if rec.flags & (INODE_DATA | lode_store::records::INODE_OBJECTS) != 0 || rec.size != 0 {
            // Lustre refuses to change the layout of a file that has objects with data.
            return Err(Errno::EBUSY.into());
        }
        let new: Layout = self.new_layout(Some(&l), None, false)?;
        rec.layout = Some(Layout {
            gen: rec.layout.as_ref().map_or(0, |o| o.gen + 1),
            ..new
        });
        Ok(())
    }
}

fn size_reply(value: Vec<u8>, size: u32) -> OpResult<XattrRep> {
    let len = value.len() as u32;
    if size == 0 {
        return Ok(XattrRep {
            value: Vec::new(),
            size: len,
        });
    }
    if len > size {
        return Err(Errno::ERANGE.into());
    }
    Ok(XattrRep { value, size: len })
}
