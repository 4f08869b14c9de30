"""The seeded fuzz corpus of hostile dataset manifests (tests/faults/test_corruption_corpus.py).

A template dataset directory is made from the five base stores of
tests/_fuzz_cases.py (a quarter of the manifests are version 1, without a
generation, over the same paths): generation ``gen-000001`` holds two parts of each base
under a column directory named after it, plus ``sp/``, a small valid dataset
directory (a split), and next to the dataset lie copies of the bases that
symlinks may point at. `make_manifest_case(bases, seed, i)` gives case i: a
``loaderx.json`` (a valid manifest mutated field by field, path by path, type
by type, byte by byte, or a splits manifest) and changes to the layout
(symlinks out, a FIFO or a directory where a file should be, a part replaced
by another base's store, a missing generation). The "typed" family adds
to dataset 0 a categorical column ``codes`` with its validity mask ``mask``
and changes their typed fields (``valid``, ``valid_of``, ``categories``,
``text``, ``labels``): such a dataset is refused at open, or its codes read
as written and ``codes IS NULL`` finds exactly the null codes.

What a correct `open_dataset` may do with a case: refuse it with a loaderx
exception, or open it and give, for every column, exactly the records of the
parts its manifest names, in that order, with the kind, dtype and item_shape
the manifest declares (which must be the parts'). Anything else is a
"wrong data" problem; the driver adds crash, hang and leak checks.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import shutil

import numpy as np

GEN = "gen-000001"
#: Each base's codec as build_bases makes it.
CODECS = {
    "dense_raw": "raw",
    "dense_zstd": "zstd",
    "ragged_1d": "raw",
    "ragged_nd": "zstd",
    "bytes_dict": "zstd_dict",
}
#: Two datasets over the template: columns of equal row counts.
DATASETS = (("dense_raw", "dense_zstd", "ragged_1d"), ("ragged_nd", "bytes_dict"))


@dataclasses.dataclass
class ManifestCase:
    index: int
    family: str
    what: str
    manifest: bytes
    ops: list  # layout changes: (kind, rel path, argument)
    parts: dict  # normalized rel path -> base name, after the ops
    base: str = "dataset"


def _part(base: str, k: int) -> str:
    return f"{GEN}/{base}/part-{k:05d}"


def template_parts() -> dict:
    return {_part(b, k): b for b in CODECS for k in range(2)}


def _identity(base) -> dict:
    dtype, shape, _ = base.records[0]
    entry = {"kind": base.kind, "dtype": "uint8" if base.kind == "bytes" else str(np.dtype(dtype)),
             "item_shape": list(shape) if base.kind == "dense" else None,
             "codec": CODECS[base.name]}
    return entry


def valid_manifest(bases: dict, which: int) -> dict:
    names = DATASETS[which]
    rows = len(bases[names[0]].records)
    columns = {}
    for name in names:
        entry = _identity(bases[name])
        entry["shards"] = [{"path": _part(name, k), "rows": rows} for k in range(2)]
        columns[name] = entry
    return {"format": "loaderx-dataset", "version": 2, "generation": GEN, "rows": 2 * rows,
            "columns": columns, "source": {"type": "fuzz"}}


#: The typed columns of dataset 0 (see `typed_manifest`), two parts each:
#: int8 codes into CATEGORIES (-1: null) and their bool validity mask
#: ``mask``; a nullable int16 column ``num`` (0 where null) and its mask ``nmask``.
CATEGORIES = ["a", "b", "c"]
TYPED = ("codes", "mask", "num", "nmask")


def typed_values(rows: int) -> dict:
    """The values of one part of each typed column."""
    codes = (np.arange(rows) % 4 - 1).astype(np.int8)
    num = (np.arange(rows) % 5).astype(np.int16)
    return {"codes": codes, "mask": codes >= 0, "num": num, "nmask": num != 0}


def write_typed_parts(ds: str, rows: int) -> None:
    from loaderx import DenseStore

    for k in range(2):
        for name, values in typed_values(rows).items():
            with DenseStore(os.path.join(ds, GEN, name, f"part-{k:05d}"), values.dtype, (),
                            codec="raw") as store:
                store.append(values)


def typed_manifest(bases: dict) -> dict:
    """Dataset 0 with a nullable categorical column ``codes`` (its mask is
    ``mask``) and a nullable int column ``num`` (its mask is ``nmask``)."""
    m = valid_manifest(bases, 0)
    rows = m["rows"] // 2
    for name, dtype in (("codes", "int8"), ("mask", "bool"), ("num", "int16"), ("nmask", "bool")):
        m["columns"][name] = {"kind": "dense", "dtype": dtype, "item_shape": [], "codec": "raw",
                              "shards": [{"path": f"{GEN}/{name}/part-{k:05d}", "rows": rows}
                                         for k in range(2)]}
    m["columns"]["codes"].update(categories=list(CATEGORIES), valid="mask")
    m["columns"]["mask"]["valid_of"] = "codes"
    m["columns"]["num"]["valid"] = "nmask"
    m["columns"]["nmask"]["valid_of"] = "num"
    return m


def write_template(root: str, bases: dict) -> None:
    """The template dataset at `root`/ds (without a manifest) and the bases
    outside it at `root`/outside-<base>."""
    from _lxformat import StoreImage

    ds = os.path.join(root, "ds")
    for rel in template_parts():
        StoreImage(bases[rel.split("/")[1]].files).write(os.path.join(ds, rel))
    write_typed_parts(ds, len(bases[DATASETS[0][0]].records))
    sp = os.path.join(ds, GEN, "sp")
    StoreImage(bases["bytes_dict"].files).write(os.path.join(sp, GEN, "b", "part-00000"))
    m = valid_manifest(bases, 1)
    m["columns"] = {"b": dict(m["columns"]["bytes_dict"])}
    m["columns"]["b"]["shards"] = [{"path": f"{GEN}/b/part-00000", "rows": m["rows"] // 2}]
    m["rows"] //= 2
    with open(os.path.join(sp, "loaderx.json"), "w") as f:
        json.dump(m, f)
    for name, base in bases.items():
        StoreImage(base.files).write(os.path.join(root, f"outside-{name}"))


# ----------------------------------------------------------------- mutations

HOSTILE_VALUES = (None, -1, 0, 2**64, -(2**63), 1.5, float("nan"), True, "", "x" * 5000,
                  "../x", [], {}, [[[[]]]], {"a": 1}, "\u2603", "gen-000001")


def _paths(obj, at=()):
    """Every (path, value) inside a JSON value."""
    yield at, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, at + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, at + (i,))


def _set(obj, at, value) -> None:
    for k in at[:-1]:
        obj = obj[k]
    obj[at[-1]] = value


def _delete(obj, at) -> None:
    for k in at[:-1]:
        obj = obj[k]
    del obj[at[-1]]


def fam_field(m, rng, k):
    """1-3 random fields set to hostile values or deleted."""
    whats = []
    for _ in range(rng.randint(1, 3)):
        at, _ = rng.choice([p for p in _paths(m) if p[0]])
        if rng.random() < 0.3:
            _delete(m, at)
            whats.append(f"del {'.'.join(map(str, at))}")
        else:
            value = rng.choice(HOSTILE_VALUES)
            _set(m, at, copy.deepcopy(value))
            whats.append(f"{'.'.join(map(str, at))}={str(value)[:20]!r}")
    return "; ".join(whats), []


PATH_VARIANTS = (
    "../outside-dense_raw", "/etc", f"{GEN}/../{GEN}/dense_raw/part-00000",
    f"{GEN}/dense_raw/part-00009", f"{GEN}/dense_raw", GEN, f"{GEN}/dense_raw/part-00000/meta",
    f"{GEN}\\dense_raw\\part-00000", f"{GEN}/dense_raw/part-00000\x00", f"{GEN}//dense_raw/part-00000",
    f"{GEN}/./dense_raw/part-00000", "gen-000002/dense_raw/part-00000", "dense_raw/part-00000",
    f"{GEN}/dense_zstd/part-00000", f"{GEN}/ragged_1d/part-00001", f"{GEN}/sp", "",
    f"{GEN}/" + "a/" * 200 + "p", f"{GEN}/dense_raw/part-00000/",
)


def fam_path(m, rng, k):
    """A shard path replaced (outside, absolute, missing, another kind's part...)."""
    variant = PATH_VARIANTS[k % len(PATH_VARIANTS)]
    col = rng.choice(list(m["columns"]))
    shard = rng.randrange(len(m["columns"][col]["shards"]))
    m["columns"][col]["shards"][shard]["path"] = variant
    return f"{col} shard {shard} path {variant[:40]!r}", []


TYPE_VARIANTS = (
    ("kind", "dense"), ("kind", "ragged"), ("kind", "bytes"), ("kind", "tensor"),
    ("dtype", "int64"), ("dtype", "float32"), ("dtype", "uint8"), ("dtype", "int32"),
    ("dtype", "<i4"), ("dtype", "object"), ("dtype", "[('a', '<i4')]"),
    ("item_shape", [6]), ("item_shape", [3, 2]), ("item_shape", []), ("item_shape", [40]),
    ("item_shape", [-1]), ("item_shape", None), ("codec", "raw"), ("codec", "zstd"),
    ("codec", "zstd_dict"), ("codec", "lz4"),
)


def fam_type(m, rng, k):
    """A column's kind, dtype, item_shape or codec changed."""
    key, value = TYPE_VARIANTS[k % len(TYPE_VARIANTS)]
    col = rng.choice(list(m["columns"]))
    m["columns"][col][key] = copy.deepcopy(value)
    return f"{col}.{key}={value!r}", []


def fam_rows(m, rng, k):
    """Row counts changed, shards reordered, dropped or duplicated."""
    col = rng.choice(list(m["columns"]))
    shards = m["columns"][col]["shards"]
    variant = k % 7
    if variant == 0:
        shards[0]["rows"] += 1
        return f"{col} shard 0 rows + 1", []
    if variant == 1:
        shards[0]["rows"] -= 1
        m["rows"] -= 1
        for c in m["columns"].values():
            c["shards"][0]["rows"] = shards[0]["rows"]
        return "every shard 0 rows - 1 (and the total)", []
    if variant == 2:
        shards.reverse()
        return f"{col} shards reversed (valid: other order)", []
    if variant == 3:
        shards.append(copy.deepcopy(shards[0]))
        return f"{col} shard 0 twice", []
    if variant == 4:
        for c in m["columns"].values():
            c["shards"] = c["shards"] + [copy.deepcopy(c["shards"][0])]
        m["rows"] += shards[0]["rows"]
        return "every column's shard 0 twice (valid: duplicated rows)", []
    if variant == 5:
        m["columns"][col]["shards"] = []
        return f"{col} no shards", []
    m["rows"] = 2**63
    return "rows 2^63", []


META_VARIANTS = (
    ("version", 1), ("version", 3), ("version", 0), ("version", "2"), ("version", 2.0),
    ("version", True), ("generation", "gen-000002"), ("generation", "../gen-000001"),
    ("generation", "gen-1"), ("generation", "."), ("generation", None),
    ("generation", "gen-000001/dense_raw"), ("format", "loaderx-datasets"),
    ("columns", {}), ("columns", []),
)


def fam_meta(m, rng, k):
    """The manifest's format, version, generation or column table changed."""
    key, value = META_VARIANTS[k % len(META_VARIANTS)]
    m[key] = copy.deepcopy(value)
    return f"{key}={value!r}", []


BYTE_VARIANTS = ("truncate", "flip", "garbage", "deep", "utf8", "bom", "empty", "huge number",
                 "duplicate keys", "trailing garbage")


def mutate_bytes(data: bytes, rng, k) -> tuple[str, bytes]:
    variant = BYTE_VARIANTS[k % len(BYTE_VARIANTS)]
    if variant == "truncate":
        return variant, data[: rng.randrange(len(data))]
    if variant == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return variant, bytes(b)
    if variant == "garbage":
        return variant, rng.randbytes(rng.randint(1, 300))
    if variant == "deep":
        return variant, b"[" * 100_000 + b"]" * 100_000
    if variant == "utf8":
        return variant, data.replace(b"gen-000001", b"gen-\xff\xfe0001", 1)
    if variant == "bom":
        return variant, b"\xef\xbb\xbf" + data
    if variant == "empty":
        return variant, b""
    if variant == "huge number":
        return variant, data.replace(b'"rows": ', b'"rows": 1' + b"0" * 5000 + b" + ", 1)
    if variant == "duplicate keys":
        return variant, data.replace(b'"version": 2', b'"version": 2, "version": 7', 1)
    return variant, data + b" ,]}"


LAYOUT_VARIANTS = ("part symlink out", "column dir symlink out", "generation symlink",
                   "manifest is a directory", "manifest is a FIFO", "manifest symlink to /dev/zero",
                   "generation missing", "part swapped with another base's",
                   "part is a file", "part is empty", "generation is a file")


def fam_layout(m, rng, k, parts):
    """The file system under a valid manifest made hostile."""
    variant = LAYOUT_VARIANTS[k % len(LAYOUT_VARIANTS)]
    col = rng.choice(list(m["columns"]))
    rel = m["columns"][col]["shards"][rng.randrange(2)]["path"]
    if variant == "part symlink out":
        del parts[rel]  # the same records, but reached through a link: never a part
        return variant, [("symlink", rel, f"outside-{col}")]
    if variant == "column dir symlink out":
        return variant, [("symlink dir", os.path.dirname(rel), "outside-dir")]
    if variant == "generation symlink":
        return variant, [("symlink dir", GEN, "outside-dir")]
    if variant == "manifest is a directory":
        return variant, [("mkdir", "loaderx.json", None)]
    if variant == "manifest is a FIFO":
        return variant, [("fifo", "loaderx.json", None)]
    if variant == "manifest symlink to /dev/zero":
        return variant, [("devzero", "loaderx.json", None)]
    if variant == "generation missing":
        return variant, [("remove", GEN, None)]
    if variant == "part swapped with another base's":
        other = rng.choice([b for b in CODECS if b != col])
        parts[rel] = other
        return f"{variant} ({other})", [("copy part", rel, _part(other, 0))]
    if variant == "part is a file":
        return variant, [("file", rel, None)]
    if variant == "part is empty":
        return variant, [("empty dir", rel, None)]
    return variant, [("file", GEN, None)]


SPLIT_VARIANTS = ({"s": f"{GEN}/sp"}, {"s": f"{GEN}/sp", "t": f"{GEN}/sp"}, {"s": f"{GEN}/x"},
                  {"s": "sp"}, {"s": f"{GEN}/../{GEN}/sp"}, {"s": f"{GEN}/dense_raw"},
                  {"s": f"{GEN}/."}, {"s": GEN}, {}, [], {"s": None}, {"s": f"{GEN}/sp/{GEN}"})


def fam_splits(m, rng, k):
    """A manifest of splits (one valid split directory exists: sp)."""
    splits = SPLIT_VARIANTS[k % len(SPLIT_VARIANTS)]
    return f"splits {splits!r}"[:60], {"format": "loaderx-dataset", "version": 2,
                                       "generation": GEN, "splits": copy.deepcopy(splits)}


TYPED_VARIANTS = (
    ("num", "valid", "nope"), ("codes", "valid", "nope"), ("codes", "categories", 5),
    ("num", "valid", "codes"), ("codes", "valid", 3), ("codes", "categories", ["a"]),
    ("num", "valid", None), ("codes", "valid", ["mask"]), ("codes", "categories", [1, "a"]),
    ("num", "valid", "mask"), ("codes", "valid", "codes"), ("codes", "categories", []),
    ("nmask", "valid_of", "codes"), ("codes", "valid", "dense_raw"), ("codes", "text", True),
    ("num", "categories", ["x"]), ("codes", "valid", None), ("codes", "labels", 7),
    ("num", "valid", "nmask"), ("codes", "valid", "ragged_1d"), ("codes", "categories", "abc"),
    ("mask", "valid_of", 7), ("codes", "categories", {"a": 1}), ("ragged_1d", "text", True),
    ("mask", "valid_of", "dense_raw"), ("codes", "categories", [["a"]]),
    ("codes", "text", "yes"), ("mask", "valid_of", None), ("codes", "categories", [True]),
    ("codes", "labels", ["x", 1]), ("codes", "valid", "mask.valid"),
    ("codes", "categories", [1.5, 2.5]), ("mask", "class_names", ["n", "y"]),
    ("codes", "categories", [None, "a"]), ("dense_raw", "valid", "mask"),
    ("codes", "categories", ["x", "y", "z", "w"]), ("codes", "valid", "mask"),
    ("codes", "categories", [10, 20, 30]), ("dense_raw", "categories", ["a"]),
    ("ragged_1d", "categories", ["a"]), ("mask", "categories", ["a", "b"]),
)


def fam_typed(m, rng, k):
    """A typed-column field (valid, valid_of, categories, text, labels) changed
    or removed on the categorical column ``codes`` and its mask."""
    col, field, value = TYPED_VARIANTS[k % len(TYPED_VARIANTS)]
    if value is None:
        m["columns"][col].pop(field, None)
        return f"{col}: del {field}", []
    m["columns"][col][field] = copy.deepcopy(value)
    return f"{col}.{field}={str(value)[:30]}", []


SCHEDULE = ("field", "path", "type", "rows", "meta", "bytes", "layout", "splits", "field",
            "path", "type", "layout", "typed")


def make_manifest_case(bases: dict, seed: int, i: int) -> ManifestCase:
    """Case number i of the manifest corpus seeded by `seed` (a pure function
    of both and the bases)."""
    family = SCHEDULE[i % len(SCHEDULE)]
    k = i // len(SCHEDULE) * SCHEDULE.count(family) + SCHEDULE[: i % len(SCHEDULE)].count(family)
    rng = random.Random(f"loaderx-fuzz-manifest/{seed}/{i}")
    m = valid_manifest(bases, rng.randrange(2)) if family != "typed" else typed_manifest(bases)
    if rng.random() < 0.25:  # a version 1 manifest: the same paths, no generation
        m["version"] = 1
        del m["generation"]
    parts = template_parts()
    ops: list = []
    if family == "field":
        what, ops = fam_field(m, rng, k)
    elif family == "path":
        what, ops = fam_path(m, rng, k)
    elif family == "type":
        what, ops = fam_type(m, rng, k)
    elif family == "rows":
        what, ops = fam_rows(m, rng, k)
    elif family == "meta":
        what, ops = fam_meta(m, rng, k)
    elif family == "layout":
        what, ops = fam_layout(m, rng, k, parts)
    elif family == "splits":
        what, m = fam_splits(m, rng, k)
    elif family == "typed":
        what, ops = fam_typed(m, rng, k)
    data = json.dumps(m, indent=1).encode()
    if family == "bytes":
        what, data = mutate_bytes(data, rng, k)
    return ManifestCase(i, family, what, data, ops, parts)


# ----------------------------------------------------------------- running a case


def build_case(case: ManifestCase, template: str, workdir: str) -> str:
    """The case's dataset directory (a fresh copy of the template)."""
    root = os.path.join(workdir, "case")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    ds = os.path.join(root, "ds")
    shutil.copytree(os.path.join(template, "ds"), ds, symlinks=True)
    outside_dir = os.path.join(root, "outside-dir")
    os.makedirs(outside_dir)
    with open(os.path.join(ds, "loaderx.json"), "wb") as f:
        f.write(case.manifest)
    for kind, rel, arg in case.ops:
        path = os.path.join(ds, rel)
        if kind in ("symlink", "symlink dir", "remove", "file", "empty dir", "copy part",
                    "mkdir", "fifo", "devzero"):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
        if kind == "symlink":
            os.symlink(os.path.join(template, arg), path)
        elif kind == "symlink dir":
            os.symlink(outside_dir, path)
        elif kind == "file":
            with open(path, "wb") as f:
                f.write(b"not a store")
        elif kind in ("empty dir", "mkdir"):
            os.makedirs(path)
        elif kind == "copy part":
            shutil.copytree(os.path.join(template, "ds", arg), path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "devzero":
            os.symlink("/dev/zero", path)
    return ds


def _records(store, n: int) -> list:
    if store.kind == "dense":
        got = store[np.arange(n)]
        return [(got.dtype.str, tuple(r.shape), r.tobytes()) for r in got]
    out = []
    for r in store[np.arange(n)]:
        if isinstance(r, (bytes, bytearray)):
            out.append((None, None, bytes(r)))
        else:
            out.append((r.dtype.str, tuple(r.shape), np.ascontiguousarray(r).tobytes()))
    return out


def check_opened(case: ManifestCase, opened: dict, bases: dict, out) -> None:
    """Every opened column holds exactly the named parts' records, typed as
    the manifest says."""
    try:
        manifest = json.loads(case.manifest)
    except ValueError:
        out.problems.append({"kind": "wrong data", "message": "an unparsable manifest opened"})
        return
    if "splits" in manifest:
        for split, cols in opened.items():
            if manifest["splits"].get(split) != f"{GEN}/sp" or set(cols) != {"b"}:
                out.problems.append({"kind": "wrong data",
                                     "message": f"split {split!r} opened as {sorted(cols)}"})
        return
    for name, store in opened.items():
        if name in TYPED:
            continue  # the typed columns, held to their values below
        col = manifest["columns"][name]
        want = []
        for shard in col["shards"]:
            base = case.parts.get(os.path.normpath(shard["path"]).replace(os.sep, "/"))
            if base is None:
                out.problems.append({"kind": "wrong data",
                                     "message": f"column {name!r} opened {shard['path']!r}, "
                                                "a part the corpus never made"})
                return
            want.extend(bases[base].records)
            ident = _identity(bases[base])
            declared = {k: col.get(k) for k in ("kind", "dtype", "item_shape")}
            if {k: ident[k] for k in declared} != declared:
                out.problems.append({"kind": "wrong data",
                                     "message": f"column {name!r} opened as {declared}, its "
                                                f"part {shard['path']} holds {ident}"})
                return
        ok, got = out.call(f"{name}: read", lambda s=store: _records(s, len(s)))
        if ok and [r[2] for r in got] != [r[2] for r in want]:
            out.problems.append({"kind": "wrong data",
                                 "message": f"column {name!r}: records differ from its parts'"})
        elif ok and store.kind != "bytes" and [r[:2] for r in got] != [
                (np.dtype(d).str, tuple(s)) for d, s, _ in want]:
            out.problems.append({"kind": "wrong data",
                                 "message": f"column {name!r}: dtypes or shapes differ"})


def check_typed(opened: dict, out) -> None:
    """The typed columns, where they opened: the values as written, and a
    predicate's nulls are the rows the masks say (for ``codes``, also the
    rows whose code is -1), whatever the manifest's typed fields say; a
    select may refuse with a loaderx error (codes its categories do not name)."""
    import loaderx

    if "codes" not in opened:
        return
    half = typed_values(len(opened["codes"]) // 2)
    values = {name: np.concatenate([half[name]] * 2) for name in TYPED}
    for name in TYPED:
        ok, got = out.call(f"{name}: read", lambda n=name: np.asarray(opened[n][:]))
        if ok and not np.array_equal(got, values[name]):
            out.problems.append({"kind": "wrong data", "message": f"{name} differs from its parts"})
    for name, mask in (("codes", "mask"), ("num", "nmask")):
        ok, sub = out.call("select IS NULL", lambda n=name: loaderx.select(opened, f"{n} IS NULL"))
        if ok and sub[name].rows.tolist() != np.flatnonzero(~values[mask]).tolist():
            out.problems.append({"kind": "wrong data", "message": f"{name} IS NULL found "
                                                                  f"{len(sub[name])} rows"})
    codes = values["codes"]
    names = getattr(opened["codes"], "categories", None)
    if names:
        out.call("select =", lambda: loaderx.select(opened, f"codes = {names[0]!r}"))
        out.call("names_of", lambda: opened["codes"].names_of(codes))


def run_manifest_case(case: ManifestCase, bases: dict, template: str, workdir: str) -> dict:
    """Opens the case's dataset and holds what comes back to its parts."""
    import loaderx
    from _fuzz import Outcome, summarize

    ds = build_case(case, template, workdir)
    out = Outcome()
    ok, opened = out.call("open_dataset", lambda: loaderx.open_dataset(ds))
    if ok:
        out.opened += 1
        out.verified += 1
        try:
            check_opened(case, opened, bases, out)
            if case.family == "typed" and "splits" not in json.loads(case.manifest):
                check_typed(opened, out)
        finally:
            stores = [s for v in opened.values()
                      for s in (v.values() if isinstance(v, dict) else [v])]
            for s in stores:
                out.call("close", s.close)
    return summarize(out)
