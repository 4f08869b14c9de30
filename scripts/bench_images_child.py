"""The images layer's contenders, each through its documented public API (child side).

This file runs inside fresh child processes, several of them from a private venv
(bench_venvs: torchvision, ffcv, dali, spdl), so it imports nothing of loaderx at
module level: only numpy, the standard library and, inside each source, the
contender itself.

The workload (issue 41): RandomResizedCrop(224, scale 0.08-1, ratio 3/4-4/3) with
torchvision's parameter rule, a horizontal flip with p = 0.5, batches of 64, in
one of two outputs: "uint8", (B, 224, 224, 3) HWC, or "float32", (B, 3, 224, 224)
CHW normalized as (pixel / 255 - mean) / std with ImageNet's mean and std. Rows
whose library gives CHW uint8 (torchvision, DALI's CMN) hand over an HWC view
(a permute, no copy); FFCV's float32 batch is its `ToTorchImage` view (channels
last in memory), as FFCV's ImageNet example gives it.

A source is `function(cfg) -> (next_batch, close)`, next_batch giving `(x, y)`
(numpy or torch). `measure` builds the loader and takes its first batch (that
time is reported), describes the first two batches (dtype, shape, value range
per channel, labels, how many distinct images) for the parent's validation
(bench_images.validate), runs a warm-up, then times `cfg["batches"]` batches with
the wall clock and the CPU time of the whole process tree (/proc: threads and
worker processes alike).

Entry points: `python bench_images_child.py child CONFIG_JSON` (one run, one JSON
line) and `python bench_images_child.py build-ffcv FOLDER OUT` (FFCV's .beton).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import io
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

CROP = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CHECKED_BATCHES = 2
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# ============================================================================ shared pieces


def rrc_box(rng, width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (left, top, width, height)."""
    area = width * height
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    ratio = width / height
    if ratio < RATIO[0]:
        w, h = width, int(round(width / RATIO[0]))
    elif ratio > RATIO[1]:
        w, h = int(round(height * RATIO[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


_LOCAL = threading.local()


def thread_rng() -> np.random.Generator:
    """A generator per thread (Python transforms draw their crops from it)."""
    rng = getattr(_LOCAL, "rng", None)
    if rng is None:
        rng = _LOCAL.rng = np.random.default_rng((os.getpid(), threading.get_ident()))
    return rng


_SCALE = (1.0 / (255.0 * np.asarray(STD, np.float32))).astype(np.float32)
_SHIFT = (np.asarray(MEAN, np.float32) / np.asarray(STD, np.float32)).astype(np.float32)


def normalize(batch: np.ndarray) -> np.ndarray:
    """uint8 (B, H, W, 3) -> float32 (B, 3, H, W), (pixel / 255 - mean) / std."""
    out = np.empty((batch.shape[0], 3) + batch.shape[1:3], np.float32)
    for c in range(3):
        np.multiply(batch[..., c], _SCALE[c], out=out[:, c], dtype=np.float32)
        out[:, c] -= _SHIFT[c]
    return out


def folder_samples(folder: str) -> list[tuple[str, int]]:
    """(path, label) of an ImageFolder tree, classes in sorted order as ImageFolder does."""
    classes = sorted(p.name for p in Path(folder).iterdir() if p.is_dir())
    return [(str(path), label) for label, name in enumerate(classes)
            for path in sorted((Path(folder) / name).glob("*.jpg"))]


def _endless(make_iterator):
    while True:
        yield from make_iterator()


# ============================================================================ torch + torchvision


def _decode_file(path: str):
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def _torch_transform(cfg: dict):
    """The PIL recipe: torchvision's ImageNet example (v1 transforms on PIL images); the
    decode_jpeg recipe: v2 transforms on uint8 tensors, as torchvision's v2 guide advises."""
    import torch
    from torchvision import transforms as v1
    from torchvision.transforms import v2

    floats = cfg["output"] == "float32"
    if cfg["backend"] == "torch_pil":
        ops = [v1.RandomResizedCrop(CROP), v1.RandomHorizontalFlip()]
        ops += [v1.ToTensor(), v1.Normalize(MEAN, STD)] if floats else [v1.PILToTensor()]
        return v1.Compose(ops)
    ops = [v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()]
    if floats:
        ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose(ops)


def torch_source(cfg: dict):
    """torch DataLoader over torchvision's ImageFolder (PIL) or DatasetFolder (decode_jpeg),
    shuffled, num_workers = cfg["workers"], default collate."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler
    from torchvision import datasets

    transform = _torch_transform(cfg)
    if cfg["backend"] == "torch_pil":
        dataset = datasets.ImageFolder(cfg["folder"], transform=transform)
    else:
        dataset = datasets.DatasetFolder(cfg["folder"], loader=_decode_file,
                                         extensions=(".jpg",), transform=transform)
    total = (cfg["batches"] + cfg["warmup"] + 4) * cfg["batch"]
    sampler = RandomSampler(dataset, num_samples=total,
                            generator=torch.Generator().manual_seed(0))
    workers = cfg["workers"]
    loader = DataLoader(dataset, batch_size=cfg["batch"], sampler=sampler, drop_last=True,
                        num_workers=workers, persistent_workers=bool(workers),
                        prefetch_factor=2 if workers else None)
    iterator = iter(loader)
    hwc = cfg["output"] == "uint8"

    def get():
        x, y = next(iterator)
        return (x.permute(0, 2, 3, 1) if hwc else x), y

    return get, (lambda: None)


# ============================================================================ FFCV


class _FolderImages:
    """FFCV's writer input: (PIL RGB image, label) per index."""

    def __init__(self, folder: str):
        self.samples = folder_samples(folder)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label


def build_ffcv(folder: str, out: str) -> dict:
    """A .beton of the folder: `RGBImageField(write_mode="jpg", jpeg_quality=90)` (FFCV
    re-encodes the decoded pixels: it cannot take a file's bytes as they are), `IntField`."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    start = time.perf_counter()
    writer = DatasetWriter(out + ".part", {
        "image": RGBImageField(write_mode="jpg", jpeg_quality=90),
        "label": IntField(),
    }, num_workers=len(os.sched_getaffinity(0)))
    writer.from_indexed_dataset(_FolderImages(folder))
    os.replace(out + ".part", out)
    return {"status": "ok", "seconds": time.perf_counter() - start,
            "bytes": os.path.getsize(out)}


def ffcv_source(cfg: dict):
    """FFCV's Loader: RandomResizedCropRGBImageDecoder (TurboJPEG + OpenCV, scale and
    ratio defaults = torchvision's), RandomHorizontalFlip, then ToTensor (uint8) or
    NormalizeImage + ToTensor + ToTorchImage (float32); `num_workers` threads."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import (NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor,
                                 ToTorchImage)

    image = [RandomResizedCropRGBImageDecoder((CROP, CROP)), RandomHorizontalFlip()]
    if cfg["output"] == "float32":
        image += [NormalizeImage(np.array(MEAN) * 255, np.array(STD) * 255, np.float32),
                  ToTensor(), ToTorchImage()]
    else:
        image += [ToTensor()]
    loader = Loader(cfg["beton"], batch_size=cfg["batch"], num_workers=cfg["workers"],
                    order=OrderOption.RANDOM, drop_last=True, seed=0, os_cache=True,
                    pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]})
    batches = _endless(lambda: loader)
    return (lambda: next(batches)), (lambda: None)


# ============================================================================ DALI


def dali_source(cfg: dict):
    """NVIDIA DALI on the CPU (device_id=None): fn.readers.file (shuffled), the ROI decoder
    fn.decoders.image_random_crop, fn.resize (antialiased), then a coin-flip mirror through
    fn.crop_mirror_normalize (float32 CHW, normalized) or fn.flip (uint8 HWC)."""
    from nvidia.dali import fn, pipeline_def, types

    floats = cfg["output"] == "float32"

    @pipeline_def(batch_size=cfg["batch"], num_threads=cfg["workers"], device_id=None, seed=0)
    def train():
        jpegs, labels = fn.readers.file(file_root=cfg["folder"], random_shuffle=True,
                                        name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=list(SCALE),
                                               random_aspect_ratio=list(RATIO),
                                               num_attempts=10)
        images = fn.resize(images, resize_x=CROP, resize_y=CROP)
        mirror = fn.random.coin_flip(probability=0.5)
        if floats:
            images = fn.crop_mirror_normalize(
                images, dtype=types.FLOAT, output_layout="CHW", mirror=mirror,
                mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])
        else:
            images = fn.flip(images, horizontal=mirror)
        return images, labels

    pipe = train()
    pipe.build()

    def get():
        images, labels = pipe.run()
        return images.as_array(), labels.as_array().reshape(-1)

    return get, (lambda: None)


# ============================================================================ SPDL


def _spdl_load(sample):
    """Demux, then one FFmpeg filter graph: the RRC window, a bilinear scale, the flip."""
    import spdl.io

    path, label = sample
    rng = thread_rng()
    packets = spdl.io.demux_image(path)
    left, top, w, h = rrc_box(rng, packets.width, packets.height)
    flip = ",hflip" if rng.random() < 0.5 else ""
    graph = (f"crop=w={w}:h={h}:x={left}:y={top},scale=w={CROP}:h={CROP}:flags=bilinear"
             f"{flip},format=pix_fmts=rgb24")
    return spdl.io.decode_packets(packets, filter_desc=graph), label


def spdl_source(cfg: dict):
    """SPDL's thread pipeline: shuffled (path, label) source -> _spdl_load with concurrency
    = cfg["workers"] -> aggregate(batch) -> convert_frames into one batch buffer (+ numpy
    normalize for float32)."""
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    samples = folder_samples(cfg["folder"])
    floats = cfg["output"] == "float32"

    def source():
        rng = np.random.default_rng(0)
        while True:
            for index in rng.permutation(len(samples)):
                yield samples[index]

    def collate(items):
        x = spdl.io.to_numpy(spdl.io.convert_frames([frames for frames, _ in items]))
        x = x.reshape(len(items), CROP, CROP, 3)
        y = np.array([label for _, label in items], np.int64)
        return (normalize(x) if floats else x), y

    workers = cfg["workers"]
    pipeline = (PipelineBuilder().add_source(source())
                .pipe(_spdl_load, concurrency=workers)
                .aggregate(cfg["batch"], drop_last=True)
                .pipe(collate)
                .add_sink(3)
                .build(num_threads=workers))
    pipeline.start()
    iterator = iter(pipeline.get_iterator(timeout=600))

    def close():
        pipeline.stop()

    return (lambda: next(iterator)), close


# ============================================================================ loaderx, Python


def _pillow_rrc(data: bytes):
    """Pillow: decode, RRC (antialiased bilinear resize of the window), flip: a PIL image."""
    from PIL import Image

    rng = thread_rng()
    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
        left, top, w, h = rrc_box(rng, *image.size)
        crop = image.resize((CROP, CROP), Image.Resampling.BILINEAR,
                            box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return crop


def _pixels_rrc(pixels: np.ndarray, out: np.ndarray, cv2) -> None:
    """One stored (256, 256, 3) image: RRC window resized into `out`, flipped; cv2's
    bilinear resize where OpenCV is installed, else Pillow's."""
    rng = thread_rng()
    left, top, w, h = rrc_box(rng, pixels.shape[1], pixels.shape[0])
    window = pixels[top:top + h, left:left + w]
    flip = rng.random() < 0.5
    if cv2 is not None:
        resized = cv2.resize(window, (CROP, CROP), interpolation=cv2.INTER_LINEAR)
        if flip:
            cv2.flip(resized, 1, dst=out)
        else:
            out[...] = resized
        return
    from PIL import Image

    resized = np.asarray(Image.fromarray(window).resize((CROP, CROP),
                                                       Image.Resampling.BILINEAR))
    out[...] = resized[:, ::-1] if flip else resized


def _python_transform(cfg: dict):
    """The batch transform a loaderx user writes today: per image in Python."""
    floats = cfg["output"] == "float32"
    cv2 = None
    if cfg["backend"] == "lx_pixels":
        try:
            import cv2
        except ImportError:  # Pillow resizes instead; the row's versions say which
            pass

    def transform(batch: dict) -> dict:
        images = batch["image"]
        out = np.empty((len(batch["label"]), CROP, CROP, 3), np.uint8)
        for k in range(len(out)):
            if cfg["backend"] == "lx_pillow":
                out[k] = np.asarray(_pillow_rrc(images[k]))
            else:
                _pixels_rrc(images[k], out[k], cv2)
        return {"image": normalize(out) if floats else out, "label": batch["label"]}

    return transform


def loaderx_python_source(cfg: dict):
    """loaderx DataLoader (default workers) over the dataset, columns image and label, with
    the per-image work in a Python `transform` (Pillow over the JPEG Zrecord, or a crop and
    flip over the stored 256x256 pixels)."""
    import loaderx

    dataset = loaderx.open_dataset(cfg["dataset"], columns=["image", "label"])
    loader = loaderx.DataLoader(dataset, batch_size=cfg["batch"], seed=0,
                                transform=_python_transform(cfg))

    def get():
        batch = next(loader)
        return batch["image"], batch["label"]

    def close():
        loader.close()
        for store in dataset.values():
            store.close()

    return get, close


# ============================================================================ loaderx, native


def native_pipeline(li, output: str, decode_only: bool = False):
    """The issue-41 pipelines, written against the API the issue gives."""
    if decode_only:
        # Every image of the uniform set is 500x375: a centre crop of the whole image
        # fixes the output size and leaves a full decode.
        return li.Pipeline(li.Decode(), li.CenterCrop((375, 500)), li.ToArray("uint8"))
    head = [li.Decode(), li.RandomResizedCrop(CROP, scale=SCALE, ratio=RATIO),
            li.RandomHorizontalFlip(0.5)]
    if output == "uint8":
        return li.Pipeline(*head, li.ToArray("uint8"))
    return li.Pipeline(*head, li.ToArray("float32", layout="CHW", mean=MEAN, std=STD))


def loaderx_native_source(cfg: dict):
    """loaderx DataLoader with `image={"image": pipeline}`: the native stage (issue 41)."""
    import importlib

    import loaderx

    li = importlib.import_module("loaderx.image")
    decode_only = cfg["backend"].startswith("lx_native_decode")
    pipeline = native_pipeline(li, cfg["output"], decode_only)
    # The decode-only rows name each image by its file's number (key "all/000012.jpg").
    other = "key" if decode_only else "label"
    dataset = loaderx.open_dataset(cfg["dataset"], columns=["image", other])
    loader = loaderx.DataLoader(dataset, batch_size=cfg["batch"], seed=0,
                                image={"image": pipeline})

    def get():
        batch = next(loader)
        if decode_only:
            keys = [k.decode() if isinstance(k, bytes) else k for k in batch["key"]]
            return batch["image"], np.array([int(Path(k).stem) for k in keys])
        return batch["image"], batch["label"]

    def close():
        loader.close()
        for store in dataset.values():
            store.close()

    return get, close


# ============================================================================ decode limits


def _uniform_bytes(cfg: dict) -> list[bytes]:
    """The uniform set's files in memory, in file-number order (000000.jpg is item 0)."""
    files = sorted(Path(cfg["uniform"]).glob("*/*.jpg"))
    return [path.read_bytes() for path in files]


def _threaded_batches(cfg: dict, decode_into):
    """Batches of whole-image decodes into one (B, 375, 500, 3) buffer, the batch split
    into one contiguous chunk per thread (both libraries release the GIL in the decode)."""
    import concurrent.futures

    data = _uniform_bytes(cfg)
    batch, threads = cfg["batch"], cfg["workers"]
    pool = concurrent.futures.ThreadPoolExecutor(threads)
    order = np.random.default_rng(0).permutation(len(data))
    state = {"next": 0}

    def get():
        first = state["next"]
        picks = [int(order[(first + k) % len(order)]) for k in range(batch)]
        state["next"] = first + batch
        out = np.empty((batch, 375, 500, 3), np.uint8)
        bounds = np.linspace(0, batch, threads + 1).astype(int)
        jobs = [pool.submit(decode_into, [data[i] for i in picks[a:b]], out[a:b])
                for a, b in zip(bounds[:-1], bounds[1:])]
        for job in jobs:
            job.result()
        return out, np.asarray(picks, np.int64)

    return get, (lambda: pool.shutdown())


def pillow_decode_source(cfg: dict):
    """Pillow's full decode (its bundled libjpeg-turbo), one thread per core."""
    from PIL import Image

    def decode_into(items: list[bytes], out: np.ndarray) -> None:
        for k, data in enumerate(items):
            with Image.open(io.BytesIO(data)) as image:
                out[k] = np.asarray(image.convert("RGB"))

    return _threaded_batches(cfg, decode_into)


def _turbojpeg():
    """The system's libturbojpeg (TurboJPEG 2 API) through ctypes, which drops the GIL."""
    name = ctypes.util.find_library("turbojpeg") or "libturbojpeg.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise ModuleNotFoundError(
            f"libturbojpeg not found ({exc}); Debian: apt-get install libturbojpeg0") from exc
    lib.tjInitDecompress.restype = ctypes.c_void_p
    lib.tjDecompressHeader3.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong] + [
        ctypes.POINTER(ctypes.c_int)] * 4
    lib.tjDecompress2.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong,
                                  ctypes.c_void_p] + [ctypes.c_int] * 5
    lib.tjDestroy.argtypes = [ctypes.c_void_p]
    return lib, name


def turbojpeg_decode_source(cfg: dict):
    """libjpeg-turbo's own decode (tjDecompress2 to RGB, default flags: accurate IDCT and
    fancy upsampling, as Pillow's), straight into the batch slot, one thread per core."""
    lib, _name = _turbojpeg()
    handles = threading.local()

    def decode_into(items: list[bytes], out: np.ndarray) -> None:
        handle = getattr(handles, "h", None)
        if handle is None:
            handle = handles.h = lib.tjInitDecompress()
        dims = [ctypes.c_int() for _ in range(4)]
        for k, data in enumerate(items):
            if lib.tjDecompressHeader3(handle, data, len(data), *map(ctypes.byref, dims)):
                raise RuntimeError("tjDecompressHeader3 failed")
            width, height = dims[0].value, dims[1].value
            if (height, width) != out.shape[1:3]:
                raise RuntimeError(f"a {width}x{height} image in the 500x375 set")
            if lib.tjDecompress2(handle, data, len(data), out[k].ctypes.data, width, 0,
                                 height, 0, 0):
                raise RuntimeError("tjDecompress2 failed")

    return _threaded_batches(cfg, decode_into)


# ============================================================================ the run


# backend -> (module proving the contender imports, source)
SOURCES = {
    "torch_pil": ("torchvision", torch_source),
    "torch_decode": ("torchvision", torch_source),
    "ffcv": ("ffcv", ffcv_source),
    "dali": ("nvidia.dali", dali_source),
    "spdl": ("spdl.io", spdl_source),
    "lx_pillow": ("loaderx", loaderx_python_source),
    "lx_pixels": ("loaderx", loaderx_python_source),
    "lx_native_jpeg": ("loaderx.image", loaderx_native_source),
    "lx_native_pixels": ("loaderx.image", loaderx_native_source),
    "lx_native_decode": ("loaderx.image", loaderx_native_source),
    "lx_native_decode_builtin": ("loaderx.image", loaderx_native_source),
    "limit_pillow": ("PIL.Image", pillow_decode_source),
    "limit_turbojpeg": ("ctypes", turbojpeg_decode_source),
}


def tree_cpu_seconds() -> float:
    """User + system CPU seconds of this process and every live descendant (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(entry)
            if fields:
                parents.setdefault(int(fields[1]), []).append(int(entry))
    pids, frontier = [os.getpid()], [os.getpid()]
    while frontier:
        children = parents.get(frontier.pop(), [])
        pids.extend(children)
        frontier.extend(children)
    ticks = 0
    for pid in pids:
        fields = _stat_fields(str(pid))
        if fields:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLK_TCK


def _stat_fields(pid: str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (empty if it ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def describe(x, y) -> dict:
    """What the parent validates: dtype, shape, per-channel range, labels, distinct images."""
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x, y = x.numpy(), y.numpy()
    x, y = np.asarray(x), np.asarray(y)
    channel_axis = 1 if x.ndim == 4 and x.shape[1] == 3 else x.ndim - 1
    axes = tuple(a for a in range(x.ndim) if a != channel_axis)
    flat = np.ascontiguousarray(x).reshape(len(x), -1)
    return {
        "x_dtype": str(x.dtype), "x_shape": list(x.shape),
        "y_dtype": str(y.dtype), "y": np.asarray(y).reshape(-1).tolist(),
        "x_min": x.min(axis=axes).astype(float).tolist(),
        "x_max": x.max(axis=axes).astype(float).tolist(),
        "image_means": flat.mean(axis=1, dtype=np.float64).tolist(),
        "distinct": len({hashlib.blake2b(row.tobytes(), digest_size=8).digest()
                         for row in flat}),
    }


def measure(cfg: dict) -> dict:
    """First batch (from building the loader), CHECKED_BATCHES described, `warmup` plain
    batches (so what the loader queued while batches were described is drained, and the
    window sees a steady state), then `batches` timed."""
    start = time.perf_counter()
    get, close = SOURCES[cfg["backend"]][1](cfg)
    batch = get()
    first_s = time.perf_counter() - start
    checks = [describe(*batch)]
    for _ in range(1, CHECKED_BATCHES):
        checks.append(describe(*get()))
    del batch
    for _ in range(cfg["warmup"]):
        get()
    cpu, start = tree_cpu_seconds(), time.perf_counter()
    for _ in range(cfg["batches"]):
        get()
    seconds = time.perf_counter() - start
    cpu = tree_cpu_seconds() - cpu
    close()
    return {"status": "ok", "batches": cfg["batches"], "seconds": seconds, "cpu_seconds": cpu,
            "first_batch_s": first_s, "checks": checks, "versions": versions(cfg["backend"])}


# backend -> distributions whose versions its row reports
VERSIONS = {
    "torch_pil": ("torch", "torchvision", "pillow"),
    "torch_decode": ("torch", "torchvision"),
    "ffcv": ("ffcv", "torch", "numba", "opencv-python"),
    "dali": ("nvidia-dali-cuda120",),
    "spdl": ("spdl",),
    "lx_pillow": ("pillow",),
    "lx_pixels": ("opencv-python-headless", "opencv-python", "pillow"),
    "limit_pillow": ("pillow",),
}


def versions(backend: str) -> dict:
    """The versions a row ran with (and which libjpeg-turbo decoded, where it says)."""
    import importlib.metadata as metadata

    found = {"python": sys.version.split()[0], "numpy": np.__version__}
    if backend.startswith("lx_"):
        import loaderx

        found["loaderx"] = f"{loaderx.__version__} ({Path(loaderx.__file__).parent})"
    if backend.startswith("lx_native"):
        from loaderx import image

        found["loaderx.image decoder"] = image.decoder()["jpeg"]
    for dist in VERSIONS.get(backend, ()):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if backend in ("limit_pillow", "lx_pillow", "torch_pil"):
        from PIL import features

        found["pillow's libjpeg-turbo"] = str(features.version("libjpeg_turbo"))
    if backend == "limit_turbojpeg":
        _turbojpeg()
        found["libturbojpeg"] = _library_version("libturbojpeg")
    return found


def _library_version(stem: str) -> str:
    """The loaded shared library's file and, where dpkg owns it, its Debian package."""
    import subprocess

    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if stem in line.rsplit("/", 1)[-1]}
    if not paths:
        return "not loaded"
    path = os.path.realpath(sorted(paths)[0])
    try:
        owner = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True,
                               timeout=30).stdout.split(":")[0].strip()
        version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", owner],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return path
    return f"{path} (Debian {owner} {version})" if owner and version else path


def child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    # LOADERX_LIBJPEG=builtin: the native stage's own portable-C libjpeg-turbo build.
    os.environ.update(cfg.get("env") or {})
    module = SOURCES[cfg["backend"]][0]
    try:
        __import__(module)
        if cfg["backend"] == "limit_turbojpeg":
            _turbojpeg()
    except Exception as exc:  # an optional contender: any import failure means "missing"
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if module == "loaderx.image" and isinstance(exc, ModuleNotFoundError):
            reason = "loaderx.image not built yet"
        print(json.dumps({"status": "missing", "reason": reason}))
        return 0
    try:
        result = measure(cfg)
    except Exception as exc:  # reported as a "failed" row by the parent
        lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
        result = {"status": "failed", "reason": " | ".join(lines[-2:])[:300]}
    print(json.dumps(result))
    sys.stdout.flush()
    # Worker pools (torch, FFCV, DALI, SPDL) can linger at exit; the result is out already.
    os._exit(0)


def build_main(folder: str, out: str) -> int:
    try:
        result = build_ffcv(folder, out)
    except ImportError as exc:
        result = {"status": "missing", "reason": f"{type(exc).__name__}: {exc}"[:300]}
    except Exception as exc:  # the FFCV rows then say why
        result = {"status": "failed", "reason": f"build: {type(exc).__name__}: {exc}"[:300]}
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    if len(sys.argv) == 4 and sys.argv[1] == "build-ffcv":
        sys.exit(build_main(sys.argv[2], sys.argv[3]))
    sys.exit("usage: bench_images_child.py child CONFIG_JSON | build-ffcv FOLDER OUT")
