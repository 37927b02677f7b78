//! The one-row `system_info` table: the machine, the kernel and the run.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, RecordBatch, StringArray, TimestampMicrosecondArray, UInt32Array, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use serde::Serialize;

use crate::{clock, decode};

/// Facts about this machine, read once per run.
#[derive(Debug, Clone, Serialize)]
pub struct SystemInfo {
    pub hostname: String,
    pub os: String,
    pub kernel_release: String,
    pub kernel_version: String,
    pub architecture: String,
    pub cpu_count: u32,
    pub memory_bytes: u64,
    pub boot_time_unix_us: i64,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn uname() -> (String, String, String, String) {
    // SAFETY: utsname is plain old data; uname fills it with NUL-terminated
    // strings.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return Default::default();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (
        field(&u.nodename),
        field(&u.release),
        field(&u.version),
        field(&u.machine),
    )
}

impl SystemInfo {
    pub fn gather() -> Self {
        let (hostname, kernel_release, kernel_version, architecture) = uname();
        let os = read_trim("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_default();
        let memory_bytes = read_trim("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let cpu_count = std::thread::available_parallelism().map_or(0, |n| n.get() as u32);
        let boot_time_unix_us = clock::unix_us() - clock::uptime_us() as i64;
        Self {
            hostname,
            os,
            kernel_release,
            kernel_version,
            architecture,
            cpu_count,
            memory_bytes,
            boot_time_unix_us,
        }
    }

    /// The table's single row.
    pub fn to_batch(
        &self,
        collection_id: &str,
        ts_uptime_us: u64,
        collection_start_unix_us: i64,
        plugins: &[String],
    ) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let utc = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Schema::new(vec![
            decode::collection_id_field(),
            Field::new("ts_uptime_us", DataType::UInt64, false),
            Field::new("hostname", DataType::Utf8, false),
            Field::new("os", DataType::Utf8, false),
            Field::new("kernel_release", DataType::Utf8, false),
            Field::new("kernel_version", DataType::Utf8, false),
            Field::new("architecture", DataType::Utf8, false),
            Field::new("cpu_count", DataType::UInt32, false),
            Field::new("memory_bytes", DataType::UInt64, false),
            Field::new("boot_time", utc(), false),
            Field::new("collection_time", utc(), false),
            Field::new("plugins", DataType::Utf8, false),
        ]);
        let s = |v: &str| Arc::new(StringArray::from(vec![v])) as ArrayRef;
        let t = |v: i64| {
            Arc::new(TimestampMicrosecondArray::from(vec![v]).with_timezone("UTC")) as ArrayRef
        };
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                decode::collection_id_column(collection_id, 1),
                Arc::new(UInt64Array::from(vec![ts_uptime_us])),
                s(&self.hostname),
                s(&self.os),
                s(&self.kernel_release),
                s(&self.kernel_version),
                s(&self.architecture),
                Arc::new(UInt32Array::from(vec![self.cpu_count])),
                Arc::new(UInt64Array::from(vec![self.memory_bytes])),
                t(self.boot_time_unix_us),
                t(collection_start_unix_us),
                s(&plugins.join(",")),
            ],
        )
    }
}
