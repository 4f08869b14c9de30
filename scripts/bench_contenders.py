"""The loaders users pick, each through its documented public API (child side).

This file runs inside fresh child processes, some of them from a private venv
(bench_venvs), so it imports nothing of loaderx at module level: only numpy,
the standard library and, inside each function, the contender itself.

Two entry points:
  * `python bench_contenders.py build KIND DATA_DIR`: writes KIND's own format
    (MosaicML MDS shards, a LitData optimized dataset, WebDataset tar shards, a
    Hugging Face `save_to_disk` folder, a Lance dataset) from DATA_DIR/x.npy and DATA_DIR/y.npy
    and prints one JSON line;
  * `SOURCES`: for the loader layer's child (bench_loader.child_main), one
    function per contender that returns `(next_batch, close)`, where a batch
    is `{"x": (B, 64, 64, 3) uint8, "y": (B,) int64}` as numpy or torch tensors.

Every contender reads the same records; y[i] = 7 i + 3 names the record, so the
parent validates what each one delivers (bench_loader._validate).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench_harness import child_reason

ITEM_SHAPE = (64, 64, 3)
WDS_SHARD_RECORDS = 1024
MDS_SHARD_BYTES = 1 << 26
LITDATA_CHUNK_BYTES = "64MB"
SHUFFLE_BUFFER = 1000

_ARRAYS: dict = {}  # x and y of the data set being written, per LitData worker process


def _load(data: Path) -> tuple[np.ndarray, np.ndarray]:
    x = np.load(data / "x.npy", mmap_mode="r")
    y = np.load(data / "y.npy")
    return x, y


def _total_records(cfg: dict) -> int:
    """Records a run may ask for, so loaders with epochs are given one long enough."""
    # The warm-up may take up to `batches` too (bench_loader._warm_up).
    return (2 * cfg["batches"] + cfg["warmup"] + 8) * cfg["batch_size"]


def _endless(make_iterator):
    """Restarts an epoch-based loader when an epoch ends (its cost counts, as users pay it)."""

    def batches():
        while True:
            for batch in make_iterator():
                yield batch

    return batches()


# ============================================================================ builders


def build_mds(data: Path) -> None:
    """MosaicML Streaming: MDS shards, uncompressed, columns x (ndarray) and y (int64)."""
    from streaming import MDSWriter

    x, y = _load(data)
    columns = {"x": "ndarray:uint8:" + ",".join(map(str, ITEM_SHAPE)), "y": "int64"}
    with MDSWriter(
        out=str(data / "mds"), columns=columns, compression=None, size_limit=MDS_SHARD_BYTES
    ) as writer:
        for i in range(len(x)):
            writer.write({"x": np.asarray(x[i]), "y": np.int64(y[i])})


def _litdata_item(data: str, i: int) -> dict:
    """One record for LitData's `optimize`; its worker processes are spawned, so each
    maps the .npy files itself, once."""
    if _ARRAYS.get("data") != data:
        _ARRAYS.update(
            data=data,
            x=np.load(Path(data) / "x.npy", mmap_mode="r"),
            y=np.load(Path(data) / "y.npy"),
        )
    return {"x": np.asarray(_ARRAYS["x"][i]), "y": int(_ARRAYS["y"][i])}


def build_litdata(data: Path) -> None:
    """LitData: `optimize` of one dict per record into 64 MB chunks, one worker process."""
    from litdata import optimize

    count = len(np.load(data / "y.npy"))
    optimize(
        fn=functools.partial(_litdata_item, str(data)),
        inputs=list(range(count)),
        output_dir=str(data / "litdata"),
        chunk_bytes=LITDATA_CHUNK_BYTES,
        num_workers=1,
        mode="overwrite",
        verbose=False,
    )


def build_wds(data: Path) -> None:
    """WebDataset: tar shards of WDS_SHARD_RECORDS samples, x as .npy and y as .cls."""
    import webdataset as wds

    x, y = _load(data)
    (data / "wds").mkdir(exist_ok=True)
    pattern = str(data / "wds" / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=WDS_SHARD_RECORDS, verbose=0) as writer:
        for i in range(len(x)):
            writer.write({"__key__": f"{i:08d}", "x.npy": np.asarray(x[i]), "y.cls": int(y[i])})


def build_hf(data: Path) -> None:
    """Hugging Face datasets: `Dataset.from_dict` with an Array3D feature, `save_to_disk`."""
    import datasets

    x, y = _load(data)
    features = datasets.Features(
        {"x": datasets.Array3D(shape=ITEM_SHAPE, dtype="uint8"), "y": datasets.Value("int64")}
    )
    table = datasets.Dataset.from_dict({"x": np.asarray(x), "y": y}, features=features)
    table.save_to_disk(str(data / "hf"))


def build_lance(data: Path) -> None:
    """Lance: one dataset, x as fixed_size_list<uint8>[12288] (stored raw), y as int64."""
    import lance
    import pyarrow as pa

    x, y = _load(data)
    width = int(np.prod(ITEM_SHAPE))
    flat = pa.array(np.ascontiguousarray(x).reshape(-1))
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(flat, width), "y": pa.array(y)})
    lance.write_dataset(table, str(data / "lance"))


BUILDERS = {"mds": build_mds, "litdata": build_litdata, "wds": build_wds, "hf": build_hf,
            "lance": build_lance}
BUILD_MODULES = {"mds": "streaming", "litdata": "litdata", "wds": "webdataset", "hf": "datasets",
                 "lance": "lance"}


def build_main(kind: str, data: str) -> int:
    try:
        __import__(BUILD_MODULES[kind])
    except Exception as exc:  # an optional contender: any import failure means "missing"
        print(json.dumps({"status": "missing", "reason": child_reason(exc)}))
        return 0
    start = time.perf_counter()
    try:
        BUILDERS[kind](Path(data))
    except Exception as exc:  # reported as a "failed" row by the parent
        print(json.dumps({"status": "failed", "reason": child_reason(exc, "build: ")}))
        return 0
    print(json.dumps({"status": "ok", "seconds": time.perf_counter() - start}))
    return 0


# ============================================================================ sources


def mds_source(cfg: dict):
    """`StreamingDataset(local=..., shuffle=True)` (its default py1e shuffle) in its
    `StreamingDataLoader`; epoch_size covers the whole run, so there is one epoch."""
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a killed earlier child may have left its /dev/shm names
    dataset = StreamingDataset(
        local=str(Path(cfg["data"]) / "mds"),
        shuffle=True,
        shuffle_seed=0,
        batch_size=cfg["batch_size"],
        epoch_size=_total_records(cfg),
    )
    workers = cfg["workers"]
    loader = StreamingDataLoader(
        dataset,
        batch_size=cfg["batch_size"],
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        drop_last=True,
    )
    iterator = iter(loader)

    def close() -> None:
        del loader._iterator
        clean_stale_shared_memory()

    return (lambda: next(iterator)), close


def litdata_source(cfg: dict):
    """`StreamingDataset(dir, shuffle=True)` (chunk-wise shuffle) in `StreamingDataLoader`,
    restarted at each epoch end (persistent workers keep the processes)."""
    from litdata import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(
        str(Path(cfg["data"]) / "litdata"), shuffle=True, seed=0, drop_last=True
    )
    workers = cfg["workers"]
    loader = StreamingDataLoader(
        dataset,
        batch_size=cfg["batch_size"],
        num_workers=workers,
        persistent_workers=bool(workers),
        drop_last=True,
    )
    batches = _endless(lambda: loader)
    return (lambda: next(batches)), (lambda: None)


def wds_source(cfg: dict):
    """`WebDataset(shards, resampled=True)` with a SHUFFLE_BUFFER sample shuffle, decoded
    (.npy, .cls) and batched in the pipeline, in a `WebLoader`."""
    import webdataset as wds

    shards = sorted(str(p) for p in (Path(cfg["data"]) / "wds").glob("shard-*.tar"))
    pipeline = (
        wds.WebDataset(shards, resampled=True, shardshuffle=False, seed=0, nodesplitter=None)
        .shuffle(SHUFFLE_BUFFER)
        .decode()
        .to_tuple("x.npy", "y.cls")
        .batched(cfg["batch_size"], partial=False)
    )
    workers = cfg["workers"]
    loader = wds.WebLoader(
        pipeline, batch_size=None, num_workers=workers, prefetch_factor=2 if workers else None
    )
    iterator = iter(loader)
    return (lambda: _as_dict(next(iterator))), (lambda: None)


def _as_dict(pair) -> dict:
    return {"x": pair[0], "y": pair[1]}


def hf_source(cfg: dict):
    """`load_from_disk(dir).with_format("numpy")` and one random batch `ds[indices]` per step.

    HF's numpy format returns integer columns as int64 (8x the bytes of the uint8
    pixels); the batch is cast back to uint8, as a user of these pixels must."""
    import datasets

    table = datasets.load_from_disk(str(Path(cfg["data"]) / "hf")).with_format("numpy")
    rng = np.random.default_rng(0)
    length, batch_size = len(table), cfg["batch_size"]

    def get() -> dict:
        batch = table[rng.integers(0, length, batch_size).tolist()]
        return {"x": batch["x"].astype(np.uint8), "y": batch["y"]}

    return get, (lambda: None)


def lance_source(cfg: dict):
    """`lance.dataset(dir).take(indices)` of one random batch per step, the columns viewed
    as numpy (x: the fixed_size_list's values, no per-record copy)."""
    import lance

    dataset = lance.dataset(str(Path(cfg["data"]) / "lance"))
    rng = np.random.default_rng(0)
    length, batch_size = dataset.count_rows(), cfg["batch_size"]

    def get() -> dict:
        table = dataset.take(rng.integers(0, length, batch_size), columns=["x", "y"])
        x = table.column("x").combine_chunks().values.to_numpy()
        return {"x": x.reshape(batch_size, *ITEM_SHAPE), "y": table.column("y").to_numpy()}

    return get, (lambda: None)


def loaderx_store_source(cfg: dict):
    """loaderx DenseStore random batch access, `store[indices]` per stream (the HF idiom)."""
    from loaderx.zrecord import DenseStore

    data = Path(cfg["data"])
    sx, sy = DenseStore(str(data / "lx_x")), DenseStore(str(data / "lx_y"))
    rng = np.random.default_rng(0)
    length, batch_size = len(sx), cfg["batch_size"]

    def get() -> dict:
        indices = rng.integers(0, length, batch_size)
        return {"x": sx[indices], "y": sy[indices]}

    def close() -> None:
        sx.close()
        sy.close()

    return get, close


def loaderx_copy_source(cfg: dict):
    """The copy limit of the loader row: the same random batches gathered with `gather(out=)`
    into reused buffers on every lane, indices drawn ahead of time, no sampler and no ring. Any
    loader of these batches makes at least this one copy of each, so its rate bounds what a
    loader can reach on this machine (the consumer's own thread then competes for the cores)."""
    from loaderx.zrecord import DenseStore

    data = Path(cfg["data"])
    sx, sy = DenseStore(str(data / "lx_x")), DenseStore(str(data / "lx_y"))
    rng = np.random.default_rng(0)
    length, batch_size = len(sx), cfg["batch_size"]
    batches = [rng.integers(0, length, batch_size) for _ in range(64)]
    outs = [
        (np.empty((batch_size, *sx.item_shape), sx.dtype), np.empty(batch_size, sy.dtype))
        for _ in range(2)
    ]
    count = [0]

    def get() -> dict:
        indices, (x, y) = batches[count[0] % 64], outs[count[0] % 2]
        count[0] += 1
        sx.gather(indices, out=x)
        sy.gather(indices, out=y)
        return {"x": x, "y": y}

    def close() -> None:
        sx.close()
        sy.close()

    return get, close


_C_COPY = r"""
#include <emmintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* A batch's rows copied by `threads` threads (the caller and helpers spinning
   on a generation counter), each a contiguous share of the rows, with SSE2
   non-temporal (streaming) stores into 64-byte-aligned destinations. */

typedef struct {
    const uint8_t *x; const int64_t *y; size_t row_bytes;
    const int64_t *idx; size_t n; uint8_t *dst_x; int64_t *dst_y;
} Job;

static Job job;
static size_t threads = 1;
static atomic_ulong generation, done;
static atomic_int stopping;
static pthread_t helpers[64];

static void copy_row(uint8_t *dst, const uint8_t *src, size_t n) {
    size_t at = 0;
    for (; at + 64 <= n; at += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + at));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + at + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + at + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + at + 48));
        _mm_stream_si128((__m128i *)(dst + at), a);
        _mm_stream_si128((__m128i *)(dst + at + 16), b);
        _mm_stream_si128((__m128i *)(dst + at + 32), c);
        _mm_stream_si128((__m128i *)(dst + at + 48), d);
    }
    memcpy(dst + at, src + at, n - at);
}

static void share(size_t t) {
    size_t from = job.n * t / threads, to = job.n * (t + 1) / threads;
    for (size_t i = from; i < to; i++) {
        copy_row(job.dst_x + i * job.row_bytes, job.x + (size_t)job.idx[i] * job.row_bytes,
                 job.row_bytes);
        job.dst_y[i] = job.y[job.idx[i]];
    }
    _mm_sfence();
}

static void *helper(void *arg) {
    size_t t = (size_t)arg;
    unsigned long seen = 0;
    for (;;) {
        unsigned long g;
        while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen) {
            if (atomic_load_explicit(&stopping, memory_order_relaxed)) return 0;
            _mm_pause();
        }
        seen = g;
        share(t);
        atomic_fetch_add_explicit(&done, 1, memory_order_release);
    }
}

int copy_start(size_t n_threads) {
    threads = n_threads < 1 ? 1 : n_threads > 64 ? 64 : n_threads;
    for (size_t t = 1; t < threads; t++)
        if (pthread_create(&helpers[t], 0, helper, (void *)t)) return -1;
    return 0;
}

void copy_batch(const uint8_t *x, const int64_t *y, size_t row_bytes,
                const int64_t *idx, size_t n, uint8_t *dst_x, int64_t *dst_y) {
    job = (Job){x, y, row_bytes, idx, n, dst_x, dst_y};
    atomic_store_explicit(&done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    share(0);
    while (atomic_load_explicit(&done, memory_order_acquire) != threads - 1) _mm_pause();
}

void copy_stop(void) {
    atomic_store(&stopping, 1);
    for (size_t t = 1; t < threads; t++) pthread_join(helpers[t], 0);
}
"""


def _compile_c(source: str, name: str) -> str:
    """A shared library built from C `source` with zig's clang (the test extra's
    ziglang) or else the system's cc, at -O2, into a temporary directory."""
    import subprocess
    import tempfile

    folder = tempfile.mkdtemp(prefix="bench-c-")
    src, lib = os.path.join(folder, f"{name}.c"), os.path.join(folder, f"lib{name}.so")
    with open(src, "w") as f:
        f.write(source)
    tried = []
    for compiler in ([sys.executable, "-m", "ziglang", "cc"], ["cc"]):
        try:
            subprocess.run([*compiler, "-O2", "-shared", "-fPIC", "-pthread", "-o", lib, src],
                           check=True, capture_output=True, timeout=300)
            return lib
        except (OSError, subprocess.SubprocessError) as exc:
            tried.append(f"{' '.join(compiler)}: {type(exc).__name__}")
    raise RuntimeError(f"no C compiler built the copy loop ({'; '.join(tried)})")


def c_copy_source(cfg: dict):
    """A plain C streaming copy: the same random batches (indices drawn ahead of time) copied
    row by row from the memory-mapped .npy files into two reused page-aligned buffers by as
    many threads as the loader has workers (the usable cores), each a share of the rows, with
    non-temporal (streaming) stores, the helpers spinning between batches. No store, no
    sampler, no ring, no hand-over: the copy-limit row's counterpart without loaderx."""
    import cffi

    x, y = _load(Path(cfg["data"]))
    x = np.asarray(x)  # (np.load's memmap -> its ndarray view of the mapping)
    row_bytes = int(np.prod(x.shape[1:])) * x.itemsize
    if row_bytes % 16:  # (_mm_stream_si128 stores to 16-byte-aligned addresses only)
        raise ValueError(f"C streaming copy: rows of {row_bytes} bytes are not 16-byte multiples")
    ffi = cffi.FFI()
    ffi.cdef("int copy_start(size_t n_threads); void copy_stop(void);"
             " void copy_batch(const uint8_t *x, const int64_t *y, size_t row_bytes,"
             " const int64_t *idx, size_t n, uint8_t *dst_x, int64_t *dst_y);")
    lib = ffi.dlopen(_compile_c(_C_COPY, "benchcopy"))
    if lib.copy_start(len(os.sched_getaffinity(0))) != 0:
        raise RuntimeError("copy_start: pthread_create failed")
    rng = np.random.default_rng(0)
    length, batch_size = len(x), cfg["batch_size"]
    batches = [rng.integers(0, length, batch_size).astype(np.int64) for _ in range(64)]

    def aligned(shape, dtype) -> np.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        raw = np.empty(nbytes + 4096, np.uint8)
        start = -raw.ctypes.data % 4096
        return raw[start:start + nbytes].view(dtype).reshape(shape)

    outs = [(aligned((batch_size, *x.shape[1:]), x.dtype), aligned((batch_size,), y.dtype))
            for _ in range(2)]
    for ox, oy in outs:  # (the pages are the buffers' own before the window, as a ring's are)
        ox.fill(0)
        oy.fill(0)

    def ptr(ctype: str, a: np.ndarray):
        return ffi.cast(ctype, a.ctypes.data)

    px, py = ptr("uint8_t *", x), ptr("int64_t *", y)
    count = [0]

    def get() -> dict:
        indices, (ox, oy) = batches[count[0] % 64], outs[count[0] % 2]
        count[0] += 1
        lib.copy_batch(px, py, row_bytes, ptr("int64_t *", indices), batch_size,
                       ptr("uint8_t *", ox), ptr("int64_t *", oy))
        return {"x": ox, "y": oy}

    def close() -> None:
        lib.copy_stop()
        keep.clear()

    keep = [x, y, lib]  # (the raw pointers above are into these mappings and this library)
    return get, close


# backend -> (module proving the contender imports, source function name in this file)
SOURCES = {
    "mds": ("streaming", "mds_source"),
    "litdata": ("litdata", "litdata_source"),
    "wds": ("webdataset", "wds_source"),
    "hf": ("datasets", "hf_source"),
    "lance": ("lance", "lance_source"),
    "loaderx_store": ("loaderx.zrecord", "loaderx_store_source"),
    "loaderx_copy": ("loaderx.zrecord", "loaderx_copy_source"),
    "c_copy": ("cffi", "c_copy_source"),
}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        sys.exit(build_main(sys.argv[2], sys.argv[3]))
    sys.exit("usage: bench_contenders.py build KIND DATA_DIR (started by scripts/bench.py)")
