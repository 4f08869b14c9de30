"""Every script in examples/ runs as a user would run it: ``python
examples/NAME.py`` in a fresh process (working directory: a temporary one),
and must exit 0 within the timeout. A script that imports a package this
environment lacks is skipped, naming the package (the test extra installs
every one they use). The Python blocks of README.md and docs/*.md run in
tests/test_docs.py.
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


def imported_packages(source, name):
    """The top-level package of every import statement in the source, except
    those guarded by ``try: ... except ImportError`` (optional ones)."""
    names = set()
    pending = [ast.parse(source, name)]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Try) and _catches_import_error(node):
            pending.extend(node.orelse + node.finalbody)
            continue
        pending.extend(ast.iter_child_nodes(node))
    return sorted(names)


def _catches_import_error(node):
    caught = [ast.unparse(handler.type) for handler in node.handlers if handler.type is not None]
    return any(name in text for text in caught for name in ("ImportError", "ModuleNotFoundError"))


def test_examples_exist():
    names = {os.path.basename(p) for p in EXAMPLES}
    assert {"jax_train.py", "pretrain_tokens.py"} <= names, names


def run_python(name, source, args, cwd):
    """Run ``python *args`` unless `source` imports a missing package."""
    packages = imported_packages(source, name)
    missing = [pkg for pkg in packages if importlib.util.find_spec(pkg) is None]
    if missing:
        pytest.skip(f"{name} needs {missing}, not installed here")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"{name} exited {result.returncode}:\n{output}"


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    run_python(os.path.basename(path), source, [path], tmp_path)
