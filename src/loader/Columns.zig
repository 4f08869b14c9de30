//! The loader's column plans: what each column of a batch is (its kind,
//! record size, the caller's `out` buffers, a token-window index or an image
//! pipeline) and where its records live (the parts: the stores of every
//! (column, source), each from its first stream index, optionally through a
//! row list). Made and checked once when the ring opens and read-only after,
//! so every worker reads it without a lock.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const Loader = @import("../Loader.zig");
const store_parts = @import("../store_parts.zig");
const store_read = @import("../store_read.zig");
const windows = @import("../windows.zig");
const diag = @import("../diag.zig");
const image = @import("../image/stage.zig");
const Replica = @import("../Replica.zig");

const Columns = @This();
const Error = Loader.Error;
const Column = Loader.Column;
const ColumnKind = Loader.ColumnKind;
const Part = Loader.Part;
const Source = Loader.Source;

gpa: Allocator,
list: []Column = &.{},
source_count: usize,
/// Columns of kind variable (each has 2 * batch_size words of sizes a step).
variable_count: usize = 0,
/// Every part, grouped by column, then by source, then by `first`; `rows`
/// is parallel to it (null: the store's own records).
parts: []store_parts.Part = &.{},
rows: []?[]const u64 = &.{},
/// Parallel to `parts`: a remote store's replica (a staged ring's), or null.
replicas: []?*Replica = &.{},
/// Per (column, source): the window index of a windows/segments column.
specs: []windows.Spec = &.{},
/// Per column: its image pipeline (image columns only; a private copy).
images: []?image.Column = &.{},
/// Per column c: its parts are parts[col_start[c] .. col_start[c + 1]];
/// per (c, k): source k's are parts[range_start[c * K + k] .. next].
col_start: []usize = &.{},
range_start: []usize = &.{},
/// The `out` buffers of every column, back to back (out_start[c] ..).
outs: [][*]u8 = &.{},
out_start: []usize = &.{},

/// Copies and checks the columns and lays out their parts (the caller's
/// arrays may go once it returns; the stores and rows must stay).
pub fn init(
    gpa: Allocator,
    columns: []const Column,
    sources: []const Source,
    parts: []const Part,
    specs: ?[*]const windows.Spec,
) Error!Columns {
    var c: Columns = .{ .gpa = gpa, .source_count = sources.len };
    errdefer c.deinit();
    const k_count = sources.len;
    c.list = gpa.dupe(Column, columns) catch return error.OutOfMemory;
    c.parts = gpa.alloc(store_parts.Part, parts.len) catch return error.OutOfMemory;
    c.rows = gpa.alloc(?[]const u64, parts.len) catch return error.OutOfMemory;
    c.replicas = gpa.alloc(?*Replica, parts.len) catch return error.OutOfMemory;
    c.specs = gpa.alloc(windows.Spec, columns.len * k_count) catch return error.OutOfMemory;
    c.images = gpa.alloc(?image.Column, columns.len) catch return error.OutOfMemory;
    @memset(c.images, null);
    c.col_start = gpa.alloc(usize, columns.len + 1) catch return error.OutOfMemory;
    c.range_start = gpa.alloc(usize, columns.len * k_count + 1) catch return error.OutOfMemory;
    try c.copyOuts(columns);
    try c.layout(parts);
    try c.checkSpecs(sources, specs);
    try c.copyImages();
    return c;
}

pub fn deinit(c: *Columns) void {
    const gpa = c.gpa;
    inline for (.{
        "list",        "parts", "rows",      "replicas", "specs", "images", "col_start",
        "range_start", "outs",  "out_start",
    }) |name| {
        gpa.free(@field(c, name));
    }
    c.* = .{ .gpa = gpa, .source_count = 0 };
}

pub fn count(c: *const Columns) usize {
    return c.list.len;
}

pub fn kindOf(c: *const Columns, column: usize) ColumnKind {
    return @fromBackingInt(@intCast(c.list[column].kind));
}

/// Column `column`'s parts (every source's).
pub fn partsOf(c: *const Columns, column: usize) []store_parts.Part {
    return c.parts[c.col_start[column]..c.col_start[column + 1]];
}

/// The caller's `out` buffer that `step` of dense column `column` is built
/// into, or null when the ring allocates it.
pub fn outOf(c: *const Columns, column: usize, step: u64) ?[*]u8 {
    const outs = c.outs[c.out_start[column]..c.out_start[column + 1]];
    if (outs.len == 0) return null;
    return outs[@intCast(step % outs.len)];
}

fn invalid(comptime fmt: []const u8, args: anytype) Error {
    return diag.fail(error.InvalidArgument, fmt, args);
}

/// Checks each column's own fields (before anything is allocated).
pub fn check(columns: []const Column, batch_size: u64) Error!void {
    for (columns, 0..) |col, i| {
        const kind = std.enums.fromInt(ColumnKind, col.kind) orelse
            return invalid("column {d}: unknown kind {d}", .{ i, col.kind });
        if (kind != .variable) {
            _ = std.math.mul(u64, col.record_size, batch_size) catch
                return invalid("column {d}: a batch overflows", .{i});
        }
        if (col.out_count > 0 and (kind == .variable or col.out == null)) {
            return invalid("column {d}: out buffers are for dense columns (and not null)", .{i});
        }
        if ((kind == .image) != (col.image != null)) {
            return invalid("column {d}: an image pipeline goes with an image column", .{i});
        }
    }
}

/// A private copy of every column's `out` buffer list.
fn copyOuts(c: *Columns, columns: []const Column) Error!void {
    c.out_start = c.gpa.alloc(usize, columns.len + 1) catch return error.OutOfMemory;
    var total: usize = 0;
    for (columns, 0..) |col, i| {
        c.out_start[i] = total;
        total += col.out_count;
        if (col.kind == @backingInt(ColumnKind.variable)) c.variable_count += 1;
    }
    c.out_start[columns.len] = total;
    assert(c.variable_count <= columns.len);
    c.outs = c.gpa.alloc([*]u8, total) catch return error.OutOfMemory;
    for (columns, 0..) |col, i| {
        if (col.out_count == 0) continue;
        @memcpy(c.outs[c.out_start[i]..c.out_start[i + 1]], col.out.?[0..col.out_count]);
    }
}

/// The image columns' pipelines, checked: each writes records of exactly
/// its column's record size.
fn copyImages(c: *Columns) Error!void {
    for (c.list, 0..) |*col, i| {
        const given = col.image orelse continue;
        const copy = given.*;
        image.checkColumn(&copy) catch |e| return diag.fail(
            e,
            "column {d}: {s}",
            .{ i, diag.get() },
        );
        if (copy.spec.outBytes() != col.record_size) {
            return invalid("column {d}: its pipeline writes {d} bytes a record, not {d}", .{
                i, copy.spec.outBytes(), col.record_size,
            });
        }
        c.images[i] = copy;
        col.image = null; // the caller's; the copy above is read from now on
    }
}

/// The window indices of the windows/segments columns: one per (column,
/// source), each matching its column's record size and its source's length.
fn checkSpecs(c: *Columns, sources: []const Source, specs: ?[*]const windows.Spec) Error!void {
    const k_count = sources.len;
    for (c.list, 0..) |col, i| {
        const kind: ColumnKind = @fromBackingInt(@intCast(col.kind));
        if (kind != .windows and kind != .segments) continue;
        const all = specs orelse
            return invalid("column {d} reads windows but no window index was given", .{i});
        for (c.rows[c.col_start[i]..c.col_start[i + 1]]) |rows| {
            if (rows != null) return invalid("column {d} reads windows: no part takes rows", .{i});
        }
        for (0..k_count) |k| {
            const spec = all[i * k_count + k];
            try windows.checkSpec(spec);
            const width = spec.seq_len + 1;
            const want = if (kind == .windows) width * spec.itemsize else width * 4;
            if (col.record_size != want) {
                return invalid(
                    "column {d}: records of {d} bytes, its windows need {d}",
                    .{ i, col.record_size, want },
                );
            }
            if (spec.windowCount() < sources[k].length) {
                return invalid(
                    "source {d} has {d} records but column {d} only {d} windows",
                    .{ k, sources[k].length, i, spec.windowCount() },
                );
            }
            assert(i * k_count + k < c.specs.len);
            c.specs[i * k_count + k] = spec;
        }
    }
}

/// A part with its rows, as sorted by `layout`.
const Placed = struct { part: store_parts.Part, rows: ?[]const u64, replica: ?*Replica };

/// Checks the parts and lays them out by column, source and `first`.
fn layout(c: *Columns, parts: []const Part) Error!void {
    const k_count = c.source_count;
    const c_count = c.list.len;
    var counts = c.gpa.alloc(usize, c_count * k_count + 1) catch return error.OutOfMemory;
    defer c.gpa.free(counts);
    @memset(counts, 0);
    for (parts, 0..) |p, i| {
        if (p.column >= c_count or p.source >= k_count) {
            return invalid("part {d}: no column {d} / source {d}", .{ i, p.column, p.source });
        }
        if (p.rows != null and p.row_count == 0) return invalid("part {d}: rows is empty", .{i});
        counts[p.column * k_count + p.source + 1] += 1;
    }
    for (1..counts.len) |i| {
        if (counts[i] == 0) {
            return invalid(
                "column {d} has no store for source {d}",
                .{ (i - 1) / k_count, (i - 1) % k_count },
            );
        }
        counts[i] += counts[i - 1];
    }
    @memcpy(c.range_start, counts);
    for (0..c_count + 1) |i| c.col_start[i] = counts[i * k_count];
    const placed = c.gpa.alloc(Placed, parts.len) catch return error.OutOfMemory;
    defer c.gpa.free(placed);
    var fill = c.gpa.dupe(usize, counts[0 .. counts.len - 1]) catch return error.OutOfMemory;
    defer c.gpa.free(fill);
    for (parts) |p| {
        const at = &fill[p.column * k_count + p.source];
        const rows: ?[]const u64 = if (p.rows) |r| r[0..@intCast(p.row_count)] else null;
        const part: store_parts.Part = .{ .store = p.store, .first = p.first };
        placed[at.*] = .{ .part = part, .rows = rows, .replica = p.replica };
        at.* += 1;
    }
    for (0..c_count * k_count) |r| {
        const range = placed[c.range_start[r]..c.range_start[r + 1]];
        std.mem.sortUnstable(Placed, range, {}, firstLess);
        try checkRange(range, r / k_count, r % k_count);
    }
    for (placed, c.parts, c.rows, c.replicas) |p, *part, *rows, *replica| {
        part.* = p.part;
        rows.* = p.rows;
        replica.* = p.replica;
    }
    // Every part placed once, each range filled exactly to the next's start.
    assert(c.range_start[c_count * k_count] == parts.len);
    assert(c.col_start[0] == 0 and c.col_start[c_count] == parts.len);
    for (fill, c.range_start[1..]) |f, next| assert(f == next);
}

/// The parts of one (column, source), sorted: from 0, no two at one start,
/// and a part with rows ends where the next begins, or before it.
fn checkRange(range: []const Placed, c: usize, k: usize) Error!void {
    assert(range.len >= 1);
    if (range[0].part.first != 0) {
        return invalid("the first part of column {d}, source {d} must start at 0", .{ c, k });
    }
    for (range[1..], range[0 .. range.len - 1]) |b, a| {
        if (b.part.first == a.part.first) {
            return invalid(
                "two parts of column {d}, source {d} start at {d}",
                .{ c, k, a.part.first },
            );
        }
        const rows = a.rows orelse continue;
        if (rows.len > b.part.first - a.part.first) {
            return invalid(
                "column {d}, source {d}: the part at {d} has {d} rows, past the next part",
                .{ c, k, a.part.first, rows.len },
            );
        }
    }
}

fn firstLess(_: void, a: Placed, b: Placed) bool {
    return a.part.first < b.part.first;
}

/// Where stream index `index` lives among parts[lo..hi] (one source of one
/// column), by the parts' starts and rows alone: (part among them, record
/// of its store, which may be past the store's end); null when no part's
/// rows reach it.
pub fn place(c: *const Columns, lo: usize, hi: usize, index: u64) ?Place {
    assert(lo < hi);
    const parts = c.parts[lo..hi];
    // The last part starting at or before `index` (the parts are sorted).
    var i: usize = 0;
    var end: usize = parts.len;
    while (end - i > 1) {
        const mid = (i + end) / 2;
        if (parts[mid].first <= index) i = mid else end = mid;
    }
    assert(i < parts.len and (i + 1 == parts.len or parts[i + 1].first > index));
    if (index < parts[i].first) return null;
    const offset = index - parts[i].first;
    const rows = c.rows[lo + i] orelse return .{ .part = i, .local = offset };
    if (offset >= rows.len) return null;
    return .{ .part = i, .local = rows[@intCast(offset)] };
}

pub const Place = struct { part: usize, local: u64 };

/// Where stream index `index` lives among parts[lo..hi] (one source of one
/// column): (part among them, record of its store); null when none holds it.
pub fn find(
    c: *const Columns,
    lo: usize,
    hi: usize,
    snaps: []const store_read.Snapshot,
    index: u64,
) ?Place {
    assert(lo < hi and snaps.len == hi - lo);
    const at = c.place(lo, hi, index) orelse return null;
    return if (at.local < snaps[at.part].count) at else null;
}
