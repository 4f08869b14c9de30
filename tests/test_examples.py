"""Every script in examples/ runs as a user would run it: ``python
examples/NAME.py`` in a fresh process (working directory: a temporary one),
and must exit 0 within the timeout. An example that imports a package this
environment lacks is skipped, naming the package.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(glob.glob(os.path.join(REPO, "examples", "*.py")))
TIMEOUT_S = 300


def imported_packages(path):
    """The top-level package of every import statement in the script."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return sorted(names)


def test_examples_exist():
    assert any(path.endswith("jax_train.py") for path in EXAMPLES), EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    missing = [name for name in imported_packages(path) if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{os.path.basename(path)} needs {missing}, not installed here")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run(
        [sys.executable, path], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, f"{path} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
