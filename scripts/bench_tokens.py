"""The tokens layer: fixed-length token windows for language-model training.

The data: int32 token documents (lognormal lengths, Zipf ids; bench_data)
concatenated in store order into one stream T. Window i of length L is
T[i*L : i*L + L + 1] (L + 1 tokens: inputs and the shifted targets), and a
batch is B = 32 windows of L = 2048. Rows, each run in a fresh process:

  * numpy memmap get_batch: nanoGPT's loop, `np.stack` of B slices of a
    memory-mapped flat token array at random window-aligned offsets;
  * loaderx TokenWindows: `tw[idx]`, `tw.gather(idx, out=buf)` and
    `DataLoader({"tokens": tw}, batch_size=32, seed=0)` over a raw RaggedStore
    of the documents, and `tw[idx]` over a zstd one;
  * the zstd limit: zstandard's C batch API (`multi_decompress_to_buffer`) on
    one thread per core, each decoding whole batches of exactly the frames
    the same random windows overlap (documents cut into frames of 4 KiB, each
    its own level-3 frame, as loaderx stores them by default); nothing is
    copied into windows, so this is what any reader of that layout must at
    least spend;
  * LitData: `optimize(..., item_loader=TokensLoader())` of the documents, read
    with `StreamingDataset(item_loader=TokensLoader(block_size=L + 1),
    shuffle=True)` in a `StreamingDataLoader` (its private venv). LitData cuts
    blocks of L + 1 tokens without overlap inside each chunk, so its rows are
    checked to be exact contiguous slices of T, not aligned windows.

The real-corpus section (issue 24): the sources of this Python's standard
library (`Lib/`, every .py file outside site-packages: 1,790 files for
CPython 3.11) tokenized with a byte-level BPE of 8,192 ids trained here with
`tokenizers` (no download), one document per file, uint16, B = 32 windows of
L = 1024. Rows:

  * nanoGPT's get_batch as train.py has it (the literal baseline): the
    `train.bin` memmap opened again on every call, B random offsets,
    `torch.from_numpy(data[i:i+L].astype(np.int64))` for x and y, `torch.stack`;
  * today's simplified one: `np.stack` of window-aligned uint16 slices of one
    memmap (the synthetic section's "numpy" row);
  * `DataLoader({"tokens": TokenWindows(store, 1024)}, batch_size=32)` over the
    documents stored three ways: raw; the default (zstd, long documents in
    4 KiB seekable frames); zstd with one frame per document (the layout
    before bounded decode, for context).

A row is (B, L + 1) tokens; the literal baseline's x and y are checked as one
such row (x then y's last token) at its random offset.

Validation is exact: the child sends, for its first batches, the dtype, the
shape, and per row the first tokens and a digest of all L + 1 tokens; the
parent finds the row in T (at the claimed window when the child knows it, at
some window-aligned offset for the loader, at any offset for LitData) and
compares digests.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import bench_data
from bench_harness import (
    table_line,
    child_reason,
    MIB,
    OFFLINE,
    Row,
    Section,
    Target,
    Unavailable,
    ValidationError,
    fmt,
    paired_ratio,
    run_child_json,
    short_error,
)

SEQ_LEN = 2048
BATCH = 32
CHECKED_BATCHES = 2
PREFIX = 8  # tokens of each checked row sent to the parent to find the row in the stream
LITDATA_CHUNK_WINDOWS = 256
LIMIT_PLAN = 64  # batches of windows the zstd limit row prepares and cycles through


def _digest(row: np.ndarray) -> str:
    return hashlib.blake2b(
        np.ascontiguousarray(row, dtype=np.int32).data, digest_size=16
    ).hexdigest()


# ============================================================================ child side


def _numpy_source(cfg: dict):
    """nanoGPT's get_batch: B window-aligned random offsets, np.stack of memmap slices."""
    data = np.load(Path(cfg["data"]) / "flat.npy", mmap_mode="r")
    length, rng = cfg["seq_len"], np.random.default_rng(0)
    windows = (len(data) - 1) // length

    def get():
        ix = rng.integers(0, windows, cfg["batch_size"])
        return np.stack([data[i * length : i * length + length + 1] for i in ix.tolist()]), ix

    return get, (lambda: None)


def _token_windows(cfg: dict):
    from loaderx import RaggedStore, TokenWindows

    name = "lx_tokens_zstd" if cfg["backend"] == "tw_zstd" else "lx_tokens"
    store = RaggedStore(str(Path(cfg["data"]) / name))
    return store, TokenWindows(store, seq_len=cfg["seq_len"])


def _tw_source(cfg: dict):
    """`tw[idx]` (a fresh array; backend "tw_zstd": over the zstd store) or, with
    backend "tw_gather", `tw.gather(idx, out=buf)`."""
    store, tw = _token_windows(cfg)
    rng, batch = np.random.default_rng(0), cfg["batch_size"]
    buffer = np.empty((batch, cfg["seq_len"] + 1), dtype=np.int32)

    def get():
        ix = rng.integers(0, len(tw), batch)
        if cfg["backend"] == "tw_gather":
            tw.gather(ix, out=buffer)
            return buffer, ix
        return tw[ix], ix

    return get, store.close


def _tw_loader_source(cfg: dict):
    from loaderx import DataLoader

    store, tw = _token_windows(cfg)
    loader = DataLoader({"tokens": tw}, batch_size=cfg["batch_size"], seed=0)
    iterator = iter(loader)

    def close() -> None:
        loader.close()
        store.close()

    return (lambda: (next(iterator)["tokens"], None)), close


def _zstd_limit_source(cfg: dict):
    """Decodes the documents that B random windows overlap, on every core: one
    thread per core, each decoding whole batches with zstandard's C batch API
    (`multi_decompress_to_buffer(threads=1)`; its own threads=N spawns threads per
    call and measured slower than one thread here). Each call decodes one batch per
    core (`get.batches_per_call`). Inputs (the frames of those documents) are made
    before the first batch for a cycle of LIMIT_PLAN batches, so no Python work is
    timed. Only the first CHECKED_BATCHES batches are also put together as windows
    (for validation); timed batches only decode. With `cfg["frame_bytes"]`, each
    document is cut into frames of that many bytes and a window decodes only the
    frames it overlaps (the seekable layout's least work)."""
    from concurrent.futures import ThreadPoolExecutor

    import zstandard

    data = Path(cfg["data"])
    flat = np.load(data / "flat.npy", mmap_mode="r")
    splits = np.load(data / "splits.npy")
    step = cfg.get("frame_bytes", 0) // flat.dtype.itemsize
    # Pieces: whole documents, or their frames; piece k holds tokens [cuts[k], cuts[k + 1]).
    cuts = sorted({int(x) for d in range(len(splits) - 1)
                   for x in range(int(splits[d]), int(splits[d + 1]), step or 1 << 62)}
                  | {int(splits[-1])})
    cuts = np.array(cuts, dtype=np.int64)
    compressor = zstandard.ZstdCompressor(level=3)
    frames = [compressor.compress(flat[cuts[k] : cuts[k + 1]].tobytes()) for k in range(len(cuts) - 1)]
    sizes = np.array([len(f) for f in frames], dtype=np.uint64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    joined = b"".join(frames)
    length, batch, threads = cfg["seq_len"], cfg["batch_size"], len(os.sched_getaffinity(0))
    windows = (int(splits[-1]) - 1) // length
    rng, plan = np.random.default_rng(0), []
    for _ in range(LIMIT_PLAN):
        ix = rng.integers(0, windows, batch)
        first = np.searchsorted(cuts, ix * length, side="right") - 1
        last = np.searchsorted(cuts, ix * length + length + 1, side="left") - 1
        pieces = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
        segments = np.stack([starts[pieces], sizes[pieces]], axis=1).tobytes()
        plan.append((ix, first, last, pieces, zstandard.BufferWithSegments(joined, segments)))
    decompressors = [zstandard.ZstdDecompressor() for _ in range(threads)]
    pool = ThreadPoolExecutor(max_workers=threads)
    served = [0]

    def decode(k: int, frames_in):
        return decompressors[k].multi_decompress_to_buffer(frames_in, threads=1)

    def get():
        at = served[0] * threads
        batches = [plan[(at + k) % LIMIT_PLAN] for k in range(threads)]
        futures = [pool.submit(decode, k, b[4]) for k, b in enumerate(batches)]
        outs = [f.result() for f in futures]
        ix, first, last, pieces, _frames = batches[0]
        out = outs[0]
        served[0] += 1
        if served[0] > CHECKED_BATCHES:
            return None, ix
        decoded = {int(p): np.frombuffer(out[k].tobytes(), flat.dtype) for k, p in enumerate(pieces)}
        rows = []
        for i, a, b in zip(ix.tolist(), first.tolist(), last.tolist()):
            tokens = np.concatenate([decoded[p] for p in range(a, b + 1)])
            offset = i * length - int(cuts[a])
            rows.append(tokens[offset : offset + length + 1])
        return np.stack(rows), ix

    get.batches_per_call = threads  # type: ignore[attr-defined]
    return get, pool.shutdown


def _litdata_source(cfg: dict):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    dataset = StreamingDataset(
        str(Path(cfg["data"]) / "litdata_tokens"),
        item_loader=TokensLoader(block_size=cfg["seq_len"] + 1),
        shuffle=True,
        drop_last=True,
        seed=0,
    )
    workers = cfg["workers"]
    loader = StreamingDataLoader(
        dataset,
        batch_size=cfg["batch_size"],
        num_workers=workers,
        persistent_workers=bool(workers),
        drop_last=True,
    )

    def batches():
        while True:  # an epoch ends; users restart it, and so does the bench (its cost counts)
            yield from loader

    iterator = batches()
    return (lambda: (next(iterator), None)), (lambda: None)


# ---------------------------------------------------------------- the real corpus

REAL_SEQ_LEN = 1024
REAL_VOCAB = 8192
# The stores of the real corpus: directory name -> RaggedStore arguments.
REAL_STORES = {
    "lx_raw": {"codec": "raw"},
    "lx_default": {},  # the defaults: zstd, frames of loaderx.ragged.TOKEN_FRAME_SIZE
    "lx_whole": {"codec": "zstd", "frame_size": 0},
}


def _nanogpt_source(cfg: dict):
    """nanoGPT's get_batch (train.py), CPU: the memmap is made again on every
    call (nanoGPT does so to avoid a memory leak), int64 x and y stacked."""
    import torch

    path = str(Path(cfg["data"]) / "train.bin")
    length, batch = cfg["seq_len"], cfg["batch_size"]
    torch.manual_seed(0)

    def get():
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - length, (batch,))
        x = torch.stack([torch.from_numpy((data[i : i + length]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + length]).astype(np.int64)) for i in ix])
        return (x, y), None

    return get, (lambda: None)


def _real_loader_source(cfg: dict):
    from loaderx import DataLoader, RaggedStore, TokenWindows

    store = RaggedStore(str(Path(cfg["data"]) / cfg["backend"][len("real_"):]))
    loader = DataLoader({"tokens": TokenWindows(store, cfg["seq_len"])},
                        batch_size=cfg["batch_size"], seed=0)
    iterator = iter(loader)

    def close() -> None:
        loader.close()
        store.close()

    return (lambda: (next(iterator)["tokens"], None)), close


SOURCES = {
    "numpy": ("numpy", _numpy_source),
    "real_nanogpt": ("torch", _nanogpt_source),
    "real_simple": ("numpy", _numpy_source),
    **{f"real_{name}": ("loaderx", _real_loader_source) for name in REAL_STORES},
    "real_zstd_limit": ("zstandard", _zstd_limit_source),
    "tw_index": ("loaderx", _tw_source),
    "tw_gather": ("loaderx", _tw_source),
    "tw_loader": ("loaderx", _tw_loader_source),
    "tw_zstd": ("loaderx", _tw_source),
    "zstd_limit": ("zstandard", _zstd_limit_source),
    "litdata": ("litdata", _litdata_source),
}


def _check(batch, ix) -> dict:
    if isinstance(batch, tuple):  # nanoGPT's (x, y): x then y's last token is the window
        x, y = (b.numpy() for b in batch)
        batch = np.concatenate([x, y[:, -1:]], axis=1)
    if hasattr(batch, "numpy") and not isinstance(batch, np.ndarray):
        batch = batch.numpy()
    batch = np.asarray(batch)
    rows = batch.reshape(len(batch), -1) if batch.ndim >= 1 else batch.reshape(1, -1)
    return {
        "dtype": str(batch.dtype),
        "shape": list(batch.shape),
        "prefixes": [r[:PREFIX].astype(np.int64).tolist() for r in rows],
        "digests": [_digest(r) for r in rows],
        "indices": None if ix is None else [int(i) for i in ix],
    }


def _measure(cfg: dict) -> dict:
    import bench_loader

    start = time.perf_counter()
    get, close = SOURCES[cfg["backend"]][1](cfg)
    checks = [_check(*get())]
    first_s = time.perf_counter() - start
    for _ in range(cfg["warmup"] - 1):
        batch = get()
        if len(checks) < CHECKED_BATCHES:
            checks.append(_check(*batch))
    faults, switches = bench_loader.tree_counters()
    count, start = 0, time.perf_counter()
    while count < cfg["batches"] and (count < 3 or time.perf_counter() - start < cfg["seconds"]):
        get()
        count += 1
    seconds = time.perf_counter() - start
    faults_end, switches_end = bench_loader.tree_counters()
    close()
    count *= getattr(get, "batches_per_call", 1)
    return {
        "status": "ok",
        "batches": count,
        "seconds": seconds,
        "first_batch_s": first_s,
        "faults_per_batch": (faults_end - faults) / count,
        "switches_per_batch": (switches_end - switches) / count,
        "vmhwm_bytes": bench_loader._proc_kib("/proc/self/status", "VmHWM:") * 1024,
        "checks": checks,
    }


def child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    module = SOURCES[cfg["backend"]][0]
    try:
        __import__(module)
    except ImportError as exc:
        print(json.dumps({"status": "missing", "reason": f"{type(exc).__name__}: {exc}"[:200]}))
        return 0
    try:
        if cfg["workers"]:
            import bench_loader

            with bench_loader.TreeRss() as rss:  # worker processes count in the peak
                result = _measure(cfg)
            result["vmhwm_bytes"] = max(result["vmhwm_bytes"], rss.peak_kib * 1024)
        else:
            result = _measure(cfg)
    except Exception as exc:  # reported as a "failed" row by the parent
        result = {"status": "failed", "reason": child_reason(exc)}
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # DataLoader worker pools can linger at interpreter exit; the result is out already


def _litdata_document(data: str, i: int):
    """Document i as a tensor, for LitData's `optimize` (its spawned workers map the files once)."""
    import torch

    if _DOCS.get("data") != data:
        _DOCS.update(
            data=data,
            flat=np.load(Path(data) / "flat.npy", mmap_mode="r"),
            splits=np.load(Path(data) / "splits.npy"),
        )
    return torch.from_numpy(np.array(_DOCS["flat"][_DOCS["splits"][i] : _DOCS["splits"][i + 1]]))


_DOCS: dict = {}


def build_litdata(data: str, seq_len: int) -> int:
    """LitData's documented token pipeline: one tensor per document, TokensLoader chunks."""
    try:
        from litdata import TokensLoader, optimize
    except ImportError as exc:
        print(json.dumps({"status": "missing", "reason": child_reason(exc)}))
        return 0
    start = time.perf_counter()
    try:
        documents = len(np.load(Path(data) / "splits.npy")) - 1
        optimize(
            fn=functools.partial(_litdata_document, data),
            inputs=list(range(documents)),
            output_dir=str(Path(data) / "litdata_tokens"),
            chunk_size=(seq_len + 1) * LITDATA_CHUNK_WINDOWS,
            item_loader=TokensLoader(),
            num_workers=1,
            mode="overwrite",
            verbose=False,
        )
    except Exception as exc:  # reported as a "failed" row by the parent
        print(json.dumps({"status": "failed", "reason": child_reason(exc, "build: ")}))
        return 0
    print(json.dumps({"status": "ok", "seconds": time.perf_counter() - start}))
    return 0


# ============================================================================ parent side

# backend -> (row name, workers attribute of Size or None, private venv or None)
ROWS = {
    "numpy": ("numpy memmap get_batch (nanoGPT, np.stack of slices)", None, None),
    "tw_index": ("loaderx TokenWindows tw[idx]", None, None),
    "tw_gather": ("loaderx TokenWindows gather(out=)", None, None),
    "tw_loader": ("loaderx DataLoader({'tokens': tw})", None, None),
    "tw_zstd": ("loaderx TokenWindows tw[idx], zstd store", None, None),
    "zstd_limit": ("zstd -3 decode of the windows' 4 KiB frames, all threads (zstandard)", None,
                   None),
    "litdata": ("litdata TokensLoader workers={w}", "loader_contender_workers", "litdata"),
}


# backend -> (row name, group)
REAL_ROWS = {
    "real_nanogpt": ("nanoGPT get_batch, literal (memmap per call, int64, torch.stack)", "baseline"),
    "real_simple": ("numpy memmap get_batch, simplified (np.stack of uint16 slices)", "contender"),
    "real_lx_raw": ("loaderx DataLoader, TokenWindows, raw store", "loaderx"),
    "real_lx_default": ("loaderx DataLoader, TokenWindows, default store (zstd frames)", "loaderx"),
    "real_lx_whole": ("loaderx DataLoader, TokenWindows, zstd one frame per document", "loaderx"),
    "real_zstd_limit": ("zstd -3 decode of the windows' 4 KiB frames, all threads (zstandard)",
                        "limit"),
}


def _token_frame_size() -> int:
    from loaderx.ragged import TOKEN_FRAME_SIZE

    return TOKEN_FRAME_SIZE


def stdlib_sources(limit: int | None = None) -> list[Path]:
    """This Python's standard library sources: every .py file of its `Lib/`
    outside site-packages, in path order (the first `limit` when given)."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
    )
    return files[:limit] if limit else files


def tokenize_stdlib(files: list[Path], vocab: int = REAL_VOCAB) -> list[np.ndarray]:
    """One uint16 document per file, by a byte-level BPE of `vocab` ids trained
    on those files here (`tokenizers`; nothing is downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [f.read_bytes().decode("utf-8", "replace") for f in files]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return [np.array(e.ids, dtype=np.uint16) for e in tokenizer.encode_batch(texts)]


def _prepare_real(ctx, directory: Path) -> tuple[Stream | None, dict, str]:
    """The tokenized stdlib as nanoGPT's train.bin, flat.npy/splits.npy and the
    three stores. Returns the stream, problems by backend and a description."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import tokenizers  # noqa: F401
    except ImportError as exc:
        why = f"missing: tokenizers ({short_error(exc)}; pip install '.[bench]')"
        return None, dict.fromkeys(REAL_ROWS, why), ""
    start = time.perf_counter()
    files = stdlib_sources(None if ctx.size.token_sequences >= 6000 else 60)
    docs = tokenize_stdlib(files)
    lengths = np.array([len(d) for d in docs])
    flat = np.concatenate(docs)
    flat.tofile(directory / "train.bin")
    np.save(directory / "flat.npy", flat)
    np.save(directory / "splits.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    problems, stored = {}, {}
    try:
        from loaderx import RaggedStore

        for name, kwargs in REAL_STORES.items():
            with RaggedStore(str(directory / name), np.uint16, **kwargs) as store:
                store.append(docs)
                stored[name] = store.stats()["live_bytes"]
    except Exception as exc:  # the loaderx rows then say why
        problems.update(dict.fromkeys([b for b in REAL_ROWS if b.startswith("real_lx")],
                                      f"failed: store build: {short_error(exc)}"))
    ctx.log(f"tokens: real corpus of {len(files)} files, {len(flat)} tokens, "
            f"built in {time.perf_counter() - start:.1f} s")
    sizes = ", ".join(f"{n[3:]} {stored[n] / MIB:.1f} MiB" for n in stored)
    what = (f"{len(files)} files, {len(flat) / 1e6:.2f} M tokens, documents median "
            f"{int(np.median(lengths))} / largest {int(lengths.max())} tokens; stored: {sizes}")
    return Stream(flat, REAL_SEQ_LEN), problems, what


class Stream:
    """The token stream T and a lookup of where a row of it starts."""

    def __init__(self, flat: np.ndarray, seq_len: int):
        self.flat = flat
        self.seq_len = seq_len
        self.windows = (len(flat) - 1) // seq_len

    def starts(self, prefix: list[int]) -> np.ndarray:
        """Every offset s with T[s : s + len(prefix)] == prefix, narrowing token by token."""
        width = self.seq_len + 1
        candidates = np.flatnonzero(self.flat[: len(self.flat) - width + 1] == prefix[0])
        for k, token in enumerate(prefix[1:], start=1):
            candidates = candidates[self.flat[candidates + k] == token]
        return candidates

    def check_row(
        self, prefix: list, digest: str, claimed: int | None, rule: str, what: str
    ) -> None:
        length = self.seq_len
        if claimed is not None:
            starts = [claimed * length] if 0 <= claimed < self.windows else []
        else:
            starts = [int(s) for s in self.starts(prefix)]
            if rule == "aligned":
                starts = [s for s in starts if s % length == 0]
        if not any(_digest(self.flat[s : s + length + 1]) == digest for s in starts):
            where = f"window {claimed}" if claimed is not None else f"any {rule} offset"
            raise ValidationError(
                f"{what}: row is not T[{where} : +{length + 1}] of the token stream"
            )


def _validate(result: dict, stream: Stream, backend: str, name: str) -> None:
    want_shape = [BATCH, stream.seq_len + 1]
    dtype = ("int64" if backend == "real_nanogpt" else "uint16") if backend.startswith("real_") \
        else "int32"
    for number, check in enumerate(result["checks"]):
        what = f"{name} batch {number}"
        if check["dtype"] != dtype or check["shape"] != want_shape:
            raise ValidationError(
                f"{what}: got {check['dtype']} {check['shape']}, want {dtype} {want_shape}"
            )
        rule = "any" if backend in ("litdata", "real_nanogpt") else "aligned"
        claimed = check["indices"] or [None] * len(check["digests"])
        for row, (prefix, digest, index) in enumerate(
            zip(check["prefixes"], check["digests"], claimed)
        ):
            stream.check_row(prefix, digest, index, rule, f"{what} row {row}")
    if not result["checks"]:
        raise ValidationError(f"{name}: no batch was checked")


def _prepare(ctx, directory: Path) -> tuple[Stream, dict]:
    directory.mkdir(parents=True, exist_ok=True)
    docs = bench_data.token_sequences(np.random.default_rng(ctx.seed + 4), ctx.size.token_sequences)
    splits = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=splits[1:])
    flat = np.concatenate(docs)
    np.save(directory / "flat.npy", flat)
    np.save(directory / "splits.npy", splits)
    problems = {}
    try:
        from loaderx.zrecord import RaggedStore

        with RaggedStore(str(directory / "lx_tokens"), np.int32, codec="raw") as store:
            store.append(docs)
        with RaggedStore(str(directory / "lx_tokens_zstd"), np.int32, codec="zstd") as store:
            store.append(docs)
    except Exception as exc:  # the loaderx rows then say why
        problems["loaderx"] = f"failed: store build: {short_error(exc)}"
    problems.update(_build_litdata(ctx, directory))
    return Stream(flat, SEQ_LEN), problems


def _build_litdata(ctx, directory: Path) -> dict:
    try:
        python = ctx.venvs.python("litdata") if ctx.venvs is not None else None
    except Unavailable as exc:
        return {"litdata": str(exc)}
    if python is None:
        return {"litdata": "missing: private venv 'litdata' not configured"}
    argv = [python, str(Path(__file__).resolve()), "build", str(directory), str(SEQ_LEN)]
    result = run_child_json(argv, timeout_s=1800, env=OFFLINE)
    if result["status"] != "ok":
        return {"litdata": f"{result['status']}: {result['reason']}"}
    ctx.log(f"tokens: litdata optimize {result['seconds']:.1f} s")
    return {}


def _configs(ctx) -> list[tuple[str, int | None]]:
    configs = []
    for backend, (_name, workers_attr, _venv) in ROWS.items():
        configs.extend(
            (backend, w) for w in (getattr(ctx.size, workers_attr) if workers_attr else (None,))
        )
    return configs


def _one_run(ctx, cfg, row: Row, extra: dict, directory: Path, stream: Stream) -> None:
    backend, workers = cfg
    venv = ROWS[backend][2] if backend in ROWS else None
    try:
        python = ctx.venvs.python(venv) if venv else sys.executable
    except Unavailable as exc:
        row.status = str(exc)
        return
    child = {
        "backend": backend,
        "workers": workers,
        "data": str(directory),
        "seq_len": stream.seq_len,
        "batch_size": BATCH,
        "batches": ctx.size.loader_batches,
        "warmup": max(ctx.size.loader_warmup, CHECKED_BATCHES),
        "seconds": ctx.size.loader_seconds,
        "frame_bytes": _token_frame_size() if backend.endswith("zstd_limit") else 0,
    }
    argv = [python, str(Path(__file__).resolve()), "child", json.dumps(child)]
    result = run_child_json(argv, timeout_s=120 + 10 * ctx.size.loader_seconds, env=OFFLINE)
    if result["status"] != "ok":
        row.status = f"{result['status']}: {result['reason']}"
        return
    try:
        _validate(result, stream, backend, row.name)
    except ValidationError as exc:
        row.status = f"INVALID: {exc}"
        return
    per_s = result["batches"] / result["seconds"]
    row.records_s.append(per_s * BATCH)
    itemsize = 2 if backend.startswith("real_") else 4
    row.gather_mibs.append(per_s * BATCH * (stream.seq_len + 1) * itemsize / MIB)
    row.batches_timed = result["batches"]
    for key, value in (
        ("first_s", result["first_batch_s"]),
        ("rss", result["vmhwm_bytes"]),
        ("faults", result["faults_per_batch"]),
        ("switches", result["switches_per_batch"]),
    ):
        extra[key].append(value)
    ctx.log(f"tokens: {row.name}: {per_s:.1f} batches/s")


def run_tokens(ctx) -> list[Section]:
    directory = ctx.workdir / "tokens"
    stream, problems = _prepare(ctx, directory)
    rows = {
        cfg: Row(
            ROWS[cfg[0]][0].replace("{w}", str(cfg[1])),
            "loaderx" if cfg[0].startswith("tw") else "contender",
            "raw",
        )
        for cfg in _configs(ctx)
    }
    rows[("numpy", None)].group = "baseline"
    rows[("zstd_limit", None)].group = "limit"
    extra = {cfg: {"first_s": [], "rss": [], "faults": [], "switches": []} for cfg in rows}
    for cfg, row in rows.items():
        row.extra = extra[cfg]  # the same figures go to the JSON report
    for cfg, row in rows.items():
        problem = problems.get("loaderx" if cfg[0].startswith("tw") else cfg[0])
        row.status = problem or row.status
    for round_index in range(min(ctx.repeat, ctx.size.loader_repeat_max)):
        order = list(rows)
        shift = round_index % len(order)
        for cfg in order[shift:] + order[:shift]:
            if rows[cfg].ok:
                _one_run(ctx, cfg, rows[cfg], extra[cfg], directory, stream)
    return [_section(ctx, rows, extra, stream), run_real(ctx)]


def run_real(ctx) -> Section:
    """The real-corpus section (see the module docs), rounds interleaved."""
    directory = ctx.workdir / "tokens-real"
    stream, problems, what = _prepare_real(ctx, directory)
    rows = {b: Row(name, group, "raw") for b, (name, group) in REAL_ROWS.items()}
    extra = {b: {"first_s": [], "rss": [], "faults": [], "switches": []} for b in rows}
    for b, row in rows.items():
        row.extra = extra[b]
        row.status = problems.get(b, row.status)
    for round_index in range(min(ctx.repeat, ctx.size.loader_repeat_max)):
        order = list(rows)
        shift = round_index % len(order)
        for b in order[shift:] + order[:shift]:
            if rows[b].ok and stream is not None:
                _one_run(ctx, (b, None), rows[b], extra[b], directory, stream)
    return _real_section(ctx, rows, extra, what)


def _real_section(ctx, rows: dict, extra: dict, what: str) -> Section:
    named = {r.name: r for r in rows.values()}
    literal, raw = rows["real_nanogpt"], rows["real_lx_raw"]
    width = max(len(r.name) for r in rows.values())
    titles = ["batches/s", "MiB/s", "first s", "peak RSS MiB", "faults/b", "vs nanoGPT", "vs raw"]
    widths = [10, 8, 8, 12, 9, 10, 7]
    head = table_line(
        [("real corpus (CPython stdlib, BPE 8k)", f"<{width}")]
        + [(t, f">{w}") for t, w in zip(titles, widths)]
    )
    lines = [head, "  " + "-" * (len(head) - 2)]
    for b, row in rows.items():
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        e = extra[b]
        ratios = [paired_ratio(row, [base], "records_s") for base in (literal, raw)]
        values = [
            (row.median("records_s") / BATCH, ".1f"),
            (row.median("gather_mibs"), ".1f"),
            (np.median(e["first_s"]), ".3f"),
            (max(e["rss"]) / MIB, ".1f"),
            (np.median(e["faults"]), ".1f"),
        ]
        cells = [(format(v, spec), f">{w}") for (v, spec), w in zip(values, widths)]
        cells += [(fmt(r, ".2f") + "x" if r else "-", f">{w}") for r, w in zip(ratios, widths[5:])]
        lines.append(table_line([(row.name, f"<{width}")] + cells))
    default = REAL_ROWS["real_lx_default"][0]
    targets = [
        Target("real corpus: default-codec windows vs nanoGPT's literal get_batch", default,
               [literal.name], 2.0, metric="records_s"),
        Target("real corpus: default-codec windows vs raw-store windows", default,
               [raw.name], 0.5, metric="records_s"),
        Target("real corpus: raw-store windows vs nanoGPT's literal get_batch", raw.name,
               [literal.name], 5.0, metric="records_s"),
    ]
    limit = REAL_ROWS["real_zstd_limit"][0]
    targets += [
        Target("real corpus: default-codec windows vs all-thread zstd decode of their frames",
               default, [limit], 0.8, metric="records_s", spec=False),
        Target("real corpus: that decode alone vs raw-store windows (what zstd allows)",
               limit, [raw.name], 0.5, metric="records_s", spec=False),
    ]
    for target in targets:
        target.evaluate(named)
    lines.append("  targets (median of per-round ratios; issue 24), then context lines:")
    lines.extend(t.line() for t in targets)
    title = (f"token windows on a real corpus: B={BATCH} x (L+1={REAL_SEQ_LEN + 1}) uint16, "
             f"{what or 'not built'}, each run a fresh process, "
             f"{min(ctx.repeat, ctx.size.loader_repeat_max)} rounds")
    lines.insert(0, f"== {title} ==")
    return Section("tokens-real", title, lines, list(rows.values()), targets)


def _section(ctx, rows: dict, extra: dict, stream: Stream) -> Section:
    named = {r.name: r for r in rows.values()}
    base = rows[("numpy", None)]
    width = max(len(r.name) for r in rows.values())
    titles = ["batches/s", "MiB/s", "first s", "peak RSS MiB", "faults/b", "ctxsw/b", "vs numpy"]
    # peak RSS: VmHWM, or with worker processes the largest sampled RSS of the process tree
    widths = [10, 8, 8, 12, 9, 8, 9]
    head = table_line(
        [("token windows", f"<{width}")] + [(t, f">{w}") for t, w in zip(titles, widths)]
    )
    lines = [head, "  " + "-" * (len(head) - 2)]
    for cfg, row in rows.items():
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        e, versus = extra[cfg], paired_ratio(row, [base], "records_s")
        values = [
            (row.median("records_s") / BATCH, ".1f"),
            (row.median("gather_mibs"), ".1f"),
            (np.median(e["first_s"]), ".3f"),
            (max(e["rss"]) / MIB, ".1f"),
            (np.median(e["faults"]), ".1f"),
            (np.median(e["switches"]), ".1f"),
        ]
        cells = [(format(v, spec), f">{w}") for (v, spec), w in zip(values, widths)]
        cells.append((fmt(versus, ".2f") + "x" if versus else "-", f">{widths[-1]}"))
        lines.append(table_line([(row.name, f"<{width}")] + cells))
    litdata = [r.name for cfg, r in rows.items() if cfg[0] == "litdata"]
    targets = [
        Target(
            "token windows tw[idx] vs numpy memmap get_batch",
            ROWS["tw_index"][0],
            [base.name],
            1.0,
            metric="records_s",
        ),
        Target(
            "token windows DataLoader vs LitData TokensLoader (best)",
            ROWS["tw_loader"][0],
            litdata,
            5.0,
            metric="records_s",
        ),
        Target(
            "zstd token windows tw[idx] vs all-thread zstd decode of their frames",
            ROWS["tw_zstd"][0],
            [ROWS["zstd_limit"][0]],
            0.8,
            metric="records_s",
        ),
    ]
    for target in targets:
        target.evaluate(named)
    lines.append("  targets (median of per-round ratios; SPEC §9 and issue 16):")
    lines.extend(t.line() for t in targets)
    title = (
        f"token windows: B={BATCH} x (L+1={SEQ_LEN + 1}) int32 from {len(stream.flat) / 1e6:.1f} M"
        f" tokens ({stream.windows} windows, {len(stream.flat) * 4 / MIB:.0f} MiB), random windows,"
        f" each run a fresh process, {min(ctx.repeat, ctx.size.loader_repeat_max)} rounds"
    )
    lines.insert(0, f"== {title} ==")
    return Section("tokens", title, lines, list(rows.values()), targets)


def frame_sweep(files: int | None = None, rounds: int = 5) -> list[str]:
    """The layout measurement behind the default frame size (CHANGELOG.md,
    2026-12-02): the real corpus stored whole-document zstd, in seekable frames
    of 4 to 64 KiB, in chunk records of 4 and 8 KiB (one record per chunk), and
    raw; per layout its size and the CPU time of one batch of 32 random
    windows of 1,024 tokens read on one lane (`tw.gather(idx, out=buf,
    threads=1)`, process time, median of `rounds` interleaved rounds of 300
    batches), next to nanoGPT's literal get_batch (CPU time too)."""
    import tempfile

    import torch

    from loaderx import RaggedStore, TokenWindows

    docs = tokenize_stdlib(stdlib_sources(files))
    flat = np.concatenate(docs)
    work = Path(tempfile.mkdtemp(prefix="lx-frames-"))
    flat.tofile(work / "train.bin")
    layouts = {"raw": ({"codec": "raw"}, 0), "zstd, one frame per document": ({"frame_size": 0}, 0)}
    for kib in (4, 8, 16, 64):
        layouts[f"zstd, {kib} KiB frames"] = ({"frame_size": kib << 10}, 0)
    for kib in (4, 8):
        layouts[f"zstd, {kib} KiB chunk records"] = ({"frame_size": 0}, (kib << 10) // 2)
    sizes = {}
    for name, (kwargs, chunk) in layouts.items():
        records = docs if not chunk else [d[i:i + chunk] for d in docs for i in range(0, len(d), chunk)]
        with RaggedStore(str(work / name), np.uint16, **kwargs) as store:
            store.append(records)
            sizes[name] = store.stats()["live_bytes"]
    length, batch, n = REAL_SEQ_LEN, BATCH, 300

    def nanogpt() -> float:
        start = time.process_time()
        for _ in range(n):
            data = np.memmap(work / "train.bin", dtype=np.uint16, mode="r")
            ix = torch.randint(len(data) - length, (batch,))
            torch.stack([torch.from_numpy((data[i:i + length]).astype(np.int64)) for i in ix])
            torch.stack([torch.from_numpy((data[i + 1:i + 1 + length]).astype(np.int64)) for i in ix])
        return (time.process_time() - start) / n

    def windows(name: str) -> float:
        with RaggedStore(str(work / name)) as store:
            tw = TokenWindows(store, length)
            rng, buf = np.random.default_rng(1), np.empty((batch, length + 1), np.uint16)
            plan = [rng.integers(0, len(tw), batch) for _ in range(n)]
            for idx in plan[:30]:
                tw.gather(idx, out=buf, threads=1)
            start = time.process_time()
            for idx in plan:
                tw.gather(idx, out=buf, threads=1)
            return (time.process_time() - start) / n

    cpu: dict = {"nanoGPT get_batch, literal": []}
    for _ in range(rounds):
        cpu["nanoGPT get_batch, literal"].append(nanogpt())
        for name in layouts:
            cpu.setdefault(name, []).append(windows(name))
    shutil.rmtree(work)
    lines = [f"{len(docs)} documents, {len(flat)} tokens; B={batch}, L={length}, one lane",
             f"{'layout':<34} {'MiB':>6} {'ratio':>6} {'us CPU/batch':>13} {'vs nanoGPT':>11}"]
    base = float(np.median(cpu["nanoGPT get_batch, literal"]))
    for name, values in cpu.items():
        mib = f"{sizes[name] / MIB:6.1f}" if name in sizes else f"{flat.nbytes / MIB:6.1f}"
        ratio = f"{flat.nbytes / sizes[name]:6.2f}" if name in sizes else f"{'-':>6}"
        us = float(np.median(values))
        lines.append(f"{name:<34} {mib} {ratio} {us * 1e6:13.1f} {base / us:10.2f}x")
    return lines


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "frames":
        print("\n".join(frame_sweep(int(sys.argv[2]) if len(sys.argv) > 2 else None)))
        sys.exit(0)
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    if len(sys.argv) == 4 and sys.argv[1] == "build":
        sys.exit(build_litdata(sys.argv[2], int(sys.argv[3])))
    sys.exit(
        "usage: bench_tokens.py child CONFIG_JSON | build DATA_DIR SEQ_LEN"
        " (started by scripts/bench.py) | frames [FILES] (the frame-size sweep)"
    )
