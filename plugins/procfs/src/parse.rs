//! Parsers of the files the probe reads, on text only (no I/O), so crafted
//! contents test them: pressure (PSI), `key value` lists (`/proc/vmstat`,
//! `cpu.stat`, `memory.stat`), per-CPU tables (`/proc/interrupts`,
//! `/proc/softirqs`), `/proc/diskstats`, `/proc/net/dev` and `io.stat`.
//! Each calls back once per value and returns how many lines it could not
//! read, so nothing is allocated per sample.

/// `cpu` of a counter the kernel keeps for the whole system rather than per
/// CPU (`ERR` and `MIS` in `/proc/interrupts`).
pub const ALL_CPUS: u32 = u32::MAX;

/// One line of a pressure file: `some avg10=0.00 avg60=0.00 avg300=0.00
/// total=0`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time in microseconds since boot.
    pub total_us: u64,
}

/// A pressure file: its `some` line and, since Linux 5.13 for CPU (always
/// for memory and I/O), its `full` line.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Psi {
    pub some: PsiLine,
    pub full: Option<PsiLine>,
}

fn psi_line(rest: &str) -> Option<PsiLine> {
    let mut line = PsiLine::default();
    let mut seen = 0u8;
    for word in rest.split_whitespace() {
        let (k, v) = word.split_once('=')?;
        match k {
            "avg10" => (line.avg10, seen) = (v.parse().ok()?, seen | 1),
            "avg60" => (line.avg60, seen) = (v.parse().ok()?, seen | 2),
            "avg300" => (line.avg300, seen) = (v.parse().ok()?, seen | 4),
            "total" => (line.total_us, seen) = (v.parse().ok()?, seen | 8),
            _ => {}
        }
    }
    (seen == 15).then_some(line)
}

/// A pressure file's text; `None` when it has no valid `some` line.
pub fn psi(text: &str) -> Option<Psi> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("some ") {
            some = psi_line(rest);
        } else if let Some(rest) = line.strip_prefix("full ") {
            full = psi_line(rest);
        }
    }
    Some(Psi { some: some?, full })
}

/// `key value` lines (`/proc/vmstat`, `cpu.stat`, `memory.stat`): calls
/// `f(key, value)` for each; returns the number of other non-empty lines.
pub fn key_values(text: &str, mut f: impl FnMut(&str, u64)) -> u64 {
    let mut bad = 0;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (None, _, _) => {}
            (Some(k), Some(v), None) => match v.parse() {
                Ok(v) => f(k, v),
                Err(_) => bad += 1,
            },
            _ => bad += 1,
        }
    }
    bad
}

/// Whether `name` is an interrupt counter kept for the whole system (one
/// number, not one per CPU): `ERR` and `MIS` on x86, `Err` on arm.
fn system_wide_irq(name: &str) -> bool {
    name.eq_ignore_ascii_case("err") || name.eq_ignore_ascii_case("mis")
}

/// A per-CPU table (`/proc/interrupts`, `/proc/softirqs`): a header of
/// `CPU<n>` columns (only online CPUs in `/proc/interrupts`), then `name:`
/// and one count per column. Calls `f(key, cpu, value)`; for interrupts the
/// key of a numbered line is `<irq>:<its last word>` (the action's name,
/// `24:ACPI:Ged`, `28:virtio0-config`), and `ERR`/`MIS` are given once with
/// [`ALL_CPUS`]. `cpus` and `key` are the caller's reused buffers. Returns
/// the number of lines that could not be read, or `None` without a header.
pub fn per_cpu(
    text: &str,
    interrupts: bool,
    cpus: &mut Vec<u32>,
    key: &mut String,
    mut f: impl FnMut(&str, u32, u64),
) -> Option<u64> {
    let mut lines = text.lines();
    let header = lines.next()?;
    cpus.clear();
    for word in header.split_whitespace() {
        cpus.push(word.strip_prefix("CPU")?.parse().ok()?);
    }
    if cpus.is_empty() {
        return None;
    }
    let mut bad = 0;
    for line in lines {
        let Some((name, rest)) = line.split_once(':') else {
            if !line.trim().is_empty() {
                bad += 1;
            }
            continue;
        };
        let name = name.trim();
        if name.is_empty() {
            bad += 1;
            continue;
        }
        let mut words = rest.split_whitespace();
        if interrupts && system_wide_irq(name) {
            match words.next().map(str::parse::<u64>) {
                Some(Ok(v)) => f(name, ALL_CPUS, v),
                _ => bad += 1,
            }
            continue;
        }
        // The counts first, one per CPU column; stop at the first word that
        // is not one (a line with fewer counts is read as far as it goes).
        let mut values = 0;
        let mut rest_words = words.clone();
        for _ in cpus.iter() {
            match rest_words.clone().next().map(str::parse::<u64>) {
                Some(Ok(_)) => {
                    rest_words.next();
                    values += 1;
                }
                _ => break,
            }
        }
        if values != cpus.len() {
            bad += 1;
            continue;
        }
        key.clear();
        key.push_str(name);
        if interrupts && name.bytes().all(|b| b.is_ascii_digit()) {
            if let Some(last) = rest_words.last() {
                key.push(':');
                key.push_str(last);
            }
        }
        for &cpu in cpus.iter() {
            if let Some(Ok(v)) = words.next().map(str::parse::<u64>) {
                f(key, cpu, v);
            }
        }
    }
    Some(bad)
}

/// Fields of a `/proc/diskstats` line after major, minor and name, in the
/// kernel's order (Documentation/admin-guide/iostats.rst): 11 before Linux
/// 4.18, 15 with discards, 17 with flushes (5.5).
pub const DISK_FIELDS: usize = 17;

/// One `/proc/diskstats` line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskLine<'a> {
    pub major: u32,
    pub minor: u32,
    pub name: &'a str,
    /// The kernel's fields, 0 past `fields`.
    pub stats: [u64; DISK_FIELDS],
    /// How many fields the line had.
    pub fields: usize,
}

/// `/proc/diskstats`: calls `f` per device line; returns the number of
/// lines that could not be read (fewer than 11 fields, not numbers).
pub fn diskstats(text: &str, mut f: impl FnMut(&DiskLine<'_>)) -> u64 {
    let mut bad = 0;
    'lines: for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(major), Some(minor), Some(name)) = (words.next(), words.next(), words.next())
        else {
            if !line.trim().is_empty() {
                bad += 1;
            }
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
            bad += 1;
            continue;
        };
        let mut d = DiskLine {
            major,
            minor,
            name,
            stats: [0; DISK_FIELDS],
            fields: 0,
        };
        for (slot, word) in d.stats.iter_mut().zip(words.by_ref()) {
            match word.parse() {
                Ok(v) => *slot = v,
                Err(_) => {
                    bad += 1;
                    continue 'lines;
                }
            }
            d.fields += 1;
        }
        if d.fields < 11 {
            bad += 1;
            continue;
        }
        f(&d);
    }
    bad
}

/// Counters of a `/proc/net/dev` line, receive then transmit.
pub const NET_FIELDS: usize = 16;

/// `/proc/net/dev`: two header lines, then `name: 16 counters`. Calls
/// `f(interface, counters)`; returns the number of lines that could not be
/// read.
pub fn net_dev(text: &str, mut f: impl FnMut(&str, &[u64; NET_FIELDS])) -> u64 {
    let mut bad = 0;
    let mut values = [0u64; NET_FIELDS];
    for line in text.lines() {
        // Header lines have '|' and no interface.
        if line.contains('|') {
            continue;
        }
        let Some((name, rest)) = line.split_once(':') else {
            if !line.trim().is_empty() {
                bad += 1;
            }
            continue;
        };
        let name = name.trim();
        let mut n = 0;
        for word in rest.split_whitespace() {
            match (values.get_mut(n), word.parse()) {
                (Some(slot), Ok(v)) => *slot = v,
                _ => {
                    n = usize::MAX;
                    break;
                }
            }
            n += 1;
        }
        if n != NET_FIELDS || name.is_empty() {
            bad += 1;
            continue;
        }
        f(name, &values);
    }
    bad
}

/// A cgroup's `io.stat`: `maj:min key=value ...` per device. Calls
/// `f(key, value)` with the key `<maj:min> <key>` (`8:0 rbytes`) written
/// into the reused `key`; returns the number of words that could not be
/// read.
pub fn io_stat(text: &str, key: &mut String, mut f: impl FnMut(&str, u64)) -> u64 {
    let mut bad = 0;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(device) = words.next() else {
            continue;
        };
        for word in words {
            let Some((k, v)) = word.split_once('=') else {
                bad += 1;
                continue;
            };
            let Ok(v) = v.parse() else {
                bad += 1;
                continue;
            };
            key.clear();
            key.push_str(device);
            key.push(' ');
            key.push_str(k);
            f(key, v);
        }
    }
    bad
}

/// Whether a `/proc/vmstat` key is a cumulative counter (events since
/// boot) rather than a gauge (pages now): the `nr_*` keys are gauges except
/// the few that count events.
pub fn vmstat_is_counter(key: &str) -> bool {
    match key.strip_prefix("nr_") {
        Some(rest) => matches!(
            rest,
            "dirtied" | "written" | "foll_pin_acquired" | "foll_pin_released"
        ),
        None => key != "workingset_nodes",
    }
}

/// Whether a `memory.stat` key is a cumulative counter (events) rather
/// than a size: page-fault, reclaim, working-set, THP, swap-in/out and
/// NUMA event counts.
pub fn memory_stat_is_counter(key: &str) -> bool {
    (key.starts_with("workingset_") && key != "workingset_nodes")
        || ["pg", "thp_", "zswp", "swpin", "swpout", "numa_"]
            .iter()
            .any(|p| key.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_lines_with_and_without_full() {
        let p = psi("some avg10=1.50 avg60=0.25 avg300=0.00 total=12345\n\
                     full avg10=0.10 avg60=0.00 avg300=0.00 total=99\n")
        .expect("psi");
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.avg60, 0.25);
        assert_eq!(p.some.total_us, 12345);
        assert_eq!(p.full.map(|f| f.total_us), Some(99));
        // CPU pressure before Linux 5.13: no full line.
        let p = psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n").expect("psi");
        assert_eq!((p.some.total_us, p.full), (7, None));
        for bad in [
            "",
            "garbage\n",
            "some avg10=x avg60=0 avg300=0 total=1\n",
            "some avg10=0 avg60=0 total=1\n",
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n",
        ] {
            assert_eq!(psi(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn key_value_lists_skip_what_is_not_a_pair() {
        let mut got = Vec::new();
        let bad = key_values(
            "nr_free_pages 100\npgfault 7\nodd\nx y\n\nthree a b\n",
            |k, v| {
                got.push((k.to_owned(), v));
            },
        );
        assert_eq!(got, [("nr_free_pages".into(), 100), ("pgfault".into(), 7)]);
        assert_eq!(bad, 3);
    }

    const INTERRUPTS: &str = "           CPU0       CPU1       \n\
  0:         36          0   IO-APIC   2-edge      timer\n\
 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n\
 28:          0          5 PCI-MSIX-0000:00:01.0   0-edge      virtio0-config\n\
 29:          3\n\
NMI:          4          2   Non-maskable interrupts\n\
LOC:     339851     259255   Local timer interrupts\n\
ERR:          9\n\
MIS:          0\n";

    fn collect(text: &str, interrupts: bool) -> (Vec<(String, u32, u64)>, Option<u64>) {
        let mut rows = Vec::new();
        let (mut cpus, mut key) = (Vec::new(), String::new());
        let bad = per_cpu(text, interrupts, &mut cpus, &mut key, |k, c, v| {
            rows.push((k.to_owned(), c, v))
        });
        (rows, bad)
    }

    #[test]
    fn interrupts_per_cpu_with_names_and_system_wide_counts() {
        let (rows, bad) = collect(INTERRUPTS, true);
        let want: Vec<(String, u32, u64)> = [
            ("0:timer", 0, 36),
            ("0:timer", 1, 0),
            ("24:ACPI:Ged", 0, 1),
            ("24:ACPI:Ged", 1, 0),
            ("28:virtio0-config", 0, 0),
            ("28:virtio0-config", 1, 5),
            ("NMI", 0, 4),
            ("NMI", 1, 2),
            ("LOC", 0, 339851),
            ("LOC", 1, 259255),
            ("ERR", ALL_CPUS, 9),
            ("MIS", ALL_CPUS, 0),
        ]
        .iter()
        .map(|&(k, c, v)| (k.to_owned(), c, v))
        .collect();
        assert_eq!(rows, want);
        assert_eq!(bad, Some(1), "the line with one count for two CPUs");
    }

    #[test]
    fn per_cpu_columns_follow_the_header_cpu_ids() {
        // CPU1 offline: /proc/interrupts lists online CPUs only.
        let (rows, bad) = collect("    CPU0   CPU2\n  1:  5  6  IO-APIC 1-edge i8042\n", true);
        assert_eq!(bad, Some(0));
        assert_eq!(
            rows,
            [("1:i8042".to_owned(), 0, 5), ("1:i8042".to_owned(), 2, 6)]
        );
        let (rows, bad) = collect(
            "                    CPU0       CPU1\n          HI:          5          0\n   NET_RX:  1 2\n",
            false,
        );
        assert_eq!(bad, Some(0));
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[2], ("NET_RX".to_owned(), 0, 1));
        assert_eq!(collect("no header\n", false).1, None);
        assert_eq!(collect("", false).1, None);
    }

    #[test]
    fn diskstats_of_every_kernel_generation() {
        let text = "   7       0 loop0 8 0 64 0 68 0 272 95 0 100 185 0 0 0 0 34 89\n\
                    \x20  8       0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n\
                    \x20  8      16 sdb 1 2 3 4 5 6 7 8 9 10 11\n\
                    \x20  8      32 sdc 1 2 3\n\
                    \x20  x       0 bad 1 2 3 4 5 6 7 8 9 10 11\n";
        let mut got = Vec::new();
        let bad = diskstats(text, |d| {
            got.push((d.name.to_owned(), d.major, d.minor, d.fields, d.stats))
        });
        assert_eq!(bad, 2);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, "loop0");
        assert_eq!(got[0].3, 17);
        assert_eq!(got[0].4[2], 64);
        assert_eq!(got[0].4[16], 89);
        assert_eq!((got[1].1, got[1].2, got[1].3), (8, 0, 15));
        assert_eq!(got[1].4[15], 0, "no flush fields before 5.5");
        assert_eq!(got[2].3, 11);
    }

    #[test]
    fn net_dev_skips_headers_and_short_lines() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n\
    lo: 186445748 2019930    0    0    0     0          0         0 186445748 2019930    0    0    0     0       0          0\n\
  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n\
  bad0: 1 2 3\n\
  bad1: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n";
        let mut got = Vec::new();
        let bad = net_dev(text, |n, v| got.push((n.to_owned(), *v)));
        assert_eq!(bad, 2);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "lo");
        assert_eq!(got[0].1[0], 186445748);
        assert_eq!(got[1].1[8], 9, "tx_bytes");
        assert_eq!(got[1].1[15], 16);
    }

    #[test]
    fn io_stat_keys_name_the_device() {
        let mut key = String::new();
        let mut got = Vec::new();
        let bad = io_stat(
            "8:0 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n259:1 rbytes=x wios=2 junk\n",
            &mut key,
            |k, v| got.push((k.to_owned(), v)),
        );
        assert_eq!(bad, 2);
        assert_eq!(got[0], ("8:0 rbytes".to_owned(), 4096));
        assert_eq!(got.len(), 7);
        assert_eq!(got[6], ("259:1 wios".to_owned(), 2));
    }

    #[test]
    fn counters_and_gauges() {
        for (key, counter) in [
            ("pgfault", true),
            ("nr_free_pages", false),
            ("nr_dirtied", true),
            ("workingset_nodes", false),
            ("workingset_refault_anon", true),
            ("thp_fault_alloc", true),
        ] {
            assert_eq!(vmstat_is_counter(key), counter, "vmstat {key}");
        }
        for (key, counter) in [
            ("anon", false),
            ("file", false),
            ("pgfault", true),
            ("workingset_nodes", false),
            ("thp_fault_alloc", true),
            ("zswpout", true),
        ] {
            assert_eq!(memory_stat_is_counter(key), counter, "memory.stat {key}");
        }
    }
}
