//! The tests every probe crate shares, on the procfs probe: its
//! declaration against the host's spec, its settings' defaults, and a real
//! start and drain that fills `procfs_vmstat`.

use procfs::Procfs;

kernmlops_plugin_testing::probe_tests!(Procfs, rows_in = "procfs_vmstat");
