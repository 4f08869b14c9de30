//! The C ABI, versions and errors: the library's, the format's and zstd's
//! versions, and what a result code or the last failed call says.
const std = @import("std");
const capi = @import("../capi.zig");
const format = @import("../format.zig");
const codec = @import("../codec.zig");
const diag = @import("../diag.zig");

const Result = capi.Result;
const version_major = capi.version_major;
const version_minor = capi.version_minor;
const version_patch = capi.version_patch;

/// Library version as (major << 16) | (minor << 8) | patch.
pub export fn lx_version() u32 {
    return (version_major << 16) | (version_minor << 8) | version_patch;
}

/// The on-disk format version this library writes. It reads this one and
/// every version from format.format_version_min (2) on.
pub export fn lx_format_version() u32 {
    return format.format_version;
}

/// The version of the zstd compiled in, as zstd's ZSTD_versionNumber().
pub export fn lx_zstd_version() u32 {
    return codec.versionNumber();
}

/// A static description of a result code (never null).
pub export fn lx_strerror(result: c_int) [*:0]const u8 {
    const r = std.enums.fromInt(Result, result) orelse return "unknown error";
    return switch (r) {
        .ok => "ok",
        .io => "I/O error",
        .invalid => "invalid argument",
        .not_found => "store not found",
        .not_a_store => "not a loaderx store",
        .corrupt => "store is damaged",
        .newer_format => "store format is newer than this library",
        .locked => "store is locked by another writer",
        .busy => "store is busy",
        .out_of_range => "index out of range",
        .out_of_memory => "out of memory",
        .size_mismatch => "size mismatch",
        .bad_dictionary => "bad dictionary",
        .read_only => "store is read-only",
        .no_space => "no space left on device",
        .closed => "closed",
        .failed => "handle failed after an earlier error; reopen the store",
        .bad_image => "not an image the image stage decodes",
    };
}

/// The calling thread's message for its last failed call (never null).
pub export fn lx_last_error() [*:0]const u8 {
    return diag.get();
}
