"""`loaderx.convert` of images: image folders (dense, ragged or encoded
columns; mixed modes keep small modes), WebDataset tars (columns by
extension, workers, shards mixing JPEG and PNG, images past the probe that do
not fit), and their refusals: oversized and deep images, truncated or
damaged tars and members that do not fit are named, never clipped or
shortened."""
from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest
from _convert_checks import (
    as_text,
    nothing_left,
    npy_bytes,
    png_bytes,
    save_image,
    tar_files,
)
from _helpers import assert_same, convert_quiet

import loaderx
from loaderx import ShardSet
from loaderx.converters import ConvertError
from loaderx.dataset import read_manifest

pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")
Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")


# ----------------------------------------------------------------- image folders


def test_image_folder_dense_ragged_encoded(tmp_path):
    root = tmp_path / "imgs"
    expected = []
    for label, cls in enumerate(("cat", "dog")):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            a = np.random.default_rng(label * 10 + i).integers(0, 255, (5, 7, 3), dtype=np.uint8)
            Image.fromarray(a).save(root / cls / f"{i:02d}.png")
            expected.append((a, label))
    (root / "dog" / "notes.txt").write_text("not an image")
    ds = loaderx.convert(root, tmp_path / "d", workers=2)
    assert isinstance(ds["image"], ShardSet) and ds["image"].item_shape == (5, 7, 3)
    assert_same(ds["image"][:], np.stack([a for a, _ in expected]))
    assert_same(ds["label"][:], np.array([lab for _, lab in expected], np.int64))
    for v in ds.values():
        v.close()
    assert read_manifest(tmp_path / "d")["source"]["classes"] == ["cat", "dog"]
    odd = np.full((3, 2), 9, np.uint8)
    Image.fromarray(odd).save(root / "dog" / "99.png")
    ds = loaderx.convert(root, tmp_path / "r")
    assert ds["image"].kind == "ragged" and len(ds["image"]) == 13
    assert_same(ds["image"][12], odd)  # a ragged column keeps each image's mode
    assert_same(ds["image"][0], expected[0][0])
    for v in ds.values():
        v.close()
    ds = loaderx.convert(root, tmp_path / "e", keep_encoded=True)
    assert ds["image"].kind == "bytes" and ds["image"][12] == (root / "dog" / "99.png").read_bytes()
    for v in ds.values():
        v.close()


def _image(path, mode: str, size=(8, 8), fmt=None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new(mode, size).save(path, format=fmt)


def test_oversized_and_deep_images_are_refused_by_name(tmp_path):
    _image(tmp_path / "bomb" / "a" / "0.png", "1", size=(20000, 20000))
    with pytest.raises(ConvertError, match="0.png: not a readable image.*decompression bomb"):
        convert_quiet(tmp_path / "bomb", tmp_path / "out")
    # Float and 32-bit images mixed: converting to 8-bit RGB would clip them.
    _image(tmp_path / "deep" / "a" / "0.tif", "F", fmt="TIFF")
    _image(tmp_path / "deep" / "a" / "1.tif", "I", fmt="TIFF")
    with pytest.raises(ConvertError, match=r"modes \['F', 'I'\].*would lose values"):
        convert_quiet(tmp_path / "deep", tmp_path / "out")
    nothing_left(tmp_path)


# ----------------------------------------------------------------- WebDataset


def _tar(path, samples) -> None:
    with tarfile.open(path, "w") as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def _wds_samples(first: int, count: int):
    out = []
    for i in range(first, first + count):
        arr = np.full((3, 4), i, np.float32)
        npy = io.BytesIO()
        np.save(npy, arr)
        out.append(
            (
                f"shard/{i:05d}",
                {
                    "cls": str(i % 4).encode(),
                    "txt": f"caption {i}".encode(),
                    "png": png_bytes(np.full((6, 6), i, np.uint8)),
                    "npy": npy.getvalue(),
                },
            )
        )
    return out


def test_webdataset_columns_by_extension_and_workers(tmp_path):
    (tmp_path / "wds").mkdir()
    _tar(tmp_path / "wds" / "a-000.tar", _wds_samples(0, 7))
    _tar(tmp_path / "wds" / "a-001.tar", _wds_samples(7, 5))
    ds = loaderx.convert(tmp_path / "wds", tmp_path / "o", workers=2)
    assert list(ds) == ["cls", "txt", "image", "npy", "key"]
    assert ds["cls"].lengths == (7, 5)
    assert_same(ds["cls"][:], np.arange(12, dtype=np.int64) % 4)
    assert ds["txt"][:] == [f"caption {i}".encode() for i in range(12)]
    assert_same(ds["image"][:], np.stack([np.full((6, 6), i, np.uint8) for i in range(12)]))
    assert_same(ds["npy"][:], np.stack([np.full((3, 4), i, np.float32) for i in range(12)]))
    for v in ds.values():
        v.close()
    broken = _wds_samples(0, 3)
    del broken[2][1]["txt"]
    _tar(tmp_path / "bad.tar", broken)
    with pytest.raises(
        ConvertError, match=r"sample 'shard/00002' has no 'txt' member.*skip_columns=\['txt'\]"
    ):
        loaderx.convert(tmp_path / "bad.tar", tmp_path / "b")
    ds = loaderx.convert(
        tmp_path / "bad.tar", tmp_path / "b", skip_columns=["txt"], keep_encoded=True
    )
    assert ds["image"][0] == broken[0][1]["png"] and len(ds["cls"]) == 3
    for v in ds.values():
        v.close()


def test_a_truncated_or_damaged_tar_is_refused_not_shortened(tmp_path):
    samples = [(f"k{i:03d}.txt", b"text %d " % i * 20) for i in range(100)]
    tar_files(tmp_path / "good.tar", samples)
    assert len(convert_quiet(tmp_path / "good.tar", tmp_path / "ok")["txt"]) == 100
    data = (tmp_path / "good.tar").read_bytes()
    with tarfile.open(tmp_path / "good.tar") as tf:
        boundary = tf.getmembers()[40].offset
    damaged = bytearray(data)
    damaged[boundary : boundary + 512] = b"\x07" * 512
    for name, content, why in (
        ("half.tar", data[: len(data) // 2 + 100], "truncated header"),
        ("boundary.tar", data[:boundary], "empty header"),
        ("garbled.tar", bytes(damaged), "invalid header"),
    ):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ConvertError, match=f"{name}: the archive ends after .*{why}"):
            convert_quiet(tmp_path / name, tmp_path / "out")
        nothing_left(tmp_path)
    tar_files(tmp_path / "good.tar.gz", samples, "w:gz")
    gz = (tmp_path / "good.tar.gz").read_bytes()
    (tmp_path / "half.tar.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(ConvertError, match="half.tar.gz: .*truncated"):
        convert_quiet(tmp_path / "half.tar.gz", tmp_path / "out")
    nothing_left(tmp_path)


def test_webdataset_members_that_do_not_fit_are_named(tmp_path):
    tar_files(tmp_path / "cls.tar", [("k0.cls", b"1"), ("k1.cls", b"2"), ("k2.cls", b"9" * 30)])
    with pytest.raises(ConvertError, match=r"cls.tar:k2.cls: holds b'9+', not an integer"):
        convert_quiet(tmp_path / "cls.tar", tmp_path / "out", allow_tiny_records=True)
    arrays = [np.zeros(i + 1, np.float64 if i < 70 else np.float32) for i in range(80)]
    tar_files(tmp_path / "npy.tar", [(f"k{i:02d}.npy", npy_bytes(a)) for i, a in enumerate(arrays)])
    with pytest.raises(ConvertError, match="npy.tar:k70.npy: array has dtype float32 but the"):
        convert_quiet(tmp_path / "npy.tar", tmp_path / "out")
    nothing_left(tmp_path)


# ----------------------------------------------------------------- real WebDataset tars


def _member_image(data: bytes, mode: str) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert(mode))


def _tar_members(paths) -> dict:
    out = {}
    for p in paths:
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                out[m.name] = tf.extractfile(m).read()
    return out


def test_webdataset_shards_mixing_jpg_and_png_convert(tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset is part of the test extra")
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 255, (12, 10, 3), dtype=np.uint8) for _ in range(23)]
    (tmp_path / "shards").mkdir()
    with wds.ShardWriter(str(tmp_path / "shards" / "train-%03d.tar"), maxcount=8, verbose=0) as w:
        for i, a in enumerate(images):
            w.write({"__key__": f"sample{i:04d}", "jpg" if i % 3 else "png": a, "cls": i % 5})
    shards = sorted((tmp_path / "shards").iterdir())
    assert len(shards) == 3
    ds = loaderx.convert(tmp_path / "shards", tmp_path / "d", workers=2, progress=False)
    assert list(ds) == ["cls", "image", "key"]
    assert ds["image"].kind == "dense" and ds["image"].item_shape == (12, 10, 3)
    members = _tar_members(shards)
    for i in range(23):
        ext = "jpg" if i % 3 else "png"
        want = _member_image(members[f"sample{i:04d}.{ext}"], "RGB")
        assert_same(ds["image"][i], want)
        if ext == "png":
            assert_same(ds["image"][i], images[i])
    assert_same(ds["cls"][:], np.arange(23, dtype=np.int64) % 5)
    assert as_text(ds["key"][:]) == [f"sample{i:04d}" for i in range(23)]
    m = read_manifest(tmp_path / "d")
    assert [f["path"] for f in m["source"]["files"]] == [p.name for p in shards]
    assert [f["rows"] for f in m["source"]["files"]] == [[0, 8], [8, 16], [16, 23]]
    for v in ds.values():
        v.close()
    # One column per extension on request; no key column on request.
    with wds.ShardWriter(str(tmp_path / "one-%03d.tar"), maxcount=100, verbose=0) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "png": images[i], "jpg": images[i]})
    with pytest.raises(ConvertError, match=r"sample 'k0' has 2 images .*image_column=None"):
        loaderx.convert(tmp_path / "one-000.tar", tmp_path / "e", progress=False)
    ds = loaderx.convert(
        tmp_path / "one-000.tar", tmp_path / "e", image_column=None, keys=False, progress=False
    )
    assert sorted(ds) == ["jpg", "png"] and ds["png"].item_shape == (12, 10, 3)
    for v in ds.values():
        v.close()


def test_tar_images_past_the_probe_that_do_not_fit_make_the_column_ragged(tmp_path):
    """The first 64 samples decide a dense column; a later image of another
    size or a wider mode makes it ragged instead of failing (or dropping
    its alpha channel)."""
    grey = [np.full((8, 8), i, np.uint8) for i in range(70)]
    wide = np.full((9, 8, 4), 200, np.uint8)
    samples = [(f"k{i:03d}", {"png": png_bytes(a)}) for i, a in enumerate(grey)]
    _tar(tmp_path / "w.tar", samples + [("k999", {"png": png_bytes(wide)})])
    ds = loaderx.convert(tmp_path / "w.tar", tmp_path / "d", batch_bytes=1 << 10, progress=False)
    assert ds["image"].kind == "ragged" and len(ds["image"]) == 71
    assert_same(ds["image"][3], grey[3])
    assert_same(ds["image"][70], wide)
    assert read_manifest(tmp_path / "d")["columns"]["image"]["image_mode"] == "per-image"
    for v in ds.values():
        v.close()


def test_deep_images_after_the_probe_are_not_clipped(tmp_path):
    gray = [(f"k{i:03d}.png", _encoded("L")) for i in range(70)]
    tar_files(tmp_path / "w.tar", gray + [("k999.png", _encoded("I;16"))])
    with pytest.raises(ConvertError, match="k999.png: the image has the Pillow mode 'I;16'"):
        convert_quiet(tmp_path / "w.tar", tmp_path / "out")
    nothing_left(tmp_path)


def _encoded(mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (8, 8)).save(buf, format="PNG")
    return buf.getvalue()


# ----------------------------------------------------------------- image modes


def test_mixed_mode_image_folders_keep_small_modes(tmp_path, capsys):
    root = tmp_path / "imgs"
    grey = [save_image(root / "a" / f"{i}.png", "L", (20 + i, 16), i) for i in range(6)]
    rgb = save_image(root / "b" / "0.png", "RGB", (16, 16), (1, 2, 3))
    rgba = save_image(root / "b" / "1.png", "RGBA", (16, 17), (1, 2, 3, 4))
    with pytest.warns(UserWarning, match=r"decoded, the images .*keep_encoded=True") as caught:
        ds = loaderx.convert(root, tmp_path / "d", progress="log")
    assert [w.filename for w in caught] == [__file__]  # the caller's line, not loaderx's
    assert ds["image"].kind == "ragged"
    for i in range(6):
        assert_same(ds["image"][i], grey[i])  # one byte per pixel, as in the file
    assert_same(ds["image"][6], rgb)
    assert_same(ds["image"][7], rgba)
    col = read_manifest(tmp_path / "d")["columns"]["image"]
    assert col["image_mode"] == "per-image"
    assert col["image_modes"] == {"L": 6, "RGB": 1, "RGBA": 1}
    assert "each in its own mode" in capsys.readouterr().err
    for v in ds.values():
        v.close()
    # One size: a dense column in the smallest mode that holds every image.
    for name, modes, want in (
        ("grey-rgb", [("L", 7), ("RGB", (7, 8, 9))], "RGB"),
        ("grey-alpha", [("L", 7), ("LA", (7, 100))], "LA"),
        ("palette", [("P", 3), ("1", 1)], "RGB"),
    ):
        for k, (mode, fill) in enumerate(modes):
            save_image(tmp_path / name / "x" / f"{k}.png", mode, (5, 4), fill)
        ds = loaderx.convert(tmp_path / name, tmp_path / f"o-{name}", progress=False)
        assert read_manifest(tmp_path / f"o-{name}")["columns"]["image"]["image_mode"] == want
        for k, (mode, fill) in enumerate(modes):
            with Image.open(tmp_path / name / "x" / f"{k}.png") as im:
                assert_same(ds["image"][k], np.asarray(im.convert(want)))
        for v in ds.values():
            v.close()
