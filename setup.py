"""Build hook: `pip install .` / `pip install -e .` compiles libloaderx with the
Zig compiler from PyPI (the `ziglang` build requirement), after fetching and
verifying the pinned zstd and libjpeg-turbo sources (scripts/fetch_vendor.py). No
other step."""
import os
import platform
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))

# The library embeds compiled zstd, so a wheel carries zstd's license (BSD or GPLv2,
# at the user's choice) next to loaderx's, in *.dist-info/licenses/. They are only
# there once zstd is fetched: the release script fetches before it builds (and checks
# the wheels for them); a first build from the sdist computes its metadata before
# build_py fetches, so that wheel carries only LICENSE.
ZSTD_LICENSES = ("vendor/zstd/LICENSE", "vendor/zstd/COPYING")


def portable_target() -> str:
    """An explicit, portable Zig target for this machine (never the host CPU)."""
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if sys.platform.startswith("linux"):
        libc = platform.libc_ver()[0]
        return f"{arch}-linux-gnu.2.17" if libc == "glibc" else f"{arch}-linux-musl"
    if sys.platform == "darwin":
        return f"{arch}-macos.11.0"
    if sys.platform == "win32":
        return f"{arch}-windows-gnu"
    raise RuntimeError(f"unsupported platform {sys.platform}/{machine}")


def build_native() -> None:
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import fetch_vendor
    finally:
        sys.path.pop(0)
    try:
        fetch_vendor.fetch()
    except fetch_vendor.FetchError as e:
        raise SystemExit(f"loaderx build: {e}")
    target = os.environ.get("LOADERX_ZIG_TARGET") or portable_target()
    cmd = [sys.executable, "-m", "ziglang", "build", f"-Dtarget={target}", "-Doptimize=ReleaseFast"]
    print("loaderx build:", " ".join(cmd), flush=True)
    # SystemExit, not CalledProcessError: setuptools' editable builds turn
    # ordinary exceptions from build commands into warnings.
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        raise SystemExit("loaderx build: `zig build` failed (see its output above)")
    lib_dir = os.path.join(ROOT, "loaderx", "lib")
    if not os.path.isdir(lib_dir) or not os.listdir(lib_dir):
        raise SystemExit(f"loaderx build: zig build produced no library in {lib_dir}")


def compile_in_place() -> None:
    """An editable install byte-compiles the package where it lies, as pip does
    for an installed one: with PYTHONDONTWRITEBYTECODE set no import writes a
    .pyc, so every process would compile loaderx again (0.6 s against 0.34 s
    to import it on a 2-core machine). An edited module's .pyc is stale by its
    source's time stamp and ignored."""
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "loaderx"), quiet=1)


class BuildWithZig(build_py):
    def run(self):
        if not os.environ.get("LOADERX_SKIP_NATIVE"):
            build_native()
        super().run()
        if self.editable_mode:
            compile_in_place()


class BinaryDistribution(Distribution):
    """The package carries a native library: wheels built from source get a
    platform tag, not py3-none-any (scripts/build_wheels.py retags release wheels
    py3-none-<platform>: the library does not link CPython)."""

    def has_ext_modules(self):
        return True


def license_files() -> list:
    return ["LICENSE"] + [p for p in ZSTD_LICENSES if os.path.isfile(os.path.join(ROOT, p))]


setup(
    cmdclass={"build_py": BuildWithZig},
    distclass=BinaryDistribution,
    license_files=license_files(),
)
