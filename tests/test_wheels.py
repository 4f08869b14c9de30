"""Release packaging: scripts/build_wheels.py and the wheels and sdist it makes.

Always on (seconds): build.zig's release table parses to the 8 expected targets;
the wheel writer packs a correct wheel from a fake dist folder (names, WHEEL tag,
METADATA, RECORD hashes, one library); the sdist holds sources only; the
ELF/Mach-O/PE reader agrees with binutils/LLVM on the host library and on any
libraries already built into zig-out/dist.

Slow, and skipped unless LOADERX_WHEEL_TEST=1 is set (each takes minutes: a Zig
build plus fresh virtualenvs that install numpy and friends from the index):

    LOADERX_WHEEL_TEST=1 python -m pytest -q tests/test_wheels.py

- the host's wheel: its library is built for the host's release target only
  (`zig build -Dtarget=<triple>`, not the 8-target `zig build dist`), packed,
  installed into a fresh venv that never saw the source tree, and the whole test
  suite (a copy of tests/, run from outside the repository) runs against it;
- the sdist: built, installed with pip into another fresh venv (pip fetches zstd
  and runs Zig), then imported and smoke-tested.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("build_wheels", ROOT / "scripts" / "build_wheels.py")
bw = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("build_wheels", bw)
_spec.loader.exec_module(bw)

EXPECTED_TARGETS = {
    "x86_64-linux-gnu.2.17": "manylinux_2_17_x86_64",
    "aarch64-linux-gnu.2.17": "manylinux_2_17_aarch64",
    "x86_64-linux-musl": "musllinux_1_2_x86_64",
    "aarch64-linux-musl": "musllinux_1_2_aarch64",
    "x86_64-macos.11.0": "macosx_11_0_x86_64",
    "aarch64-macos.11.0": "macosx_11_0_arm64",
    "x86_64-windows-gnu": "win_amd64",
    "aarch64-windows-gnu": "win_arm64",
}

SLOW = os.environ.get("LOADERX_WHEEL_TEST") == "1"
slow = pytest.mark.skipif(not SLOW, reason="slow (minutes): set LOADERX_WHEEL_TEST=1 to build and install wheels")


# ---------------------------------------------------------------------------
# Always on

def test_release_table_has_the_eight_targets():
    pairs = bw.release_targets()
    assert dict(pairs) == EXPECTED_TARGETS
    assert len(pairs) == 8
    for triple, tag in pairs:
        plat = bw.parse_tag(tag)
        arch, os_name = triple.split("-")[0], triple.split("-")[1].split(".")[0]
        assert plat.arch == arch
        assert {"linux": "linux", "macos": "macosx", "windows": "win"}[os_name] == plat.os
        if plat.os == "linux":
            assert plat.libc == ("musl" if triple.endswith("musl") else "glibc")
        if triple.endswith("gnu.2.17"):
            assert plat.min_version == (2, 17)
        if ".11.0" in triple:
            assert plat.min_version == (11, 0)


def _fake_root(tmp_path: Path) -> Path:
    """A copy of what packing reads, plus junk that must stay out of the wheel."""
    root = tmp_path / "src"
    shutil.copytree(ROOT / "loaderx", root / "loaderx",
                    ignore=shutil.ignore_patterns("lib", "__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "build.zig"):
        shutil.copy(ROOT / name, root / name)
    (root / "LICENSE").write_text("MIT License\n\nCopyright (c) loaderx authors\n")
    (root / "vendor" / "zstd").mkdir(parents=True)
    (root / "vendor" / "zstd" / "LICENSE").write_text("BSD License\n")
    (root / "vendor" / "zstd" / "COPYING").write_text("GPLv2\n")
    (root / "loaderx" / "__pycache__").mkdir()
    (root / "loaderx" / "__pycache__" / "_lib.cpython-311.pyc").write_bytes(b"\0junk")
    (root / "loaderx" / "lib").mkdir()
    (root / "loaderx" / "lib" / "libloaderx.so").write_bytes(b"stale dev build")
    (root / "loaderx" / "lib" / "loaderx.dll").write_bytes(b"stale other platform")
    return root


@pytest.mark.parametrize("tag,lib_name", [
    ("manylinux_2_17_x86_64", "libloaderx.so"),
    ("macosx_11_0_arm64", "libloaderx.dylib"),
    ("win_arm64", "loaderx.dll"),
])
def test_build_wheel_from_fake_dist(tmp_path, tag, lib_name):
    root = _fake_root(tmp_path)
    project = bw.load_project(root)
    lib_dir = tmp_path / "dist" / tag
    lib_dir.mkdir(parents=True)
    payload = b"fake library for " + tag.encode()
    (lib_dir / lib_name).write_bytes(payload)

    wheel = bw.build_wheel(lib_dir, tag, tmp_path / "out", root=root)
    assert wheel.name == f"loaderx-{project.version}-py3-none-{tag}.whl"
    bw.check_wheel(wheel, root=root, inspect_binary=False)

    dist_info = f"loaderx-{project.version}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        files = {n: zf.read(n) for n in names}
        lib_info = zf.getinfo(f"loaderx/lib/{lib_name}")
    # Exactly one library, this platform's, where loaderx/_lib.py looks for it.
    natives = [n for n in names if n.endswith((".so", ".dylib", ".dll"))]
    assert natives == [f"loaderx/lib/{lib_name}"]
    assert files[f"loaderx/lib/{lib_name}"] == payload
    assert (lib_info.external_attr >> 16) & 0o111, "the library should be executable"
    # The package's Python files, nothing cached, nothing outside the package.
    assert "loaderx/__init__.py" in names and "loaderx/_lib.py" in names
    expected_py = sorted(p.relative_to(root).as_posix() for p in (root / "loaderx").rglob("*.py")
                         if "__pycache__" not in p.parts)
    assert sorted(n for n in names if n.startswith("loaderx/") and n.endswith(".py")) == expected_py
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert all(n.startswith(("loaderx/", dist_info + "/")) for n in names)
    # WHEEL: platform wheel, one tag.
    wheel_meta = files[f"{dist_info}/WHEEL"].decode().splitlines()
    assert "Root-Is-Purelib: false" in wheel_meta
    assert [line for line in wheel_meta if line.startswith("Tag:")] == [f"Tag: py3-none-{tag}"]
    # METADATA from pyproject.toml, extras included.
    head = files[f"{dist_info}/METADATA"].decode().split("\n\n", 1)[0].splitlines()
    assert "Name: loaderx" in head and f"Version: {project.version}" in head
    assert "License: MIT" in head
    for dep in project.dependencies:
        assert f"Requires-Dist: {dep}" in head
    assert "Provides-Extra: test" in head
    assert 'Requires-Dist: pytest>=7; extra == "test"' in head
    assert any(line.startswith("Summary: ") for line in head)
    # Console script and licenses (loaderx's and the embedded zstd's).
    assert "loaderx = loaderx.__main__:main" in files[f"{dist_info}/entry_points.txt"].decode()
    for lic in ("LICENSE", "zstd/LICENSE", "zstd/COPYING"):
        assert f"{dist_info}/licenses/{lic}" in names
    # RECORD: every member once, hashes and sizes recomputed here.
    rows = list(csv.reader(io.StringIO(files[f"{dist_info}/RECORD"].decode())))
    assert sorted(r[0] for r in rows) == sorted(names)
    for name, digest, size in rows:
        if name.endswith("/RECORD"):
            assert digest == size == ""
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}" and int(size) == len(files[name]), name


def test_packing_rejects_a_wrong_dist_folder(tmp_path):
    root = _fake_root(tmp_path)
    dist = tmp_path / "dist"
    (dist / "manylinux_2_17_x86_64").mkdir(parents=True)
    (dist / "manylinux_2_17_x86_64" / "loaderx.dll").write_bytes(b"wrong name for Linux")
    with pytest.raises(bw.PackError, match="expected exactly libloaderx.so"):
        bw.build_wheel(dist / "manylinux_2_17_x86_64", "manylinux_2_17_x86_64", tmp_path / "out", root=root)
    with pytest.raises(bw.PackError, match="no build for"):
        bw.dist_folders(dist)
    assert [t for t, _ in bw.dist_folders(dist, partial=True)] == ["manylinux_2_17_x86_64"]
    (dist / "linux_x86_64").mkdir()
    with pytest.raises(bw.PackError, match="not tags of build.zig"):
        bw.dist_folders(dist, partial=True)


def test_sdist_holds_sources_only(tmp_path):
    pytest.importorskip("setuptools")
    sdist = bw.build_sdist(tmp_path)
    row = bw.check_sdist(sdist)  # required sources present; no zstd, library or build output
    assert row["wheel"] == sdist.name
    # The checker itself rejects an sdist that carries zstd's sources or a library.
    import tarfile
    prefix = sdist.name[:-len(".tar.gz")]
    for intruder in ("vendor/zstd/zstd.c", "loaderx/lib/libloaderx.so"):
        bad = tmp_path / "bad" / sdist.name
        bad.parent.mkdir(exist_ok=True)
        with tarfile.open(sdist) as src, tarfile.open(bad, "w:gz") as dst:
            for member in src.getmembers():
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
            info = tarfile.TarInfo(f"{prefix}/{intruder}")
            info.size = 4
            dst.addfile(info, io.BytesIO(b"junk"))
        with pytest.raises(bw.PackError, match="built or third-party"):
            bw.check_sdist(bad)


def _binutils_view(path: Path) -> tuple[set[str], set[str]]:
    """(defined dynamic symbols, GLIBC_* versions) of an ELF file, per nm and objdump."""
    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    defined = {line.split()[-1] for line in nm.stdout.splitlines() if line.split()[-2] in "TtDdBbRrWwVvi"}
    od = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True, check=True)
    versions = set(re.findall(r"GLIBC_[0-9]+(?:\.[0-9]+)*", od.stdout))
    return defined, versions


def _elf_libraries() -> list[tuple[Path, str]]:
    out = []
    dev = ROOT / "loaderx" / "lib" / "libloaderx.so"
    if dev.is_file() and sys.platform.startswith("linux") and platform.machine() == "x86_64" \
            and platform.libc_ver()[0] == "glibc":
        out.append((dev, "manylinux_2_17_x86_64"))  # setup.py builds the portable gnu.2.17 target
    dist = ROOT / "zig-out" / "dist"
    for tag in EXPECTED_TARGETS.values():
        plat = bw.parse_tag(tag)
        lib = dist / tag / plat.lib_name
        if lib.is_file() and plat.os == "linux":
            out.append((lib, tag))
    return out


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("objdump") is None, reason="needs binutils")
@pytest.mark.parametrize("lib,tag", [pytest.param(lib, tag, id=f"{lib.parent.name}/{lib.name}")
                                     for lib, tag in _elf_libraries()]
                         or [pytest.param(None, None, marks=pytest.mark.skip(reason="no ELF library built"))])
def test_elf_reader_agrees_with_binutils(lib, tag):
    # Exact agreement with src/capi.zig is test_abi's job (and build_wheels' at pack
    # time); a library built before the latest edit must not fail this test.
    binary, _summary = bw.check_library(lib.read_bytes(), bw.parse_tag(tag), None)
    defined, versions = _binutils_view(lib)
    assert set(binary.exports) == defined
    assert {v for v in binary.symbol_versions.values() if v.startswith("GLIBC_")} == versions
    assert all(n.startswith("lx_") for n in defined)


def test_built_dist_libraries_pass_the_release_checks():
    """Every library already in zig-out/dist (if any) matches its tag and exports only lx_*."""
    dist = ROOT / "zig-out" / "dist"
    found = [(t, d) for t, d in ((t, dist / t) for t in EXPECTED_TARGETS.values()) if d.is_dir()]
    if not found:
        pytest.skip("zig-out/dist not built (python -m ziglang build dist)")
    llvm = shutil.which("llvm-objdump")
    for tag, folder in found:
        plat = bw.parse_tag(tag)
        lib = bw.find_library(folder, plat)
        binary, _summary = bw.check_library(lib.read_bytes(), plat, None)
        if llvm and plat.os != "linux":  # cross-check the Mach-O and PE readers (ELF: see above)
            assert set(binary.exports) == _llvm_exports(llvm, lib, plat.os), tag


def _llvm_exports(llvm: str, lib: Path, os_name: str) -> set[str]:
    if os_name == "macosx":
        out = subprocess.run([llvm, "--macho", "--exports-trie", str(lib)], capture_output=True, text=True, check=True)
        names = re.findall(r"^0x[0-9A-Fa-f]+\s+_(\S+)$", out.stdout, re.M)
    else:
        out = subprocess.run([llvm, "-p", str(lib)], capture_output=True, text=True, check=True)
        table = out.stdout.split("Export Table:", 1)[1]
        names = re.findall(r"^\s+\d+\s+0x[0-9a-f]+\s+(\S+)$", table, re.M)
    return set(names)


# ---------------------------------------------------------------------------
# Slow: real wheels and sdist in fresh virtualenvs

def _host_target() -> tuple[str, str]:
    """(zig triple, wheel tag) of the release target this machine runs, or skip."""
    arch = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}.get(
        platform.machine().lower(), platform.machine().lower())
    if sys.platform.startswith("linux"):
        triple = f"{arch}-linux-gnu.2.17" if platform.libc_ver()[0] == "glibc" else f"{arch}-linux-musl"
    elif sys.platform == "darwin":
        triple = f"{arch}-macos.11.0"
    elif sys.platform == "win32":
        triple = f"{arch}-windows-gnu"
    else:
        pytest.skip(f"no release target for {sys.platform}")
    table = dict(bw.release_targets())
    if triple not in table:
        pytest.skip(f"{triple} is not a release target")
    return triple, table[triple]


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LOADERX_WHEEL_TEST",
                        "LOADERX_SKIP_NATIVE", "LOADERX_ZIG_TARGET", "PYTHONSAFEPATH")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd, cwd, timeout=1800, **kw):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True,
                          text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, env=_clean_env(), timeout=600)
    return path / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


_WHERE = """
import json, sysconfig, loaderx, loaderx._lib as l
print(json.dumps({"package": loaderx.__file__, "library": l.LIBRARY_PATH,
                  "purelib": sysconfig.get_paths()["purelib"], "platlib": sysconfig.get_paths()["platlib"],
                  "version": l.version()}))
"""

_SMOKE = """
import sys, tempfile, numpy as np
from loaderx.zrecord import DenseStore
with tempfile.TemporaryDirectory() as d:
    data = np.arange(64 * 100, dtype=np.int32).reshape(100, 64)
    with DenseStore(d + "/s", np.int32, (64,), codec="zstd") as s:
        s.append(data)
        got = s[np.array([7, 0, 99])]
    assert (got == data[[7, 0, 99]]).all()
print("smoke ok")
"""


def _assert_installed(py: Path, venv: Path, cwd: Path) -> dict:
    import json
    where = json.loads(_run([py, "-c", _WHERE], cwd=cwd).strip().splitlines()[-1])
    site = Path(where["platlib"]).resolve()
    pkg = Path(where["package"]).resolve()
    assert site in pkg.parents, f"loaderx imported from {pkg}, not the venv's site-packages {site}"
    assert Path(venv).resolve() in pkg.parents
    assert ROOT not in pkg.parents, f"loaderx imported from the source tree: {pkg}"
    assert Path(where["library"]).resolve().parent == pkg.parent / "lib"
    return where


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("wheels")


@slow
def test_host_wheel_passes_the_suite_in_a_fresh_venv(work):
    triple, tag = _host_target()
    plat = bw.parse_tag(tag)
    # Build only the host's release target (the full `zig build dist` is 8 targets).
    prefix = work / "zig" / "prefix"
    _run([sys.executable, "-m", "ziglang", "build", f"-Dtarget={triple}", "-Doptimize=ReleaseFast",
          "-p", prefix], cwd=ROOT)
    # The default install step puts the library at <prefix>/../loaderx/lib (see build.zig).
    built = prefix.parent / "loaderx" / "lib" / plat.lib_name
    assert built.is_file(), f"zig build did not produce {built}"
    lib_dir = work / "dist" / tag
    lib_dir.mkdir(parents=True)
    shutil.copy2(built, lib_dir / plat.lib_name)
    wheel = bw.build_wheel(lib_dir, tag, work / "out")
    row = bw.check_wheel(wheel)
    print(row)

    outside = work / "outside"
    outside.mkdir()
    venv = work / "venv-wheel"
    py = _venv(venv)
    _run([py, "-m", "pip", "install", "-q", wheel, "pytest>=7"], cwd=outside)
    where = _assert_installed(py, venv, outside)
    assert where["version"]
    _run([venv / ("Scripts" if sys.platform == "win32" else "bin") / "loaderx", "--help"], cwd=outside)

    # The suite, copied out of the repository. tests/ reads src/capi.zig (the ABI
    # test) and scripts/ (the bench smoke test), so those come along as data; the
    # loaderx package itself does not exist anywhere but in the venv.
    suite = work / "suite"
    shutil.copytree(ROOT / "tests", suite / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "test_wheels.py"))
    shutil.copytree(ROOT / "src", suite / "src", ignore=shutil.ignore_patterns("*.o"))
    shutil.copytree(ROOT / "scripts", suite / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (suite / "loaderx").exists()
    out = _run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", suite, suite / "tests"],
               cwd=suite, timeout=3600)
    print(out[-2000:])
    assert re.search(r"\d+ passed", out) and " failed" not in out


@slow
def test_sdist_installs_from_source_in_a_fresh_venv(work):
    sdist = bw.build_sdist(work / "sdist")
    bw.check_sdist(sdist)
    outside = work / "outside-sdist"
    outside.mkdir()
    venv = work / "venv-sdist"
    py = _venv(venv)
    # pip builds it in isolation: ziglang from the index, zstd fetched and verified, Zig run.
    _run([py, "-m", "pip", "install", "-q", "--no-cache-dir", sdist], cwd=outside, timeout=3600)
    _assert_installed(py, venv, outside)
    assert "smoke ok" in _run([py, "-c", _SMOKE], cwd=outside)
