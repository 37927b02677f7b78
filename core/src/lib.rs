//! The kernmlops host: loads probe plugins, validates what they declare,
//! runs them, decodes their records into Arrow and writes one Arrow IPC file
//! per table, plus a manifest and a `system_info` table.
//!
//! The data path is probe -> [`collect`] (drain loop) -> [`decode`] ->
//! [`sink`]; plugins are found and checked by [`plugin`] and [`validate`].

pub mod clock;
pub mod collect;
pub mod config;
pub mod decode;
pub mod manifest;
pub mod plugin;
pub mod preflight;
pub mod sink;
pub mod system_info;
pub mod validate;
