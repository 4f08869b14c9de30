//! The loader's prefetch ring: library threads that build whole batches
//! ahead of the consumer — every step's indices (one source, or a weighted
//! mixture of sources) and every column of every store — so no Python runs
//! between a step and its finished buffers.
//!
//! Model. A loader reads `columns` (a DataLoader's stream names) from one or
//! more `sources`; each (source, column) pair is a list of parts (the shards
//! of a ShardSet, or one store). A dense column's batch goes into a buffer
//! the consumer submits (batch_size fixed-size records); a variable column's
//! (ragged records, bytes) into one new buffer per step, which `wait` hands
//! to the consumer with every record's payload and aux sizes.
//!
//! Indices. The records of all ranks form one stream of global positions;
//! step s of this ring starts at a position computed from the base (the
//! `step` and `position` of the config, or of the last reset), G =
//! batch_size * world records per step, and rank r takes its slice
//! [r*B, (r+1)*B). With one source, position p is the sampler's index at p,
//! and the step's position is `sampler.positionAt` (CYCLIC steps never
//! straddle two cycles). With a mixture, the mixed stream's positions run
//! G per step; mixture.zig shares them out among the sources by weight and
//! orders each step's records by a keyed permutation; each source's records
//! are its own sampler's indices, at its own positions (SEQUENTIAL, IID) or,
//! in CYCLIC mode, from its cursor's cycle (one cycle per step, see
//! mixture.zig). All of it is a pure function of the step and the base, and
//! a resumed run continues from any base.
//!
//! Ring. The consumer submits steps in order; `threads` workers claim them in
//! order and build them; the consumer waits for a step and owns its buffers
//! again. A ring of `window` slots holds the steps submitted and not yet
//! waited for (slot = step % window); submitting into a slot that is still
//! in use is refused, never a race.
//!
//! Lifetime. The loader counts itself as a user of every store it reads
//! (Store.enter, Store.hold) until `destroy`, so a store its owner closes
//! while the loader runs stays mapped; the loader fails that store's next
//! step with `error.Closed` instead of reading it.
const std = @import("std");
const Io = std.Io;
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const Store = @import("Store.zig");
const sampler = @import("sampler.zig");
const mixture = @import("mixture.zig");
const outbuf = @import("outbuf.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const store_read = @import("store_read.zig");
const store_parts = @import("store_parts.zig");
const windows = @import("windows.zig");

const Loader = @This();

pub const Error = Store.Error;

/// Bounds chosen at open (TigerStyle: everything bounded).
pub const columns_max: usize = 1024;
pub const window_max: usize = 1 << 16;
pub const threads_max: usize = 256;
pub const sources_max: usize = mixture.sources_max;
pub const parts_max: usize = store_parts.parts_max;
const message_size_max: usize = 256;

pub const ColumnKind = enum(u32) {
    /// Fixed-size records into a submitted buffer (batch_size * record_size).
    dense = 0,
    /// Any records into a new buffer per step, with their sizes.
    variable = 1,
    /// Token windows of a document corpus (windows.zig): (L + 1) tokens a record.
    windows = 2,
    /// The document ordinals of those windows: (L + 1) int32 a record.
    segments = 3,
};

/// lx_column_t: one stream of every batch.
pub const Column = extern struct {
    kind: u32,
    _reserved: u32 = 0,
    /// Bytes of one record (dense columns).
    record_size: u64,

    comptime {
        assert(@sizeOf(Column) == 16);
    }
};

/// lx_source_t: one source of records; `weight` matters in a mixture only,
/// `cursor` in a CYCLIC mixture only: the source's place at `Config.step`
/// (mixture.Cursor; all zero for a fresh run).
pub const Source = extern struct {
    length: u64,
    seed: u64,
    weight: u64,
    cursor: mixture.Cursor = .{},

    comptime {
        assert(@sizeOf(Source) == 48);
    }
};

/// lx_loader_part_t: `store` holds records from `first` of (source, column).
pub const Part = extern struct {
    store: *Store,
    first: u64,
    source: u32,
    column: u32,

    comptime {
        assert(@sizeOf(Part) == 24);
    }
};

/// lx_loader_config_t.
pub const Config = extern struct {
    /// Records per step on this rank.
    batch_size: u64,
    rank: u64,
    world: u64,
    /// The global position of the first record of step `step` (the
    /// sampler's, see sampler.positionAt; a mixture's mixed position).
    position: u64,
    /// The first step to submit.
    step: u64,
    /// Keys the order of a mixture's records within a step.
    seed: u64,
    /// sampler.Mode of every source.
    mode: u32,
    /// Steps submitted and not yet waited for, at most.
    window: u32,
    threads: u32,
    /// Lanes of one gather (0: every usable core).
    lanes: u32,

    comptime {
        assert(@sizeOf(Config) == 64);
    }
};

const State = enum(u8) { free, submitted, running, done };

const Slot = struct {
    state: State = .free,
    step: u64 = 0,
    failure: ?Error = null,
    failed_column: u32 = 0,
    message_len: usize = 0,
    message: [message_size_max]u8 = undefined,
};

/// A variable column's result of a step: a buffer from outbuf.zig, or null.
const Result = struct {
    buffer: ?[*]u8 = null,
    len: u64 = 0,
};

/// What a step's consumer gave it: one destination per column, and where to
/// write the step's indices and sources (either may be null).
const Dests = struct {
    columns: [][*]u8,
    indices: ?[*]u64 = null,
    sources: ?[*]u16 = null,
};

/// A worker's buffers, sized at open.
const Work = struct {
    indices: []u64,
    sources: []u16,
    origins: []mixture.Origin,
    slots: []u64,
    /// A step's positions of one source (mixtures: up to G).
    filled: []u64,
    parts: store_parts.Scratch = .{},
    win: windows.Scratch = .{},
    /// One source's records of a step: their rows and window indices.
    rows: []u64,
    picked: []u64,
};

gpa: Allocator,
config: Config,
mode: sampler.Mode,
sources: []Source,
mix: mixture.Mixture,
/// A CYCLIC mixture's sources: the steps of each cycle after the base's
/// (mixture.zig's T_k), and each one's cursor at the base step. Written only
/// at open and by `reset` while no step is being built, read by the builds.
cycle_steps: [sources_max]u64 = undefined,
cursors: [sources_max]mixture.Cursor = undefined,
columns: []Column,
/// Every part, grouped by column, then by source, then by `first`.
parts: []store_parts.Part,
/// Per (column, source): the window index of a windows/segments column.
specs: []windows.Spec,
/// Per column c: its parts are parts[col_start[c] .. col_start[c + 1]];
/// per (c, k): source k's are parts[range_start[c * K + k] .. next].
col_start: []usize,
range_start: []usize,
slots: []Slot,
/// window * columns destinations, results; window index/source outputs.
dests: [][*]u8,
results: []Result,
index_out: []?[*]u64,
source_out: []?[*]u16,
work: []Work,
threads: []std.Thread,

mutex: Io.Mutex = .init,
/// Workers wait here for a submitted step (or close).
work_ready: Io.Condition = .init,
/// Waiters (and reset) wait here for a finished step (or close).
step_done: Io.Condition = .init,
// Under `mutex`:
next_submit: u64,
next_claim: u64,
running: u32 = 0,
closed: bool = false,

stop_started: std.atomic.Value(bool) = .init(false),
joined: std.atomic.Value(bool) = .init(false),

// ---------------------------------------------------------------- open

fn checkConfig(c: Config, sources: []const Source, columns: []const Column) Error!void {
    // No column at all is fine: the ring then only computes indices (for
    // streams the consumer reads itself).
    if (columns.len > columns_max) {
        return invalid(
            "a loader takes at most {d} columns, got {d}",
            .{ columns_max, columns.len },
        );
    }
    if (sources.len == 0 or sources.len > sources_max) {
        return invalid("a loader needs 1 to {d} sources, got {d}", .{ sources_max, sources.len });
    }
    if (c.window == 0 or c.window > window_max) {
        return invalid("window must be 1..{d}, got {d}", .{ window_max, c.window });
    }
    if (c.threads == 0 or c.threads > threads_max) {
        return invalid("threads must be 1..{d}, got {d}", .{ threads_max, c.threads });
    }
    if (c.batch_size == 0 or c.world == 0 or c.rank >= c.world) {
        return invalid(
            "bad batch_size {d} or shard ({d}, {d})",
            .{ c.batch_size, c.rank, c.world },
        );
    }
    if (std.enums.fromInt(sampler.Mode, c.mode) == null) {
        return invalid("unknown sampler mode {d}", .{c.mode});
    }
    const global = std.math.mul(u64, c.batch_size, c.world) catch
        return invalid("batch_size * world overflows", .{});
    _ = std.math.mul(usize, @intCast(global), @sizeOf(u64)) catch
        return invalid("global batch too large", .{});
    var total: u64 = 0;
    for (sources, 0..) |s, k| {
        if (s.length == 0) return invalid("source {d} is empty", .{k});
        if (sources.len > 1 and s.weight == 0) return invalid("source {d} has weight 0", .{k});
        total = std.math.add(u64, total, s.weight) catch return invalid("weights overflow", .{});
    }
    if (sources.len > 1 and total > mixture.weight_total_max) {
        return invalid("weights add up to more than {d}", .{mixture.weight_total_max});
    }
    for (columns, 0..) |col, i| {
        const kind = std.enums.fromInt(ColumnKind, col.kind) orelse
            return invalid("column {d}: unknown kind {d}", .{ i, col.kind });
        if (kind != .variable) {
            _ = std.math.mul(u64, col.record_size, c.batch_size) catch
                return invalid("column {d}: a batch overflows", .{i});
        }
    }
}

/// CYCLIC: refuses a global batch that would have to repeat a record (more
/// records than one source has, or a mixture source's most records in one
/// step, mixture.windowMax, above its length), and for a mixture sets each
/// source's cycle length and its cursor at the base step.
fn initCycles(l: *Loader, sources: []const Source) Error!void {
    if (l.mode != .cyclic) return;
    const global = l.config.batch_size * l.config.world;
    if (sources.len == 1) {
        if (global > sources[0].length) {
            return invalid(
                "CYCLIC needs batch_size * world ({d}) <= the source's {d} records",
                .{ global, sources[0].length },
            );
        }
        return;
    }
    for (sources, 0..) |s, k| {
        l.cycle_steps[k] = l.mix.stepsPerCycle(k, s.length, global);
        if (l.cycle_steps[k] == 0) {
            return invalid(
                "source {d} has {d} records, but one step of {d} can take up to {d} of them",
                .{ k, s.length, global, l.mix.windowMax(k, global) },
            );
        }
    }
    for (sources, 0..) |s, k| l.cursors[k] = s.cursor;
    l.normalizeCursors(l.config.position);
}

/// Gives every cursor of a CYCLIC mixture its steps left (mixture.normalize)
/// at mixed position `position`.
fn normalizeCursors(l: *Loader, position: u64) void {
    const global = l.config.batch_size * l.config.world;
    for (l.sources, 0..) |s, k| {
        l.cursors[k] = l.mix.normalize(k, s.length, global, position, l.cursors[k]);
    }
}

/// Whether the ring keeps cursors: CYCLIC with more than one source.
pub fn hasCursors(l: *const Loader) bool {
    return l.mode == .cyclic and l.sources.len > 1;
}

/// The window indices of the windows/segments columns: one per (column,
/// source), each matching its column's record size and its source's length.
fn checkSpecs(l: *Loader, specs: ?[*]const windows.Spec) Error!void {
    const k_count = l.sources.len;
    for (l.columns, 0..) |col, c| {
        const kind: ColumnKind = @fromBackingInt(@intCast(col.kind));
        if (kind != .windows and kind != .segments) continue;
        const all = specs orelse
            return invalid("column {d} reads windows but no window index was given", .{c});
        for (0..k_count) |k| {
            const spec = all[c * k_count + k];
            try windows.checkSpec(spec);
            const width = spec.seq_len + 1;
            const want = if (kind == .windows) width * spec.itemsize else width * 4;
            if (col.record_size != want) {
                return invalid(
                    "column {d}: records of {d} bytes, its windows need {d}",
                    .{ c, col.record_size, want },
                );
            }
            if (spec.windowCount() < l.sources[k].length) {
                return invalid(
                    "source {d} has {d} records but column {d} only {d} windows",
                    .{ k, l.sources[k].length, c, spec.windowCount() },
                );
            }
            l.specs[c * k_count + k] = spec;
        }
    }
}

fn invalid(comptime fmt: []const u8, args: anytype) Error {
    return diag.fail(error.InvalidArgument, fmt, args);
}

/// Checks the parts and lays them out by column, source and `first`.
fn layout(l: *Loader, parts: []const Part) Error!void {
    const k_count = l.sources.len;
    const c_count = l.columns.len;
    var counts = l.gpa.alloc(usize, c_count * k_count + 1) catch return error.OutOfMemory;
    defer l.gpa.free(counts);
    @memset(counts, 0);
    for (parts, 0..) |p, i| {
        if (p.column >= c_count or p.source >= k_count) {
            return invalid("part {d}: no column {d} / source {d}", .{ i, p.column, p.source });
        }
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
    @memcpy(l.range_start, counts);
    for (0..c_count + 1) |c| l.col_start[c] = counts[c * k_count];
    var fill = l.gpa.dupe(usize, counts[0 .. counts.len - 1]) catch return error.OutOfMemory;
    defer l.gpa.free(fill);
    for (parts) |p| {
        const at = &fill[p.column * k_count + p.source];
        l.parts[at.*] = .{ .store = p.store, .first = p.first };
        at.* += 1;
    }
    for (0..c_count * k_count) |r| {
        const range = l.parts[l.range_start[r]..l.range_start[r + 1]];
        std.mem.sortUnstable(store_parts.Part, range, {}, firstLess);
        if (range[0].first != 0) {
            return invalid(
                "the first part of column {d}, source {d} must start at 0",
                .{ r / k_count, r % k_count },
            );
        }
        for (range[1..], range[0 .. range.len - 1]) |b, a| {
            if (b.first == a.first) {
                return invalid(
                    "two parts of column {d}, source {d} start at {d}",
                    .{ r / k_count, r % k_count, a.first },
                );
            }
        }
    }
}

fn firstLess(_: void, a: store_parts.Part, b: store_parts.Part) bool {
    return a.first < b.first;
}

/// Starts `config.threads` workers reading `parts` (kept alive until `destroy`).
pub fn create(
    gpa: Allocator,
    config: Config,
    sources: []const Source,
    columns: []const Column,
    parts: []const Part,
    specs: ?[*]const windows.Spec,
) Error!*Loader {
    try checkConfig(config, sources, columns);
    if (parts.len > parts_max) {
        return invalid("a loader takes at most {d} parts, got {d}", .{ parts_max, parts.len });
    }
    const l = gpa.create(Loader) catch return error.OutOfMemory;
    errdefer gpa.destroy(l);
    l.* = .{
        .gpa = gpa,
        .config = config,
        .mode = @fromBackingInt(@intCast(config.mode)),
        .sources = &.{},
        .mix = undefined,
        .columns = &.{},
        .parts = &.{},
        .specs = &.{},
        .col_start = &.{},
        .range_start = &.{},
        .slots = &.{},
        .dests = &.{},
        .results = &.{},
        .index_out = &.{},
        .source_out = &.{},
        .work = &.{},
        .threads = &.{},
        .next_submit = config.step,
        .next_claim = config.step,
    };
    errdefer l.freeBuffers();
    try l.allocate(sources, columns, parts.len);
    try l.layout(parts);
    try l.checkSpecs(specs);
    if (sources.len > 1) {
        var weights: [sources_max]u64 = undefined;
        for (sources, 0..) |s, k| weights[k] = s.weight;
        l.mix = mixture.Mixture.init(weights[0..sources.len]);
    }
    try l.initCycles(sources);
    try l.enterStores();
    errdefer for (l.parts) |p| p.store.leave();
    try l.startThreads();
    for (l.parts) |p| p.store.hold();
    return l;
}

fn allocate(
    l: *Loader,
    sources: []const Source,
    columns: []const Column,
    part_count: usize,
) Error!void {
    const gpa = l.gpa;
    const window: usize = l.config.window;
    l.sources = gpa.dupe(Source, sources) catch return error.OutOfMemory;
    l.columns = gpa.dupe(Column, columns) catch return error.OutOfMemory;
    l.parts = gpa.alloc(store_parts.Part, part_count) catch return error.OutOfMemory;
    l.specs = gpa.alloc(windows.Spec, columns.len * sources.len) catch return error.OutOfMemory;
    l.col_start = gpa.alloc(usize, columns.len + 1) catch return error.OutOfMemory;
    l.range_start = gpa.alloc(usize, columns.len * sources.len + 1) catch return error.OutOfMemory;
    l.slots = gpa.alloc(Slot, window) catch return error.OutOfMemory;
    @memset(l.slots, .{});
    l.dests = gpa.alloc([*]u8, window * columns.len) catch return error.OutOfMemory;
    l.results = gpa.alloc(Result, window * columns.len) catch return error.OutOfMemory;
    @memset(l.results, .{});
    l.index_out = gpa.alloc(?[*]u64, window) catch return error.OutOfMemory;
    l.source_out = gpa.alloc(?[*]u16, window) catch return error.OutOfMemory;
    l.work = gpa.alloc(Work, l.config.threads) catch return error.OutOfMemory;
    for (l.work) |*w| {
        w.* = .{
            .indices = &.{},
            .sources = &.{},
            .origins = &.{},
            .slots = &.{},
            .filled = &.{},
            .rows = &.{},
            .picked = &.{},
        };
    }
    const batch: usize = @intCast(l.config.batch_size);
    const global: usize = @intCast(l.config.batch_size * l.config.world);
    for (l.work) |*w| {
        w.indices = gpa.alloc(u64, batch) catch return error.OutOfMemory;
        w.sources = gpa.alloc(u16, batch) catch return error.OutOfMemory;
        w.rows = gpa.alloc(u64, batch) catch return error.OutOfMemory;
        w.picked = gpa.alloc(u64, batch) catch return error.OutOfMemory;
        if (sources.len > 1) {
            w.origins = gpa.alloc(mixture.Origin, batch) catch return error.OutOfMemory;
            w.slots = gpa.alloc(u64, batch) catch return error.OutOfMemory;
            w.filled = gpa.alloc(u64, global) catch return error.OutOfMemory;
        }
    }
}

fn freeBuffers(l: *Loader) void {
    const gpa = l.gpa;
    for (l.work) |*w| {
        gpa.free(w.indices);
        gpa.free(w.sources);
        gpa.free(w.origins);
        gpa.free(w.slots);
        gpa.free(w.filled);
        gpa.free(w.rows);
        gpa.free(w.picked);
        w.parts.deinit(gpa);
        w.win.deinit(gpa);
    }
    for (l.results) |r| outbuf.free(r.buffer);
    inline for (.{
        "work",        "source_out", "index_out", "results", "dests",   "slots",
        "range_start", "col_start",  "specs",     "parts",   "columns", "sources",
    }) |name| {
        gpa.free(@field(l, name));
    }
}

fn enterStores(l: *Loader) Error!void {
    var entered: usize = 0;
    errdefer for (l.parts[0..entered]) |p| p.store.leave();
    while (entered < l.parts.len) : (entered += 1) try l.parts[entered].store.enter();
}

fn startThreads(l: *Loader) Error!void {
    l.threads = l.gpa.alloc(std.Thread, l.config.threads) catch return error.OutOfMemory;
    var started: usize = 0;
    errdefer {
        l.closeAndWake();
        for (l.threads[0..started]) |t| t.join();
        l.gpa.free(l.threads);
    }
    while (started < l.threads.len) : (started += 1) {
        const options: std.Thread.SpawnConfig = .{ .stack_size = 1 << 20 };
        l.threads[started] = std.Thread.spawn(options, workerMain, .{ l, started }) catch
            return diag.fail(error.OutOfMemory, "could not start loader thread {d}", .{started});
    }
}

// ---------------------------------------------------------------- the ring

/// Gives step `step` (the next in order) its destinations: per column, a
/// dense column's batch buffer (batch_size * record_size bytes) or a packed
/// column's sizes buffer (2 * batch_size words: payload sizes, then aux
/// sizes); and where to write the step's indices and per-record sources
/// (each null for none). Errors: Closed, InvalidArgument (out of order, or
/// its slot is still in use).
pub fn submit(
    l: *Loader,
    step: u64,
    dests: []const [*]u8,
    indices: ?[*]u64,
    sources: ?[*]u16,
) Error!void {
    assert(dests.len == l.columns.len);
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
    if (step != l.next_submit) {
        return invalid("step {d} submitted out of order (next is {d})", .{ step, l.next_submit });
    }
    const k = l.slotOf(step);
    const slot = &l.slots[k];
    if (slot.state != .free) {
        return invalid(
            "step {d}: ring slot still holds step {d} (more than {d} steps submitted)",
            .{ step, slot.step, l.config.window },
        );
    }
    @memcpy(l.dests[k * l.columns.len ..][0..l.columns.len], dests);
    l.index_out[k] = indices;
    l.source_out[k] = sources;
    slot.* = .{ .state = .submitted, .step = step };
    l.next_submit = step + 1;
    l.work_ready.signal(io);
}

/// Waits until submitted step `step` is built and frees its slot: its buffers
/// are the caller's again, and each variable column's new buffer and its length
/// go to `buffers[c]`/`lengths[c]` (the caller frees them with outbuf.free).
/// On a failed step, returns the error (message in diag) and the failing
/// column in `failed_column`. Errors: Closed, InvalidArgument (not
/// submitted), or the step's error.
pub fn wait(
    l: *Loader,
    step: u64,
    failed_column: *u32,
    buffers: []?[*]u8,
    lengths: []u64,
) Error!void {
    assert(buffers.len == l.columns.len and lengths.len == l.columns.len);
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    const k = l.slotOf(step);
    const slot = &l.slots[k];
    while (true) {
        if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
        if (slot.state == .free or slot.step != step) {
            return invalid("step {d} was not submitted", .{step});
        }
        if (slot.state == .done) break;
        l.step_done.waitUncancelable(io, &l.mutex);
    }
    slot.state = .free;
    const results = l.results[k * l.columns.len ..][0..l.columns.len];
    if (slot.failure) |err| {
        freeResults(results);
        failed_column.* = slot.failed_column;
        diag.set("{s}", .{slot.message[0..slot.message_len]});
        return err;
    }
    for (results, buffers, lengths) |*r, *b, *n| {
        b.* = r.buffer;
        n.* = r.len;
        r.* = .{};
    }
}

fn freeResults(results: []Result) void {
    for (results) |*r| {
        outbuf.free(r.buffer);
        r.* = .{};
    }
}

/// Drops every submitted step (waiting for those being built, so no worker
/// still writes into a buffer afterwards); the next step to submit is
/// `step`, and its first record is at global `position`. A CYCLIC mixture
/// (`hasCursors`) also takes every source's cursor at `step` (one per
/// source; otherwise `cursors` is empty and ignored).
pub fn reset(l: *Loader, step: u64, position: u64, cursors: []const mixture.Cursor) void {
    assert(!l.hasCursors() or cursors.len == l.sources.len);
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    while (l.running > 0 and !l.closed) l.step_done.waitUncancelable(io, &l.mutex);
    for (l.slots) |*slot| slot.state = .free;
    freeResults(l.results);
    l.config.step = step;
    l.config.position = position;
    l.next_submit = step;
    l.next_claim = step;
    // Builds read the cursors unlocked; none runs now unless closed (and a
    // closed ring builds nothing more).
    if (l.hasCursors() and !l.closed) {
        @memcpy(l.cursors[0..cursors.len], cursors);
        l.normalizeCursors(position);
    }
}

/// Stops the workers and joins them; waiters return Closed. Idempotent and
/// safe from any thread, also while another thread waits.
pub fn stop(l: *Loader) void {
    l.closeAndWake();
    if (l.stop_started.swap(true, .acq_rel)) return;
    for (l.threads) |t| t.join();
    l.joined.store(true, .release);
}

/// Stops, lets go of the stores and frees the loader. No other call may race it.
pub fn destroy(l: *Loader) void {
    l.stop();
    // A stop begun on another thread may still be joining.
    while (!l.joined.load(.acquire)) std.Thread.yield() catch {};
    for (l.parts) |p| {
        p.store.leave();
        p.store.unhold();
    }
    const gpa = l.gpa;
    gpa.free(l.threads);
    l.freeBuffers();
    gpa.destroy(l);
}

fn closeAndWake(l: *Loader) void {
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    l.closed = true;
    l.mutex.unlock(io);
    l.work_ready.broadcast(io);
    l.step_done.broadcast(io);
}

fn slotOf(l: *const Loader, step: u64) usize {
    return @intCast(step % l.config.window);
}

fn workerMain(l: *Loader, worker_index: usize) void {
    const io = pool.io();
    const work = &l.work[worker_index];
    var dests: [columns_max][*]u8 = undefined;
    var results: [columns_max]Result = undefined;
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    while (!l.closed) {
        const k = l.slotOf(l.next_claim);
        const slot = &l.slots[k];
        if (slot.state != .submitted or slot.step != l.next_claim) {
            l.work_ready.waitUncancelable(io, &l.mutex);
            continue;
        }
        // Claimed: the slot stays ours until we mark it done (a reset waits
        // for `running` to drop), so the build runs unlocked.
        slot.state = .running;
        l.next_claim += 1;
        l.running += 1;
        const step = slot.step;
        const n = l.columns.len;
        @memcpy(dests[0..n], l.dests[k * n ..][0..n]);
        const out: Dests = .{
            .columns = dests[0..n],
            .indices = l.index_out[k],
            .sources = l.source_out[k],
        };
        const base = .{ l.config.step, l.config.position };
        l.mutex.unlock(io);
        var failed_column: u32 = 0;
        for (results[0..n]) |*r| r.* = .{};
        const result = l.build(step, base, out, work, results[0..n], &failed_column);
        l.mutex.lockUncancelable(io);
        l.finish(slot, k, result, failed_column, results[0..n]);
        l.running -= 1;
        l.step_done.broadcast(io);
    }
}

/// Records a built step's outcome in its slot. Caller holds the mutex.
fn finish(
    l: *Loader,
    slot: *Slot,
    k: usize,
    result: Error!void,
    failed_column: u32,
    results: []Result,
) void {
    slot.state = .done;
    slot.failure = null;
    @memcpy(l.results[k * l.columns.len ..][0..l.columns.len], results);
    if (result) |_| {} else |err| {
        freeResults(l.results[k * l.columns.len ..][0..l.columns.len]);
        const message = std.mem.span(diag.get());
        const len = @min(message.len, message_size_max);
        @memcpy(slot.message[0..len], message[0..len]);
        slot.message_len = len;
        slot.failure = err;
        slot.failed_column = failed_column;
    }
}

// ---------------------------------------------------------------- building a step

/// Builds `step` into `out` (and `results`), with the indices of the base
/// (step, position) the step was claimed under.
fn build(
    l: *Loader,
    step: u64,
    base: struct { u64, u64 },
    out: Dests,
    work: *Work,
    results: []Result,
    failed_column: *u32,
) Error!void {
    assert(step >= base[0]);
    l.indicesOf(step, .{ .step = base[0], .position = base[1] }, work);
    const batch: usize = @intCast(l.config.batch_size);
    if (out.indices) |p| @memcpy(p[0..batch], work.indices);
    if (out.sources) |p| @memcpy(p[0..batch], work.sources);
    for (l.columns, 0..) |col, c| {
        failed_column.* = @intCast(c);
        try l.buildColumn(c, col, out.columns[c], work, &results[c]);
    }
}

/// This rank's indices (and sources) of `step`, for the base it was claimed
/// under (a mixture's position is u128 there: the mixed stream's).
fn indicesOf(l: *Loader, step: u64, base: mixture.Base, work: *Work) void {
    const c = l.config;
    const batch: u64 = c.batch_size;
    const global: u64 = c.batch_size * c.world;
    if (l.sources.len == 1) {
        const s = l.sources[0];
        const first = sampler.positionAt(l.mode, s.length, global, base.step, base.position, step);
        sampler.fillFrom(s.length, l.mode, s.seed, first + c.rank * batch, work.indices);
        @memset(work.sources, 0);
        return;
    }
    // The mixed stream runs G positions per step, whatever the mode.
    const first: u128 = base.position + @as(u128, step - base.step) * global;
    mixture.compose(&l.mix, c.seed, first, global, c.rank * batch, work.slots, work.origins);
    var before: [sources_max]u128 = undefined;
    var after: [sources_max]u128 = undefined;
    l.mix.cumulative(first, &before);
    l.mix.cumulative(first + global, &after);
    // Each source's positions of the step, filled at once (one sampler call
    // per source), then picked by the rank's records.
    var at: usize = 0;
    var start: [sources_max]usize = undefined;
    for (l.sources, 0..) |s, k| {
        const n: usize = @intCast(after[k] - before[k]);
        start[k] = at;
        if (n > 0) {
            const from = l.sourcePosition(k, step, base, before[k]);
            sampler.fillFrom(s.length, l.mode, s.seed, from, work.filled[at..][0..n]);
        }
        at += n;
    }
    for (work.origins, work.indices, work.sources) |o, *index, *source| {
        const within: usize = @intCast(o.position - before[o.source]);
        index.* = work.filled[start[o.source] + within];
        source.* = o.source;
    }
}

/// Where source `k`'s records of `step` start in its own sampler's sequence:
/// its cumulative count `before` (SEQUENTIAL, IID), or its cursor's place
/// (CYCLIC: the step's records all come from one cycle).
fn sourcePosition(
    l: *const Loader,
    k: usize,
    step: u64,
    base: mixture.Base,
    before: u128,
) sampler.Position {
    if (!l.hasCursors()) return before;
    const global = l.config.batch_size * l.config.world;
    const place = l.mix.cursorAt(k, global, l.cycle_steps[k], base, l.cursors[k], step);
    return place.position(l.sources[k].length);
}

fn buildColumn(
    l: *Loader,
    c: usize,
    col: Column,
    dest: [*]u8,
    work: *Work,
    result: *Result,
) Error!void {
    const kind: ColumnKind = @fromBackingInt(@intCast(col.kind));
    if (kind == .windows or kind == .segments) return l.buildWindows(c, kind, dest, work);
    const parts = l.parts[l.col_start[c]..l.col_start[c + 1]];
    const snaps = try store_parts.begin(l.gpa, parts, &work.parts);
    defer store_parts.end(parts);
    const reads = try l.readsOf(c, snaps, work);
    const batch: usize = @intCast(l.config.batch_size);
    switch (kind) {
        .windows, .segments => unreachable, // built by buildWindows
        .dense => {
            const size: usize = @intCast(col.record_size);
            try store_read.gatherReads(reads, .{
                .base = dest,
                .len = size * batch,
                .stride = size,
            }, .payload, l.config.lanes);
        },
        .variable => {
            const words: [*]u64 = @ptrCast(@alignCast(dest));
            const buf = try store_read.packedReads(
                l.gpa,
                reads,
                l.config.lanes,
                words[0..batch],
                words[batch..][0..batch],
            );
            result.* = .{ .buffer = if (buf.len > 0) buf.ptr else null, .len = buf.len };
        },
    }
}

/// A windows (or segments) column: each source's records are windows of its
/// corpus, gathered into their rows.
fn buildWindows(l: *Loader, c: usize, kind: ColumnKind, dest: [*]u8, work: *Work) Error!void {
    const k_count = l.sources.len;
    for (0..k_count) |k| {
        var n: usize = 0;
        for (work.sources, work.indices, 0..) |source, index, row| {
            if (source != k) continue;
            work.rows[n] = row;
            work.picked[n] = index;
            n += 1;
        }
        if (n == 0) continue;
        const r = c * k_count + k;
        const parts = l.parts[l.range_start[r]..l.range_start[r + 1]];
        const out: windows.Out = if (kind == .windows)
            .{ .tokens = dest, .rows = work.rows[0..n] }
        else
            .{ .segments = @ptrCast(@alignCast(dest)), .rows = work.rows[0..n] };
        try windows.gather(
            l.gpa,
            l.specs[r],
            parts,
            work.picked[0..n],
            out,
            l.config.lanes,
            &work.win,
        );
    }
}

/// Column c's reads of the step in `work`: each record's part (among the
/// column's parts) and index inside it.
fn readsOf(
    l: *Loader,
    c: usize,
    snaps: []const store_read.Snapshot,
    work: *Work,
) Error!store_read.Reads {
    const k_count = l.sources.len;
    const col_first = l.col_start[c];
    const sc = &work.parts;
    sc.of.resize(l.gpa, work.indices.len) catch return error.OutOfMemory;
    sc.local.resize(l.gpa, work.indices.len) catch return error.OutOfMemory;
    for (work.indices, work.sources, sc.of.items, sc.local.items) |index, source, *of, *local| {
        const r = c * k_count + source;
        const lo = l.range_start[r] - col_first;
        const hi = l.range_start[r + 1] - col_first;
        const parts = l.parts[col_first + lo .. col_first + hi];
        const at = store_parts.find(parts, snaps[lo..hi], index) orelse
            return diag.fail(error.OutOfRange, "source {d}: index {d} is out of range " ++
                "(a store of this column is shorter than the source)", .{ source, index });
        of.* = @intCast(lo + at.part);
        local.* = at.local;
    }
    return .{ .snaps = snaps, .of = sc.of.items, .indices = sc.local.items };
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

fn testStore(tmp: *testing.TmpDir, name: []const u8, count: u64, mul: u64) !*Store {
    return testStoreFrom(tmp, name, count, mul, 0);
}

/// A store of `count` u64 records: record i holds mul * (offset + i) + 1.
fn testStoreFrom(
    tmp: *testing.TmpDir,
    name: []const u8,
    count: u64,
    mul: u64,
    offset: u64,
) !*Store {
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/{s}", .{ base, name });
    const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    errdefer s.close();
    var values: [64]u64 = undefined;
    var ptrs: [64][*]const u8 = undefined;
    var sizes: [64]u64 = undefined;
    var first: u64 = 0;
    while (first < count) : (first += values.len) {
        const n: usize = @intCast(@min(values.len, count - first));
        for (0..n) |i| {
            values[i] = mul * (offset + first + i) + 1;
            ptrs[i] = @ptrCast(&values[i]);
            sizes[i] = 8;
        }
        _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = n }, false);
    }
    return s;
}

fn dense8() [1]Column {
    return .{.{ .kind = @backingInt(ColumnKind.dense), .record_size = 8 }};
}

fn testConfig(batch: u64, window: u32, threads: u32, step: u64) Config {
    return .{
        .batch_size = batch,
        .rank = 0,
        .world = 1,
        .position = step * batch,
        .step = step,
        .seed = 5,
        .mode = @backingInt(sampler.Mode.cyclic),
        .window = window,
        .threads = threads,
        .lanes = 0,
    };
}

test "the ring builds every step in order, exactly as the sampler says" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "x", 100, 3);
    defer s.close();
    const sources = [_]Source{.{ .length = 100, .seed = 5, .weight = 1 }};
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    const config = testConfig(7, 3, 2, 10);
    const l = try Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
    defer l.destroy();
    var buffers: [3][7]u64 = undefined;
    var expected: [7]u64 = undefined;
    var failed: u32 = 0;
    var bufs: [1]?[*]u8 = undefined;
    var lens: [1]u64 = undefined;
    for (10..13) |first| try l.submit(first, &.{@ptrCast(&buffers[first % 3])}, null, null);
    // A fourth step has no free slot until step 10 is waited for.
    const full = l.submit(13, &.{@ptrCast(&buffers[0])}, null, null);
    try testing.expectError(error.InvalidArgument, full);
    var step: u64 = 10;
    while (step < 40) : (step += 1) {
        try l.wait(step, &failed, &bufs, &lens);
        const got = &buffers[step % 3];
        sampler.fill(100, .cyclic, 5, step, 0, 1, &expected);
        for (got, expected) |value, index| try testing.expectEqual(3 * index + 1, value);
        try l.submit(step + 3, &.{@ptrCast(got)}, null, null);
    }
    // Reset drops the steps in flight; the ring continues anywhere.
    l.reset(1000, @intCast(sampler.positionAt(.cyclic, 100, 7, 0, 0, 1000)), &.{});
    try testing.expectError(error.InvalidArgument, l.wait(40, &failed, &bufs, &lens));
    try l.submit(1000, &.{@ptrCast(&buffers[1])}, null, null);
    try l.wait(1000, &failed, &bufs, &lens);
    sampler.fill(100, .cyclic, 5, 1000, 0, 1, &expected);
    for (buffers[1], expected) |value, index| try testing.expectEqual(3 * index + 1, value);
}

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
    var got: [16]u64 = undefined;
    var indices: [16]u64 = undefined;
    var origin: [16]u16 = undefined;
    var failed: u32 = 0;
    var bufs: [1]?[*]u8 = undefined;
    var lens: [1]u64 = undefined;
    var per_source: [2]u64 = @splat(0);
    for (0..8) |step| {
        try l.submit(step, &.{@ptrCast(&got)}, &indices, &origin);
        try l.wait(step, &failed, &bufs, &lens);
        for (got, indices, origin) |value, index, source| {
            // Source 0's index i is record i of the shards (value i + 1); source 1's, 1000 i + 1.
            try testing.expectEqual(if (source == 0) index + 1 else 1000 * index + 1, value);
            per_source[source] += 1;
        }
    }
    // 3:1 over 128 records: 96 and 32.
    try testing.expectEqual(@as(u64, 96), per_source[0]);
    try testing.expectEqual(@as(u64, 32), per_source[1]);
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
    const parts = [_]Part{
        .{ .store = a, .first = 0, .source = 0, .column = 0 },
        .{ .store = b, .first = 0, .source = 1, .column = 0 },
    };
    const config = testConfig(10, 2, 1, 0);
    const l = try Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
    defer l.destroy();
    try testing.expect(l.hasCursors());
    var got: [10]u64 = undefined;
    var indices: [40][10]u64 = undefined;
    var origin: [40][10]u16 = undefined;
    var failed: u32 = 0;
    var bufs: [1]?[*]u8 = undefined;
    var lens: [1]u64 = undefined;
    for (0..40) |step| {
        try l.submit(step, &.{@ptrCast(&got)}, &indices[step], &origin[step]);
        try l.wait(step, &failed, &bufs, &lens);
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
    l.reset(20, 200, &cursors);
    var again: [10]u64 = undefined;
    var again_origin: [10]u16 = undefined;
    for (20..40) |step| {
        try l.submit(step, &.{@ptrCast(&got)}, &again, &again_origin);
        try l.wait(step, &failed, &bufs, &lens);
        try testing.expectEqualSlices(u64, &indices[step], &again);
        try testing.expectEqualSlices(u16, &origin[step], &again_origin);
    }
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

test "a failing step reports its error and column; close wakes a waiter" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const a = try testStore(&tmp, "a", 50, 3);
    defer a.close();
    const b = try testStore(&tmp, "b", 40, 3);
    defer b.close();
    // The sampler draws from 50 records, column 1 holds only 40: some step fails.
    const columns = [_]Column{ dense8()[0], dense8()[0] };
    const parts = [_]Part{
        .{ .store = a, .first = 0, .source = 0, .column = 0 },
        .{ .store = b, .first = 0, .source = 0, .column = 1 },
    };
    var config = testConfig(50, 2, 1, 0);
    config.mode = @backingInt(sampler.Mode.sequential);
    const sources = [_]Source{.{ .length = 50, .seed = 0, .weight = 1 }};
    const l = try Loader.create(testing.allocator, config, &sources, &columns, &parts, null);
    defer l.destroy();
    var xa: [50]u64 = undefined;
    var xb: [50]u64 = undefined;
    var failed: u32 = 9;
    var bufs: [2]?[*]u8 = undefined;
    var lens: [2]u64 = undefined;
    try l.submit(0, &.{ @ptrCast(&xa), @ptrCast(&xb) }, null, null);
    try testing.expectError(error.OutOfRange, l.wait(0, &failed, &bufs, &lens));
    try testing.expectEqual(@as(u32, 1), failed);

    // A store closed by its owner fails the next step instead of being read
    // (the loader keeps it mapped until destroy).
    a.shutdown();
    try l.submit(1, &.{ @ptrCast(&xa), @ptrCast(&xb) }, null, null);
    try testing.expectError(error.Closed, l.wait(1, &failed, &bufs, &lens));
    try testing.expectEqual(@as(u32, 0), failed);

    const Waiter = struct {
        fn run(loader: *Loader, result: *?Error) void {
            var f: u32 = 0;
            var bb: [2]?[*]u8 = undefined;
            var ll: [2]u64 = undefined;
            loader.wait(2, &f, &bb, &ll) catch |err| {
                result.* = err;
            };
        }
    };
    // Close while another thread waits for a submitted step.
    l.reset(2, 100, &.{});
    var result: ?Error = null;
    try l.submit(2, &.{ @ptrCast(&xa), @ptrCast(&xb) }, null, null);
    const t = try std.Thread.spawn(.{}, Waiter.run, .{ l, &result });
    l.stop();
    t.join();
    // Either the step finished first (then it failed: a store is closed) or
    // the stop woke the waiter.
    try testing.expect(result != null);
    try testing.expectError(
        error.Closed,
        l.submit(3, &.{ @ptrCast(&xa), @ptrCast(&xb) }, null, null),
    );
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
    var sizes: [8]u64 = undefined;
    var failed: u32 = 0;
    var bufs: [1]?[*]u8 = undefined;
    var lens: [1]u64 = undefined;
    try l.submit(0, &.{@ptrCast(&sizes)}, null, null);
    try l.wait(0, &failed, &bufs, &lens);
    defer outbuf.free(bufs[0]);
    try testing.expectEqual(@as(u64, 32), lens[0]);
    try testing.expectEqualSlices(u64, &.{ 8, 8, 8, 8, 0, 0, 0, 0 }, &sizes);
    const values: [*]align(1) const u64 = @ptrCast(bufs[0].?);
    for (0..4) |i| try testing.expectEqual(2 * @as(u64, i) + 1, values[i]);
    // A submitted step never waited for: its buffer is freed by destroy.
    try l.submit(1, &.{@ptrCast(&sizes)}, null, null);
}
