"""What `convert(..., max_side=N)` costs and saves, measured side by side.

    python scripts/bench_max_side.py                      # 1000 images, max_side 256
    python scripts/bench_max_side.py --count 200 --rounds 2 --max-side 320

The images are the bench's images layer's (scripts/bench_images_data.py:
ImageNet-shaped JPEGs, 500x375 most often, cut from photos pip packages ship),
made once under --cache. The folder is converted twice, in this process:
with `keep_encoded=True` alone (the files' bytes) and with `max_side=N` too
(each image whose longer side is above N re-encoded once at quality 90).
Then, in interleaved rounds, the native stage reads each store through a
DataLoader (RandomResizedCrop(224) + flip -> uint8, the library's threads),
and the medians are compared. It reports:

  * costs: the conversion's seconds, and what one more JPEG generation at a
    smaller size changes in what training sees: the mean absolute
    difference and PSNR of a deterministic Resize(224) + CenterCrop(224) of
    each image, from the original bytes and from the shrunk ones;
  * saves: stored bytes per image, and images/s of the training pipeline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_images_data  # noqa: E402

import loaderx  # noqa: E402
from loaderx import image as li  # noqa: E402

BATCH = 64
TRAIN = li.Pipeline(li.Decode(), li.RandomResizedCrop(224), li.RandomHorizontalFlip(0.5),
                    li.ToArray("uint8"))
VAL = li.Pipeline(li.Decode(), li.Resize(224), li.CenterCrop(224), li.ToArray("uint8"))


def convert(folder: str, dest: str, max_side: int | None) -> tuple[float, object]:
    start = time.perf_counter()
    ds = loaderx.convert(folder, dest, keep_encoded=True, max_side=max_side, mode="overwrite")
    return time.perf_counter() - start, ds


def stored_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def images_per_s(ds, steps: int) -> float:
    """The training pipeline's rate over `ds`: `steps` timed batches after 2 warm-up ones."""
    batch = min(BATCH, len(ds["image"]))
    with loaderx.DataLoader(ds, batch_size=batch, seed=0, image={"image": TRAIN}) as loader:
        for _ in range(2):
            next(loader)
        start = time.perf_counter()
        for _ in range(steps):
            next(loader)
        return steps * batch / (time.perf_counter() - start)


def fidelity(original, shrunk, count: int) -> tuple[float, float]:
    """Mean absolute difference and PSNR (dB) of VAL's outputs, over `count` images."""
    idx = range(min(count, len(original["image"])))
    a = VAL.apply([original["image"][i] for i in idx], seed=0, step=0).astype(np.float64)
    b = VAL.apply([shrunk["image"][i] for i in idx], seed=0, step=0).astype(np.float64)
    mse = float(np.mean((a - b) ** 2))
    return float(np.mean(np.abs(a - b))), 10 * np.log10(255**2 / mse) if mse else float("inf")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--max-side", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="timed batches per round")
    parser.add_argument("--cache", type=Path,
                        default=Path(__file__).resolve().parent.parent / "bench-out")
    args = parser.parse_args(argv)
    data = bench_images_data.prepare(args.cache, args.count, log=lambda _m: None)
    cpu = cpu_name()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for name, side in (("keep_encoded", None), (f"max_side={args.max_side}", args.max_side)):
            dest = os.path.join(tmp, name)
            seconds, ds = convert(data["folder"], dest, side)
            runs[name] = {"ds": ds, "convert_s": seconds, "rates": [],
                          "bytes": stored_bytes(dest) / len(ds["image"])}
        for _ in range(args.rounds):  # interleaved: both see the same machine
            for run in runs.values():
                run["rates"].append(images_per_s(run["ds"], args.steps))
        (base, small) = runs.values()
        diff, psnr = fidelity(base["ds"], small["ds"], 200)
        print(f"{args.count} images ({data['folder']}), {args.rounds} interleaved rounds, "
              f"batch {BATCH}, {os.cpu_count()} cores{', ' + cpu if cpu else ''}")
        print(f"{'store':<16}{'convert s':>10}{'KiB/image':>11}{'images/s':>10}{'vs base':>9}")
        for name, run in runs.items():
            ratios = [r / b for r, b in zip(run["rates"], base["rates"])]
            print(f"{name:<16}{run['convert_s']:>10.1f}{run['bytes'] / 1024:>11.1f}"
                  f"{statistics.median(run['rates']):>10.0f}{statistics.median(ratios):>8.2f}x")
        print(f"Resize(224)+CenterCrop(224) of the shrunk bytes vs the original: mean |diff| "
              f"{diff:.2f}, PSNR {psnr:.1f} dB (200 images)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
