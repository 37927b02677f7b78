//! trace: typed tables from any tracepoint, kernel function or user
//! function named in configuration (`[probes.trace] events`), with no
//! build: one generic BPF object whose field fetches are planned here from
//! the tracepoint's format file or from BTF.

pub mod format;
pub mod plan;
pub mod spec;
