"""The store and sampler layers of the bench: workloads, their rows and their SPEC §9 targets.

Each layer returns Sections: a titled table plus the target lines that compare
loaderx rows with the contenders measured side by side in the same rounds.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np

import bench_backends as bb
import bench_data
from bench_harness import (
    MIB,
    Backend,
    Measurement,
    Options,
    Plan,
    Row,
    Section,
    Target,
    ValidationError,
    check_array,
    fmt,
    fmt_count,
    import_or_missing,
    paired_ratio,
    store_table,
)

BATCH_SIZE = 256
SAMPLER_LENGTH = 1_000_000


@dataclasses.dataclass(frozen=True)
class Size:
    """How much work one --size does; "tiny" exists for the smoke test and proves nothing."""

    dense_mib: int  # per record size (half of it for 200 B records, whose writers loop per record)
    plan_batches: int
    plan_payload_mib: int  # caps planned batches of big records (a 256 KiB batch is 64 MiB)
    dense_batch: int  # SPEC §9 says 256; only "tiny" uses less, to keep the smoke test short
    token_sequences: int
    image_count: int
    image_batch: int
    budget_s: float
    repeat: int
    write_repeat: int
    sampler_calls: int
    loader_records: int
    loader_batches: int
    loader_warmup: int
    loader_seconds: float
    loader_warmup_s: float  # and at least this long: every row warms up for the same time
    loader_repeat_max: int  # every loader run is a fresh process that imports torch or grain
    loader_torch_workers: tuple
    loader_grain_workers: tuple
    loader_contender_workers: tuple  # torchdata, MosaicML Streaming, LitData, WebDataset
    scale_exponents: dict  # scale layer: kind -> (smallest, largest) power of ten of records
    scale_batches: int  # random batches timed per scale run; RSS is read after 1000 (tiny: this many)
    # cold layer (bench_cold): records per workload, the memory cgroup's limit (MiB, 0: none),
    # seconds per run and per fio job (0: fio not run), batch size
    cold: dict = dataclasses.field(default_factory=dict)
    # dense layer's fresh-process rows: the record sizes run (empty: every one)
    fresh_labels: tuple = ()
    # images layer (bench_images): JPEGs generated, batch, warm-up and timed batches per
    # run, most rounds, torch DataLoader worker counts, and "temporary": the data set
    # goes to the run's own directory instead of --cache
    images: dict = dataclasses.field(default_factory=dict)


SIZES = {
    "tiny": Size(
        dense_mib=2, plan_batches=6, plan_payload_mib=64, dense_batch=32, token_sequences=300, image_count=12, image_batch=4,
        budget_s=0.005, repeat=2, write_repeat=1, sampler_calls=256,
        loader_records=1024, loader_batches=4, loader_warmup=2, loader_seconds=0.2, loader_warmup_s=0.0,
        loader_repeat_max=1,
        loader_torch_workers=(0, 1), loader_grain_workers=(0,), loader_contender_workers=(0,),
        scale_exponents={"dense8": (3, 4), "dense1k": (3, 4), "ragged": (3, 4)}, scale_batches=20,
        cold={"12 KiB": 256, "200 B": 20_000, "cgroup_mib": 0, "seconds": 0.1, "fio_seconds": 0,
              "batch": 32},
        fresh_labels=("200 B", "12 KiB"),
        images={"count": 20, "batch": 8, "warmup": 2, "batches": 2, "repeat": 1,
                "torch_workers": (0,), "temporary": True},
    ),
    "small": Size(
        dense_mib=16, plan_batches=256, plan_payload_mib=256, dense_batch=256, token_sequences=6000, image_count=48, image_batch=16,
        budget_s=0.08, repeat=3, write_repeat=1, sampler_calls=4096,
        loader_records=4096, loader_batches=5000, loader_warmup=3, loader_seconds=1.0, loader_warmup_s=0.3,
        loader_repeat_max=2,
        loader_torch_workers=(0, 1, 2, 4), loader_grain_workers=(0, 2), loader_contender_workers=(0, 2),
        scale_exponents={"dense8": (4, 7), "dense1k": (4, 6), "ragged": (4, 6)}, scale_batches=200,
        cold={"12 KiB": 43_690, "200 B": 2_684_354, "cgroup_mib": 256, "seconds": 1.0,
              "fio_seconds": 2, "batch": 256},
        images={"count": 1000, "batch": 64, "warmup": 4, "batches": 8, "repeat": 2,
                "torch_workers": (0, 1, 2)},
    ),
    "default": Size(
        dense_mib=64, plan_batches=4096, plan_payload_mib=1024, dense_batch=256, token_sequences=50000, image_count=320, image_batch=32,
        budget_s=0.3, repeat=5, write_repeat=3, sampler_calls=32768,
        loader_records=16384, loader_batches=10000, loader_warmup=30, loader_seconds=2.0, loader_warmup_s=0.5,
        loader_repeat_max=5,
        loader_torch_workers=(0, 1, 2, 4), loader_grain_workers=(0, 2), loader_contender_workers=(0, 2),
        scale_exponents={"dense8": (4, 8), "dense1k": (4, 8), "ragged": (4, 7)}, scale_batches=1000,
        cold={"12 KiB": 131_072, "200 B": 10_000_000, "cgroup_mib": 640, "seconds": 3.0,
              "fio_seconds": 4, "batch": 256},
        images={"count": 5000, "batch": 64, "warmup": 4, "batches": 16, "repeat": 3,
                "torch_workers": (0, 1, 2)},
    ),
}

# (label, dtype, item shape, share of Size.dense_mib)
DENSE_SHAPES = (
    ("200 B", np.int16, (100,), 0.5),
    ("12 KiB", np.uint8, (64, 64, 3), 1.0),
    ("256 KiB", np.uint8, (256, 256, 4), 1.0),
)


@dataclasses.dataclass
class Context:
    size: Size
    workdir: Path
    repeat: int
    seed: int
    threads: int  # cores this process may use: the loaderx thread count SPEC §5 asks for
    log: Callable[[str], None]
    venvs: Any = None  # bench_venvs.Venvs: private environments of contenders that need one
    cache: Path | None = None  # stores kept between runs (the scale layer's big stores)
    scale_max_bytes: int | None = None  # --scale-max-gib: the largest scale store to build
    baseline: Path | None = None  # --baseline: a loaderx package the fresh-process rows also run
    latency_ms: float = 0.0  # --latency-ms: added to every request of the remote layer
    server_disk: str = "auto"  # --server-disk: the remote layer's server pages, cold or warm

    def options(self, key: str, budget_s: float | None = None, chunk: int = 1) -> Options:
        directory = self.workdir / key
        directory.mkdir(parents=True, exist_ok=True)
        return Options(
            workdir=self.workdir,
            repeat=self.repeat,
            write_repeat=min(self.size.write_repeat, self.repeat),
            budget_s=self.size.budget_s if budget_s is None else budget_s,
            chunk=chunk,
            collect=self.size is not SIZES["tiny"],
        )


def _named(rows: list[Row]) -> dict[str, Row]:
    return {r.name: r for r in rows}


def _section(key: str, title: str, rows: list[Row], reference: str, targets: list[Target]) -> Section:
    named = _named(rows)
    for target in targets:
        target.evaluate(named)
    lines = [f"== {title} =="] + store_table(rows, named.get(reference))
    if targets:
        lines.append("  SPEC §9 targets (median of per-round ratios):")
        lines.extend(t.line() for t in targets)
    return Section(key, title, lines, rows, targets)


# ----------------------------------------------------------------------------- dense


def _dense_backends(source: bb.Source, plan: list, threads: int) -> list[Backend]:
    lx_dict = bb.LoaderxDense("loaderx zstd_dict", source, "zstd_dict")
    lx_raw = bb.LoaderxDense("loaderx raw", source, "raw")
    lx_into = bb.LoaderxDense("loaderx raw gather(out=)", source, "raw", into=True)
    lx_into.store_owner = lx_raw
    lance_raw = bb.LanceDense("Lance take() raw -> numpy", source, note="fixed_size_list column")
    lance_arrow = bb.LanceDense("Lance take() raw -> Arrow", source, arrow=True, note="the same dataset")
    lance_arrow.store_owner = lance_raw
    return [
        bb.NumpyMmap("npy mmap fancy index", source, "dense", group="baseline"),
        lx_raw,
        lx_into,
        bb.LoaderxDense("loaderx zstd", source, "zstd"),
        lx_dict,
        bb.Lmdb("lmdb", source, "dense"),
        bb.H5Dense("h5py raw", source, "dense"),
        bb.H5Dense("h5py gzip", source, "dense", codec="gzip", note="gzip-4, 64 KiB chunks"),
        bb.ArrowIpcDense("pyarrow ipc raw", source, "dense"),
        bb.ArrowIpcDense("pyarrow ipc zstd", source, "dense", codec="zstd", note="64 KiB record batches"),
        bb.ParquetDense("pyarrow parquet raw", source, "dense", note="64 KiB row groups"),
        bb.ParquetDense("pyarrow parquet zstd", source, "dense", codec="zstd", note="64 KiB row groups"),
        bb.ArrayRecord("array_record raw", source, "dense"),
        bb.ArrayRecord("array_record zstd", source, "dense", codec="zstd"),
        lance_raw,
        lance_arrow,
        bb.LanceDense("Lance take() zstd -> numpy", source, codec="zstd", note="binary column, zstd"),
        bb.MemcpyLimit(source, 1),
        bb.MemcpyLimit(source, threads),
        bb.ZstdLimit(source, plan),
        bb.ZstdLimit(source, plan, dict_owner=lx_dict),
    ] + ([
        bb.ZstdLimit(source, plan, threads=threads),
        bb.ZstdLimit(source, plan, dict_owner=lx_dict, threads=threads),
    ] if threads > 1 else [])


def _dense_targets(label: str, record_bytes: int, threads: int, memcpy_all: str) -> list[Target]:
    small = " (small records: no per-record syscall)" if record_bytes <= 256 else ""
    targets = [Target(f"dense {label} raw gather vs npy mmap{small}", "loaderx raw", ["npy mmap fancy index"], 1.0)]
    if record_bytes >= 12 << 10:
        # Like for like: the memcpy row copies into a pre-faulted buffer, so the
        # loaderx side gathers into a reused one too (gather(out=)); the
        # allocating row also pays the kernel's zeroing of fresh pages.
        targets.append(Target(f"dense {label} raw gather(out=) vs all-thread memcpy (both into a reused buffer)",
                              "loaderx raw gather(out=)", [memcpy_all], 0.6))
    for codec, limit in (("zstd", "zstd -3"), ("zstd_dict", "zstd -3 + dictionary")):
        targets.append(
            Target(
                f"dense {label} {codec} gather vs 1-thread zstd x {threads} threads",
                f"loaderx {codec}",
                [f"{limit} decompress 1 thread (zstandard)"],
                0.8,
                scale=float(threads),
            )
        )
        if threads > 1:
            # Context, not a target: the same bar against what the cores measured together.
            targets.append(
                Target(
                    f"  (context) {codec} gather vs measured {threads}-thread zstd",
                    f"loaderx {codec}",
                    [f"{limit} decompress {threads} threads (zstandard)"],
                    0.8,
                    spec=False,
                )
            )
    # Lance (issue 27): how far ahead loaderx is; no bar of its own.
    for codec, lance in (("raw", "Lance take() raw -> numpy"), ("zstd", "Lance take() zstd -> numpy")):
        targets.append(Target(f"  (context) dense {label} {codec} gather vs {lance}", f"loaderx {codec}", [lance], 1.0,
                              spec=False))
    targets.append(Target(f"  (context) dense {label} raw gather vs Lance take() raw -> Arrow (no conversion)",
                          "loaderx raw", ["Lance take() raw -> Arrow"], 1.0, spec=False))
    raw_writers = ["npy mmap fancy index", "lmdb", "h5py raw", "pyarrow ipc raw", "pyarrow parquet raw", "array_record raw"]
    zstd_writers = ["pyarrow ipc zstd", "pyarrow parquet zstd", "array_record zstd"]
    targets.append(Target(f"dense {label} raw write vs fastest raw contender", "loaderx raw", raw_writers, 0.5, metric="write_mibs"))
    targets.append(Target(f"dense {label} zstd write vs fastest zstd contender", "loaderx zstd", zstd_writers, 0.5, metric="write_mibs"))
    return targets


def run_dense(ctx: Context) -> list[Section]:
    sections = []
    for label, dtype, shape, share in DENSE_SHAPES:
        rng = np.random.default_rng(ctx.seed)
        record_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        count = max(1, int(share * ctx.size.dense_mib * (1 << 20)) // record_bytes)
        ctx.log(f"dense {label}: generating {count} records")
        source = bb.Source(np.dtype(dtype), dense=bench_data.chunked_dense(rng, count, dtype, shape))
        batch_size = ctx.size.dense_batch
        batch_count = min(ctx.size.plan_batches, max(4, (ctx.size.plan_payload_mib << 20) // (batch_size * record_bytes)))
        batches = bench_data.uniform_plan(rng, count, batch_size, batch_count)
        plan = Plan(batches, [len(b) * record_bytes for b in batches], source.dense.nbytes)
        key = f"dense-{label.replace(' ', '')}"
        memcpy_all = f"memcpy {ctx.threads} thread{'s' if ctx.threads > 1 else ''} (numpy copyto)"
        backends = _dense_backends(source, batches, ctx.threads)
        rows = Measurement(key, backends, plan, ctx.options(key), ctx.log).run()
        title = (
            f"dense {label} records ({np.dtype(dtype).name} {shape}), {count} records, "
            f"{source.dense.nbytes / MIB:.1f} MiB, batch {batch_size}, uniform random indices, {ctx.repeat} rounds"
        )
        sections.append(_section(key, title, rows, "npy mmap fancy index", _dense_targets(label, record_bytes, ctx.threads, memcpy_all)))
        del source, backends
    # The same gathers again, each run a fresh process (allocation and first-touch costs included).
    import bench_fresh

    return sections + bench_fresh.run_fresh(ctx)


# ----------------------------------------------------------------------------- ragged tokens


def _token_backends(source: bb.Source) -> list[Backend]:
    flat_packed = bb.NumpyFlat("numpy flat+offsets packed", source, "packed", group="baseline", note="vectorized: one fancy index over element positions")
    flat_loop = flat_packed.shared("numpy flat+offsets packed (loop)", "packed", note="one slice copy per record")
    flat_loop.loop = True
    flat_list = flat_packed.shared("numpy flat+offsets list", "list", note="one owned copy per record")
    lx_raw = bb.LoaderxRagged("loaderx raw packed", source, "packed", "raw")
    lx_zstd = bb.LoaderxRagged("loaderx zstd packed", source, "packed", "zstd")
    return [
        flat_packed,
        flat_loop,
        flat_list,
        lx_raw,
        lx_raw.shared("loaderx raw list", "list"),
        lx_zstd,
        lx_zstd.shared("loaderx zstd list", "list"),
        bb.H5Vlen("h5py vlen list", source, "list"),
        bb.Lmdb("lmdb list", source, "list"),
        bb.ArrowIpcList("pyarrow ipc list<int32> packed", source, "packed"),
        bb.ArrayRecord("array_record zstd list", source, "list", codec="zstd"),
    ]


def run_ragged(ctx: Context) -> list[Section]:
    rng = np.random.default_rng(ctx.seed + 1)
    records = bench_data.token_sequences(rng, ctx.size.token_sequences)
    source = bb.Source(np.dtype(np.int32), records=records)
    lengths = np.array([len(r) for r in records])
    batches = bench_data.uniform_plan(rng, len(records), BATCH_SIZE, ctx.size.plan_batches)
    plan = Plan(batches, [int(lengths[b].sum()) * 4 for b in batches], int(lengths.sum()) * 4)
    key = "ragged-tokens"
    rows = Measurement(key, _token_backends(source), plan, ctx.options(key), ctx.log).run()
    title = (
        f"ragged int32 token sequences, {len(records)} sequences (lognormal lengths 16..2048, mean {lengths.mean():.0f}), "
        f"{plan.logical_bytes / MIB:.1f} MiB, batch {BATCH_SIZE}, {ctx.repeat} rounds"
    )
    flat = ["numpy flat+offsets packed", "numpy flat+offsets packed (loop)"]
    targets = [
        Target("ragged tokens packed (raw) vs hand-written flat+offsets (best of 2)", "loaderx raw packed", flat, 1.0),
        Target("ragged tokens list (raw) vs h5py vlen", "loaderx raw list", ["h5py vlen list"], 3.0),
        Target("ragged tokens list (raw) vs lmdb", "loaderx raw list", ["lmdb list"], 1.0),
    ]
    return [_section(key, title, rows, "numpy flat+offsets packed", targets)]


# ----------------------------------------------------------------------------- images


def _image_backends(source: bb.Source) -> list[Backend]:
    return [
        bb.NumpyFlat("numpy flat+offsets list", source, "list", group="baseline", note="one owned copy per image"),
        bb.LoaderxRagged("loaderx RaggedStore raw", source, "list", "raw"),
        bb.LoaderxRagged("loaderx RaggedStore zstd", source, "list", "zstd"),
        bb.LoaderxBytes("loaderx Zrecord zstd", source, "list", group="loaderx", codec="zstd", note="bytes: int64 shape header + pixels"),
        bb.Lmdb("lmdb", source, "list", note="bytes: int64 shape header + pixels"),
        bb.H5Vlen("h5py vlen", source, "list", note="flattened pixels + shapes dataset"),
        bb.ArrayRecord("array_record raw", source, "list"),
        bb.ArrayRecord("array_record zstd", source, "list", codec="zstd"),
    ]


def run_image_store(ctx: Context) -> list[Section]:
    """Variable-size decoded images as a store workload (the decode-and-augment bench is
    the images layer: bench_images)."""
    rng = np.random.default_rng(ctx.seed + 2)
    images = bench_data.chw_images(rng, ctx.size.image_count)
    source = bb.Source(np.dtype(np.uint8), records=images)
    sizes = np.array([im.nbytes for im in images])
    batch = ctx.size.image_batch
    batches = bench_data.uniform_plan(rng, len(images), batch, ctx.size.plan_batches)
    plan = Plan(batches, [int(sizes[b].sum()) for b in batches], int(sizes.sum()))
    key = "image-store"
    rows = Measurement(key, _image_backends(source), plan, ctx.options(key), ctx.log).run()
    title = (
        f"variable-size CHW uint8 images (sides 64..512), {len(images)} images, {plan.logical_bytes / MIB:.1f} MiB, "
        f"batch {batch}, returned as a list of (3, H, W) arrays, {ctx.repeat} rounds (no SPEC §9 target)"
    )
    return [_section(key, title, rows, "numpy flat+offsets list", [])]


# ----------------------------------------------------------------------------- sampler


class NumpyIntegers(Backend):
    """`rng.integers(0, n, 256)` per call from one `numpy.random.default_rng()`: the baseline."""

    group = "baseline"
    codec = "-"
    writes = False

    def __init__(self, length: int):
        self.name = "numpy default_rng().integers"
        self.length = length

    def open(self, directory) -> None:
        self.rng = np.random.default_rng(0)

    def fetch(self, indices) -> np.ndarray:
        return self.rng.integers(0, self.length, BATCH_SIZE)

    def validate(self, output, indices) -> None:
        _check_batch(output, self.length, self.name)


def _check_batch(output, length: int, what: str) -> None:
    if not isinstance(output, np.ndarray) or output.dtype != np.int64 or output.shape != (BATCH_SIZE,):
        raise ValidationError(f"{what}: want int64[{BATCH_SIZE}], got {getattr(output, 'dtype', type(output))} {getattr(output, 'shape', '')}")
    if output.min() < 0 or output.max() >= length:
        raise ValidationError(f"{what}: index out of 0..{length}")


class LoaderxSampler(Backend):
    """`Sampler(n, 256, mode).next()` per call. Opening also checks each mode's meaning
    on a small index space: SEQUENTIAL counts up, CYCLIC repeats nothing within a
    cycle, and every mode is the pure function of (seed, step) that `at` exposes."""

    group = "loaderx"
    codec = "-"
    writes = False

    def __init__(self, length: int, mode: str):
        self.name = f"loaderx Sampler {mode}"
        self.length = length
        self.mode = mode

    def prepare(self) -> None:
        self.module = import_or_missing("loaderx.zsampler")

    def open(self, directory) -> None:
        Sampler = self.module.Sampler
        self._check_semantics(Sampler)
        self.sampler = Sampler(self.length, BATCH_SIZE, mode=getattr(Sampler.Mode, self.mode), seed=0)

    def _check_semantics(self, Sampler) -> None:
        mode = getattr(Sampler.Mode, self.mode)
        small = Sampler(1000, BATCH_SIZE, mode=mode, seed=7)
        steps = [small.next() for _ in range(3)]
        for step, batch in enumerate(steps):
            check_array(np.asarray(batch), np.asarray(small.at(step)), f"{self.name} at({step}) vs next()")
        stacked = np.concatenate(steps)
        if self.mode == "SEQUENTIAL":
            check_array(stacked, np.arange(3 * BATCH_SIZE, dtype=np.int64), f"{self.name} order")
        if self.mode == "CYCLIC" and len(np.unique(stacked)) != len(stacked):
            raise ValidationError(f"{self.name}: repeated an index within one cycle")

    def fetch(self, indices) -> np.ndarray:
        return self.sampler.next()

    def validate(self, output, indices) -> None:
        _check_batch(output, self.length, self.name)


def _sampler_table(rows: list[Row], reference: Row | None) -> list[str]:
    width = max(len(r.name) for r in rows)
    head = f"  {'sampler':<{width}} {'calls/s':>10} {'indices/s':>10} {'p95 us/call':>12} {'vs numpy':>9}"
    lines = [head, "  " + "-" * (len(head) - 2)]
    for row in rows:
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        calls = row.median("records_s") / BATCH_SIZE
        versus = paired_ratio(row, [reference], metric="records_s")
        p95 = row.p95_ms()
        lines.append(
            f"  {row.name:<{width}} {fmt_count(calls):>10} {fmt_count(row.median('records_s')):>10}"
            f" {fmt(None if p95 is None else p95 * 1e3, '.2f'):>12} {fmt(versus, '.2f') + 'x' if versus else '-':>9}"
        )
    return lines


def run_sampler(ctx: Context) -> list[Section]:
    modes = ("SEQUENTIAL", "IID", "CYCLIC")
    backends = [NumpyIntegers(SAMPLER_LENGTH)] + [LoaderxSampler(SAMPLER_LENGTH, m) for m in modes]
    dummy = np.zeros(BATCH_SIZE, dtype=np.int64)
    calls = ctx.size.sampler_calls
    plan = Plan([dummy] * calls, [BATCH_SIZE * 8] * calls, SAMPLER_LENGTH * 8)
    key = "sampler"
    # Calls are a few microseconds: time them in chunks of 64 so the clock stays out of the figure.
    options = ctx.options(key, budget_s=ctx.size.budget_s * 2, chunk=64)
    options.min_batches = min(calls, 64)
    rows = Measurement(key, backends, plan, options, ctx.log).run()
    targets = [
        Target(f"sampler {m} batch {BATCH_SIZE} vs numpy integers", f"loaderx Sampler {m}", ["numpy default_rng().integers"], 3.0, metric="records_s")
        for m in modes
    ]
    named = _named(rows)
    for target in targets:
        target.evaluate(named)
    title = f"sampler alone: one batch of {BATCH_SIZE} indices per call over n = {SAMPLER_LENGTH:,}, {ctx.repeat} rounds"
    lines = [f"== {title} =="] + _sampler_table(rows, named.get("numpy default_rng().integers"))
    lines.append("  SPEC §9 targets (median of per-round ratios):")
    lines.extend(t.line() for t in targets)
    return [Section(key, title, lines, rows, targets)]
