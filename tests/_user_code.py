"""Running user-facing code as a user would: a fresh process, a temporary
working directory, the repository on ``PYTHONPATH``. Code that imports a
package this environment lacks is skipped, naming the package (the test extra
installs every one the examples and docs use; a wheel tested in a bare venv
has none of them)."""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def run_python(name, source, args, cwd, extra_env=None):
    """Run ``python *args`` unless `source` imports a missing package;
    `extra_env` is added to the environment."""
    packages = imported_packages(source, name)
    missing = [pkg for pkg in packages if importlib.util.find_spec(pkg) is None]
    if missing:
        pytest.skip(f"{name} needs {missing}, not installed here")
    # A remote dataset's node-local cache goes where the block runs, not to
    # the user's ~/.cache/loaderx (unless the block's own env says where).
    env = dict(os.environ, LOADERX_CACHE_DIR=os.path.join(str(cwd), "loaderx-cache"))
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"{name} exited {result.returncode}:\n{output}"
