"""The image stage (loaderx.image): pipelines as data, the native decode and
augment pass against Pillow's decoder and resampler, its randomness (pure in
seed, step and position), and the stage inside the DataLoader: resume,
shards, mixtures, views, Python streams, the torch and JAX adapters, remote
datasets, bad records, and the converter's max_side."""
from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import loaderx  # noqa: E402
from loaderx import image as li  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth picture with edges and a little noise (JPEG-friendly)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([128 + 100 * np.sin(x / (20 + seed) + y / 31),
                    128 + 90 * np.cos(x / 23 - y / (17 + seed)),
                    128 + 60 * np.sin((x + y) / 13)], -1)
    img[h // 4:h // 2, w // 3:w // 2] = (250, 40, 30)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _encode(pixels: np.ndarray, fmt: str = "JPEG", mode: str | None = None, **kw) -> bytes:
    im = Image.fromarray(pixels)
    if mode:
        im = im.convert(mode)
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def _pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _identity(h: int, w: int, dtype: str = "uint8") -> li.Pipeline:
    return li.Pipeline(li.Decode(), li.Resize((h, w)), li.ToArray(dtype))


TRAIN = li.Pipeline(li.Decode(), li.RandomResizedCrop(32), li.RandomHorizontalFlip(),
                    li.ToArray("uint8"))


@pytest.fixture(scope="module")
def jpegs():
    return [_encode(_photo(60 + 3 * i, 80 + 2 * i, i), quality=90) for i in range(24)]


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory, jpegs):
    """An image folder converted with keep_encoded: image (bytes), label, key."""
    root = tmp_path_factory.mktemp("img")
    for i, data in enumerate(jpegs):
        os.makedirs(root / "src" / f"c{i % 3}", exist_ok=True)
        (root / "src" / f"c{i % 3}" / f"{i:02d}.jpg").write_bytes(data)
    loaderx.convert(str(root / "src"), str(root / "lx"), keep_encoded=True, progress="off")
    return str(root / "lx")


@pytest.fixture(scope="module")
def image_ds(image_dir):
    return loaderx.open_dataset(image_dir)


# ---------------------------------------------------------------- pipelines as data

def test_a_pipeline_is_validated_printable_picklable_and_comparable():
    p = li.Pipeline(li.Decode(), li.Resize(256), li.CenterCrop(224),
                    li.ToArray("float32", layout="CHW", mean=MEAN, std=STD))
    assert p.shape() == (3, 224, 224) and p.dtype == np.float32
    assert "CenterCrop(size=(224, 224))" in repr(p)
    assert pickle.loads(pickle.dumps(p)) == p and hash(pickle.loads(pickle.dumps(p))) == hash(p)
    assert p != TRAIN
    with pytest.raises(ValueError, match="starts with Decode"):
        li.Pipeline(li.Resize(3), li.ToArray())
    with pytest.raises(TypeError, match="not an image op"):
        li.Pipeline(li.Decode(), "flip", li.ToArray())
    with pytest.raises(ValueError, match="mean has 2 values"):
        li.Pipeline(li.Decode(), li.CenterCrop(8), li.ToArray("float32", mean=(0, 0), std=STD))
    with pytest.raises(ValueError, match="uint8 keeps the pixels"):
        li.ToArray("uint8", mean=MEAN)
    with pytest.raises(ValueError, match="mode must be"):
        li.Decode(mode="CMYK")
    with pytest.raises(ValueError, match="scale must satisfy"):
        li.RandomResizedCrop(8, scale=(0.5, 2))
    with pytest.raises(ValueError, match="no fixed output size"):
        li.Pipeline(li.Decode(), li.Resize(256), li.ToArray()).shape()
    assert li.Pipeline(li.Decode(), li.Resize(16), li.ToArray()).shape((40, 80)) == (16, 32, 3)


def test_bad_arguments_name_themselves():
    """Before, ToArray(dtype=5) raised numpy's "Cannot interpret '5' as a data
    type", mean='abc' "could not convert string to float", and apply(step=-1)
    cffi's "can't convert negative number to unsigned"; a seed of -1 was
    taken as 2**64 - 1, which no loader accepts."""
    with pytest.raises(ValueError, match=r"ToArray: dtype must be one of .* got 5"):
        li.ToArray(dtype=5)
    assert li.ToArray(dtype=np.float16).dtype == "float16"
    for bad in ("abc", ["a", 1, 2]):
        with pytest.raises(TypeError, match=r"ToArray: mean must be a sequence of numbers"):
            li.ToArray("float32", mean=bad)
    p = li.Pipeline(li.Decode(), li.CenterCrop(8), li.ToArray())
    pixels = np.zeros((1, 8, 8, 3), np.uint8)
    for name, value in (("step", -1), ("step", 2**64), ("seed", -1), ("position", True),
                        ("seed", 1.0)):
        with pytest.raises(ValueError, match=rf"Pipeline.apply: {name} must be an int in "
                                             rf"\[0, 2\*\*64\), got {value!r}"):
            p.apply(pixels, **{name: value})
    assert p.apply(pixels, seed=2**64 - 1, step=2**64 - 1).shape == (1, 8, 8, 3)
    # (before: bytes()'s "string argument without an encoding", and float
    # pixels read as encoded records: "not a JPEG or PNG image")
    with pytest.raises(TypeError, match="record 0 is a str, not the bytes of an encoded image"):
        p.apply(["abc"])
    with pytest.raises(TypeError, match=r"pixel records are a uint8 array .* got float32 "
                                        r"\(1, 8, 8, 3\)"):
        p.apply(pixels.astype(np.float32))


def test_a_pipeline_without_a_fixed_size_is_refused_when_the_loader_is_built(image_ds):
    free = li.Pipeline(li.Decode(), li.Resize(16), li.ToArray())
    with pytest.raises(ValueError, match="no fixed output size"):
        loaderx.DataLoader(image_ds, batch_size=4, image={"image": free})
    with pytest.raises(TypeError, match="holds dense int64"):
        loaderx.DataLoader(image_ds, batch_size=4, image={"label": TRAIN})
    with pytest.raises(ValueError, match="not one of"):
        loaderx.DataLoader(image_ds, batch_size=4, image={"nope": TRAIN})


# ---------------------------------------------------------------- decoding

@pytest.mark.parametrize("kw", [dict(quality=90), dict(quality=90, subsampling=0),
                                dict(quality=80, progressive=True)])
def test_a_jpeg_decodes_exactly_as_pillow_decodes_it(kw):
    data = _encode(_photo(45, 61, 1), **kw)
    got = _identity(45, 61).apply([data])[0]
    assert np.array_equal(got, _pil_rgb(data))


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_greyscale_and_cmyk_jpegs_come_out_rgb(mode):
    data = _encode(_photo(40, 50, 2), mode=mode, quality=92)
    got = _identity(40, 50).apply([data])[0].astype(int)
    assert np.abs(got - _pil_rgb(data)).max() <= 1


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "1", "I;16"])
def test_pngs_of_every_mode_come_out_rgb_as_pillow_reads_them(mode):
    pixels = _photo(23, 37, 3)
    if mode == "I;16":
        im = Image.fromarray((pixels[..., 0].astype(np.uint16) * 257))
        buf = io.BytesIO()
        im.save(buf, "PNG")
        data = buf.getvalue()
        want = np.repeat(pixels[..., :1], 3, axis=2)  # the high byte of each sample
    else:
        data = _encode(pixels, "PNG", mode=mode)
        want = _pil_rgb(data)
    assert np.array_equal(_identity(23, 37).apply([data])[0], want)


def test_greyscale_output_is_pillow_s_luma():
    data = _encode(_photo(20, 30, 4), "PNG")
    p = li.Pipeline(li.Decode(mode="L"), li.Resize((20, 30)), li.ToArray())
    got = p.apply([data])[0]
    assert got.shape == (20, 30, 1)
    want = np.asarray(Image.open(io.BytesIO(data)).convert("L"))
    assert np.abs(got[..., 0].astype(int) - want).max() <= 1


def test_pixel_records_go_through_the_same_pipeline(jpegs):
    pixels = np.stack([_photo(40, 40, i) for i in range(3)])
    p = li.Pipeline(li.Decode(), li.Resize((40, 40)), li.ToArray())
    assert np.array_equal(p.apply(pixels), pixels)
    grey = pixels[..., 0]
    assert np.array_equal(p.apply(grey), np.repeat(grey[..., None], 3, axis=3))


# ---------------------------------------------------------------- resampling

def test_a_resize_is_pillow_s_antialiased_bilinear_within_rounding():
    pixels = _photo(120, 160, 5)
    data = _encode(pixels, "PNG")
    got = li.Pipeline(li.Decode(), li.Resize((45, 70)), li.ToArray()).apply([data])[0]
    want = np.asarray(Image.fromarray(pixels).resize((70, 45), Image.Resampling.BILINEAR))
    diff = np.abs(got.astype(int) - want)
    assert diff.mean() < 0.6 and diff.max() <= 3


def test_resize_then_centre_crop_is_torchvision_s_validation_recipe():
    pixels = _photo(90, 120, 6)
    data = _encode(pixels, "PNG")
    p = li.Pipeline(li.Decode(), li.Resize(64), li.CenterCrop(56), li.ToArray())
    got = p.apply([data])[0]
    # torchvision: shorter side 90 -> 64, longer int(64 * 120 / 90) = 85; crop at
    # round((64 - 56) / 2) = 4, round((85 - 56) / 2) = 14 (half to even).
    resized = np.asarray(Image.fromarray(pixels).resize((85, 64), Image.Resampling.BILINEAR))
    want = resized[4:60, 14:70]
    diff = np.abs(got.astype(int) - want)
    assert diff.mean() < 0.6 and diff.max() <= 3


def test_a_centre_crop_larger_than_the_image_pads_with_zeros():
    pixels = _photo(10, 12, 7)
    got = li.Pipeline(li.Decode(), li.CenterCrop((14, 12)), li.ToArray()).apply(pixels[None])[0]
    assert np.array_equal(got[2:12], pixels) and not got[:2].any() and not got[12:].any()


def test_float_output_is_the_uint8_output_normalised(jpegs):
    u8 = li.Pipeline(li.Decode(), li.RandomResizedCrop(24), li.ToArray("uint8"))
    f32 = li.Pipeline(li.Decode(), li.RandomResizedCrop(24),
                      li.ToArray("float32", layout="CHW", mean=MEAN, std=STD))
    f16 = li.Pipeline(li.Decode(), li.RandomResizedCrop(24),
                      li.ToArray("float16", layout="CHW", mean=MEAN, std=STD))
    a = u8.apply(jpegs[:4], seed=1, step=2)
    b = f32.apply(jpegs[:4], seed=1, step=2)
    c = f16.apply(jpegs[:4], seed=1, step=2)
    want = (a.transpose(0, 3, 1, 2) / 255.0 - np.reshape(MEAN, (3, 1, 1))) / \
        np.reshape(STD, (3, 1, 1))
    assert b.dtype == np.float32 and c.dtype == np.float16
    assert np.abs(b - want).max() < 0.6 / 255 / min(STD)
    assert np.abs(c.astype(np.float32) - b).max() < 0.01


# ---------------------------------------------------------------- randomness

def test_draws_are_a_pure_function_of_seed_step_and_position(jpegs):
    a = TRAIN.apply(jpegs[:8], seed=3, step=5)
    assert np.array_equal(a, TRAIN.apply(jpegs[:8], seed=3, step=5))
    # A record keeps its augmentation at its position, whatever comes with it.
    assert np.array_equal(a[5:], TRAIN.apply(jpegs[5:8], seed=3, step=5, position=5))
    assert not np.array_equal(a, TRAIN.apply(jpegs[:8], seed=3, step=6))
    assert not np.array_equal(a, TRAIN.apply(jpegs[:8], seed=4, step=5))


def test_random_resized_crops_follow_torchvision_s_area_and_aspect_rule():
    # A ramp image: the crop's box shows in the output's corner values.
    w, h = 200, 100
    ramp = np.zeros((h, w, 3), np.uint8)
    ramp[..., 0] = np.arange(w)[None, :] * 255 // (w - 1)
    ramp[..., 1] = np.arange(h)[:, None] * 255 // (h - 1)
    p = li.Pipeline(li.Decode(), li.RandomResizedCrop(16, scale=(0.25, 0.25), ratio=(1, 1)),
                    li.ToArray())
    out = p.apply(np.repeat(ramp[None], 64, axis=0), seed=0, step=0).astype(float)
    # Area 1/4 at aspect 1: a box of round(sqrt(5000)) = 71 pixels a side.
    span_x = (out[:, 0, -1, 0] - out[:, 0, 0, 0]) * (w - 1) / 255
    span_y = (out[:, -1, 0, 1] - out[:, 0, 0, 1]) * (h - 1) / 255
    assert np.all(np.abs(span_x - 71 * 15 / 16) < 4) and np.all(np.abs(span_y - 71 * 15 / 16) < 4)
    left = out[:, 0, 0, 0] * (w - 1) / 255
    assert left.min() < 20 and left.max() > w - 71 - 20  # the place is uniform over the image


def test_a_flip_mirrors_the_crop():
    pixels = _photo(30, 40, 8)
    keep = li.Pipeline(li.Decode(), li.CenterCrop(20), li.RandomHorizontalFlip(0),
                       li.ToArray())
    flip = li.Pipeline(li.Decode(), li.CenterCrop(20), li.RandomHorizontalFlip(1),
                       li.ToArray())
    assert np.array_equal(flip.apply(pixels[None])[0], keep.apply(pixels[None])[0][:, ::-1])


# ---------------------------------------------------------------- in the loader

def _records(ds, indices):
    return [ds["image"][int(i)] for i in indices]


def test_a_loader_batch_is_the_pipeline_on_the_step_s_records(image_ds):
    with loaderx.DataLoader(image_ds, batch_size=6, seed=7, image={"image": TRAIN},
                            stop_after=3) as loader:
        seen = 0
        for step, batch in enumerate(loader):
            idx = loaderx.Sampler(len(image_ds["image"]), 6, seed=7).at(step)
            assert batch["image"].shape == (6, 32, 32, 3) and batch["image"].dtype == np.uint8
            want = TRAIN.apply(_records(image_ds, idx), seed=7, step=step)
            assert np.array_equal(batch["image"], want)
            assert np.array_equal(batch["label"], image_ds["label"][idx])
            seen += 1
    assert seen == 3


def test_resume_is_exact_and_the_thread_count_changes_nothing(image_ds):
    def run(workers, stop, state=None):
        with loaderx.DataLoader(image_ds, batch_size=4, seed=1, image={"image": TRAIN},
                                workers=workers, stop_after=stop) as loader:
            if state is not None:
                loader.load_state_dict(state)
            batches = [b["image"] for b in loader]
            return batches, loader.state_dict()
    whole, _ = run(2, 8)
    single, _ = run(1, 8)
    assert len(single) == len(whole) == 8
    assert all(np.array_equal(a, b) for a, b in zip(whole, single))
    first, state = run(2, 3)
    rest, _ = run(1, 8, state)
    assert len(first) == 3 and len(first) + len(rest) == len(whole) == 8
    assert all(np.array_equal(a, b) for a, b in zip(whole, first + rest))


def test_ranks_sharing_a_step_see_what_one_process_sees(image_ds):
    with loaderx.DataLoader(image_ds, batch_size=8, seed=2, image={"image": TRAIN}) as one:
        whole = next(one)["image"]
    for rank in (0, 1):
        with loaderx.DataLoader(image_ds, batch_size=4, seed=2, image={"image": TRAIN},
                                shard=(rank, 2)) as part:
            assert np.array_equal(next(part)["image"], whole[4 * rank:4 * rank + 4])


def test_mixtures_views_shards_and_python_streams_take_pipelines(image_ds, tmp_path, jpegs):
    view = loaderx.select(image_ds, np.arange(len(jpegs)) % 2 == 0)
    mix = loaderx.Mixture({"a": image_ds, "b": view}, weights={"a": 1, "b": 1})
    with loaderx.DataLoader(mix, batch_size=6, seed=0, image={"image": TRAIN}) as loader:
        assert next(loader)["image"].shape == (6, 32, 32, 3)
    sharded = loaderx.convert({"image": np.stack([_photo(40, 40, i) for i in range(12)])},
                              str(tmp_path / "px"), workers=2, codec="raw", progress="off")
    p = li.Pipeline(li.Decode(), li.RandomResizedCrop(16), li.ToArray("float32"))
    with loaderx.DataLoader(sharded, batch_size=4, seed=0, image={"image": p}) as loader:
        native = next(loader)["image"]
    pixels = {"image": np.stack([_photo(40, 40, i) for i in range(12)])}  # a Python stream
    with loaderx.DataLoader(pixels, batch_size=4, seed=0, image={"image": p}) as loader:
        assert np.array_equal(next(loader)["image"], native)


def test_a_transform_with_a_generator_augments_reproducibly(image_ds):
    def transform(batch, rng):
        batch["noise"] = rng.integers(0, 1 << 30, 3)
        return batch

    def run(workers, stop, state=None):
        with loaderx.DataLoader(image_ds, batch_size=4, seed=5, transform=transform,
                                image={"image": TRAIN}, workers=workers,
                                stop_after=stop) as loader:
            if state is not None:
                loader.load_state_dict(state)
            out = [(b["noise"].tolist(), b["position"].tolist()) for b in loader]
            return out, loader.state_dict()
    whole, _ = run(2, 6)
    assert whole == run(1, 6)[0]
    assert whole[1][1] == [4, 5, 6, 7]  # the records' global positions
    first, state = run(2, 2)
    assert first + run(1, 6, state)[0] == whole


def test_a_bad_record_names_the_dataset_column_and_record(tmp_path, jpegs):
    records = list(jpegs[:6])
    records[4] = records[4][: len(records[4]) // 2]  # truncated
    with loaderx.Zrecord(str(tmp_path / "z"), create=True) as z:
        z.append(records)
    ds = {"image": loaderx.Zrecord(str(tmp_path / "z"))}
    with loaderx.DataLoader(ds, batch_size=6, mode="sequential", image={"image": TRAIN}) as L:
        with pytest.raises(loaderx.ImageError, match=r"z: image column 'image': record 4: "
                                                     r"a damaged JPEG"):
            next(L)
    skip = li.Pipeline(li.Decode(on_error="skip"), li.RandomResizedCrop(32), li.ToArray())
    with loaderx.DataLoader(ds, batch_size=6, mode="sequential", image={"image": skip}) as L:
        batch = next(L)["image"]
        assert L.stats() == {"images_skipped": 1}
    # Slot 4 holds record 5 with slot 4's own draws.
    assert np.array_equal(batch[4], skip.apply([records[5]], step=0, position=4)[0])
    with pytest.raises(loaderx.ImageError, match="record 1: not a JPEG or PNG"):
        TRAIN.apply([jpegs[0], b"GIF89a..."])


def test_hostile_records_fail_cleanly_never_crash(jpegs):
    png = _encode(_photo(30, 30, 9), "PNG")
    rng = np.random.default_rng(0)
    cases = []
    for good in (jpegs[0], png):
        cases += [good[:n] for n in rng.integers(0, len(good), 40)]
        for _ in range(60):
            bad = bytearray(good)
            for at in rng.integers(0, len(bad), 3):
                bad[at] ^= 1 << int(rng.integers(0, 8))
            cases.append(bytes(bad))
        cases += [b"", b"\xff\xd8\xff", os.urandom(500)]
    for tiny in (_encode(_photo(1, 1, 0)), _encode(_photo(1, 1, 0), "PNG")):
        assert TRAIN.apply([tiny]).shape == (1, 32, 32, 3)  # a 1x1 image upscales
        cases += [tiny[:len(tiny) // 2], tiny[:8], tiny[:-1]]  # and its truncations
    assert len(cases) == 2 * (40 + 60 + 3) + 2 * 3
    ran = failed = 0
    for case in cases:
        try:
            TRAIN.apply([case])
        except loaderx.ImageError:
            failed += 1
        ran += 1
    assert ran == len(cases) == 212
    # At least the two empty records, the two bare JPEG markers and the two 8-byte tiny heads.
    assert failed >= 6


def test_the_decoder_is_chosen_once_and_can_be_forced_builtin():
    info = li.decoder()
    assert "libjpeg-turbo" in info["jpeg"]
    code = ("import loaderx.image as li, json; print(json.dumps(li.decoder()))")
    env = {**os.environ, "LOADERX_LIBJPEG": "builtin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert '"path": null' in out and "built-in" in out
    env["LOADERX_LIBJPEG"] = os.path.abspath(__file__)  # not a library: refused, built-in used
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert "built-in" in out and "cannot be loaded" in out


def test_max_side_reencodes_only_the_larger_images(tmp_path):
    (tmp_path / "f" / "a").mkdir(parents=True)
    big, small = _encode(_photo(300, 450, 1), quality=95), _encode(_photo(50, 60, 2), "PNG")
    (tmp_path / "f" / "a" / "big.jpg").write_bytes(big)
    (tmp_path / "f" / "a" / "small.png").write_bytes(small)
    ds = loaderx.convert(str(tmp_path / "f"), str(tmp_path / "o"), keep_encoded=True,
                         max_side=100, progress="off")
    stored = {bytes(ds["key"][i]).decode(): ds["image"][i] for i in range(2)}
    assert stored["a/small.png"] == small
    shrunk = Image.open(io.BytesIO(stored["a/big.jpg"]))
    assert shrunk.format == "JPEG" and shrunk.size == (100, 67)
    # (the message said "max_side=True", not the value given)
    with pytest.raises(ValueError, match="max_side=100 shrinks the encoded images "
                                         "keep_encoded=True stores"):
        loaderx.convert(str(tmp_path / "f"), str(tmp_path / "o2"), max_side=100)


def test_the_torch_and_jax_adapters_hand_over_image_batches(image_ds):
    torch = pytest.importorskip("torch")
    import loaderx.torch as lt

    chw = li.Pipeline(li.Decode(), li.RandomResizedCrop(16),
                      li.ToArray("float32", layout="CHW", mean=MEAN, std=STD))

    arrays = {k: image_ds[k] for k in ("image", "label")}  # (JAX takes arrays only)

    def make_loader(rank, world):
        return loaderx.DataLoader(arrays, batch_size=4, seed=0, shard=(rank, world),
                                  image={"image": chw})
    batch = next(iter(lt.IterableDataset(make_loader)))
    assert isinstance(batch["image"], torch.Tensor) and batch["image"].shape == (4, 3, 16, 16)
    jax = pytest.importorskip("jax")
    import loaderx.jax as lj

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    with make_loader(0, 1) as loader:
        arr = next(lj.global_batches(loader, sharding))["image"]
    assert arr.shape == (4, 3, 16, 16) and np.allclose(np.asarray(arr), batch["image"].numpy())


def test_a_remote_image_dataset_goes_through_the_pipeline(image_ds, image_dir, tmp_path, s3):
    url = s3.upload_dir(image_dir, "images")
    remote = loaderx.open_dataset(url, cache_dir=str(tmp_path / "cache"),
                                  storage_options=s3.options())
    with loaderx.DataLoader(remote, batch_size=4, seed=3, image={"image": TRAIN}) as a, \
            loaderx.DataLoader(image_ds, batch_size=4, seed=3, image={"image": TRAIN}) as b:
        for _ in range(3):
            assert np.array_equal(next(a)["image"], next(b)["image"])
