#!/usr/bin/env bash
# Installs what kernmlops needs to build, run and test on Debian or Ubuntu,
# as root, skipping whatever is already there. Sourced by scripts/collect and
# scripts/test; safe to run on its own.
set -euo pipefail

say() { printf 'setup: %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    say "kernmlops loads BPF programs: run this as root (sudo $0)"
    exit 1
fi

# Build: clang compiles the BPF programs, libelf/zlib/pkg-config/make build
# the vendored libbpf. Run and test: perf (independent counts), stress tools,
# util-linux (setpriv, unshare), python3 for the read-back tests, and the
# workloads the benchmarks run (fio, stress-ng, redis, memcached), the
# font graphs are drawn with, libpfm4, which the perf probe and
# perf-list load at run time to resolve model-specific event names, and
# Slurm with munge (scripts/slurm-local runs a cluster from them for the
# Slurm executor's tests, its nodes in namespaces made with iproute2's ip
# and util-linux's nsenter and unshare; no system service is started).
# e2fsprogs: mkfs.ext4 for the loop device an experiment's [device] makes.
packages=(clang llvm libelf-dev zlib1g-dev pkg-config make gcc util-linux python3 python3-pip
    fio stress-ng redis-server redis-tools memcached libmemcached-tools fonts-dejavu-core
    libpfm4 slurm-wlm munge iproute2 e2fsprogs)
optional=(bpftool)
if grep -qi ubuntu /etc/os-release 2>/dev/null; then
    optional+=(linux-tools-common "linux-tools-$(uname -r)")
else
    packages+=(linux-perf)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    # Server packages (redis, memcached) must not start system services:
    # benchmarks run their own instances on free loopback ports.
    # Nor be started at the next boot: the units these packages enable are
    # disabled again, unless they were enabled before.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
    fi
    services=(redis-server memcached munge slurmctld slurmd)
    was_enabled=()
    for unit in "${services[@]}"; do
        systemctl is-enabled --quiet "$unit" 2>/dev/null && was_enabled+=("$unit")
    done
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    [ "$own_policy" = 1 ] && rm -f "$policy"
    for unit in "${services[@]}"; do
        case " ${was_enabled[*]} " in *" $unit "*) continue ;; esac
        if systemctl is-enabled --quiet "$unit" 2>/dev/null; then
            systemctl disable --quiet "$unit" >/dev/null 2>&1 \
                && say "disabled $unit.service (installed for the benchmarks and tests, which run their own)" \
                || true
        fi
    done
fi
for p in "${optional[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 \
            || say "optional package $p is not available (only 'cargo xtask vmlinux' needs it)"
    fi
done

# Rust toolchain.
if ! command -v cargo >/dev/null 2>&1; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    say "installing Rust with rustup"
    command -v curl >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy,rustfmt
    . "$HOME/.cargo/env"
fi

# Python readers for the read-back tests and for users' first look; DuckDB
# reads the exported Hive-partitioned dataset in the dataset tests; pytest
# and NumPy run the Python package's tests, scikit-learn its example (examples/ml).
pip_install() {
    python3 -m pip install -q "$@" 2>/dev/null \
        || python3 -m pip install -q --break-system-packages "$@"
}
if ! python3 -c 'import pyarrow, polars, duckdb, pytest, numpy, sklearn, scipy' >/dev/null 2>&1; then
    say "installing pyarrow, polars, duckdb, pytest, numpy, scikit-learn and scipy"
    pip_install pyarrow polars duckdb pytest numpy scikit-learn scipy
fi
# The Python package (python/): `import kernmlops`, `python -m kernmlops`.
# Reinstalled when the checkout's copy changed since the last install.
py_src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/python"
py_hash=$(cat "$py_src"/pyproject.toml "$py_src"/kernmlops/*.py "$py_src"/kernmlops_data.py | sha256sum | cut -c1-16)
if [ "$(python3 -c 'import kernmlops; print(getattr(kernmlops, "__source_hash__", ""))' 2>/dev/null)" != "$py_hash" ]; then
    say "installing the kernmlops Python package (python/)"
    stage=$(mktemp -d)
    cp -r "$py_src"/pyproject.toml "$py_src"/README.md "$py_src"/kernmlops "$py_src"/kernmlops_data.py "$stage"/
    printf '__source_hash__ = "%s"\n__checkout__ = "%s"\n' "$py_hash" "$(dirname "$py_src")" >>"$stage/kernmlops/__init__.py"
    pip_install "$stage"
    rm -rf "$stage"
fi

# tracefs: tp/ programs attach through it (kernmlops also mounts it itself).
if [ ! -d /sys/kernel/tracing/events ]; then
    say "mounting tracefs at /sys/kernel/tracing"
    mount -t tracefs nodev /sys/kernel/tracing
fi
