//! The event-spec language of `[probes.trace] events`: what to trace
//! (`sys:event`, `tp:`, `raw_tp:`, `tp_btf:`, `fentry:`, `fexit:`,
//! `kprobe:`, `kretprobe:`, `func:`, `uprobe:PATH:SYM`, `uretprobe:`), which
//! arguments or pointer paths to record (`(rq->__sector, str(arg1))`) and
//! how (`ret`, `latency`, `count`), plus the long form
//! `[[probes.trace.event]]`. Pure parsing: nothing here reads the kernel.
//!
//! Grammar (whitespace around tokens is ignored):
//! ```text
//! event   = [kind ":"] target ["(" [arg {"," arg}] ")"] {flag}
//! kind    = tp | raw_tp | tp_btf | fentry | fexit | kprobe | kretprobe
//!         | func | uprobe | uretprobe
//! target  = SYSTEM ":" EVENT          (tp, or no kind)
//!         | NAME                      (raw_tp, tp_btf, functions)
//!         | PATH ":" SYMBOL ["+" OFF] (uprobe, uretprobe)
//! arg     = [alias "="] ("str(" path ")" | path)
//! path    = IDENT {("->" | ".") IDENT}
//! flag    = ret | latency | count | "by=" KEY {"," KEY}
//!         | "interval=" DURATION | "exit=" SYSTEM ":" EVENT
//! ```
//!
//! `count` records no row per event: per key (`by`, default `tgid`) and
//! interval (default 100ms) one row with the number of events (and, with
//! `latency`, their total, least and greatest duration). `exit=` joins a
//! tracepoint with the tracepoint that ends it (`raw_syscalls:sys_enter
//! latency exit=raw_syscalls:sys_exit`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// How deep a pointer path may go (`a->b->c->d->e->f->g->h->i`: 8 steps).
pub const MAX_PATH_STEPS: usize = 8;
/// Most fields one event may record.
pub const MAX_FIELDS: usize = 32;
/// Longest event string accepted.
pub const MAX_EVENT_LEN: usize = 4096;
/// Most key columns of a count event.
pub const MAX_KEYS: usize = 8;
/// A count event's interval when none is given.
pub const DEFAULT_INTERVAL_US: u64 = 100_000;
/// Shortest and longest count interval.
pub const MIN_INTERVAL_US: u64 = 10_000;
pub const MAX_INTERVAL_US: u64 = 3_600_000_000;
/// The key of a count event when none is given.
pub const DEFAULT_KEY: &str = "tgid";

/// The kind of attach an event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A classic tracepoint (`sys:event`, `tp:sys:event`): fields from its
    /// format file.
    Tracepoint,
    /// A raw tracepoint: arguments as u64, untyped.
    RawTp,
    /// A BTF-typed raw tracepoint: arguments typed from `btf_trace_<name>`.
    TpBtf,
    Fentry,
    Fexit,
    Kprobe,
    Kretprobe,
    /// A kernel function, the best attach this kernel allows.
    Func,
    Uprobe,
    Uretprobe,
}

impl Kind {
    /// Every kind, with the prefix users type.
    pub const ALL: [(Kind, &'static str); 10] = [
        (Kind::Tracepoint, "tp"),
        (Kind::RawTp, "raw_tp"),
        (Kind::TpBtf, "tp_btf"),
        (Kind::Fentry, "fentry"),
        (Kind::Fexit, "fexit"),
        (Kind::Kprobe, "kprobe"),
        (Kind::Kretprobe, "kretprobe"),
        (Kind::Func, "func"),
        (Kind::Uprobe, "uprobe"),
        (Kind::Uretprobe, "uretprobe"),
    ];

    /// The prefix users type (`tp_btf`).
    pub fn prefix(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("?", |(_, p)| p)
    }

    fn from_prefix(p: &str) -> Option<Self> {
        Self::ALL.iter().find(|(_, s)| *s == p).map(|(k, _)| *k)
    }

    /// A kernel function (fentry, fexit, kprobe, kretprobe, func).
    pub fn is_kernel_function(self) -> bool {
        matches!(
            self,
            Kind::Fentry | Kind::Fexit | Kind::Kprobe | Kind::Kretprobe | Kind::Func
        )
    }

    /// A user function (uprobe, uretprobe).
    pub fn is_user_function(self) -> bool {
        matches!(self, Kind::Uprobe | Kind::Uretprobe)
    }

    /// Attached at a function's return (its return value is readable).
    pub fn is_return(self) -> bool {
        matches!(self, Kind::Fexit | Kind::Kretprobe | Kind::Uretprobe)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.prefix())
    }
}

/// Where an event attaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A classic tracepoint.
    Tracepoint { system: String, event: String },
    /// A raw or BTF tracepoint, or a kernel function, by name.
    Name(String),
    /// A user function: the binary and the symbol, plus a byte offset.
    User {
        path: String,
        symbol: String,
        offset: u64,
    },
}

/// One thing to record: a path from an argument (`rq->__sector`), read as
/// a string with `str(...)`, under a column name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The root: an argument name (`rq`, `arg0`) or a format field.
    pub root: String,
    /// Member steps after the root; `true` where the step dereferences a
    /// pointer (`->`), `false` for an embedded member (`.`).
    pub steps: Vec<(String, bool)>,
    /// `str(...)`: read a NUL-terminated string.
    pub string: bool,
    /// The column name: the alias, or the path joined with `_`.
    pub column: String,
}

impl Field {
    /// The path as typed (`rq->q->disk`).
    pub fn path(&self) -> String {
        let mut s = self.root.clone();
        for (name, deref) in &self.steps {
            s.push_str(if *deref { "->" } else { "." });
            s.push_str(name);
        }
        s
    }
}

/// One parsed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    /// The event as the user wrote it, for messages.
    pub text: String,
    pub kind: Kind,
    pub target: Target,
    /// Fields asked for; `None` when there was no argument list (every
    /// field of a tracepoint, every argument of a function).
    pub fields: Option<Vec<Field>>,
    /// Record the return value.
    pub ret: bool,
    /// Join entry and exit: one row with the duration.
    pub latency: bool,
    /// Count per key and interval instead of a row per event.
    pub count: bool,
    /// Count mode: the key columns (`tgid`, `pid`, `cpu`, `comm` or
    /// fields), in table order; empty means [`DEFAULT_KEY`].
    pub by: Vec<String>,
    /// Count mode: the interval, microseconds.
    pub interval_us: u64,
    /// A tracepoint's latency: the tracepoint (system, event) that ends
    /// what this one starts, joined per thread.
    pub exit: Option<(String, String)>,
    /// The table's name.
    pub table: String,
}

impl EventSpec {
    /// The key columns of a count event (`by`, or [`DEFAULT_KEY`]).
    pub fn keys(&self) -> Vec<String> {
        if self.by.is_empty() {
            vec![DEFAULT_KEY.to_owned()]
        } else {
            self.by.clone()
        }
    }
}

/// Why an event string was refused: one line naming the event and the
/// problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace event {event:?}: {problem}")]
pub struct SpecError {
    pub event: String,
    pub problem: String,
}

/// `[[probes.trace.event]]`: the long form of one event.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongEvent {
    /// The event, in the short form's syntax (its argument list optional).
    pub event: String,
    /// The table's name (default: from the event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// Fields to record (`"rq->__sector"`, `"bytes=rq->__data_len"`,
    /// `"str(arg1)"`), after any in the event's argument list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ret: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub latency: bool,
    /// The same as `mode = "count"`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub count: bool,
    /// `"rows"` (the default: one row per event) or `"count"` (one row per
    /// key and interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Count mode: the key columns (default `["tgid"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by: Vec<String>,
    /// Count mode: the interval (`"100ms"`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// A tracepoint's latency: the tracepoint that ends it
    /// (`"raw_syscalls:sys_exit"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
}

/// Characters allowed in identifiers (C names).
fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Tracepoint system and event names, kernel symbols (`foo.isra.0`) and
/// user symbols (C++ mangled names) may hold a few more characters.
fn is_symbol(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c == '_' || c == '.' || c == '$' || c == '@' || c.is_ascii_alphanumeric())
}

/// A table name from any name: lowercase, runs of other characters as one
/// `_`, starting with a letter.
pub fn snake(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    if out.is_empty() {
        return "t".to_owned();
    }
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert_str(0, "t_");
    }
    out
}

/// Parses one event string.
pub fn parse_event(text: &str) -> Result<EventSpec, SpecError> {
    let mut spec = parse_unchecked(text)?;
    let err = |problem: String| SpecError {
        event: text.chars().take(200).collect(),
        problem,
    };
    check_flags(&spec).map_err(err)?;
    if spec.count {
        spec.table.push_str("_count");
    }
    Ok(spec)
}

/// Parses one event string, its flags not yet checked together (the long
/// form adds its own first); `by`/`interval` without `count` refused.
fn parse_unchecked(text: &str) -> Result<EventSpec, SpecError> {
    let err = |problem: String| SpecError {
        event: text.chars().take(200).collect(),
        problem,
    };
    if text.len() > MAX_EVENT_LEN {
        return Err(err(format!("longer than {MAX_EVENT_LEN} bytes")));
    }
    if let Some(c) = text.chars().find(|c| c.is_control() && *c != '\t') {
        return Err(err(format!("holds the control character {c:?}")));
    }
    let s = text.trim();
    if s.is_empty() {
        return Err(err("is empty".into()));
    }
    // Head (kind and target), argument list, flags.
    let (head, args, rest) = match s.find('(') {
        Some(open) => {
            let close = s
                .rfind(')')
                .filter(|&c| c > open)
                .ok_or_else(|| err("has \"(\" without a closing \")\"".into()))?;
            (&s[..open], Some(&s[open + 1..close]), &s[close + 1..])
        }
        None => {
            if s.contains(')') {
                return Err(err("has \")\" without an opening \"(\"".into()));
            }
            match s.find(char::is_whitespace) {
                Some(sp) => (&s[..sp], None, &s[sp..]),
                None => (s, None, ""),
            }
        }
    };
    let head = head.trim();
    let (kind, target) = parse_head(head).map_err(err)?;
    let mut spec = EventSpec {
        text: text.to_owned(),
        kind,
        table: default_table(&target),
        target,
        fields: None,
        ret: false,
        latency: false,
        count: false,
        by: Vec::new(),
        interval_us: DEFAULT_INTERVAL_US,
        exit: None,
    };
    if let Some(args) = args {
        spec.fields = Some(parse_args(args).map_err(err)?);
    }
    let (mut by_given, mut interval_given, mut exit_given) = (false, false, false);
    for flag in rest.split_whitespace() {
        if let Some((name, value)) = flag.split_once('=') {
            let given = match name {
                "by" => &mut by_given,
                "interval" => &mut interval_given,
                "exit" => &mut exit_given,
                other => {
                    return Err(err(format!(
                    "unknown setting {other:?} after the event (settings: by=, interval=, exit=)"
                )))
                }
            };
            if *given {
                return Err(err(format!("{name}= is given twice")));
            }
            *given = true;
            match name {
                "by" => spec.by = parse_keys(value.split(',')).map_err(err)?,
                "interval" => spec.interval_us = parse_interval(value).map_err(err)?,
                _ => spec.exit = Some(parse_exit(value).map_err(err)?),
            }
            continue;
        }
        let slot = match flag {
            "ret" => &mut spec.ret,
            "latency" => &mut spec.latency,
            "count" => &mut spec.count,
            other => {
                return Err(err(format!(
                    "unknown flag {other:?} after the event (flags: ret, latency, count, by=, interval=, exit=)"
                )))
            }
        };
        if *slot {
            return Err(err(format!("flag {flag} is given twice")));
        }
        *slot = true;
    }
    if !spec.count && (by_given || interval_given) {
        return Err(err(
            "by= and interval= are for count mode: add the flag count".into(),
        ));
    }
    Ok(spec)
}

/// Count keys: names, distinct, at most [`MAX_KEYS`].
fn parse_keys<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Vec<String>, String> {
    let mut keys: Vec<String> = Vec::new();
    for n in names {
        let n = n.trim();
        if !is_ident(n) {
            return Err(if n.is_empty() {
                "by= has an empty key".to_owned()
            } else {
                format!("count key {n:?} is not a column name")
            });
        }
        if keys.iter().any(|k| k == n) {
            return Err(format!("count key {n} is given twice"));
        }
        if keys.len() == MAX_KEYS {
            return Err(format!("more than {MAX_KEYS} count keys"));
        }
        keys.push(n.to_owned());
    }
    if keys.is_empty() {
        return Err("by= names no key".into());
    }
    Ok(keys)
}

/// A count interval, 10ms to 1h.
fn parse_interval(text: &str) -> Result<u64, String> {
    let d = kernmlops_sys::duration::parse_duration(text).map_err(|e| {
        format!(
            "interval={}: {e}",
            text.chars().take(64).collect::<String>()
        )
    })?;
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if !(MIN_INTERVAL_US..=MAX_INTERVAL_US).contains(&us) {
        return Err(format!(
            "interval={}: a count interval is 10ms to 1h",
            text.chars().take(64).collect::<String>()
        ));
    }
    Ok(us)
}

/// `exit=SYSTEM:EVENT` (an optional `tp:` prefix).
fn parse_exit(text: &str) -> Result<(String, String), String> {
    let body = text.strip_prefix("tp:").unwrap_or(text);
    match body.split_once(':') {
        Some((system, event)) if is_symbol(system) && is_symbol(event) => {
            Ok((system.to_owned(), event.to_owned()))
        }
        _ => Err(format!(
            "exit={}: not a tracepoint system:event",
            text.chars().take(64).collect::<String>()
        )),
    }
}

fn parse_head(head: &str) -> Result<(Kind, Target), String> {
    if head.is_empty() {
        return Err("names no event (expected sys:event or kind:name)".into());
    }
    if head.chars().any(char::is_whitespace) {
        return Err(format!("{head:?} holds a space"));
    }
    let (prefix, after) = head.split_once(':').unwrap_or(("", head));
    let (kind, body) = match Kind::from_prefix(prefix) {
        Some(k) => (k, after),
        None if prefix.is_empty() => {
            return Err(format!(
                "{head:?} names no kind: write sys:event for a tracepoint, or one of {}",
                kinds_list()
            ))
        }
        // No known kind: a tracepoint `sys:event`.
        None => (Kind::Tracepoint, head),
    };
    let target = match kind {
        Kind::Tracepoint => {
            let (system, event) = body
                .split_once(':')
                .ok_or_else(|| format!("tracepoint {body:?} is not system:event"))?;
            for (what, name) in [("system", system), ("event", event)] {
                if !is_symbol(name) {
                    return Err(format!(
                        "tracepoint {what} {name:?} is not a name (letters, digits, _)"
                    ));
                }
            }
            Target::Tracepoint {
                system: system.to_owned(),
                event: event.to_owned(),
            }
        }
        Kind::Uprobe | Kind::Uretprobe => {
            let (path, sym) = body
                .rsplit_once(':')
                .ok_or_else(|| format!("{kind} needs PATH:SYMBOL, not {body:?}"))?;
            if !path.starts_with('/') {
                return Err(format!("{kind} path {path:?} is not absolute"));
            }
            let (symbol, offset) = match sym.split_once('+') {
                Some((s, off)) => (s, parse_offset(off)?),
                None => (sym, 0),
            };
            if !is_symbol(symbol) {
                return Err(format!("{kind} symbol {symbol:?} is not a symbol name"));
            }
            Target::User {
                path: path.to_owned(),
                symbol: symbol.to_owned(),
                offset,
            }
        }
        _ => {
            if !is_symbol(body) {
                return Err(format!(
                    "{kind} target {body:?} is not a name (letters, digits, _, .)"
                ));
            }
            Target::Name(body.to_owned())
        }
    };
    Ok((kind, target))
}

fn kinds_list() -> String {
    Kind::ALL
        .iter()
        .map(|(_, p)| format!("{p}:"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_offset(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("symbol offset {s:?} is not a number"))
}

fn default_table(target: &Target) -> String {
    snake(match target {
        Target::Tracepoint { event, .. } => event,
        Target::Name(n) => n,
        Target::User { symbol, .. } => symbol,
    })
}

fn check_flags(spec: &EventSpec) -> Result<(), String> {
    let k = spec.kind;
    if spec.ret && !(k.is_kernel_function() || k.is_user_function()) {
        return Err(format!(
            "ret applies to functions (func:, fexit:, kretprobe:, uprobe:, uretprobe:), not {k}:"
        ));
    }
    if spec.ret && matches!(k, Kind::Fentry | Kind::Kprobe) {
        return Err(format!(
            "{k}: runs at entry, where there is no return value: use {}: or func: with ret",
            if k == Kind::Fentry {
                "fexit"
            } else {
                "kretprobe"
            }
        ));
    }
    if spec.exit.is_some() && !(k == Kind::Tracepoint && spec.latency) {
        return Err(
            "exit= names the tracepoint that ends a tracepoint's latency: it needs a tracepoint (sys:event) and the flag latency"
                .into(),
        );
    }
    if spec.latency && k == Kind::Tracepoint && spec.exit.is_none() {
        return Err(
            "latency on a tracepoint needs exit=SYSTEM:EVENT, the tracepoint that ends it (raw_syscalls:sys_enter latency exit=raw_syscalls:sys_exit)"
                .into(),
        );
    }
    if spec.latency
        && !matches!(
            k,
            Kind::Func | Kind::Fentry | Kind::Kprobe | Kind::Uprobe | Kind::Tracepoint
        )
    {
        return Err(format!(
            "latency joins a function's entry and exit: use func:, fentry:, kprobe: or uprobe: (or a tracepoint with exit=), not {k}:"
        ));
    }
    if let Some(fields) = &spec.fields {
        if fields.len() > MAX_FIELDS {
            return Err(format!(
                "asks for {} fields, at most {MAX_FIELDS}",
                fields.len()
            ));
        }
        for (i, f) in fields.iter().enumerate() {
            if fields[..i].iter().any(|o| o.column == f.column) {
                return Err(format!(
                    "column {} is asked for twice (name one with alias=...)",
                    f.column
                ));
            }
        }
    }
    Ok(())
}

/// Splits an argument list at top-level commas.
fn parse_args(args: &str) -> Result<Vec<Field>, String> {
    if args.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in args.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(parse_field(&args[start..i])?);
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err("has an unbalanced \")\" in its argument list".into());
        }
    }
    if depth != 0 {
        return Err("has an unbalanced \"(\" in its argument list".into());
    }
    out.push(parse_field(&args[start..])?);
    Ok(out)
}

/// Parses one field: `[alias=](str(path)|path)`.
pub fn parse_field(text: &str) -> Result<Field, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("has an empty argument (two commas, or a trailing comma)".into());
    }
    let (alias, expr) = match t.split_once('=') {
        Some((a, e)) => {
            let a = a.trim();
            if !is_ident(a) {
                return Err(format!("column name {a:?} is not a name"));
            }
            (Some(a), e.trim())
        }
        None => (None, t),
    };
    let (string, path) = match expr.strip_prefix("str(") {
        Some(inner) => (
            true,
            inner
                .strip_suffix(')')
                .ok_or_else(|| format!("{expr:?}: str( without its closing )"))?
                .trim(),
        ),
        None => (false, expr),
    };
    if path.contains(['(', ')']) {
        return Err(format!(
            "{expr:?} is not a path (only str(...) takes parentheses)"
        ));
    }
    let (root, steps) = parse_path(path)?;
    let column = match alias {
        Some(a) => snake(a),
        None => {
            let mut c = root.clone();
            for (s, _) in &steps {
                c.push('_');
                c.push_str(s);
            }
            snake(&c)
        }
    };
    Ok(Field {
        root,
        steps,
        string,
        column,
    })
}

#[allow(clippy::type_complexity)]
fn parse_path(path: &str) -> Result<(String, Vec<(String, bool)>), String> {
    let mut parts = Vec::new();
    let mut rest = path;
    let mut deref = false;
    loop {
        let next = [
            rest.find("->").map(|i| (i, 2, true)),
            rest.find('.').map(|i| (i, 1, false)),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|&(i, _, _)| i);
        let (name, after, next_deref) = match next {
            Some((i, len, d)) => (&rest[..i], Some(&rest[i + len..]), d),
            None => (rest, None, false),
        };
        let name = name.trim();
        if !is_ident(name) {
            return Err(if name.is_empty() {
                format!("path {path:?} has an empty member name")
            } else {
                format!("path {path:?}: {name:?} is not a C name")
            });
        }
        parts.push((name.to_owned(), deref));
        deref = next_deref;
        match after {
            Some(a) => rest = a,
            None => break,
        }
    }
    let (root, _) = parts.remove(0);
    if parts.len() > MAX_PATH_STEPS {
        return Err(format!(
            "path {path:?} has {} steps, at most {MAX_PATH_STEPS}",
            parts.len()
        ));
    }
    Ok((root, parts))
}

/// Parses a long-form event: its event string, then its fields and flags.
pub fn parse_long(long: &LongEvent) -> Result<EventSpec, SpecError> {
    let mut spec = parse_unchecked(&long.event)?;
    let err = |problem: String| SpecError {
        event: long.event.chars().take(200).collect(),
        problem,
    };
    if !long.fields.is_empty() {
        let fields = spec.fields.get_or_insert_with(Vec::new);
        for f in &long.fields {
            fields.push(parse_field(f).map_err(|e| err(format!("field {f:?}: {e}")))?);
        }
    }
    spec.ret |= long.ret;
    spec.latency |= long.latency;
    let count = match long.mode.as_deref() {
        None => long.count,
        Some("count") => true,
        Some("rows") if !long.count => false,
        Some("rows") => return Err(err("mode = \"rows\" and count = true disagree".into())),
        Some(other) => {
            return Err(err(format!(
                "mode {:?}: the modes are \"rows\" and \"count\"",
                other.chars().take(64).collect::<String>()
            )))
        }
    };
    spec.count |= count;
    if !long.by.is_empty() {
        if !spec.by.is_empty() {
            return Err(err("by is given in the event and as by = [...]".into()));
        }
        spec.by = parse_keys(long.by.iter().map(String::as_str)).map_err(err)?;
    }
    if let Some(i) = &long.interval {
        spec.interval_us = parse_interval(i).map_err(err)?;
    }
    if let Some(x) = &long.exit {
        if spec.exit.is_some() {
            return Err(err("exit is given in the event and as exit = ...".into()));
        }
        spec.exit = Some(parse_exit(x).map_err(err)?);
    }
    if !spec.count && (!long.by.is_empty() || long.interval.is_some()) {
        return Err(err(
            "by and interval are for count mode: add mode = \"count\"".into(),
        ));
    }
    if let Some(t) = &long.table {
        if !kernmlops_sys::names::is_snake_case(t) {
            return Err(err(format!("table name {t:?} is not lowercase snake_case")));
        }
        t.clone_into(&mut spec.table);
    } else if spec.count {
        spec.table.push_str("_count");
    }
    check_flags(&spec).map_err(err)?;
    Ok(spec)
}

/// Parses every event of the settings, short then long, and checks that
/// their tables are distinct.
pub fn parse_all(short: &[String], long: &[LongEvent]) -> Result<Vec<EventSpec>, SpecError> {
    let mut out: Vec<EventSpec> = Vec::new();
    for s in short {
        out.push(parse_event(s)?);
    }
    for l in long {
        out.push(parse_long(l)?);
    }
    for (i, e) in out.iter().enumerate() {
        if let Some(o) = out[..i].iter().find(|o| o.table == e.table) {
            return Err(SpecError {
                event: e.text.clone(),
                problem: format!(
                    "its table {} is also {:?}'s: give one a table = name with [[probes.trace.event]]",
                    e.table, o.text
                ),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> EventSpec {
        parse_event(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn bad(s: &str, needle: &str) {
        let e = parse_event(s).expect_err(s).to_string();
        assert!(e.contains(needle), "{s}: {e:?} lacks {needle:?}");
        assert!(!e.contains('\n'), "{s}: more than one line: {e}");
    }

    #[test]
    fn parses_every_kind() {
        let e = ok("sched:sched_migrate_task");
        assert_eq!(e.kind, Kind::Tracepoint);
        assert_eq!(
            e.target,
            Target::Tracepoint {
                system: "sched".into(),
                event: "sched_migrate_task".into()
            }
        );
        assert_eq!(e.fields, None);
        assert_eq!(e.table, "sched_migrate_task");
        assert_eq!(
            ok("tp:sched:sched_switch").target,
            ok("sched:sched_switch").target
        );
        let e = ok("tp_btf:block_rq_insert(rq->__sector, rq->__data_len, rq->cmd_flags)");
        assert_eq!(e.kind, Kind::TpBtf);
        let f = e.fields.expect("fields");
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].root, "rq");
        assert_eq!(f[0].steps, vec![("__sector".to_owned(), true)]);
        assert_eq!(f[0].column, "rq_sector");
        let e = ok("fexit:zswap_store(folio->index) ret");
        assert!(e.ret && e.kind == Kind::Fexit);
        let e = ok("func:do_madvise(start, len_in, behavior) latency");
        assert!(e.latency && e.kind == Kind::Func);
        let e = ok("uprobe:/usr/bin/redis-server:processCommand(arg0) latency");
        assert_eq!(
            e.target,
            Target::User {
                path: "/usr/bin/redis-server".into(),
                symbol: "processCommand".into(),
                offset: 0
            }
        );
        assert_eq!(e.table, "processcommand");
        let e = ok("uretprobe:/bin/x:f+0x10 ret");
        assert!(matches!(e.target, Target::User { offset: 16, .. }));
        let e = ok("raw_tp:sched_switch(arg1, arg2)");
        assert_eq!(e.kind, Kind::RawTp);
        assert!(ok("kprobe:vfs_read(file, count)").kind == Kind::Kprobe);
        assert!(ok("kretprobe:vfs_read ret").ret);
        assert!(ok("fentry:vfs_read").fields.is_none());
        assert_eq!(ok("fentry:vfs_read()").fields, Some(vec![]));
        let e = ok("syscalls:sys_enter_openat(str(filename), flags) count");
        assert!(e.count);
        assert_eq!(e.table, "sys_enter_openat_count");
        let f = e.fields.expect("fields");
        assert!(f[0].string && f[0].column == "filename");
    }

    #[test]
    fn paths_aliases_and_embedded_members() {
        let e = ok("tp_btf:sched_switch(p = prev->se.vruntime, n=next->mm->mmap_base)");
        let f = e.fields.expect("fields");
        assert_eq!(f[0].column, "p");
        assert_eq!(
            f[0].steps,
            vec![("se".to_owned(), true), ("vruntime".to_owned(), false)]
        );
        assert_eq!(f[0].path(), "prev->se.vruntime");
        assert_eq!(f[1].path(), "next->mm->mmap_base");
        let deep = ok("tp_btf:x(a->b->c->d->e->f->g->h->i)");
        assert_eq!(deep.fields.expect("f")[0].steps.len(), 8);
        bad("tp_btf:x(a->b->c->d->e->f->g->h->i->j)", "at most 8");
    }

    #[test]
    fn errors_name_the_problem() {
        bad("", "is empty");
        bad("   ", "is empty");
        bad("sched_switch", "names no kind");
        bad("tp:sched_switch", "not system:event");
        bad("sched:sched switch", "unknown flag \"switch\"");
        bad("sched :sched_switch", "names no kind");
        bad("sched:sched_switch(prev_pid", "without a closing");
        bad("sched:sched_switch prev_pid)", "without an opening");
        bad("sched:sched_switch(a,,b)", "empty argument");
        bad("sched:sched_switch(a,)", "empty argument");
        bad("sched:sched_switch(a-b)", "not a C name");
        bad("sched:sched_switch(a->)", "empty member");
        bad("sched:sched_switch(1a)", "not a C name");
        bad("sched:sched_switch(a, a)", "asked for twice");
        bad("sched:sched_switch(str(a)", "unbalanced");
        assert!(parse_field("str(a").expect_err("open").contains("closing"));
        bad("sched:sched_switch(f(a))", "not a path");
        bad("sched:sched_switch nope", "unknown flag \"nope\"");
        bad("sched:sched_switch count count", "twice");
        bad("sched:sched_switch ret", "ret applies to functions");
        bad("fentry:vfs_read ret", "use fexit");
        bad("kprobe:vfs_read ret", "use kretprobe");
        bad("fexit:vfs_read latency", "latency joins");
        bad("uprobe:bin:f", "not absolute");
        bad("uprobe:/bin/x", "PATH:SYMBOL");
        bad("uprobe:/bin/x:f+zz", "not a number");
        bad("tp_btf:a/b", "not a name");
        bad("sched:sched_switch\n", "control character");
        bad(&format!("tp_btf:{}", "a".repeat(5000)), "longer than");
    }

    #[test]
    fn long_form_and_duplicate_tables() {
        let long = LongEvent {
            event: "tp_btf:block_rq_insert".into(),
            table: Some("rq_inserts".into()),
            fields: vec!["sector=rq->__sector".into(), "rq->__data_len".into()],
            ..LongEvent::default()
        };
        let e = parse_long(&long).expect("long");
        assert_eq!(e.table, "rq_inserts");
        let f = e.fields.expect("fields");
        assert_eq!(f[0].column, "sector");
        assert_eq!(f[1].column, "rq_data_len");
        let bad_table = LongEvent {
            table: Some("Bad-Name".into()),
            ..long.clone()
        };
        assert!(parse_long(&bad_table)
            .expect_err("bad table")
            .to_string()
            .contains("snake_case"));
        let dup = parse_all(
            &["sched:sched_switch".into()],
            &[LongEvent {
                event: "tp_btf:sched_switch".into(),
                ..LongEvent::default()
            }],
        )
        .expect_err("same table");
        assert!(dup.to_string().contains("table = name"), "{dup}");
        let counted = parse_long(&LongEvent {
            event: "sched:sched_switch".into(),
            count: true,
            ..LongEvent::default()
        })
        .expect("count");
        assert!(counted.count && counted.table == "sched_switch_count");
    }

    #[test]
    fn count_mode_keys_intervals_and_exits() {
        let e = ok("syscalls:sys_enter_getppid count");
        assert!(e.count && e.by.is_empty() && e.keys() == ["tgid"]);
        assert_eq!(e.interval_us, DEFAULT_INTERVAL_US);
        assert_eq!(e.table, "sys_enter_getppid_count");
        let e = ok("raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exit count by=tgid,id interval=250ms");
        assert_eq!(e.keys(), ["tgid", "id"]);
        assert_eq!(e.interval_us, 250_000);
        assert_eq!(
            e.exit,
            Some(("raw_syscalls".to_owned(), "sys_exit".to_owned()))
        );
        assert!(e.latency && e.count);
        let e = ok("uprobe:/bin/x:f(arg0) latency count by=arg0,comm");
        assert_eq!(e.keys(), ["arg0", "comm"]);
        bad("sched:sched_switch by=prev_pid", "for count mode");
        bad("sched:sched_switch interval=1s", "for count mode");
        bad("sched:sched_switch count by=", "empty key");
        bad("sched:sched_switch count by=a,a", "twice");
        bad("sched:sched_switch count by=a-b", "not a column name");
        bad(
            "sched:sched_switch count by=a,b,c,d,e,f,g,h,i",
            "more than 8",
        );
        bad("sched:sched_switch count by=a by=b", "given twice");
        bad("sched:sched_switch count interval=1us", "10ms to 1h");
        bad("sched:sched_switch count interval=2h", "10ms to 1h");
        bad("sched:sched_switch count interval=soon", "interval=soon");
        bad("sched:sched_switch count nope=1", "unknown setting");
        bad("sched:sched_switch latency", "needs exit=");
        bad("sched:sched_switch exit=sched:sched_wakeup", "flag latency");
        bad("uprobe:/bin/x:f latency exit=a:b", "needs a tracepoint");
        bad("sched:sched_switch latency exit=nope", "not a tracepoint");
        let long = parse_long(&LongEvent {
            event: "syscalls:sys_enter_getppid".into(),
            mode: Some("count".into()),
            by: vec!["pid".into(), "cpu".into()],
            interval: Some("1s".into()),
            ..LongEvent::default()
        })
        .expect("long count");
        assert!(long.count && long.keys() == ["pid", "cpu"] && long.interval_us == 1_000_000);
        assert_eq!(long.table, "sys_enter_getppid_count");
        let long = parse_long(&LongEvent {
            event: "raw_syscalls:sys_enter(id) latency".into(),
            exit: Some("raw_syscalls:sys_exit".into()),
            ..LongEvent::default()
        })
        .expect("long exit");
        assert!(long.exit.is_some() && !long.count);
        let long = |event: &str| LongEvent {
            event: event.into(),
            ..LongEvent::default()
        };
        for (l, needle) in [
            (
                LongEvent {
                    mode: Some("tally".into()),
                    ..long("sched:sched_switch")
                },
                "the modes are",
            ),
            (
                LongEvent {
                    by: vec!["tgid".into()],
                    ..long("sched:sched_switch")
                },
                "for count mode",
            ),
            (
                LongEvent {
                    mode: Some("rows".into()),
                    count: true,
                    ..long("sched:sched_switch")
                },
                "disagree",
            ),
            (
                LongEvent {
                    by: vec!["pid".into()],
                    ..long("sched:sched_switch count by=tgid")
                },
                "by is given",
            ),
        ] {
            let e = parse_long(&l).expect_err(needle).to_string();
            assert!(e.contains(needle) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn snake_names() {
        assert_eq!(snake("processCommand"), "processcommand");
        assert_eq!(snake("foo.isra.0"), "foo_isra_0");
        assert_eq!(snake("__x64_sys_read"), "x64_sys_read");
        assert_eq!(snake("9p"), "t_9p");
        assert_eq!(snake(""), "t");
    }

    /// Thousands of mutated and random strings: each parses or is refused
    /// with one line, never a panic.
    #[test]
    fn fuzzed_events_never_panic() {
        let seeds = [
            "sched:sched_switch",
            "tp_btf:block_rq_insert(rq->__sector, rq->__data_len, rq->cmd_flags)",
            "fexit:zswap_store(folio->index) ret",
            "func:do_madvise(start, len_in, behavior) latency",
            "uprobe:/usr/bin/redis-server:processCommand(arg0) latency",
            "syscalls:sys_enter_openat(n=str(filename), flags) count",
            "tp_btf:x(a->b.c->d->e->f)",
            "raw_syscalls:sys_enter(id) latency exit=raw_syscalls:sys_exit count by=tgid,id interval=100ms",
        ];
        let alphabet: Vec<char> = "():,->. =_str0x+/\\\"'\t\u{e9}\u{0}()->ab"
            .chars()
            .collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut parsed, mut refused) = (0, 0);
        for round in 0..20_000 {
            let mut s: Vec<char> = if round % 5 == 4 {
                Vec::new()
            } else {
                seeds[(next() % seeds.len() as u64) as usize]
                    .chars()
                    .collect()
            };
            for _ in 0..1 + next() % 6 {
                let c = alphabet[(next() % alphabet.len() as u64) as usize];
                let at = if s.is_empty() {
                    0
                } else {
                    (next() % (s.len() as u64 + 1)) as usize
                };
                match next() % 3 {
                    0 => s.insert(at, c),
                    1 if at < s.len() => {
                        s.remove(at);
                    }
                    _ if at < s.len() => s[at] = c,
                    _ => s.push(c),
                }
            }
            let text: String = s.into_iter().collect();
            match parse_event(&text) {
                Ok(e) => {
                    parsed += 1;
                    assert!(
                        kernmlops_sys::names::is_snake_case(&e.table),
                        "{text:?}: {e:?}"
                    );
                }
                Err(e) => {
                    refused += 1;
                    let line = e.to_string();
                    assert!(
                        !line.contains('\n') && !line.is_empty(),
                        "{text:?}: {line:?}"
                    );
                }
            }
        }
        assert!(
            parsed > 100 && refused > 100,
            "{parsed} parsed, {refused} refused"
        );
    }
}
