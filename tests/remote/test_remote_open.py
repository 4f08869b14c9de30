"""Opening remote datasets and stores (loaderx.remote) on loopback servers:
an s3:// dataset reads byte for byte as its local copy, https://, gs:// and
az:// through their own clients, stores refuse mutations, a store replaced
on the server keeps the version opened, and the settings errors (plain
http, no credentials) name what to set."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402
from loaderx import remote  # noqa: E402
from loaderx.errors import (  # noqa: E402
    ReadOnlyError,
    RemoteChangedError,
    RemoteIOError,
    RemoteNotFoundError,
    RemotePermissionError,
)

from _helpers import assert_same  # noqa: E402
from _remote_helpers import N, RAW, REC, ZZ, opened  # noqa: E402
from _servers import range_server  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_dataset_uploaded_by_any_tool_reads_byte_for_byte_as_the_local_copy(
        tmp_path, s3, url, local_ds, data):
    dense, ragged = data
    ds = opened(url, tmp_path / "cache", s3)
    local = loaderx.open_dataset(local_ds)
    try:
        assert list(ds) == list(local)
        idx = np.array([5, N - 1, 0, 5, 200, 199])
        for name in ("raw", "z", "zz"):
            assert_same(ds[name][idx], local[name][idx])
            col = ds[name]
            assert (col.shards[0] if name == "zz" else col).path.startswith("s3://")
        got = ds["rag"][idx]
        for g, i in zip(got, idx):
            assert_same(g, ragged[i])
        values, splits = ds["rag"].gather(idx, packed=True)
        assert_same(values, np.concatenate([ragged[i] for i in idx]))
        assert_same(splits, np.cumsum([0] + [len(ragged[i]) for i in idx]))
        assert_same(ds["raw"][:], dense)
        assert repr(ds["raw"]).startswith("DenseStore('s3://")
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


def test_remote_stores_refuse_every_mutation_naming_the_url(tmp_path, s3, url):
    store = loaderx.open_store(f"{url}/{RAW}", cache_dir=str(tmp_path),
                               storage_options=s3.options())
    try:
        with pytest.raises(ReadOnlyError, match="s3://.*read-only"):
            store.append(np.zeros((1, REC), np.uint8))
        with pytest.raises(ReadOnlyError):
            store.delete([0])
    finally:
        store.close()
    with pytest.raises(ReadOnlyError, match="cannot be created"):
        loaderx.DenseStore(f"{url}/new", np.uint8, (3,))


def test_an_https_style_server_serves_a_dataset(tmp_path, local_ds, data):
    dense, ragged = data
    server, base = range_server(os.path.dirname(local_ds))
    try:
        ds = loaderx.open_dataset(f"{base}/ds", cache_dir=str(tmp_path / "c"))
        idx = [3, 1, 399]
        assert_same(ds["z"][idx], dense.reshape(N, 30, 100)[idx])
        for g, i in zip(ds["rag"][idx], idx):
            assert_same(g, ragged[i])
        for s in ds.values():
            s.close()
    finally:
        server.shutdown()


def test_gcs_and_azure_urls_read_a_dataset_through_their_own_clients(tmp_path, local_ds, data):
    """gs:// and az:// go through obstore's Google and Azure clients (their
    request paths and signing), pointed at a loopback server by their own
    settings: a service account's gcs_base_url, an Azure endpoint."""
    import base64
    import json

    dense, ragged = data
    root = tmp_path / "served"
    shutil.copytree(local_ds, root / "bkt" / "some" / "ds")
    server, base = range_server(str(root))
    gcs_key = json.dumps({"disable_oauth": True, "client_email": "", "private_key": "",
                          "private_key_id": "", "gcs_base_url": base})
    setups = {
        "gs://bkt/some/ds": {"google_service_account_key": gcs_key, "allow_http": True},
        "az://bkt/some/ds": {"azure_storage_account_name": "devaccount",
                             "azure_storage_account_key": base64.b64encode(b"k" * 32).decode(),
                             "azure_storage_endpoint": base, "allow_http": True},
    }
    try:
        for k, (url, opts) in enumerate(setups.items()):
            ds = loaderx.open_dataset(url, cache_dir=str(tmp_path / f"c{k}"), storage_options=opts)
            idx = [7, 0, 399, 7]
            assert_same(ds["zz"][idx], dense[idx])
            for g, i in zip(ds["rag"][idx], idx):
                assert_same(g, ragged[i])
            for s in ds.values():
                s.close()
            missing = f"{url}-missing"
            with pytest.raises(RemoteNotFoundError, match=re.escape(missing)) as e:
                loaderx.open_dataset(missing, cache_dir=str(tmp_path / "c"), storage_options=opts)
            assert isinstance(e.value, FileNotFoundError)
            with loaderx.open_store(f"{url}/{ZZ}0", cache_dir=str(tmp_path / "c"),
                                    storage_options=opts) as store:
                with pytest.raises(ReadOnlyError, match=re.escape(url) + ".*read-only"):
                    store.append(dense[:1])
    finally:
        server.shutdown()


def test_a_store_replaced_on_the_server_keeps_its_cached_version_or_raises(tmp_path, s3, data):
    dense, _ = data
    local = tmp_path / "v1"
    loaderx.from_numpy(str(local), dense, codec="raw").close()
    url = s3.upload_dir(str(local), "replaced/s")
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"), storage_options=s3.options())
    assert_same(store[[0, 1]], dense[[0, 1]])
    # Replace the store (a new version of every object) while it is open.
    loaderx.from_numpy(str(tmp_path / "v2"), np.zeros_like(dense), codec="raw").close()
    s3.upload_dir(str(tmp_path / "v2"), "replaced/s")
    assert_same(store[[0, 1]], dense[[0, 1]])  # cached: the version it opened
    with pytest.raises(RemoteChangedError, match="changed on the server"):
        store[[50]]
    store.close()
    # Reopened: the new version, from a new replica.
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"), storage_options=s3.options())
    assert not store[[0, 50]].any()
    store.close()


def test_url_paths_everywhere(tmp_path, s3, url, data):
    dense, _ = data
    opts = s3.options()
    shards = loaderx.ShardSet([f"{url}/{ZZ}0", f"{url}/{ZZ}1"],
                              cache_dir=str(tmp_path), storage_options=opts)
    assert shards.is_remote and len(shards) == N
    assert shards.prefetch_warm([0, N - 1]) is False  # nothing fetched yet
    assert_same(shards[[0, N - 1]], dense[[0, N - 1]])
    assert shards.prefetch_warm([0, N - 1]) is True and shards.prefetch_warm([1]) is False
    shards.close()
    remote.configure(cache_dir=str(tmp_path / "default"), storage_options=opts)
    try:
        store = loaderx.DenseStore(f"{url}/{RAW}")
        assert_same(store[[4]], dense[[4]])
        assert str(tmp_path / "default") in store._remote.local_dir
        store.close()
    finally:
        remote._DEFAULTS.clear()
    man = loaderx.dataset.read_manifest(url, storage_options=opts)
    assert man["rows"] == N
    with pytest.raises(loaderx.NotAStoreError, match="single store"):
        loaderx.dataset.read_manifest(f"{url}/{RAW}", storage_options=opts)


@pytest.fixture
def bare_aws_env(monkeypatch, tmp_path):
    """An environment with no AWS setting at all (no credentials, profile or
    config files: HOME is empty), and fresh clients before and after."""
    from loaderx import _objstore

    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    _objstore._forget_clients()
    yield monkeypatch
    _objstore._forget_clients()


def test_a_plain_http_endpoint_without_allow_http_names_the_setting(tmp_path, s3, url,
                                                                    bare_aws_env):
    """AWS_ENDPOINT_URL=http://... without AWS_ALLOW_HTTP: the client refuses
    the scheme ("builder error"); the error says which setting allows it,
    at once (never retried)."""
    bare_aws_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    opts = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
    t = time.monotonic()
    with pytest.raises(RemoteIOError, match=r"plain http://.*AWS_ALLOW_HTTP=true.*allow_http") \
            as e:
        loaderx.open_dataset(url, cache_dir=str(tmp_path), storage_options=opts)
    assert str(e.value).startswith(url) and time.monotonic() - t < 5
    bare_aws_env.setenv("AWS_ALLOW_HTTP", "true")  # the setting it names: then it reads
    from loaderx import _objstore
    _objstore._forget_clients()
    ds = loaderx.open_dataset(url, cache_dir=str(tmp_path), storage_options=opts)
    assert len(ds["raw"]) == N
    for col in ds.values():
        col.close()


def test_no_credentials_anywhere_is_a_permission_error_naming_where_they_go(tmp_path, s3, url,
                                                                            bare_aws_env):
    """No keys, no profile, and a metadata service that gives none (here a
    server on loopback that answers every request with an error, standing
    in for 169.254.169.254): `RemotePermissionError`, naming the variables
    and the profile files, without the retries of a transient fault."""
    os.makedirs(tmp_path / "empty")
    server, metadata = range_server(str(tmp_path / "empty"))
    bare_aws_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    bare_aws_env.setenv("AWS_ALLOW_HTTP", "true")
    bare_aws_env.setenv("AWS_METADATA_ENDPOINT", metadata)
    try:
        t = time.monotonic()
        with pytest.raises(RemotePermissionError, match="no credentials found") as e:
            loaderx.open_store(f"{url}/{RAW}", cache_dir=str(tmp_path),
                               storage_options={"region": "us-east-1"})
        assert time.monotonic() - t < 30
    finally:
        server.shutdown()
    text = str(e.value)
    assert text.startswith(f"{url}/{RAW}")
    for named in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                  "~/.aws/credentials", "storage_options"):
        assert named in text, named
    assert isinstance(e.value, PermissionError)


def test_a_failed_open_leaves_no_request_to_abort_the_interpreter_at_exit(s3, tmp_path):
    """Opening a missing dataset raised while sibling requests were still in
    flight; one that finished during interpreter finalisation made obstore's
    runtime thread take the GIL there, and the process died of SIGABRT after
    the script's last line (about 1 run in 4 before the fix)."""
    import json

    code = ("import json, sys, loaderx\n"
            "try:\n"
            "    loaderx.open_dataset('s3://loaderx-test/no-such-dataset', cache_dir=sys.argv[2],"
            " storage_options=json.loads(sys.argv[1]))\n"
            "except FileNotFoundError:\n"
            "    pass\n")
    for run in range(15):
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(s3.options()),
                               str(tmp_path / f"c{run}")], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, (run, proc.returncode, proc.stderr[-2000:])
