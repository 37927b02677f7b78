"""Driving ``kernmlops run`` and ``kernmlops experiment run`` from Python."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ._read import Collection, Experiment, KernmlopsError, PathLike, open_collection, open_experiment

_COLLECTING = re.compile(r"^collecting .* into (?P<path>/.+?) \(attached in")


def find_binary(binary: PathLike | None = None) -> Path:
    """The ``kernmlops`` binary: ``binary`` if given, else ``$KERNMLOPS_BIN``, else
    ``kernmlops`` on ``PATH``, else ``target/release/kernmlops`` of the checkout
    this package is in. A binary found nowhere is a :class:`KernmlopsError`."""
    tried = []
    if binary is not None:
        p = Path(binary)
        if p.is_file() and os.access(p, os.X_OK):
            return p.resolve()
        raise KernmlopsError(f"{p}: not an executable kernmlops binary")
    env = os.environ.get("KERNMLOPS_BIN")
    if env:
        p = Path(env)
        if p.is_file() and os.access(p, os.X_OK):
            return p.resolve()
        raise KernmlopsError(f"KERNMLOPS_BIN={env}: not an executable kernmlops binary")
    on_path = shutil.which("kernmlops")
    if on_path:
        return Path(on_path).resolve()
    tried.append("PATH")
    # The checkout this package was installed from (scripts/setup.sh records
    # it), or the one it is imported from.
    recorded = getattr(sys.modules.get(__package__ or ""), "__checkout__", None)
    roots = [Path(recorded)] if recorded else []
    roots.append(Path(__file__).resolve().parents[2])
    for root in roots:
        checkout = root / "target" / "release" / "kernmlops"
        if checkout.is_file() and os.access(checkout, os.X_OK):
            return checkout
        tried.append(str(checkout))
    raise KernmlopsError(
        "no kernmlops binary (looked on " + " and in ".join(tried) + "); build it with "
        "`cargo build --release` or pass binary=PATH"
    )


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise KernmlopsError(f"{what} needs root (BPF programs and perf events): run Python as root")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise KernmlopsError(f"config value {v!r} has no TOML form")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def to_toml(config: Mapping[str, Any]) -> str:
    """A nested dict as TOML (tables for dicts, inline values for the rest)."""
    out: list[str] = []

    def table(prefix: list[str], d: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, Mapping)}
        tables = {k: v for k, v in d.items() if isinstance(v, Mapping)}
        if prefix and scalars:
            out.append("[" + ".".join(_toml_key(p) for p in prefix) + "]")
        for k, v in scalars.items():
            out.append(f"{_toml_key(k)} = {_toml_value(v)}")
        for k, v in tables.items():
            table(prefix + [k], v)

    table([], config)
    return "\n".join(out) + "\n"


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = dict(v) if isinstance(v, Mapping) else v
    return base


class Collecting:
    """A running ``kernmlops run``; use it as a context manager (see :func:`collect`)."""

    def __init__(self, argv: list[str], tmp: tempfile.TemporaryDirectory[str] | None, timeout: float, echo: bool):
        self.argv = argv
        self._tmp = tmp
        self._timeout = timeout
        self._echo = echo
        self.path: Path | None = None
        self.collection: Collection | None = None
        self.stderr_lines: list[str] = []
        self._ready = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            line = line.rstrip("\n")
            self.stderr_lines.append(line)
            if self._echo:
                print(line, file=sys.stderr)
            m = _COLLECTING.match(line)
            if m and self.path is None:
                self.path = Path(m.group("path"))
                self._ready.set()
        self._ready.set()

    def start(self) -> "Collecting":
        """Start the collector and return once it is collecting (raises if it fails to)."""
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self._timeout
        while not self._ready.wait(0.05):
            if time.monotonic() > deadline:
                self._kill()
                raise KernmlopsError(f"kernmlops run did not start collecting within {self._timeout:.0f} s")
        if self.path is None:
            code = self._proc.wait()
            self._reader.join(5)
            raise KernmlopsError(self._error_line() or f"kernmlops run exited with {code} before collecting")
        return self

    def _error_line(self) -> str | None:
        for line in reversed(self.stderr_lines):
            if line.startswith("error:"):
                return "kernmlops run: " + line
        return None

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def stop(self) -> Collection:
        """Stop collecting (SIGINT, as Ctrl+C), wait for the files to be closed, open the collection."""
        if self._proc is None:
            raise KernmlopsError("not started")
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(self._timeout)
        except subprocess.TimeoutExpired:
            self._kill()
            raise KernmlopsError(f"kernmlops run did not stop within {self._timeout:.0f} s: killed") from None
        finally:
            if self._proc.stdout is not None:
                self._proc.stdout.read()
                self._proc.stdout.close()
            if self._reader is not None:
                self._reader.join(5)
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None
        assert self.path is not None
        self.collection = open_collection(self.path)
        return self.collection

    @property
    def pid(self) -> int | None:
        """The collector's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> "Collecting":
        return self.start() if self._proc is None else self

    def __exit__(self, *exc: Any) -> None:
        # Also on an exception or KeyboardInterrupt in the block: the collector
        # stops cleanly and its files are complete; the exception goes on.
        self.stop()


def collect(
    plugins: Sequence[str] | None = None,
    trace: Sequence[str] | None = None,
    power: Sequence[str] | str | None = None,
    config: Mapping[str, Any] | None = None,
    output: PathLike | None = None,
    duration: str | None = None,
    binary: PathLike | None = None,
    extra_args: Sequence[str] = (),
    timeout: float = 60.0,
    echo: bool = False,
) -> Collecting:
    """Collect while a ``with`` block runs::

        with kernmlops.collect(plugins=["quanta_runtime"], output="data") as c:
            run_my_workload()
        c.collection.table("quanta_runtime").collect()

    Starts ``kernmlops run`` and returns once it is collecting; the block's end
    (also an exception or Ctrl+C) stops it with SIGINT and opens the result as
    ``c.collection`` (``c.path`` is its folder). ``trace`` adds events to the
    ``trace`` probe (``"sched:sched_process_exec"``, ...); ``power`` names power
    sources (``"auto"`` for every source that works here); ``config`` is merged
    over the defaults like a ``--config`` file. Needs root.
    """
    _require_root("collecting")
    exe = find_binary(binary)
    argv = [str(exe), "run"]
    plugins = list(plugins or [])
    cfg: dict[str, Any] = _merge({}, config or {})
    if trace:
        if "trace" not in plugins:
            plugins.append("trace")
        events = cfg.setdefault("probes", {}).setdefault("trace", {})
        events["events"] = list(events.get("events") or []) + list(trace)
    if plugins:
        argv += ["--plugins", ",".join(plugins)]
    if power is not None:
        argv += ["--power", power if isinstance(power, str) else ",".join(power)]
    if output is not None:
        argv += ["--output", str(output)]
    if duration is not None:
        argv += ["--duration", duration]
    tmp = None
    if cfg:
        tmp = tempfile.TemporaryDirectory(prefix="kernmlops-py.")
        os.chmod(tmp.name, 0o700)
        path = Path(tmp.name) / "config.toml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(to_toml(cfg))
        argv += ["--config", str(path)]
    argv += list(extra_args)
    return Collecting(argv, tmp, timeout, echo)


def run_experiment(
    path: PathLike,
    dir: PathLike | None = None,
    binary: PathLike | None = None,
    extra_args: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
) -> Experiment:
    """Run an experiment file with ``kernmlops experiment run`` and open its folder.

    ``dir`` defaults to ``experiments/<name>-<UTC time>`` as the command's own
    default. Each progress line goes to ``progress`` (default: printed to
    stderr). A failed experiment is a :class:`KernmlopsError` with its error line.
    """
    _require_root("running an experiment")
    exe = find_binary(binary)
    spec = Path(path)
    if not spec.is_file():
        raise KernmlopsError(f"{spec}: no such experiment file")
    if dir is None:
        name = tomllib.loads(spec.read_text()).get("name") or spec.stem
        dir = Path("experiments") / f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    argv = [str(exe), "experiment", "run", str(spec), "--dir", str(dir), *extra_args]
    say = progress or (lambda line: print(line, file=sys.stderr))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last_error = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("error:"):
                last_error = line
            say(line)
        code = proc.wait()
    except BaseException:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    if code != 0 and not (Path(dir) / "results.parquet").is_file():
        raise KernmlopsError(f"kernmlops experiment run exited with {code}: {last_error or 'see its output'}")
    return open_experiment(dir)
