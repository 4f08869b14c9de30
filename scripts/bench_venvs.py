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
    text = json.dumps([spec.requirements, sys.version_info[:2]])
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


def venv_env() -> dict:
    """The environment for a child run from a private venv: no PYTHONHOME/PYTHONPATH leaks."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    return env
