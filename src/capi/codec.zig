//! The C ABI, codec work outside a store: training a zstd dictionary, and
//! decoding records another writer stored (`loaderx convert`).
const std = @import("std");
const assert = std.debug.assert;
const capi = @import("../capi.zig");
const codec = @import("../codec.zig");
const diag = @import("../diag.zig");

const Result = capi.Result;
const invalid = capi.invalid;

/// Trains a zstd dictionary of at most `cap` bytes into `out` from `count`
/// samples laid end to end at `samples` with sizes `sizes`; writes its size to
/// `*out_len`. Errors: bad_dictionary (training failed: too few or too uniform
/// samples), invalid.
pub export fn lx_train_dict(
    samples: ?[*]const u8,
    sizes: ?[*]const u64,
    count: u64,
    out: ?[*]u8,
    cap: u64,
    out_len: ?*u64,
) c_int {
    const smp = samples orelse return invalid("samples is null", .{});
    const szs = sizes orelse return invalid("sizes is null", .{});
    const o = out orelse return invalid("out is null", .{});
    const written = out_len orelse return invalid("out_len is null", .{});
    if (count == 0) return invalid("no samples", .{});
    var total: u64 = 0;
    for (szs[0..@intCast(count)]) |s| {
        total = std.math.add(u64, total, s) catch return invalid("sample sizes overflow", .{});
    }
    const sz: [*]const usize = @ptrCast(szs);
    var why: [*:0]const u8 = "";
    written.* = codec.trainDict(
        smp[0..@intCast(total)],
        sz[0..@intCast(count)],
        o[0..@intCast(cap)],
        &why,
    ) catch {
        diag.set("zstd could not train a dictionary: {s}", .{why});
        return @backingInt(Result.bad_dictionary);
    };
    assert(written.* <= cap); // zstd writes the dictionary into out[0..cap]
    return 0;
}

/// Decodes `count` records stored by another writer (the original package's
/// stores, read by `loaderx convert`): record i is the `src_sizes[i]` bytes at
/// `src_offsets[i]` of `src[0..src_len]`, stored with `codecs[i]` (0 raw, 1
/// zstd, 2 zstd with the dictionary `dict`, trained or raw content; dict_len 0
/// for none), and must decode to exactly `dst_sizes[i]` bytes; the records are
/// laid end to end in `dst[0..dst_len]`. On a record that does not,
/// `*bad_index` is its index and the message says why. Errors: corrupt,
/// bad_dictionary, invalid, out_of_memory.
pub export fn lx_decode_frames(
    src: ?[*]const u8,
    src_len: u64,
    src_offsets: ?[*]const u64,
    src_sizes: ?[*]const u64,
    codecs: ?[*]const u8,
    count: u64,
    dst: ?[*]u8,
    dst_len: u64,
    dst_sizes: ?[*]const u64,
    dict: ?[*]const u8,
    dict_len: u64,
    bad_index: ?*u64,
) c_int {
    diag.clear();
    const bad = bad_index orelse return invalid("bad_index is null", .{});
    bad.* = std.math.maxInt(u64);
    if (count == 0) return 0;
    const n: usize = @intCast(count);
    const offs = (src_offsets orelse return invalid("src_offsets is null", .{}))[0..n];
    const ss = (src_sizes orelse return invalid("src_sizes is null", .{}))[0..n];
    const cs = (codecs orelse return invalid("codecs is null", .{}))[0..n];
    const ds = (dst_sizes orelse return invalid("dst_sizes is null", .{}))[0..n];
    const d = dst orelse return invalid("dst is null", .{});
    if (src_len > 0 and src == null) return invalid("src is null", .{});
    if (dict_len > 0 and dict == null) return invalid("dict is null", .{});
    var total: u64 = 0;
    for (ds) |x| total = std.math.add(u64, total, x) catch return invalid("sizes overflow", .{});
    if (total != dst_len) return invalid("dst_sizes add up to {d}, not {d}", .{ total, dst_len });
    var why: [*:0]const u8 = "";
    codec.decodeFrames(
        if (src) |p| p[0..@intCast(src_len)] else &.{},
        offs,
        ss,
        cs,
        d[0..@intCast(dst_len)],
        ds,
        if (dict) |p| p[0..@intCast(dict_len)] else &.{},
        bad,
        &why,
    ) catch |e| switch (e) {
        error.Corrupt => {
            diag.set("{s}", .{why});
            return @backingInt(Result.corrupt);
        },
        error.BadDictionary => {
            diag.set("zstd cannot use the dictionary ({d} bytes)", .{dict_len});
            return @backingInt(Result.bad_dictionary);
        },
        error.OutOfMemory => return @backingInt(Result.out_of_memory),
        error.BadLevel => unreachable, // decoding sets no level
    };
    return 0;
}
