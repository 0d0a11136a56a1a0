//! The lode wire format: frames, the fixed header, opcodes and message bodies.
//!
//! A frame is `u32 length | u32 crc32c | header (64 bytes) | body`, little endian,
//! where `length` counts everything after itself and the CRC covers header and body.
//! Bodies are `postcard` encodings of the structs in [`msg`], chosen by the opcode.
//! Formats are frozen by golden byte tests: changing one is a [`PROTO_VERSION`] bump.

pub mod frame;
pub mod msg;

pub use frame::{Frame, FrameError, Header, HEADER_LEN, MAGIC, PROTO_VERSION};
pub use msg::*;
