//! `lode lr-reader`: an MDT's server data, clients and reply records, laid out like
//! Lustre's `lr_reader` (the debug tool for `last_rcvd` and `reply_data`), from the
//! target's directory: on a stopped target, or read-only beside a running one.

use anyhow::{anyhow, Result};
use clap::Args;
use lode_base::config::{Role, TargetConfig};
use lode_store::mdt::ReplyRecord;
use lode_store::records::{self, ClientRec};
use lode_store::{Cf, Engine, RocksEngine};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Arguments of lr-reader.
#[derive(Args)]
pub struct LrArgs {
    /// Also print the clients (their slots: lode's client generation).
    #[arg(short = 'c', long = "client")]
    client: bool,
    /// Also print the reply records.
    #[arg(short = 'r', long = "reply")]
    reply: bool,
    /// The MDT's directory (the one given to `lode mds`).
    dir: PathBuf,
}

/// Runs lr-reader.
pub fn run(a: LrArgs) -> Result<()> {
    print!("{}", render(&a)?);
    Ok(())
}

fn render(a: &LrArgs) -> Result<String> {
    let cfg = TargetConfig::load(&a.dir, Role::Mdt).map_err(|e| anyhow!("lr-reader: {e}"))?;
    let db = a.dir.join(lode_store::MDT_DB_DIR);
    let e = RocksEngine::open_read_only(&db)
        .map_err(|e| anyhow!("lr-reader: {}: {e}", db.display()))?;
    let last = lode_store::mdt::last_transno_on_disk(&e)?;
    let mut out = String::new();
    let _ = writeln!(out, "last_rcvd:");
    let _ = writeln!(out, "  uuid: {}", cfg.uuid);
    let _ = writeln!(out, "  last_transaction: {last}");
    let _ = writeln!(out, "  target_index: {}", cfg.index);

    // Reply records by slot: (tag, record).
    let mut replies: BTreeMap<u32, Vec<(u16, ReplyRecord)>> = BTreeMap::new();
    let mut bad = None;
    e.scan(Cf::Reply, b"", b"", &mut |k, v| {
        if k.len() == 6 {
            let slot = u32::from_be_bytes([k[0], k[1], k[2], k[3]]);
            let tag = u16::from_be_bytes([k[4], k[5]]);
            match records::decode::<ReplyRecord>("reply", v) {
                Ok(r) => replies.entry(slot).or_default().push((tag, r)),
                Err(e) => bad = Some(e),
            }
        }
        true
    })?;
    if let Some(e) = bad {
        return Err(anyhow!("lr-reader: {e}"));
    }
    if a.client {
        let mut clients = Vec::new();
        e.scan(Cf::Clients, b"", b"", &mut |k, v| {
            if let Ok(c) = records::decode::<ClientRec>("clients", v) {
                clients.push((String::from_utf8_lossy(k).into_owned(), c.slot));
            }
            true
        })?;
        clients.sort_by_key(|c| c.1);
        for (uuid, slot) in clients {
            let recs = replies.get(&slot).map(Vec::as_slice).unwrap_or_default();
            let newest = recs.iter().max_by_key(|(_, r)| (r.transno, r.xid));
            let _ = writeln!(out);
            let _ = writeln!(out, "  {uuid}:");
            let _ = writeln!(out, "    generation: {slot}");
            let _ = writeln!(
                out,
                "    last_transaction: {}",
                newest.map_or(0, |(_, r)| r.transno)
            );
            let _ = writeln!(out, "    last_xid: {}", newest.map_or(0, |(_, r)| r.xid));
            let _ = writeln!(
                out,
                "    last_result: {}",
                newest.map_or(0, |(_, r)| r.status)
            );
            let _ = writeln!(out, "    last_data: 0");
        }
    }
    if a.reply {
        let _ = writeln!(out);
        let _ = writeln!(out, "reply_data:");
        for (i, (slot, tag, r)) in replies
            .iter()
            .flat_map(|(s, v)| v.iter().map(move |(t, r)| (*s, *t, r)))
            .enumerate()
        {
            if i > 0 {
                let _ = writeln!(out);
            }
            let _ = writeln!(out, "  {i}:");
            let _ = writeln!(out, "    client_generation: {slot}");
            let _ = writeln!(out, "    tag: {tag}");
            let _ = writeln!(out, "    last_transaction: {}", r.transno);
            let _ = writeln!(out, "    last_xid: {}", r.xid);
            let _ = writeln!(out, "    last_result: {}", r.status);
            let _ = writeln!(out, "    last_data: 0");
        }
    }
    Ok(out)
}
