//! POSIX access control lists (POSIX.1e draft 17, as Linux has them): the xattr
//! encoding of `system.posix_acl_access` and `system.posix_acl_default`, and the
//! rules the MDT applies with them. Linux's own functions are the reference: the
//! checks match `posix_acl_valid`, `posix_acl_permission` (with the shortcuts of
//! `acl_permission_check`, so the MDT and a mount's kernel agree), `posix_acl_chmod`
//! and `posix_acl_create`.

use crate::{Attr, Cred, Errno};

/// The xattr holding an inode's access ACL.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The xattr holding a directory's default ACL, inherited by what is made in it.
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// Whether xattr `name` is one of the two ACLs.
pub fn is_acl_name(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

/// Entries an ACL may hold (ext4 keeps about as many in one block).
pub const ENTRIES_MAX: usize = 1024;
/// The largest xattr value of a valid ACL.
pub const XATTR_MAX: usize = 4 + 8 * ENTRIES_MAX;

const VERSION: u32 = 2;
/// The id stored for entries that name no user or group.
const UNDEFINED_ID: u32 = u32::MAX;

/// Tag of the owner's entry.
pub const USER_OBJ: u16 = 0x01;
/// Tag of a named user's entry.
pub const USER: u16 = 0x02;
/// Tag of the owning group's entry.
pub const GROUP_OBJ: u16 = 0x04;
/// Tag of a named group's entry.
pub const GROUP: u16 = 0x08;
/// Tag of the mask: the most a named entry or the owning group may be granted.
pub const MASK: u16 = 0x10;
/// Tag of everyone else's entry.
pub const OTHER: u16 = 0x20;

/// One entry: a tag, the rwx bits it grants, and for named entries the uid or gid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// One of the tags above.
    pub tag: u16,
    /// `r` 4, `w` 2, `x` 1.
    pub perm: u16,
    /// The uid (`USER`) or gid (`GROUP`); unused by the other tags.
    pub id: u32,
}

/// A valid ACL, entries in the order Linux requires (by tag, as the tags above are
/// ordered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Parses an xattr value. `Ok(None)`: a header with no entries, which Linux takes
    /// as removing the ACL. EINVAL for anything `posix_acl_valid` refuses.
    pub fn parse(bytes: &[u8]) -> Result<Option<Acl>, Errno> {
        if bytes.len() < 4 || !(bytes.len() - 4).is_multiple_of(8) {
            return Err(Errno::EINVAL);
        }
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        if word(0) != VERSION {
            return Err(Errno::EOPNOTSUPP);
        }
        let n = (bytes.len() - 4) / 8;
        if n == 0 {
            return Ok(None);
        }
        if n > ENTRIES_MAX {
            return Err(Errno::EINVAL);
        }
        let entries = (0..n)
            .map(|k| {
                let i = 4 + 8 * k;
                let tag = u16::from_le_bytes([bytes[i], bytes[i + 1]]);
                let perm = u16::from_le_bytes([bytes[i + 2], bytes[i + 3]]);
                let named = tag == USER || tag == GROUP;
                Entry {
                    tag,
                    perm,
                    id: if named { word(i + 4) } else { UNDEFINED_ID },
                }
            })
            .collect();
        let acl = Acl { entries };
        acl.valid()?;
        Ok(Some(acl))
    }

    /// `posix_acl_valid`: one owner, owning group and other entry, named entries
    /// between them in tag order, and a mask exactly when a named entry needs one.
    fn valid(&self) -> Result<(), Errno> {
        #[derive(PartialEq)]
        enum State {
            UserObj,
            User,
            Group,
            Other,
            Done,
        }
        let mut state = State::UserObj;
        let mut needs_mask = false;
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return Err(Errno::EINVAL);
            }
            state = match (e.tag, state) {
                (USER_OBJ, State::UserObj) => State::User,
                (USER, State::User) if e.id != UNDEFINED_ID => {
                    needs_mask = true;
                    State::User
                }
                (GROUP_OBJ, State::User) => State::Group,
                (GROUP, State::Group) if e.id != UNDEFINED_ID => {
                    needs_mask = true;
                    State::Group
                }
                (MASK, State::Group) => State::Other,
                (OTHER, State::Other) => State::Done,
                (OTHER, State::Group) if !needs_mask => State::Done,
                _ => return Err(Errno::EINVAL),
            };
        }
        if state == State::Done {
            Ok(())
        } else {
            Err(Errno::EINVAL)
        }
    }

    /// The xattr value of this ACL, as Linux writes it.
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.entries.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    /// Builds an ACL from entries (tests and tools); EINVAL as [`Acl::parse`].
    pub fn from_entries(mut entries: Vec<Entry>) -> Result<Acl, Errno> {
        for e in &mut entries {
            if e.tag != USER && e.tag != GROUP {
                e.id = UNDEFINED_ID;
            }
        }
        let acl = Acl { entries };
        acl.valid()?;
        Ok(acl)
    }

    /// The entries, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// True if the ACL says no more than permission bits can (owner, group and other
    /// entries only): Linux then stores no ACL, only the mode.
    pub fn is_minimal(&self) -> bool {
        self.entries.len() == 3
    }

    fn perm_of(&self, tag: u16) -> Option<u16> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    /// The rwx bits (0o777) of the mode that goes with this ACL: the owner's entry,
    /// the mask (the owning group's entry without one), and other's.
    pub fn mode_bits(&self) -> u32 {
        let u = self.perm_of(USER_OBJ).unwrap_or(0) as u32;
        let g = self
            .perm_of(MASK)
            .or_else(|| self.perm_of(GROUP_OBJ))
            .unwrap_or(0) as u32;
        let o = self.perm_of(OTHER).unwrap_or(0) as u32;
        (u << 6) | (g << 3) | o
    }

    /// `posix_acl_chmod`: the owner's, mask (or owning group's) and other's entries
    /// take the new mode's bits; named entries stay.
    pub fn chmod(&mut self, mode: u32) {
        let has_mask = self.entries.iter().any(|e| e.tag == MASK);
        for e in &mut self.entries {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
    }

    /// `posix_acl_create`'s masking: a new inode in a directory whose default ACL is
    /// `self` gets this ACL limited by the mode the creator asked for (`mode`, its
    /// umask not applied), and the mode limited by the ACL. Returns the new mode's
    /// 0o777 bits and the inode's access ACL (`None` if the mode says it all).
    pub fn inherit(&self, mode: u32) -> (u32, Option<Acl>) {
        let mut acl = self.clone();
        let mut m = mode & 0o777;
        let mut equiv = true;
        let mut mask_at = None;
        let mut group_at = None;
        for (i, e) in acl.entries.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((m >> 6) & 7) as u16;
                    m &= ((e.perm as u32) << 6) | !0o700;
                }
                USER | GROUP => equiv = false,
                GROUP_OBJ => group_at = Some(i),
                OTHER => {
                    e.perm &= (m & 7) as u16;
                    m &= e.perm as u32 | !0o007;
                }
                MASK => {
                    mask_at = Some(i);
                    equiv = false;
                }
                _ => {}
            }
        }
        if let Some(i) = mask_at.or(group_at) {
            let e = &mut acl.entries[i];
            e.perm &= ((m >> 3) & 7) as u16;
            m &= ((e.perm as u32) << 3) | !0o070;
        }
        (m & 0o777, (!equiv).then_some(acl))
    }

    /// May `cred`, neither root nor the owner, access `attr` for `want` (MAY_* bits)
    /// under this access ACL? `posix_acl_permission`.
    fn permits_other(&self, attr: &Attr, cred: &Cred, want: u32) -> bool {
        let want = (want & 7) as u16;
        let mask = self.perm_of(MASK).unwrap_or(7);
        let mut found = false;
        for e in &self.entries {
            match e.tag {
                USER if e.id == cred.uid => return e.perm & mask & want == want,
                GROUP_OBJ | GROUP => {
                    let gid = if e.tag == GROUP_OBJ { attr.gid } else { e.id };
                    if cred.in_group(gid) {
                        found = true;
                        if e.perm & want == want {
                            return e.perm & mask & want == want;
                        }
                    }
                }
                OTHER => return !found && e.perm & want == want,
                _ => {}
            }
        }
        false
    }
}

/// Whether an access ACL on `attr`'s inode, if it has one, decides `cred`'s access:
/// as Linux, only for callers neither root nor the owner, and only when the mode's
/// group bits (the ACL's mask) grant something. Otherwise the mode bits alone do, and
/// nobody need read the ACL.
pub fn consulted(attr: &Attr, cred: &Cred) -> bool {
    cred.uid != 0 && cred.uid != attr.uid && attr.mode & 0o070 != 0
}

/// Linux's `generic_permission` with an ACL: may `cred` access `attr` for `want` (a
/// mask of MAY_*), `acl` being the inode's access ACL (`None`: none)? See
/// [`consulted`].
pub fn may_access(attr: &Attr, acl: Option<&Acl>, cred: &Cred, want: u32) -> bool {
    match acl {
        Some(acl) if consulted(attr, cred) => acl.permits_other(attr, cred, want),
        _ => crate::perm::may_access(attr, cred, want),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: u16, perm: u16, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        crate::perm::tests::attr(libc::S_IFREG | mode, uid, gid)
    }

    fn cred(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    /// user::rw- user:1001:rwx group::r-- group:50:rw- mask::rw- other::---
    fn named() -> Acl {
        Acl::from_entries(vec![
            e(USER_OBJ, 6, 0),
            e(USER, 7, 1001),
            e(GROUP_OBJ, 4, 0),
            e(GROUP, 6, 50),
            e(MASK, 6, 0),
            e(OTHER, 0, 0),
        ])
        .unwrap()
    }

    #[test]
    fn an_acl_survives_its_xattr_encoding_byte_for_byte() {
        let acl = named();
        let bytes = acl.to_xattr();
        assert_eq!(bytes.len(), 4 + 6 * 8);
        assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
        // user:1001:rwx, as setfacl writes it.
        assert_eq!(&bytes[12..20], &[2, 0, 7, 0, 0xe9, 3, 0, 0]);
        // Unnamed entries carry ACL_UNDEFINED_ID.
        assert_eq!(&bytes[8..12], &[0xff; 4]);
        assert_eq!(Acl::parse(&bytes).unwrap(), Some(acl));
        assert_eq!(Acl::parse(&2u32.to_le_bytes()).unwrap(), None);
    }

    #[test]
    fn what_posix_acl_valid_refuses_is_einval() {
        let bad = [
            // No mask though a named user needs one.
            vec![
                e(USER_OBJ, 6, 0),
                e(USER, 7, 5),
                e(GROUP_OBJ, 4, 0),
                e(OTHER, 0, 0),
            ],
            // Out of order.
            vec![e(GROUP_OBJ, 4, 0), e(USER_OBJ, 6, 0), e(OTHER, 0, 0)],
            // No other entry.
            vec![e(USER_OBJ, 6, 0), e(GROUP_OBJ, 4, 0)],
            // Two owner entries.
            vec![
                e(USER_OBJ, 6, 0),
                e(USER_OBJ, 6, 0),
                e(GROUP_OBJ, 4, 0),
                e(OTHER, 0, 0),
            ],
            // Bits beyond rwx.
            vec![e(USER_OBJ, 8, 0), e(GROUP_OBJ, 4, 0), e(OTHER, 0, 0)],
            // An unknown tag.
            vec![
                e(USER_OBJ, 6, 0),
                e(0x40, 4, 0),
                e(GROUP_OBJ, 4, 0),
                e(OTHER, 0, 0),
            ],
        ];
        for entries in bad {
            let acl = Acl { entries };
            assert_eq!(Acl::parse(&acl.to_xattr()), Err(Errno::EINVAL), "{acl:?}");
        }
        assert_eq!(Acl::parse(&[2, 0, 0]), Err(Errno::EINVAL));
        assert_eq!(Acl::parse(&[2, 0, 0, 0, 1]), Err(Errno::EINVAL));
        assert_eq!(Acl::parse(&[1, 0, 0, 0]), Err(Errno::EOPNOTSUPP));
        // A mask with no named entry is allowed (setfacl -m m::r writes one).
        let masked = Acl {
            entries: vec![
                e(USER_OBJ, 6, 0),
                e(GROUP_OBJ, 4, 0),
                e(MASK, 4, 0),
                e(OTHER, 0, 0),
            ],
        };
        assert!(Acl::parse(&masked.to_xattr()).unwrap().is_some());
    }

    #[test]
    fn named_entries_are_limited_by_the_mask_and_groups_are_tried_all() {
        let acl = named();
        let a = attr(acl.mode_bits(), 1000, 100);
        assert_eq!(acl.mode_bits(), 0o660);
        let yes = |c: &Cred, w| may_access(&a, Some(&acl), c, w);
        // The named user: rwx, masked to rw-.
        assert!(yes(&cred(1001, 1, &[]), 6));
        assert!(!yes(&cred(1001, 1, &[]), 1));
        // The owner goes by the owner bits; root by root's rules.
        assert!(yes(&cred(1000, 1, &[]), 6));
        assert!(!yes(&cred(1000, 1, &[]), 1));
        assert!(yes(&cred(0, 0, &[]), 6));
        // In the owning group (r--) and in group 50 (rw-): write granted by group 50.
        assert!(yes(&cred(7, 100, &[50]), 2));
        // In the owning group only: read yes, write no, and not other's bits.
        assert!(yes(&cred(7, 100, &[]), 4));
        assert!(!yes(&cred(7, 100, &[]), 2));
        // Nobody matched: other's entry.
        assert!(!yes(&cred(7, 7, &[]), 4));
    }

    #[test]
    fn a_mask_of_nothing_leaves_the_decision_to_the_mode_as_linux_does() {
        let mut acl = named();
        acl.chmod(0o604);
        assert_eq!(acl.mode_bits(), 0o604);
        let a = attr(0o604, 1000, 100);
        // The ACL would refuse user 1001; Linux's shortcut gives it other's read.
        assert!(may_access(&a, Some(&acl), &cred(1001, 1, &[]), 4));
    }

    #[test]
    fn chmod_sets_the_mask_not_the_owning_group() {
        let mut acl = named();
        acl.chmod(0o751);
        assert_eq!(acl.mode_bits(), 0o751);
        assert_eq!(acl.perm_of(GROUP_OBJ), Some(4));
        assert_eq!(acl.perm_of(MASK), Some(5));
        let mut plain =
            Acl::from_entries(vec![e(USER_OBJ, 6, 0), e(GROUP_OBJ, 4, 0), e(OTHER, 4, 0)]).unwrap();
        plain.chmod(0o700);
        assert_eq!(plain.mode_bits(), 0o700);
        assert!(plain.is_minimal());
    }

    #[test]
    fn a_default_acl_is_inherited_limited_by_the_mode_asked_for() {
        // default: user::rwx user:1001:rwx group::r-x mask::rwx other::r-x
        let def = Acl::from_entries(vec![
            e(USER_OBJ, 7, 0),
            e(USER, 7, 1001),
            e(GROUP_OBJ, 5, 0),
            e(MASK, 7, 0),
            e(OTHER, 5, 0),
        ])
        .unwrap();
        // A file asked for with 0666: no x anywhere; the mask becomes rw-.
        let (mode, acl) = def.inherit(0o666);
        assert_eq!(mode, 0o664);
        let acl = acl.unwrap();
        assert_eq!(
            acl.perm_of(USER),
            Some(7),
            "named entries are kept as they are"
        );
        assert_eq!(acl.perm_of(MASK), Some(6));
        assert_eq!(acl.perm_of(GROUP_OBJ), Some(5));
        assert_eq!(acl.mode_bits(), mode);
        // A minimal default ACL gives a mode and no ACL.
        let min =
            Acl::from_entries(vec![e(USER_OBJ, 7, 0), e(GROUP_OBJ, 5, 0), e(OTHER, 0, 0)]).unwrap();
        assert_eq!(min.inherit(0o777), (0o750, None));
    }
}
