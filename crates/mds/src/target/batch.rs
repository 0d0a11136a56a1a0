//! Batched requests (Lustre's `MDS_BATCH`, LU-14393): one RPC carrying up to
//! `BATCH_SUBS_MAX` sub-requests, executed in order, each with its own status.
//!
//! A read batch (`Batch`: lookups and getattrs) runs on the thread that received it,
//! with the same lock intents as the single requests. A modifying batch
//! (`BatchModify`: creates, unlinks and setattrs too) is admitted on its tag as any
//! change; each change takes its locks (parking the batch, not the thread, while clients
//! are called back) and writes its own reply record under `(slot, tag, index + 1)`, so a
//! resent batch answers the changes already made from their records and runs only the
//! rest. The reply leaves once every change in it is committed: the client then has
//! nothing of the batch to replay after a restart, and a batch that lost its reply in
//! a crash is resent whole and finds exactly the records that survived.

use super::{Export, Mdt, LOCK_RETRIES};
use crate::ldlm::{Acquired, MdtLocks, Want};
use crate::{OpError, OpResult};
use lode_base::limits::{BATCH_SUBS_MAX, BATCH_SUB_BYTES_MAX};
use lode_base::Errno;
use lode_proto::frame::FLAG_RESENT;
use lode_proto::{BatchRep, BatchReq, DecodeError, Header, MdtRequest, Reply, SubRep, SubReq};
use lode_rpc::server::Deferred;
use lode_rpc::{Incoming, Outgoing};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use tracing::{debug, warn};

/// A modifying batch on its way: what is left to run and what has been answered.
struct BatchRun {
    header: Header,
    body: Vec<u8>,
    peer: SocketAddr,
    conn_id: u64,
    exp: Arc<Export>,
    todo: VecDeque<Result<MdtRequest, Errno>>,
    results: Vec<SubRep>,
    /// Where the reply goes once the batch has been parked.
    d: Option<Deferred>,
}

impl BatchRun {
    fn incoming(&self) -> Incoming {
        Incoming::local(self.header, self.body.clone(), self.peer, self.conn_id)
    }
}

/// What running a batch came to.
enum Step {
    /// Every sub-request answered.
    Done(Box<BatchRun>),
    /// Waiting for locks; whoever frees them runs the rest.
    Parked,
}

impl Mdt {
    /// One sub-request, decoded on its own: a malformed one fails with EPROTO, an
    /// opcode a batch may not carry with EINVAL, and neither stops the others.
    fn decode_sub(&self, inc: &Incoming, sub: &SubReq, modify: bool) -> Result<MdtRequest, Errno> {
        if sub.body.len() > BATCH_SUB_BYTES_MAX {
            return Err(Errno::EPROTO);
        }
        let mut req = MdtRequest::decode(sub.opcode, &sub.body).map_err(|e| match e {
            DecodeError::Body(_) => Errno::EPROTO,
            DecodeError::Opcode(_) | DecodeError::Service(_) => Errno::EINVAL,
        })?;
        let allowed = match &req {
            MdtRequest::Getattr(_) | MdtRequest::Lookup(_) => true,
            // An open-create leaves an open handle, which a batch (never replayed)
            // could not bring back after a restart.
            MdtRequest::Create(r) => modify && r.open_flags.is_none(),
            MdtRequest::Unlink(_) | MdtRequest::Setattr(_) => modify,
            _ => false,
        };
        if !allowed {
            return Err(Errno::EINVAL);
        }
        self.squash_cred(inc, &mut req);
        Ok(req)
    }

    /// A read batch: every sub-request answered in order, here.
    pub(super) fn batch_reads(
        &self,
        inc: &Incoming,
        exp: &Export,
        r: BatchReq,
    ) -> OpResult<BatchRep> {
        if r.subs.len() > BATCH_SUBS_MAX {
            return Err(Errno::EPROTO.into());
        }
        let mut results = Vec::with_capacity(r.subs.len());
        for sub in &r.subs {
            results.push(match self.decode_sub(inc, sub, false) {
                Ok(req) => sub_rep(self.run_sub(inc, exp, req, 0)),
                Err(e) => failed(e),
            });
        }
        Ok(BatchRep { results })
    }

    /// A modifying batch, admitted on its tag by [`Mdt::modify`].
    pub(super) fn batch_modify(&self, inc: &Incoming, exp: &Arc<Export>, r: BatchReq) -> Outgoing {
        let (tag, xid) = (inc.header.tag, inc.header.xid);
        if r.subs.len() > BATCH_SUBS_MAX {
            warn!(peer = %inc.peer, client = %exp.uuid, subs = r.subs.len(), "batch over {BATCH_SUBS_MAX} sub-requests: refused");
            self.untag(exp.slot, tag, xid);
            return self.error_out(Errno::EPROTO.into());
        }
        let todo = r
            .subs
            .iter()
            .map(|s| self.decode_sub(inc, s, true))
            .collect();
        let run = BatchRun {
            header: inc.header,
            body: inc.body.clone(),
            peer: inc.peer,
            conn_id: inc.conn_id,
            exp: exp.clone(),
            todo,
            results: Vec::with_capacity(r.subs.len()),
            d: None,
        };
        match self.batch_step(inc, run, None) {
            Step::Done(run) => self.batch_answer(Some(inc), *run),
            Step::Parked => Outgoing::parked(),
        }
    }

    /// Runs sub-requests until the batch is done or must wait for locks. `held` are the
    /// locks granted for the first one left (and what they were chosen as), if it
    /// waited for them.
    fn batch_step(
        &self,
        inc: &Incoming,
        mut run: BatchRun,
        mut held: Option<(MdtLocks, Vec<Want>)>,
    ) -> Step {
        let resent = run.header.flags & FLAG_RESENT != 0;
        let exp = run.exp.clone();
        while let Some(next) = run.todo.pop_front() {
            let sub = run.results.len() as u16 + 1;
            let req = match next {
                Ok(req) => req,
                Err(e) => {
                    run.results.push(failed(e));
                    continue;
                }
            };
            if !req.opcode().is_modify() {
                run.results.push(sub_rep(self.run_sub(inc, &exp, req, 0)));
                continue;
            }
            let mut locks = None;
            match held.take() {
                // Chosen before the wait: still right only if the names did not move
                // meanwhile.
                Some((l, want)) if self.wants_hold(&run.exp, &req, &want) => locks = Some(l),
                Some(_) => {}
                None if resent => match self.ns.store.reply_record(exp.slot, run.header.tag, sub) {
                    Ok(Some(rec)) if rec.xid == run.header.xid => {
                        run.results.push(SubRep {
                            status: rec.status,
                            transno: rec.transno,
                            body: rec.body,
                        });
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        run.results.push(sub_rep(self.error_out(OpError::Store(e))));
                        continue;
                    }
                },
                None => {}
            }
            for _ in 0..LOCK_RETRIES {
                if locks.is_some() {
                    break;
                }
                let want = self.lock_wants(&run.exp, &req);
                if want.is_empty() {
                    break;
                }
                match self.ldlm.try_acquire(&want) {
                    Some(l) if self.wants_hold(&run.exp, &req, &want) => locks = Some(l),
                    Some(_) => {}
                    None => {
                        run.todo.push_front(Ok(req));
                        return match self.batch_wait(inc, run, want) {
                            Wait::Parked => Step::Parked,
                            Wait::Granted(run, held) => self.batch_step(inc, run, Some(held)),
                            Wait::Cannot(mut run) => {
                                run.todo.pop_front();
                                run.results.push(failed(Errno::EAGAIN));
                                self.batch_step(inc, run, None)
                            }
                        };
                    }
                }
            }
            let mut out = self.run_sub(inc, &exp, req, sub);
            drop(locks);
            self.record_failure(&exp, run.header.tag, run.header.xid, sub, &mut out);
            run.results.push(sub_rep(out));
        }
        Step::Done(Box::new(run))
    }

    /// Parks the batch (its next sub-request first in `todo`) until `want` is granted,
    /// calling back the clients in the way.
    fn batch_wait(&self, inc: &Incoming, mut run: BatchRun, want: Vec<Want>) -> Wait {
        if run.d.is_none() {
            run.d = inc.defer();
        }
        if run.d.is_none() {
            // Built in-process, with no connection to answer on later.
            return Wait::Cannot(run);
        }
        let slot = run.exp.slot;
        let parked = Arc::new(Mutex::new(Some(run)));
        let (me, parked2, want2) = (self.me.clone(), parked.clone(), want.clone());
        let acquired = self.ldlm.acquire(Some(slot), &want, move |locks| {
            let Some(mdt) = me.upgrade() else { return };
            let Some(run) = parked2.lock().take() else {
                return;
            };
            let inc = run.incoming();
            if let Step::Done(run) = mdt.batch_step(&inc, run, Some((locks, want2))) {
                // A parked batch has its Deferred: the reply goes through it.
                let _ = mdt.batch_answer(None, *run);
            }
        });
        match acquired {
            Acquired::Granted(locks) => match parked.lock().take() {
                Some(run) => Wait::Granted(run, (locks, want)),
                None => Wait::Parked,
            },
            Acquired::Waiting(cbs) => {
                debug!(callbacks = cbs.len(), "batch waits for lock cancels");
                self.call_back(&cbs);
                Wait::Parked
            }
        }
    }

    /// Frees the batch's tag and answers it once every change it made is committed.
    /// Returns the reply if it can go now from the calling thread; otherwise it goes
    /// through the batch's `Deferred` and this returns a parked outcome.
    fn batch_answer(&self, inc: Option<&Incoming>, mut run: BatchRun) -> Outgoing {
        let transno = run.results.iter().map(|r| r.transno).max().unwrap_or(0);
        self.untag(run.exp.slot, run.header.tag, run.header.xid);
        let body = Reply::BatchModify(BatchRep {
            results: std::mem::take(&mut run.results),
        })
        .encode();
        let out = move |last_committed| Outgoing {
            status: 0,
            transno,
            last_committed,
            body,
            ..Default::default()
        };
        let committed = self.ns.store.last_committed();
        if transno <= committed {
            return match run.d {
                Some(d) => {
                    d.send(out(committed));
                    Outgoing::parked()
                }
                None => out(committed),
            };
        }
        match run.d.or_else(|| inc.and_then(|i| i.defer())) {
            None => match self.ns.store.sync() {
                Ok(c) => out(c),
                Err(e) => self.error_out(OpError::Store(e)),
            },
            Some(d) => {
                self.ns.store.when_committed(Box::new(move |r| {
                    d.send(match r {
                        Ok(c) => out(c),
                        Err(e) => {
                            warn!("batch commit failed: {e}");
                            Outgoing::error(Errno::EIO)
                        }
                    })
                }));
                Outgoing::parked()
            }
        }
    }
}

/// What waiting for a sub-request's locks came to.
enum Wait {
    /// Parked: whoever frees the locks runs the rest.
    Parked,
    /// Freed meanwhile: go on with them.
    Granted(BatchRun, (MdtLocks, Vec<Want>)),
    /// No way to answer later (an in-process call): that change fails with EAGAIN.
    Cannot(BatchRun),
}

/// A sub-request that did not run.
fn failed(e: Errno) -> SubRep {
    SubRep {
        status: e.status(),
        transno: 0,
        body: Vec::new(),
    }
}

/// A sub-request's outcome, from what its single request would have answered.
fn sub_rep(out: Outgoing) -> SubRep {
    SubRep {
        status: out.status,
        transno: out.transno,
        body: if out.status < 0 { Vec::new() } else { out.body },
    }
}
