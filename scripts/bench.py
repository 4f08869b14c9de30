"""loaderx benchmark suite against real contenders (SPEC §9).

    python scripts/bench.py LAYER [--size tiny|small|default] [--repeat N]
                                  [--json OUT.json] [--workdir DIR] [--keep]
                                  [--images-count N]
                                  [--plot OUT.png] [--cache DIR] [--venvs build|use|off]
                                  [--baseline DIR] [--publish NAME]
                                  [--latency-ms MS] [--server-disk auto|cold|warm]

LAYER is one of sampler, dense, ragged, image-store (variable-size decoded
images as a store workload), images (JPEG decode + RandomResizedCrop + flip
against torchvision, FFCV, DALI and SPDL: bench_images), loader, tokens, scale,
select, cold (data larger than the page cache: bench_cold), remote (object
storage: SeaweedFS on loopback, bench_remote), or all;
"fresh" runs only the fresh-process part of the dense layer (bench_fresh), which
with --baseline DIR also runs the loaderx package in DIR: before and after.
Contenders come from the `bench` extra (pip install ".[bench]"); MosaicML
Streaming, LitData and the images layer's torchvision, FFCV, DALI and SPDL run
from private venvs that the bench creates under --cache (default bench-out/,
git-ignored) with pinned versions (bench_venvs), installing the Debian packages
FFCV and SPDL need when it runs as root. The images layer keeps its generated
JPEGs under --cache too (bench_images_data), keyed by their content.
One that cannot be installed, imported or run is a row saying "missing: ..."
(with pip's reason) or "failed: ...". The scale layer keeps its big stores
under --cache too, and builds them once.

How figures are made (see bench_harness for the details):
  * every path goes through the public Python API, with cffi, the GIL and
    numpy allocation inside the timing;
  * every backend's output for the planned indices is validated (exact dtype,
    shape, order, values) before any timing; a mismatch fails the run (exit 1);
  * each figure is the median of --repeat rounds, the backends run round-robin
    inside every round, and each ratio is the median of per-round ratios;
  * the loader, tokens and scale layers run every configuration in a fresh
    process, for a clean peak RSS, and print page faults and context switches
    next to each throughput;
  * --plot draws throughput against record size (dense layer, with the memcpy
    and zstd limit rows) and the loader and token bars (bench_plot);
  * --publish NAME makes the run the reference's: its report becomes
    docs/perf/NAME.json, its plot docs/perf-NAME.png, and every table made
    from it (docs/performance.md, the README) is rewritten (bench_report).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
for entry in (str(SCRIPTS), str(ROOT)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import numpy as np  # noqa: E402

import bench_layers  # noqa: E402
import bench_loader  # noqa: E402
import bench_scale  # noqa: E402
import bench_select  # noqa: E402
import bench_tokens  # noqa: E402
import bench_venvs  # noqa: E402
from bench_harness import Section  # noqa: E402

LAYERS = ("sampler", "dense", "ragged", "image-store", "images", "loader", "tokens", "scale",
          "select", "cold", "remote")
# Run on their own only: "all" has them inside another layer (dense runs fresh).
EXTRA_LAYERS = ("fresh",)

# (label, distribution name for the version, module proving it imports)
CONTENDERS = (
    ("lmdb", "lmdb", "lmdb"),
    ("h5py", "h5py", "h5py"),
    ("pyarrow", "pyarrow", "pyarrow"),
    ("array-record", "array-record", "array_record.python.array_record_module"),
    ("grain", "grain", "grain"),
    ("torch", "torch", "torch"),
    ("torchdata", "torchdata", "torchdata"),
    ("webdataset", "webdataset", "webdataset"),
    ("datasets (HF)", "datasets", "datasets"),
    ("zstandard", "zstandard", "zstandard"),
    ("matplotlib", "matplotlib", "matplotlib"),
)
SLOW_IMPORTS = ("torch", "grain", "torchdata", "datasets (HF)", "matplotlib")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory() -> str:
    fields = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
    except OSError:
        return "unknown"
    gib = float(1 << 30)
    return f"{fields.get('MemTotal', 0) / gib:.1f} GiB total, {fields.get('MemAvailable', 0) / gib:.1f} GiB available"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _loaderx_version() -> str:
    try:
        import loaderx
        import loaderx.zrecord  # noqa: F401 - proves the native library loads
    except Exception as exc:  # the loaderx rows will say "missing" with the same reason
        return f"missing: {type(exc).__name__}: {exc}"
    version = getattr(loaderx, "__version__", None)
    return f"{version or 'unknown version'} ({Path(loaderx.__file__).parent}{_git_revision()})"


def _git_revision() -> str:
    """The checkout's commit, so a saved report says which code it measured."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f", git {done.stdout.strip()}" if done.returncode == 0 and done.stdout.strip() else ""


def _contender_version(dist: str, module: str, quick: bool) -> str:
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing: not installed"
    if quick:
        # torch and grain load for seconds; the loader children import them and report failures.
        return version
    try:
        __import__(module)
    except Exception as exc:  # an optional contender
        return f"{version}, missing: import fails: {type(exc).__name__}: {exc}"
    return version


def load_average() -> str:
    """The machines are shared: a busy neighbour shows here and in every absolute figure."""
    one, five, _fifteen = os.getloadavg()
    busy = "  (busy: absolute figures are unreliable, ratios less so)" if one > 0.5 * usable_cores() else ""
    return f"{one:.2f} (1 min), {five:.2f} (5 min){busy}"


def _gil() -> str:
    """", free-threaded, GIL disabled" on a 3.13t/3.14t interpreter (scripts/freethreaded.sh)."""
    import sysconfig

    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        return ""
    enabled = getattr(sys, "_is_gil_enabled", lambda: True)()
    return f", free-threaded, GIL {'enabled' if enabled else 'disabled'}"


def machine_block() -> dict:
    info = {
        "cpu": _cpu_model(),
        "cores usable": f"{usable_cores()} (sched_getaffinity) of {os.cpu_count()} online",
        "memory": _memory(),
        "load at start": load_average(),
        "os": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": f"{platform.python_version()} ({platform.python_implementation()}{_gil()})",
        "numpy": np.__version__,
        "loaderx": _loaderx_version(),
    }
    for label, dist, module in CONTENDERS:
        info[label] = _contender_version(dist, module, quick=label in SLOW_IMPORTS)
    for name, spec in bench_venvs.SPECS.items():
        info[f"venv {name}"] = "pinned " + ", ".join(spec.requirements) + " (versions installed: see the layer tables)"
    return info


def print_machine(info: dict) -> None:
    print("== machine ==")
    for key, value in info.items():
        print(f"  {key:<14} {value}")
    print(flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layer", choices=LAYERS + EXTRA_LAYERS + ("all",))
    parser.add_argument("--size", choices=tuple(bench_layers.SIZES), default="default", help="tiny: seconds (smoke test); default: a few minutes")
    parser.add_argument("--repeat", type=int, default=None, help="rounds per figure (default by size)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--workdir", type=Path, default=None, help="where stores are written (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the stores after the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=None, help="draw the figures into this PNG (needs matplotlib)")
    parser.add_argument("--cache", type=Path, default=ROOT / "bench-out", help="private venvs and big stores kept between runs")
    parser.add_argument("--venvs", choices=bench_venvs.MODES, default="build",
                        help="build: create missing private venvs; use: only ready ones; off: none")
    parser.add_argument("--scale-max-gib", type=float, default=None, help="largest scale-layer store to build (GiB)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="fresh-process dense rows also run the loaderx package in this directory"
                             " (e.g. an export of the previous commit with its library built): before/after")
    parser.add_argument("--images-count", type=int, default=None,
                        help="images layer: JPEGs to generate (default by --size: tiny 20,"
                             " small 1000, default 5000)")
    parser.add_argument("--publish", default=None, metavar="NAME",
                        help="the run becomes docs/perf/NAME.json (xeon, epyc, xeon-remote, ...),"
                             " its plot docs/perf-NAME.png, and the docs' tables are rewritten")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="remote layer: add this latency to every request (an object store's "
                             "first-byte time; scripts/latency_proxy.py)")
    parser.add_argument("--server-disk", choices=("auto", "cold", "warm"), default="auto",
                        help="remote layer: cold drops the server's files from the page cache "
                             "before every reader's run, so each reads the server's disk; warm "
                             "reads them once first; auto (default) is cold where the server's "
                             "data outgrows half the memory, else warm (SeaweedFS; moto, at "
                             "--size tiny, keeps its objects in memory)")
    args = parser.parse_args(argv)
    if args.publish is not None and not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", args.publish):
        parser.error(f"--publish {args.publish!r}: a run name is lowercase words joined by '-'"
                     " (xeon, epyc-remote)")
    if args.latency_ms < 0:
        parser.error(f"--latency-ms must be >= 0, got {args.latency_ms}")
    if args.images_count is not None and args.images_count < 10:
        parser.error(f"--images-count must be >= 10 (one image per class), got {args.images_count}")
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    if args.scale_max_gib is not None and args.scale_max_gib <= 0:
        parser.error(f"--scale-max-gib must be > 0, got {args.scale_max_gib}")
    if args.baseline is not None and not (args.baseline / "loaderx" / "__init__.py").is_file():
        parser.error(f"--baseline {args.baseline} holds no loaderx package (loaderx/__init__.py)")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            parser.error(f"--plot needs matplotlib (pip install '.[bench]'): {exc}")
    return args


def run_layer(name: str, ctx: bench_layers.Context) -> list[Section]:
    if name == "loader":
        return bench_loader.run_loader(ctx, ctx.log)
    if name == "tokens":
        return bench_tokens.run_tokens(ctx)
    if name == "images":
        import bench_images

        return bench_images.run_images(ctx)
    if name == "image-store":
        return bench_layers.run_image_store(ctx)
    if name == "scale":
        return bench_scale.run_scale(ctx)
    if name == "select":
        return bench_select.run_select(ctx)
    if name == "remote":
        import bench_remote

        return bench_remote.run_remote(ctx)
    if name == "fresh":
        import bench_fresh

        return bench_fresh.run_fresh(ctx)
    if name == "cold":
        import bench_cold

        return bench_cold.run_cold(ctx)
    return getattr(bench_layers, f"run_{name}")(ctx)


def summary_lines(sections: list[Section]) -> list[str]:
    lines = ["== summary: SPEC §9 targets =="]
    for section in sections:
        lines.extend(t.line() for t in section.targets)
    unavailable = [f"  {section.key}: {row.name}: {row.status}" for section in sections for row in section.rows if not row.ok]
    if unavailable:
        lines.append("== rows that did not run ==")
        lines.extend(unavailable)
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    size = bench_layers.SIZES[args.size]
    if args.images_count is not None:
        size = dataclasses.replace(size, images={**size.images, "count": args.images_count})
    base = args.workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="loaderx-bench-", dir=base))
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", file=sys.stderr, flush=True)

    venvs = bench_venvs.Venvs(args.cache / "venvs", args.venvs, log)
    ctx = bench_layers.Context(
        size, workdir, args.repeat or size.repeat, args.seed, usable_cores(), log, venvs, args.cache,
        scale_max_bytes=None if args.scale_max_gib is None else int(args.scale_max_gib * (1 << 30)),
        baseline=None if args.baseline is None else args.baseline.resolve(),
        latency_ms=args.latency_ms, server_disk=args.server_disk,
    )
    info = machine_block()
    print_machine(info)
    sections: list[Section] = []
    try:
        for name in LAYERS if args.layer == "all" else (args.layer,):
            log(f"layer {name}")
            for section in run_layer(name, ctx):
                sections.append(section)
                print("\n".join(section.lines), end="\n\n", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\n".join(summary_lines(sections)))
    for line in venvs.report_lines():
        print(f"  {line}")
        info[line.split(" (", 1)[0]] = line
    info["load at end"] = load_average()
    print(f"  load at end: {info['load at end']}")
    invalid = [f"{s.key}: {r.name}: {r.status}" for s in sections for r in s.rows if r.status.startswith("INVALID")]
    if invalid:
        print("\n!!! VALIDATION FAILED: a backend returned data that differs from the source:", file=sys.stderr)
        print("\n".join(invalid), file=sys.stderr)
    if args.json or args.publish:
        payload = {
            "command": " ".join(["python scripts/bench.py"] + (argv if argv is not None
                                                                 else sys.argv[1:])),
            "commit": _git_revision().removeprefix(", git ") or None,
            "date": time.strftime("%Y-%m-%d"),
            "machine": info,
            "size": args.size,
            "repeat": ctx.repeat,
            "seconds": time.perf_counter() - started,
            "sections": [s.to_json() for s in sections],
            "invalid": invalid,
        }
        report = args.json or workdir.with_suffix(".json")
        report.write_text(json.dumps(payload, indent=1))
        if args.publish and not invalid:
            import bench_report

            bench_report.publish(report, args.publish)
        if args.json is None:
            report.unlink()
    if args.plot:
        import bench_plot

        bench_plot.draw([s.to_json() for s in sections], info, args.plot)
        log(f"figure written to {args.plot}")
    log(f"done in {time.perf_counter() - started:.1f} s")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
