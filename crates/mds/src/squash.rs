//! Root squash, as Lustre's `root_squash` and `nosquash_nids`: requests from root on a
//! client whose address is not listed are run as `UID:GID` instead, so root on a client
//! node is not root on the file system. Credentials come from the client (as in Lustre
//! without Kerberos): squash is what keeps a client's root from owning everything.

use lode_base::Cred;
use std::net::IpAddr;

/// One `nosquash_nids` entry: an IPv4 address whose octets may be ranges, Lustre's
/// `10.0.[2-10].[1-255]@tcp` (the `@tcp` is optional; `*` stands for any octet).
#[derive(Clone, Debug, PartialEq, Eq)]
struct NidRange([Vec<(u8, u8)>; 4]);

impl NidRange {
    fn parse(s: &str) -> Result<NidRange, String> {
        let addr = match s.split_once('@') {
            Some((a, net)) if net.starts_with("tcp") => a,
            Some(_) => return Err(format!("{s:?}: only tcp networks are known")),
            None => s,
        };
        if addr == "*" {
            return Ok(NidRange(std::array::from_fn(|_| vec![(0, 255)])));
        }
        let parts: Vec<&str> = addr.split('.').collect();
        if parts.len() != 4 {
            return Err(format!("{s:?}: not an IPv4 address or range"));
        }
        let mut octets: [Vec<(u8, u8)>; 4] = Default::default();
        for (o, p) in octets.iter_mut().zip(parts) {
            *o = octet(p).ok_or_else(|| format!("{s:?}: bad octet {p:?}"))?;
        }
        Ok(NidRange(octets))
    }

    fn matches(&self, ip: IpAddr) -> bool {
        let IpAddr::V4(v4) = ip else { return false };
        self.0
            .iter()
            .zip(v4.octets())
            .all(|(ranges, b)| ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&b)))
    }
}

/// `N`, `*`, or `[a-b,c,...]`.
fn octet(p: &str) -> Option<Vec<(u8, u8)>> {
    if p == "*" {
        return Some(vec![(0, 255)]);
    }
    let inner = match p.strip_prefix('[') {
        Some(r) => r.strip_suffix(']')?,
        None => return p.parse().ok().map(|n| vec![(n, n)]),
    };
    inner
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse().ok()?, b.parse().ok()?);
                (a <= b).then_some((a, b))
            }
            None => r.parse().ok().map(|n| (n, n)),
        })
        .collect()
}

/// The squash policy of an MDT.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Squash {
    uid: u32,
    gid: u32,
    nids: Vec<NidRange>,
    nids_text: String,
}

impl Squash {
    /// Whether root is squashed at all (`root_squash` not `0:0`).
    pub fn on(&self) -> bool {
        self.uid != 0 || self.gid != 0
    }

    /// `root_squash` as Lustre prints it.
    pub fn root(&self) -> String {
        format!("{}:{}", self.uid, self.gid)
    }

    /// `nosquash_nids` as set (`NONE` if empty).
    pub fn nids(&self) -> String {
        if self.nids.is_empty() {
            "NONE".into()
        } else {
            self.nids_text.clone()
        }
    }

    /// Sets `root_squash=UID:GID` (`0:0` turns squash off).
    pub fn set_root(&mut self, v: &str) -> Result<(), String> {
        let bad = || format!("root_squash {v:?}: expected UID:GID");
        let (u, g) = v.trim().split_once(':').ok_or_else(bad)?;
        self.uid = u.parse().map_err(|_| bad())?;
        self.gid = g.parse().map_err(|_| bad())?;
        Ok(())
    }

    /// Sets `nosquash_nids`: entries separated by spaces or commas outside brackets,
    /// or `NONE`.
    pub fn set_nids(&mut self, v: &str) -> Result<(), String> {
        let v = v.trim();
        if v.is_empty() || v == "NONE" {
            self.nids.clear();
            self.nids_text.clear();
            return Ok(());
        }
        let mut entries = Vec::new();
        let (mut cur, mut depth) = (String::new(), 0);
        for c in v.chars() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            if depth == 0 && (c == ' ' || c == ',') {
                if !cur.is_empty() {
                    entries.push(std::mem::take(&mut cur));
                }
            } else {
                cur.push(c);
            }
        }
        if !cur.is_empty() {
            entries.push(cur);
        }
        self.nids = entries
            .iter()
            .map(|e| NidRange::parse(e))
            .collect::<Result<_, _>>()?;
        self.nids_text = entries.join(" ");
        Ok(())
    }

    /// Squashes `cred` of a request from `peer`: root (uid or gid 0, and group 0
    /// among its groups) becomes the squash identity, unless squash is off or the
    /// peer is listed.
    pub fn apply(&self, peer: IpAddr, cred: &mut Cred) {
        if !self.on() {
            return;
        }
        if cred.uid != 0 && cred.gid != 0 && !cred.groups.contains(&0) {
            return;
        }
        if self.nids.iter().any(|n| n.matches(peer)) {
            return;
        }
        if cred.uid == 0 {
            cred.uid = self.uid;
        }
        if cred.gid == 0 {
            cred.gid = self.gid;
        }
        for g in cred.groups.iter_mut().filter(|g| **g == 0) {
            *g = self.gid;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Cred {
        Cred {
            uid: 0,
            gid: 0,
            groups: vec![0, 5],
        }
    }

    #[test]
    fn root_is_squashed_unless_its_address_is_listed() {
        let mut s = Squash::default();
        let ip = |a: &str| a.parse::<IpAddr>().expect("ip");
        let mut c = root();
        s.apply(ip("10.0.3.4"), &mut c);
        assert_eq!(c.uid, 0, "off by default");
        s.set_root("500:501").expect("set");
        s.set_nids("10.0.[2-10].[1-255]@tcp 192.168.1.7")
            .expect("set");
        assert_eq!(s.nids(), "10.0.[2-10].[1-255]@tcp 192.168.1.7");
        s.apply(ip("10.0.3.4"), &mut c);
        assert_eq!(c.uid, 0, "listed range keeps root");
        s.apply(ip("192.168.1.7"), &mut c);
        assert_eq!(c.uid, 0, "listed address keeps root");
        s.apply(ip("10.0.11.4"), &mut c);
        assert_eq!((c.uid, c.gid, c.groups.clone()), (500, 501, vec![501, 5]));
        let mut user = Cred {
            uid: 42,
            gid: 42,
            groups: vec![42],
        };
        s.apply(ip("10.0.11.4"), &mut user);
        assert_eq!(user.uid, 42, "others are left alone");
        s.set_nids("NONE").expect("set");
        assert_eq!(s.nids(), "NONE");
        for bad in [
            "10.0.1",
            "10.0.[5-2].1",
            "a.b.c.d",
            "10.0.0.1@o2ib",
            "300.0.0.1",
        ] {
            assert!(s.set_nids(bad).is_err(), "{bad}");
        }
        assert!(s.set_root("5").is_err());
        s.set_nids("*@tcp").expect("set");
        let mut c = root();
        s.apply(ip("172.16.0.1"), &mut c);
        assert_eq!(c.uid, 0);
    }
}
