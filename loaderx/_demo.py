"""``python -m loaderx demo``: build small stores in a temporary directory and
run the DataLoader over them, printing throughput and compression.

The data is synthetic but shaped like a real workload: image-like float32
records (smooth, so zstd has something to find), variable-length token
sequences with lognormal lengths, and int64 labels, all made from a seeded
generator so every run writes the same bytes. Nothing outlives the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, TextIO

import numpy as np

IMAGE_SHAPE = (3, 32, 32)
VOCAB_SIZE = 32000
LABEL_COUNT = 10
CHUNK_RECORDS = 2000
MIB = float(1 << 20)


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="loaderx demo",
        description="Build a small store in a temporary directory and run the loader over it.",
    )
    parser.add_argument("--records", type=int, default=20000,
                        help="records per stream (default 20000)")
    parser.add_argument("--steps", type=int, default=300, help="batches to load (default 300)")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="records per batch (default 256)")
    parser.add_argument("--workers", type=int, default=None,
                        help="loader threads (default: usable cores)")
    parser.add_argument("--seed", type=int, default=0, help="data and sampler seed (default 0)")
    args = parser.parse_args(argv)
    # Checked before anything is built: a bad --workers used to surface only
    # after the stores were written, a negative --seed as numpy's bare
    # "expected non-negative integer".
    for name, least in (("records", 1), ("steps", 1), ("batch_size", 1), ("workers", 1),
                        ("seed", 0)):
        value = getattr(args, name)
        if value is not None and value < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    return args


def _images(rng: np.random.Generator, count: int) -> np.ndarray:
    """Smooth 8x8 fields upsampled to 32x32 plus fine quantised noise."""
    coarse = rng.random((count, IMAGE_SHAPE[0], 8, 8), dtype=np.float32)
    images = np.repeat(np.repeat(coarse, 4, axis=2), 4, axis=3)
    images += rng.integers(-2, 3, size=images.shape).astype(np.float32) / 64.0
    return np.round(images * 64.0) / 64.0


def _token_records(rng: np.random.Generator, count: int) -> List[np.ndarray]:
    lengths = np.clip(rng.lognormal(mean=5.0, sigma=0.6, size=count), 1, 2048).astype(np.int64)
    # Zipf-like token ids: frequent small ids, as in real vocabularies.
    tokens = np.minimum(rng.zipf(1.3, size=int(lengths.sum())), VOCAB_SIZE - 1).astype(np.int32)
    return np.split(tokens, np.cumsum(lengths)[:-1])


def _build(root: str, records: int, seed: int) -> Dict[str, Any]:
    """Write the three streams; return the open stores and their logical sizes."""
    from loaderx.zrecord import DenseStore, RaggedStore

    images = DenseStore(os.path.join(root, "images"), np.float32, IMAGE_SHAPE, codec="zstd")
    tokens = RaggedStore(os.path.join(root, "tokens"), np.int32, codec="zstd")
    labels = DenseStore(os.path.join(root, "labels"), np.int64, ())
    logical = {"image": 0, "tokens": 0, "label": 0}
    for start in range(0, records, CHUNK_RECORDS):
        count = min(CHUNK_RECORDS, records - start)
        rng = np.random.default_rng([seed, start])
        chunk = _images(rng, count)
        images.append(chunk)
        logical["image"] += chunk.nbytes
        sequences = _token_records(rng, count)
        tokens.append(sequences)
        logical["tokens"] += sum(sequence.nbytes for sequence in sequences)
        label_chunk = rng.integers(0, LABEL_COUNT, size=count, dtype=np.int64)
        labels.append(label_chunk)
        logical["label"] += label_chunk.nbytes
    return {"streams": {"image": images, "tokens": tokens, "label": labels}, "logical": logical}


def _collate(batch: Dict[str, Any]) -> Dict[str, Any]:
    """Pad the token lists into one array (runs on the loader threads)."""
    sequences = batch["tokens"]
    lengths = np.fromiter((len(sequence) for sequence in sequences), dtype=np.int64,
                          count=len(sequences))
    padded = np.zeros((len(sequences), int(lengths.max(initial=0))), dtype=np.int32)
    for row, sequence in enumerate(sequences):
        padded[row, : len(sequence)] = sequence
    payload_bytes = batch["image"].nbytes + batch["label"].nbytes + int(lengths.sum()) * 4
    return {
        "image": batch["image"],
        "tokens": padded,
        "lengths": lengths,
        "label": batch["label"],
        "payload_bytes": payload_bytes,
    }


def _run_loader(streams: Dict[str, Any], args: argparse.Namespace,
                stdout: TextIO) -> Dict[str, float]:
    from loaderx.dataloader import DataLoader

    tty = stdout.isatty()
    payload_bytes = 0
    with DataLoader(
        streams, args.batch_size, seed=args.seed, workers=args.workers, transform=_collate
    ) as loader:
        workers, prefetch = loader.workers, loader.prefetch
        start = time.perf_counter()
        shown = start
        for step in range(args.steps):
            batch = next(loader)
            payload_bytes += batch["payload_bytes"]
            now = time.perf_counter()
            if tty and (now - shown > 0.1 or step + 1 == args.steps):
                shown = now
                rate = (step + 1) / max(now - start, 1e-9)
                stdout.write(f"\r  loading: step {step + 1}/{args.steps}  {rate:,.0f} batches/s ")
                stdout.flush()
        elapsed = time.perf_counter() - start
    if tty:
        stdout.write("\n")
    return {"elapsed": elapsed, "payload_bytes": payload_bytes, "workers": workers,
            "prefetch": prefetch}


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m loaderx demo``; returns the exit status."""
    args = _parse(argv)
    stdout = sys.stdout
    with tempfile.TemporaryDirectory(prefix="loaderx-demo-") as root:
        start = time.perf_counter()
        built = _build(root, args.records, args.seed)
        build_s = time.perf_counter() - start
        streams = built["streams"]
        try:
            logical_total = sum(built["logical"].values())
            print(
                f"built 3 streams of {args.records:,} records ({logical_total / MIB:,.1f} MiB) "
                f"in {build_s:.2f} s ({logical_total / MIB / build_s:,.0f} MiB/s) under {root}",
                file=stdout,
            )
            for name, store in streams.items():
                stats = store.stats()
                ratio = (built["logical"][name] / stats["chunk_bytes"] if stats["chunk_bytes"]
                         else float("nan"))
                print(
                    f"  {name:<7} {store.kind:<6} {str(np.dtype(store.dtype)):<8} "
                    f"{built['logical'][name] / MIB:8.1f} MiB logical  "
                    f"{stats['chunk_bytes'] / MIB:8.1f} MiB on disk  ratio {ratio:.2f}",
                    file=stdout,
                )
            result = _run_loader(streams, args, stdout)
        finally:
            for store in streams.values():
                store.close()
    elapsed = result["elapsed"]
    print(
        f"loaded {args.steps} batches of {args.batch_size} in {elapsed:.2f} s: "
        f"{args.steps / elapsed:,.0f} batches/s, "
        f"{result['payload_bytes'] / MIB / elapsed:,.0f} MiB/s "
        f"of payload (workers={result['workers']}, prefetch={result['prefetch']})",
        file=stdout,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
