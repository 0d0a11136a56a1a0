//! Shared helpers for the integration tests.
#![allow(dead_code)]

use lode_base::{Cred, Errno, Fid};
use lode_client::{Client, Session};
use lode_testkit::Cluster;
use std::path::Path;

/// A cluster of real `lode` processes with `osts` OSTs.
pub fn cluster(osts: u32) -> Cluster {
    Cluster::start(Path::new(env!("CARGO_BIN_EXE_lode")), osts)
}

/// The superuser.
pub fn root() -> Cred {
    Cred::root()
}

/// An unprivileged user (uid 1000, gid 1000).
pub fn user() -> Cred {
    Cred {
        uid: 1000,
        gid: 1000,
        groups: vec![],
    }
}

/// Resolves a path to its FID (no final symlink following).
pub fn fid(s: &Session, path: &str) -> Result<Fid, Errno> {
    s.run(s.client.resolve(&root(), path, false))
        .map(|b| b.attr.fid)
}

/// Creates directories along `path` as root and returns the last FID.
pub async fn mkdir_p(c: &Client, path: &str) -> Fid {
    let mut cur = Fid::ROOT;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        cur = match c.lookup(&root(), cur, part.as_bytes()).await {
            Ok(b) => b.attr.fid,
            Err(_) => {
                c.mkdir(&root(), cur, part.as_bytes(), 0o755, None)
                    .await
                    .expect("mkdir")
                    .attr
                    .fid
            }
        };
    }
    cur
}
