//! The kernmlops host: loads probe plugins, validates what they declare,
//! runs them, decodes their records into Arrow and writes one Arrow IPC file
//! per table, plus a manifest and a `system_info` table.
//!
//! The data path is probe -> [`collect`] (drain loop) -> [`decode`] ->
//! [`sink`]; plugins are found and checked by [`plugin`] against the plugin
//! API's specification (`kernmlops_plugin_api::spec`).

/// `println!` for what the host reports on standard output, except that a
/// closed stdout (`kernmlops run | head`) loses the line instead of
/// panicking: a run, repair or experiment goes on and closes its files.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout(), $($arg)*);
    }};
}

/// `print!` as [`outln!`] is `println!`.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stdout(), $($arg)*);
    }};
}

pub mod collect;
pub mod collection;
pub mod config;
pub mod decode;
pub mod dump;
pub mod export;
pub mod features;
pub mod files;
pub mod graph;
pub mod indicator;
pub mod machine;
pub mod manifest;
pub mod perf_list;
pub mod plugin;
pub mod power;
pub mod preflight;
pub mod sink;
pub mod system_info;
#[cfg(test)]
mod test_tree;
pub mod trace_list;
pub mod trust;
pub mod undo;

/// Tunes glibc's allocator for the ingest path: freed batch buffers stay in
/// the heap instead of going back to the kernel, so each flush does not
/// page-fault fresh memory in again. Measured by `benchmarks` `ingest`: about
/// twice the records per second. Call once at start-up.
pub fn tune_allocator() {
    // SAFETY: mallopt only changes allocator tunables; it is called before
    // any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}
