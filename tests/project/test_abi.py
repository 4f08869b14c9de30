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



@pytest.mark.slow
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


INVALID = _abi.RESULTS["invalid"]
NULL = _lib.ffi.NULL


def _open_store(path):
    ffi, lib = _lib.ffi, _lib.lib
    out = ffi.new("lx_store **")
    rc = lib.lx_open(str(path).encode(), 1, _abi.CODECS["raw"], 0, NULL, 0, NULL, 0, 0, out)
    assert rc == 0, ffi.string(lib.lx_last_error())
    return out[0]


def _refused(rc, words):
    """`rc` is invalid and the thread's message names what was wrong."""
    message = _lib.ffi.string(_lib.lib.lx_last_error()).decode()
    assert rc == INVALID and words in message, (rc, message)


def test_every_area_refuses_null_handles_and_pointers(tmp_path):
    """The ABI boundary checks its arguments: a null or foreign handle, a null
    pointer with a nonzero count and a null out-pointer come back as invalid
    with a message, never a crash. One call (at least) per area file of
    src/capi/."""
    ffi, lib = _lib.ffi, _lib.lib
    u64, n = ffi.new("uint64_t[4]"), ffi.new("uint64_t *")
    store = _open_store(tmp_path / "s")
    try:
        # errors: an unknown result code still has a description.
        assert ffi.string(lib.lx_strerror(12345)) == b"unknown error"
        # store: a null handle, a foreign pointer, a null out-pointer.
        _refused(lib.lx_len(NULL, n), "not a store handle")
        foreign = ffi.new("uint64_t[64]")
        _refused(lib.lx_len(ffi.cast("lx_store *", foreign), n), "not a store handle")
        _refused(lib.lx_len(store, NULL), "out is null")
        _refused(lib.lx_append(store, 2, NULL, NULL, NULL, NULL, 0, n), "ptrs or sizes is null")
        lib.lx_close(NULL)
        lib.lx_free(NULL)
        # gather: parts null, a part whose store is null, indices null with a count.
        _refused(lib.lx_gather(NULL, 1, u64, 1, ffi.new("uint8_t[8]"), 8, 8, NULL, 0, 0),
                 "parts is null")
        parts = ffi.new("lx_part_t[1]")
        _refused(lib.lx_prefetch(parts, 1, u64, 1, 0), "part 0: not a store handle")
        parts[0].store = store
        _refused(lib.lx_gather_alloc(parts, 1, NULL, 3, 0, u64, u64, ffi.new("uint8_t **"), n),
                 "indices is null")
        _refused(lib.lx_gather_alloc(parts, 1, u64, 0, 0, u64, u64, NULL, n), "out is null")
        # pool
        _refused(lib.lx_pool_alloc(64, NULL), "out is null")
        lib.lx_pool_stats(NULL)
        # maintain
        _refused(lib.lx_stats(NULL, ffi.new("lx_stats_t *")), "not a store handle")
        _refused(lib.lx_delete(store, NULL, 5, NULL, n), "indices is null")
        _refused(lib.lx_verify(store, NULL), "bad_index is null")
        # cache
        _refused(lib.lx_cache_configure(NULL, NULL), "not a cache handle")
        _refused(lib.lx_meta_parse(NULL, 10, ffi.new("lx_meta_t *")), "meta is null")
        _refused(lib.lx_replica_begin(NULL, u64, 1, 0, ffi.new("lx_fetch_t *")),
                 "not a replica handle")
        # codec
        _refused(lib.lx_train_dict(NULL, u64, 1, ffi.new("uint8_t[8]"), 8, n), "samples is null")
        _refused(lib.lx_decode_frames(NULL, 0, NULL, u64, ffi.new("uint8_t[1]"), 1,
                                      ffi.new("uint8_t[1]"), 1, u64, NULL, 0, n),
                 "src_offsets is null")
        # sampler
        _refused(lib.lx_sampler_fill(10, 2, 1, 0, 0, 0, 0, 1, NULL), "out is null")
        _refused(lib.lx_mixture_step_max(NULL, 2, 4, u64), "sources is null")
        # windows
        _refused(lib.lx_windows_index(NULL, 4, 0, u64, 1), "not a store handle")
        _refused(lib.lx_windows_epoch(parts, 1, NULL), "out is null")
        # loader
        _refused(lib.lx_loader_submit(NULL, 0, 1, 0, NULL), "not a loader handle")
        _refused(lib.lx_loader_wait(NULL, 0, 0, ffi.new("uint32_t *"), NULL, NULL, NULL, NULL,
                                    NULL, NULL), "not a loader handle")
        _refused(lib.lx_loader_reset(ffi.cast("lx_loader *", foreign), 0, 0, NULL, n),
                 "not a loader handle")
        lib.lx_loader_stop(NULL)
        lib.lx_loader_free(NULL)
        loader_parts = ffi.new("lx_loader_part_t[1]")
        _refused(lib.lx_loader_open(ffi.new("lx_loader_config_t *"), ffi.new("lx_source_t[1]"),
                                    1, ffi.new("lx_column_t[1]"), 1, loader_parts, 1, NULL,
                                    ffi.new("lx_loader **")), "part 0: not a store handle")
        # image
        _refused(lib.lx_image_apply(NULL, NULL, 0, NULL, NULL, 1, 0, 0, NULL, 0,
                                    ffi.new("uint32_t *"), n), "column is null")
        _refused(lib.lx_image_jpeg_library(NULL, 0, NULL), "len is null")
        # debug
        _refused(lib.lx_debug_recording(NULL, 16, n), "out is null")
        lib.lx_debug_fault_counts(NULL, NULL)
        # The handle the refused calls were given is untouched.
        assert lib.lx_len(store, n) == 0 and n[0] == 0
    finally:
        lib.lx_free(store)
