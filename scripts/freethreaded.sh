#!/usr/bin/env bash
# Build a free-threaded CPython 3.14 (3.14t) from Debian's source package, make a
# venv from it, install loaderx into it and run the test suite with the GIL off.
#
# No free-threaded interpreter is installable here as a binary, and CI does not run
# this (the build takes 10-40 minutes on 2 busy cores). Debian bookworm carries no
# python3.14; sid (unstable) does, trixie does not, so a deb-src line for sid is
# added in its own file (sources only: no sid binary package can be installed by it).
#
# On the machine this was written on (2026-12), the Debian mirror served sid's
# Sources index (python3.14 3.14.9-1 and 3.14.10-1) but answered 404 for their
# files, so `source` stops with that message; PYTHON_SRC takes any CPython 3.14
# source tree or tarball instead, and the later steps are the same.
#
# Usage: scripts/freethreaded.sh [all|source|build|venv|test|bench]   (default: all)
#   source  add the deb-src line, `apt-get source python3.14` into $FT/src
#   build   ./configure --disable-gil && make -j2 && make install into $FT/python3.14t
#   venv    $FT/venv from that interpreter, the project installed into it (editable)
#   test    the suite under PYTHON_GIL=0 (the log is $FT/pytest.log)
#   bench   the bench's loader and dense layers (--size tiny unless BENCH_SIZE is set)
# Environment: FT (default /work/ft), SUITE (default sid), JOBS (default 2),
#   PYTEST_ARGS (default -q), BENCH_SIZE (default tiny), PYTHON_SRC (a CPython
#   3.14 source tree or .tar.xz/.tgz to build instead of Debian's source package,
#   for a mirror that serves sid's package lists but not its python3.14 sources).
# Needs root (apt). `build` installs the usual CPython build dependencies from the
# machine's own suite (BUILD_DEPS below; libzstd-dev gives 3.14 its compression.zstd);
# not `apt-get build-dep`: sid's exact build dependencies are newer than bookworm's,
# and an ordinary ./configure does not need them.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
FT="${FT:-/work/ft}"
SUITE="${SUITE:-sid}"
JOBS="${JOBS:-2}"
PREFIX="$FT/python3.14t"
VENV="$FT/venv"
SRC_LIST=/etc/apt/sources.list.d/loaderx-python314-src.sources
NICE=(nice -n 19)

log() { printf '[freethreaded] %s\n' "$*" >&2; }

step_source() {
    mkdir -p "$FT/src"
    if [ -n "${PYTHON_SRC:-}" ]; then
        if [ -d "$PYTHON_SRC" ]; then
            ln -sfn "$(cd "$PYTHON_SRC" && pwd)" "$FT/src/python3.14-given"
        else
            mkdir -p "$FT/src/python3.14-given"
            tar -xf "$PYTHON_SRC" -C "$FT/src/python3.14-given" --strip-components=1
        fi
    elif ! ls "$FT"/src/python3.14-*/configure >/dev/null 2>&1; then
        if [ ! -f "$SRC_LIST" ]; then
            log "adding deb-src for $SUITE in $SRC_LIST"
            cat >"$SRC_LIST" <<EOF
# Added by loaderx scripts/freethreaded.sh: sources only, to build python3.14 (3.14t).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        fi
        # Refresh only this source's index: the system's other lists are left alone.
        apt-get update -o Dir::Etc::sourcelist="$SRC_LIST" -o Dir::Etc::sourceparts=- \
            -o APT::Get::List-Cleanup=0
        cd "$FT/src"
        # Download only, then unpack without Debian's patches: they adapt the tree to
        # Debian's multiarch install layout and debian/rules' flags, while this is an
        # ordinary private-prefix build of the upstream sources.
        if ! apt-get source --download-only python3.14; then
            log "apt-get source python3.14 failed: the $SUITE index lists it, but its files"
            log "could not be downloaded (above). Give a CPython 3.14 source tree or tarball"
            log "instead: PYTHON_SRC=/path/to/Python-3.14.x.tar.xz $0"
            exit 1
        fi
        dsc="$(ls -1 python3.14_*.dsc | sort -V | tail -n1)"
        dpkg-source --skip-patches -x "$dsc"
    fi
    src_dir
}

src_dir() {
    ls -d "$FT"/src/python3.14-*/ | sort -V | tail -n1
}

BUILD_DEPS=(gcc make pkg-config libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev
    libsqlite3-dev libreadline-dev uuid-dev libzstd-dev libgdbm-dev libexpat1-dev)

step_build() {
    local src
    src="$(src_dir)"
    if [ -x "$PREFIX/bin/python3.14t" ]; then
        log "already built: $PREFIX/bin/python3.14t"
        return
    fi
    local need=()
    for pkg in "${BUILD_DEPS[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    if [ "${#need[@]}" -gt 0 ]; then
        log "installing build dependencies: ${need[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
    fi
    mkdir -p "$FT/build"
    cd "$FT/build"
    log "configure $src --disable-gil --prefix=$PREFIX"
    "${NICE[@]}" "$src/configure" --prefix="$PREFIX" --disable-gil --with-ensurepip=install
    log "make -j$JOBS"
    "${NICE[@]}" make -j"$JOBS"
    "${NICE[@]}" make install
    "$PREFIX/bin/python3.14t" -c 'import sys, sysconfig; assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1, "not a free-threaded build"; print(sys.version)'
}

# Packages the suite needs; each is installed on its own so that one without a
# 3.14t wheel (or a source build that fails) is named and skipped, never fatal.
CORE_DEPS=(numpy cffi msgpack tqdm pytest "ziglang==0.17.0" setuptools wheel)
OPTIONAL_DEPS=(pyarrow pillow zstandard datasets "torch==2.13.0" "torchdata==0.11.0" "jax==0.10.2" "ray[data]" mypy build auditwheel lief)

step_venv() {
    [ -x "$VENV/bin/python" ] || "$PREFIX/bin/python3.14t" -m venv "$VENV"
    local py="$VENV/bin/python"
    "$py" -m pip install -q -U pip
    "$py" -m pip install -q "${CORE_DEPS[@]}"
    local missing=()
    for pkg in "${OPTIONAL_DEPS[@]}"; do
        # --only-binary: a package without a cp314t wheel is reported missing rather
        # than compiled for half an hour (or failing halfway through a source build).
        if ! "$py" -m pip install -q --only-binary=:all: "$pkg" >"$FT/pip-$pkg.log" 2>&1; then
            missing+=("$pkg")
        fi
    done
    # The project itself: build isolation off (its build requirements are installed
    # above); the native library is rebuilt only if the worktree has none.
    local skip=""
    ls "$ROOT"/loaderx/lib/libloaderx.* >/dev/null 2>&1 && skip=1
    (cd "$ROOT" && LOADERX_SKIP_NATIVE="$skip" "$py" -m pip install -q --no-build-isolation --no-deps -e .)
    printf '%s\n' "${missing[@]}" >"$FT/missing.txt"
    if [ "${#missing[@]}" -gt 0 ]; then
        log "no 3.14t wheel (tests needing these skip): ${missing[*]} (logs: $FT/pip-<name>.log)"
    fi
}

check_gil_off() {
    # PYTHON_GIL=0 keeps the GIL off even if an extension module does not declare
    # free-threading support; without it, importing such a module re-enables the GIL
    # (with a RuntimeWarning). Both are reported: the first is the test condition.
    PYTHON_GIL=0 "$VENV/bin/python" -c '
import sys, loaderx
assert not sys._is_gil_enabled(), "GIL enabled despite PYTHON_GIL=0"
print("free-threaded:", sys.version.split()[0], "loaderx", loaderx.__version__, "GIL enabled:", sys._is_gil_enabled())'
    "$VENV/bin/python" -W error::RuntimeWarning -c '
import sys, importlib
mods = ["loaderx", "numpy", "cffi", "msgpack"]
for m in ["pyarrow", "PIL.Image", "zstandard", "torch", "jax"]:
    try:
        importlib.import_module(m); mods.append(m)
    except ImportError:
        pass
    except RuntimeWarning as e:
        print("re-enables the GIL:", m, e)
print("without PYTHON_GIL=0, after importing", ", ".join(mods), "-> GIL enabled:", sys._is_gil_enabled())' || true
}

step_test() {
    check_gil_off
    cd "$ROOT"
    # shellcheck disable=SC2086
    PYTHON_GIL=0 PYTHONPATH="$ROOT" "${NICE[@]}" "$VENV/bin/python" -m pytest ${PYTEST_ARGS:--q} -rs tests 2>&1 | tee "$FT/pytest.log"
}

step_bench() {
    cd "$ROOT"
    for layer in loader dense; do
        PYTHON_GIL=0 PYTHONPATH="$ROOT" "${NICE[@]}" "$VENV/bin/python" scripts/bench.py "$layer" \
            --size "${BENCH_SIZE:-tiny}" --venvs off --json "$FT/bench-$layer.json" 2>&1 | tee "$FT/bench-$layer.log"
    done
}

case "${1:-all}" in
    source) step_source ;;
    build) step_build ;;
    venv) step_venv ;;
    test) step_test ;;
    bench) step_bench ;;
    all) step_source && step_build && step_venv && step_test ;;
    *) echo "usage: $0 [all|source|build|venv|test|bench]" >&2; exit 2 ;;
esac
