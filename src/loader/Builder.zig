//! A loader worker's step builder: it computes a step's indices (one
//! source's sampler, or a mixture's shares) and builds every column of the
//! step into its buffers: dense records, variable records with their sizes,
//! token windows, and images through their pipeline. Each ring worker owns
//! one, with every buffer sized when the ring opens, so building a step
//! allocates only the step's own output.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const Loader = @import("../Loader.zig");
const Columns = @import("Columns.zig");
const sampler = @import("../sampler.zig");
const mixture = @import("../mixture.zig");
const outbuf = @import("../outbuf.zig");
const diag = @import("../diag.zig");
const store_read = @import("../store_read.zig");
const store_parts = @import("../store_parts.zig");
const windows = @import("../windows.zig");
const cpu = @import("../cpu.zig");
const image = @import("../image/stage.zig");
const Stage = @import("Stage.zig");

const Builder = @This();
const Error = Loader.Error;
const ColumnKind = Loader.ColumnKind;

indices: []u64 = &.{},
sources: []u16 = &.{},
origins: []mixture.Origin = &.{},
slots: []u64 = &.{},
/// A step's positions of one source (mixtures: up to G).
filled: []u64 = &.{},
parts: store_parts.Scratch = .{},
win: windows.Scratch = .{},
/// One source's records of a step: their rows and window indices.
rows: []u64 = &.{},
picked: []u64 = &.{},
/// An image column's record sizes (payloads, aux) and offsets: 3 * batch.
image_sizes: []u64 = &.{},
/// The image stage's per-lane buffers (made at the first image step).
image_lanes: image.Lanes = .{},
/// A staged ring's: the step's records of each replica, and its request.
stage: Stage.Worker = .{},
/// Dense columns this builder wrote with streaming stores (read by tests).
streamed: u64 = 0,

/// A builder for `l`'s batch size, world and sources.
pub fn init(l: *const Loader) Error!Builder {
    const gpa = l.gpa;
    var b: Builder = .{};
    errdefer b.deinit(gpa);
    const batch: usize = @intCast(l.config.batch_size);
    const global: usize = @intCast(l.config.batch_size * l.config.world);
    b.indices = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    b.sources = gpa.alloc(u16, batch) catch return error.OutOfMemory;
    b.rows = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    b.picked = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    b.image_sizes = gpa.alloc(u64, 3 * batch) catch return error.OutOfMemory;
    if (l.sources.len > 1) {
        b.origins = gpa.alloc(mixture.Origin, batch) catch return error.OutOfMemory;
        b.slots = gpa.alloc(u64, batch) catch return error.OutOfMemory;
        b.filled = gpa.alloc(u64, global) catch return error.OutOfMemory;
    }
    return b;
}

pub fn deinit(b: *Builder, gpa: Allocator) void {
    gpa.free(b.indices);
    gpa.free(b.sources);
    gpa.free(b.origins);
    gpa.free(b.slots);
    gpa.free(b.filled);
    gpa.free(b.rows);
    gpa.free(b.picked);
    gpa.free(b.image_sizes);
    b.parts.deinit(gpa);
    b.win.deinit(gpa);
    b.image_lanes.deinit(gpa);
    b.stage.deinit(gpa);
    b.* = .{};
}

/// Builds `step` into its slot's buffers and `results`, with the indices of
/// the base (step, position) the step was claimed under, in the generation
/// it was claimed in, `ahead` steps past the consumer's next.
pub fn buildSlot(
    b: *Builder,
    l: *Loader,
    step: u64,
    base: struct { u64, u64, u64, u64 },
    slot: *Loader.Slot,
    results: []Loader.Result,
    failed_column: *u32,
) Error!void {
    assert(slot.state == .running and slot.step == step);
    assert(results.len == l.columns.count());
    failed_column.* = @intCast(l.columns.count());
    try slotBuffers(l, slot);
    assert(step >= base[0]);
    const at: mixture.Base = .{ .step = base[0], .position = base[1] };
    var built: Built = .{ .generation = base[2], .held = &slot.held, .ahead = base[3] };
    try b.build(l, step, at, slot.sizes, results, failed_column, &built);
    @memcpy(slot.indices, b.indices);
    @memcpy(slot.sources, b.sources);
    slot.images_skipped = built.images_skipped;
}

/// The slot's index, source and size arrays, allocated at its first build
/// (the slot owns them until Loader.destroy).
fn slotBuffers(l: *Loader, slot: *Loader.Slot) Error!void {
    if (slot.indices.len > 0) return;
    const batch: usize = @intCast(l.config.batch_size);
    const gpa = l.gpa;
    const indices = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    errdefer gpa.free(indices);
    const sources = gpa.alloc(u16, batch) catch return error.OutOfMemory;
    errdefer gpa.free(sources);
    slot.sizes = gpa.alloc(
        u64,
        2 * batch * l.columns.variable_count,
    ) catch return error.OutOfMemory;
    slot.sources = sources;
    slot.indices = indices;
    assert(slot.indices.len == batch and slot.sources.len == batch);
}

/// What `build` makes of a step besides its buffers.
pub const Built = struct {
    /// Image records replaced by another of the step (Decode on_error skip).
    images_skipped: u32 = 0,
    /// In: the generation the step was claimed in, and its slot's count of
    /// stored bytes (a staged ring's, loader/Stage.zig).
    generation: u64 = 0,
    held: ?*u64 = null,
    /// In: steps between the consumer's next and this one when it was
    /// claimed (0: the consumer takes it next).
    ahead: u64 = 0,
};

/// Builds `step` (its indices in b.indices and b.sources, for the base the
/// step was claimed under) into `results`, one per column; a failure names
/// its column in `failed_column`.
pub fn build(
    b: *Builder,
    l: *Loader,
    step: u64,
    base: mixture.Base,
    sizes: []u64,
    results: []Loader.Result,
    failed_column: *u32,
    built: *Built,
) Error!void {
    const cols = &l.columns;
    assert(results.len == cols.count());
    for (results) |r| assert(r.buffer == null);
    assert(step >= base.step);
    failed_column.* = @intCast(cols.count());
    b.indicesOf(l, step, base, l.cursors[0..l.sources.len]);
    if (l.config.gated == 2) try Stage.ready(l, b, step, built.generation, built.held.?);
    const batch: usize = @intCast(l.config.batch_size);
    var variable: usize = 0;
    for (0..cols.count()) |c| {
        failed_column.* = @intCast(c);
        const kind = cols.kindOf(c);
        if (kind == .variable) {
            const mine = sizes[variable * 2 * batch ..][0 .. 2 * batch];
            variable += 1;
            try b.buildVariable(l, c, mine, &results[c]);
            continue;
        }
        const dest = try denseDest(l, c, step, &results[c]);
        switch (kind) {
            .dense => try b.buildDense(l, c, dest, built.ahead),
            .windows, .segments => try b.buildWindows(l, c, kind, dest),
            .image => built.images_skipped += try b.buildImage(l, c, step, dest),
            .variable => unreachable, // built above
        }
    }
    assert(variable == cols.variable_count);
}

/// Where dense column `c` of `step` is built: the caller's `out` buffer of
/// the step, or a new pool buffer that `result` owns from now on.
fn denseDest(l: *const Loader, c: usize, step: u64, result: *Loader.Result) Error![*]u8 {
    assert(result.buffer == null);
    assert(l.columns.kindOf(c) != .variable);
    if (l.columns.outOf(c, step)) |out| return out;
    const size: usize = @intCast(l.columns.list[c].record_size * l.config.batch_size);
    // Built here, dropped by the consumer's thread: a pool block from 64 KiB.
    const buf = outbuf.allocExactCrossThread(&outbuf.default_pool, size) orelse
        return diag.fail(error.OutOfMemory, "no memory for a batch of {d} bytes", .{size});
    assert(outbuf.capacityOf(buf) >= size);
    result.* = .{ .buffer = buf, .len = size };
    return buf;
}

/// This rank's indices (and sources) of `step` into b.indices and
/// b.sources, for the base it was claimed under (a mixture's position is
/// u128 there: the mixed stream's) and, for a CYCLIC mixture, the sources'
/// `cursors` at that base.
pub fn indicesOf(
    b: *Builder,
    l: *const Loader,
    step: u64,
    base: mixture.Base,
    cursors: []const mixture.Cursor,
) void {
    const c = l.config;
    const batch: u64 = c.batch_size;
    const global: u64 = c.batch_size * c.world;
    assert(step >= base.step);
    assert(b.indices.len == batch and b.sources.len == batch);
    defer b.checkIndices(l);
    if (l.sources.len == 1) {
        const s = l.sources[0];
        const first = sampler.positionAt(l.mode, s.length, global, base.step, base.position, step);
        sampler.fillFrom(s.length, l.mode, s.seed, first + c.rank * batch, b.indices);
        @memset(b.sources, 0);
        return;
    }
    assert(cursors.len == l.sources.len or !l.hasCursors());
    assert(b.filled.len == global and b.origins.len == batch);
    // The mixed stream runs G positions per step, whatever the mode.
    const first: u128 = base.position + @as(u128, step - base.step) * global;
    mixture.compose(&l.mix, c.seed, first, global, c.rank * batch, b.slots, b.origins);
    var before: [Loader.sources_max]u128 = undefined;
    var after: [Loader.sources_max]u128 = undefined;
    l.mix.cumulative(first, &before);
    l.mix.cumulative(first + global, &after);
    // Each source's positions of the step, filled at once (one sampler call
    // per source), then picked by the rank's records.
    var at: usize = 0;
    var start: [Loader.sources_max]usize = undefined;
    for (l.sources, 0..) |s, k| {
        const n: usize = @intCast(after[k] - before[k]);
        start[k] = at;
        if (n > 0) {
            // Cursors only in a CYCLIC mixture: indicesAt passes none otherwise.
            const cursor: mixture.Cursor = if (l.hasCursors()) cursors[k] else .{};
            const from = sourcePosition(l, k, step, base, cursor, before[k]);
            sampler.fillFrom(s.length, l.mode, s.seed, from, b.filled[at..][0..n]);
        }
        at += n;
    }
    // The sources' shares of the step add up to the step.
    assert(at == global);
    for (b.origins, b.indices, b.sources) |o, *index, *source| {
        assert(o.source < l.sources.len);
        assert(o.position >= before[o.source] and o.position < after[o.source]);
        const within: usize = @intCast(o.position - before[o.source]);
        index.* = b.filled[start[o.source] + within];
        source.* = o.source;
    }
}

/// Every index of a step names a record of its source (the reads trust it).
fn checkIndices(b: *const Builder, l: *const Loader) void {
    if (!std.debug.runtime_safety) return;
    for (b.indices, b.sources) |index, source| {
        assert(source < l.sources.len and index < l.sources[source].length);
    }
}

/// Where source `k`'s records of `step` start in its own sampler's sequence:
/// its cumulative count `before` (SEQUENTIAL, IID), or its place from its
/// `cursor` at `base` (CYCLIC: the step's records all come from one cycle).
fn sourcePosition(
    l: *const Loader,
    k: usize,
    step: u64,
    base: mixture.Base,
    cursor: mixture.Cursor,
    before: u128,
) sampler.Position {
    assert(k < l.sources.len);
    if (!l.hasCursors()) return before;
    const global = l.config.batch_size * l.config.world;
    const place = l.mix.cursorAt(k, global, l.cycle_steps[k], base, cursor, step);
    return place.position(l.sources[k].length);
}

/// A dense column into `dest`.
fn buildDense(b: *Builder, l: *Loader, c: usize, dest: [*]u8, ahead: u64) Error!void {
    const parts = l.columns.partsOf(c);
    const snaps = try store_parts.begin(l.gpa, parts, &b.parts);
    defer store_parts.end(parts);
    const reads = try b.readsOf(l, c, snaps);
    const batch: usize = @intCast(l.config.batch_size);
    const size: usize = @intCast(l.columns.list[c].record_size);
    assert(reads.indices.len == batch and reads.of.?.len == batch);
    const stream = streams(size * batch, ahead, l.config.threads);
    try store_read.gatherReads(reads, .{
        .base = dest,
        .len = size * batch,
        .stride = size,
        .stream = stream,
    }, .payload, l.config.lanes);
    b.streamed += @intFromBool(stream);
}

/// Whether a dense column's step of `bytes` claimed `ahead` steps before the
/// consumer's next is written with streaming stores.
fn streams(bytes: usize, ahead: u64, threads: u32) bool {
    return bytes >= stream_step_min and ahead >= threads and cpu.streamingPays();
}

/// A dense column's step is written with streaming stores
/// (store_read.Dest.stream, codec.copyStream) where they pay
/// (cpu.streamingPays: AMD), when it is at least this many bytes and is
/// built at least `threads` steps ahead of the consumer (the ring is
/// filling: the consumer is the slower side). Its buffer then comes
/// round from a ring of cold ones (with the default prefetch, 8 of them), and
/// it waits its turn, so its lines would not stay cached for the consumer
/// anyway. A step the consumer is about to take goes into one of the few
/// buffers that take turns while the consumer outpaces the workers, still
/// cached: there plain stores were faster (x only, 20,000 random 12 KiB
/// records, AMD EPYC: streaming every step ran at 0.84-0.88x).
const stream_step_min: usize = 1 << 20;

/// A variable column into one new buffer (owned by `result`), with each
/// record's payload and aux sizes in `sizes`.
fn buildVariable(
    b: *Builder,
    l: *Loader,
    c: usize,
    sizes: []u64,
    result: *Loader.Result,
) Error!void {
    assert(result.buffer == null);
    assert(sizes.len == 2 * l.config.batch_size);
    const parts = l.columns.partsOf(c);
    const snaps = try store_parts.begin(l.gpa, parts, &b.parts);
    defer store_parts.end(parts);
    const reads = try b.readsOf(l, c, snaps);
    const batch: usize = @intCast(l.config.batch_size);
    const buf = try store_read.packedReads(
        l.gpa,
        reads,
        l.config.lanes,
        sizes[0..batch],
        sizes[batch..][0..batch],
    );
    assert(reads.indices.len == batch);
    result.* = .{ .buffer = if (buf.len > 0) buf.ptr else null, .len = buf.len };
}

/// A windows (or segments) column: each source's records are windows of its
/// corpus, gathered into their rows.
fn buildWindows(b: *Builder, l: *Loader, c: usize, kind: ColumnKind, dest: [*]u8) Error!void {
    const k_count = l.sources.len;
    var rows_total: usize = 0;
    for (0..k_count) |k| {
        var n: usize = 0;
        for (b.sources, b.indices, 0..) |source, index, row| {
            if (source != k) continue;
            b.rows[n] = row;
            b.picked[n] = index;
            n += 1;
        }
        rows_total += n;
        if (n == 0) continue;
        const r = c * k_count + k;
        const parts = l.columns.parts[l.columns.range_start[r]..l.columns.range_start[r + 1]];
        const out: windows.Out = if (kind == .windows)
            .{ .tokens = dest, .rows = b.rows[0..n] }
        else
            .{ .segments = @ptrCast(@alignCast(dest)), .rows = b.rows[0..n] };
        try windows.gather(
            l.gpa,
            l.columns.specs[r],
            parts,
            b.picked[0..n],
            out,
            l.config.lanes,
            &b.win,
        );
    }
    // Every record of the step belongs to one source.
    assert(rows_total == b.indices.len);
}

/// An image column: its records (encoded images, or pixels) read into a
/// pool buffer, then through the column's pipeline into `dest`, record i
/// keyed by its global position in the step. Returns the records replaced.
fn buildImage(b: *Builder, l: *Loader, c: usize, step: u64, dest: [*]u8) Error!u32 {
    const col = &(l.columns.images[c] orelse unreachable); // image columns have a pipeline
    const parts = l.columns.partsOf(c);
    const snaps = try store_parts.begin(l.gpa, parts, &b.parts);
    defer store_parts.end(parts);
    const reads = try b.readsOf(l, c, snaps);
    const batch: usize = @intCast(l.config.batch_size);
    const key: image.Key = .{ .seed = col.seed, .step = step, .position = l.config.rank * batch };
    const lanes = l.config.lanes;
    if (col.input == @backingInt(image.InputKind.pixels)) {
        const size: usize = @intCast(@as(u64, col.height) * col.width * col.channels);
        const buf = outbuf.alloc(size * batch) orelse
            return diag.fail(error.OutOfMemory, "no memory for {d} bytes", .{size * batch});
        defer outbuf.free(buf);
        const to: store_read.Dest = .{ .base = buf, .len = size * batch, .stride = size };
        try store_read.gatherReads(reads, to, .payload, lanes);
        const pixels: image.Records = .{ .pixels = .{
            .data = buf[0 .. size * batch],
            .height = col.height,
            .width = col.width,
            .channels = col.channels,
        } };
        return image.batchInto(l.gpa, col, pixels, key, dest, &b.image_lanes, lanes, b.indices);
    }
    const sizes = b.image_sizes;
    assert(sizes.len == 3 * batch);
    const payloads = sizes[0..batch];
    const aux = sizes[batch..][0..batch];
    const bytes = try store_read.packedReads(l.gpa, reads, lanes, payloads, aux);
    defer if (bytes.len > 0) outbuf.free(bytes.ptr);
    const offsets = sizes[2 * batch ..][0..batch];
    var at: u64 = 0;
    for (offsets, payloads) |*o, s| {
        o.* = at;
        at += s;
    }
    const encoded: image.Records = .{
        .encoded = .{ .bytes = bytes, .offsets = offsets, .sizes = payloads },
    };
    return image.batchInto(l.gpa, col, encoded, key, dest, &b.image_lanes, lanes, b.indices);
}

/// Column c's reads of the step: each record's part (among the column's
/// parts) and index inside its store.
fn readsOf(
    b: *Builder,
    l: *Loader,
    c: usize,
    snaps: []const store_read.Snapshot,
) Error!store_read.Reads {
    const cols = &l.columns;
    const k_count = l.sources.len;
    const col_first = cols.col_start[c];
    const sc = &b.parts;
    sc.of.resize(l.gpa, b.indices.len) catch return error.OutOfMemory;
    sc.local.resize(l.gpa, b.indices.len) catch return error.OutOfMemory;
    for (b.indices, b.sources, sc.of.items, sc.local.items) |index, source, *of, *local| {
        const r = c * k_count + source;
        assert(source < k_count);
        const lo = cols.range_start[r] - col_first;
        const hi = cols.range_start[r + 1] - col_first;
        assert(lo < hi and hi <= snaps.len);
        const at = cols.find(col_first + lo, col_first + hi, snaps[lo..hi], index) orelse
            return diag.fail(error.OutOfRange, "source {d}: index {d} is out of range " ++
                "(a store of this column is shorter than the source)", .{ source, index });
        assert(at.part < hi - lo and at.local < snaps[lo + at.part].count);
        of.* = @intCast(lo + at.part);
        local.* = at.local;
    }
    return .{ .snaps = snaps, .of = sc.of.items, .indices = sc.local.items };
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const lt = @import("testing.zig");
const Store = @import("../Store.zig");
const Source = Loader.Source;
const Part = Loader.Part;
const Column = Loader.Column;
const Config = Loader.Config;
const testStore = lt.testStore;
const testStoreFrom = lt.testStoreFrom;
const twoSourceParts = lt.twoSourceParts;
const dense8 = lt.dense8;
const testConfig = lt.testConfig;
const Taken = lt.Taken;
const take = lt.take;
const gatedTestLoader = lt.gatedTestLoader;

test "shards and a mixture: every record from its source's own sequence" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    // Source 0 is split into two shards (30 + 20 records); source 1 is one store.
    const a = try testStore(&tmp, "a", 30, 1);
    defer a.close();
    const b = try testStoreFrom(&tmp, "b", 20, 1, 30);
    defer b.close();
    const c = try testStore(&tmp, "c", 40, 1000);
    defer c.close();
    const sources = [_]Source{
        .{ .length = 50, .seed = 1, .weight = 3 },
        .{ .length = 40, .seed = 2, .weight = 1 },
    };
    const parts = [_]Part{
        .{ .store = b, .first = 30, .source = 0, .column = 0 },
        .{ .store = a, .first = 0, .source = 0, .column = 0 },
        .{ .store = c, .first = 0, .source = 1, .column = 0 },
    };
    var config = testConfig(16, 2, 1, 0);
    config.position = 0;
    const l = try Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
    defer l.destroy();
    var indices: [16]u64 = undefined;
    var origin: [16]u16 = undefined;
    var ahead: [16]u64 = undefined;
    var ahead_origin: [16]u16 = undefined;
    var t: Taken = .{};
    var per_source: [2]u64 = @splat(0);
    for (0..8) |step| {
        // The indices of a step, computed without building it, are the built ones.
        try l.indicesAt(step, &ahead, &ahead_origin);
        try take(l, step, 0, &t, &indices, &origin);
        defer t.free();
        try testing.expectEqualSlices(u64, &ahead, &indices);
        try testing.expectEqualSlices(u16, &ahead_origin, &origin);
        for (t.values(0)[0..16], indices, origin) |value, index, source| {
            // Source 0's index i is record i of the shards (value i + 1); source 1's, 1000 i + 1.
            try testing.expectEqual(if (source == 0) index + 1 else 1000 * index + 1, value);
            per_source[source] += 1;
        }
    }
    // 3:1 over 128 records: 96 and 32.
    try testing.expectEqual(@as(u64, 96), per_source[0]);
    try testing.expectEqual(@as(u64, 32), per_source[1]);
}

test "indicesAt of a SEQUENTIAL or IID mixture (no cursors) is what the ring builds" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const a = try testStore(&tmp, "a", 30, 1);
    defer a.close();
    const b = try testStore(&tmp, "b", 20, 1000);
    defer b.close();
    const sources = [_]Source{
        .{ .length = 30, .seed = 1, .weight = 2 },
        .{ .length = 20, .seed = 2, .weight = 1 },
    };
    const parts = twoSourceParts(a, b);
    for ([_]sampler.Mode{ .sequential, .iid }) |mode| {
        var config = testConfig(6, 2, 1, 0);
        config.mode = @backingInt(mode);
        const l = try Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
        defer l.destroy();
        var indices: [6]u64 = undefined;
        var origin: [6]u16 = undefined;
        var ahead: [6]u64 = undefined;
        var ahead_origin: [6]u16 = undefined;
        var t: Taken = .{};
        for (0..5) |step| {
            try l.indicesAt(step, &ahead, &ahead_origin);
            try take(l, step, 0, &t, &indices, &origin);
            defer t.free();
            try testing.expectEqualSlices(u64, &ahead, &indices);
            try testing.expectEqualSlices(u16, &ahead_origin, &origin);
        }
    }
}

test "a CYCLIC mixture repeats no record of a source in a step; a reset with cursors continues" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const a = try testStore(&tmp, "a", 23, 1);
    defer a.close();
    const b = try testStore(&tmp, "b", 17, 1);
    defer b.close();
    // 10 records a step, 6 and 4 of them from the sources: cycles of 3 and 4 steps.
    const sources = [_]Source{
        .{ .length = 23, .seed = 1, .weight = 3 },
        .{ .length = 17, .seed = 2, .weight = 2 },
    };
    const parts = twoSourceParts(a, b);
    const config = testConfig(10, 2, 1, 0);
    const l = try Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
    defer l.destroy();
    try testing.expect(l.hasCursors());
    var indices: [40][10]u64 = undefined;
    var origin: [40][10]u16 = undefined;
    var ahead: [10]u64 = undefined;
    var ahead_origin: [10]u16 = undefined;
    var t: Taken = .{};
    for (0..40) |step| {
        // What indicesAt says (a prefetch hook's indices) is what the ring builds.
        try l.indicesAt(step, &ahead, &ahead_origin);
        try take(l, step, 0, &t, &indices[step], &origin[step]);
        t.free();
        try testing.expectEqualSlices(u64, &ahead, &indices[step]);
        try testing.expectEqualSlices(u16, &ahead_origin, &origin[step]);
        for (0..10) |i| {
            for (0..i) |j| {
                const same_source = origin[step][i] == origin[step][j];
                try testing.expect(!same_source or indices[step][i] != indices[step][j]);
            }
        }
    }
    // Every source's cursor at step 20, then the run again from there.
    var cursors: [2]mixture.Cursor = undefined;
    for (&cursors, 0..) |*cursor, k| {
        const start: mixture.Base = .{ .step = 0, .position = 0 };
        const place = l.mix.cursorAt(k, 10, l.cycle_steps[k], start, l.cursors[k], 20);
        cursor.* = .{
            .cycle = @intCast(place.cycle),
            .offset = @intCast(place.offset),
            .steps_left = place.steps_left,
        };
    }
    try testing.expectEqual(@as(u64, 1), l.reset(20, 200, &cursors));
    var again: [10]u64 = undefined;
    var again_origin: [10]u16 = undefined;
    for (20..40) |step| {
        try l.indicesAt(step, &ahead, &ahead_origin);
        try take(l, step, 1, &t, &again, &again_origin);
        t.free();
        try testing.expectEqualSlices(u64, &indices[step], &again);
        try testing.expectEqualSlices(u16, &origin[step], &again_origin);
        try testing.expectEqualSlices(u64, &again, &ahead);
        try testing.expectEqualSlices(u16, &again_origin, &ahead_origin);
    }
}

test "indicesAt is what a one-source CYCLIC ring builds, across cycle ends and resets" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "s", 23, 1);
    defer s.close();
    // 5 records a step: a cycle of 23 serves 4 steps and drops 3 records.
    const sources = [_]Source{.{ .length = 23, .seed = 9, .weight = 1 }};
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    const config = testConfig(5, 3, 2, 2);
    const l = try Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
    defer l.destroy();
    var ahead: [5]u64 = undefined;
    var built: [5]u64 = undefined;
    var expected: [5]u64 = undefined;
    var t: Taken = .{};
    for (2..14) |step| {
        try l.indicesAt(step, &ahead, null);
        try take(l, step, 0, &t, &built, null);
        t.free();
        try testing.expectEqualSlices(u64, &ahead, &built);
        sampler.fill(23, .cyclic, 9, step, 0, 1, &expected);
        try testing.expectEqualSlices(u64, &expected, &built);
        // No step straddles a cycle: its records are distinct.
        for (0..5) |i| for (0..i) |j| try testing.expect(built[i] != built[j]);
    }
    // An elastic base: cycle 3, offset 7 (a global batch of another size
    // stopped there). Three more steps fit in its cycle, then whole cycles.
    try testing.expectEqual(@as(u64, 1), l.reset(100, 3 * 23 + 7, &.{}));
    var cycle_of: [8]u64 = undefined;
    for (100..108, 0..) |step, i| {
        try l.indicesAt(step, &ahead, null);
        try take(l, step, 1, &t, &built, null);
        t.free();
        try testing.expectEqualSlices(u64, &ahead, &built);
        const position = sampler.positionAt(.cyclic, 23, 5, 100, 3 * 23 + 7, step);
        cycle_of[i] = @intCast(position / 23);
        sampler.fillFrom(23, .cyclic, 9, position, &expected);
        try testing.expectEqualSlices(u64, &expected, &built);
    }
    try testing.expectEqualSlices(u64, &.{ 3, 3, 3, 4, 4, 4, 4, 5 }, &cycle_of);
    // Before the base there is nothing to compute.
    try testing.expectError(error.InvalidArgument, l.indicesAt(99, &ahead, null));
}

test "CYCLIC refuses a global batch that must repeat a record" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "s", 10, 1);
    defer s.close();
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    const one = [_]Source{.{ .length = 10, .seed = 1, .weight = 1 }};
    const config = testConfig(11, 2, 1, 0);
    const refused = Loader.create(testing.allocator, config, &one, &dense8(), &parts, null);
    try testing.expectError(error.InvalidArgument, refused);
    // A mixture source of 10 records with half of every step of 22.
    const two = [_]Source{
        .{ .length = 100, .seed = 1, .weight = 1 },
        .{ .length = 10, .seed = 2, .weight = 1 },
    };
    const both = [_]Part{
        .{ .store = s, .first = 0, .source = 0, .column = 0 },
        .{ .store = s, .first = 0, .source = 1, .column = 0 },
    };
    const mixed = testConfig(22, 2, 1, 0);
    const too_small = Loader.create(testing.allocator, mixed, &two, &dense8(), &both, null);
    try testing.expectError(error.InvalidArgument, too_small);
}

test "steps built ahead of the consumer stream their large dense columns, byte for byte" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    // 256 records of 4,100 B a step: over stream_step_min, and every record
    // after the first starts off a 32-byte boundary.
    const size = 4100;
    const count = 300;
    const io = @import("../pool.zig").io();
    const base = try tmp.dir.realPathFileAlloc(io, ".", testing.allocator);
    defer testing.allocator.free(base);
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/big", .{base});
    const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    defer s.close();
    const block = try testing.allocator.alloc(u8, count * size);
    defer testing.allocator.free(block);
    for (block, 0..) |*byte, i| byte.* = @truncate(i / size *% 31 +% i);
    var ptrs: [count][*]const u8 = undefined;
    var sizes: [count]u64 = undefined;
    for (&ptrs, &sizes, 0..) |*p, *z, i| {
        p.* = block[i * size ..].ptr;
        z.* = size;
    }
    _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = count }, false);
    const sources = [_]Source{.{ .length = count, .seed = 7, .weight = 1 }};
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    const dense = @backingInt(Loader.ColumnKind.dense);
    const columns = [_]Column{.{ .kind = dense, .record_size = size }};
    const batch = 256;
    comptime assert(batch * size >= stream_step_min);
    const config = testConfig(batch, 6, 2, 0);
    const l = try Loader.create(testing.allocator, config, &sources, &columns, &parts, null);
    defer l.destroy();
    var indices: [batch]u64 = undefined;
    var t: Taken = .{};
    for (0..12) |step| {
        if (step == 1) {
            // The ring fills up to its window while the consumer holds step
            // 0: steps 3 to 5 are claimed 2 or more ahead of its next.
            while (true) {
                l.mutex.lockUncancelable(io);
                const claimed = l.next_claim;
                l.mutex.unlock(io);
                if (claimed >= 6) break;
                std.Thread.yield() catch {};
            }
        }
        try take(l, step, 0, &t, &indices, null);
        defer t.free();
        try testing.expectEqual(@as(u64, batch * size), t.lengths[0]);
        for (indices, 0..) |index, i| {
            const want = block[@intCast(index * size)..][0..size];
            try testing.expectEqualSlices(u8, want, t.buffers[0].?[i * size ..][0..size]);
        }
    }
    l.stop(); // (every build finished)
    var streamed: u64 = 0;
    for (l.builders) |b| streamed += b.streamed;
    // Steps 0 and 1 were claimed 0 and 1 ahead: written with plain stores;
    // steps 2 to 5 and every step claimed after a take, 2 or more ahead,
    // where streaming pays (AMD); on other CPUs none.
    if (cpu.streamingPays()) {
        try testing.expect(streamed >= 4 and streamed + 2 <= l.next_claim);
    } else {
        try testing.expectEqual(@as(u64, 0), streamed);
    }
}

test "a variable column hands over one new buffer with the sizes" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "p", 20, 2);
    defer s.close();
    const columns = [_]Column{.{ .kind = @backingInt(ColumnKind.variable), .record_size = 0 }};
    var config = testConfig(4, 2, 1, 0);
    config.mode = @backingInt(sampler.Mode.sequential);
    const sources = [_]Source{.{ .length = 20, .seed = 0, .weight = 1 }};
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    const l = try Loader.create(testing.allocator, config, &sources, &columns, &parts, null);
    defer l.destroy();
    var t: Taken = .{};
    try take(l, 0, 0, &t, null, null);
    defer t.free();
    try testing.expectEqual(@as(u64, 32), t.lengths[0]);
    try testing.expectEqualSlices(u64, &.{ 8, 8, 8, 8, 0, 0, 0, 0 }, t.sizes[0..8]);
    for (0..4) |i| try testing.expectEqual(2 * @as(u64, i) + 1, t.values(0)[i]);
}

test "parts with rows read the store records they name; out buffers take steps in turn" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const a = try testStore(&tmp, "a", 20, 1);
    defer a.close();
    const b = try testStoreFrom(&tmp, "b", 10, 1, 100);
    defer b.close();
    // Stream records 0..4 are a's records 2, 3, 5, 11, 19; 5..14 are b's.
    const rows = [_]u64{ 2, 3, 5, 11, 19 };
    const sources = [_]Source{.{ .length = 15, .seed = 0, .weight = 1 }};
    const parts = [_]Part{
        .{ .store = b, .first = 5, .source = 0, .column = 0 },
        .{ .store = a, .first = 0, .source = 0, .column = 0, .rows = &rows, .row_count = 5 },
    };
    var outs: [3][5]u64 = undefined;
    const out_ptrs = [3][*]u8{ @ptrCast(&outs[0]), @ptrCast(&outs[1]), @ptrCast(&outs[2]) };
    const columns = [_]Column{.{
        .kind = @backingInt(ColumnKind.dense),
        .record_size = 8,
        .out = &out_ptrs,
        .out_count = 3,
    }};
    var config = testConfig(5, 2, 1, 0);
    config.mode = @backingInt(sampler.Mode.sequential);
    const l = try Loader.create(testing.allocator, config, &sources, &columns, &parts, null);
    defer l.destroy();
    var t: Taken = .{};
    const want = [3][5]u64{
        .{ 3, 4, 6, 12, 20 },
        .{ 101, 102, 103, 104, 105 },
        .{ 106, 107, 108, 109, 110 },
    };
    for (0..3) |step| {
        try take(l, step, 0, &t, null, null);
        // The step's batch is the caller's buffer: nothing was handed over.
        try testing.expect(t.buffers[0] == null);
        try testing.expectEqualSlices(u64, &want[step], &outs[step]);
    }
    // A rows array longer than the room before the next part is refused.
    const long = [_]u64{ 0, 1, 2, 3, 4, 5 };
    var bad = parts;
    bad[1].rows = &long;
    bad[1].row_count = 6;
    const refused = Loader.create(testing.allocator, config, &sources, &columns, &bad, null);
    try testing.expectError(error.InvalidArgument, refused);
}

test "a failing step reports its error and column; close wakes a waiter" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const a = try testStore(&tmp, "a", 50, 3);
    defer a.close();
    const b = try testStore(&tmp, "b", 40, 3);
    defer b.close();
    // The sampler draws from 50 records, column 1 holds only 40: step 0 fails.
    const columns = [_]Column{ dense8()[0], dense8()[0] };
    const parts = [_]Part{
        .{ .store = a, .first = 0, .source = 0, .column = 0 },
        .{ .store = b, .first = 0, .source = 0, .column = 1 },
    };
    var config = testConfig(50, 2, 1, 0);
    config.mode = @backingInt(sampler.Mode.sequential);
    // Gated: each step is built once released, after the store changes below.
    config.gated = 1;
    const sources = [_]Source{.{ .length = 50, .seed = 0, .weight = 1 }};
    const live = outbuf.live.load(.monotonic);
    const l = try Loader.create(testing.allocator, config, &sources, &columns, &parts, null);
    var t: Taken = .{ .failed_column = 9 };
    try l.submit(0, 1, 0, null);
    try testing.expectError(error.OutOfRange, take(l, 0, 0, &t, null, null));
    try testing.expectEqual(@as(u32, 1), t.failed_column);
    // A failed step hands nothing over (its column-0 batch was freed).
    try testing.expect(t.buffers[0] == null);

    // A store closed by its owner fails the next step instead of being read
    // (the loader keeps it mapped until destroy).
    a.shutdown();
    try l.submit(1, 1, 0, null);
    try testing.expectError(error.Closed, take(l, 1, 0, &t, null, null));
    try testing.expectEqual(@as(u32, 0), t.failed_column);

    const Waiter = struct {
        fn run(loader: *Loader, result: *?Error) void {
            var got: Taken = .{};
            take(loader, 2, 0, &got, null, null) catch |err| {
                result.* = err;
            };
            got.free();
        }
    };
    // Stop while another thread waits for a step being built.
    var result: ?Error = null;
    try l.submit(2, 1, 0, null);
    const thread = try std.Thread.spawn(.{}, Waiter.run, .{ l, &result });
    l.stop();
    thread.join();
    // Either the step finished first (then it failed: a store is closed) or
    // the stop woke the waiter.
    try testing.expect(result != null);
    try testing.expectError(error.Closed, take(l, 3, 0, &t, null, null));
    l.destroy();
    try testing.expectEqual(live, outbuf.live.load(.monotonic));
}
