//! The C ABI, the image stage (src/image/): running a column's pipeline
//! outside a loader, and choosing the libjpeg that decodes JPEGs.
const std = @import("std");
const assert = std.debug.assert;
const capi = @import("../capi.zig");
const image = @import("../image/stage.zig");
const jpeg = @import("../image/jpeg.zig");
const diag = @import("../diag.zig");

const Result = capi.Result;
const ImageColumn = capi.ImageColumn;
const code = capi.code;
const invalid = capi.invalid;
const gpa = capi.gpa;

/// Runs `column`'s pipeline on `count` records outside a loader, into `out`
/// (`count` * the pipeline's bytes a record, exactly `out_len`): record i is
/// keyed at step `step`, global position `position + i`, so it comes out as
/// a loader's step `step` makes the record at that position. Encoded input:
/// record i is data[offsets[i] .. offsets[i] + sizes[i]]; pixel input: the
/// i-th block of height * width * channels bytes of `data` (offsets and
/// sizes may be null). Runs on every usable core, the GIL released. Writes
/// the records replaced (on_error skip) to `*skipped`, and on bad_image the
/// failing record's number to `*failed`. Errors: invalid, bad_image (the
/// message names the record and what is wrong), out_of_memory.
pub export fn lx_image_apply(
    column: ?*const ImageColumn,
    data: ?[*]const u8,
    data_len: u64,
    offsets: ?[*]const u64,
    sizes: ?[*]const u64,
    count: u64,
    step: u64,
    position: u64,
    out: ?[*]u8,
    out_len: u64,
    skipped: ?*u32,
    failed: ?*u64,
) c_int {
    diag.clear();
    const replaced = skipped orelse return invalid("skipped is null", .{});
    const failing = failed orelse return invalid("failed is null", .{});
    replaced.* = 0;
    failing.* = 0;
    const col = column orelse return invalid("column is null", .{});
    image.checkColumn(col) catch |e| return code(e);
    const dest = out orelse return invalid("out is null", .{});
    const want = std.math.mul(
        u64,
        count,
        col.spec.outBytes(),
    ) catch return invalid("count overflows", .{});
    if (out_len != want) return invalid(
        "out holds {d} bytes, the records need {d}",
        .{ out_len, want },
    );
    if (count == 0) return 0;
    const bytes = (data orelse return invalid("data is null", .{}))[0..@intCast(data_len)];
    const records = imageRecords(
        col,
        bytes,
        offsets,
        sizes,
        count,
    ) orelse return @backingInt(Result.invalid);
    var lanes: image.Lanes = .{};
    defer lanes.deinit(gpa);
    var outcome: image.Outcome = .{};
    const key: image.Key = .{ .seed = col.seed, .step = step, .position = position };
    image.batch(gpa, &col.spec, records, key, dest, &lanes, 0, &outcome) catch |e| switch (e) {
        error.OutOfMemory => return code(error.OutOfMemory),
        error.BadRecord => {
            failing.* = outcome.failed_slot.?;
            diag.set("record {d}: {s}", .{ failing.*, outcome.message[0..outcome.message_len] });
            return @backingInt(Result.bad_image);
        },
    };
    assert(outcome.skipped <= count);
    replaced.* = outcome.skipped;
    return 0;
}

/// The records of lx_image_apply, checked against `data` (null: invalid,
/// message set).
fn imageRecords(
    col: *const ImageColumn,
    data: []const u8,
    offsets: ?[*]const u64,
    sizes: ?[*]const u64,
    count: u64,
) ?image.Records {
    const n: usize = @intCast(count);
    if (col.input == @backingInt(image.InputKind.pixels)) {
        const size = @as(u64, col.height) * col.width * col.channels;
        if (data.len != size * count) {
            diag.set(
                "data holds {d} bytes, {d} records of {d} x {d} x {d} need {d}",
                .{ data.len, count, col.height, col.width, col.channels, size * count },
            );
            return null;
        }
        return .{
            .pixels = .{
                .data = data,
                .height = col.height,
                .width = col.width,
                .channels = col.channels,
            },
        };
    }
    const o = (offsets orelse {
        diag.set("offsets is null", .{});
        return null;
    })[0..n];
    const s = (sizes orelse {
        diag.set("sizes is null", .{});
        return null;
    })[0..n];
    for (o, s, 0..) |at, size, i| {
        if (at > data.len or size > data.len - at) {
            diag.set(
                "record {d} ({d} bytes at {d}) runs past the {d} bytes of data",
                .{ i, size, at, data.len },
            );
            return null;
        }
    }
    return .{ .encoded = .{ .bytes = data, .offsets = o, .sizes = s } };
}

/// Decodes JPEGs with the libjpeg at `path` (a libjpeg-turbo with SIMD: the
/// one Pillow ships, or the system's) instead of the built-in one, from now
/// on, for the whole process. It is taken only if it exports the libjpeg 6b
/// API with libjpeg-turbo's crop and skip calls and decodes the library's
/// test images exactly as the built-in decoder does. Must come before the
/// first JPEG decode. Errors: not_found (no such library, or a symbol is
/// missing), invalid (it decodes differently, a decode already ran, or this
/// platform cannot load libraries).
pub export fn lx_image_use_jpeg(path: ?[*:0]const u8) c_int {
    diag.clear();
    const p = std.mem.span(path orelse return invalid("path is null", .{}));
    jpeg.useLibrary(p) catch |e| {
        diag.set("{s}: {s}", .{ p, switch (e) {
            error.NotFound => "cannot be loaded",
            error.MissingSymbol => "is not a libjpeg-turbo (a symbol is missing)",
            error.Mismatch => "decodes the test images differently from the built-in decoder",
            error.Unsupported => "libraries are not loaded on this platform",
            error.AlreadyChosen => "the decoder was chosen already (before the first decode)",
        } });
        const missing = e == error.NotFound or e == error.MissingSymbol;
        const r: Result = if (missing) .not_found else .invalid;
        return @backingInt(r);
    };
    return 0;
}

/// Writes the path of the libjpeg decoding JPEGs ("" for the built-in
/// libjpeg-turbo) to `out` (up to `cap` bytes, NUL-terminated when it fits)
/// and its length to `*len`. Choosing nothing by then chooses the built-in.
pub export fn lx_image_jpeg_library(out: ?[*]u8, cap: u64, len: ?*u64) c_int {
    diag.clear();
    const n = len orelse return invalid("len is null", .{});
    const path = jpeg.libraryPath();
    n.* = path.len;
    const o = out orelse return 0;
    if (cap < path.len + 1) return 0;
    @memcpy(o[0..path.len], path);
    o[path.len] = 0;
    return 0;
}
