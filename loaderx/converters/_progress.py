"""Progress reports for long operations: a ``tqdm`` bar with rate and ETA on a
terminal, plain periodic log lines otherwise, nothing when quiet.

``make_progress(mode, total, desc, unit)`` with `mode` one of ``"bar"``,
``"log"``, ``"off"``, ``None`` for "a bar if stderr is a terminal, else
nothing" (what a library call does by default), or a callable
``progress(done, total)`` called after each update (the writers' one
meaning of ``progress=``, see ``loaderx._writer``). Log lines go to stderr every
``LOADERX_LOG_INTERVAL`` seconds (default 10) and once at the end.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

__all__ = ["make_progress", "Progress", "resolve_mode", "Ticker"]

_MODES = ("bar", "log", "off")


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("LOADERX_LOG_INTERVAL", "10")))
    except ValueError:
        return 10.0


def resolve_mode(mode) -> str:
    """``None``/``True`` → bar on a terminal (``True``: log lines elsewhere);
    ``False`` → off; a mode name → itself."""
    if mode is None or mode is True:
        if sys.stderr.isatty():
            return "bar"
        return "log" if mode is True else "off"
    if mode is False:
        return "off"
    if mode not in _MODES:
        raise ValueError(f"progress must be one of {_MODES}, True, False, None or a callable "
                         f"progress(done, total), got {mode!r}")
    return mode


def _fmt_count(n: float, unit: str) -> str:
    if unit == "B":
        for u in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(n) < 1024 or u == "TiB":
                return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
            n /= 1024
    return f"{n:,.0f} {unit}" if unit != "s" else f"{n:.0f} s"


class Progress:
    """``update(n, records, nbytes)``, ``note(text)``, ``close()``; a context
    manager. Next to `n` units of `total` it shows the other of records and
    bytes read, when reported: a conversion counted in tar bytes shows its
    records, one counted in rows shows its bytes. Thread-compatible, not
    thread-safe: one thread reports."""

    def __init__(self, mode: str, total: float | None, desc: str, unit: str):
        self.mode, self.total, self.desc, self.unit = mode, total, desc, unit
        self.done = 0.0
        self.report: Callable[[Any, Any], Any] | None = None  # a caller's progress(done, total)
        self.records = 0
        self.nbytes = 0
        self._t0 = time.monotonic()
        self._last_log = self._t0
        self._bar = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                unit_scale=unit == "B",
                unit_divisor=1024 if unit == "B" else 1000,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )

    def update(self, n: float, records: int = 0, nbytes: int = 0) -> None:
        if float(n).is_integer():
            n = int(n)  # whole rows show as integers in the bar
        self.done += n
        self.records += records
        self.nbytes += nbytes
        if self.report is not None:
            done = int(self.done) if float(self.done).is_integer() else self.done
            self.report(done, self.total)
        if self._bar is not None:
            extra = self._extra()
            if extra:
                self._bar.set_postfix_str(extra, refresh=False)
            self._bar.update(n)
        elif self.mode == "log":
            now = time.monotonic()
            if now - self._last_log >= _interval():
                self._last_log = now
                self._log(now)

    def _extra(self) -> str:
        """The count that is not the bar's unit: records or bytes read."""
        if self.unit == "B" and self.records:
            return f"{self.records:,} records"
        if self.unit != "B" and self.nbytes:
            return f"{_fmt_count(self.nbytes, 'B')} read"
        return ""

    def note(self, text: str) -> None:
        """A line of information shown with the progress (none when off)."""
        if self._bar is not None:
            self._bar.write(f"{self.desc}: {text}", file=sys.stderr)
        elif self.mode != "off":
            print(f"{self.desc}: {text}", file=sys.stderr, flush=True)

    def _log(self, now: float, final: bool = False) -> None:
        elapsed = max(now - self._t0, 1e-9)
        rate = self.done / elapsed
        if self.total and self.unit == "B":
            parts = [
                f"{self.desc}: {_fmt_count(self.done, 'B')} of {_fmt_count(self.total, 'B')} "
                f"({100 * self.done / self.total:.1f}%)"
            ]
        elif self.total:
            parts = [
                f"{self.desc}: {self.done:,.0f}/{self.total:,.0f} {self.unit} "
                f"({100 * self.done / self.total:.1f}%)"
            ]
        else:
            parts = [f"{self.desc}: {_fmt_count(self.done, self.unit)}"]
        if self._extra():
            parts.append(self._extra())
        parts.append(f"{_fmt_count(rate, self.unit)}/s")
        if final:
            parts.append(f"done in {elapsed:.1f} s")
        elif self.total and rate > 0:
            parts.append(f"ETA {max(self.total - self.done, 0) / rate:.0f} s")
        else:
            parts.append(f"{elapsed:.0f} s elapsed")
        print(", ".join(parts), file=sys.stderr, flush=True)

    def close(self, failed: bool = False) -> None:
        """Ends the bar; a log line says "done" only when the work finished."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "log":
            if failed:
                print(f"{self.desc}: stopped", file=sys.stderr, flush=True)
            else:
                self._log(time.monotonic(), final=True)
            self.mode = "off"

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)


def make_progress(mode, total: float | None, desc: str, unit: str = "rows") -> Progress:
    if callable(mode):
        progress = Progress("off", total, desc, unit)
        progress.report = mode
        return progress
    return Progress(resolve_mode(mode), total, desc, unit)


class Ticker:
    """Reports elapsed time while one long native call (verify, compact,
    dictionary training) runs without a progress callback of its own: a bar
    with no total that ticks every second, or periodic log lines."""

    def __init__(self, mode, desc: str):
        self._mode = resolve_mode(mode)
        self._desc = desc
        self._bar = Progress("bar", None, desc, "s") if self._mode == "bar" else None
        self._stop = threading.Event()
        self._thread = None
        self._t0 = time.monotonic()
        if self._mode != "off":
            self._thread = threading.Thread(target=self._run, name="loaderx-progress", daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(1.0):
            if self._bar is not None:
                self._bar.update(1)
            elif time.monotonic() - last >= _interval():
                last = time.monotonic()
                print(
                    f"{self._desc}: running, {last - self._t0:.0f} s elapsed",
                    file=sys.stderr,
                    flush=True,
                )

    def __enter__(self) -> "Ticker":
        self._t0 = time.monotonic()
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
        elif self._mode == "log":
            end = "stopped after" if exc_type is not None else "done in"
            print(
                f"{self._desc}: {end} {time.monotonic() - self._t0:.1f} s",
                file=sys.stderr,
                flush=True,
            )
