"""The bindings cannot drift: loaderx/_abi.py is generated from the C ABI
(src/capi.zig and its area files, src/capi/*.zig) by `zig build bindings`,
this test regenerates it and fails on any difference, and the library exports
exactly the functions it declares."""
import os
import re
import shutil
import subprocess

import pytest

from loaderx import _abi, _lib, errors
from _helpers import assert_generated_current, c_abi_exports



def test_generated_bindings_are_current(tmp_path):
    """Regenerate _abi.py from the Zig source; the committed file must match."""
    assert_generated_current("bindings-print", "bindings/_abi.py", "loaderx/_abi.py", tmp_path)


def declared_functions():
    return re.findall(r"\b(lx_\w+)\(", _abi.CDEF)


def test_every_declared_function_resolves():
    names = declared_functions()
    assert len(names) > 20
    for name in names:
        assert getattr(_lib.lib, name) is not None


def test_exports_are_exactly_the_zig_exports():
    """The C ABI's `export fn lx_*` set (src/capi.zig, src/capi/*.zig) equals
    the generated declarations, each declared once."""
    exports = c_abi_exports()
    assert len(exports) == len(set(exports))
    assert sorted(exports) == sorted(declared_functions())


@pytest.mark.skipif(shutil.which("nm") is None or not _lib.LIBRARY_PATH.endswith(".so"),
                    reason="needs nm and an ELF build")
def test_library_exports_only_loaderx_symbols():
    out = subprocess.run(["nm", "-D", "--defined-only", _lib.LIBRARY_PATH], capture_output=True, text=True,
                         check=True)
    names = {line.split()[-1] for line in out.stdout.splitlines() if line.split()[-2] in "TtDdBbRrWwVv"}
    assert names, "nm found no symbols"
    foreign = sorted(n for n in names if not n.startswith("lx_"))
    assert not foreign, f"unexpected exported symbols: {foreign[:10]}"
    assert names == set(declared_functions())


def test_every_result_code_has_one_exception_class():
    assert set(_lib.ERROR_CLASSES) == set(_abi.RESULTS) - {"ok"}
    for name, cls in _lib.ERROR_CLASSES.items():
        assert issubclass(cls, errors.ZrecordError), name
    assert len(set(_lib.ERROR_CLASSES.values())) == len(_lib.ERROR_CLASSES)


def test_struct_layouts_match_cffi():
    for name, size in _abi.STRUCT_SIZES.items():
        assert _lib.ffi.sizeof(name) == size, name


def test_python_constants_come_from_the_abi():
    from loaderx import _buffers, _loader
    from loaderx.zsampler import Sampler
    assert {m.name.lower(): int(m) for m in Sampler.Mode} == _abi.SAMPLER_MODES
    assert _lib.CODECS == _abi.CODECS
    assert _loader.WORKERS_MAX == _abi.LOADER_THREADS_MAX
    assert _loader.WINDOW_MAX == _abi.LOADER_WINDOW_MAX
    assert _buffers.STALE_CHECKOUTS == _abi.OUTPUT_POOL["stale_checkouts"]


def test_versions():
    assert re.fullmatch(r"\d+\.\d+\.\d+", _lib.version())
    assert _lib.lib.lx_format_version() == _abi.FORMAT_VERSION
    assert _lib.lib.lx_zstd_version() >= 10500
    assert _lib.lib.lx_lanes() >= 1
