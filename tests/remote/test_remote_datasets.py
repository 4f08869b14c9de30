"""Remote datasets as the rest of loaderx uses them: the DataLoader and its
native ring, token windows, select and subsets, convert and uploads to a URL
(publish, append, races, multipart sizes), the command line, and a walk of
every public callable and command that takes a path, given an s3:// URL."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402
from loaderx import remote  # noqa: E402
from loaderx.errors import (  # noqa: E402
    ReadOnlyError,
)

from _helpers import assert_same, path_callables  # noqa: E402
from _remote_helpers import N, RAW, _env, opened  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_loader_reads_a_remote_dataset_as_the_local_copy_and_resumes_across(
        tmp_path, s3, url, local_ds):
    ds = opened(url, tmp_path / "cache", s3, columns=["raw", "rag"])
    local = loaderx.open_dataset(local_ds, columns=["raw", "rag"])
    try:
        a = loaderx.DataLoader(ds, batch_size=16, seed=3, workers=2)
        b = loaderx.DataLoader(local, batch_size=16, seed=3, workers=2)
        for _ in range(3):
            x, y = next(a), next(b)
            assert_same(x["raw"], y["raw"])
            assert all(np.array_equal(p, q) for p, q in zip(x["rag"], y["rag"]))
        state = a.state_dict()
        a.close()
        b.close()
        # A state from the remote run resumes on the local copy, and back.
        c = loaderx.DataLoader(local, batch_size=16, seed=3, workers=2)
        c.load_state_dict(state)
        d = loaderx.DataLoader(ds, batch_size=16, seed=3, workers=2)
        d.load_state_dict(c.state_dict())
        assert_same(next(c)["raw"], next(d)["raw"])
        c.close()
        d.close()
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


def test_the_native_ring_reads_remote_streams_and_views_only_after_their_prefetch(
        tmp_path, s3, url, local_ds, monkeypatch):
    # The ring reads a remote store's cache replica natively: holes read as
    # zeros, so every step must be fetched before it is built. The ring
    # stages its steps itself (lx_loader_stage): a view's indices are mapped
    # to the base's records natively, and Python only fetches the plans'
    # byte ranges, on the loaderx-stage thread, never per step otherwise.
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"])
    local = loaderx.open_dataset(local_ds, columns=["raw"])
    rows = np.arange(3, len(local["raw"]), 7)
    pins, fetches = [], []
    begin, fetch = remote.Binding.begin, remote.Binding._fetch

    def counted(self, indices, pin=False):
        if pin:
            pins.append(len(indices))
        return begin(self, indices, pin)

    def counted_fetch(self, f):
        fetches.append(threading.current_thread().name)
        return fetch(self, f)
    monkeypatch.setattr(remote.Binding, "begin", counted)
    monkeypatch.setattr(remote.Binding, "_fetch", counted_fetch)
    try:
        for remote_streams, local_streams in (
                (ds, local), (loaderx.select(ds, rows), loaderx.select(local, rows))):
            a = loaderx.DataLoader(remote_streams, batch_size=16, seed=5, workers=2)
            b = loaderx.DataLoader(local_streams, batch_size=16, seed=5, workers=2)
            pins.clear()
            fetches.clear()
            steps = 2 * len(rows) // 16 + 3  # more than a cycle of the view
            batches = []
            for _ in range(steps):
                x, y = next(a), next(b)
                assert_same(x["raw"], y["raw"])
                batches.append(x["raw"].copy())
            # Native: no Python worker threads read these streams, and no
            # Python prefetch runs per step.
            names = {t.name for t in threading.enumerate()}
            assert not [n for n in names if n.startswith(("loaderx-worker", "loaderx-prefetch"))]
            assert "loaderx-stage" in names
            a.close()
            b.close()
            assert not pins
            assert fetches and set(fetches) == {"loaderx-stage"}
            assert len(fetches) <= steps + a.prefetch + a.workers
            # The same steps again: their records are cached (a view's rows
            # map to its base's records in the cache), so only the steps the
            # ring stages beyond them may fetch.
            fetches.clear()
            with loaderx.DataLoader(remote_streams, batch_size=16, seed=5, workers=2) as again:
                for want in batches:
                    assert_same(next(again)["raw"], want)
            assert len(fetches) <= again.prefetch + again.workers < steps
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


def test_token_windows_over_a_remote_corpus_read_as_over_the_local_one(tmp_path, s3, data):
    _, ragged = data
    docs = [np.abs(r).astype(np.uint16) for r in ragged]
    loaderx.from_iterator(str(tmp_path / "tok"), docs).close()
    url = s3.upload_dir(str(tmp_path / "tok"), "tokens/s")
    local = loaderx.TokenWindows(loaderx.RaggedStore(str(tmp_path / "tok")), 64, separator=0)
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"), storage_options=s3.options())
    tw = loaderx.TokenWindows(store, 64, separator=0)
    assert tw.is_remote and len(tw) == len(local)
    idx = np.array([0, len(tw) - 1, 17, 3])
    assert tw.prefetch_warm(idx[:2]) is False and local.prefetch_warm(idx[:2]) is False
    tw.prefetch(idx[:2])
    assert tw.prefetch_warm(idx[:2]) is True
    assert_same(tw[idx], local[idx])
    assert_same(tw.segments[idx], local.segments[idx])
    store.close()


def test_select_and_scalar_columns_of_a_remote_dataset_read_fetched_checked_records(
        tmp_path, s3, monkeypatch):
    """A predicate over a remote column reads its records through the cache
    (a replica's holes are not empty strings or zeros), by a dataset, its
    URL, or the command line."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 1000
    x = np.arange(n, dtype=np.int64)
    pq.write_table(pa.table({"t": [f"t{i % 10}" for i in range(n)], "x": x}),
                   tmp_path / "t.parquet")
    loaderx.convert(str(tmp_path / "t.parquet"), str(tmp_path / "local"), progress="off")
    url = s3.upload_dir(str(tmp_path / "local"), "typed/ds")
    ds = opened(url, tmp_path / "cache", s3)
    try:
        assert_same(loaderx.select(ds, "t = 't5'")["x"].rows, x[5::10])
        assert len(loaderx.select(ds, "t = ''")["x"]) == 0
        assert_same(loaderx.select(ds, "x >= 990 AND t <> 't9'")["x"].rows, x[990:999])
        whole = ds["x"].as_array()
        assert_same(whole, x)
        assert not whole.flags.writeable
    finally:
        for col in ds.values():
            col.close()
    remote.configure(cache_dir=str(tmp_path / "cache2"), storage_options=s3.options())
    try:
        views = loaderx.select(url, "t = 't5'")
        assert_same(views["x"].rows, x[5::10])
        assert views["x"].selection.source == url  # (re-selected from there when unpickled)
        for v in views.values():
            v.close()
    finally:
        remote._DEFAULTS.clear()
    env = dict(_env(), **s3.env, LOADERX_CACHE_DIR=str(tmp_path / "cache3"))
    out = subprocess.run([sys.executable, "-m", "loaderx", "select", url, "t = 't5'", "--count"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "100", out.stderr


def test_a_subset_checkpoint_taken_on_s3_resumes_on_a_local_copy(tmp_path, s3, url, local_ds):
    """A subset's fingerprint names the records, not where they are: a state
    taken over the dataset at its s3:// URL resumes on the local directory
    its files came from, and on a local copy converted from the URL."""
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=s3.options())
    try:
        mask = np.arange(N) % 3 == 0
        view = loaderx.select(url, mask)["raw"]
        with loaderx.DataLoader({"raw": view}, 8, seed=1) as loader:
            next(loader)
            state = loader.state_dict()
            expected = next(loader)["raw"]
        view.close()
        loaderx.convert(url, str(tmp_path / "converted"), progress="off")
    finally:
        remote._DEFAULTS.clear()
    for where in (local_ds, str(tmp_path / "converted")):
        local = loaderx.select(where, mask)["raw"]
        assert local.fingerprint == state["fingerprints"]["raw"], where
        with loaderx.DataLoader({"raw": local}, 8, seed=1) as loader:
            loader.load_state_dict(state)
            assert_same(next(loader)["raw"], expected)
        local.close()


def test_convert_to_a_url_uploads_then_publishes_and_never_writes_a_local_s3_folder(
        tmp_path, s3, data, monkeypatch):
    dense, _ = data
    monkeypatch.chdir(tmp_path)
    opts = s3.options()
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=opts)
    try:
        url = f"s3://{s3.bucket}/written/ds"
        ds = loaderx.convert({"x": dense[:100], "y": np.arange(100, dtype=np.int64)}, url,
                             progress="off")
        assert not os.path.exists(tmp_path / "s3:")
        assert_same(ds["x"][[0, 99]], dense[[0, 99]])
        for s in ds.values():
            s.close()
        with pytest.raises(loaderx.dataset.DestinationExistsError, match="already exists"):
            loaderx.convert({"x": dense[:10], "y": np.arange(10, dtype=np.int64)}, url,
                            progress="off")
        # Append adds shards and a new manifest (a conditional put).
        ds = loaderx.convert({"x": dense[100:150], "y": np.arange(100, 150, dtype=np.int64)}, url,
                             mode="append", progress="off")
        assert len(ds["x"]) == 150
        assert_same(ds["y"][:], np.arange(150, dtype=np.int64))
        assert_same(ds["x"][[120]], dense[[120]])
        for s in ds.values():
            s.close()
        with pytest.raises(loaderx.IdentityError, match="dtype"):
            loaderx.convert({"x": dense[:5].astype(np.int16), "y": np.arange(5)}, url,
                            mode="append", progress="off")
        # Overwrite: the new dataset, the old stores deleted after it is published.
        before = {o["Key"] for o in s3.client().list_objects_v2(
            Bucket=s3.bucket, Prefix="written/ds/")["Contents"]}
        ds = loaderx.convert({"x": dense[:7], "y": np.arange(7, dtype=np.int64)}, url,
                             mode="overwrite", progress="off")
        assert len(ds["x"]) == 7
        for s in ds.values():
            s.close()
        after = {o["Key"] for o in s3.client().list_objects_v2(
            Bucket=s3.bucket, Prefix="written/ds/")["Contents"]}
        assert not (before & after) - {"written/ds/loaderx.json"}
        # A single store.
        st = loaderx.from_numpy(f"s3://{s3.bucket}/written/one", dense[:20])
        assert st.is_remote and st.path == f"s3://{s3.bucket}/written/one"
        assert_same(st[:], dense[:20])
        st.close()
        rg = loaderx.from_iterator(f"s3://{s3.bucket}/written/rag", [np.arange(3), np.arange(5)])
        assert_same(rg[1], np.arange(5))
        rg.close()
        with pytest.raises(ReadOnlyError, match="append"):
            loaderx.from_numpy(f"s3://{s3.bucket}/written/one", dense[:2], mode="append")
        with pytest.raises(ReadOnlyError, match="read-only"):
            loaderx.convert({"x": dense[:2]}, "https://example.com/ds", progress="off")
    finally:
        remote._DEFAULTS.clear()


def test_an_append_racing_another_writer_publishes_nothing(tmp_path, s3, data, monkeypatch):
    dense, _ = data
    opts = s3.options()
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=opts)
    try:
        url = f"s3://{s3.bucket}/raced/ds"
        loaderx.converters.convert_to_directory({"x": dense[:10]}, url, progress="off")
        real = remote.Target.publish

        def late(self, fresh):  # another writer appends first
            monkeypatch.setattr(remote.Target, "publish", real)
            loaderx.converters.convert_to_directory({"x": dense[10:12]}, url, mode="append",
                                                    progress="off")
            return real(self, fresh)
        monkeypatch.setattr(remote.Target, "publish", late)
        with pytest.raises(loaderx.LockedError, match="another writer"):
            loaderx.converters.convert_to_directory({"x": dense[20:25]}, url, mode="append",
                                                    progress="off")
        monkeypatch.setattr(remote.Target, "publish", real)
        man = loaderx.dataset.read_manifest(url, storage_options=opts)
        assert man["rows"] == 12  # the other writer's append, not ours
        keys = [o["Key"] for o in s3.client().list_objects_v2(
            Bucket=s3.bucket, Prefix="raced/ds/")["Contents"]]
        named = {f"raced/ds/{sh['path']}/{f}" for sh in man["columns"]["x"]["shards"]
                 for f in ("meta", "index", "data")}
        assert set(keys) - {"raced/ds/loaderx.json"} == named  # ours were deleted
    finally:
        remote._DEFAULTS.clear()


def test_uploads_use_parts_s3_takes_at_any_size(tmp_path, s3):
    from loaderx import _objstore

    mib, gib = 1 << 20, 1 << 30
    # obstore's default 5 MiB parts stop a file at 48.8 GiB (S3: 10,000 parts).
    for nbytes in (0, 1, 5 * mib, 48 * gib, 49 * gib, 156 * gib, 1 << 40, 5 << 40):
        part, in_flight = _objstore.part_plan(nbytes)
        assert part >= _objstore.PART_MIN and part % mib == 0
        assert -(-nbytes // part) < _objstore.PARTS_MAX
        assert 2 <= in_flight <= 12 and (in_flight == 2 or part * in_flight <= 256 * mib)
    # The plan reaches the server: 40 MiB go up in three 16 MiB parts (a
    # multipart object's ETag ends in its part count).
    path = tmp_path / "big"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 40 * mib, np.uint8).tobytes())
    url = f"s3://{s3.bucket}/parts/big"
    _objstore.put(url, _objstore.Options(s3.options()), str(path))
    head = s3.client().head_object(Bucket=s3.bucket, Key="parts/big")
    assert head["ContentLength"] == 40 * mib and head["ETag"].strip('"').endswith("-3")


def test_the_cli_takes_urls(tmp_path, s3, url, data):
    dense, _ = data
    env = dict(_env(), **s3.env, LOADERX_CACHE_DIR=str(tmp_path / "cache"))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "loaderx", *args], env=env,
                              capture_output=True, text=True, timeout=120)
    out = cli("info", url, "--json")
    assert out.returncode == 0, out.stderr
    import json
    report = json.loads(out.stdout)
    assert report["path"] == url and report["rows"] == N
    out = cli("verify", url)
    assert out.returncode == 0 and "ok:" in out.stdout, out.stderr
    np.save(tmp_path / "x.npy", dense[:30])
    dst = f"s3://{s3.bucket}/cli/ds"
    out = cli("convert", str(tmp_path / "x.npy"), dst, "-q")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "s3:").exists()
    out = cli("convert", str(tmp_path / "x.npy"), dst, "-q")
    assert out.returncode == 1 and "--append or --overwrite" in out.stderr
    out = cli("info", f"s3://{s3.bucket}/no/such")
    assert out.returncode == 1 and "s3://" in out.stderr


# ---------------------------------------------------------------- every path takes a URL (issue 38)

def _walk_calls(c) -> dict:
    """``{(callable, parameter): (how the walk calls it with an s3:// URL, what
    it must do: "works", "refused", or a reason it is not called here)}``."""
    lx = loaderx
    new = c["new"]
    return {
        ("loaderx.zrecord.open_store", "path"): (lambda: lx.open_store(c["dense"]), "works"),
        ("loaderx.dataset.open_dataset", "path"): (lambda: lx.open_dataset(c["ds"]), "works"),
        ("loaderx._manifest.read_manifest", "path"): (lambda: lx.dataset.read_manifest(c["ds"]),
                                                      "works"),
        ("loaderx.dataset.labels", "dataset"): (lambda: lx.labels(c["ds"], "raw"), "works"),
        ("loaderx.subset.select", "dataset"): (lambda: lx.select(c["ds"], np.arange(N) < 9),
                                               "works"),
        ("loaderx.converters.convert", "source"): (
            lambda: lx.convert(c["ds"], c["tmp"] / "from-url", progress="off"), "works"),
        ("loaderx.converters.convert", "dest"): (
            lambda: lx.convert({"x": np.arange(5)}, new(), progress="off"), "works"),
        ("loaderx.converters.convert_to_directory", "source"): (
            lambda: lx.converters.convert_to_directory(c["dense"], c["tmp"] / "one-store",
                                                       progress="off"), "works"),
        ("loaderx.converters.convert_to_directory", "dest"): (
            lambda: lx.converters.convert_to_directory({"x": np.arange(5)}, new(),
                                                       progress="off"), "works"),
        ("loaderx.converters.open_source", "source"): (
            lambda: lx.converters.open_source(c["ds"], __import__(
                "loaderx.converters._source", fromlist=["Options"]).Options()), "works"),
        ("loaderx.dataset.from_numpy", "path"): (lambda: lx.from_numpy(new(), np.arange(4)),
                                                 "works"),
        ("loaderx.dataset.from_iterator", "path"): (
            lambda: lx.from_iterator(new(), [np.arange(3)]), "works"),
        ("loaderx.dataset.write_dataset", "path"): (
            lambda: lx.dataset.write_dataset(new(), np.arange(4)), "works"),
        ("loaderx.bytestore.Zrecord", "path"): (lambda: lx.Zrecord(c["bytes"]), "works"),
        ("loaderx.bytestore.Zrecord.create", "path"): (lambda: lx.Zrecord.create(new()),
                                                       "refused"),
        ("loaderx.dense.DenseStore", "path"): (lambda: lx.DenseStore(c["dense"]),
                                                        "works"),
        ("loaderx.dense.DenseStore.create", "path"): (
            lambda: lx.DenseStore.create(new(), np.uint8, (3,)), "refused"),
        ("loaderx._store.Store.open", "path"): (lambda: lx.RaggedStore.open(c["ragged"]),
                                                "works"),
        ("loaderx.ragged.RaggedStore", "path"): (lambda: lx.RaggedStore(c["ragged"]),
                                                          "works"),
        ("loaderx.ragged.RaggedStore.create", "path"): (
            lambda: lx.RaggedStore.create(new(), np.int32), "refused"),
        ("loaderx.shardset.ShardSet", "shards"): (
            lambda: lx.ShardSet([c["dense"], c["dense"]]), "works"),
        ("loaderx.tokens.TokenWindows", "store"): (
            lambda: lx.TokenWindows(c["ragged"], 8), "refused"),  # a path: open it first
        ("loaderx.mixture.Mixture", "sources"): (
            lambda: lx.Mixture({"a": {"x": c["dense"]}}, {"a": 1}), "refused"),
        ("loaderx.dataloader.DataLoader", "streams"): (
            lambda: lx.DataLoader({"x": c["dense"]}, 4), "refused"),
        ("loaderx.dictionary.train_dict", "source"): (
            lambda: lx.train_dict(lx.open_store(c["ragged"]), "fast"), "works"),
        ("loaderx.dictionary.train_dict", "path"): (
            lambda: lx.train_dict([b"x" * 64] * 16, path=new()), "refused"),
        ("loaderx.legacy.Dataset", "path"): (lambda: lx.Dataset(c["dense"]), "works"),
        ("loaderx.legacy.PackedDataset", "path"): (
            lambda: lx.dataset.Dataset(c["ragged"]), "works"),
        ("loaderx.subset.Selection", "dataset"): (None, "a description for people, never opened"),
        ("loaderx.subset.Selection", "source"): (
            None, "the dataset a selection came from, as select recorded it (select takes URLs)"),
        ("loaderx.ray.write_dataset", "dest"): (
            None, "starts Ray: tests/test_ray.py writes to s3:// (moto) and reads it back"),
        ("loaderx.ray.read_dataset", "dest"): (
            None, "starts Ray: tests/test_ray.py reads what it wrote to s3:// back"),
    }


def _close(got) -> None:
    values = got.values() if isinstance(got, dict) else [got]
    for v in values:
        _close(v) if isinstance(v, dict) else getattr(v, "close", lambda: None)()


def _walked(fn, url_part: str) -> str:
    """What one call did: "works", or "refused" with an error that is
    loaderx's (or a TypeError) and names the URL; never a raw OS error or a
    URL taken for a local path (``<cwd>/s3:/...``)."""
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - judged below
        text = str(e)
        assert isinstance(e, (loaderx.LoaderxError, TypeError)), f"{type(e).__name__}: {text}"
        assert url_part in text, f"{type(e).__name__} does not name the URL: {text}"
        assert "s3:/" not in text.replace("s3://", ""), f"a URL taken for a path: {text}"
        return "refused"
    _close(got)
    return "works"


def test_every_public_path_takes_a_url_or_refuses_it_naming_it(tmp_path, s3, url):
    """Every public callable with a path parameter (found by signature in
    the public modules, so a new one must join the table) given an s3://
    URL: it works, or it refuses the URL with a loaderx error naming it."""
    from loaderx import _objstore

    bytes_dir = tmp_path / "bytes"
    with loaderx.Zrecord.create(str(bytes_dir)) as records:
        records.append([b"ab", b"", b"cde"])
    made = iter(range(1000))
    c = {"ds": url, "dense": f"{url}/{RAW}", "ragged": f"{url}/gen-000001/rag/part-00000",
         "bytes": s3.upload_dir(str(bytes_dir), "walk/bytes"), "tmp": tmp_path,
         "new": lambda: f"s3://{s3.bucket}/walk/new-{next(made)}"}
    calls = _walk_calls(c)
    missing = sorted(path_callables() - set(calls))
    assert not missing, f"path-taking callables the walk does not call: {missing}"
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=s3.options())
    try:
        done = {}
        for key, (fn, want) in calls.items():
            if fn is None:
                continue
            got = _walked(fn, "s3://")
            assert got == want, f"{key}: {got}, expected {want}"
            done[key] = got
        assert sum(1 for v in done.values() if v == "works") >= 20
        _adapters_read_urls(c)
    finally:
        remote._DEFAULTS.clear()
        _objstore._forget_clients()


def _adapters_read_urls(c) -> None:
    """The torch and JAX adapters over a dataset opened from its URL."""
    ds = loaderx.open_dataset(c["ds"], ["raw"])
    try:
        local = ds["raw"][:8]
        torch = pytest.importorskip("torch")
        import loaderx.torch as lxtorch

        adapter = lxtorch.IterableDataset(
            lambda rank, world: loaderx.DataLoader(ds, 8, mode="sequential",
                                                   shard=(rank, world)), rank=0, world=1)
        batch = next(iter(adapter))
        assert isinstance(batch["raw"], torch.Tensor)
        assert_same(batch["raw"].numpy(), local)
        adapter.close()
        jax = pytest.importorskip("jax")
        import loaderx.jax as lxjax

        sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]),
                                                                ("d",)),
                                              jax.sharding.PartitionSpec("d"))
        with loaderx.DataLoader(ds, 8, mode="sequential") as loader:
            got = next(lxjax.global_batches(loader, sharding))
        assert_same(np.asarray(got["raw"]), local)
    finally:
        ds["raw"].close()


def test_the_cli_takes_a_url_for_every_path_or_refuses_it_naming_it(tmp_path, s3, url, local_ds,
                                                                     capsys):
    """`loaderx info / verify / select / convert / compact / train-dict` with an
    s3:// URL for each path they take."""
    from loaderx import _objstore
    from loaderx.__main__ import main

    loaderx.convert({"x": np.arange(50)}, str(tmp_path / "scalar"), progress="off")
    scalar = s3.upload_dir(str(tmp_path / "scalar"), "cli-walk/scalar")
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=s3.options())
    store = f"{url}/{RAW}"
    runs = [
        (["info", url, "--json"], 0), (["info", store], 0), (["verify", store], 0),
        (["select", scalar, "x < 5", "--count"], 0),
        (["convert", url, str(tmp_path / "copy"), "-q"], 0),
        (["convert", store, f"s3://{s3.bucket}/cli-walk/one", "-q"], 0),
        (["compact", store], 1),  # a remote store is read-only
        (["train-dict", f"{url}/gen-000001/rag/part-00000", "-o", str(tmp_path / "d")], 0),
        (["train-dict", store, "-o", f"s3://{s3.bucket}/d"], 1),
        (["select", scalar, "x < 5", "--out", f"s3://{s3.bucket}/rows.npy"], 1),
    ]
    try:
        for argv, want in runs:
            capsys.readouterr()
            rc = main(argv)
            err = capsys.readouterr().err
            assert rc == want, (argv, err)
            if rc:
                assert "s3://" in err and "[Errno" not in err, (argv, err)
                assert "s3:/" not in err.replace("s3://", ""), (argv, err)
    finally:
        remote._DEFAULTS.clear()
        _objstore._forget_clients()
    copy = loaderx.open_dataset(str(tmp_path / "copy"))
    local = loaderx.open_dataset(local_ds)
    assert list(copy) == list(local) == ["raw", "z", "zz", "rag"]
    for name in copy:
        for got, want in zip(copy[name][[0, 7, N - 1]], local[name][[0, 7, N - 1]]):
            assert_same(got, want)
    for col in list(copy.values()) + list(local.values()):
        col.close()
