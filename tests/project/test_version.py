"""One version everywhere: pyproject.toml is the source of truth, and build.zig.zon,
loaderx/__init__.py and lx_version (src/capi.zig) must state the same; the Zig the
manifest asks for is the Zig the build pins. Reads files only (no library needed)."""
import re
import sys
from pathlib import Path

from _helpers import ROOT as REPO

ROOT = Path(REPO)
sys.path.insert(0, str(ROOT / "scripts"))
import build_wheels as bw  # noqa: E402  (scripts/ is not a package)

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


def _pyproject() -> dict:
    if tomllib is None:
        import pytest
        pytest.skip("reading pyproject.toml needs tomllib (Python >= 3.11)")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_every_source_states_the_pyproject_version():
    want = _pyproject()["project"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", want)
    # build_wheels.py refuses to release unless these agree; this is that gate, in CI.
    assert bw.versions() == {
        "pyproject.toml": want,
        "build.zig.zon": want,
        "loaderx/__init__.py": want,
        "src/capi.zig": want,
    }


def test_zon_declares_one_version_and_the_pinned_zig():
    zon = (ROOT / "build.zig.zon").read_text()
    # Exactly one top-level .version (a dependency entry has none), so the regex in
    # build_wheels.versions() cannot pick up the wrong one.
    assert len(re.findall(r"^\s*\.version\s*=", zon, re.M)) == 1
    minimum = re.search(r'\.minimum_zig_version = "([^"]+)"', zon).group(1)
    requires = _pyproject()["build-system"]["requires"]
    assert f"ziglang=={minimum}" in requires
    assert re.search(r'\.zstd = \.\{ \.path = "vendor/zstd" \}', zon)
