"""Examples are code: every Python block of README.md and docs/*.md runs, as
written, each in a fresh process and a fresh working directory, so the first
thing a user copies works.

A block right after the line ``<!-- loaderx 1.7.7 -->`` is code for the
original loaderx 1.7.7 (docs/migrating.md: what a user did there): it runs in
1.7.7's own interpreter (tests/_lx177.py; skipped without it), in the working
directory of the next block, just before it, so that block reads what the
real 1.7.7 wrote."""
from __future__ import annotations

import os
import re

import pytest

from _user_code import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(ROOT, "docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


MARKER_177 = "<!-- loaderx 1.7.7 -->"


def blocks():
    for path in DOCS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        setup = None
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            if text[:match.start()].rstrip().endswith(MARKER_177):
                assert setup is None, f"{path}:{line}: two loaderx 1.7.7 blocks in a row"
                setup = match.group(1)  # runs in 1.7.7, before the next block
                continue
            yield pytest.param(path, match.group(1), setup,
                               id=f"{os.path.relpath(path, ROOT)}:{line}")
            setup = None
        assert setup is None, f"{path}: a loaderx 1.7.7 block with no block after it"


@pytest.fixture(scope="module")
def local_s3():
    """A local S3 server (moto) for the blocks that read or write a bucket:
    the environment a user sets for one (docs/remote.md), with the buckets
    the docs name (``my-public-bucket`` allows anonymous reads)."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    import json

    from _servers import MotoS3

    server = MotoS3("my-bucket")
    client = server.client()
    client.create_bucket(Bucket="my-public-bucket")
    client.put_bucket_policy(Bucket="my-public-bucket", Policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": "*", "Action": "s3:*",
            "Resource": "arn:aws:s3:::my-public-bucket/*"}]}))
    yield server.env
    server.stop()


@pytest.mark.parametrize("path, code, setup", list(blocks()))
def test_python_block_runs(tmp_path, path, code, setup, request):
    env = request.getfixturevalue("local_s3") if "s3://" in code or "AWS_" in code else None
    if setup is not None:
        from _lx177 import run177

        run177(setup, tmp_path)
    run_python(os.path.relpath(path, ROOT), code, ["-c", code], tmp_path, env)


def test_every_doc_has_its_blocks_found():
    assert len(list(blocks())) >= 5
