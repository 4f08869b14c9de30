"""The cffi declarations in loaderx/_lib.py must match the exports of
src/capi.zig exactly, and the library must export nothing else."""
import os
import re
import shutil
import subprocess

import pytest

from loaderx import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAPI = os.path.join(ROOT, "src", "capi.zig")

# Zig parameter/return types used at the boundary -> their C spelling in the cdef.
ZIG_TO_C = {
    "u32": "uint32_t", "i32": "int32_t", "u64": "uint64_t", "c_int": "int", "void": "void",
    "[*:0]const u8": "const char *", "?[*:0]const u8": "const char *",
    "?[*]const u8": "const uint8_t *", "?[*]u8": "uint8_t *",
    "?[*]const u64": "const uint64_t *", "?[*]u64": "uint64_t *", "*u64": "uint64_t *",
    "?[*]const [*]const u8": "const uint8_t *const *",
    "*Store": "lx_store *", "?*Store": "lx_store *", "?*?*Store": "lx_store **",
    "?[*]const *Store": "lx_store *const *", "*Loader": "lx_loader *", "?*Loader": "lx_loader *",
    "?*?*Loader": "lx_loader **", "?[*]const [*]u8": "uint8_t *const *", "*u32": "uint32_t *",
    "*Info": "lx_info_t *", "*Store.Stats": "lx_stats_t *", "*[*]const u8": "const uint8_t **",
}


def _norm(c_type: str) -> str:
    return re.sub(r"\s+", " ", c_type.replace("*", " * ")).replace("* *", "**").strip()


def zig_exports():
    src = open(CAPI).read()
    out = {}
    for m in re.finditer(r"export fn (\w+)\((.*?)\)\s*([^{]+?)\s*\{", src, re.S):
        name, params, ret = m.group(1), m.group(2), m.group(3).strip()
        types = []
        for p in filter(None, (x.strip() for x in params.split(","))):
            types.append(ZIG_TO_C[p.split(":", 1)[1].strip()])
        out[name] = (ZIG_TO_C[ret], types)
    return out


def cdef_functions():
    out = {}
    for m in re.finditer(r"^([\w\s\*]+?)\s*\**\s*\b(lx_\w+)\((.*?)\);", _lib.CDEF, re.M | re.S):
        decl = m.group(0)
        head = decl[:decl.index(m.group(2))]
        params = m.group(3)
        types = []
        if params.strip() != "void":
            for p in params.split(","):
                p = p.strip()
                types.append(_norm(re.sub(r"\b\w+$", "", p)))
        out[m.group(2)] = (_norm(head), types)
    return out


def test_cdef_matches_zig_exports():
    zig = zig_exports()
    cdef = cdef_functions()
    assert sorted(zig) == sorted(cdef), "exported functions differ between capi.zig and _lib.CDEF"
    for name, (ret, params) in zig.items():
        c_ret, c_params = cdef[name]
        assert _norm(ret) == c_ret, f"{name}: return {ret} vs cdef {c_ret}"
        assert [_norm(p) for p in params] == c_params, f"{name}: params {params} vs cdef {c_params}"


def test_every_declared_function_resolves():
    for name in cdef_functions():
        assert getattr(_lib.lib, name) is not None


@pytest.mark.skipif(shutil.which("nm") is None or not _lib.LIBRARY_PATH.endswith(".so"), reason="needs nm and an ELF build")
def test_library_exports_only_loaderx_symbols():
    out = subprocess.run(["nm", "-D", "--defined-only", _lib.LIBRARY_PATH], capture_output=True, text=True, check=True)
    names = {line.split()[-1] for line in out.stdout.splitlines() if line.split()[-2] in "TtDdBbRrWwVv"}
    assert names, "nm found no symbols"
    foreign = sorted(n for n in names if not n.startswith("lx_"))
    assert not foreign, f"unexpected exported symbols: {foreign[:10]}"
    assert names == set(zig_exports())


def test_error_codes_cover_the_zig_result_enum():
    src = open(CAPI).read()
    body = src[src.index("pub const Result = enum(c_int) {"):]
    body = body[:body.index("};")]
    codes = {int(v) for v in re.findall(r"=\s*(-?\d+),", body)}
    assert codes - {0} == set(_lib._ERRORS), "every native error code needs exactly one exception class"


def test_versions():
    assert re.fullmatch(r"\d+\.\d+\.\d+", _lib.version())
    assert _lib.lib.lx_format_version() >= 1
    assert _lib.lib.lx_zstd_version() >= 10500
    assert _lib.lib.lx_lanes() >= 1
