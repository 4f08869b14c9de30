//! The C ABI, the loader ring (src/Loader.zig): open one, release and wait
//! for its steps, read the indices it builds them with, reset, stop, free.
const std = @import("std");
const assert = std.debug.assert;
const capi = @import("../capi.zig");
const Loader = @import("../Loader.zig");
const diag = @import("../diag.zig");

const LoaderConfig = capi.LoaderConfig;
const LoaderSource = capi.LoaderSource;
const LoaderColumn = capi.LoaderColumn;
const LoaderPart = capi.LoaderPart;
const LoaderStage = capi.LoaderStage;
const Fetch = capi.Fetch;
const WindowsSpec = capi.WindowsSpec;
const Cursor = capi.Cursor;
const code = capi.code;
const invalid = capi.invalid;
const gpa = capi.gpa;
const loaderHandle = capi.loaderHandle;

/// `invalid` for a loader handle loaderHandle refused.
fn notALoader() c_int {
    return invalid("not a loader handle (null, or freed)", .{});
}
const storeField = capi.storeField;

/// Starts a prefetch ring (see src/Loader.zig): `config->threads` library
/// threads build steps in order — the step's indices over `sources` (one, or
/// a weighted mixture) and every column of `columns` read from `parts` (the
/// stores of each (source, column): one store, or a ShardSet's shards). A
/// windows or segments column reads token windows: `specs[c * source_count
/// + k]` is its window index for source k (`specs` may be null without such
/// columns; the prefix sums it points at must outlive the ring). At
/// most `config->window` steps are submitted and not yet waited for; the
/// first to submit is `config->step`, whose first record is at global
/// position `config->position`. The stores are kept alive until
/// lx_loader_free: lx_close on one while the ring runs makes its next step
/// fail with closed instead of unmapping it under the threads. Errors:
/// invalid, closed, out_of_memory. On success `*out` owns the ring until
/// lx_loader_free.
pub export fn lx_loader_open(
    config: ?*const LoaderConfig,
    sources: ?[*]const LoaderSource,
    source_count: u32,
    columns: ?[*]const LoaderColumn,
    column_count: u32,
    parts: ?[*]const LoaderPart,
    part_count: u32,
    specs: ?[*]const WindowsSpec,
    out: ?*?*Loader,
) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    o.* = null;
    const c = config orelse return invalid("config is null", .{});
    const s = sources orelse return invalid("sources is null", .{});
    const cols = columns orelse return invalid("columns is null", .{});
    const p = parts orelse return invalid("parts is null", .{});
    if (part_count > Loader.parts_max) {
        const max = Loader.parts_max;
        return invalid("a loader takes at most {d} parts, got {d}", .{ max, part_count });
    }
    for (p[0..part_count], 0..) |*part, k| {
        if (storeField(&part.store) == null) {
            return invalid("part {d}: not a store handle (null, or freed)", .{k});
        }
        if (part.replica != null and capi.replicaHandle(part.replica) == null) {
            return invalid("part {d}: not a replica handle (freed)", .{k});
        }
    }
    o.* = Loader.create(
        gpa,
        c.*,
        s[0..source_count],
        cols[0..column_count],
        p[0..part_count],
        specs,
    ) catch |e| return code(e);
    return 0;
}

/// Releases steps `step` .. `step + count - 1` of a gated ring
/// (config->gated = 1; the next steps in order) to its threads; with a
/// non-null `failure` (a message, NUL terminated) fails them instead of
/// building them: their lx_loader_wait returns LX_FAILED with that message
/// and `*failed_column` = column_count. `generation` is the caller's count
/// of lx_loader_reset calls. At most `config->window` steps may be released
/// and not yet handed over. All or nothing. Errors: closed, invalid (not
/// gated, count 0, out of order, too far ahead, or an older generation:
/// dropped by a reset).
pub export fn lx_loader_submit(
    handle: ?*Loader,
    step: u64,
    count: u64,
    generation: u64,
    failure: ?[*:0]const u8,
) c_int {
    diag.clear();
    const l = loaderHandle(handle) orelse return notALoader();
    const message: ?[]const u8 = if (failure) |f| std.mem.span(f) else null;
    l.submit(step, count, generation, message) catch |e| return code(e);
    return 0;
}

/// The stager of a staged ring (config->gated = 2; see
/// src/loader/Stage.zig): the ring's workers read a step as soon as the
/// records its parts' replicas hold for it are present and checked in the
/// cache (kept there as a prefetch keeps them); a step with bytes to fetch
/// waits for this call. It takes those steps in order and blocks while
/// there is none. When a step needs bytes fetched, returns 0 with `*f`
/// holding the ranges (status ranges, as lx_replica_begin fills it) and
/// `*out` naming the step, its generation and the replica: fetch them, call
/// lx_fetch_landed until the status is done, then call again with `failure`
/// null; if the fetch failed (after lx_fetch_failed), call again with its
/// message: the step fails with it (its lx_loader_wait returns LX_FAILED).
/// A nonzero result with `out->replica` set is that step's error
/// (lx_replica_begin's; nothing of it stays reserved): call again with a
/// failure. One thread at a time. Errors: closed (the ring stopped: done),
/// invalid (not a staged ring, two callers), and a step's.
pub export fn lx_loader_stage(
    handle: ?*Loader,
    failure: ?[*:0]const u8,
    f: ?*Fetch,
    out: ?*LoaderStage,
) c_int {
    diag.clear();
    const l = loaderHandle(handle) orelse return notALoader();
    const fetch = f orelse return invalid("f is null", .{});
    const o = out orelse return invalid("out is null", .{});
    o.* = .{};
    const message: ?[]const u8 = if (failure) |m| std.mem.span(m) else null;
    Loader.Stage.run(l, message, fetch, o) catch |e| return code(e);
    return 0;
}

/// Blocks until step `step` of `generation` is built and hands it over; any
/// thread may wait, each step is handed over once. Column c's buffer goes to
/// `*buffers[c]` (null for a column built into the caller's `out` buffer, or
/// without bytes) and its length to `lengths[c]`; the caller owns it from
/// then on and frees it with lx_free_buffer (a null `buffers[c]` has it
/// freed now). `sizes` (2 * batch_size uint64 per variable column, in column
/// order: payload sizes, then aux sizes), `indices` and `sources`
/// (batch_size each) receive the step's record sizes, indices and sources;
/// each may be null, and so may `images_skipped` (the image records the
/// step replaced: an image column's Decode on_error skip). A step that
/// failed hands nothing over: returns its error (message in lx_last_error)
/// with the failing column in `*failed_column` (column_count: failed by
/// lx_loader_submit). Errors: closed (the ring was stopped, also while
/// waiting; or a store was closed), invalid (before the first step, already
/// handed over, or dropped by a reset, also while waiting), failed,
/// bad_image (an image column's record; the message names its index), or
/// any lx_gather error.
pub export fn lx_loader_wait(
    handle: ?*Loader,
    step: u64,
    generation: u64,
    failed_column: ?*u32,
    buffers: ?[*]const ?*?[*]u8,
    lengths: ?[*]u64,
    sizes: ?[*]u64,
    indices: ?[*]u64,
    sources: ?[*]u16,
    images_skipped: ?*u32,
) c_int {
    diag.clear();
    const l = loaderHandle(handle) orelse return notALoader();
    const failed = failed_column orelse return invalid("failed_column is null", .{});
    const b = buffers orelse return invalid("buffers is null", .{});
    const n = lengths orelse return invalid("lengths is null", .{});
    const count = l.columns.count();
    assert(count <= Loader.columns_max); // checked by lx_loader_open
    l.wait(step, generation, .{
        .failed_column = failed,
        .buffers = b[0..count],
        .lengths = n[0..count],
        .sizes = sizes,
        .indices = indices,
        .sources = sources,
        .images_skipped = images_skipped,
    }) catch |e| return code(e);
    return 0;
}

/// Writes the batch_size indices (and, when `sources` is not null, their
/// sources) that the ring builds steps `step` .. `step + count - 1` with,
/// one step after the other, under its current base, without building
/// them: a pure function of the step (the sampler, or the mixture). Any
/// thread may call it. Errors: invalid (before the ring's first step, count
/// 0 or above the ring's window, or `indices` null), out_of_memory.
pub export fn lx_loader_indices(
    handle: ?*Loader,
    step: u64,
    count: u64,
    indices: ?[*]u64,
    sources: ?[*]u16,
) c_int {
    diag.clear();
    const l = loaderHandle(handle) orelse return notALoader();
    const out = indices orelse return invalid("indices is null", .{});
    if (count == 0 or count > l.config.window) {
        return invalid("count must be 1 to the window ({d}), got {d}", .{ l.config.window, count });
    }
    const n: usize = @intCast(l.config.batch_size * count);
    const s: ?[]u16 = if (sources) |p| p[0..n] else null;
    l.indicesAt(step, out[0..n], s) catch |e| return code(e);
    return 0;
}

/// Drops every step (after the ones being built finish, so no buffer is
/// written afterwards; their buffers are freed) and wakes every waiter of
/// the old generation (they return invalid); the next step is `step`, with
/// its first record at global `position`. A CYCLIC mixture also takes each
/// source's cursor at `step` in `cursors[0..source_count]` (as
/// lx_mixture_cursors gives them; any other ring ignores `cursors`, which
/// may be null). Writes the new generation (the number of resets so far) to
/// `generation`. Does nothing once stopped (the generation stays). Errors:
/// invalid (a CYCLIC mixture without cursors, or `generation` null;
/// nothing is dropped then).
pub export fn lx_loader_reset(
    handle: ?*Loader,
    step: u64,
    position: u64,
    cursors: ?[*]const Cursor,
    generation: ?*u64,
) c_int {
    diag.clear();
    const l = loaderHandle(handle) orelse return notALoader();
    const out = generation orelse return invalid("generation is null", .{});
    if (!l.hasCursors()) {
        out.* = l.reset(step, position, &.{});
        return 0;
    }
    const c = cursors orelse return invalid("a CYCLIC mixture needs every source's cursor", .{});
    assert(l.sources.len >= 1 and l.sources.len <= Loader.sources_max);
    out.* = l.reset(step, position, c[0..l.sources.len]);
    return 0;
}

/// Stops and joins the ring's threads; waiters return closed. Idempotent; any
/// thread may call it, also while another waits.
pub export fn lx_loader_stop(handle: ?*Loader) void {
    const l = loaderHandle(handle) orelse return;
    l.stop();
}

/// Stops the ring, lets go of its stores and frees it. Must not race any
/// other call on the same ring.
pub export fn lx_loader_free(l: ?*Loader) void {
    if (loaderHandle(l)) |ring| ring.destroy();
}
