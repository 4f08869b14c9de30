"""The images layer: decode + RandomResizedCrop(224) + flip, loaderx vs the loaders users pick.

Issue 41's bench. Data: bench_images_data (ImageNet-like JPEGs cut from the photos
scikit-image and scikit-learn ship, an ImageFolder tree of 10 classes, the same
files in a loaderx Zrecord, and decoded 256x256 pixels in a DenseStore).
Workload: RandomResizedCrop(224, scale 0.08-1, ratio 3/4-4/3) + horizontal flip,
batch 64, in two outputs, each its own table: uint8 (B, 224, 224, 3) HWC and
normalized float32 (B, 3, 224, 224) CHW. A third table is the decode-only limit:
whole 500x375 images decoded by libjpeg-turbo on every core, against the native
stage decoding the same files.

Rows (bench_images_child has the code of each, through its public API):
  * torch DataLoader + torchvision, the PIL recipe (ImageFolder, v1 transforms)
    and the `torchvision.io.decode_jpeg` + v2 recipe, num_workers 0/1/2; from the
    private venv "torchvision" (torch 2.14.1 + torchvision 0.29.1: the test
    extra's torch 2.13.0 cannot load PyPI's torchvision);
  * FFCV (venv "ffcv": its sdist built against Debian's libopencv-dev and
    libturbojpeg0-dev), NVIDIA DALI CPU-only (venv "dali", device_id=None) and
    SPDL (venv "spdl", with Debian's FFmpeg libraries), one thread per core;
  * loaderx today: Pillow decode + RRC + flip in a `transform` over the JPEG
    Zrecord (what the docs show), and the stored pixels with the crop and flip in
    a `transform` (OpenCV, or Pillow without it);
  * loaderx's native stage, `DataLoader(ds, image={"image": loaderx.image.Pipeline(
    ...)})`, over the JPEG store and over the stored pixels: "missing: loaderx.image
    not built yet" until that module exists;
  * decode-only limits: Pillow's full decode (its bundled libjpeg-turbo) and the
    system's libturbojpeg through ctypes, each on one thread per core, against the
    native stage decoding whole images with the decoder it picks (a SIMD
    libjpeg-turbo where one is installed) and with LOADERX_LIBJPEG=builtin (its
    own portable-C build): the numbers issue 41 asks to choose between them by.
How each private venv was installed (pip pins, Debian packages) is in
bench_venvs.SPECS; the output prints it per row family, with the versions found.

Protocol: every run is a fresh process (bench_images_child): a first batch (its
time is reported), a warm-up, then the timed batches, timed with the wall clock
and the CPU time of the process tree (threads and worker processes). Rounds run
every configuration round-robin, starting one further along each round; a figure
is the median over rounds and a ratio the median of per-round ratios. Reported:
images/s, CPU ms per image, both cores' use (CPU time / wall / cores), and the
ratio to torch's best recipe for the same output, by images/s and by images per
CPU-second (the steadier one on a shared machine).

Validation (random crops cannot be compared value by value across libraries):
every row's first two batches must have the exact dtype and shape, labels of the
data set, values inside the output's range (float32: normalized, so below 0 in
every channel somewhere in the batch), images that differ from each other, and
a plausible mean brightness; the decode rows' images must match Pillow's decode
of the same files (mean within 1 grey level).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

import bench_images_data
from bench_harness import (
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
)

CHILD = str(Path(__file__).resolve().parent / "bench_images_child.py")
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CROP = 224
UNIFORM_HW = (375, 500)
RUN_TIMEOUT_S = 900
OUTPUTS = ("uint8", "float32")

# backend -> (row name, private venv or None, section kinds, workers: "torch" | "cores" | None)
FAMILIES = {
    "torch_pil": ("torch DataLoader, PIL + v1 transforms, workers={w}", "torchvision",
                  OUTPUTS, "torch"),
    "torch_decode": ("torch DataLoader, decode_jpeg + v2 transforms, workers={w}",
                     "torchvision", OUTPUTS, "torch"),
    "ffcv": ("FFCV Loader, RRC decoder, {w} threads", "ffcv", OUTPUTS, "cores"),
    "dali": ("DALI CPU, image_random_crop, {w} threads", "dali", OUTPUTS, "cores"),
    "spdl": ("SPDL pipeline, FFmpeg decode+filter, {w} threads", "spdl", OUTPUTS, "cores"),
    "lx_pillow": ("loaderx DataLoader, Pillow in transform (the docs today)", None, OUTPUTS,
                  None),
    "lx_pixels": ("loaderx DataLoader, stored 256px pixels, crop/flip in transform", None,
                  OUTPUTS, None),
    "lx_native_jpeg": ("loaderx.image Pipeline over the JPEG store", None, OUTPUTS, None),
    "lx_native_pixels": ("loaderx.image Pipeline over stored 256px pixels", None, OUTPUTS,
                         None),
    "lx_native_decode": ("loaderx.image Decode only (whole 500x375 images)", None,
                         ("decode",), None),
    "lx_native_decode_builtin": ("loaderx.image Decode only, built-in portable-C decoder",
                                 None, ("decode",), None),
    "limit_pillow": ("limit: Pillow full decode, {w} threads", None, ("decode",), "cores"),
    "limit_turbojpeg": ("limit: libturbojpeg tjDecompress2, {w} threads", None, ("decode",),
                        "cores"),
}
TORCH = ("torch_pil", "torch_decode")
PEERS = ("ffcv", "dali", "spdl")
LIMITS = ("limit_pillow", "limit_turbojpeg")


def _group(backend: str) -> str:
    if backend.startswith("lx_"):
        return "loaderx"
    return "limit" if backend.startswith("limit_") else backend.split("_")[0]


def configs(ctx) -> list[tuple[str, str, int | None]]:
    """Every (backend, output, workers) run, in a fixed order."""
    found = []
    for backend, (_name, _venv, kinds, workers) in FAMILIES.items():
        counts = {"torch": ctx.size.images["torch_workers"], "cores": (ctx.threads,),
                  None: (None,)}[workers]
        found.extend((backend, kind, count) for kind in kinds for count in counts)
    return found


def row_name(config: tuple) -> str:
    backend, _output, workers = config
    return FAMILIES[backend][0].replace("{w}", str(workers))


# ============================================================================ data and builds


def _data(ctx) -> dict:
    """The data set: cached under --cache, except at --size tiny (a temporary one)."""
    home = ctx.workdir / "images" if ctx.size.images.get("temporary") else ctx.cache
    return bench_images_data.prepare(home, ctx.size.images["count"], ctx.seed, ctx.log,
                                     ctx.threads)


def python_for(ctx, backend: str) -> str:
    venv = FAMILIES[backend][1]
    if venv is None:
        return sys.executable
    if ctx.venvs is None:
        raise Unavailable("missing", f"private venv '{venv}' not configured")
    return ctx.venvs.python(venv)


def _ffcv_beton(ctx, data: dict) -> str:
    """FFCV's .beton of the folder, built once per data set and FFCV pin in the ffcv venv."""
    import bench_venvs

    python = python_for(ctx, "ffcv")
    pin = bench_venvs.SPECS["ffcv"].requirements[0].replace("==", "-")
    beton = Path(data["root"]) / f"{pin}.beton"
    if not beton.is_file():
        ctx.log("images: writing FFCV's .beton (FFCV re-encodes at quality 90)")
        done = run_child_json([python, CHILD, "build-ffcv", data["folder"], str(beton)],
                              timeout_s=3600, env=OFFLINE)
        if done["status"] != "ok":
            raise Unavailable("missing" if done["status"] == "missing" else "failed",
                              f"building the .beton: {done['reason']}")
        ctx.log(f"images: .beton written in {done['seconds']:.1f} s")
    return str(beton)


def _debian_versions(packages: tuple) -> str:
    if not packages:
        return ""
    try:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Version}, ", *packages],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().rstrip(",")


def install_lines(ctx) -> list[str]:
    """How each private venv's contender was installed, for the report."""
    import bench_venvs

    lines = []
    for name in ("torchvision", "ffcv", "dali", "spdl"):
        spec = bench_venvs.SPECS[name]
        how = f"pip install {' '.join(spec.requirements)}"
        if spec.system:
            debian = _debian_versions(spec.system) or " ".join(spec.system)
            how = f"apt-get install {' '.join(spec.system)} ({debian}); {how}"
        home = ctx.venvs.root / name if ctx.venvs is not None else f"<cache>/venvs/{name}"
        lines.append(f"  venv {name} ({home}): {how}")
    return lines


# ============================================================================ runs


def _child_config(ctx, config: tuple, data: dict, beton: str | None) -> dict:
    backend, output, workers = config
    stored = "pixels" if backend in ("lx_pixels", "lx_native_pixels") else "jpeg"
    sizes = ctx.size.images
    return {
        "backend": backend, "output": "uint8" if output == "decode" else output,
        "workers": workers, "batch": sizes["batch"], "warmup": sizes["warmup"],
        "batches": sizes["batches"], "folder": data["folder"], "uniform": data["uniform"],
        "dataset": data["uniform_jpeg"] if output == "decode" else data[stored],
        "beton": beton,
        "env": {"LOADERX_LIBJPEG": "builtin"} if backend.endswith("_builtin") else {},
    }


def one_run(ctx, config: tuple, row: Row, data: dict, beton: str | None,
            reference: np.ndarray) -> None:
    """One fresh process of one configuration; its figures go into `row`."""
    try:
        python = python_for(ctx, config[0])
    except Unavailable as exc:
        row.status = str(exc)
        return
    child = _child_config(ctx, config, data, beton)
    result = run_child_json([python, CHILD, "child", json.dumps(child)],
                            timeout_s=RUN_TIMEOUT_S, env=OFFLINE)
    if result["status"] != "ok":
        row.status = f"{result['status']}: {result['reason']}"
        return
    try:
        validate(result, config, child["batch"], reference)
    except ValidationError as exc:
        row.status = f"INVALID: {exc}"
        return
    record(row, result, config, child["batch"], ctx.threads)
    ctx.log(f"images: {row.name} [{config[1]}]: "
            f"{result['batches'] * child['batch'] / result['seconds']:.0f} images/s")


def record(row: Row, result: dict, config: tuple, batch: int, cores: int) -> None:
    images = result["batches"] * batch
    per_s = images / result["seconds"]
    output = config[1]
    pixels = UNIFORM_HW[0] * UNIFORM_HW[1] * 3 if output == "decode" else CROP * CROP * 3
    item_bytes = pixels * (4 if output == "float32" else 1)
    row.records_s.append(per_s)
    row.gather_mibs.append(per_s * item_bytes / MIB)
    row.batches_timed = result["batches"]
    extra = row.extra
    cpu = max(result["cpu_seconds"], 1e-9)
    extra.setdefault("cpu_ms_per_image", []).append(1e3 * cpu / images)
    extra.setdefault("images_per_cpu_s", []).append(images / cpu)
    extra.setdefault("cores_use", []).append(cpu / result["seconds"] / cores)
    extra.setdefault("first_batch_s", []).append(result["first_batch_s"])
    extra["versions"] = result["versions"]


# ============================================================================ validation


def reference_means(data: dict) -> np.ndarray:
    """Pillow's decode of every uniform image: its mean, by file number."""
    from PIL import Image

    files = sorted(Path(data["uniform"]).glob("*/*.jpg"))
    means = np.empty(len(files))
    for number, path in enumerate(files):
        assert int(path.stem) == number, path
        with Image.open(path) as image:
            means[number] = np.asarray(image.convert("RGB"), dtype=np.float64).mean()
    return means


def _want_shape(output: str, batch: int) -> list[int]:
    if output == "decode":
        return [batch, *UNIFORM_HW, 3]
    return [batch, CROP, CROP, 3] if output == "uint8" else [batch, 3, CROP, CROP]


def validate(result: dict, config: tuple, batch: int, reference: np.ndarray) -> None:
    """Raises ValidationError unless every described batch is what the workload asks for."""
    backend, output, _workers = config
    if not result.get("checks"):
        raise ValidationError("no batch was described")
    for number, check in enumerate(result["checks"]):
        what = f"batch {number}"
        dtype = "float32" if output == "float32" else "uint8"
        if check["x_dtype"] != dtype or check["x_shape"] != _want_shape(output, batch):
            raise ValidationError(f"{what}: images are {check['x_dtype']} {check['x_shape']},"
                                  f" want {dtype} {_want_shape(output, batch)}")
        labels = np.asarray(check["y"])
        if len(labels) != batch or not np.issubdtype(labels.dtype, np.integer):
            raise ValidationError(f"{what}: {len(labels)} labels of {labels.dtype}")
        if output == "decode":
            _check_decoded(check, labels, reference, what)
        else:
            _check_augmented(check, labels, output, what)


def _check_decoded(check: dict, numbers: np.ndarray, reference: np.ndarray, what: str) -> None:
    if numbers.min() < 0 or numbers.max() >= len(reference):
        raise ValidationError(f"{what}: image numbers outside the uniform set")
    gap = np.abs(np.asarray(check["image_means"]) - reference[numbers])
    if gap.max() > 1.0:
        raise ValidationError(f"{what}: image {int(numbers[gap.argmax()])} differs from"
                              f" Pillow's decode (mean off by {gap.max():.2f})")


def _check_augmented(check: dict, labels: np.ndarray, output: str, what: str) -> None:
    if labels.min() < 0 or labels.max() >= bench_images_data.CLASS_COUNT:
        raise ValidationError(f"{what}: labels {sorted(set(labels.tolist()))} are not 0..9")
    low, high = np.asarray(check["x_min"]), np.asarray(check["x_max"])
    mean = float(np.mean(check["image_means"]))
    if output == "float32":
        floor = (0.0 - np.asarray(MEAN)) / np.asarray(STD) - 1e-3
        ceiling = (1.0 - np.asarray(MEAN)) / np.asarray(STD) + 1e-3
        if (low < floor).any() or (high > ceiling).any():
            raise ValidationError(f"{what}: values {low}..{high} are outside normalized"
                                  f" [0, 1] ({floor}..{ceiling})")
        # A batch of photos has pixels darker than ImageNet's mean in every channel: a
        # float batch never normalized (0..1) has none below 0.
        if (low >= 0).any():
            raise ValidationError(f"{what}: no value below 0 in some channel ({low}):"
                                  " not normalized")
        plausible = -1.5 < mean < 2.0
    else:
        plausible = 20.0 < mean < 235.0
    if not plausible or (high - low <= 0).any():
        raise ValidationError(f"{what}: implausible batch (mean {mean:.2f}, channel ranges"
                              f" {low}..{high})")
    if check["distinct"] < max(2, len(labels) // 2):
        raise ValidationError(f"{what}: only {check['distinct']} distinct images")


# ============================================================================ report


def _rounds(ctx) -> int:
    return max(1, min(ctx.repeat, ctx.size.images["repeat"]))


def per_cpu_ratio(row: Row, bases: list[Row]) -> float | None:
    """Median over rounds of row / best base, in images per CPU-second."""
    bases = [b for b in bases if b.ok and b.extra.get("images_per_cpu_s")]
    if not row.ok or not row.extra.get("images_per_cpu_s") or not bases:
        return None
    mine = row.extra["images_per_cpu_s"]
    rounds = min([len(mine)] + [len(b.extra["images_per_cpu_s"]) for b in bases])
    return statistics.median(
        mine[r] / max(b.extra["images_per_cpu_s"][r] for b in bases) for r in range(rounds))


def table(rows: list[Row], bases: list[Row], base_label: str, cores: int) -> list[str]:
    """The fixed-width table; each row's ratios to the best of `bases` also go to its
    JSON figures ("vs_base", "vs_base_per_cpu_s", "base")."""
    width = max(len(r.name) for r in rows)
    head = (f"  {'row':<{width}} {'images/s':>9} {'CPU ms/img':>10} {'cores use':>9}"
            f" {'first s':>8} {'vs base':>8} {'per CPU-s':>9}")
    legend = (f"  cores use: CPU time / wall / {cores} cores; first s: building the loader and"
              f" its first batch; vs base: images/s over {base_label}; per CPU-s: the same"
              " by images per CPU-second (medians of per-round ratios)")
    lines = [legend, head, "  " + "-" * (len(head) - 2)]
    for row in rows:
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        extra = row.extra
        extra["base"] = base_label
        extra["vs_base"] = versus = paired_ratio(row, bases, "records_s")
        extra["vs_base_per_cpu_s"] = per_cpu = per_cpu_ratio(row, bases)
        lines.append(
            f"  {row.name:<{width}} {row.median('records_s'):>9.0f}"
            f" {statistics.median(extra['cpu_ms_per_image']):>10.2f}"
            f" {statistics.median(extra['cores_use']):>9.2f}"
            f" {statistics.median(extra['first_batch_s']):>8.2f}"
            f" {fmt(versus, '.2f') + 'x' if versus else '-':>8}"
            f" {fmt(per_cpu, '.2f') + 'x' if per_cpu else '-':>9}")
    return lines


def targets(output: str, named: dict) -> list[Target]:
    """Issue 41's bars for one output, and context lines for loaderx today."""
    def names(backends):
        return [n for n, (b, o, _w) in named.items() if b in backends and o == output]

    native, pixels = names(("lx_native_jpeg",)), names(("lx_native_pixels",))
    torch, peers = names(TORCH), names(PEERS)
    found = [
        Target(f"native stage, {output}, vs torch's best recipe", native[0], torch, 2.0,
               metric="records_s"),
        Target(f"native stage, {output}, vs the best of FFCV, DALI, SPDL", native[0], peers,
               1.3, metric="records_s"),
        Target(f"native stage over stored pixels, {output}, vs torch's best", pixels[0],
               torch, 3.0, metric="records_s"),
    ]
    for backend, label in (("lx_pillow", "Pillow in a transform"),
                           ("lx_pixels", "stored pixels, Python crop/flip")):
        found.append(Target(f"  (context) loaderx today, {label}, {output}, vs torch's best",
                            names((backend,))[0], torch, 1.0, metric="records_s", spec=False))
    return found


def decode_targets(named: dict) -> list[Target]:
    def name(backend):
        return [n for n, (b, _o, _w) in named.items() if b == backend][0]

    limits = [n for n, (b, _o, _w) in named.items() if b in LIMITS]
    return [
        Target("native decode only vs libjpeg-turbo's own rate on all cores (best limit)",
               name("lx_native_decode"), limits, 0.8, metric="records_s"),
        Target("  (context) the same with the built-in portable-C decoder (issue 41's choice)",
               name("lx_native_decode_builtin"), limits, 0.8, metric="records_s", spec=False),
    ]


def sections(ctx, rows: dict, data: dict | None) -> list[Section]:
    """The three tables (uint8, float32, decode only) with their bars."""
    result = []
    described = _data_line(data)
    for kind in OUTPUTS + ("decode",):
        mine = {config: row for config, row in rows.items() if config[1] == kind}
        named_rows = {row.name: row for row in mine.values()}
        named = {row.name: config for config, row in mine.items()}
        bars = decode_targets(named) if kind == "decode" else targets(kind, named)
        for bar in bars:
            bar.evaluate(named_rows)
        if kind == "decode":
            bases = [row for config, row in mine.items() if config[0] in LIMITS]
            label = "the best decode limit row"
        else:
            bases = [row for config, row in mine.items() if config[0] in TORCH]
            label = f"torch's best recipe ({kind})"
        title = _title(ctx, kind)
        lines = [f"== {title} ==", described]
        lines += table(list(mine.values()), bases, label, ctx.threads)
        lines.append("  issue 41 bars (median of per-round ratios of images/s):")
        lines.extend(bar.line() for bar in bars)
        if kind == "decode":
            lines.append("  how the private venvs were installed (bench_venvs.SPECS):")
            lines.extend(install_lines(ctx))
            lines.extend(_version_lines(rows))
        result.append(Section(f"images-{kind}", title, lines, list(mine.values()), bars))
    return result


def _data_line(data: dict | None) -> str:
    if data is None:
        return "  data: not available"
    return (f"  data: {data['count']} JPEGs (mean {data['mean_bytes'] / 1024:.0f} KiB, quality"
            f" {data['quality']}, cut from {len(data['photos'])} shipped photos; Pillow's"
            f" libjpeg-turbo {data['pillow_libjpeg_turbo']}) in {data['root']}")


def _version_lines(rows: dict) -> list[str]:
    seen, lines = set(), []
    for (backend, _output, _workers), row in rows.items():
        versions = row.extra.get("versions")
        family = FAMILIES[backend][1] or backend
        if versions and family not in seen:
            seen.add(family)
            listed = ", ".join(f"{k} {v}" for k, v in versions.items())
            lines.append(f"  ran with ({family}): {listed}")
    return lines


def _title(ctx, kind: str) -> str:
    sizes = ctx.size.images
    what = {
        "uint8": "RandomResizedCrop(224) + flip -> uint8 (B, 224, 224, 3) HWC",
        "float32": "RandomResizedCrop(224) + flip -> normalized float32 (B, 3, 224, 224) CHW",
        "decode": "decode only: whole 500x375 JPEGs -> uint8 (B, 375, 500, 3)",
    }[kind]
    return (f"images: {what}, batch {sizes['batch']}, {sizes['warmup']} warm-up +"
            f" {sizes['batches']} timed batches per fresh process, {_rounds(ctx)} rounds")


def run_images(ctx) -> list[Section]:
    rows = {config: Row(row_name(config), _group(config[0]), "jpeg") for config in configs(ctx)}
    try:
        data = _data(ctx)
    except bench_images_data.PhotosMissing as exc:
        for row in rows.values():
            row.status = f"missing: {exc}"
        return sections(ctx, rows, None)
    reference = reference_means(data)
    if importlib.util.find_spec("loaderx.image") is None:
        # Spares a process per row and round; each child checks the import again.
        for config, row in rows.items():
            if config[0].startswith("lx_native"):
                row.status = "missing: loaderx.image not built yet"
    beton = None
    if any(config[0] == "ffcv" for config in rows):
        try:
            beton = _ffcv_beton(ctx, data)
        except Unavailable as exc:
            for config, row in rows.items():
                if config[0] == "ffcv":
                    row.status = str(exc)
    order = list(rows)
    for round_index in range(_rounds(ctx)):
        shift = round_index % len(order)
        for config in order[shift:] + order[:shift]:
            if rows[config].ok:
                one_run(ctx, config, rows[config], data, beton, reference)
    if ctx.size.images.get("temporary"):
        shutil.rmtree(Path(data["root"]).parent.parent, ignore_errors=True)
    return sections(ctx, rows, data)
