//! The loader's prefetch ring: library threads that build the batches of dense
//! streams ahead of the consumer, so no Python runs between a step's indices
//! and its finished buffers.
//!
//! The consumer (Python's DataLoader) submits steps in order, each with one
//! destination buffer per stream. `threads` workers claim submitted steps in
//! step order, compute each step's indices with the sampler (a pure function
//! of the step) and gather every stream into that step's buffers. The consumer
//! waits for a step and then owns its buffers again. A ring of `window` slots
//! holds the steps submitted and not yet waited for (slot = step % window);
//! submitting into a slot that is still in use is refused, never a race.
//!
//! The loader counts itself as a user of every store it reads (Store.enter,
//! Store.hold) until `destroy`, so a store its owner closes while the loader
//! runs stays mapped; the loader reports such a store's next step as failed
//! (`error.Closed`) instead of reading it.
//!
//! Trade-off: every worker runs whole steps, one after another; a step's
//! gather uses `lanes` lanes of the shared pool (1 when the workers already
//! cover the cores).
const std = @import("std");
const Io = std.Io;
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const Store = @import("Store.zig");
const sampler = @import("sampler.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");

const Loader = @This();

pub const Error = Store.Error;

/// Bounds chosen at open (TigerStyle: everything bounded).
pub const streams_max: usize = 1024;
pub const window_max: usize = 1 << 16;
pub const threads_max: usize = 256;
const message_size_max: usize = 256;

pub const Stream = struct {
    store: *Store,
    /// Bytes of one record; a step's buffer holds batch_size of them.
    record_size: u64,
};

pub const Config = struct {
    length: u64,
    batch_size: u64,
    mode: sampler.Mode,
    seed: u64,
    rank: u64 = 0,
    world: u64 = 1,
    /// Steps submitted and not yet waited for, at most.
    window: u32,
    threads: u32,
    /// Lanes of one gather (0: every usable core).
    lanes: u32 = 0,
    /// The first step to submit.
    step: u64 = 0,
};

const State = enum(u8) { free, submitted, running, done };

const Slot = struct {
    state: State = .free,
    step: u64 = 0,
    failure: ?Error = null,
    failed_stream: u32 = 0,
    message_len: usize = 0,
    message: [message_size_max]u8 = undefined,
};

gpa: Allocator,
config: Config,
streams: []Stream,
slots: []Slot,
/// window * streams.len destination pointers: slot k's are [k * n .. (k + 1) * n).
dests: [][*]u8,
/// One index buffer of batch_size per worker.
indices: []u64,
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

/// Starts `config.threads` workers over `streams` (kept alive until `destroy`).
pub fn create(gpa: Allocator, streams: []const Stream, config: Config) Error!*Loader {
    if (streams.len == 0 or streams.len > streams_max) return diag.fail(error.InvalidArgument, "a loader needs 1 to {d} streams, got {d}", .{ streams_max, streams.len });
    if (config.window == 0 or config.window > window_max) return diag.fail(error.InvalidArgument, "window must be 1..{d}, got {d}", .{ window_max, config.window });
    if (config.threads == 0 or config.threads > threads_max) return diag.fail(error.InvalidArgument, "threads must be 1..{d}, got {d}", .{ threads_max, config.threads });
    if (config.length == 0 or config.batch_size == 0) return diag.fail(error.InvalidArgument, "length and batch_size must be >= 1", .{});
    if (config.world == 0 or config.rank >= config.world) return diag.fail(error.InvalidArgument, "bad shard ({d}, {d})", .{ config.rank, config.world });
    for (streams, 0..) |st, i| {
        _ = std.math.mul(u64, st.record_size, config.batch_size) catch return diag.fail(error.InvalidArgument, "stream {d}: a batch of {d} records of {d} bytes overflows", .{ i, config.batch_size, st.record_size });
    }
    const batch: usize = @intCast(config.batch_size);

    const l = try gpa.create(Loader);
    errdefer gpa.destroy(l);
    const own_streams = try gpa.dupe(Stream, streams);
    errdefer gpa.free(own_streams);
    const slots = try gpa.alloc(Slot, config.window);
    errdefer gpa.free(slots);
    @memset(slots, .{});
    const dests = try gpa.alloc([*]u8, @as(usize, config.window) * streams.len);
    errdefer gpa.free(dests);
    const indices = try gpa.alloc(u64, std.math.mul(usize, batch, config.threads) catch return error.OutOfMemory);
    errdefer gpa.free(indices);
    const threads = try gpa.alloc(std.Thread, config.threads);
    errdefer gpa.free(threads);
    l.* = .{
        .gpa = gpa,
        .config = config,
        .streams = own_streams,
        .slots = slots,
        .dests = dests,
        .indices = indices,
        .threads = threads,
        .next_submit = config.step,
        .next_claim = config.step,
    };
    var entered: usize = 0;
    errdefer for (own_streams[0..entered]) |st| st.store.leave();
    while (entered < own_streams.len) : (entered += 1) try own_streams[entered].store.enter();
    var started: usize = 0;
    errdefer {
        l.closeAndWake();
        for (threads[0..started]) |t| t.join();
    }
    while (started < threads.len) : (started += 1) {
        threads[started] = std.Thread.spawn(.{ .stack_size = 1 << 20 }, workerMain, .{ l, started }) catch
            return diag.fail(error.OutOfMemory, "could not start loader thread {d}", .{started});
    }
    for (own_streams) |st| st.store.hold();
    return l;
}

/// Gives step `step` (which must be the next one in order) its destination
/// buffers, one per stream, each batch_size * record_size bytes. Errors:
/// Closed, InvalidArgument (out of order, or its slot is still in use).
pub fn submit(l: *Loader, step: u64, dests: []const [*]u8) Error!void {
    assert(dests.len == l.streams.len);
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
    if (step != l.next_submit) return diag.fail(error.InvalidArgument, "step {d} submitted out of order (next is {d})", .{ step, l.next_submit });
    const k = l.slotOf(step);
    const slot = &l.slots[k];
    if (slot.state != .free) return diag.fail(error.InvalidArgument, "step {d}: ring slot still holds step {d} (more than {d} steps submitted)", .{ step, slot.step, l.config.window });
    @memcpy(l.dests[k * l.streams.len ..][0..l.streams.len], dests);
    slot.* = .{ .state = .submitted, .step = step };
    l.next_submit = step + 1;
    l.work_ready.signal(io);
}

/// Waits until submitted step `step` is built and frees its slot: its buffers
/// are the caller's again. On a failed step, returns the gather's error (its
/// message in diag) and the failing stream in `failed_stream`.
/// Errors: Closed, InvalidArgument (not submitted), or the gather's error.
pub fn wait(l: *Loader, step: u64, failed_stream: *u32) Error!void {
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    const slot = &l.slots[l.slotOf(step)];
    while (true) {
        if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
        if (slot.state == .free or slot.step != step) return diag.fail(error.InvalidArgument, "step {d} was not submitted", .{step});
        if (slot.state == .done) break;
        l.step_done.waitUncancelable(io, &l.mutex);
    }
    slot.state = .free;
    if (slot.failure) |err| {
        failed_stream.* = slot.failed_stream;
        diag.set("{s}", .{slot.message[0..slot.message_len]});
        return err;
    }
}

/// Drops every submitted step (waiting for those being built, so no worker
/// still writes into a buffer afterwards); the next step to submit is `step`.
pub fn reset(l: *Loader, step: u64) void {
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    while (l.running > 0 and !l.closed) l.step_done.waitUncancelable(io, &l.mutex);
    for (l.slots) |*slot| slot.state = .free;
    l.next_submit = step;
    l.next_claim = step;
}

/// Stops the workers and joins them; waiters return Closed. Idempotent and
/// safe from any thread, also while another thread waits.
pub fn stop(l: *Loader) void {
    l.closeAndWake();
    if (l.stop_started.swap(true, .acq_rel)) return;
    for (l.threads) |t| t.join();
    l.joined.store(true, .release);
}

/// Stops, releases the stores and frees the loader. No other call may race it.
pub fn destroy(l: *Loader) void {
    l.stop();
    // A stop begun on another thread may still be joining.
    while (!l.joined.load(.acquire)) std.Thread.yield() catch {};
    for (l.streams) |st| {
        st.store.leave();
        st.store.unhold();
    }
    const gpa = l.gpa;
    gpa.free(l.threads);
    gpa.free(l.indices);
    gpa.free(l.dests);
    gpa.free(l.slots);
    gpa.free(l.streams);
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
    const batch: usize = @intCast(l.config.batch_size);
    const indices = l.indices[worker_index * batch ..][0..batch];
    var dests: [streams_max][*]u8 = undefined;
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    while (!l.closed) {
        const k = l.slotOf(l.next_claim);
        const slot = &l.slots[k];
        if (slot.state != .submitted or slot.step != l.next_claim) {
            l.work_ready.waitUncancelable(io, &l.mutex);
            continue;
        }
        // Claimed: the slot's metadata stays ours until we mark it done (a
        // reset waits for `running` to drop), so the build runs unlocked.
        slot.state = .running;
        l.next_claim += 1;
        l.running += 1;
        const step = slot.step;
        const n = l.streams.len;
        @memcpy(dests[0..n], l.dests[k * n ..][0..n]);
        l.mutex.unlock(io);
        var failed_stream: u32 = 0;
        const result = l.build(step, dests[0..n], indices, &failed_stream);
        l.mutex.lockUncancelable(io);
        slot.state = .done;
        slot.failure = null;
        if (result) |_| {} else |err| {
            const message = std.mem.span(diag.get());
            const len = @min(message.len, message_size_max);
            @memcpy(slot.message[0..len], message[0..len]);
            slot.message_len = len;
            slot.failure = err;
            slot.failed_stream = failed_stream;
        }
        l.running -= 1;
        l.step_done.broadcast(io);
    }
}

/// Fills `dests` with every stream's records at the indices of `step`.
fn build(l: *Loader, step: u64, dests: []const [*]u8, indices: []u64, failed_stream: *u32) Error!void {
    const c = l.config;
    sampler.fill(c.length, c.mode, c.seed, step, c.rank, c.world, indices);
    for (l.streams, dests, 0..) |st, dest, i| {
        failed_stream.* = @intCast(i);
        if (st.store.isClosed()) return diag.fail(error.Closed, "the store was closed while a loader was reading it", .{});
        const len: usize = @intCast(st.record_size * c.batch_size);
        try st.store.gather(indices, .{ .base = dest, .len = len, .stride = @intCast(st.record_size) }, .payload, c.lanes);
    }
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

fn testStore(tmp: *testing.TmpDir, name: []const u8, count: u64) !*Store {
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/{s}", .{ base, name });
    const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    errdefer s.close();
    // Record i is the u64 value 3i + 1.
    var values: [64]u64 = undefined;
    var ptrs: [64][*]const u8 = undefined;
    var sizes: [64]u64 = undefined;
    var first: u64 = 0;
    while (first < count) : (first += values.len) {
        const n: usize = @intCast(@min(values.len, count - first));
        for (0..n) |i| {
            values[i] = 3 * (first + i) + 1;
            ptrs[i] = @ptrCast(&values[i]);
            sizes[i] = 8;
        }
        _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = n }, false);
    }
    return s;
}

test "the ring builds every step in order, exactly as the sampler says" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try testStore(&tmp, "x", 100);
    defer s.close();
    const config: Config = .{ .length = 100, .batch_size = 7, .mode = .cyclic, .seed = 5, .window = 3, .threads = 2, .step = 10 };
    const l = try Loader.create(testing.allocator, &.{.{ .store = s, .record_size = 8 }}, config);
    defer l.destroy();
    var buffers: [3][7]u64 = undefined;
    var expected: [7]u64 = undefined;
    var failed: u32 = 0;
    var step: u64 = 10;
    for (10..13) |first| try l.submit(first, &.{@ptrCast(&buffers[first % 3])});
    // A fourth step has no free slot until step 10 is waited for.
    try testing.expectError(error.InvalidArgument, l.submit(13, &.{@ptrCast(&buffers[0])}));
    while (step < 40) : (step += 1) {
        try l.wait(step, &failed);
        const got = &buffers[step % 3];
        sampler.fill(100, .cyclic, 5, step, 0, 1, &expected);
        for (got, expected) |value, index| try testing.expectEqual(3 * index + 1, value);
        try l.submit(step + 3, &.{@ptrCast(got)});
    }
    // Reset drops the steps in flight; the ring continues anywhere.
    l.reset(1000);
    try testing.expectError(error.InvalidArgument, l.wait(40, &failed));
    try l.submit(1000, &.{@ptrCast(&buffers[1])});
    try l.wait(1000, &failed);
    sampler.fill(100, .cyclic, 5, 1000, 0, 1, &expected);
    for (buffers[1], expected) |value, index| try testing.expectEqual(3 * index + 1, value);
}

test "a failing step reports its error and stream; close wakes a waiter" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const a = try testStore(&tmp, "a", 50);
    defer a.close();
    const b = try testStore(&tmp, "b", 40);
    defer b.close();
    // The sampler draws from 50 records, stream 1 holds only 40: some step fails.
    const streams = [_]Stream{ .{ .store = a, .record_size = 8 }, .{ .store = b, .record_size = 8 } };
    const l = try Loader.create(testing.allocator, &streams, .{ .length = 50, .batch_size = 50, .mode = .sequential, .seed = 0, .window = 2, .threads = 1 });
    defer l.destroy();
    var xa: [50]u64 = undefined;
    var xb: [50]u64 = undefined;
    var failed: u32 = 9;
    try l.submit(0, &.{ @ptrCast(&xa), @ptrCast(&xb) });
    try testing.expectError(error.OutOfRange, l.wait(0, &failed));
    try testing.expectEqual(@as(u32, 1), failed);
    try testing.expect(std.mem.indexOf(u8, std.mem.span(diag.get()), "out of range") != null);

    // A store closed by its owner fails the next step instead of being read
    // (the loader keeps it mapped until destroy).
    a.shutdown();
    try l.submit(1, &.{ @ptrCast(&xa), @ptrCast(&xb) });
    try testing.expectError(error.Closed, l.wait(1, &failed));
    try testing.expectEqual(@as(u32, 0), failed);

    const Waiter = struct {
        fn run(loader: *Loader, result: *?Error) void {
            var f: u32 = 0;
            loader.wait(2, &f) catch |err| {
                result.* = err;
            };
        }
    };
    // Close while another thread waits for a submitted step.
    l.reset(2);
    var result: ?Error = null;
    try l.submit(2, &.{ @ptrCast(&xa), @ptrCast(&xb) });
    const t = try std.Thread.spawn(.{}, Waiter.run, .{ l, &result });
    l.stop();
    t.join();
    // Either the step finished first (then it failed: stream 1 is short) or
    // the stop woke the waiter.
    try testing.expect(result != null);
    try testing.expectError(error.Closed, l.submit(3, &.{ @ptrCast(&xa), @ptrCast(&xb) }));
}
