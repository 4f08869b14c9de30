"""The bases of the fuzz corpus of hostile stores (tests/_fuzz_cases.py):
`build_bases` writes six small stores with loaderx (DenseStore raw and zstd,
RaggedStore 1-D and n-D, a zstd_dict Zrecord, a token store with its
windows.idx), the `Base` and `Case` records, and the helpers every family of
cases uses."""
from __future__ import annotations

import dataclasses
import json
import os
import random

import numpy as np

from _lxformat import StoreImage


BASE_NAMES = ("dense_raw", "dense_zstd", "ragged_1d", "ragged_nd", "bytes_dict", "tokens")
KINDS = {
    "dense_raw": "dense",
    "dense_zstd": "dense",
    "ragged_1d": "ragged",
    "ragged_nd": "ragged",
    "bytes_dict": "bytes",
    "tokens": "ragged",
}


@dataclasses.dataclass
class Base:
    name: str
    kind: str
    files: dict
    # Per record: (dtype str or None, shape tuple or None, payload bytes).
    records: list


@dataclasses.dataclass
class Case:
    index: int
    base: str
    family: str
    what: str
    image: StoreImage
    states: list | None
    compare: str = "typed"  # "typed": dtype, shape and bytes; "bytes": payload bytes only


# ----------------------------------------------------------------- bases


def _json_records(n: int, start: int = 0) -> list[bytes]:
    return [
        json.dumps(
            {
                "id": i,
                "name": f"user{i}",
                "tags": ["a", "b", str(i % 7)],
                "score": i * 3.5,
                "active": i % 3 == 0,
            }
        ).encode()
        for i in range(start, start + n)
    ]


def _typed_records(arrays) -> list:
    return [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]


def build_bases(root) -> dict[str, Base]:
    """Writes the five base stores under `root` and returns their images."""
    from loaderx import DenseStore, RaggedStore, Zrecord, train_dict

    rng = np.random.default_rng(20240611)
    made = {}
    dense = rng.integers(-1000, 1000, size=(6, 2, 3)).astype("<i4")
    with DenseStore(os.path.join(root, "dense_raw"), "<i4", (2, 3), codec="raw") as s:
        s.append(dense)
    made["dense_raw"] = _typed_records(list(dense))
    rows = np.concatenate(
        [(np.arange(120) % 5).reshape(3, 40), rng.integers(0, 60000, size=(3, 40))]
    )
    rows = rows.astype("<u2")
    with DenseStore(os.path.join(root, "dense_zstd"), "<u2", (40,), codec="zstd") as s:
        s.append(rows)
    made["dense_zstd"] = _typed_records(list(rows))
    ragged = [rng.standard_normal(n).astype("<f4") for n in (0, 1, 30, 100, 7, 64)]
    with RaggedStore(os.path.join(root, "ragged_1d"), "<f4", codec="raw") as s:
        s.append(ragged)
    made["ragged_1d"] = _typed_records(ragged)
    shapes = [(2, 3), (0, 4), (), (5,), (3, 1, 2), (40, 3), (4,)]
    nd = [rng.integers(-9, 9, size=sh).astype("<i2") for sh in shapes]
    nd[5] = np.zeros((40, 3), "<i2") + np.arange(3, dtype="<i2")
    with RaggedStore(os.path.join(root, "ragged_nd"), "<i2", codec="zstd") as s:
        s.append(nd)
    made["ragged_nd"] = _typed_records(nd)
    dict_bytes = train_dict(_json_records(300), size=1024)
    recs = _json_records(5, 1000) + [b"", bytes(rng.integers(0, 256, 50, dtype=np.uint8))]
    with Zrecord(
        os.path.join(root, "bytes_dict"), create=True, codec="zstd_dict", dict_bytes=dict_bytes
    ) as z:
        z.append(recs)
    made["bytes_dict"] = [(None, None, r) for r in recs]
    from loaderx import TokenWindows

    tokens = [(np.arange(n) % 97 * 3 + k).astype("<u2") for k, n in enumerate((40, 0, 300, 7, 129, 90))]
    with RaggedStore(os.path.join(root, "tokens"), "<u2", codec="zstd", frame_size=64) as s:
        s.append(tokens)
    with RaggedStore(os.path.join(root, "tokens")) as s:
        TokenWindows(s, 5)  # writes windows.idx
    made["tokens"] = _typed_records(tokens)
    return {
        name: Base(name, KINDS[name], StoreImage.load(os.path.join(root, name)).files, made[name])
        for name in BASE_NAMES
    }


def original_states(base: Base) -> list:
    """The one allowed state: the base's records, unchanged."""
    return [list(range(len(base.records)))]


def reseal_live(img: StoreImage) -> None:
    """Sets the commit's live_bytes to what the table says (verify checks it)."""
    total = img.live_total()
    if total <= img.commit()["data_size"]:
        img.put_commit(live_bytes=total)


def victim(img: StoreImage, rng: random.Random) -> int:
    return rng.randrange(img.count)
