"""Tests of `loaderx.select` against hostile predicates and unlucky processes
(issue 37, items 1, 2, 12 and 15, and the predicate fuzz corpus).

* A predicate is one boolean expression: statements after a ``;``, set
  operations, clauses after the condition and parentheses that break out
  of the WHERE clause are refused with a ValueError naming the predicate,
  through `select` on both engines and through the CLI, and nothing is
  written; the DuckDB connection itself cannot write, attach, install,
  load or change a setting, yet reads the files the predicate names.
* Whatever rows an engine returns are checked before a selection exists.
* Long flat chains (10,000 terms) parse and evaluate; nesting deeper than
  `loaderx._sql.DEPTH_MAX` is a ValueError with the position.
* A process killed while it builds a view's compact copy leaves nothing
  behind.
* The seeded predicate corpus (tests/_fuzz_predicates.py): every case gives
  the numpy reference's rows (plain predicates) or a ValueError or a valid
  selection (hostile ones), nothing else, and writes no file.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import loaderx
import loaderx.subset as lselect

pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")
duckdb = pytest.importorskip("duckdb", reason="the DuckDB engine needs duckdb: pip install duckdb")

ROOT = os.path.dirname(os.path.dirname(loaderx.__file__))
N = 1000

#: The issue's attacks and their relatives: each must be refused, and write nothing.
ATTACKS = (
    "x = 1; COPY (SELECT 42 AS a) TO 'pwned.csv'",
    "x = 1; ATTACH 'evil.db' AS e; CREATE TABLE e.t AS SELECT 1",
    "x = 1; INSTALL httpfs",
    "x = 1; LOAD httpfs",
    "x = 1; SET threads = 1",
    "x = 1; PRAGMA threads = 1",
    "x = 1; EXPORT DATABASE 'exported'",
    "x = 1 UNION ALL SELECT -3",
    "x = 1 UNION SELECT 5000",
    "x = 1 INTERSECT SELECT 1",
    "x = 1 EXCEPT SELECT 1",
    "x = 1) UNION ALL (SELECT -3",
    "x = 1) UNION ALL SELECT -3 WHERE (1 = 1",
    "x = 1 --\n) UNION ALL SELECT 2 --",
    "x = 1 ORDER BY 1 LIMIT 1",
    "x = 1 COPY (SELECT 1) TO 'pwned2.csv'",
    "COPY (SELECT 1) TO 'pwned3.csv'",
    "x = 1\x00; COPY (SELECT 1) TO 'pwned4.csv'",
    "x IN (SELECT 1 FROM query('COPY (SELECT 1) TO ''pwned5.csv'''))",
    "x IN (SELECT 1 FROM enable_logging(storage='file', storage_path='logs'))",
    "x IN (SELECT 1 FROM enable_profiling(save_location='profile.json', format='json'))",
    "x IN (SELECT 1 FROM json_execute_serialized_sql('{}'))",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    x = np.arange(N, dtype=np.int64)
    ds = loaderx.convert({"x": x, "id": x * 7 % N, "v": np.repeat(x, 4).reshape(N, 4)
                          .astype(np.float32)}, tmp / "ds", progress="off")
    yield tmp, ds
    for stream in ds.values():
        stream.close()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory: whatever a predicate writes lands here."""
    where = tmp_path / "cwd"
    where.mkdir()
    monkeypatch.chdir(where)
    return where


# ----------------------------------------------------------------- item 1

@pytest.mark.parametrize("where", ATTACKS)
@pytest.mark.parametrize("engine", [None, "duckdb"])
def test_a_predicate_cannot_run_statements(data, workdir, where, engine):
    _, ds = data
    with pytest.raises(ValueError) as caught:
        loaderx.select(ds, where, engine=engine)
    assert "the predicate" in str(caught.value)
    assert os.listdir(workdir) == []


def test_refusals_say_what_and_where(data, workdir):
    _, ds = data
    cases = {
        "x = 1; COPY (SELECT 42 AS a) TO 'pwned.csv'": r"';' at position 5 would end the "
                                                        "statement",
        "x = 1 UNION ALL SELECT -3": r"is not one SQL expression: UNION at position 6",
        "x = 1) UNION ALL (SELECT -3": r"the '\)' at position 5 closes a parenthesis",
        "x = 1 COPY (SELECT 1) TO 'p.csv'": r"Parser Error: .*COPY.* \(at position 6\)",
        "x IN (SELECT 1 FROM query('SELECT 1'))": r"calls the table function query\(\)",
    }
    for where, message in cases.items():
        with pytest.raises(ValueError, match=message):
            loaderx.select(ds, where, engine="duckdb")
    with pytest.raises(ValueError, match=r"position 5: ';' ends an SQL statement; a predicate "
                                         "is one expression"):
        loaderx.select(ds, "x = 1; COPY (SELECT 42 AS a) TO 'pwned.csv'")
    assert os.listdir(workdir) == []


def test_the_cli_refuses_them_too(data, tmp_path):
    tmp, _ = data
    cwd = tmp_path / "cli"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": ROOT}
    for where in ATTACKS[:3] + ("x = 1 UNION ALL SELECT -3",):
        out = subprocess.run([sys.executable, "-m", "loaderx", "select", str(tmp / "ds"), where],
                             capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
        assert out.returncode == 1 and "the predicate" in out.stderr, (where, out.stderr)
        assert "Traceback" not in out.stderr
    assert os.listdir(cwd) == []


def test_the_connection_itself_cannot_write_attach_install_or_reset(tmp_path, monkeypatch):
    """The second layer, alone: statements run straight on the connection."""
    from loaderx import _duckdb_guard as guard

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"id": [7, 14]}), "keep.parquet")
    pq.write_table(pa.table({"id": [1]}), "other.parquet")
    con = guard.connect(duckdb, 1, guard.allowed_paths(duckdb, "read_parquet('keep.parquet')"))
    try:
        assert con.execute("SELECT id FROM read_parquet('keep.parquet')").fetchall() == [(7,),
                                                                                        (14,)]
        for statement in ("COPY (SELECT 1) TO 'pwned.csv'", "ATTACH 'evil.db' AS e",
                          "INSTALL httpfs", "LOAD httpfs", "SET threads = 1",
                          "SET enable_external_access = true", "SET lock_configuration = false",
                          "EXPORT DATABASE 'exported'",
                          "SELECT * FROM read_parquet('other.parquet')",
                          "COPY (SELECT 1) TO 'keep.parquet'"):
            with pytest.raises(duckdb.Error):
                con.execute(statement)
    finally:
        con.close()
    assert sorted(os.listdir(tmp_path)) == ["keep.parquet", "other.parquet"]


def test_documented_reads_of_other_files_still_work(data, workdir):
    _, ds = data
    pq.write_table(pa.table({"id": np.array([7, 14, 21], np.int64)}), "keep.parquet")
    want = np.flatnonzero(np.isin(np.arange(N) * 7 % N, [7, 14, 21]))
    for where in ("id IN (SELECT id FROM read_parquet('keep.parquet'))",
                  "id IN (SELECT id FROM 'keep.parquet')",
                  "id IN (SELECT id FROM read_parquet('*.parquet')) -- a comment",
                  "x < 0 OR /* ; COPY ... */ id IN (SELECT id FROM "
                  "read_parquet(['keep.parquet']))"):
        assert loaderx.select(ds, where)["x"].rows.tolist() == want.tolist(), where
    with pytest.raises(ValueError, match="nope.parquet.*reads only the existing files"):
        loaderx.select(ds, "id IN (SELECT id FROM read_parquet('nope.parquet'))")
    assert os.listdir(workdir) == ["keep.parquet"]


# ----------------------------------------------------------------- item 2

@pytest.mark.parametrize("found, message", [
    ([-3, 1], r"gave row -3, outside the 1,000 records"),
    ([1, N], r"gave row 1000, outside the 1,000 records"),
    ([5, 1, 5], r"gave row 5 more than once"),
    (np.array([0.5]), r"gave float64 values"),
])
def test_rows_from_any_engine_are_checked(data, monkeypatch, found, message):
    _, ds = data
    for engine, name in ((None, "_arrow_rows"), ("duckdb", "_duckdb_rows")):
        monkeypatch.setattr(lselect, name, lambda *a, **k: np.asarray(found))
        with pytest.raises(ValueError, match="the predicate 'x >= 0' " + message):
            loaderx.select(ds, "x >= 0", engine=engine)


def test_rows_an_engine_returns_out_of_order_are_sorted(data, monkeypatch):
    _, ds = data
    monkeypatch.setattr(lselect, "_duckdb_rows", lambda *a, **k: np.array([9, 2, 5]))
    sub = loaderx.select(ds, "x >= 0", engine="duckdb")
    assert sub["x"].rows.tolist() == [2, 5, 9] and sub["x"][:].tolist() == [2, 5, 9]
    monkeypatch.setattr(lselect, "_duckdb_rows", lambda *a, **k: np.array([2, 0]))
    narrower = loaderx.select(sub, "x > 2", engine="duckdb")  # from a view: its space is 3
    assert narrower["x"].rows.tolist() == [2, 9]
    monkeypatch.setattr(lselect, "_duckdb_rows", lambda *a, **k: np.array([3]))
    with pytest.raises(ValueError, match="outside the 3 records"):
        loaderx.select(sub, "x > 2", engine="duckdb")


# ----------------------------------------------------------------- item 12

@pytest.mark.parametrize("engine", [None, "duckdb"])
def test_long_flat_chains_parse_and_evaluate(data, engine):
    _, ds = data
    chains = {
        " OR ".join(f"x = {k}" for k in range(0, 10_000, 7)): np.arange(0, N, 7),
        " AND ".join(f"x >= {k % 500}" for k in range(10_000)): np.arange(499, N),
        "x IN (" + ", ".join(map(str, range(0, 10_000, 3))) + ")": np.arange(0, N, 3),
    }
    if engine is None:  # DuckDB nests a sum per term, within its own limit
        chains["x + " + " + ".join(["1"] * 10_000) + " > 10500"] = np.arange(501, N)
    for where, want in chains.items():
        assert loaderx.select(ds, where, engine=engine)["x"].rows.tolist() == want.tolist()


def test_nesting_up_to_the_depth_works_and_beyond_it_is_refused(data):
    _, ds = data
    depth = loaderx._sql.DEPTH_MAX
    for engine in (None, "duckdb"):
        nested = "(" * depth + "x < 3" + ")" * depth
        assert loaderx.select(ds, nested, engine=engine)["x"].rows.tolist() == [0, 1, 2]
        nots = depth - 3  # NOT ... NOT (x < 3): the comparison and its operands are 2 more
        want = 3 if nots % 2 == 0 else N - 3
        assert len(loaderx.select(ds, "NOT " * nots + "x < 3", engine=engine)["x"]) == want
    # Refused where the nesting passes the depth: the 201st '(' or the NOT
    # that makes the 201st level (counted from the innermost).
    too_deep = {
        "(" * (depth + 1) + "x < 3" + ")" * (depth + 1): depth,
        "(" * 5000 + "x": depth,
        "NOT " * (depth + 1) + "x < 3": 8,
        "x > " + "- " * (depth + 5) + "x": 4 + 2 * 5,
    }
    for where, position in too_deep.items():
        with pytest.raises(ValueError, match=rf"at position {position}: the predicate nests "
                                             rf"deeper than {depth} levels"):
            loaderx.select(ds, where)
    for where in list(too_deep)[:2]:  # DuckDB's parser bounds the rest itself
        with pytest.raises(ValueError, match=rf"deeper than {depth} parentheses \(at "
                                             rf"position {depth}\)"):
            loaderx.select(ds, where, engine="duckdb")


def test_comments_remainders_and_mixed_in_lists_agree_across_engines(data):
    """Four disagreements the predicate corpus found between the engines."""
    _, ds = data
    x = np.arange(N)
    cases = {
        "x < 3 -- 1": x < 3,  # a comment, not x < 3 - (-1)
        "x < 3 /* OR x > 5 */": x < 3,
        "(x - 500) % 7 = -3": np.fmod(x - 500, 7) == -3,  # C's remainder, as DuckDB's
        "(x - 500) % -7 = 3": np.fmod(x - 500, -7) == 3,
        "x IN (1, 2.5, 3)": np.isin(x, [1, 3]),  # an int column and a float in the list
        "4.5 IN (1, -1.25, 3.75) OR x = 0": x == 0,
        "-(x * 0.5) IN (0.0, 1.5)": x == 0,  # -0.0 is 0.0, as = says
        "-(x * 0.5) NOT IN (0.0, 1.5)": x > 0,
    }
    for where, want in cases.items():
        for engine in (None, "duckdb"):
            got = loaderx.select(ds, where, engine=engine)["x"].rows
            assert got.tolist() == np.flatnonzero(want).tolist(), (where, engine)
    with pytest.raises(ValueError, match="the comment is not closed"):
        loaderx.select(ds, "x < 3 /* OR x > 5")


# ----------------------------------------------------------------- item 15

_BUILD_AND_WAIT = r"""
import sys, time
import loaderx
import loaderx.subset as lselect
from loaderx.dense import DenseStore

dataset, room, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
lselect._room_for = lambda nbytes: room
lselect.COMPACT_APPEND_BYTES = 64  # four 16-byte records an append
view = loaderx.select(loaderx.open_dataset(dataset), "x % 4 = 0")["v"]
real_append = DenseStore.append
appends = []

def append(self, *args, **kwargs):
    appends.append(1)
    if len(appends) == kill_at:
        print("inside", flush=True)
        time.sleep(120)
    return real_append(self, *args, **kwargs)

DenseStore.append = append
view._compact_copy()
print("finished", flush=True)
"""


def _kill_while_building(dataset, room, kill_at: int) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    child = subprocess.Popen([sys.executable, "-c", _BUILD_AND_WAIT, str(dataset), str(room),
                              str(kill_at)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline()
        assert line.strip() == "inside", line
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL and unlinked files are POSIX")
def test_a_process_killed_while_it_builds_a_compact_copy_leaves_nothing(data, tmp_path,
                                                                         monkeypatch):
    tmp, _ = data
    room = tmp_path / "shm"
    room.mkdir()
    # Killed mid-copy (its third append): the copy had no name any more.
    _kill_while_building(tmp / "ds", room, 3)
    assert os.listdir(room) == []
    # Killed at its first append, the one instant the copy has a name: the
    # next copy made there sweeps it (the dead builder's owner lock is free).
    _kill_while_building(tmp / "ds", room, 1)
    left = os.listdir(room)
    assert len(left) == 1 and left[0].startswith("loaderx-view-")
    monkeypatch.setattr(lselect, "_room_for", lambda nbytes: str(room))
    view = loaderx.select(loaderx.open_dataset(tmp / "ds"), "x % 4 = 1")["v"]
    copy = view._compact_copy()
    assert copy is not None and len(copy) == N // 4
    assert copy[3].tolist() == [13.0] * 4
    assert os.listdir(room) == []
    # A live builder's copy is never swept.
    from loaderx import _locks

    alive = room / "loaderx-view-alive"
    alive.mkdir()
    owner = _locks.own(str(alive))
    try:
        assert loaderx.select(loaderx.open_dataset(tmp / "ds"), "x % 4 = 2")["v"]._compact_copy()
        assert os.listdir(room) == ["loaderx-view-alive"]
    finally:
        os.close(owner)


# ----------------------------------------------------------------- the corpus

PREDICATE_CASES = int(os.environ.get("LOADERX_FUZZ_PREDICATE_CASES", "400"))
SEED = int(os.environ.get("LOADERX_FUZZ_SEED", "11"))


def test_fuzz_predicate_corpus(tmp_path, monkeypatch, capsys):
    """Seeded random predicates, plain and hostile (tests/_fuzz_predicates.py)."""
    pytest.importorskip("pandas", reason="pandas comes with the test extra (datasets)")
    import _fuzz_predicates as fp

    ds = fp.write_dataset(str(tmp_path / "ds"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    start = time.monotonic()
    counts, failures = fp.run_corpus(ds, SEED, PREDICATE_CASES)
    wall = time.monotonic() - start
    with capsys.disabled():
        print(f"\npredicate corpus: seed {SEED}, {PREDICATE_CASES} cases in {wall:.1f} s: "
              + ", ".join(f"{kind} {outcome} {count}"
                          for (kind, outcome), count in sorted(counts.items())))
    assert not failures, failures[:10]
    assert os.listdir(work) == []
    assert sum(counts.values()) == PREDICATE_CASES
    assert counts.get(("plain", "selection"), 0) > PREDICATE_CASES // 5
    assert counts.get(("hostile", "ValueError"), 0) > PREDICATE_CASES // 3
    families = {fp.make_case(SEED, i).family for i in range(len(fp.FAMILIES))}
    assert len(families) == len(set(fp.FAMILIES))
