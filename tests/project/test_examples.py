"""Every script in examples/ runs as a user would run it: ``python
examples/NAME.py`` in a fresh process (working directory: a temporary one),
and must exit 0 within the timeout. A script that imports a package this
environment lacks is skipped, naming the package (the test extra installs
every one they use). The Python blocks of README.md and docs/*.md run in
tests/project/test_docs.py.
"""

from __future__ import annotations

import glob
import os

import pytest

from _user_code import REPO, run_python

EXAMPLES = sorted(glob.glob(os.path.join(REPO, "examples", "*.py")))


def test_examples_exist():
    names = {os.path.basename(p) for p in EXAMPLES}
    assert {"jax_train.py", "pretrain_tokens.py"} <= names, names


@pytest.mark.parametrize("path", EXAMPLES, ids=[os.path.basename(p) for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    run_python(os.path.basename(path), source, [path], tmp_path)
