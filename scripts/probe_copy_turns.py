"""A gather of random 12 KiB rows into buffers reused in turn: two (what the
loader bench's copy-limit row and a `gather(out=)` loop reuse) against eight
(about what a DataLoader's window cycles through), into page-aligned buffers
(the library copies with `rep movsb` there) and 16 bytes past a line (where
numpy puts an array's data; a vector loop). Medians of 3 rounds, batches/s.

    python scripts/probe_copy_turns.py
"""
from __future__ import annotations

import os
import statistics
import tempfile

import numpy as np

import loaderx
from bench_ab import _rate

N, B, ROW = 4096, 256, 12288


def main() -> None:
    tmp = tempfile.mkdtemp()
    x = (np.arange(N, dtype=np.uint64)[:, None] * 3
         + np.arange(ROW, dtype=np.uint64)[None] // 7).astype(np.uint8)
    loaderx.from_numpy(os.path.join(tmp, "lx"), x.reshape(N, 64, 64, 3), codec="raw").close()
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, N, B) for _ in range(64)]
    store = loaderx.open_store(os.path.join(tmp, "lx"))

    def buffers(offset: int, count: int) -> list:
        out = []
        for _ in range(count):
            raw = np.empty(B * ROW + 8192, np.uint8)
            start = (-raw.ctypes.data) % 4096 + offset
            out.append(raw[start:start + B * ROW].reshape(B, 64, 64, 3))
        return out

    def rate(bufs: list) -> float:
        """Batches/s of gathers into `bufs` in turn (bench_ab's timing loop)."""
        k = [0]

        def step() -> None:
            k[0] += 1
            store.gather(batches[k[0] % len(batches)], out=bufs[k[0] % len(bufs)])
        return _rate(step, B * ROW) * 2**20 / (B * ROW)

    rates: dict = {}
    for _ in range(3):
        for offset in (0, 16):
            for count in (2, 8):
                rates.setdefault((offset, count), []).append(rate(buffers(offset, count)))
    store.close()
    for (offset, count), r in rates.items():
        m = statistics.median(r)
        where = "page-aligned" if offset == 0 else "16 B past a line"
        print(f"{where:17} {count} buffers in turn: {m:7.0f} batches/s"
              f" {m * B * ROW / 2**30:5.1f} GiB/s")


if __name__ == "__main__":
    main()
