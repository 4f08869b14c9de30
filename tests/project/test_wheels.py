"""Release packaging: scripts/build_wheels.py and the wheels and sdist it makes.

Always on (seconds): build.zig's release table parses to the 8 expected targets; the wheel
checker rejects a wheel with a stray library or without zstd's licenses. With the release
extra installed (`pip install -e '.[release]'`): the sdist holds sources only, and the
lief-based library checks accept the host library and any in zig-out/dist, and reject
wrong exports, a wrong tag, CPU or libc.

Slow, and skipped unless LOADERX_WHEEL_TEST=1 is set (minutes: Zig builds plus fresh
virtualenvs that install numpy and friends from the index):

    LOADERX_WHEEL_TEST=1 python -m pytest -q tests/project/test_wheels.py

- the host's wheel: `build_wheels.py --only <host tag>` builds the sdist and, from it, the
  host's wheel through setup.py, retags and audits it; the wheel is installed into a fresh
  venv that never saw the source tree, and the whole test suite (a copy of tests/, run
  from outside the repository) runs against it;
- the sdist: installed with pip into another fresh venv (pip fetches zstd and runs Zig),
  then imported and smoke-tested.
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from _helpers import ROOT as REPO

ROOT = Path(REPO)
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
RELEASE_TOOLS = ("build", "wheel", "auditwheel", "lief")


def _missing_tools() -> list[str]:
    return [m for m in RELEASE_TOOLS if importlib.util.find_spec(m) is None]


release_tools = pytest.mark.skipif(
    bool(_missing_tools()),
    reason=f"needs the release extra (pip install -e '.[release]'): missing {_missing_tools()}")
SLOW = os.environ.get("LOADERX_WHEEL_TEST") == "1"
slow = pytest.mark.skipif(not SLOW, reason="slow (minutes): set LOADERX_WHEEL_TEST=1")


# ---------------------------------------------------------------------------
# Always on

def test_release_table_has_the_eight_targets():
    pairs = bw.release_targets()
    assert dict(pairs) == EXPECTED_TARGETS and len(pairs) == 8
    for triple, tag in pairs:
        os_name, arch, minimum = bw.parse_tag(tag)
        zig_arch, zig_os = triple.split("-")[0], triple.split("-")[1].split(".")[0]
        assert arch == zig_arch
        assert {"linux": "linux", "macos": "macosx", "windows": "win"}[zig_os] == os_name
        assert tag.startswith("musllinux") == triple.endswith("musl")
        if triple.endswith("gnu.2.17"):
            assert minimum == (2, 17)
        if ".11.0" in triple:
            assert minimum == (11, 0)


def _fake_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _wheel_members(lib_name: str) -> dict[str, bytes]:
    info = "loaderx-0.1.0.dist-info"
    return {"loaderx/__init__.py": b"", f"loaderx/lib/{lib_name}": b"\x7fELF",
            f"{info}/licenses/LICENSE": b"MIT", f"{info}/licenses/vendor/zstd/LICENSE": b"BSD",
            f"{info}/licenses/vendor/zstd/COPYING": b"GPLv2"}


def test_check_wheel_rejects_stray_libraries_and_missing_licenses(tmp_path):
    tag = "manylinux_2_17_x86_64"
    stale = {**_wheel_members("libloaderx.so"), "loaderx/lib/loaderx.dll": b"MZ"}
    with pytest.raises(bw.PackError, match=r"native files .*loaderx.dll.*expected only"):
        bw.check_wheel(_fake_wheel(tmp_path / "a.whl", stale), tag, None)
    wrong_name = _wheel_members("loaderx.dll")
    with pytest.raises(bw.PackError, match="expected only loaderx/lib/libloaderx.so"):
        bw.check_wheel(_fake_wheel(tmp_path / "b.whl", wrong_name), tag, None)
    no_gpl = {k: v for k, v in _wheel_members("libloaderx.so").items() if "COPYING" not in k}
    with pytest.raises(bw.PackError, match="no vendor/zstd/COPYING"):
        bw.check_wheel(_fake_wheel(tmp_path / "c.whl", no_gpl), tag, None)


# ---------------------------------------------------------------------------
# With the release extra

@release_tools
def test_sdist_holds_sources_only(tmp_path):
    sdist = bw.build_sdist(tmp_path, ["--no-isolation"])
    assert re.fullmatch(r"loaderx-\d+\.\d+\.\d+\.tar\.gz", sdist.name)
    assert "sources only" in bw.check_sdist(sdist)
    with tarfile.open(sdist) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    assert {"build.zig.zon", "build.zig", "src/capi.zig", "loaderx/_lib.py"} <= names
    # The checker itself rejects an sdist that carries zstd's sources or a library.
    prefix = sdist.name[: -len(".tar.gz")]
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


def _dev_library() -> Path | None:
    """The x86-64 glibc dev library: setup.py and `zig build` make the gnu.2.17 target."""
    dev = ROOT / "loaderx" / "lib" / "libloaderx.so"
    host = sys.platform.startswith("linux") and platform.machine() == "x86_64" \
        and platform.libc_ver()[0] == "glibc"
    return dev if host and dev.is_file() else None


def _built_libraries() -> list[tuple[Path, str]]:
    """The dev library and whatever `zig build dist` left in zig-out/dist."""
    out = [(_dev_library(), "manylinux_2_17_x86_64")] if _dev_library() else []
    for tag in EXPECTED_TARGETS.values():
        lib = ROOT / "zig-out" / "dist" / tag / bw.LIB_NAMES[bw.parse_tag(tag)[0]]
        if lib.is_file():
            out.append((lib, tag))
    return out


@release_tools
@pytest.mark.parametrize("lib,tag", [pytest.param(lib, tag, id=f"{lib.parent.name}/{lib.name}")
                                     for lib, tag in _built_libraries()]
                         or [pytest.param(None, None, marks=pytest.mark.skip(
                             reason="no library built (pip install -e . or zig build dist)"))])
def test_built_libraries_pass_the_release_checks(lib, tag):
    # The dev library is rebuilt with every install, so it must export exactly the C ABI's
    # set; zig-out/dist may predate the latest edit of it, so there only lx_* names
    # are required (the exact set is checked again when the release is packed).
    expected = bw.capi_exports() if lib == _dev_library() else None
    summary = bw.check_library(lib, tag, expected)
    assert re.match(r"\d+ lx_\* exports, ", summary)
    platform_part = {"manylinux": "GLIBC <= 2.17", "musllinux": "NEEDED libc.so",
                     "macosx": "minos 11.0", "win": "DLLs"}[tag.split("_")[0]]
    assert platform_part in summary
    if tag == "macosx_11_0_arm64":
        assert summary.endswith("signed")


@release_tools
@pytest.mark.skipif(_dev_library() is None,
                    reason="needs the x86-64 glibc dev library (pip install -e . on such a host)")
def test_library_checks_reject_what_does_not_match():
    import lief
    lib = _dev_library()
    binary = lief.parse(str(lib))  # kept alive: lief's iterators point into it
    names = {s.name for s in binary.exported_symbols}
    assert bw.check_library(lib, "manylinux_2_17_x86_64", names).startswith(f"{len(names)} lx_")
    one = sorted(names)[0]
    with pytest.raises(bw.PackError, match=rf"missing \[\], extra \['{one}'\]"):
        bw.check_library(lib, "manylinux_2_17_x86_64", names - {one})
    with pytest.raises(bw.PackError, match=r"missing \['lx_not_there'\]"):
        bw.check_library(lib, "manylinux_2_17_x86_64", names | {"lx_not_there"})
    with pytest.raises(bw.PackError, match="expected .*ARM64"):
        bw.check_library(lib, "manylinux_2_17_aarch64", names)
    with pytest.raises(bw.PackError, match="expected FORMATS.PE"):
        bw.check_library(lib, "win_amd64", names)
    with pytest.raises(bw.PackError, match="expected musl's libc.so only"):
        bw.check_library(lib, "musllinux_1_2_x86_64", names)
    with pytest.raises(bw.PackError, match=r"glibc symbol versions .* exceed \(2, 5\)"):
        bw.check_library(lib, "manylinux_2_5_x86_64", names)


# ---------------------------------------------------------------------------
# Slow: real wheels and sdist in fresh virtualenvs

def _host_tag() -> str:
    """The wheel tag of the release target this machine runs, or skip."""
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(),
                                                       platform.machine().lower())
    if sys.platform.startswith("linux"):
        glibc = platform.libc_ver()[0] == "glibc"
        triple = f"{arch}-linux-gnu.2.17" if glibc else f"{arch}-linux-musl"
    elif sys.platform == "darwin":
        triple = f"{arch}-macos.11.0"
    elif sys.platform == "win32":
        triple = f"{arch}-windows-gnu"
    else:
        pytest.skip(f"no release target for {sys.platform}")
    table = dict(bw.release_targets())
    if triple not in table:
        pytest.skip(f"{triple} is not a release target")
    return table[triple]


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LOADERX_WHEEL_TEST",
                        "LOADERX_SKIP_NATIVE", "LOADERX_ZIG_TARGET", "PYTHONSAFEPATH")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd, cwd, timeout=1800):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, \
        f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, env=_clean_env(),
                   timeout=600)
    return path / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


_WHERE = """
import json, sysconfig, loaderx, loaderx._lib as l
print(json.dumps({"package": loaderx.__file__, "library": l.LIBRARY_PATH,
                  "platlib": sysconfig.get_paths()["platlib"], "version": l.version()}))
"""

_SMOKE = """
import tempfile, numpy as np
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
    where = json.loads(_run([py, "-c", _WHERE], cwd=cwd).strip().splitlines()[-1])
    pkg = Path(where["package"]).resolve()
    assert Path(where["platlib"]).resolve() in pkg.parents, f"loaderx imported from {pkg}"
    assert Path(venv).resolve() in pkg.parents
    assert ROOT not in pkg.parents, f"loaderx imported from the source tree: {pkg}"
    assert Path(where["library"]).resolve().parent == pkg.parent / "lib"
    return where


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """build_wheels.py for the host's tag only: (sdist, wheel, work dir)."""
    assert not _missing_tools(), f"install the release extra first: missing {_missing_tools()}"
    work = tmp_path_factory.mktemp("wheels")
    tag = _host_tag()
    assert bw.main(["--out", str(work / "out"), "--only", tag]) == 0
    (sdist,) = (work / "out").glob("loaderx-*.tar.gz")
    (wheel,) = (work / "out").glob(f"loaderx-*-py3-none-{tag}.whl")
    return sdist, wheel, work


@slow
def test_host_wheel_passes_the_suite_in_a_fresh_venv(release):
    _sdist, wheel, work = release
    outside = work / "outside"
    outside.mkdir()
    venv = work / "venv-wheel"
    py = _venv(venv)
    _run([py, "-m", "pip", "install", "-q", wheel, "pytest>=7"], cwd=outside)
    where = _assert_installed(py, venv, outside)
    assert re.fullmatch(r"\d+\.\d+\.\d+", where["version"])
    _run([venv / ("Scripts" if sys.platform == "win32" else "bin") / "loaderx", "--help"],
         cwd=outside)
    # The suite, copied out of the repository. tests/ reads src/capi*.zig (the ABI test),
    # scripts/ (the bench smoke test) and the README, docs/ and examples/ (whose code
    # runs as tests), so those come along as data; the loaderx
    # package exists only in the venv. The three source-tree tests stay behind: this
    # file, the version check (pyproject.toml, loaderx/) and the bindings check (it
    # regenerates loaderx/_abi.py with Zig).
    suite = work / "suite"
    shutil.copytree(ROOT / "tests", suite / "tests", ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "test_wheels.py", "test_version.py", "test_abi.py"))
    shutil.copytree(ROOT / "src", suite / "src", ignore=shutil.ignore_patterns("*.o"))
    shutil.copytree(ROOT / "scripts", suite / "scripts",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for docs in ("docs", "examples"):
        shutil.copytree(ROOT / docs, suite / docs, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "README.md", suite / "README.md")
    assert not (suite / "loaderx").exists()
    out = _run([py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", suite,
                suite / "tests"], cwd=suite, timeout=3600)
    print(out[-2000:])
    assert re.search(r"\d+ passed", out) and " failed" not in out


@slow
def test_sdist_installs_from_source_in_a_fresh_venv(release):
    sdist, _wheel, work = release
    outside = work / "outside-sdist"
    outside.mkdir()
    venv = work / "venv-sdist"
    py = _venv(venv)
    # pip builds it in isolation: setuptools and ziglang from the index, zstd fetched and
    # verified, Zig run.
    _run([py, "-m", "pip", "install", "-q", "--no-cache-dir", sdist], cwd=outside, timeout=3600)
    _assert_installed(py, venv, outside)
    assert "smoke ok" in _run([py, "-c", _SMOKE], cwd=outside)
