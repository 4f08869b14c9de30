"""The images layer's data: ImageNet-like JPEGs cut from real photos that pip packages ship.

Nothing is downloaded. The photos are the files scikit-image and scikit-learn
carry inside their wheels (skimage/data/*.png|jpg, sklearn/datasets/images/*.jpg),
found with `importlib.util.find_spec` without importing either package (so
neither needs its own dependencies to work): 11 colour photos, and 7 greyscale
ones (camera, brick, grass, ...) that each image tints with its own random
duotone. Either package alone is enough; with neither, a clear error says what
to install (both are in the bench and test extras).

Image i is a pure function of (seed, i): from a `numpy.random.default_rng((seed,
i))` it picks a photo, an ImageNet shape (500x375 most often; 375x500, 500x333,
333x500, 500x500), a crop of 40-100% of the photo's largest crop of that aspect
at a random place, a bicubic resize to the shape, then a random mirror,
per-channel gain, gamma, and sensor-like noise, and encodes it with Pillow at
quality 90 (4:2:0, as ImageNet's files mostly are): about 85 KiB a file. It goes
to `folder/class_{i % 10:02d}/{i:06d}.jpg`, an ImageFolder tree of 10 classes.

Also written, from the same files:
  * `jpeg/`: `loaderx.convert(folder, ..., keep_encoded=True)`: a Zrecord
    column `image` holding each file's bytes untouched, `label` and `key`;
  * `pixels/`: the same images decoded, resized (shorter side 256, bilinear,
    antialiased) and centre-cropped to 256x256x3 uint8, a raw DenseStore
    column `image` plus `label` (the "stored decoded pixels" rows);
  * `uniform/all/*.jpg` and `uniform-jpeg/`: `count // 5` further images made
    the same way but all exactly 500x375 (width x height), for the decode-only
    rows: a pipeline that decodes whole images needs one output size.

Everything lives under `<cache>/images-data/<key>`, where the key hashes the
generator's version, the count, the seed, the photos' bytes and the Pillow and
libjpeg-turbo versions (which decide the JPEG bytes); a `done.json` written last
marks a finished set, so a rerun reuses it. The loaderx stores sit in a
sub-folder named by loaderx's version, rebuilt when that changes.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np

GENERATOR_VERSION = 1
CLASS_COUNT = 10
QUALITY = 90
STORED_SIDE = 256
NOISE = 8.0  # sensor-like noise (grey levels): with it the files average about 85 KiB
UNIFORM_SIZE = (500, 375)  # (width, height): the decode-only rows' one size
# ImageNet's common shapes (width, height) and how often each is drawn.
SHAPES = ((500, 375), (375, 500), (500, 333), (333, 500), (500, 500))
SHAPE_WEIGHTS = (0.5, 0.15, 0.2, 0.05, 0.1)
# (package, folder inside it, colour photos, greyscale photos tinted per image)
PHOTO_SOURCES = (
    ("skimage", "data",
     ("astronaut.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "ihc.png",
      "motorcycle_left.png", "motorcycle_right.png", "retina.jpg", "rocket.jpg"),
     ("camera.png", "brick.png", "grass.png", "gravel.png", "moon.png", "coins.png",
      "cell.png")),
    ("sklearn", "datasets/images", ("china.jpg", "flower.jpg"), ()),
)
PHOTO_PACKAGES = "scikit-image and/or scikit-learn"


class PhotosMissing(RuntimeError):
    """No package that ships the photos is installed."""


def photo_paths() -> list[Path]:
    """The shipped photo files found in the installed packages, in a fixed order."""
    found = []
    for package, folder, colour, grey in PHOTO_SOURCES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        base = Path(spec.origin).parent / folder
        found.extend(base / name for name in colour + grey if (base / name).is_file())
    if not found:
        raise PhotosMissing(
            f"no photos to cut images from: pip install {PHOTO_PACKAGES}"
            " (their wheels carry the photos; nothing is downloaded)"
        )
    return found


def _libjpeg_version() -> str:
    from PIL import features

    return str(features.version("libjpeg_turbo") or features.version("jpg") or "unknown")


def data_key(count: int, seed: int, photos: list[Path]) -> str:
    """Hashes everything the JPEG bytes depend on."""
    import PIL

    digest = hashlib.sha256()
    header = [GENERATOR_VERSION, count, seed, PIL.__version__, _libjpeg_version()]
    digest.update(json.dumps(header).encode())
    for path in photos:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def load_photos(photos: list[Path]) -> list:
    """The photos as Pillow images: RGB ones as they are, greyscale ones as "L"."""
    from PIL import Image

    loaded = []
    for path in photos:
        with Image.open(path) as image:
            mode = "L" if image.mode in ("L", "I;16", "I") else "RGB"
            loaded.append(image.convert(mode))
    return loaded


def _crop_box(rng: np.random.Generator, photo_size: tuple, shape: tuple) -> tuple:
    """A box of 40-100% of the largest crop of the shape's aspect, at a random place."""
    width, height = photo_size
    aspect = shape[0] / shape[1]
    crop_w = min(width, height * aspect)
    scale = rng.uniform(0.4, 1.0)
    box_w, box_h = crop_w * scale, crop_w * scale / aspect
    left = rng.uniform(0, width - box_w)
    top = rng.uniform(0, height - box_h)
    return (left, top, left + box_w, top + box_h)


def _jitter(rng: np.random.Generator, pixels: np.ndarray, grey: bool) -> np.ndarray:
    """Tint (greyscale photos), mirror, per-channel gain, gamma and noise: uint8 (H, W, 3)."""
    levels = np.linspace(0.0, 1.0, 256, dtype=np.float32)[None, :].repeat(3, axis=0)
    if grey:
        dark, light = rng.uniform(0.0, 0.35, (3, 1)), rng.uniform(0.65, 1.0, (3, 1))
        levels = dark + (light - dark) * levels
    levels = np.clip(levels * rng.uniform(0.85, 1.15, (3, 1)), 0.0, 1.0)
    table = (levels ** rng.uniform(0.8, 1.25) * 255.0).astype(np.float32)  # (3, 256)
    if rng.random() < 0.5:
        pixels = pixels[:, ::-1]
    if grey:
        pixels = pixels[..., None].repeat(3, axis=2)
    out = np.stack([table[c][pixels[..., c]] for c in range(3)], axis=2)
    shape = out.shape
    out += rng.standard_normal(shape[:2] + (1,), dtype=np.float32) * rng.uniform(NOISE, 2 * NOISE)
    out += rng.standard_normal(shape, dtype=np.float32) * np.float32(NOISE / 2)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def make_image(photos: list, seed: int, index: int, shape: tuple | None = None) -> bytes:
    """Image `index` as JPEG bytes: a pure function of (seed, index, shape)."""
    from PIL import Image

    rng = np.random.default_rng((seed, index))
    if shape is None:
        shape = SHAPES[int(rng.choice(len(SHAPES), p=SHAPE_WEIGHTS))]
    photo = photos[int(rng.integers(len(photos)))]
    box = _crop_box(rng, photo.size, shape)
    cut = photo.resize(shape, Image.Resampling.BICUBIC, box=box)
    pixels = _jitter(rng, np.asarray(cut), photo.mode == "L")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=QUALITY, subsampling="4:2:0")
    return out.getvalue()


def _write_jpegs(photos: list, seed: int, jobs: list, threads: int) -> list[int]:
    """Writes each (index, path, shape) job's image; returns the files' sizes."""

    def one(job) -> int:
        index, path, shape = job
        data = make_image(photos, seed, index, shape)
        path.write_bytes(data)
        return len(data)

    # Pillow releases the GIL while it resizes and encodes, so threads use every core.
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, jobs))


def _stored_pixels(path: Path) -> np.ndarray:
    """One file decoded, its shorter side resized to 256 and centre-cropped: (256, 256, 3)."""
    from PIL import Image, ImageOps

    with Image.open(path) as image:
        fitted = ImageOps.fit(image.convert("RGB"), (STORED_SIDE, STORED_SIDE),
                              Image.Resampling.BILINEAR)
    return np.asarray(fitted)


def _write_pixels(folder: Path, dest: Path, threads: int) -> None:
    """The `pixels` dataset: every file of `folder` decoded to 256x256x3, and its label."""
    import loaderx

    files = sorted(folder.glob("class_*/*.jpg"))
    labels = np.array([int(p.parent.name.split("_")[1]) for p in files], dtype=np.int64)
    scratch = dest.parent / "pixels.npy"
    pixels = np.lib.format.open_memmap(
        scratch, "w+", np.uint8, (len(files), STORED_SIDE, STORED_SIDE, 3)
    )

    def one(position: int) -> None:
        pixels[position] = _stored_pixels(files[position])

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(files))))
    pixels.flush()
    loaderx.convert({"image": pixels, "label": labels}, str(dest), codec="raw",
                    progress="off", mode="overwrite")
    del pixels
    scratch.unlink()


def _write_stores(root: Path, threads: int) -> Path:
    """The loaderx datasets of a finished JPEG set (once per loaderx version)."""
    import loaderx

    stores = root / f"loaderx-{loaderx.__version__}"
    marker = stores / "done.json"
    if marker.is_file():
        return stores
    shutil.rmtree(stores, ignore_errors=True)
    stores.mkdir(parents=True)
    for folder, name in (("folder", "jpeg"), ("uniform", "uniform-jpeg")):
        # What users write (README, issue 41): the files' bytes untouched, in a Zrecord.
        loaderx.convert(str(root / folder), str(stores / name), keep_encoded=True,
                        progress="off")
    _write_pixels(root / "folder", stores / "pixels", threads)
    marker.write_text(json.dumps({"loaderx": loaderx.__version__}))
    return stores


def _generate(root: Path, photo_files: list[Path], count: int, seed: int, threads: int,
              key: str) -> dict:
    photos = load_photos(photo_files)
    for label in range(CLASS_COUNT):
        (root / "folder" / f"class_{label:02d}").mkdir(parents=True, exist_ok=True)
    (root / "uniform" / "all").mkdir(parents=True, exist_ok=True)
    jobs = [(i, root / "folder" / f"class_{i % CLASS_COUNT:02d}" / f"{i:06d}.jpg", None)
            for i in range(count)]
    uniform = uniform_count(count)
    # The uniform set's indices follow the main set's, so no image repeats another.
    jobs += [(count + i, root / "uniform" / "all" / f"{i:06d}.jpg", UNIFORM_SIZE)
             for i in range(uniform)]
    sizes = _write_jpegs(photos, seed, jobs, threads)
    info = {
        "key": key, "count": count, "uniform_count": uniform, "seed": seed,
        "mean_bytes": float(np.mean(sizes[:count])),
        "uniform_mean_bytes": float(np.mean(sizes[count:])) if uniform else 0.0,
        "photos": [p.name for p in photo_files], "quality": QUALITY,
        "pillow_libjpeg_turbo": _libjpeg_version(),
        "generator": GENERATOR_VERSION,
    }
    (root / "done.json").write_text(json.dumps(info, indent=1))
    return info


def uniform_count(count: int) -> int:
    return max(16, count // 5)


def prepare(cache: Path, count: int, seed: int = 0, log=print, threads: int | None = None) -> dict:
    """Makes (or finds) the data set of `count` images under `cache`; returns its description:
    the done.json fields plus "root", "folder", "uniform" and the loaderx datasets'
    "jpeg", "pixels" and "uniform_jpeg" paths."""
    if count < CLASS_COUNT:
        raise ValueError(f"count must be at least {CLASS_COUNT} (one image per class), got {count}")
    threads = threads or len(os.sched_getaffinity(0))
    photo_files = photo_paths()
    key = data_key(count, seed, photo_files)
    root = Path(cache) / "images-data" / key
    try:
        info = json.loads((root / "done.json").read_text())
        log(f"images: data set {key} found in {root}")
    except (OSError, ValueError):
        log(f"images: generating {count} JPEGs (+{uniform_count(count)} of 500x375) into {root}")
        shutil.rmtree(root, ignore_errors=True)
        info = _generate(root, photo_files, count, seed, threads, key)
    stores = _write_stores(root, threads)
    return {**info, "root": str(root), "folder": str(root / "folder"),
            "uniform": str(root / "uniform"), "jpeg": str(stores / "jpeg"),
            "pixels": str(stores / "pixels"), "uniform_jpeg": str(stores / "uniform-jpeg")}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=Path(__file__).resolve().parent.parent
                        / "bench-out")
    args = parser.parse_args()
    print(json.dumps(prepare(args.cache, args.count, args.seed), indent=1))
