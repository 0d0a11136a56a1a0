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

/// Registers a target.
pub async fn register(mgs: &Arc<Import>, fsname: &str, target: TargetInfo) -> Result<(), Errno> {
    mgs.call(Request::MgsRegister(MgsRegisterReq {
        fsname: fsname.to_string(),
        target,
    }))
    .await
    .map(|_| ())
}

/// Fetches the file system config.
pub async fn fetch_config(mgs: &Arc<Import>) -> Result<MgsConfigRep, Errno> {
    match mgs.call(Request::MgsConfig(Empty {})).await?.reply {
        Reply::MgsConfig(c) => Ok(c),
        _ => Err(Errno::EPROTO),
    }
}
