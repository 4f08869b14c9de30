"""The remote tests' shared data: a dataset (``data``: 400 dense records of
3,000 B and 400 ragged ones), its local directory (``local_ds``: a raw and a
zstd dense column, the zstd one in two shards, a ragged column) and its copy
on the session's S3 server (``url``), each made once per session; the tests
only read them. The servers (``s3``, the fault proxy ``proxy``) are the
suite's: tests/conftest.py. The constants and helpers the files share are in
_remote_helpers.py.

Tiers: each file whose tests run servers or child processes says
``pytestmark = pytest.mark.slow``; test_remote_units.py (no server, no
subprocess) is in the fast tier."""
from __future__ import annotations

import numpy as np
import pytest

import loaderx

from _remote_helpers import N, REC


@pytest.fixture(scope="session")
def data():
    rng = np.random.default_rng(7)
    dense = rng.integers(0, 256, size=(N, REC), dtype=np.uint8)
    ragged = [rng.integers(0, 1000, size=int(rng.integers(0, 60)), dtype=np.int32)
              for _ in range(N)]
    return dense, ragged


@pytest.fixture(scope="session")
def local_ds(tmp_path_factory, data):
    """A local dataset directory: a raw dense column, a zstd dense column in
    two shards, a ragged column (the converter's layout)."""
    dense, ragged = data
    root = str(tmp_path_factory.mktemp("ds") / "ds")
    loaderx.convert({"raw": dense, "z": dense.reshape(N, 30, 100)}, root, codec="raw",
                    progress="off")
    # Add a zstd column split into two shards and a ragged one by hand.
    man = loaderx.dataset.read_manifest(root)
    half = N // 2
    gen = man.get("generation", ".")  # the generation directory (manifest version 2)
    for k, part in enumerate((dense[:half], dense[half:])):
        loaderx.from_numpy(f"{root}/{gen}/zz/part-{k:05d}", part, codec="zstd").close()
    loaderx.from_iterator(f"{root}/{gen}/rag/part-00000", ragged).close()
    pre = "" if gen == "." else f"{gen}/"
    man["columns"]["zz"] = {"kind": "dense", "dtype": "uint8", "item_shape": [REC], "codec": "zstd",
                            "shards": [{"path": f"{pre}zz/part-{k:05d}", "rows": half}
                                       for k in (0, 1)]}
    man["columns"]["rag"] = {"kind": "ragged", "dtype": "int32", "item_shape": None,
                             "codec": "zstd", "shards": [{"path": f"{pre}rag/part-00000",
                                                          "rows": N}]}
    import json
    with open(f"{root}/loaderx.json", "w") as f:
        json.dump(man, f)
    return root


@pytest.fixture(scope="session")
def url(s3, local_ds):
    return s3.upload_dir(local_ds, "datasets/ds")
