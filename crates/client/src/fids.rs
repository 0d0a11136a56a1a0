//! FID allocation from sequences granted by the MDT (SEQ_ALLOC).

use crate::Client;
use lode_base::{Errno, Fid};
use lode_proto::{Empty, Reply, Request};
use parking_lot::Mutex;

#[derive(Default)]
pub(crate) struct FidPool {
    cur: Mutex<Option<(u64, u32, u32)>>,
    refill: tokio::sync::Mutex<()>,
}

impl Client {
    /// A new FID for an object this client creates.
    pub async fn alloc_fid(&self) -> Result<Fid, Errno> {
        loop {
            if let Some(f) = self.take_fid() {
                return Ok(f);
            }
            let _g = self.fids.refill.lock().await;
            if self
                .fids
                .cur
                .lock()
                .is_some_and(|(_, next, width)| next <= width)
            {
                continue;
            }
            let Reply::SeqAlloc(s) = self.md(Request::SeqAlloc(Empty {})).await? else {
                return Err(Errno::EPROTO);
            };
            if s.width == 0 || s.seq < lode_base::fid::FIRST_NORMAL_SEQ {
                return Err(Errno::EPROTO);
            }
            *self.fids.cur.lock() = Some((s.seq, 1, s.width));
        }
    }

    fn take_fid(&self) -> Option<Fid> {
        let mut cur = self.fids.cur.lock();
        let (seq, next, width) = cur.as_mut()?;
        if *next > *width {
            return None;
        }
        let f = Fid::new(*seq, *next, 0);
        *next += 1;
        Some(f)
    }
}
