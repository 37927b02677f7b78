//! What the `trace` probe can trace on this machine (`kernmlops trace-list
//! [PATTERN]`): tracepoints with their fields and the types their columns
//! get, kernel functions with their BTF prototypes, and for each kind of
//! hook whether this kernel lets it attach, and why not.

use std::path::Path;

use kernmlops_sys::{btf, features, trace_format, tracefs};

/// Longest pattern accepted.
const MAX_PATTERN: usize = 256;
/// Entries shown with their fields or prototypes; more matches are listed
/// by name (tracepoints) or counted (functions).
const DETAIL_LIMIT: usize = 50;
/// Kernel functions listed by name at most.
const FUNCTION_LIMIT: usize = 500;

/// One kind of hook and whether it attaches here.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HookKind {
    /// How an event of this kind is written (`sched:sched_switch`).
    pub spelling: &'static str,
    pub what: &'static str,
    pub available: bool,
    /// Why not, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One field of a tracepoint and the column type it becomes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TraceField {
    pub name: String,
    pub decl: String,
    pub column: String,
}

/// A tracepoint: `system:event`, and its fields when they were read.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Tracepoint {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<TraceField>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A kernel function with its prototype (`int do_madvise(struct mm_struct *mm, ...)`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelFunction {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prototype: Option<String>,
}

/// What `trace-list` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TraceListing {
    pub pattern: Option<String>,
    pub kinds: Vec<HookKind>,
    pub tracepoints: Vec<Tracepoint>,
    pub tracepoints_matched: usize,
    pub functions: Vec<KernelFunction>,
    pub functions_matched: usize,
    /// Why tracepoints or functions could not be listed at all.
    pub notes: Vec<String>,
}

/// Why the listing cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum TraceListError {
    #[error("pattern {0:?}: at most {MAX_PATTERN} bytes of letters, digits, _ : . - * ?")]
    BadPattern(String),
}

/// A shell-style match of `name` against `pattern` (`*` any run, `?` one
/// character); a pattern without wildcards matches as a substring.
pub fn matches(pattern: &str, name: &str) -> bool {
    if !pattern.contains(['*', '?']) {
        return name.contains(pattern);
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative glob with one backtrack point: linear in practice.
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Why tracefs cannot be read: not mounted, or mounted where this user
/// cannot look (it is root's: `tracefs_root` cannot see into it).
fn tracefs_missing() -> String {
    let mounted = tracefs::TRACEFS_PATHS
        .iter()
        .any(|p| std::fs::read_dir(p).is_err() && Path::new(p).exists());
    if mounted {
        "tracefs is not readable by this user (run as root)".to_owned()
    } else {
        "tracefs is not mounted (kernmlops mounts it when it runs)".to_owned()
    }
}

fn kinds() -> Vec<HookKind> {
    let tp = match tracefs::tracefs_root() {
        Some(_) => (true, None),
        None => (false, Some(tracefs_missing())),
    };
    let from = |f: features::Feature| {
        let reason = (!f.detail.is_empty()).then_some(f.detail);
        (f.available, reason)
    };
    let btf_ok = from(features::btf());
    let fentry = from(features::fentry());
    let kprobes = from(features::kprobes());
    let uprobes = from(features::uprobes());
    let func = if fentry.0 {
        (true, None)
    } else if kprobes.0 {
        (
            true,
            Some("through kprobes (fentry/fexit are not allowed here)".to_owned()),
        )
    } else {
        (
            false,
            Some(format!(
                "neither fentry/fexit ({}) nor kprobes ({})",
                fentry.1.as_deref().unwrap_or("not available"),
                kprobes.1.as_deref().unwrap_or("not available")
            )),
        )
    };
    let kind = |spelling, what, (available, reason): (bool, Option<String>)| HookKind {
        spelling,
        what,
        available,
        reason: if available {
            reason.filter(|r| r.starts_with("through"))
        } else {
            reason
        },
    };
    vec![
        kind(
            "SYSTEM:EVENT",
            "a tracepoint, every field of its format file",
            tp.clone(),
        ),
        kind(
            "tp_btf:EVENT(arg->path, ...)",
            "a tracepoint's BTF arguments, through pointers",
            if btf_ok.0 { tp } else { btf_ok.clone() },
        ),
        kind(
            "fentry:FUNCTION(arg, ...)",
            "a kernel function's arguments at entry",
            fentry.clone(),
        ),
        kind(
            "fexit:FUNCTION(arg, ...) ret",
            "a kernel function's arguments and return value",
            fentry,
        ),
        kind(
            "func:FUNCTION(arg, ...) latency",
            "entry and exit joined: one row with the duration",
            func,
        ),
        kind(
            "uprobe:BINARY:FUNCTION(arg0, ...) latency",
            "a user function",
            uprobes,
        ),
    ]
}

fn tracepoint_names(root: &Path) -> Result<Vec<String>, String> {
    let file = root.join("available_events");
    let text = std::fs::read_to_string(&file).map_err(|e| {
        format!(
            "{}: {}",
            file.display(),
            kernmlops_sys::private::strip_os_error(&e)
        )
    })?;
    let mut names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.contains(':') && l.len() < 256)
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

fn fields_of(root: &Path, name: &str) -> Result<Vec<TraceField>, String> {
    let (system, event) = name.split_once(':').unwrap_or((name, ""));
    let f = trace_format::read(root, system, event).map_err(|e| e.to_string())?;
    Ok(f.own_fields()
        .map(|x| TraceField {
            name: x.name.clone(),
            decl: x.decl.clone(),
            column: x.ty.to_string(),
        })
        .collect())
}

fn prototype(b: &btf::Btf, name: &str) -> Option<String> {
    let id = b.type_id_of_kind(name, btf::Kind::Func)?;
    let proto = b.func_proto(id)?;
    let args: Vec<String> = proto
        .params
        .iter()
        .map(|(n, t)| {
            let ty = b.c_name(*t);
            if n.is_empty() {
                ty
            } else if ty.ends_with('*') {
                format!("{ty}{n}")
            } else {
                format!("{ty} {n}")
            }
        })
        .collect();
    let ret = b.c_name(proto.ret);
    let sep = if ret.ends_with('*') { "" } else { " " };
    Some(format!("{ret}{sep}{name}({})", args.join(", ")))
}

/// Lists what can be traced here, limited to names matching `pattern`.
/// Without a pattern, tracepoints are listed by name only and kernel
/// functions are counted.
pub fn list(pattern: Option<&str>) -> Result<TraceListing, TraceListError> {
    if let Some(p) = pattern {
        let ok = !p.is_empty()
            && p.len() <= MAX_PATTERN
            && p.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '.' | '-' | '*' | '?')
            });
        if !ok {
            return Err(TraceListError::BadPattern(p.to_owned()));
        }
    }
    let mut notes = Vec::new();
    let mut tracepoints = Vec::new();
    let mut tracepoints_matched = 0;
    match tracefs::tracefs_root() {
        None => notes.push(format!("{}: no tracepoints listed", tracefs_missing())),
        Some(root) => match tracepoint_names(&root) {
            Err(e) => notes.push(e),
            Ok(names) => {
                let hit: Vec<String> = names
                    .into_iter()
                    .filter(|n| pattern.is_none_or(|p| matches(p, n)))
                    .collect();
                tracepoints_matched = hit.len();
                let detail = pattern.is_some() && hit.len() <= DETAIL_LIMIT;
                tracepoints = hit
                    .into_iter()
                    .map(|name| {
                        let (fields, error) = if detail {
                            match fields_of(&root, &name) {
                                Ok(f) => (Some(f), None),
                                Err(e) => (None, Some(e)),
                            }
                        } else {
                            (None, None)
                        };
                        Tracepoint {
                            name,
                            fields,
                            error,
                        }
                    })
                    .collect();
            }
        },
    }
    let mut functions = Vec::new();
    let mut functions_matched = 0;
    match btf::Btf::vmlinux() {
        Err(e) => notes.push(format!(
            "{}: {}: no kernel functions listed",
            tracefs::BTF_VMLINUX,
            kernmlops_sys::private::strip_os_error(&e)
        )),
        Ok(b) => {
            let mut names: Vec<&str> = b.names_of_kind(btf::Kind::Func).collect();
            names.sort_unstable();
            names.dedup();
            match pattern {
                None => functions_matched = names.len(),
                Some(p) => {
                    let hit: Vec<&str> = names.into_iter().filter(|n| matches(p, n)).collect();
                    functions_matched = hit.len();
                    let detail = hit.len() <= DETAIL_LIMIT;
                    functions = hit
                        .into_iter()
                        .take(FUNCTION_LIMIT)
                        .map(|n| KernelFunction {
                            name: n.to_owned(),
                            prototype: if detail { prototype(&b, n) } else { None },
                        })
                        .collect();
                }
            }
        }
    }
    Ok(TraceListing {
        pattern: pattern.map(str::to_owned),
        kinds: kinds(),
        tracepoints,
        tracepoints_matched,
        functions,
        functions_matched,
        notes,
    })
}

/// The listing as text, as `perf-list` and `power-list` print theirs.
pub fn render(l: &TraceListing) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    s.push_str("hooks on this kernel:\n");
    for k in &l.kinds {
        let state = match (&k.available, &k.reason) {
            (true, None) => "yes".to_owned(),
            (true, Some(r)) => format!("yes, {r}"),
            (false, r) => format!("no: {}", r.as_deref().unwrap_or("not available")),
        };
        let _ = writeln!(s, "  {:<42} {}  ({})", k.spelling, state, k.what);
    }
    let _ = writeln!(
        s,
        "\ntracepoints{}: {}",
        l.pattern
            .as_deref()
            .map(|p| format!(" matching {p:?}"))
            .unwrap_or_default(),
        l.tracepoints_matched
    );
    for t in &l.tracepoints {
        match (&t.fields, &t.error) {
            (Some(fields), _) => {
                let _ = writeln!(s, "  {}", t.name);
                for f in fields {
                    let _ = writeln!(s, "      {:<24} {:<10} {}", f.name, f.column, f.decl);
                }
            }
            (None, Some(e)) => {
                let _ = writeln!(s, "  {}  (fields unreadable: {e})", t.name);
            }
            (None, None) => {
                let _ = writeln!(s, "  {}", t.name);
            }
        }
    }
    match &l.pattern {
        None => {
            let _ = writeln!(
                s,
                "\nkernel functions in BTF: {} (give a PATTERN to list them with prototypes)",
                l.functions_matched
            );
        }
        Some(p) => {
            let _ = writeln!(
                s,
                "\nkernel functions matching {p:?}: {}",
                l.functions_matched
            );
            for f in &l.functions {
                let _ = writeln!(s, "  {}", f.prototype.as_deref().unwrap_or(&f.name));
            }
            if l.functions_matched > l.functions.len() {
                let _ = writeln!(
                    s,
                    "  ... and {} more",
                    l.functions_matched - l.functions.len()
                );
            }
        }
    }
    for n in &l.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s.push_str(
        "\nTrace one in [probes.trace] events = [\"sched:sched_switch\"] (or `kernmlops run --trace EVENT`); \
         fields and prototypes are listed when a PATTERN matches at most 50.\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_and_substring_matching() {
        assert!(matches("sched_switch", "sched:sched_switch"));
        assert!(matches("sched:*", "sched:sched_switch"));
        assert!(matches("*:sched_sw?tch", "sched:sched_switch"));
        assert!(!matches("sched:*wake", "sched:sched_wakeup"));
        assert!(matches("a*b*c", "aXbYc"));
        assert!(!matches("a*b*c", "aXbY"));
        assert!(matches("*", ""));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(list(Some("a/b")).is_err());
        assert!(list(Some("")).is_err());
        assert!(list(Some(&"x".repeat(300))).is_err());
    }

    #[test]
    fn tracepoints_and_functions_of_this_kernel() {
        let l = list(Some("sched:sched_switch")).unwrap();
        if tracefs::tracefs_root().is_some() && l.notes.is_empty() {
            assert_eq!(l.tracepoints_matched, 1, "{:?}", l.tracepoints);
            let f = l.tracepoints[0].fields.as_ref().expect("fields");
            let prev = f.iter().find(|x| x.name == "prev_comm").expect("prev_comm");
            assert_eq!(prev.column, "char[16]");
            assert!(f.iter().any(|x| x.name == "next_pid" && x.column == "i32"));
        }
        let l = list(Some("do_madvise")).unwrap();
        if Path::new(tracefs::BTF_VMLINUX).exists() {
            let f = l
                .functions
                .iter()
                .find(|f| f.name == "do_madvise")
                .expect("do_madvise in BTF");
            let p = f.prototype.as_deref().unwrap();
            assert!(p.starts_with("int do_madvise(struct mm_struct *"), "{p}");
        }
        let text = render(&l);
        assert!(text.contains("hooks on this kernel:"));
    }
}
