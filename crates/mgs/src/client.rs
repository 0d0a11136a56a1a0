//! Talking to the MGS: registering a target, fetching the config.

use lode_base::Errno;
use lode_proto::{Empty, MgsConfigRep, MgsRegisterReq, Reply, Request, TargetInfo};
use lode_rpc::{Import, ImportConfig};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;

/// An import of the MGS.
pub fn mgs_import(
    addr: &str,
    fsname: &str,
    uuid: &str,
    key: Vec<u8>,
    timeout: Duration,
    rt: Handle,
) -> Arc<Import> {
    Import::new(
        addr.to_string(),
        ImportConfig {
            fsname: fsname.to_string(),
            target: "MGS".into(),
            client_uuid: uuid.to_string(),
            key,
            flags: 0,
            max_rpcs_in_flight: 2,
            max_mod_rpcs: 1,
            timeout,
            resend_interval: Duration::from_secs(5),
        },
        rt,
    )
}

/// Registers a target, proving it with the target's `secret` (empty: a target formatted
/// before there were secrets). The MGS asks for the secret itself (ENODATA) the first
/// time.
pub async fn register(
    mgs: &Arc<Import>,
    fsname: &str,
    target: TargetInfo,
    secret: &[u8],
) -> Result<(), Errno> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let proof = if secret.is_empty() {
        Vec::new()
    } else {
        lode_rpc::auth::register_proof(secret, &target.name, &target.addr, &target.uuid, stamp)
    };
    let mut req = MgsRegisterReq {
        fsname: fsname.to_string(),
        target,
        stamp,
        proof,
        secret: Vec::new(),
    };
    match mgs.call(Request::MgsRegister(req.clone())).await {
        Err(Errno::ENODATA) if !secret.is_empty() => {
            req.secret = secret.to_vec();
            mgs.call(Request::MgsRegister(req)).await.map(|_| ())
        }
        r => r.map(|_| ()),
    }
}

/// Fetches the file system config.
pub async fn fetch_config(mgs: &Arc<Import>) -> Result<MgsConfigRep, Errno> {
    match mgs.call(Request::MgsConfig(Empty {})).await?.reply {
        Reply::MgsConfig(c) => Ok(c),
        _ => Err(Errno::EPROTO),
    }
}
