"""Private virtualenvs for contenders that cannot share the bench's own environment.

mosaicml-streaming 0.13 needs numpy < 2.2 and a torchvision whose native ops
load, which only a CUDA build of torch provides (the CPU torch wheel cannot
load PyPI's torchvision); litdata pulls torchvision, which upgrades torch next
to the bench extra's pin. Each such contender therefore runs from its own
virtualenv under `<cache>/venvs/<name>`, created by the bench itself from the
pinned requirements below, so a fresh clone reproduces it. The bench already
runs every contender in a fresh child process; these children simply use the
venv's interpreter, which needs nothing of loaderx (numpy and the contender).

A venv is ready when it holds a marker naming exactly its requirements. A
failed install is remembered the same way (with pip's own reason), so a later
run reports "missing: pip: ..." at once instead of resolving again; delete the
venv's folder to retry. Modes: "build" (create what is absent), "use" (only
use ready venvs: the smoke test) and "off" (report every venv contender as
missing).

Some contenders also need Debian packages (`system`): FFCV compiles against
OpenCV and libjpeg-turbo found by pkg-config, SPDL loads FFmpeg's shared
libraries. In "build" mode, running as root with apt-get present, the bench
installs the missing ones with `apt-get install -y --no-install-recommends`;
otherwise (or when apt fails) the venv is "missing" with apt's reason or the
command to run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench_harness import Unavailable

MODES = ("build", "use", "off")
INSTALL_TIMEOUT_S = 3600


@dataclasses.dataclass(frozen=True)
class VenvSpec:
    """One private environment: pinned requirements and the distributions to report."""

    name: str
    requirements: tuple
    report: tuple  # distributions whose versions the bench prints
    probe: str  # a statement that must run in the venv, proving the contender imports
    why: str
    system: tuple = ()  # Debian packages it needs (dpkg names), installed before pip


# "torch===2.13.0" (arbitrary equality) selects PyPI's CUDA build: its torchvision 0.28.0
# loads its native ops, which streaming imports unconditionally; the CPU wheel
# ("2.13.0+cpu") cannot load them. CUDA libraries are only loaded, never used.
SPECS = {
    "streaming": VenvSpec(
        "streaming",
        ("mosaicml-streaming==0.13.0", "torch===2.13.0", "torchvision==0.28.0", "numpy==2.1.3"),
        ("mosaicml-streaming", "torch", "torchvision", "numpy"),
        "import streaming; from streaming import MDSWriter, StreamingDataset",
        "mosaicml-streaming 0.13 needs numpy < 2.2 and a torchvision whose ops load",
    ),
    "lance": VenvSpec(
        "lance",
        ("pylance==14.0.2", "pyarrow==26.0.1", "numpy==2.4.6"),
        ("pylance", "pyarrow", "numpy"),
        "import lance, pyarrow",
        "pylance is not in the bench extra (the remote layer's take() contender)",
    ),
    # The images layer (bench_images). torchvision's native ops load only beside the torch
    # build they were made for; the test extra pins torch 2.13.0 (CPU), whose PyPI
    # torchvision fails ("operator torchvision::nms does not exist"). pip on Python 3.11
    # takes torch 2.14.1 (a CUDA build, run on the CPU) and torchvision 0.29.1 from this
    # machine's disk (/etc/xdg/pip caps both there).
    "torchvision": VenvSpec(
        "torchvision",
        ("torch==2.14.1", "torchvision==0.29.1", "numpy==2.4.6", "pillow==13.0.0"),
        ("torch", "torchvision", "pillow", "numpy"),
        "import torch, torchvision; from torchvision.io import decode_jpeg;"
        " from torchvision.transforms import v2; from torchvision import datasets",
        "torchvision needs the torch it was built for, not the test extra's torch 2.13.0",
    ),
    # FFCV has no wheels: its sdist compiles libffcv against pkg-config's opencv4 and
    # libturbojpeg (without them: "Could not find required package: opencv"), and it
    # pulls torch (2.14.1 from this disk, as above), numba and opencv-python.
    "ffcv": VenvSpec(
        "ffcv",
        ("ffcv==1.0.2", "torch==2.14.1", "numpy==2.4.6", "numba==0.68.1",
         "opencv-python==5.1.0.95", "pillow==13.0.0"),
        ("ffcv", "torch", "numba", "opencv-python", "numpy"),
        "import ffcv, ffcv.libffcv; from ffcv.loader import Loader;"
        " from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder",
        "FFCV builds from its sdist against Debian's OpenCV and libjpeg-turbo, and pulls torch",
        system=("libopencv-dev", "libturbojpeg0-dev", "pkg-config"),
    ),
    # NVIDIA DALI CPU-only: the CUDA-named wheel (262 MB) runs on the CPU with
    # device_id=None; no CUDA library is loaded.
    "dali": VenvSpec(
        "dali",
        ("nvidia-dali-cuda120==2.4.0", "numpy==2.4.6"),
        ("nvidia-dali-cuda120", "numpy"),
        "from nvidia.dali import pipeline_def, fn, types",
        "DALI's wheel is 262 MB and CUDA-named; it stays out of the bench extra",
    ),
    # SPDL decodes through FFmpeg's shared libraries, which its wheel does not carry:
    # Debian bookworm's FFmpeg 5.1 (libavcodec59 ...) comes with the -dev packages.
    "spdl": VenvSpec(
        "spdl",
        ("spdl==0.8.0", "numpy==2.4.6"),
        ("spdl", "numpy"),
        "import spdl.io, spdl.pipeline; spdl.io.demux_image",
        "SPDL needs FFmpeg's shared libraries (Debian's libav*)",
        system=("libavcodec-dev", "libavformat-dev", "libavutil-dev", "libavfilter-dev",
                "libavdevice-dev", "libswscale-dev", "libswresample-dev"),
    ),
    "litdata": VenvSpec(
        "litdata",
        ("litdata==0.2.76", "torch==2.13.0", "torchvision==0.28.0", "numpy==2.4.6"),
        ("litdata", "torch", "numpy"),
        "import litdata; from litdata import optimize, StreamingDataset, StreamingDataLoader;"
        " from litdata import TokensLoader",
        "litdata pulls torchvision, which upgrades torch next to the bench extra",
    ),
}


def _digest(spec: VenvSpec) -> str:
    # A spec without Debian packages keeps the digest it had before `system` existed.
    extra = [spec.system] if spec.system else []
    text = json.dumps([spec.requirements, sys.version_info[:2]] + extra)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _pip_reason(output: str) -> str:
    """pip's own words, without the index-location warnings this machine prints."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("WARNING: Location")]
    errors = [line for line in lines if line.startswith("ERROR") or "error" in line.lower()]
    picked = (errors or lines or ["no output"])[-3:]
    return " | ".join(picked)[:300]


class Venvs:
    """The bench's private environments, created on demand under `root`."""

    def __init__(self, root: Path, mode: str, log):
        assert mode in MODES, mode
        self.root = root
        self.mode = mode
        self.log = log
        self.used: dict[str, dict] = {}  # name -> versions, for the report

    def python(self, name: str) -> str:
        """The interpreter of venv `name`; raises Unavailable("missing", why) if there is none."""
        spec = SPECS[name]
        if self.mode == "off":
            raise Unavailable("missing", f"private venv '{name}' disabled (--venvs off)")
        home = self.root / name
        marker = home / "bench-venv.json"
        state = self._state(marker, spec)
        if state is None and self.mode == "use":
            raise Unavailable(
                "missing", f"private venv '{name}' not built (run with --venvs build; {spec.why})"
            )
        if state is None:
            state = self._build(home, marker, spec)
        if state["status"] != "ok":
            raise Unavailable("missing", f"pip: {state['reason']} (cached: delete {home} to retry)")
        self.used[name] = state["versions"]
        return str(home / "bin" / "python")

    @staticmethod
    def _state(marker: Path, spec: VenvSpec) -> dict | None:
        try:
            state = json.loads(marker.read_text())
        except (OSError, ValueError):
            return None
        return state if state.get("digest") == _digest(spec) else None

    def _build(self, home: Path, marker: Path, spec: VenvSpec) -> dict:
        shutil.rmtree(home, ignore_errors=True)
        home.parent.mkdir(parents=True, exist_ok=True)
        self.log(
            f"venv {spec.name}: creating {home} ({' '.join(spec.requirements)}); this runs once"
        )
        start = time.perf_counter()
        state = self._install(home, spec)
        state["digest"] = _digest(spec)
        state["seconds"] = round(time.perf_counter() - start, 1)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(state, indent=1))
        self.log(f"venv {spec.name}: {state['status']} in {state['seconds']} s")
        return state

    def _install(self, home: Path, spec: VenvSpec) -> dict:
        problem = system_packages(spec.system)
        if problem:
            return {"status": "missing", "reason": problem}
        base = getattr(sys, "_base_executable", sys.executable)
        steps = [
            [base, "-m", "venv", str(home)],
            [str(home / "bin" / "python"), "-m", "pip", "install", "--quiet", *spec.requirements],
            [str(home / "bin" / "python"), "-c", spec.probe],
        ]
        for step in steps:
            try:
                done = subprocess.run(
                    step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return {
                    "status": "missing",
                    "reason": f"{step[2]}: {type(exc).__name__}: {exc}"[:300],
                }
            if done.returncode != 0:
                return {
                    "status": "missing",
                    "reason": f"{step[2]}: {_pip_reason(done.stdout + done.stderr)}",
                }
        return {"status": "ok", "versions": self._versions(home, spec)}

    @staticmethod
    def _versions(home: Path, spec: VenvSpec) -> dict:
        code = (
            "import importlib.metadata as m, json, sys;"
            f"print(json.dumps({{d: m.version(d) for d in {list(spec.report)!r}}}"
            " | {'python': sys.version.split()[0]}))"
        )
        done = subprocess.run(
            [str(home / "bin" / "python"), "-c", code], capture_output=True, text=True
        )
        return json.loads(done.stdout) if done.returncode == 0 else {"versions": "unknown"}

    def report_lines(self) -> list[str]:
        lines = []
        for name, versions in sorted(self.used.items()):
            listed = ", ".join(f"{k} {v}" for k, v in versions.items())
            lines.append(f"venv {name} ({self.root / name}): {listed}")
        return lines


def missing_debian(packages: tuple) -> list[str]:
    """The Debian packages of `packages` that dpkg does not list as installed."""
    if not packages:
        return []
    try:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${Package} ${Status}\\n", *packages],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return list(packages)
    installed = {line.split()[0] for line in done.stdout.splitlines()
                 if line.endswith("install ok installed")}
    return [name for name in packages if name not in installed]


def system_packages(packages: tuple) -> str:
    """Installs the missing Debian `packages` as root with apt-get; "" when all are there,
    else why not (apt's own words, or the command to run)."""
    missing = missing_debian(packages)
    if not missing:
        return ""
    command = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"needs Debian packages {' '.join(missing)} (as root: {' '.join(command)})"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for step in (["apt-get", "update", "-q"], command):
        try:
            done = subprocess.run(step, capture_output=True, text=True, env=env,
                                  timeout=INSTALL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"apt: {' '.join(step)}: {type(exc).__name__}: {exc}"[:300]
        if done.returncode != 0:
            return f"apt: {' '.join(step)}: {_pip_reason(done.stdout + done.stderr)}"[:300]
    left = missing_debian(packages)
    return f"apt: still not installed: {' '.join(left)}" if left else ""


def venv_env() -> dict:
    """The environment for a child run from a private venv: no PYTHONHOME/PYTHONPATH leaks."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    return env
