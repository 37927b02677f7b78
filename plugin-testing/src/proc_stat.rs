//! A process's own accounting from `/proc/<pid>/stat`, the oracle of tests
//! that check CPU time (a zombie still has it, so a test can read it after
//! the process ended and before it is reaped).

/// The fields after `comm`: `stat`'s field 3 (state) onwards. `comm` may
/// hold spaces and parentheses, so it ends at the last `)`.
fn fields_after_comm(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = text.get(text.rfind(')')? + 2..)?;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// The process's state letter (`R`, `S`, `Z`, ...), `?` when it is gone.
pub fn state(pid: u32) -> char {
    fields_after_comm(pid)
        .and_then(|f| f.first()?.chars().next())
        .unwrap_or('?')
}

/// User + system CPU time of the process in microseconds, with its reaped
/// children's (`cutime` + `cstime`) when `with_children`. Panics when the
/// process is gone: the test has lost its oracle.
pub fn cpu_us(pid: u32, with_children: bool) -> u64 {
    let f = fields_after_comm(pid).unwrap_or_else(|| panic!("reading /proc/{pid}/stat"));
    // utime, stime, cutime, cstime are fields 14-17; `f` starts at field 3.
    let tick = |i: usize| -> u64 {
        f.get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("/proc/{pid}/stat field {}", i + 3))
    };
    let mut ticks = tick(11) + tick(12);
    if with_children {
        ticks += tick(13) + tick(14);
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    ticks * 1_000_000 / hz.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_process_through_its_life() {
        let me = std::process::id();
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        assert!(cpu_us(me, false) > 0, "50 ms of spinning");
        assert!(cpu_us(me, true) >= cpu_us(me, false));

        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while state(pid) != 'S' && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(state(pid), 'S', "a sleeping child");
        child.kill().expect("kill");
        while state(pid) != 'Z' && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(state(pid), 'Z', "killed, not yet reaped");
        assert!(cpu_us(pid, true) < 1_000_000, "a zombie keeps its times");
        child.wait().expect("reap");
        assert_eq!(state(pid), '?', "reaped");
    }
}
