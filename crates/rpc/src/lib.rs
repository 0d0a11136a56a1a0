//! RPC over TCP: framed connections, the server's dispatch to a bounded pool of service
//! threads, the client import (xids, modify tags, in-flight limits, reconnect and
//! resend), per-opcode statistics and fault injection (`fail_loc`).

pub mod admin;
pub mod auth;
pub mod fail;
pub mod import;
pub mod recovery;
pub mod server;
pub mod spin;
pub mod stats;
mod wire;

pub use import::{
    blocking_caller, client_handshake, handshake_reply, Import, ImportConfig, Response,
};
pub use server::{serve, CallbackChannel, Incoming, Outgoing, ServerConfig, Service};
pub use stats::OpStats;
pub use wire::{read_frame, read_raw, read_sealed};
