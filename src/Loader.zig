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
//! prefetch releases it failed), or, in a staged ring, once its records
//! are in the node-local cache (loader/Stage.zig). `wait` blocks until a
//! step is built and hands it over: its buffers belong to the caller from
//! then on, and its slot is free for the step `window` later.
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
const image = @import("image/stage.zig");
pub const Columns = @import("loader/Columns.zig");
pub const Builder = @import("loader/Builder.zig");
pub const Stage = @import("loader/Stage.zig");
const Replica = @import("Replica.zig");

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
    /// Images (encoded, or pixels) through an image pipeline
    /// (image/stage.zig): `record_size` bytes of pipeline output a record.
    image = 4,
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
    /// An image column's pipeline (copied at open).
    image: ?*const image.Column = null,

    comptime {
        assert(@sizeOf(Column) == 32);
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
    /// A remote store's replica (src/Replica.zig): a staged ring (`gated`
    /// 2) brings the records it reads into the cache first. Null: local.
    replica: ?*Replica = null,

    comptime {
        assert(@sizeOf(Part) == 48);
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
    /// by lx_loader_submit; 2: as soon as its slot is free, once its records
    /// are in the node-local cache (staged, loader/Stage.zig).
    gated: u32 = 0,
    _reserved: u32 = 0,
    /// A staged ring's bound on the stored bytes of its steps not yet
    /// handed over (0: none).
    budget: u64 = 0,

    comptime {
        assert(@sizeOf(Config) == 80);
    }
};

const State = enum(u8) { free, submitted, running, done };

pub const Slot = struct {
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
    /// Image records the build replaced (Decode on_error skip).
    images_skipped: u32 = 0,
    /// A staged step's stored bytes (its budget's share, until handed over).
    held: u64 = 0,
};

/// A column's buffer of a step: from outbuf.zig (owned by the ring until
/// handed over), or null (a caller's `out` buffer, or no bytes).
pub const Result = struct {
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
    /// The step's image records replaced (Decode on_error skip).
    images_skipped: ?*u32 = null,
};

/// `canary_value` from create until destroy (the C ABI checks it: a null,
/// foreign or freed pointer is refused, not followed).
canary: u64 = canary_value,
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
/// The columns of every step and where their records live (read-only once open).
columns: Columns,
slots: []Slot,
/// window * columns results.
results: []Result,
/// One step builder per worker thread.
builders: []Builder,
threads: []std.Thread,

mutex: Io.Mutex = .init,
/// Workers wait here for a claimable step (or close).
work_ready: Io.Condition = .init,
/// Waiters (and reset) wait here for a finished step (or close, or a reset).
step_done: Io.Condition = .init,
/// A staged ring: the stager waits here for a request (or close), its
/// workers for their fetch or for budget (or close, or a reset).
fetch_wanted: Io.Condition = .init,
fetched: Io.Condition = .init,
stage: Stage = .{},
// Under `mutex`:
next_claim: u64,
/// Gated rings: the next step to release.
next_release: u64,
/// The step the consumer takes next (one past the last handed over): how far
/// ahead of it a claimed step is decides how it is written (Builder.Built.ahead).
next_wait: u64,
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
    if (c.gated > 2) return invalid("gated must be 0, 1 or 2, got {d}", .{c.gated});
    if (c.budget != 0 and c.gated != 2) return invalid("a budget is for a staged ring", .{});
    try Columns.check(columns, c.batch_size);
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

fn invalid(comptime fmt: []const u8, args: anytype) Error {
    return diag.fail(error.InvalidArgument, fmt, args);
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
        .columns = try Columns.init(gpa, columns, sources, parts, specs),
        .slots = &.{},
        .results = &.{},
        .builders = &.{},
        .threads = &.{},
        .next_claim = config.step,
        .next_release = config.step,
        .next_wait = config.step,
    };
    errdefer l.freeBuffers();
    try l.allocate(sources);
    if (sources.len > 1) {
        var weights: [sources_max]u64 = undefined;
        for (sources, 0..) |s, k| weights[k] = s.weight;
        l.mix = mixture.Mixture.init(weights[0..sources.len]);
    }
    try l.initCycles(sources);
    try l.enterStores();
    errdefer for (l.columns.parts) |p| p.store.leave();
    try l.startThreads();
    for (l.columns.parts) |p| p.store.hold();
    assert(l.threads.len == config.threads and l.columns.parts.len == parts.len);
    return l;
}

fn allocate(l: *Loader, sources: []const Source) Error!void {
    const gpa = l.gpa;
    const window: usize = l.config.window;
    const n = l.columns.count();
    l.sources = gpa.dupe(Source, sources) catch return error.OutOfMemory;
    l.slots = gpa.alloc(Slot, window) catch return error.OutOfMemory;
    @memset(l.slots, .{});
    l.results = gpa.alloc(Result, window * n) catch return error.OutOfMemory;
    @memset(l.results, .{});
    l.builders = gpa.alloc(Builder, l.config.threads) catch return error.OutOfMemory;
    @memset(l.builders, .{});
    for (l.builders) |*b| b.* = try Builder.init(l);
    assert(l.slots.len == window and l.results.len == window * n);
    assert(l.builders.len == l.config.threads);
}

fn freeBuffers(l: *Loader) void {
    const gpa = l.gpa;
    for (l.builders) |*b| b.deinit(gpa);
    for (l.results) |r| outbuf.free(r.buffer);
    for (l.slots) |slot| {
        gpa.free(slot.indices);
        gpa.free(slot.sources);
        gpa.free(slot.sizes);
    }
    inline for (.{ "builders", "results", "slots", "sources" }) |name| {
        gpa.free(@field(l, name));
    }
    l.columns.deinit();
}

fn enterStores(l: *Loader) Error!void {
    var entered: usize = 0;
    const parts = l.columns.parts;
    errdefer for (parts[0..entered]) |p| p.store.leave();
    while (entered < parts.len) : (entered += 1) try parts[entered].store.enter();
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
    if (l.config.gated != 1) return invalid("submit: this ring is not gated", .{});
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
        for (l.results[l.slotOf(at) * l.columns.count() ..][0..l.columns.count()]) |r| {
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
            slot.failed_column = @intCast(l.columns.count());
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
    assert(out.buffers.len == l.columns.count() and out.lengths.len == l.columns.count());
    const io = pool.io();
    // Wake-ups go out once the mutex is free (the last defer to run), so
    // the woken thread does not sleep again at once on the mutex.
    var wake_worker = false;
    var wake_fetched = false;
    defer if (wake_worker) l.work_ready.signal(io);
    defer if (wake_fetched) l.fetched.broadcast(io);
    pool.lockSpin(&l.mutex);
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
    l.next_wait = @max(l.next_wait, step + 1);
    // Its slot is free: an ungated ring builds the step `window` later now.
    wake_worker = true;
    slot.held = 0;
    wake_fetched = l.stage.budget_waiting > 0;
    const results = l.results[k * l.columns.count() ..][0..l.columns.count()];
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
    // A built step's arrays (Builder.slotBuffers) and one result per column.
    assert(slot.indices.len == batch and slot.sources.len == batch);
    assert(slot.sizes.len == 2 * batch * l.columns.variable_count);
    assert(results.len == l.columns.count());
    if (out.indices) |p| @memcpy(p[0..batch], slot.indices);
    if (out.sources) |p| @memcpy(p[0..batch], slot.sources);
    if (out.sizes) |p| @memcpy(p[0 .. 2 * batch * l.columns.variable_count], slot.sizes);
    if (out.images_skipped) |p| p.* = slot.images_skipped;
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
    l.fetched.broadcast(io); // (staged workers drop what is not being fetched)
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
    l.next_wait = step;
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

pub const canary_value: u64 = 0x5245444144584C31;

/// Stops, lets go of the stores and frees the loader (and every buffer it
/// still holds). No other call may race it.
pub fn destroy(l: *Loader) void {
    l.stop();
    // A stop begun on another thread may still be joining.
    while (!l.joined.load(.acquire)) std.Thread.yield() catch {};
    for (l.columns.parts) |p| {
        p.store.leave();
        p.store.unhold();
    }
    const gpa = l.gpa;
    gpa.free(l.threads);
    l.freeBuffers();
    l.canary = 0;
    gpa.destroy(l);
}

fn closeAndWake(l: *Loader) void {
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    l.closed = true;
    l.mutex.unlock(io);
    l.work_ready.broadcast(io);
    l.step_done.broadcast(io);
    l.fetch_wanted.broadcast(io);
    l.fetched.broadcast(io);
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
        const results = l.results[k * l.columns.count() ..][0..l.columns.count()];
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
        if (l.config.gated != 1) return if (slot.state == .free) slot else null;
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
    const builder = &l.builders[worker_index];
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
        const base = .{ l.config.step, l.config.position, l.generation, step -| l.next_wait };
        l.mutex.unlock(io);
        const n = l.columns.count();
        var failed_column: u32 = 0;
        for (results[0..n]) |*r| r.* = .{};
        const result = builder.buildSlot(l, step, base, slot, results[0..n], &failed_column);
        pool.lockSpin(&l.mutex);
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
    assert(results.len == l.columns.count());
    slot.state = .done;
    slot.failure = null;
    const mine = l.results[k * l.columns.count() ..][0..l.columns.count()];
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
    var b = try Builder.init(l);
    defer b.deinit(l.gpa);
    for (0..indices.len / batch) |i| {
        b.indicesOf(l, step + i, base, cursors);
        @memcpy(indices[i * batch ..][0..batch], b.indices);
        if (sources) |s| @memcpy(s[i * batch ..][0..batch], b.sources);
    }
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const lt = @import("loader/testing.zig");

const testStore = lt.testStore;
const testStoreFrom = lt.testStoreFrom;
const twoSourceParts = lt.twoSourceParts;
const dense8 = lt.dense8;
const testConfig = lt.testConfig;
const Taken = lt.Taken;
const take = lt.take;
const gatedTestLoader = lt.gatedTestLoader;

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
