"""Examples are code: every Python block of README.md and docs/*.md runs, as
written, each in a fresh process and a fresh working directory, so the first
thing a user copies works."""
from __future__ import annotations

import os
import re

import pytest

from _user_code import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(ROOT, "docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks():
    for path in DOCS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for k, match in enumerate(BLOCK.finditer(text)):
            line = text.count("\n", 0, match.start()) + 2
            yield pytest.param(path, match.group(1), id=f"{os.path.relpath(path, ROOT)}:{line}")


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


@pytest.mark.parametrize("path, code", list(blocks()))
def test_python_block_runs(tmp_path, path, code, request):
    env = request.getfixturevalue("local_s3") if "s3://" in code or "AWS_" in code else None
    run_python(os.path.relpath(path, ROOT), code, ["-c", code], tmp_path, env)


def test_every_doc_has_its_blocks_found():
    assert len(list(blocks())) >= 5
