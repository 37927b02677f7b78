//! Low-level Linux helpers every part of kernmlops shares (host, SDK,
//! plugins, tests), in one place instead of copies: the one clock, duration
//! text, naming rules, cgroup v2, tracefs and its tracepoint format files, a
//! reader of the kernel's BTF and the kernel feature checks built on them,
//! and private files and folders
//! (`private`: fresh temporary folders, exclusive creates, atomic writes).
//!
//! Depends on `libc` only, so the stable-ABI crate (`kernmlops-plugin-api`)
//! may use it too. Errors are plain `std` error types: `io::Error` for what
//! the system reports, small enums with `Display` for parse errors, and
//! `String` reasons for "can this kernel do X" checks.

pub mod btf;
pub mod cgroup;
pub mod clock;
pub mod duration;
pub mod features;
pub mod names;
pub mod private;
pub mod trace_format;
pub mod tracefs;
