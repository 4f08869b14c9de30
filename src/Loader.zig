//! The loader's prefetch ring, the DataLoader's one step machine: library
//! threads that build whole batches ahead of the consumer — every step's
//! indices (one source, or a weighted mixture of sources) and every column of
//! every store — so no Python runs between a step and its finished buffers.
//!
//! Model. A loader reads `columns` (a DataLoader's stream names) from one or
//! more `sources`; each (source, column) pair is a list of parts (the shards
//! of a ShardSet, or one store; a part may read a subset of its store's
//! records, `rows`). A dense column's batch (batch_size fixed-size records)
//! goes into a buffer the ring takes from the output pool (outbuf.zig), or
//! into the caller's recycled buffers (`Column.out`); a variable column's
//! (ragged records, bytes) into one new pool buffer per step, with every
//! record's payload and aux sizes.
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
//! mixture.zig). All of it is a pure function of the step and the base
//! (`indicesAt` computes it without building), and a resumed run continues
//! from any base.
//!
//! Ring. A ring of `window` slots (slot = step % window) holds the steps
//! being built or built and not yet handed over. `threads` workers claim
//! steps in order and build them: a step as soon as its slot is free, or,
//! in a gated ring, once the caller released it (`submit`: the DataLoader
//! releases a step after its streams' prefetch hook returned; a failed
//! prefetch releases it failed). `wait` blocks until a step is built and
//! hands it over: its buffers belong to the caller from then on, and its
//! slot is free for the step `window` later.
//!
//! Ownership (the invariant every path keeps). Memory a worker writes is the
//! ring's until the worker is provably done with it: a step's buffers are
//! handed to the caller only by `wait`, after the step was built; a failed
//! step's, a reset's dropped steps' and a stopped ring's are freed by the
//! ring only once their builders finished (`reset` waits for them, `destroy`
//! joins every worker first). A consumer woken by `stop` or a reset gets no
//! buffer at all, so nothing it drops can still be written. The caller's
//! `out` buffers must stay valid until `stop` returned.
//!
//! Generations. `reset` drops every step (once their builds finished) and
//! starts the next generation; a `wait` or `submit` of an older generation
//! returns error.InvalidArgument ("dropped by a reset") at once, also a wait
//! that was blocked when the reset came.
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
    /// Fixed-size records into a pool buffer or the caller's (batch_size * record_size).
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
    /// The caller's recycled buffers of a dense column: step s is built into
    /// `out[s % out_count]` (valid until lx_loader_stop returned); 0: every
    /// step gets a new buffer from the output pool.
    out_count: u32 = 0,
    /// Bytes of one record (dense, windows and segments columns).
    record_size: u64,
    out: ?[*]const [*]u8 = null,

    comptime {
        assert(@sizeOf(Column) == 24);
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

/// lx_loader_part_t: `store` holds the records from `first` of (source,
/// column): stream index `first + i` is store record `i`, or, when `rows` is
/// not null, store record `rows[i]` for i < `row_count` (a subset; the rows
/// must stay valid until lx_loader_free).
pub const Part = extern struct {
    store: *Store,
    first: u64,
    source: u32,
    column: u32,
    rows: ?[*]const u64 = null,
    row_count: u64 = 0,

    comptime {
        assert(@sizeOf(Part) == 40);
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
    /// The first step to build.
    step: u64,
    /// Keys the order of a mixture's records within a step.
    seed: u64,
    /// sampler.Mode of every source.
    mode: u32,
    /// Steps built or being built and not yet handed over, at most.
    window: u32,
    threads: u32,
    /// Lanes of one gather (0: every usable core).
    lanes: u32,
    /// 0: a step is built as soon as its slot is free; 1: only once released
    /// by lx_loader_submit.
    gated: u32 = 0,
    _reserved: u32 = 0,

    comptime {
        assert(@sizeOf(Config) == 72);
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
    /// The step's indices, sources and variable columns' sizes (2 * batch
    /// words each: payload sizes, then aux sizes), owned by the slot from its
    /// first build to `destroy`.
    indices: []u64 = &.{},
    sources: []u16 = &.{},
    sizes: []u64 = &.{},
};

/// A column's buffer of a step: from outbuf.zig (owned by the ring until
/// handed over), or null (a caller's `out` buffer, or no bytes).
const Result = struct {
    buffer: ?[*]u8 = null,
    len: u64 = 0,
};

/// Where `wait` hands a built step over to the caller.
pub const Handout = struct {
    failed_column: *u32,
    /// Per column: where its buffer goes (the caller owns it from then on),
    /// or null to have it freed.
    buffers: []const ?*?[*]u8,
    /// Per column: its buffer's length.
    lengths: []u64,
    /// 2 * batch_size words per variable column, in column order (or null).
    sizes: ?[*]u64 = null,
    indices: ?[*]u64 = null,
    sources: ?[*]u16 = null,
};

/// A worker's buffers, sized at open.
const Work = struct {
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
/// Columns of kind variable (each has 2 * batch_size words of sizes a step).
variable_count: usize,
/// Every part, grouped by column, then by source, then by `first`; `rows`
/// is parallel to it (null: the store's own records).
parts: []store_parts.Part,
rows: []?[]const u64,
/// Per (column, source): the window index of a windows/segments column.
specs: []windows.Spec,
/// Per column c: its parts are parts[col_start[c] .. col_start[c + 1]];
/// per (c, k): source k's are parts[range_start[c * K + k] .. next].
col_start: []usize,
range_start: []usize,
/// The `out` buffers of every column, back to back (out_start[c] ..).
outs: [][*]u8,
out_start: []usize,
slots: []Slot,
/// window * columns results.
results: []Result,
work: []Work,
threads: []std.Thread,

mutex: Io.Mutex = .init,
/// Workers wait here for a claimable step (or close).
work_ready: Io.Condition = .init,
/// Waiters (and reset) wait here for a finished step (or close, or a reset).
step_done: Io.Condition = .init,
// Under `mutex`:
next_claim: u64,
/// Gated rings: the next step to release.
next_release: u64,
/// Resets so far; waits and submits name the one they belong to.
generation: u64 = 0,
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
    if (c.gated > 1) return invalid("gated must be 0 or 1, got {d}", .{c.gated});
    for (columns, 0..) |col, i| {
        const kind = std.enums.fromInt(ColumnKind, col.kind) orelse
            return invalid("column {d}: unknown kind {d}", .{ i, col.kind });
        if (kind != .variable) {
            _ = std.math.mul(u64, col.record_size, c.batch_size) catch
                return invalid("column {d}: a batch overflows", .{i});
        }
        if (col.out_count > 0 and (kind == .variable or col.out == null)) {
            return invalid("column {d}: out buffers are for dense columns (and not null)", .{i});
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
        for (l.rows[l.col_start[c]..l.col_start[c + 1]]) |rows| {
            if (rows != null) return invalid("column {d} reads windows: no part takes rows", .{c});
        }
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
            assert(c * k_count + k < l.specs.len);
            l.specs[c * k_count + k] = spec;
        }
    }
}

fn invalid(comptime fmt: []const u8, args: anytype) Error {
    return diag.fail(error.InvalidArgument, fmt, args);
}

/// A part with its rows, as sorted by `layout`.
const Placed = struct { part: store_parts.Part, rows: ?[]const u64 };

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
    @memcpy(l.range_start, counts);
    for (0..c_count + 1) |c| l.col_start[c] = counts[c * k_count];
    const placed = l.gpa.alloc(Placed, parts.len) catch return error.OutOfMemory;
    defer l.gpa.free(placed);
    var fill = l.gpa.dupe(usize, counts[0 .. counts.len - 1]) catch return error.OutOfMemory;
    defer l.gpa.free(fill);
    for (parts) |p| {
        const at = &fill[p.column * k_count + p.source];
        const rows: ?[]const u64 = if (p.rows) |r| r[0..@intCast(p.row_count)] else null;
        placed[at.*] = .{ .part = .{ .store = p.store, .first = p.first }, .rows = rows };
        at.* += 1;
    }
    for (0..c_count * k_count) |r| {
        const range = placed[l.range_start[r]..l.range_start[r + 1]];
        std.mem.sortUnstable(Placed, range, {}, firstLess);
        try checkRange(range, r / k_count, r % k_count);
    }
    for (placed, l.parts, l.rows) |p, *part, *rows| {
        part.* = p.part;
        rows.* = p.rows;
    }
    // Every part placed once, each range filled exactly to the next's start.
    assert(l.range_start[c_count * k_count] == parts.len);
    assert(l.col_start[0] == 0 and l.col_start[c_count] == parts.len);
    for (fill, l.range_start[1..]) |f, next| assert(f == next);
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
        .variable_count = 0,
        .parts = &.{},
        .rows = &.{},
        .specs = &.{},
        .col_start = &.{},
        .range_start = &.{},
        .outs = &.{},
        .out_start = &.{},
        .slots = &.{},
        .results = &.{},
        .work = &.{},
        .threads = &.{},
        .next_claim = config.step,
        .next_release = config.step,
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
    assert(l.threads.len == config.threads and l.parts.len == parts.len);
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
    l.rows = gpa.alloc(?[]const u64, part_count) catch return error.OutOfMemory;
    l.specs = gpa.alloc(windows.Spec, columns.len * sources.len) catch return error.OutOfMemory;
    l.col_start = gpa.alloc(usize, columns.len + 1) catch return error.OutOfMemory;
    l.range_start = gpa.alloc(usize, columns.len * sources.len + 1) catch return error.OutOfMemory;
    l.slots = gpa.alloc(Slot, window) catch return error.OutOfMemory;
    @memset(l.slots, .{});
    l.results = gpa.alloc(Result, window * columns.len) catch return error.OutOfMemory;
    @memset(l.results, .{});
    try l.copyOuts(columns);
    l.work = gpa.alloc(Work, l.config.threads) catch return error.OutOfMemory;
    @memset(l.work, .{});
    for (l.work) |*w| try l.initWork(w);
    assert(l.slots.len == window and l.results.len == window * columns.len);
    assert(l.work.len == l.config.threads);
}

/// A private copy of every column's `out` buffer list.
fn copyOuts(l: *Loader, columns: []const Column) Error!void {
    l.out_start = l.gpa.alloc(usize, columns.len + 1) catch return error.OutOfMemory;
    var total: usize = 0;
    for (columns, 0..) |col, c| {
        l.out_start[c] = total;
        total += col.out_count;
        if (col.kind == @backingInt(ColumnKind.variable)) l.variable_count += 1;
    }
    l.out_start[columns.len] = total;
    assert(l.variable_count <= columns.len);
    l.outs = l.gpa.alloc([*]u8, total) catch return error.OutOfMemory;
    for (columns, 0..) |col, c| {
        if (col.out_count == 0) continue;
        @memcpy(l.outs[l.out_start[c]..l.out_start[c + 1]], col.out.?[0..col.out_count]);
    }
}

fn initWork(l: *Loader, w: *Work) Error!void {
    const gpa = l.gpa;
    const batch: usize = @intCast(l.config.batch_size);
    const global: usize = @intCast(l.config.batch_size * l.config.world);
    w.indices = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    w.sources = gpa.alloc(u16, batch) catch return error.OutOfMemory;
    w.rows = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    w.picked = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    if (l.sources.len > 1) {
        w.origins = gpa.alloc(mixture.Origin, batch) catch return error.OutOfMemory;
        w.slots = gpa.alloc(u64, batch) catch return error.OutOfMemory;
        w.filled = gpa.alloc(u64, global) catch return error.OutOfMemory;
    }
}

fn deinitWork(gpa: Allocator, w: *Work) void {
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

fn freeBuffers(l: *Loader) void {
    const gpa = l.gpa;
    for (l.work) |*w| deinitWork(gpa, w);
    for (l.results) |r| outbuf.free(r.buffer);
    for (l.slots) |slot| {
        gpa.free(slot.indices);
        gpa.free(slot.sources);
        gpa.free(slot.sizes);
    }
    inline for (.{
        "work",      "results", "slots", "outs",  "out_start", "range_start",
        "col_start", "specs",   "rows",  "parts", "columns",   "sources",
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

/// Releases steps `step` .. `step + count - 1` of a gated ring (the next in
/// order) to the workers, or, with a `failure` message, fails them without
/// building them: their `wait` returns error.Failed with that message.
/// `generation` is the caller's (the number of resets it made). All or
/// nothing. Errors: Closed, InvalidArgument (not gated, count 0, out of
/// order, a slot still holds an earlier step, or an older generation:
/// dropped by a reset).
pub fn submit(l: *Loader, step: u64, count: u64, generation: u64, failure: ?[]const u8) Error!void {
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
    if (l.config.gated == 0) return invalid("submit: this ring is not gated", .{});
    if (generation != l.generation) return dropped(step);
    if (step != l.next_release) {
        return invalid("step {d} submitted out of order (next is {d})", .{ step, l.next_release });
    }
    if (count == 0 or count > l.config.window) {
        const window = l.config.window;
        return invalid("submit: count must be 1 to the window ({d}), got {d}", .{ window, count });
    }
    assert(l.next_claim <= l.next_release);
    for (step..step + count) |at| {
        const slot = &l.slots[l.slotOf(at)];
        if (slot.state != .free) {
            return invalid(
                "step {d}: ring slot still holds step {d} (more than {d} steps ahead)",
                .{ at, slot.step, l.config.window },
            );
        }
        for (l.results[l.slotOf(at) * l.columns.len ..][0..l.columns.len]) |r| {
            assert(r.buffer == null); // handed over or freed with the slot's last step
        }
    }
    for (step..step + count) |at| {
        const slot = &l.slots[l.slotOf(at)];
        slot.state = .submitted;
        slot.step = at;
        if (failure) |message| {
            slot.state = .done;
            slot.failure = error.Failed;
            slot.failed_column = @intCast(l.columns.len);
            slot.message_len = @min(message.len, message_size_max);
            @memcpy(slot.message[0..slot.message_len], message[0..slot.message_len]);
        }
    }
    if (failure != null) l.step_done.broadcast(io);
    l.next_release = step + count;
    l.invariants();
    l.work_ready.broadcast(io);
}

fn dropped(step: u64) Error {
    return invalid("step {d} was dropped by a reset", .{step});
}

/// Waits until step `step` (of `generation`) is built and hands it over (see
/// Handout): its buffers are the caller's from then on, its slot is free. On
/// a failed step, frees its buffers and returns the error (message in diag)
/// with the failing column in `failed_column` (columns.len: failed by
/// `submit`). Errors: Closed (also when stopped while waiting),
/// InvalidArgument (before the ring's first step, already handed over, or
/// dropped by a reset, also while waiting), or the step's error.
pub fn wait(l: *Loader, step: u64, generation: u64, out: Handout) Error!void {
    assert(out.buffers.len == l.columns.len and out.lengths.len == l.columns.len);
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    defer l.invariants(); // runs first, under the mutex
    const k = l.slotOf(step);
    const slot = &l.slots[k];
    while (true) {
        if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
        if (generation != l.generation) return dropped(step);
        if (step < l.config.step) return invalid("step {d} is before the ring's first", .{step});
        if (slot.step == step and slot.state == .done) break;
        const pending = slot.step == step and slot.state != .free;
        if (step < l.next_claim and !pending) {
            return invalid("step {d} was already handed over", .{step});
        }
        l.step_done.waitUncancelable(io, &l.mutex);
    }
    // Built (claimed), or failed by `submit` (released).
    assert(slot.step == step and slot.state == .done);
    assert(step >= l.config.step and step < @max(l.next_claim, l.next_release));
    slot.state = .free;
    // Its slot is free: an ungated ring builds the step `window` later now.
    l.work_ready.signal(io);
    const results = l.results[k * l.columns.len ..][0..l.columns.len];
    if (slot.failure) |err| {
        freeResults(results);
        out.failed_column.* = slot.failed_column;
        diag.set("{s}", .{slot.message[0..slot.message_len]});
        return err;
    }
    l.handOver(slot, results, out);
}

/// Copies a built step's indices and sizes out and gives its buffers away.
/// Caller holds the mutex.
fn handOver(l: *Loader, slot: *const Slot, results: []Result, out: Handout) void {
    assert(slot.state == .free and slot.failure == null);
    const batch: usize = @intCast(l.config.batch_size);
    // A built step's arrays (slotBuffers) and one result per column.
    assert(slot.indices.len == batch and slot.sources.len == batch);
    assert(slot.sizes.len == 2 * batch * l.variable_count);
    assert(results.len == l.columns.len);
    if (out.indices) |p| @memcpy(p[0..batch], slot.indices);
    if (out.sources) |p| @memcpy(p[0..batch], slot.sources);
    if (out.sizes) |p| @memcpy(p[0 .. 2 * batch * l.variable_count], slot.sizes);
    for (results, out.buffers, out.lengths) |*r, to, *len| {
        len.* = r.len;
        if (to) |owner| owner.* = r.buffer else outbuf.free(r.buffer);
        r.* = .{};
    }
}

fn freeResults(results: []Result) void {
    for (results) |*r| {
        outbuf.free(r.buffer);
        r.* = .{};
    }
}

/// Drops every step (waiting for those being built, so no worker still
/// writes into a buffer afterwards, and freeing their buffers), wakes every
/// waiter of the old generation, and starts the next: its first step is
/// `step`, whose first record is at global `position`. A CYCLIC mixture
/// (`hasCursors`) also takes every source's cursor at `step` (one per
/// source; otherwise `cursors` is empty and ignored). Returns the new
/// generation. Does nothing once stopped.
pub fn reset(l: *Loader, step: u64, position: u64, cursors: []const mixture.Cursor) u64 {
    assert(!l.hasCursors() or cursors.len == l.sources.len);
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    if (l.closed) return l.generation;
    l.generation += 1;
    l.step_done.broadcast(io);
    while (l.running > 0) {
        // Stopped meanwhile: leave the slots to the builders still running
        // (destroy frees everything once they are joined).
        if (l.closed) return l.generation;
        l.step_done.waitUncancelable(io, &l.mutex);
    }
    assert(l.running == 0);
    for (l.slots) |*slot| {
        assert(slot.state != .running);
        slot.state = .free;
    }
    freeResults(l.results);
    l.config.step = step;
    l.config.position = position;
    l.next_claim = step;
    l.next_release = step;
    // Builds read the cursors unlocked (indicesAt copies them under the
    // mutex); none runs now, and the next claims come after this.
    if (l.hasCursors()) {
        @memcpy(l.cursors[0..cursors.len], cursors);
        l.normalizeCursors(position);
    }
    l.invariants();
    l.work_ready.broadcast(io);
    return l.generation;
}

/// Stops the workers and joins them; waiters return Closed. Idempotent and
/// safe from any thread, also while another thread waits.
pub fn stop(l: *Loader) void {
    l.closeAndWake();
    if (l.stop_started.swap(true, .acq_rel)) return;
    for (l.threads) |t| t.join();
    l.joined.store(true, .release);
}

/// Stops, lets go of the stores and frees the loader (and every buffer it
/// still holds). No other call may race it.
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
    assert(l.slots.len == l.config.window);
    return @intCast(step % l.config.window);
}

/// The ring's bookkeeping, checked under the mutex after each change (Debug
/// and ReleaseSafe; one pass over the slots): `running` counts the running
/// slots, every busy slot sits at its step's place and holds a step between
/// the base and the claims (submitted ones between the claims and the
/// releases of a gated ring), and a slot holds buffers only once built.
fn invariants(l: *const Loader) void {
    if (!std.debug.runtime_safety) return;
    assert(l.running <= l.config.threads);
    assert(l.next_claim >= l.config.step);
    if (l.config.gated == 1) {
        assert(l.next_claim <= l.next_release);
    } else {
        assert(l.next_release == l.config.step);
    }
    var running: u32 = 0;
    for (l.slots, 0..) |slot, k| {
        const results = l.results[k * l.columns.len ..][0..l.columns.len];
        switch (slot.state) {
            .free => continue,
            .submitted => {
                assert(l.config.gated == 1);
                assert(slot.step >= l.next_claim and slot.step < l.next_release);
            },
            .running => {
                running += 1;
                assert(slot.step < l.next_claim);
            },
            .done => assert(slot.step < @max(l.next_claim, l.next_release)),
        }
        if (slot.state != .done) for (results) |r| assert(r.buffer == null);
        assert(slot.step >= l.config.step);
        assert(l.slotOf(slot.step) == k);
    }
    assert(running == l.running);
}

/// The slot of `next_claim` when a worker may build it now, skipping steps
/// that `submit` failed. Caller holds the mutex.
fn claimable(l: *Loader) ?*Slot {
    while (true) {
        const slot = &l.slots[l.slotOf(l.next_claim)];
        if (l.config.gated == 0) return if (slot.state == .free) slot else null;
        assert(l.next_claim <= l.next_release);
        if (l.next_claim >= l.next_release) return null;
        if (slot.step == l.next_claim and slot.state == .submitted) return slot;
        // Released but not for building: failed by `submit` (still done, or
        // already handed over and its slot free or reused).
        assert(slot.step != l.next_claim or slot.state == .done or slot.state == .free);
        l.next_claim += 1;
    }
}

fn workerMain(l: *Loader, worker_index: usize) void {
    const io = pool.io();
    const work = &l.work[worker_index];
    var results: [columns_max]Result = undefined;
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    while (!l.closed) {
        const slot = l.claimable() orelse {
            l.work_ready.waitUncancelable(io, &l.mutex);
            continue;
        };
        // Claimed: the slot stays ours until we mark it done (a reset waits
        // for `running` to drop), so the build runs unlocked.
        const step = l.next_claim;
        const k = l.slotOf(step);
        slot.* = .{
            .state = .running,
            .step = step,
            .indices = slot.indices,
            .sources = slot.sources,
            .sizes = slot.sizes,
        };
        l.next_claim += 1;
        assert(l.running < l.config.threads);
        l.running += 1;
        l.invariants();
        const base = .{ l.config.step, l.config.position };
        l.mutex.unlock(io);
        const n = l.columns.len;
        var failed_column: u32 = 0;
        for (results[0..n]) |*r| r.* = .{};
        const result = l.build(step, base, slot, work, results[0..n], &failed_column);
        l.mutex.lockUncancelable(io);
        l.finish(slot, k, result, failed_column, results[0..n]);
        assert(l.running > 0);
        l.running -= 1;
        l.invariants();
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
    assert(slot.state == .running);
    assert(slot == &l.slots[k] and l.slotOf(slot.step) == k);
    assert(results.len == l.columns.len);
    slot.state = .done;
    slot.failure = null;
    const mine = l.results[k * l.columns.len ..][0..l.columns.len];
    for (mine) |r| assert(r.buffer == null);
    @memcpy(mine, results);
    if (result) |_| {} else |err| {
        freeResults(mine);
        const message = std.mem.span(diag.get());
        const len = @min(message.len, message_size_max);
        @memcpy(slot.message[0..len], message[0..len]);
        slot.message_len = len;
        slot.failure = err;
        slot.failed_column = failed_column;
    }
}

/// The indices (and sources) this ring builds steps `step`, `step + 1`, ...
/// with (batch_size each, as many steps as `indices` holds), under its
/// current base, computed without building them. Errors: InvalidArgument
/// (before the ring's first step), OutOfMemory.
pub fn indicesAt(l: *Loader, step: u64, indices: []u64, sources: ?[]u16) Error!void {
    const batch: usize = @intCast(l.config.batch_size);
    assert(indices.len % batch == 0);
    assert(sources == null or sources.?.len == indices.len);
    const n = l.sources.len;
    const cursors = l.gpa.alloc(mixture.Cursor, if (l.hasCursors()) n else 0) catch
        return error.OutOfMemory;
    defer l.gpa.free(cursors);
    // The base and the cursors of one generation (a reset may come meanwhile).
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    const base: mixture.Base = .{ .step = l.config.step, .position = l.config.position };
    @memcpy(cursors, l.cursors[0..cursors.len]);
    l.mutex.unlock(io);
    if (step < base.step) return invalid("step {d} is before the ring's first", .{step});
    var work: Work = .{};
    defer deinitWork(l.gpa, &work);
    try l.initWork(&work);
    for (0..indices.len / batch) |i| {
        l.indicesOf(step + i, base, cursors, &work);
        @memcpy(indices[i * batch ..][0..batch], work.indices);
        if (sources) |s| @memcpy(s[i * batch ..][0..batch], work.sources);
    }
}

// ---------------------------------------------------------------- building a step

/// Builds `step` into its slot's buffers and `results`, with the indices of
/// the base (step, position) the step was claimed under.
fn build(
    l: *Loader,
    step: u64,
    base: struct { u64, u64 },
    slot: *Slot,
    work: *Work,
    results: []Result,
    failed_column: *u32,
) Error!void {
    assert(slot.state == .running and slot.step == step);
    assert(results.len == l.columns.len);
    for (results) |r| assert(r.buffer == null);
    failed_column.* = @intCast(l.columns.len);
    try l.slotBuffers(slot);
    assert(step >= base[0]);
    const at: mixture.Base = .{ .step = base[0], .position = base[1] };
    l.indicesOf(step, at, l.cursors[0..l.sources.len], work);
    @memcpy(slot.indices, work.indices);
    @memcpy(slot.sources, work.sources);
    const batch: usize = @intCast(l.config.batch_size);
    var variable: usize = 0;
    for (l.columns, 0..) |col, c| {
        failed_column.* = @intCast(c);
        const kind: ColumnKind = @fromBackingInt(@intCast(col.kind));
        if (kind == .variable) {
            const sizes = slot.sizes[variable * 2 * batch ..][0 .. 2 * batch];
            variable += 1;
            try l.buildVariable(c, sizes, work, &results[c]);
            continue;
        }
        const dest = try l.denseDest(c, step, &results[c]);
        try l.buildColumn(c, kind, dest, work);
    }
    assert(variable == l.variable_count);
}

/// The slot's index, source and size arrays, allocated at its first build.
fn slotBuffers(l: *Loader, slot: *Slot) Error!void {
    if (slot.indices.len > 0) return;
    const batch: usize = @intCast(l.config.batch_size);
    const gpa = l.gpa;
    const indices = gpa.alloc(u64, batch) catch return error.OutOfMemory;
    errdefer gpa.free(indices);
    const sources = gpa.alloc(u16, batch) catch return error.OutOfMemory;
    errdefer gpa.free(sources);
    slot.sizes = gpa.alloc(u64, 2 * batch * l.variable_count) catch return error.OutOfMemory;
    slot.sources = sources;
    slot.indices = indices;
    assert(slot.indices.len == batch and slot.sources.len == batch);
}

/// Where dense column `c` of `step` is built: the caller's `out` buffer of
/// the step, or a new pool buffer that `result` owns from now on.
fn denseDest(l: *Loader, c: usize, step: u64, result: *Result) Error![*]u8 {
    assert(result.buffer == null);
    assert(l.columns[c].kind != @backingInt(ColumnKind.variable));
    const outs = l.outs[l.out_start[c]..l.out_start[c + 1]];
    if (outs.len > 0) return outs[@intCast(step % outs.len)];
    const size: usize = @intCast(l.columns[c].record_size * l.config.batch_size);
    // Built here, dropped by the consumer's thread: a pool block from 64 KiB.
    const buf = outbuf.allocExactCrossThread(&outbuf.default_pool, size) orelse
        return diag.fail(error.OutOfMemory, "no memory for a batch of {d} bytes", .{size});
    assert(outbuf.capacityOf(buf) >= size);
    result.* = .{ .buffer = buf, .len = size };
    return buf;
}

/// This rank's indices (and sources) of `step`, for the base it was claimed
/// under (a mixture's position is u128 there: the mixed stream's) and, for
/// a CYCLIC mixture, the sources' `cursors` at that base.
fn indicesOf(
    l: *const Loader,
    step: u64,
    base: mixture.Base,
    cursors: []const mixture.Cursor,
    work: *Work,
) void {
    const c = l.config;
    const batch: u64 = c.batch_size;
    const global: u64 = c.batch_size * c.world;
    assert(step >= base.step);
    assert(work.indices.len == batch and work.sources.len == batch);
    defer l.checkIndices(work);
    if (l.sources.len == 1) {
        const s = l.sources[0];
        const first = sampler.positionAt(l.mode, s.length, global, base.step, base.position, step);
        sampler.fillFrom(s.length, l.mode, s.seed, first + c.rank * batch, work.indices);
        @memset(work.sources, 0);
        return;
    }
    assert(cursors.len == l.sources.len or !l.hasCursors());
    assert(work.filled.len == global and work.origins.len == batch);
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
            // Cursors only in a CYCLIC mixture: indicesAt passes none otherwise.
            const cursor: mixture.Cursor = if (l.hasCursors()) cursors[k] else .{};
            const from = l.sourcePosition(k, step, base, cursor, before[k]);
            sampler.fillFrom(s.length, l.mode, s.seed, from, work.filled[at..][0..n]);
        }
        at += n;
    }
    // The sources' shares of the step add up to the step.
    assert(at == global);
    for (work.origins, work.indices, work.sources) |o, *index, *source| {
        assert(o.source < l.sources.len);
        assert(o.position >= before[o.source] and o.position < after[o.source]);
        const within: usize = @intCast(o.position - before[o.source]);
        index.* = work.filled[start[o.source] + within];
        source.* = o.source;
    }
}

/// Every index of a step names a record of its source (the reads trust it).
fn checkIndices(l: *const Loader, work: *const Work) void {
    if (!std.debug.runtime_safety) return;
    for (work.indices, work.sources) |index, source| {
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

/// A fixed-size column (dense, windows, segments) into `dest`.
fn buildColumn(l: *Loader, c: usize, kind: ColumnKind, dest: [*]u8, work: *Work) Error!void {
    if (kind == .windows or kind == .segments) return l.buildWindows(c, kind, dest, work);
    assert(kind == .dense);
    const parts = l.parts[l.col_start[c]..l.col_start[c + 1]];
    const snaps = try store_parts.begin(l.gpa, parts, &work.parts);
    defer store_parts.end(parts);
    const reads = try l.readsOf(c, snaps, work);
    const batch: usize = @intCast(l.config.batch_size);
    const size: usize = @intCast(l.columns[c].record_size);
    assert(reads.indices.len == batch and reads.of.?.len == batch);
    try store_read.gatherReads(reads, .{
        .base = dest,
        .len = size * batch,
        .stride = size,
    }, .payload, l.config.lanes);
}

/// A variable column into one new buffer (owned by `result`), with each
/// record's payload and aux sizes in `sizes`.
fn buildVariable(l: *Loader, c: usize, sizes: []u64, work: *Work, result: *Result) Error!void {
    assert(result.buffer == null);
    assert(sizes.len == 2 * l.config.batch_size);
    const parts = l.parts[l.col_start[c]..l.col_start[c + 1]];
    const snaps = try store_parts.begin(l.gpa, parts, &work.parts);
    defer store_parts.end(parts);
    const reads = try l.readsOf(c, snaps, work);
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
fn buildWindows(l: *Loader, c: usize, kind: ColumnKind, dest: [*]u8, work: *Work) Error!void {
    const k_count = l.sources.len;
    var rows_total: usize = 0;
    for (0..k_count) |k| {
        var n: usize = 0;
        for (work.sources, work.indices, 0..) |source, index, row| {
            if (source != k) continue;
            work.rows[n] = row;
            work.picked[n] = index;
            n += 1;
        }
        rows_total += n;
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
    // Every record of the step belongs to one source.
    assert(rows_total == work.indices.len);
}

/// Column c's reads of the step in `work`: each record's part (among the
/// column's parts) and index inside its store.
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
        assert(source < k_count);
        const lo = l.range_start[r] - col_first;
        const hi = l.range_start[r + 1] - col_first;
        assert(lo < hi and hi <= snaps.len);
        const at = l.find(col_first + lo, col_first + hi, snaps[lo..hi], index) orelse
            return diag.fail(error.OutOfRange, "source {d}: index {d} is out of range " ++
                "(a store of this column is shorter than the source)", .{ source, index });
        assert(at.part < hi - lo and at.local < snaps[lo + at.part].count);
        of.* = @intCast(lo + at.part);
        local.* = at.local;
    }
    return .{ .snaps = snaps, .of = sc.of.items, .indices = sc.local.items };
}

/// Where stream index `index` lives among parts[lo..hi] (one source of one
/// column): (part among them, record of its store); null when none holds it.
fn find(
    l: *const Loader,
    lo: usize,
    hi: usize,
    snaps: []const store_read.Snapshot,
    index: u64,
) ?struct { part: usize, local: u64 } {
    assert(lo < hi and snaps.len == hi - lo);
    const parts = l.parts[lo..hi];
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
    const rows = l.rows[lo + i] orelse {
        return if (offset < snaps[i].count) .{ .part = i, .local = offset } else null;
    };
    if (offset >= rows.len or rows[@intCast(offset)] >= snaps[i].count) return null;
    return .{ .part = i, .local = rows[@intCast(offset)] };
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

/// One dense column read from two sources: store `a` is source 0, `b` source 1.
fn twoSourceParts(a: *Store, b: *Store) [2]Part {
    return .{
        .{ .store = a, .first = 0, .source = 0, .column = 0 },
        .{ .store = b, .first = 0, .source = 1, .column = 0 },
    };
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

/// What a test takes from one step: each column's buffer (the test frees
/// them), its indices and sources.
const Taken = struct {
    buffers: [2]?[*]u8 = @splat(null),
    lengths: [2]u64 = @splat(0),
    sizes: [16]u64 = undefined,
    failed_column: u32 = 0,

    fn free(t: *Taken) void {
        for (&t.buffers) |*b| {
            outbuf.free(b.*);
            b.* = null;
        }
    }

    fn values(t: *const Taken, c: usize) [*]align(1) const u64 {
        return @ptrCast(t.buffers[c].?);
    }
};

fn take(
    l: *Loader,
    step: u64,
    generation: u64,
    t: *Taken,
    indices: ?[*]u64,
    sources: ?[*]u16,
) Error!void {
    const n = l.columns.len;
    var owners: [2]?*?[*]u8 = .{ &t.buffers[0], &t.buffers[1] };
    try l.wait(step, generation, .{
        .failed_column = &t.failed_column,
        .buffers = owners[0..n],
        .lengths = t.lengths[0..n],
        .sizes = &t.sizes,
        .indices = indices,
        .sources = sources,
    });
}

test "the ring builds every step in order, exactly as the sampler says" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "x", 100, 3);
    defer s.close();
    const live = outbuf.live.load(.monotonic);
    const sources = [_]Source{.{ .length = 100, .seed = 5, .weight = 1 }};
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    const config = testConfig(7, 3, 2, 10);
    const l = try Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
    var expected: [7]u64 = undefined;
    var indices: [7]u64 = undefined;
    var t: Taken = .{};
    var step: u64 = 10;
    while (step < 40) : (step += 1) {
        try take(l, step, 0, &t, &indices, null);
        defer t.free();
        try testing.expectEqual(@as(u64, 56), t.lengths[0]);
        sampler.fill(100, .cyclic, 5, step, 0, 1, &expected);
        try testing.expectEqualSlices(u64, &expected, &indices);
        for (t.values(0)[0..7], expected) |value, index| {
            try testing.expectEqual(3 * index + 1, value);
        }
    }
    // Handed over once only.
    try testing.expectError(error.InvalidArgument, take(l, 39, 0, &t, null, null));
    // Reset drops the steps in flight; the ring continues anywhere, in a new
    // generation, and a wait of the old one is refused.
    const position = sampler.positionAt(.cyclic, 100, 7, 0, 0, 1000);
    try testing.expectEqual(@as(u64, 1), l.reset(1000, @intCast(position), &.{}));
    try testing.expectError(error.InvalidArgument, take(l, 40, 0, &t, null, null));
    try take(l, 1000, 1, &t, null, null);
    sampler.fill(100, .cyclic, 5, 1000, 0, 1, &expected);
    for (t.values(0)[0..7], expected) |value, index| try testing.expectEqual(3 * index + 1, value);
    t.free();
    // Steps built and never taken are freed with the ring.
    l.destroy();
    try testing.expectEqual(live, outbuf.live.load(.monotonic));
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

/// A gated, SEQUENTIAL ring (batch 3, window 4, 2 threads) over store `s`
/// of 30 records (the gated-ring tests'; `create` copies what it is given).
fn gatedTestLoader(s: *Store) !*Loader {
    const sources = [_]Source{.{ .length = 30, .seed = 0, .weight = 1 }};
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    var config = testConfig(3, 4, 2, 0);
    config.mode = @backingInt(sampler.Mode.sequential);
    config.gated = 1;
    return Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
}

test "a gated ring builds released steps only; a failed release fails its step" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "x", 30, 1);
    defer s.close();
    const l = try gatedTestLoader(s);
    defer l.destroy();
    var t: Taken = .{};
    try testing.expectError(error.InvalidArgument, l.submit(1, 1, 0, null)); // out of order
    try l.submit(0, 1, 0, null);
    try l.submit(1, 1, 0, "the prefetch of step 1 failed");
    try l.submit(2, 1, 0, null);
    try take(l, 0, 0, &t, null, null);
    try testing.expectEqual(@as(u64, 1), t.values(0)[0]);
    t.free();
    try testing.expectError(error.Failed, take(l, 1, 0, &t, null, null));
    try testing.expectEqual(@as(u32, 1), t.failed_column);
    try testing.expectEqualStrings("the prefetch of step 1 failed", std.mem.span(diag.get()));
    try take(l, 2, 0, &t, null, null);
    try testing.expectEqual(@as(u64, 7), t.values(0)[0]);
    t.free();
    // Nothing released: nothing built, so a reset drops nothing and a
    // submit of the old generation is refused.
    const generation = l.reset(6, 18, &.{});
    try testing.expectError(error.InvalidArgument, l.submit(6, 1, 0, null));
    try l.submit(6, 1, generation, null);
    try take(l, 6, generation, &t, null, null);
    try testing.expectEqual(@as(u64, 19), t.values(0)[0]);
    t.free();
}

test "a gated ring releases a run of steps at once, all or nothing" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "x", 30, 1);
    defer s.close();
    const l = try gatedTestLoader(s);
    defer l.destroy();
    // More than the window, or none: refused, and nothing is released.
    try testing.expectError(error.InvalidArgument, l.submit(0, 5, 0, null));
    try testing.expectError(error.InvalidArgument, l.submit(0, 0, 0, null));
    try l.submit(0, 3, 0, null);
    // The window holds 4: one more fits, two do not (step 5's slot is step 1's).
    try testing.expectError(error.InvalidArgument, l.submit(3, 2, 0, null));
    var t: Taken = .{};
    for (0..3) |step| {
        try take(l, step, 0, &t, null, null);
        try testing.expectEqual(3 * @as(u64, step) + 1, t.values(0)[0]);
        t.free();
    }
    // A failed run fails each of its steps with the message.
    const failed = "the prefetch of steps 3-4 failed";
    try l.submit(3, 2, 0, failed);
    for (3..5) |step| {
        try testing.expectError(error.Failed, take(l, step, 0, &t, null, null));
        try testing.expectEqualStrings(failed, std.mem.span(diag.get()));
    }
    // indicesAt of several steps is each step's, one after the other.
    var many: [9]u64 = undefined;
    try l.indicesAt(5, &many, null);
    try testing.expectEqualSlices(u64, &.{ 15, 16, 17, 18, 19, 20, 21, 22, 23 }, &many);
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
