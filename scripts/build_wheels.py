"""Pack the release with standard tools: one `py3-none-<platform>` wheel per target + the sdist.

    pip install -e '.[release]'      # build, wheel, auditwheel, lief
    python scripts/build_wheels.py [--out dist] [--only TAG ...] [--isolation]

1. The sdist: `python -m build --sdist` in a copy of the files git knows (so no fetched
   zstd, build output or stale *.egg-info reaches it).
2. Per target of build.zig's `release_targets`: the sdist is unpacked, the verified zstd
   sources (scripts/fetch_vendor.py, the only fetcher) are copied in, `python -m build
   --wheel` runs setup.py with LOADERX_ZIG_TARGET=<triple>, and `python -m wheel tags`
   retags the wheel `py3-none-<tag>`: the library links no CPython (cffi ABI mode).
3. Checks: `auditwheel show` on Linux wheels (for the musl ones see auditwheel_tag); lief
   reads every library (format, CPU, exports, glibc symbol versions, macOS minos and
   signature); and our own check: the exports equal the C ABI's `export fn lx_*` set
   (src/capi.zig and its area files, src/capi/*.zig).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fetch_vendor  # noqa: E402  (the sibling script that is the one fetcher)

ROOT = Path(__file__).resolve().parent.parent
LIB_NAMES = {"linux": "libloaderx.so", "macosx": "libloaderx.dylib", "win": "loaderx.dll"}
NATIVE = (".so", ".dylib", ".dll", ".pyd", ".a", ".lib", ".pdb")
ZSTD_LICENSES = ("vendor/zstd/LICENSE", "vendor/zstd/COPYING")
# Zig's Mach-O linker exports these two from every dylib; nothing in the build can hide
# them, and under macOS's two-level namespace they are harmless.
MACHO_LINKER_SYMBOLS = {"__mh_dylib_header", "___dso_handle"}
SDIST_REQUIRED = ("build.zig", "build.zig.zon", "setup.py", "vendor/zstd.lock.json",
                  "scripts/fetch_vendor.py", "src/capi.zig", "loaderx/_lib.py")
SDIST_FORBIDDEN = ("vendor/zstd/", "loaderx/lib/", "zig-out/", ".zig-cache/", "build/", "dist/")


class PackError(RuntimeError):
    """The release cannot be built, or something built failed a check."""


def release_targets() -> list[tuple[str, str]]:
    """The (zig triple, wheel platform tag) pairs of build.zig's `release_targets`."""
    table = (ROOT / "build.zig").read_text().partition("release_targets = ")[2].partition("\n};")[0]
    pairs = re.findall(r'\.triple = "([^"]+)", \.tag = "([^"]+)"', table)
    if not pairs:
        raise PackError("build.zig: no `release_targets` table")
    return pairs


def versions() -> dict[str, str]:
    """The version each source states; a release needs them all equal."""
    def find(path: str, pattern: str) -> str:
        m = re.search(pattern, (ROOT / path).read_text(), re.M)
        return ".".join(m.groups()) if m else "(none)"
    return {
        "pyproject.toml": find("pyproject.toml", r'^version = "([^"]+)"'),
        "build.zig.zon": find("build.zig.zon", r'^\s*\.version = "([^"]+)"'),
        "loaderx/__init__.py": find("loaderx/__init__.py", r'^__version__ = "([^"]+)"'),
        "src/capi.zig": find("src/capi.zig", r"version_major = (\d+);\s*pub const "
                             r"version_minor = (\d+);\s*pub const version_patch = (\d+);"),
    }


def capi_exports() -> set[str]:
    """The `export fn` names of the C ABI (src/capi.zig, the root, and its area files
    src/capi/*.zig): what every library must export, exactly."""
    files = [ROOT / "src/capi.zig", *sorted((ROOT / "src/capi").glob("*.zig"))]
    return {name for path in files
            for name in re.findall(r"\bexport\s+fn\s+(\w+)\s*\(", path.read_text())}


def parse_tag(tag: str) -> tuple[str, str, tuple[int, int] | None]:
    """(os, arch, minimum version) of a wheel platform tag: ('linux', 'x86_64', (2, 17))."""
    kind, *rest = tag.split("_", 3)
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(rest[-1], rest[-1])
    if kind == "win":
        return "win", arch, None
    return ("macosx" if kind == "macosx" else "linux"), arch, (int(rest[0]), int(rest[1]))


def run(cmd: list, cwd: Path, env: dict | None = None) -> str:
    cmd = [str(c) for c in cmd]
    env = {**os.environ, **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PackError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def build_sdist(out: Path, flags: list[str]) -> Path:
    """`python -m build --sdist` in a staging copy of the tracked and unignored files."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, listed.split("\0")):
            if (ROOT / name).is_file():
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, Path(tmp) / name)
        run([sys.executable, "-m", "build", "--sdist", *flags, "--outdir", out, "."], Path(tmp))
    (sdist,) = out.glob("loaderx-*.tar.gz")
    return sdist


def build_wheel(sdist: Path, triple: str, tag: str, out: Path, flags: list[str]) -> Path:
    """The backend's wheel for one target, from the sdist plus the fetched zstd, retagged."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        src, built = Path(tmp) / sdist.name[: -len(".tar.gz")], Path(tmp) / "wheel"
        shutil.copytree(ROOT / "vendor/zstd", src / "vendor/zstd")
        # One local Zig cache for every target, so the build runner compiles once.
        env = {"LOADERX_ZIG_TARGET": triple, "ZIG_LOCAL_CACHE_DIR": str(ROOT / ".zig-cache")}
        run([sys.executable, "-m", "build", "--wheel", *flags, "--outdir", built, src], src, env)
        (wheel,) = built.glob("*.whl")
        renamed = run([sys.executable, "-m", "wheel", "tags", "--remove", "--python-tag", "py3",
                       "--abi-tag", "none", "--platform-tag", tag, wheel], built).split()[-1]
        return Path(shutil.move(str(built / renamed), out / renamed))


def check_library(path: Path, tag: str, expected: set[str] | None) -> str:
    """Check one library against its tag with lief; returns a one-line summary."""
    import lief
    lief.logging.disable()
    os_name, arch, minimum = parse_tag(tag)
    b = lief.parse(str(path))
    fmt = getattr(lief.Binary.FORMATS, {"linux": "ELF", "macosx": "MACHO", "win": "PE"}[os_name])
    cpu = getattr(lief.Header.ARCHITECTURES, {"x86_64": "X86_64", "aarch64": "ARM64"}[arch])
    if b is None or b.format != fmt or b.abstract.header.architecture != cpu:
        got = "unreadable" if b is None else f"{b.format} {b.abstract.header.architecture}"
        raise PackError(f"{tag}: library is {got}, expected {fmt} {cpu}")
    names = {s.name for s in (b.exported_functions if os_name == "win" else b.exported_symbols)}
    if os_name == "macosx":
        names = {n[1:] for n in names - MACHO_LINKER_SYMBOLS}
    if expected is not None and names != expected:
        raise PackError(f"{tag}: exports differ from the C ABI (src/capi*): missing "
                        f"{sorted(expected - names)}, extra {sorted(names - expected)}")
    if not names or any(not n.startswith("lx_") for n in names):
        raise PackError(f"{tag}: exports must be lx_* only, got {sorted(names)[:10]}")
    return f"{len(names)} lx_* exports, " + _platform_check(b, tag, os_name, minimum)


def _platform_check(b, tag: str, os_name: str, minimum: tuple[int, int] | None) -> str:
    if os_name == "macosx":
        minos = tuple(b.build_version.minos[:2]) if b.has_build_version else None
        if minos is None or minos > minimum:
            raise PackError(f"{tag}: needs macOS {minos}, the tag promises {minimum}")
        if tag.endswith("arm64") and not b.has_code_signature:
            raise PackError(f"{tag}: arm64 macOS loads only signed code (ad-hoc is enough)")
        return f"minos {minos[0]}.{minos[1]}" + (", signed" if b.has_code_signature else "")
    if os_name == "win":
        return f"imports {len(b.imports)} DLLs"
    needed = list(b.libraries)
    glibc = {tuple(map(int, a.name[6:].split("."))) for r in b.symbols_version_requirement
             for a in r.get_auxiliary_symbols() if a.name.startswith("GLIBC_")}
    if tag.startswith("musllinux"):
        if needed != ["libc.so"] or glibc:
            raise PackError(f"{tag}: expected musl's libc.so only, NEEDED {needed}")
        return "NEEDED libc.so"
    if not glibc or max(glibc) > minimum:
        raise PackError(f"{tag}: glibc symbol versions {sorted(glibc)} exceed {minimum}")
    return f"GLIBC <= {'.'.join(map(str, max(glibc)))}"


def auditwheel_tag(wheel: Path, tag: str) -> str:
    """`auditwheel show`: a manylinux wheel must get exactly its tag (2_17 is manylinux2014).

    auditwheel knows musl's libc only as libc.musl-<arch>.so.1 (Alpine's file name); Zig's
    musl stub is named libc.so, which musl's loader also takes as itself. So a musl wheel
    gets linux_<arch> with libc.so the one library to eliminate, and passes if that is all
    and its symbols fit its tag. (PUBLISHING.md explains musllinux_1_2 vs 1_1.)
    """
    with tempfile.TemporaryDirectory() as nothing:  # cross-built: host libraries don't apply
        report = json.loads(run([sys.executable, "-m", "auditwheel", "show", "--json",
                                 "--ldpaths", nothing, wheel], wheel.parent))
    got, sym = report["overall_tag"], report["sym_tag"]
    blockers = report["policy_upgrades"].get(tag, {}).get("libs_to_eliminate")
    musl_ok = (tag.startswith("musllinux") and sym == tag and blockers == ["libc.so"]
               and list(report["external_libs"]) == ["libc.so"])
    if report["unsupported_isa"] or not (got == tag or musl_ok):
        raise PackError(f"{wheel.name}: auditwheel disagrees with {tag}: {report}")
    return f"{got}, symbols {sym}"


def check_wheel(wheel: Path, tag: str, expected: set[str] | None) -> str:
    """One library, this platform's, where loaderx/_lib.py looks; licenses; the checks."""
    lib = f"loaderx/lib/{LIB_NAMES[parse_tag(tag)[0]]}"
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        names = zf.namelist()
        natives = [n for n in names if n.endswith(NATIVE) or ".so." in n]
        if natives != [lib]:
            raise PackError(f"{wheel.name}: native files {natives}, expected only {lib}")
        for want in ("LICENSE", *ZSTD_LICENSES):
            if not any(n.endswith(f".dist-info/licenses/{want}") for n in names):
                raise PackError(f"{wheel.name}: no {want} in *.dist-info/licenses/")
        summary = check_library(Path(zf.extract(lib, tmp)), tag, expected)
    if tag.startswith(("manylinux", "musllinux")):
        summary += f", auditwheel: {auditwheel_tag(wheel, tag)}"
    return summary


def check_sdist(sdist: Path) -> str:
    """Sources only (no zstd sources, library or build output), and all a build needs."""
    with tarfile.open(sdist) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()]
    missing = [n for n in SDIST_REQUIRED if n not in names]
    bad = [n for n in names if n.startswith(SDIST_FORBIDDEN) or n.endswith(NATIVE)
           or "__pycache__" in n]
    if missing or bad:
        raise PackError(f"{sdist.name}: missing {missing}; built or third-party files {bad[:10]}")
    return f"{len(names)} files, sources only"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "dist", help="(emptied of loaderx-*)")
    ap.add_argument("--only", nargs="+", metavar="TAG", help="build only these platform tags")
    ap.add_argument("--isolation", action="store_true", help="isolated build envs (slower)")
    args = ap.parse_args(argv)
    flags = [] if args.isolation else ["--no-isolation"]
    try:
        if len(set(versions().values())) != 1:
            raise PackError(f"versions disagree: {versions()}")
        table = release_targets()
        targets = [(t, g) for t, g in table if not args.only or g in args.only]
        if args.only and len(targets) != len(args.only):
            raise PackError(f"--only {args.only}: build.zig's tags are {[g for _, g in table]}")
        fetch_vendor.fetch()  # the pinned sources in vendor/, verified (no-op when they are)
        args.out.mkdir(parents=True, exist_ok=True)
        for old in args.out.glob("loaderx-*"):
            old.unlink()
        sdist = build_sdist(args.out, flags)
        print(f"{sdist.name}: {check_sdist(sdist)}", flush=True)
        for triple, tag in targets:
            wheel = build_wheel(sdist, triple, tag, args.out, flags)
            print(f"{wheel.name}: {check_wheel(wheel, tag, capi_exports())}", flush=True)
    except (PackError, fetch_vendor.FetchError) as e:
        print(f"build_wheels: {e}", file=sys.stderr)
        return 1
    print(f"{len(targets)} wheel(s) + 1 sdist in {args.out}, all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
