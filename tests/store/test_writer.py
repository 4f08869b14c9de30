"""One writer vocabulary (loaderx._writer) for every way of writing data:
``mode``, ``codec`` (with its dictionary), ``progress``; `convert` and
`convert_to_directory` share one signature, `from_numpy` and `from_iterator`
one implementation; old spellings warn."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

import loaderx
from loaderx.converters import convert_to_directory
from loaderx.errors import DestinationExistsError

ROWS = np.frombuffer(b'{"user": 12, "tags": ["a", "b"], "ok": true}  ' * 4000,
                     np.uint8).reshape(-1, 92)  # (convert stores rows under 64 B raw)
DOCS = [np.frombuffer(f'{{"id": {i}, "text": "document {i % 17}"}}'.encode(), np.uint8)
        for i in range(3000)]


def _writers(tmp_path):
    """Each writer as ``write(name, **options) -> something to close``."""
    return {
        "from_numpy": lambda name, **kw: loaderx.from_numpy(tmp_path / name, ROWS[:100], **kw),
        "from_iterator": lambda name, **kw: loaderx.from_iterator(tmp_path / name, DOCS[:100],
                                                                  **kw),
        "convert": lambda name, **kw: loaderx.convert({"x": ROWS[:100]}, tmp_path / name,
                                                      **kw)["x"],
    }


@pytest.mark.parametrize("writer", ["from_numpy", "from_iterator", "convert"])
def test_every_writer_follows_the_same_mode_words(tmp_path, writer):
    write = _writers(tmp_path)[writer]
    write("w", progress=False).close()
    with pytest.raises(DestinationExistsError, match='mode="append" or mode="overwrite"'):
        write("w", progress=False)
    got = write("w", mode="append", progress=False)
    assert len(got) == 200
    got.close()
    got = write("w", mode="overwrite", progress=False)
    assert len(got) == 100
    got.close()
    with pytest.raises(ValueError, match="mode must be one of"):
        write("v", mode="replace", progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    with pytest.raises(DestinationExistsError, match="refusing to overwrite"):
        write("other", mode="overwrite", progress=False)
    assert (tmp_path / "other" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("writer", ["from_numpy", "from_iterator", "convert"])
def test_an_overwrite_removes_only_what_loaderx_wrote(tmp_path, writer):
    """Before, an overwrite of a store or dataset removed everything in its
    directory: a user's notes beside it, a folder, a nested dataset."""
    write = _writers(tmp_path)[writer]
    write("w", progress=False).close()
    (tmp_path / "w" / "notes.txt").write_text("mine")
    (tmp_path / "w" / "mine").mkdir()
    before = sorted(os.listdir(tmp_path / "w"))
    with pytest.raises(DestinationExistsError, match=r"2 entries that are not .*'mine', "
                                                     r"'notes.txt'.*refusing to overwrite"):
        write("w", mode="overwrite", progress=False)
    assert sorted(os.listdir(tmp_path / "w")) == before
    assert (tmp_path / "w" / "notes.txt").read_text() == "mine"
    (tmp_path / "w" / "notes.txt").unlink()
    (tmp_path / "w" / "mine").rmdir()
    got = write("w", mode="overwrite", progress=False)
    assert len(got) == 100
    got.close()


@pytest.mark.parametrize("writer", ["from_numpy", "convert"])
def test_an_overwrite_never_replaces_a_store_a_writer_has_open(tmp_path, writer):
    """Before, the overwrite went ahead and the open writer's later appends
    were lost when it closed."""
    write = _writers(tmp_path)[writer]
    loaderx.from_numpy(tmp_path / "w", ROWS[:10]).close()
    with loaderx.DenseStore.create(tmp_path / "w", np.uint8, (92,), mode="append") as writer_:
        writer_.append(ROWS[10:13])
        with pytest.raises(loaderx.errors.LockedError, match="writer lock"):
            write("w", mode="overwrite", progress=False)
        writer_.append(ROWS[13:20])
    with loaderx.open_store(tmp_path / "w") as store:
        assert len(store) == 20


@pytest.mark.parametrize("writer", ["from_numpy", "from_iterator", "convert"])
def test_every_writer_takes_the_same_codecs(tmp_path, writer):
    write = _writers(tmp_path)[writer]
    with pytest.raises(ValueError, match=r"codec must be one of \('raw', 'zstd', 'zstd_dict'\)"):
        write("bad", codec="lz4", progress=False)
    with write("zd", codec="zstd_dict", dict_size=1024, progress=False) as s:
        # Trained by the writer itself; level 19 is zstd_dict's default.
        assert (s.codec, s.level) == ("zstd_dict", 19)
        assert 0 < len(s.dictionary()) <= 1024
        assert bytes(s[5]) == (ROWS[5].tobytes() if writer != "from_iterator"
                               else DOCS[5].tobytes())


@pytest.mark.parametrize("writer", ["from_numpy", "from_iterator", "convert"])
def test_progress_is_one_thing_for_every_writer(tmp_path, writer):
    write = _writers(tmp_path)[writer]
    calls = []
    write("p", progress=lambda done, total: calls.append((done, total))).close()
    assert calls and calls[-1] == (100, 100)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    for quiet in (False, "off", None):
        write(f"q{quiet}", progress=quiet).close()
    with pytest.raises(ValueError, match="or a callable"):
        write("bad", progress="loud")


def test_from_iterator_counts_records_without_a_length(tmp_path):
    calls = []
    loaderx.from_iterator(tmp_path / "g", (d for d in DOCS[:40]),
                          progress=lambda done, total: calls.append((done, total))).close()
    assert calls == [(40, None)]


def test_from_iterator_trains_on_its_first_records_and_writes_them_all(tmp_path):
    with loaderx.from_iterator(tmp_path / "r", iter(DOCS), codec="zstd_dict") as rs:
        assert rs.codec == "zstd_dict" and len(rs) == len(DOCS)
        assert [a.tobytes() for a in rs[[0, 1, 2999]]] == [DOCS[i].tobytes()
                                                           for i in (0, 1, 2999)]


def test_dict_true_is_deprecated_for_codec_zstd_dict(tmp_path):
    with pytest.warns(DeprecationWarning, match='codec="zstd_dict"') as caught:
        old = loaderx.convert({"x": ROWS}, tmp_path / "old", dict=True, progress=False)
    assert caught[0].filename == __file__  # it points at the caller's line
    new = loaderx.convert({"x": ROWS}, tmp_path / "new", codec="zstd_dict", progress=False)
    assert old["x"].codec == new["x"].codec == "zstd_dict"
    assert old["x"].dictionary() == new["x"].dictionary()
    old["x"].close()
    new["x"].close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling is silent
        loaderx.convert({"x": ROWS}, tmp_path / "plain", progress=False)["x"].close()


def test_the_cli_dict_flag_is_codec_zstd_dict(tmp_path):
    from loaderx.__main__ import main

    np.save(tmp_path / "x.npy", ROWS)
    assert main(["convert", str(tmp_path / "x.npy"), str(tmp_path / "a"), "--dict", "-q"]) == 0
    assert main(["convert", str(tmp_path / "x.npy"), str(tmp_path / "b"), "--codec",
                 "zstd_dict", "-q"]) == 0
    for name in ("a", "b"):
        manifest = json.loads((tmp_path / name / "loaderx.json").read_text())
        assert manifest["columns"]["x"]["codec"] == "zstd_dict"


def test_convert_to_directory_takes_exactly_converts_options(tmp_path):
    manifest = convert_to_directory({"x": ROWS[:10]}, tmp_path / "d", codec="raw",
                                    progress=False)
    assert manifest["rows"] == 10 and manifest["columns"]["x"]["codec"] == "raw"
    assert os.path.isfile(tmp_path / "d" / "loaderx.json")
    with pytest.raises(TypeError, match="convert_to_directory: .*'compression'"):
        convert_to_directory({"x": ROWS[:10]}, tmp_path / "e", compression="zstd")
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("bad, error, match", [
    (dict(level=0), loaderx.InvalidArgumentError, "level 0 is not a zstd level"),
    (dict(codec="zstd", dict_bytes=b"x" * 300), loaderx.DictionaryError,
     "dict_bytes given but codec is 'zstd'"),
    (dict(level="high"), loaderx.ArgumentTypeError, "level must be an int, not str"),
])
def test_a_bad_argument_never_costs_the_store_an_overwrite_would_replace(tmp_path, bad, error,
                                                                         match):
    loaderx.from_numpy(tmp_path / "s", ROWS[:10]).close()
    with pytest.raises(error, match=match):
        loaderx.from_numpy(tmp_path / "s", ROWS[:20], mode="overwrite", **bad)
    with pytest.raises(error, match=match):
        loaderx.DenseStore.create(tmp_path / "s", np.uint8, (92,), mode="overwrite", **bad)
    with loaderx.DenseStore.open(tmp_path / "s") as s:
        assert len(s) == 10


def test_a_conversion_never_writes_inside_its_source_or_onto_it(tmp_path):
    """Before, `convert imgs imgs/out` wrote into the source folder (a later
    append read its own output as a class) and an .npy could be converted
    onto itself."""
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "x.npy", np.arange(10))
    for dest in (src / "out", src):
        with pytest.raises(ValueError, match="contain one another"):
            loaderx.convert(src, dest, progress=False)
    with pytest.raises(ValueError, match="contain one another"):
        loaderx.convert(src / "x.npy", src / "x.npy", progress=False)
    assert sorted(os.listdir(src)) == ["x.npy"]


@pytest.mark.parametrize("bad", [dict(level=999), dict(level=23), dict(progress="nope")])
def test_an_overwrite_with_a_bad_argument_keeps_the_store(tmp_path, bad):
    """Before, a level zstd refuses (999) or a bad progress= was found only
    once the old store was removed."""
    loaderx.from_numpy(tmp_path / "s", np.arange(5)).close()
    with pytest.raises((loaderx.errors.InvalidArgumentError, ValueError),
                       match="level .* is out of range|progress must be one of"):
        if "progress" in bad:
            loaderx.from_numpy(tmp_path / "s", np.arange(3), mode="overwrite", **bad)
        else:
            loaderx.DenseStore.create(tmp_path / "s", np.int64, (), mode="overwrite", **bad)
    with loaderx.open_store(tmp_path / "s") as store:
        assert store[:].tolist() == [0, 1, 2, 3, 4]


def test_convert_refuses_more_workers_than_it_would_start(tmp_path):
    """Before, workers=10**6 ran for minutes (1,000 made 100 shards of 100 rows)."""
    for workers in (0, 257, 10**6, 1.5, True):  # (True was taken as 1)
        with pytest.raises(ValueError, match="workers must be an int from 1 to 256"):
            loaderx.convert({"x": np.arange(10)}, tmp_path / "o", workers=workers,
                            progress=False)
    assert not (tmp_path / "o").exists()


class _Stop(Exception):
    pass


def _stop_after(calls: int):
    """A progress callback that raises on its `calls`-th call: a write that
    fails (or is interrupted) part-way through."""
    seen = []

    def progress(done, total):
        seen.append(done)
        if len(seen) == calls:
            raise _Stop(f"stopped at {done}")
    return progress


@pytest.mark.parametrize("writer", ["from_numpy", "from_iterator"])
@pytest.mark.parametrize("mode", ["create", "append", "overwrite"])
def test_a_write_that_fails_part_way_leaves_what_was_there(tmp_path, writer, mode):
    """Before the fix an overwrite removed the store first, and every chunk
    was its own append: a failing source left a partial store and lost the
    old one."""
    def write(name, **kw):
        if writer == "from_numpy":
            return loaderx.from_numpy(tmp_path / name, ROWS[:1000], chunk_bytes=92 * 100, **kw)
        return loaderx.from_iterator(tmp_path / name, iter(DOCS * 12), **kw)  # 3 chunks

    if mode != "create":
        write("w", progress=False).close()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(_Stop):
        write("w", progress=_stop_after(3), mode=mode)
    assert sorted(os.listdir(tmp_path)) == before  # nothing left beside it either
    if mode == "create":
        return
    with loaderx.open_store(tmp_path / "w") as store:
        want = ROWS[:1000] if writer == "from_numpy" else DOCS * 12
        assert len(store) == len(want) and store.stats()["reclaimable"] == 0
        got = store[:]
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_a_failed_create_in_an_empty_directory_leaves_it_empty(tmp_path):
    (tmp_path / "w").mkdir()
    with pytest.raises(_Stop):
        loaderx.from_iterator(tmp_path / "w", iter(DOCS * 12), progress=_stop_after(2))
    assert os.listdir(tmp_path / "w") == []


def test_an_overwrite_replaces_the_store_whole_and_readers_keep_the_old_one(tmp_path):
    loaderx.from_numpy(tmp_path / "w", ROWS[:100], progress=False).close()
    old = loaderx.open_store(tmp_path / "w")  # a reader
    new = loaderx.from_numpy(tmp_path / "w", ROWS[100:130], mode="overwrite", progress=False)
    assert len(new) == 30 and np.array_equal(new[:], ROWS[100:130])
    assert len(old) == 100 and np.array_equal(old[[0, 99]], ROWS[[0, 99]])  # its files, unlinked
    old.close()
    new.close()
    assert os.listdir(tmp_path) == ["w"]


def test_an_overwrite_clears_what_a_killed_one_left_and_refuses_a_live_one(tmp_path):
    from loaderx.errors import LockedError

    loaderx.from_numpy(tmp_path / "w", ROWS[:10], progress=False).close()
    left = tmp_path / ".w.loaderx-replacing"
    loaderx.from_numpy(left, ROWS[:3], progress=False).close()  # a killed overwrite's
    loaderx.from_numpy(tmp_path / "w", ROWS[:5], mode="overwrite", progress=False).close()
    assert sorted(os.listdir(tmp_path)) == ["w"]
    with loaderx.DenseStore(tmp_path / "w") as w:
        assert len(w) == 5
    with loaderx.from_numpy(left, ROWS[:3], progress=False):  # a live one: its writer is open
        with pytest.raises(LockedError, match="another writer is replacing this store now"):
            loaderx.from_numpy(tmp_path / "w", ROWS[:7], mode="overwrite", progress=False)
    with loaderx.DenseStore(tmp_path / "w") as w:
        assert len(w) == 5


def test_one_append_publishes_its_appends_together_or_not_at_all(tmp_path):
    with loaderx.RaggedStore.create(tmp_path / "r", np.uint8) as store:
        with store.one_append():
            store.append(DOCS[:2])
            store.append(DOCS[2:5])
            assert len(store) == 0  # nothing visible yet
        assert len(store) == 5
        with pytest.raises(_Stop):
            with store.one_append():
                store.append(DOCS[5:9])
                raise _Stop
        assert len(store) == 5 and np.array_equal(store[4], DOCS[4])
        store.append(DOCS[5:6])
        assert len(store) == 6 and np.array_equal(store[5], DOCS[5])


def test_one_append_is_one_transaction_across_threads_and_failures(tmp_path):
    """Another thread's append waits for the block (it would otherwise join
    its transaction, published or dropped with it); an append that fails
    after it began writing inside the block, even if the caller catches it,
    leaves the block nothing to publish; blocks do not nest."""
    import threading

    from loaderx.errors import LoaderxError, LockedError

    with loaderx.RaggedStore.create(tmp_path / "r", np.uint8) as store:
        entered, other_done = threading.Event(), threading.Event()

        def other():
            entered.wait()
            store.append(DOCS[10:11])
            other_done.set()

        t = threading.Thread(target=other)
        t.start()
        with pytest.raises(_Stop):
            with store.one_append():
                store.append(DOCS[:2])
                entered.set()
                assert not other_done.wait(0.3)  # waits for the block
                raise _Stop
        t.join(10)
        assert other_done.is_set() and len(store) == 1
        assert np.array_equal(store[0], DOCS[10])

        def failing(copies):
            yield from DOCS * copies
            raise _Stop

        # Failing while it builds its second chunk, the append wrote nothing:
        # the block goes on, and publishes what it holds.
        with store.one_append():
            store.append(DOCS[:3])
            with pytest.raises(_Stop):
                store.append(failing(7))  # (21,000 records: a chunk of 16,384 and a rest)
            store.append(DOCS[3:4])
        assert len(store) == 5
        # Failing after its first chunk was written, it dropped them all.
        with pytest.raises(LoaderxError, match="an append inside this one_append failed after "
                                               "it began writing .*_Stop") as caught:
            with store.one_append():
                store.append(DOCS[:3])
                with pytest.raises(_Stop):
                    store.append(failing(12))  # (36,000 records: 3 chunks)
                store.append(DOCS[3:4])
        assert isinstance(caught.value.__cause__, _Stop)
        assert len(store) == 5
        with pytest.raises(LockedError, match="one_append inside another one_append"):
            with store.one_append():
                with store.one_append():
                    pass
        with store.one_append():
            store.append(DOCS[:2])
        assert len(store) == 7 and np.array_equal(store[4], DOCS[3])


@pytest.mark.parametrize("cut", ["after the first rename", "after the second rename",
                                 "after the first rename, the new store gone"])
def test_the_next_write_finishes_a_swap_a_crash_cut_short(tmp_path, cut):
    """The states a kill -9 between swap_in's two renames (or just after
    them) leaves; the next write to the path finds the store it should."""
    old, new = ROWS[:10], ROWS[10:15]
    loaderx.from_numpy(tmp_path / "w", old, progress=False).close()
    loaderx.from_numpy(tmp_path / ".w.loaderx-replacing", new, progress=False).close()
    os.rename(tmp_path / "w", tmp_path / ".w.loaderx-replaced")  # swap_in's first rename
    if cut == "after the second rename":
        os.rename(tmp_path / ".w.loaderx-replacing", tmp_path / "w")
    elif cut == "after the first rename, the new store gone":
        import shutil
        shutil.rmtree(tmp_path / ".w.loaderx-replacing")
    loaderx.from_numpy(tmp_path / "w", ROWS[15:16], mode="append", progress=False).close()
    assert sorted(os.listdir(tmp_path)) == ["w"]
    want = old if cut.endswith("gone") else new
    with loaderx.DenseStore(tmp_path / "w") as w:
        assert np.array_equal(w[:], np.concatenate([want, ROWS[15:16]]))
