//! `lode bench`: mdtest-style metadata phases against a directory (any file system) or
//! natively through the lode client library.

pub mod md;
pub mod stats;
