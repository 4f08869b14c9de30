"""The select layer of the bench (issue 25): predicates over scalar columns,
and the loader over a subset.

Workload 1: N rows of two scalar columns, int32 ``label`` (0..9) and
float32 ``score`` (uniform [0, 1)), stored once as a loaderx dataset (two
raw scalar columns) and once as two ``.npy`` files; the predicate is
``label = 3 AND score > 0.5``. Rows (rows scanned per second; every result
is validated against the numpy one before timing):

* ``loaderx select (pyarrow engine)`` and ``(DuckDB engine)``: the
  record indices, from the memory-mapped columns;
* ``numpy mask over memmapped .npy``: ``np.flatnonzero((label == 3) &
  (score > 0.5))`` on ``np.load(mmap_mode="r")`` arrays, the same data;
* ``HF datasets filter``: ``Dataset.filter`` with the per-example lambda
  users write (and, for context, a batched numpy function), on the first
  ``hf_rows`` rows only (it runs at tens of thousands of rows per second;
  the rate is what is compared).

Targets: select within 1 s for 10^8 rows (projected linearly from N when N
is smaller), >= 1/1.5 of the numpy mask's rate, >= 100x HF's.

Workload 2: the DataLoader over a 10% subset of a dataset (a view) against
the loader over a dataset of the subset's size (records: float32 (16,) + an
int64 label), batch 256, the same threads; target >= 0.9x. The loader's
native ring reads a view's ``native_parts`` (each store's selected rows), as
it reads the dataset's stores.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

import bench_layers
from bench_harness import MIB, Row, Section, Target, ValidationError, fmt, fmt_count, paired_ratio

WHERE = "label = 3 AND score > 0.5"
BATCH_SIZE = 256
VEC = 16


@dataclasses.dataclass(frozen=True)
class SelectSize:
    rows: int
    hf_rows: int
    loader_records: int  # the subset's size; the big dataset has 10x
    loader_seconds: float


SIZES = {
    "tiny": SelectSize(rows=100_000, hf_rows=2_000, loader_records=2_000, loader_seconds=0.2),
    "small": SelectSize(rows=10_000_000, hf_rows=50_000, loader_records=50_000,
                        loader_seconds=1.0),
    "default": SelectSize(rows=100_000_000, hf_rows=200_000, loader_records=200_000,
                          loader_seconds=2.0),
}


def _size(ctx) -> SelectSize:
    """This layer's sizes for the run's --size."""
    name = next((k for k, v in bench_layers.SIZES.items() if v is ctx.size), "default")
    return SIZES[name]


def _columns(directory: Path, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """label.npy and score.npy of `rows` rows, written in chunks (bounded memory)."""
    rng = np.random.default_rng(seed)
    label = np.lib.format.open_memmap(directory / "label.npy", "w+", np.int32, (rows,))
    score = np.lib.format.open_memmap(directory / "score.npy", "w+", np.float32, (rows,))
    step = 1 << 22
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        label[start:stop] = rng.integers(0, 10, stop - start, dtype=np.int32)
        score[start:stop] = rng.random(stop - start, dtype=np.float32)
    label.flush()
    score.flush()
    del label, score
    return (np.load(directory / "label.npy", mmap_mode="r"),
            np.load(directory / "score.npy", mmap_mode="r"))


def _row(name: str, group: str, note: str = "") -> Row:
    return Row(name=name, group=group, codec="-", note=note)


def _time(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got = np.asarray(got)
    if got.shape != want.shape or not np.array_equal(got, want):
        raise ValidationError(f"{what}: {len(got)} rows selected, want {len(want)} "
                              "(or different rows)")


def _record(row: Row, seconds: float, rows: int) -> None:
    row.records_s.append(rows / seconds)
    row.gather_mibs.append(rows * 8 / seconds / MIB)  # the two columns' bytes scanned
    row.latencies_s.append(seconds)


def _hf_rows(ctx, label, score, hf_rows: int, rows: dict) -> None:
    """HF datasets filter on the first `hf_rows` rows (validated)."""
    per_example = rows["hf"]
    batched = rows["hf_batched"]
    try:
        import datasets
    except Exception as exc:  # an optional contender
        per_example.status = batched.status = f"missing: {type(exc).__name__}: {exc}"[:120]
        return
    datasets.disable_progress_bars()
    n = min(hf_rows, len(label))
    table = datasets.Dataset.from_dict({"label": np.asarray(label[:n]),
                                        "score": np.asarray(score[:n]),
                                        "i": np.arange(n)})
    want = np.flatnonzero((label[:n] == 3) & (score[:n] > 0.5))
    cases = (
        (per_example, lambda: table.filter(lambda x: x["label"] == 3 and x["score"] > 0.5,
                                           keep_in_memory=True)),
        (batched, lambda: table.with_format("numpy").filter(
            lambda b: (b["label"] == 3) & (b["score"] > 0.5), batched=True,
            batch_size=10_000, keep_in_memory=True)),
    )
    for row, run in cases:
        try:
            for _ in range(max(1, min(ctx.repeat, 3))):
                seconds, out = _time(run)
                _check(np.asarray(out["i"]), want, row.name)
                _record(row, seconds, n)
        except ValidationError as exc:
            row.status = f"INVALID: {exc}"
        except Exception as exc:  # the contender failed here
            row.status = f"failed: {type(exc).__name__}: {exc}"[:160]


def run_select(ctx) -> list[Section]:
    import loaderx

    size = _size(ctx)
    directory = ctx.workdir / "select"
    directory.mkdir(parents=True, exist_ok=True)
    ctx.log(f"select: writing {size.rows:,} rows of label int32 + score float32")
    label, score = _columns(directory, size.rows, ctx.seed)
    loaderx.convert({"label": label, "score": score}, directory / "ds", progress="off")
    ds = loaderx.open_dataset(directory / "ds")
    want = np.flatnonzero((label == 3) & (score > 0.5))
    rows = {
        "arrow": _row("loaderx select (pyarrow engine)", "loaderx"),
        "duckdb": _row("loaderx select (DuckDB engine)", "loaderx-optional"),
        "numpy": _row("numpy mask over memmapped .npy", "baseline"),
        "hf": _row("HF datasets filter (per-example lambda)", "contender",
                   f"on the first {min(size.hf_rows, size.rows):,} rows; rows/s compared"),
        "hf_batched": _row("HF datasets filter (batched numpy function)", "contender",
                           f"on the first {min(size.hf_rows, size.rows):,} rows; context"),
    }
    runs = {
        "arrow": lambda: loaderx.select(ds, WHERE, engine="arrow")["label"].rows,
        "duckdb": lambda: loaderx.select(ds, WHERE, engine="duckdb")["label"].rows,
        "numpy": lambda: np.flatnonzero((label == 3) & (score > 0.5)),
    }
    try:
        import duckdb  # noqa: F401
    except ImportError as exc:
        rows["duckdb"].status = f"missing: {exc}"
        del runs["duckdb"]
    for key, run in list(runs.items()):  # validate before timing
        try:
            _check(run(), want, rows[key].name)
        except ValidationError as exc:
            rows[key].status = f"INVALID: {exc}"
            del runs[key]
    for r in range(ctx.repeat):
        keys = list(runs)
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            seconds, _ = _time(runs[key])
            _record(rows[key], seconds, size.rows)
    _hf_rows(ctx, label, score, size.hf_rows, rows)
    for col in ds.values():
        col.close()
    del label, score
    sections = [_select_section(ctx, size, rows)]
    sections.append(_loader_section(ctx, size))
    return sections


def _select_section(ctx, size: SelectSize, rows: dict) -> Section:
    named = {r.name: r for r in rows.values()}
    arrow = rows["arrow"]
    targets = [
        Target("select >= 1/1.5 of a numpy mask over memmapped .npy (rows/s)", arrow.name,
               [rows["numpy"].name], 1 / 1.5, metric="records_s").evaluate(named),
        Target("select >= 100x HF datasets filter (per-example lambda, rows/s)", arrow.name,
               [rows["hf"].name], 100.0, metric="records_s").evaluate(named),
        Target("  (context) select vs HF filter with a batched numpy function", arrow.name,
               [rows["hf_batched"].name], 1.0, metric="records_s", spec=False).evaluate(named),
        Target("  (context) DuckDB engine vs the pyarrow engine", rows["duckdb"].name,
               [arrow.name], 1.0, metric="records_s", spec=False).evaluate(named),
    ]
    projected = None
    if arrow.ok and arrow.records_s:
        projected = 1e8 / float(np.median(arrow.records_s))
    label = "select of 10^8 rows within 1 s (1 s / time" + \
        (")" if size.rows == 10**8 else f", projected from {size.rows:,} rows)")
    targets.insert(0, Target(label, arrow.name, [], 1.0).settle(
        None if projected is None else 1.0 / projected, "loaderx unavailable"))
    width = max(len(r.name) for r in rows.values())
    lines = [f"== select over {size.rows:,} rows (int32 label + float32 score): {WHERE} ==",
             "  rows/s: rows scanned per second (median of rounds); vs numpy: median of"
             " per-round ratios",
             f"  {'backend':<{width}} {'rows/s':>10} {'seconds':>9} {'vs numpy':>9}"]
    for row in rows.values():
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        versus = paired_ratio(row, [rows["numpy"]], "records_s")
        seconds = float(np.median(row.latencies_s))
        lines.append(f"  {row.name:<{width}} {fmt_count(row.median('records_s')):>10}"
                     f" {seconds:>9.3f} {fmt(versus, '.2f') + 'x' if versus else '-':>9}")
        if row.note:
            lines.append(f"  {'':<{width}}   ({row.note})")
    lines.append("  targets (issue 25):")
    lines.extend(t.line() for t in targets)
    return Section("select", lines[0].strip("= "), lines, list(rows.values()), targets)


# ----------------------------------------------------------------- the loader over a subset

def _loader_rate(loader, seconds: float, check) -> tuple[float, int]:
    for _ in range(3):
        check(next(loader))
    count = 0
    start = time.perf_counter()
    while True:
        next(loader)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and count >= 5:
            return count / elapsed, count


def _loader_section(ctx, size: SelectSize) -> Section:
    import loaderx
    import loaderx.subset as lselect

    directory = ctx.workdir / "select-loader"
    directory.mkdir(parents=True, exist_ok=True)
    m = size.loader_records
    rng = np.random.default_rng(ctx.seed)
    big_x = rng.random((10 * m, VEC), dtype=np.float32)
    big_y = np.arange(10 * m, dtype=np.int64)
    big = loaderx.convert({"x": big_x, "y": big_y}, directory / "big", progress="off")
    keep = np.zeros(10 * m, bool)
    keep[rng.choice(10 * m, m, replace=False)] = True
    subset = loaderx.select(big, keep)
    same_x, same_y = big_x[keep], big_y[keep]
    same = loaderx.convert({"x": same_x, "y": same_y}, directory / "same", progress="off")
    rows = {
        "subset": _row("loaderx DataLoader over a 10% subset (views)", "loaderx"),
        "same": _row("loaderx DataLoader over a dataset of the same size", "baseline"),
        "mapped": _row("loaderx DataLoader over the subset, no compact copy", "context",
                       "the views' rows read in place in the base (COMPACT_BYTES_MAX = 0)"),
    }

    def checker(x_all, y_all):
        def check(batch):
            pos = np.searchsorted(y_all, batch["y"])
            if not np.array_equal(x_all[pos], batch["x"]):
                raise ValidationError("a batch's x does not belong to its y")
        return check

    streams = {"subset": (subset, checker(big_x, big_y)), "same": (same, checker(same_x, same_y)),
               "mapped": (loaderx.select(big, keep), checker(big_x, big_y))}
    for r in range(ctx.repeat):
        for key in (("subset", "same", "mapped") if r % 2 == 0 else ("mapped", "same", "subset")):
            data, check = streams[key]
            # The compact copy is made (or not) when a loader first reads a view.
            compact, lselect.COMPACT_BYTES_MAX = lselect.COMPACT_BYTES_MAX, (
                0 if key == "mapped" else lselect.COMPACT_BYTES_MAX)
            try:
                loader = loaderx.DataLoader({"x": data["x"], "y": data["y"]}, BATCH_SIZE,
                                            seed=r, workers=ctx.threads)
            finally:
                lselect.COMPACT_BYTES_MAX = compact
            try:
                per_s, count = _loader_rate(loader, size.loader_seconds, check)
            except ValidationError as exc:
                rows[key].status = f"INVALID: {exc}"
                continue
            finally:
                loader.close()
            rows[key].records_s.append(per_s * BATCH_SIZE)
            rows[key].gather_mibs.append(per_s * BATCH_SIZE * (VEC * 4 + 8) / MIB)
            rows[key].batches_timed = count
    copied = bool(subset["x"]._compact)  # made by the first loader over the views
    for col in [*big.values(), *same.values(), *subset.values(), *streams["mapped"][0].values()]:
        col.close()
    named = {r.name: r for r in rows.values()}
    target = Target("loader over a 10% subset >= 0.9x a dataset of the same size",
                    rows["subset"].name, [rows["same"].name], 0.9,
                    metric="records_s").evaluate(named)
    native = callable(getattr(subset["x"], "native_parts", None))  # (no store access)
    title = (f"loader over a 10% subset: {m:,} of {10 * m:,} records (x float32[{VEC}] + y int64)"
             f" vs {m:,} records, batch {BATCH_SIZE}, {ctx.threads} threads")
    lines = [f"== {title} ==",
             "  views are read " + ("natively (the ring reads their rows)" if native else
                                    "on the loader's Python threads")
             + ("; from a compact raw copy of the selected records" if copied else "")]
    width = max(len(r.name) for r in rows.values())
    for row in rows.values():
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        lines.append(f"  {row.name:<{width}} {row.median('records_s') / BATCH_SIZE:>10.1f}"
                     " batches/s")
    lines.append("  targets (issue 25):")
    lines.append(target.line())
    return Section("select-loader", title, lines, list(rows.values()), [target])
