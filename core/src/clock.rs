//! The one clock of kernmlops, re-exported from `kernmlops_sys::clock` so
//! host code keeps writing `crate::clock::uptime_us()`: `CLOCK_BOOTTIME` in
//! microseconds for every table, wall-clock time only in metadata.

pub use kernmlops_sys::clock::*;
