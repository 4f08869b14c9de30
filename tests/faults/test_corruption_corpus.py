"""How stores handle corrupt and forged files, pinned by a seeded fuzz corpus
of hostile stores (issue 11, "Fuzz corpus"), and of hostile dataset manifests.

Every CI run builds six small base stores (DenseStore raw in the fixed-width
layout, DenseStore zstd, RaggedStore 1-D raw, RaggedStore n-D zstd, a
zstd_dict Zrecord, a uint16 token store in seekable zstd frames with its
token window index windows.idx) and derives at least 1,000 mutated stores from them
(tests/_fuzz_cases.py): random bit flips and byte overwrites, truncations of
each file, and forged headers, commits, table entries, zstd frames,
dictionaries, type identities, ragged shapes and delete journals whose
checksums are valid, windows.idx files damaged or forged with valid
checksums, so the engine's structural checks are what stands
between them and a crash. `LOADERX_FUZZ_CASES=20000` runs a longer corpus,
`LOADERX_FUZZ_SEED=N` another one.

Each case is opened with its typed class and with `loaderx.dataset.open_store`;
every record is gathered through each batch API of the class and one by one,
and `verify()` runs. Cases run in worker subprocesses limited to 1 GiB of
address space (RLIMIT_AS) and 64 MiB per file written (RLIMIT_FSIZE); a worker
that dies or stays silent for 20 s is blamed on its case and replaced.

Invariants, per case:
* no crash: no worker dies (a signal such as SIGSEGV or SIGBUS, or an abort);
* no hang: every case answers within the timeout;
* memory bounded: nothing fails for want of more than 1 GiB of address space
  except through a loaderx error;
* only loaderx exceptions: every exception is a `loaderx.ZrecordError`, or an
  IndexError/TypeError/ValueError raised by a `raise` statement in loaderx's
  own code. A numpy, msgpack, Unicode, recursion, memory, runtime or system
  error escaping the library fails the case;
* nothing leaks: once every handle of a case is closed (or failed to open),
  the worker holds no more file descriptors than before the case (a leaked
  descriptor of the `lock` file also keeps the writer lock held);
* no wrong windows: a ragged store of integers is also read as
  TokenWindows (which builds, reads or rewrites windows.idx); unless
  verify() reports damage (it checks windows.idx too), every window is the
  slice of the store's own records it names;
* no wrong count: a store that opens holds as many records as an allowed
  state of the case (the base's records; for a delete journal, before or after
  the delete);
* no wrong bytes. A record comes back with "wrong bytes" when a gather
  returns it without raising and its payload bytes (and, where the case keeps
  the type identity, its dtype and shape) differ from the record the allowed
  state holds at that index. Wrong bytes are acceptable only when `verify()`
  reports that very record damaged: raw records are not checksummed on
  gather, while verify() checks every record's location, checksum and decoded
  size. Because verify() stops at the first damaged record, the question is
  put to a store holding only that record (the same header, dictionary, table
  entry and data bytes, see `StoreImage.single_record`). A record forged to
  name other valid bytes is expected to return those bytes.

These tests fail on the engine of issue 11's filing: object-dtype identities
that open and then crash the gather, numpy errors from hostile shapes and
sizes, table entries whose aux_size + stored_size overflows (SIGBUS), journal
entries whose index wraps around onto a live record, and failed opens that
keep the writer lock's descriptor.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import time

import pytest

if sys.platform == "win32":
    pytest.skip(
        "the corpus workers need POSIX resource limits and signals", allow_module_level=True
    )

import _fuzz  # noqa: E402
import _fuzz_cases  # noqa: E402
import _fuzz_common  # noqa: E402
import _fuzz_crafted  # noqa: E402
from _lxformat import StoreImage, block, frame, raw_frame  # noqa: E402
from _lxlayout import SEED_BLOB, SEED_COMMIT, SEED_HEADER  # noqa: E402
from _xxhash import xxh64  # noqa: E402
from loaderx import DenseStore, Zrecord  # noqa: E402

CASES = int(os.environ.get("LOADERX_FUZZ_CASES", "1000"))
SEED = int(os.environ.get("LOADERX_FUZZ_SEED", "11"))


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-bases")
    made = _fuzz_common.build_bases(str(root))
    path = str(root / "bases.pkl")
    _fuzz.save_bases(made, path)
    return made, path


# ----------------------------------------------------------------- the forger against the engine


def test_meta_checksums_and_frame_checksums_match_the_engine(bases):
    made, _ = bases
    for base in made.values():
        img = StoreImage(base.files)
        meta = bytes(img.files["meta"])
        assert struct.unpack_from("<Q", meta, 104)[0] == xxh64(meta[:104], SEED_HEADER), base.name
        assert img.commit()["checksum"] == xxh64(meta[4096 : 4096 + 56], SEED_COMMIT), base.name
        assert img.header()["blob_checksum"] == xxh64(
            img.dict_bytes() + img.user_bytes(), SEED_BLOB
        )
    # zstd's own content checksum (low 32 bits of XXH64, seed 0) closes every frame.
    img = StoreImage(made["ragged_nd"].files)
    loc = img.loc(5)
    assert loc["codec"] == 1
    _, stored = img.record_parts(loc)
    content = made["ragged_nd"].records[5][2]
    assert stored[-4:] == (xxh64(content) & 0xFFFFFFFF).to_bytes(4, "little")


def test_forged_stores_are_valid_to_the_engine(bases, tmp_path):
    """What the fuzzer forges with valid checksums passes the engine's checks:
    a resealed header, a prefix commit, a hand-made zstd frame and a delete
    journal the engine replays (so the corpus tests more than checksum refusal)."""
    made, _ = bases
    base = made["bytes_dict"]
    recs = [r[2] for r in base.records]
    img = StoreImage(base.files)
    img.put_header(flags=123)
    live = sum(img.loc(i)["aux_size"] + img.loc(i)["stored_size"] for i in range(4))
    data_size = img.commit()["data_size"]
    img.put_commit(record_count=4, live_bytes=live, durable_count=4, durable_data_size=data_size,
                   durable_live_bytes=live)
    img.write(tmp_path / "prefix")
    with Zrecord(tmp_path / "prefix") as z:
        assert z[:] == recs[:4]
        z.verify()

    img = StoreImage(base.files)
    payload = b"forged but valid " * 9
    at = img.append_data(raw_frame(payload), live=False)
    img.put_loc(
        2,
        offset=at,
        stored_size=len(raw_frame(payload)),
        raw_size=len(payload),
        codec=1,
        aux_size=0,
    )
    img.put_commit(live_bytes=img.live_total())
    img.write(tmp_path / "frame")
    with Zrecord(tmp_path / "frame") as z:
        assert z[2] == payload
        z.verify()

    for name in ("bytes_dict", "dense_raw"):
        img = StoreImage(made[name].files)
        n = img.count
        entries, c, after = _fuzz_crafted.delete_plan(img, random.Random(3), 2)
        img.put_journal(entries, c)
        img.write(tmp_path / f"journal-{name}")
        z = Zrecord if name == "bytes_dict" else DenseStore
        with z(tmp_path / f"journal-{name}") as s:
            assert len(s) == n - 2
            got = [bytes(x) if isinstance(x, bytes) else x.tobytes() for x in s[:]]
            assert got == [made[name].records[j][2] for j in after]
            s.verify()
        assert not (tmp_path / f"journal-{name}" / "journal").exists()


def test_hand_made_frames_decode_as_zstd_says(bases, tmp_path):
    """The frame builder against the real decoder: RLE blocks and a frame of
    several raw blocks decode to their content, and verify() accepts them."""
    made, _ = bases
    cases = [
        (frame([block("rle", b"z", size=300, last=True)], 300, checksum_of=b"z" * 300), b"z" * 300),
        (raw_frame(bytes(range(256)) * 600), bytes(range(256)) * 600),  # two raw blocks
    ]
    for k, (stored, content) in enumerate(cases):
        img = StoreImage(made["bytes_dict"].files)
        at = img.append_data(stored, live=False)
        img.put_loc(
            0, offset=at, stored_size=len(stored), raw_size=len(content), codec=1, aux_size=0
        )
        img.put_commit(live_bytes=img.live_total())
        img.write(tmp_path / f"f{k}")
        with Zrecord(tmp_path / f"f{k}") as z:
            z.verify()
            assert z[0] == content


# ----------------------------------------------------------------- the driver


@pytest.mark.slow
def test_driver_blames_crashes_and_hangs_on_their_case(bases, tmp_path, monkeypatch):
    """A worker killed by a signal, or silent past the timeout, is charged to
    the case in flight; a fresh worker carries on with the next cases."""
    _, path = bases
    monkeypatch.setenv("LOADERX_FUZZ_SELFTEST", "crash:2,hang:4")
    results = _fuzz.run_corpus(path, SEED, range(7), str(tmp_path), jobs=2, timeout=2.0)
    assert sorted(results) == list(range(7))
    assert results[2]["outcome"] == "CRASH"
    assert "SIGSEGV" in results[2]["problems"][0]["message"]
    assert "_selftest" in results[2]["problems"][0]["stderr"], (
        "faulthandler's stack should name the crash site"
    )
    assert results[4]["outcome"] == "HANG"
    assert (
        "sleep" in results[4]["problems"][0]["stderr"]
        or "_selftest" in results[4]["problems"][0]["stderr"]
    )
    others = [results[i]["outcome"] for i in (0, 1, 3, 5, 6)]
    assert not [o for o in others if o in ("CRASH", "HANG")], others
    counts = _fuzz.tally(results)
    assert counts["crashes"] == 1 and counts["hangs"] == 1 and counts["cases"] == 7


# ----------------------------------------------------------------- the corpus


@pytest.mark.slow
def test_fuzz_corpus(bases, tmp_path, capsys):
    """The corpus (see the module docstring for the invariants and the exact
    meaning of "wrong bytes")."""
    made, path = bases
    start = time.monotonic()
    results = _fuzz.run_corpus(
        path, SEED, range(CASES), str(tmp_path), jobs=min(2, os.cpu_count() or 1)
    )
    wall = time.monotonic() - start
    counts = _fuzz.tally(results)
    failing = sorted(i for i, r in results.items() if r["problems"])
    lines = [
        f"fuzz corpus: seed {SEED}, {counts['cases']} cases in {wall:.1f} s, "
        f"worker peak RSS {counts['max rss MiB']} MiB",
        "  by outcome: " + ", ".join(f"{k} {v}" for k, v in counts["outcomes"].items()),
        "  crashes {crashes}, hangs {hangs}, wrong bytes {wrong bytes}, "
        "wrong windows {wrong windows}, wrong count {wrong count}, "
        "foreign exceptions {foreign exceptions}, leaked descriptors {leaked descriptors}, "
        "harness errors {harness errors}".format(**counts),
    ]
    if failing:
        lines.append(f"  {len(failing)} failing cases, by problem:")
        lines += _fuzz.failure_groups(
            results, lambda i: _fuzz.case_title(made, SEED, i, results[i])
        )
        lines.append(f"  reproduce one: python tests/_fuzz.py repro {SEED} CASE")
    report = "\n".join(lines)
    with capsys.disabled():
        print("\n" + report)
    assert counts["cases"] == CASES
    families = {_fuzz_cases.make_case(made, SEED, i).family for i in range(min(CASES, 40))}
    assert len(families) >= 12, families
    assert counts["outcomes"].get("opened, verify ok", 0) > 0 and any(
        k.startswith("refused") for k in counts["outcomes"]
    ), "the corpus should hold both good and refused stores"
    assert counts["max rss MiB"] < _fuzz.MEMORY_LIMIT >> 20
    assert not failing, report


# ----------------------------------------------------------------- the manifest corpus

MANIFEST_CASES = int(os.environ.get("LOADERX_FUZZ_MANIFEST_CASES", "360"))


@pytest.mark.slow
def test_fuzz_manifest_corpus(bases, tmp_path, capsys):
    """Hostile dataset manifests (tests/_fuzz_manifests.py), opened with
    `open_dataset` in worker subprocesses: no crash, no hang, no leaked
    descriptor, only loaderx exceptions, and a dataset that opens holds
    exactly the records of the parts its manifest names, typed as it says."""
    import _fuzz_manifests

    made, path = bases
    start = time.monotonic()
    results = _fuzz.run_corpus(path, SEED, range(MANIFEST_CASES), str(tmp_path),
                               jobs=min(2, os.cpu_count() or 1), corpus="manifests")
    wall = time.monotonic() - start
    counts = _fuzz.tally(results)
    wrong = sum(1 for r in results.values() if any(p["kind"] == "wrong data"
                                                   for p in r["problems"]))
    failing = sorted(i for i, r in results.items() if r["problems"])
    lines = [
        f"manifest corpus: seed {SEED}, {counts['cases']} cases in {wall:.1f} s",
        "  by outcome: " + ", ".join(f"{k} {v}" for k, v in counts["outcomes"].items()),
        f"  crashes {counts['crashes']}, hangs {counts['hangs']}, wrong data {wrong}, "
        f"foreign exceptions {counts['foreign exceptions']}, leaked descriptors "
        f"{counts['leaked descriptors']}, harness errors {counts['harness errors']}",
    ]
    if failing:
        lines.append(f"  {len(failing)} failing cases, by problem:")
        lines += _fuzz.failure_groups(results, lambda i: results[i].get("what", "?"))
    report = "\n".join(lines)
    with capsys.disabled():
        print("\n" + report)
    assert counts["cases"] == MANIFEST_CASES
    schedule = _fuzz_manifests.SCHEDULE
    families = {_fuzz_manifests.make_manifest_case(made, SEED, i).family
                for i in range(len(schedule))}
    assert families == set(schedule), families
    assert counts["outcomes"].get("opened, verify ok", 0) > 0 and any(
        k.startswith("refused") for k in counts["outcomes"])
    assert not failing, report
