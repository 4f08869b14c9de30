"""The bench's picture: `python scripts/bench.py all --plot perf.png` (`--publish NAME`
draws docs/perf-NAME.png).

Panels, each drawn when its layer ran:
  * dense gather throughput against record size, every backend a line, the
    physical limit rows (memcpy, zstd decompression) dashed;
  * loader end to end, batches per second, one bar per configuration;
  * token windows, batches per second;
  * scale: gather throughput and open time against the store's record count.
Rows that did not run are listed in the bars with their status, never dropped
(in the remote panel, whose bars sit close, by its first word: "missing").
The title names the CPU model, the usable cores and the code revision.
`python scripts/bench_plot.py REPORT.json OUT.png` redraws a saved --json report.
"""

from __future__ import annotations

import re
from pathlib import Path

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}
LOADERX_COLOR = "#d62728"
LIMIT_COLOR = "#444444"


def record_bytes(key: str) -> int | None:
    """'dense-12KiB' -> 12288."""
    match = re.fullmatch(r"dense-(\d+)(B|KiB|MiB)", key)
    return int(match.group(1)) * UNITS[match.group(2)] if match else None


LOADERX_COLORS = ("#d62728", "#ff7f0e", "#8c2d04", "#e377c2")
CONTENDER_COLORS = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
    "#8c564b",
    "#aec7e8",
    "#98df8a",
    "#c5b0d5",
    "#9edae5",
    "#dbdb8d",
)
LIMIT_DASHES = ((6, 2), (2, 2), (8, 2, 2, 2), (4, 1, 1, 1), (1, 1), (10, 3))


def _line_style(group: str, name: str, counters: dict) -> dict:
    """loaderx rows thick and warm, contenders thin and cool, limits grey with their own dashes."""
    if group == "baseline":
        return dict(lw=2.0, marker="s", color="black")
    if group == "limit":
        k = counters["limit"] = counters["limit"] + 1
        shade = "#555555" if name.startswith("memcpy") else "#999999"
        return dict(lw=1.3, color=shade, dashes=LIMIT_DASHES[(k - 1) % len(LIMIT_DASHES)])
    if group == "loaderx":
        k = counters["loaderx"] = counters["loaderx"] + 1
        return dict(lw=2.6, marker="o", color=LOADERX_COLORS[(k - 1) % len(LOADERX_COLORS)])
    k = counters["contender"] = counters["contender"] + 1
    return dict(lw=1.0, marker=".", color=CONTENDER_COLORS[(k - 1) % len(CONTENDER_COLORS)])


def _size_label(size: int) -> str:
    for unit in ("MiB", "KiB"):
        if size >= UNITS[unit] and size % UNITS[unit] == 0:
            return f"{size // UNITS[unit]} {unit}"
    return f"{size} B"


def _dense_panel(ax, sections: list[dict]) -> None:
    series: dict[str, list] = {}
    groups: dict[str, str] = {}
    for section in sections:
        size = record_bytes(section["key"])
        for row in section["rows"]:
            if size is not None and row["status"] == "ok" and row["gather_mib_s"]:
                series.setdefault(row["name"], []).append((size, row["gather_mib_s"]))
                groups[row["name"]] = row["group"]
    order = sorted(
        series,
        key=lambda name: (
            (
                ["loaderx", "baseline", "contender", "limit"].index(groups[name])
                if groups[name] in ("loaderx", "baseline", "contender", "limit")
                else 2
            ),
            name,
        ),
    )
    counters = {"loaderx": 0, "contender": 0, "limit": 0}
    for name in order:
        points = sorted(series[name])
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=name, **_line_style(groups[name], name, counters))
    sizes = sorted({x for points in series.values() for x, _y in points})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([_size_label(x) for x in sizes])
    ax.set_xlabel("record size (bytes, log)")
    ax.set_ylabel("gather MiB/s (log)")
    ax.set_title("dense random gather, batch 256: throughput vs record size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6.5, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)


def _short(status: str, limit: int = 44) -> str:
    return status if len(status) <= limit else status[: limit - 3] + "..."


def _bars(ax, section: dict, per_batch: int, title: str) -> None:
    rows = section["rows"]
    names = [
        r["name"] if r["status"] == "ok" else f"{r['name']}\n[{_short(r['status'])}]" for r in rows
    ]
    values = [(r["records_s"] or 0) / per_batch if r["status"] == "ok" else 0.0 for r in rows]
    colors = [
        (
            LOADERX_COLOR
            if r["group"] == "loaderx"
            else ("black" if r["group"] == "baseline" else "#1f77b4")
        )
        for r in rows
    ]
    positions = range(len(rows))
    ax.barh(positions, values, color=colors)
    ax.set_yticks(list(positions))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, max(values + [10.0]) * 4)  # room for the value labels
    ax.set_xlabel("batches / s (symlog)")
    ax.set_title(title)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    for position, value in zip(positions, values):
        if value:
            ax.text(value, position, f" {value:,.0f}", va="center", fontsize=6.5)


def _remote_panel(ax, sections: list[dict]) -> None:
    """The remote layer: payload MiB/s of every row, cold and warm, one bar each."""
    rows = [(s["key"].split("-", 1)[1], r) for s in sections for r in s["rows"]]
    names = [
        (r["name"] if f"({phase})" in r["name"] else f"{phase}: {r['name']}")
        + ("" if r["status"] == "ok" else f" [{r['status'].split(':')[0]}]") for phase, r in rows
    ]
    values = [r["gather_mib_s"] or 0.0 if r["status"] == "ok" else 0.0 for _, r in rows]
    colors = [LOADERX_COLOR if r["group"] == "loaderx" else
              ("black" if r["group"] == "baseline" else "#1f77b4") for _, r in rows]
    positions = range(len(rows))
    ax.barh(positions, values, color=colors)
    ax.set_yticks(list(positions))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(0.1, max(values + [10.0]) * 4)
    ax.set_xlabel("MiB/s of payload (log)")
    cold = next((s.get("title", "") for s in sections if s["key"] == "remote-cold"), "")
    server = "; server disk cold" if "server disk cold" in cold else ""
    ax.set_title(f"remote: random batches of 256 x 12 KiB from an S3 server on loopback{server}")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    for position, value in zip(positions, values):
        if value:
            ax.text(value, position, f" {value:,.1f}", va="center", fontsize=6.5)


def _scale_panel(ax, section: dict) -> None:
    kinds: dict[str, list] = {}
    for row in section["rows"]:
        if row["status"] == "ok":
            extra = row["extra"]
            kinds.setdefault(row["name"].rsplit(" ", 1)[0], []).append(
                (extra["count"], row["gather_mib_s"])
            )
    for name, points in kinds.items():
        points.sort()
        xs, ys = zip(*points)
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("records in the store (log)")
    ax.set_ylabel("random gather MiB/s (log)")
    ax.set_title("scale: gather throughput vs store size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _panels(sections: list[dict]) -> list:
    """(kind, payload) for every panel this report can draw, in page order."""
    by_key = {s["key"]: s for s in sections}
    panels = []
    dense = [s for s in sections if record_bytes(s["key"]) is not None]
    if dense:
        panels.append(("dense", dense))
    if "loader" in by_key:
        panels.append(("loader", by_key["loader"]))
    if "tokens" in by_key:
        panels.append(("tokens", by_key["tokens"]))
    if "scale-size" in by_key:
        panels.append(("scale", by_key["scale-size"]))
    remote = [by_key[k] for k in ("remote-cold", "remote-warm") if k in by_key]
    if remote:
        panels.append(("remote", remote))
    return panels


def draw(sections: list[dict], machine: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = _panels(sections)
    if not panels:
        raise ValueError("nothing to plot: run the dense, loader, tokens, scale or remote layer")
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 4.6 * len(panels)), squeeze=False)
    for ax, (kind, payload) in zip(axes[:, 0], panels):
        if kind == "dense":
            _dense_panel(ax, payload)
        elif kind == "loader":
            _bars(
                ax,
                payload,
                256,
                "loader end to end, 12 KiB records + label, batch 256 (fresh process per run)",
            )
        elif kind == "tokens":
            _bars(ax, payload, 32, "token windows, 32 x 2049 int32 per batch")
        elif kind == "remote":
            _remote_panel(ax, payload)
        else:
            _scale_panel(ax, payload)
    revision = machine.get("loaderx", "").rsplit("git ", 1)[-1].rstrip(")")
    fig.suptitle(
        f"loaderx bench on {machine.get('cpu', '?')},"
        f" {machine.get('cores usable', '?').split(' (')[0]} cores"
        f" (git {revision}); medians of interleaved rounds",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110, bbox_inches="tight")  # (no tick label cut at the edge)
    plt.close(fig)


if __name__ == "__main__":
    import json
    import sys

    if len(sys.argv) != 3:
        sys.exit(
            "usage: bench_plot.py REPORT.json OUT.png  (redraws a saved `bench.py --json` report)"
        )
    report = json.loads(Path(sys.argv[1]).read_text())
    draw(report["sections"], report["machine"], Path(sys.argv[2]))
