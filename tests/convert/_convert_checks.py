"""What the converter tests share: the debris a conversion may leave next to
its destination, the check that a failed one left nothing, and sources made
of bytes: PNG and .npy bytes of an array, a tar of given members, an image
file of a mode, and key records read back as text."""
from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")


def leftovers(parent) -> list:
    """The names in `parent` of a conversion's staging directories and
    manifest swaps (none once a conversion has ended, however it ended)."""
    return [n for n in os.listdir(parent) if ".loaderx-" in n or n.startswith("loaderx.json.")]


def nothing_left(parent, name: str = "out") -> None:
    """A failed conversion into `parent`/`name` left no destination and no
    partial directory behind."""
    assert not os.path.exists(os.path.join(parent, name))
    assert [n for n in os.listdir(parent) if "loaderx-partial" in n] == []


def png_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def npy_bytes(array: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, **kw)
    return buf.getvalue()


def tar_files(path, members, mode="w") -> None:
    with tarfile.open(path, mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def save_image(path, mode: str, size, fill) -> np.ndarray:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    im = Image.new(mode, size, fill)
    im.save(path)
    return np.asarray(im)


def as_text(values) -> list:
    """Key records as str, whether the store gives UTF-8 columns back as
    bytes or as str."""
    return [v.decode() if isinstance(v, bytes) else v for v in values]
