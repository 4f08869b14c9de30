//! The loader's native staging (a ring opened with `gated` 2): a remote
//! store's records are brought into the node-local cache by the ring
//! itself, so a remote loader's steps need no Python between the sampler
//! and the batch, and a cached step no thread beyond the ring's.
//!
//! A worker that claimed a step computes its indices (Builder.indicesOf),
//! then, before it reads a record, `ready`: it maps the indices through
//! every column's parts (a view's rows included) to the records of each
//! replica (one group per replica) and starts each group as a kept
//! prefetch (Replica.beginWarm, present and checked). When every group is
//! ready it builds the step at once: a warm step costs the ring a few
//! microseconds and nothing else. Otherwise it queues a request for the
//! step and sleeps until the stager has fetched it. The stager is one
//! caller thread (Python's `loaderx-stage`, the network being obstore's) in
//! `run`, through lx_loader_stage: it takes the queued requests in order,
//! starts each group of one (cache_fetch.begin with Begin.pin), and hands
//! a group with bytes to fetch back to its caller as a fetch plan; the
//! caller lands it and calls again (or fails the step with a message), and
//! once every group of a request is ready its worker builds the step.
//!
//! Budget. With `Config.budget`, a step is staged only while the stored
//! bytes (Replica.nbytes of its groups) of the steps before it that are not
//! yet handed over, plus its own, stay within it, or when none is held:
//! the earliest step never waits, so the ring always moves on.
//!
//! Resets and stop. A request of an older generation is dropped (its
//! worker's build fails, and the reset frees it). A worker leaves a request
//! the stager has not taken at once on a reset or stop; one the stager is
//! fetching it waits for, but not once the ring is stopped: requests live
//! in the workers' builders, which the ring frees only at destroy.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const Loader = @import("../Loader.zig");
const Builder = @import("Builder.zig");
const Replica = @import("../Replica.zig");
const cache_fetch = @import("../cache_fetch.zig");
const pool = @import("../pool.zig");
const diag = @import("../diag.zig");

const Stage = @This();
const Error = Loader.Error;

/// What `run` hands back (lx_stage_t): the step it stopped at, its
/// generation, and the replica whose fetch (or error) it is.
pub const Out = extern struct {
    step: u64 = 0,
    generation: u64 = 0,
    replica: ?*Replica = null,

    comptime {
        assert(@sizeOf(Out) == 24);
    }
};

/// One replica's records of a step.
pub const Group = struct {
    replica: *Replica,
    records: std.ArrayList(u64) = .empty,
};

const State = enum { pending, active, done, failed, dropped };

/// A worker's step to fetch (its builder's, so it outlives the worker's
/// wait; under the loader's mutex while queued).
pub const Request = struct {
    step: u64 = 0,
    generation: u64 = 0,
    groups: []Group = &.{},
    state: State = .done,
    message_len: usize = 0,
    message: [256]u8 = undefined,
    next: ?*Request = null,
};

/// A worker's staging: one group per replica its parts read (made at its
/// first step and kept, emptied at every step: a step of a few replicas
/// leaves the others' groups empty), each part's group, and its request.
pub const Worker = struct {
    groups: std.ArrayList(Group) = .empty,
    /// Per part of the loader: its group, or `no_group` (a local part).
    part_group: []u32 = &.{},
    request: Request = .{},

    const no_group = std.math.maxInt(u32);

    pub fn deinit(w: *Worker, gpa: Allocator) void {
        for (w.groups.items) |*g| g.records.deinit(gpa);
        w.groups.deinit(gpa);
        gpa.free(w.part_group);
        w.* = .{};
    }

    /// The groups, one per replica, and each part's (once).
    fn init(w: *Worker, l: *const Loader) Error!void {
        const c = &l.columns;
        assert(w.part_group.len == 0 and w.groups.items.len == 0);
        const part_group = l.gpa.alloc(u32, c.parts.len) catch return error.OutOfMemory;
        // Cut short (no memory), nothing half made is kept: the next step
        // tries again from nothing.
        errdefer {
            l.gpa.free(part_group);
            for (w.groups.items) |*g| g.records.deinit(l.gpa);
            w.groups.clearRetainingCapacity();
        }
        w.part_group = part_group;
        errdefer w.part_group = &.{};
        for (c.replicas, w.part_group) |replica, *slot| {
            slot.* = no_group;
            const rep = replica orelse continue;
            for (w.groups.items, 0..) |g, k| {
                if (g.replica == rep) slot.* = @intCast(k);
            }
            if (slot.* != no_group) continue;
            slot.* = @intCast(w.groups.items.len);
            w.groups.append(l.gpa, .{ .replica = rep }) catch return error.OutOfMemory;
        }
    }
};

// Under the loader's mutex:
/// Requests not yet taken, oldest first.
head: ?*Request = null,
tail: ?*Request = null,
/// The request the stager works on; `group` is the next of its groups to
/// start (the one before it was handed back when `handed`).
active: ?*Request = null,
group: usize = 0,
handed: bool = false,
/// A caller is in `run` (one at a time).
busy: bool = false,
/// Workers waiting for budget (the consumer's hand-overs wake them).
budget_waiting: u32 = 0,

// ---------------------------------------------------------------- workers

/// Makes the records of `step` (the builder's indices, of `generation`)
/// ready to read: at once when they are cached, else through the stager.
/// `held` is the step's slot's count of its stored bytes. Errors: Closed,
/// InvalidArgument (dropped by a reset), Failed (its fetch failed; the
/// message says how), OutOfMemory, and a warm start's errors.
pub fn ready(l: *Loader, b: *Builder, step: u64, generation: u64, held: *u64) Error!void {
    const w = &b.stage;
    try mapGroups(l, b);
    if (l.config.budget != 0) try waitBudget(l, w.groups.items, step, generation, held);
    var warm = true;
    for (w.groups.items) |*g| {
        if (g.records.items.len == 0) continue;
        if (try g.replica.beginWarm(g.records.items, true) == null) {
            warm = false;
            break;
        }
    }
    if (warm) return;
    const io = pool.io();
    const req = &w.request;
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    assert(req.state != .pending and req.state != .active);
    req.* = .{ .step = step, .generation = generation, .groups = w.groups.items };
    req.state = .pending;
    l.stage.enqueue(req);
    l.fetch_wanted.signal(io);
    while (true) {
        switch (req.state) {
            .done => return if (l.generation == generation) {} else dropped(step),
            .failed => return diag.fail(error.Failed, "{s}", .{req.message[0..req.message_len]}),
            .dropped => return dropped(step),
            .pending => if (l.closed or l.generation != generation) {
                l.stage.unlink(req);
                req.state = .dropped;
                if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
                return dropped(step);
            },
            .active => if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{}),
        }
        l.fetched.waitUncancelable(io, &l.mutex);
    }
}

fn dropped(step: u64) Error {
    return diag.fail(error.InvalidArgument, "step {d} was dropped by a reset", .{step});
}

/// The builder's step as the records of each replica it reads.
fn mapGroups(l: *const Loader, b: *Builder) Error!void {
    const w = &b.stage;
    if (w.part_group.len == 0) try w.init(l);
    for (w.groups.items) |*g| g.records.clearRetainingCapacity();
    const c = &l.columns;
    const k_count = c.source_count;
    for (b.indices, b.sources) |index, source| {
        for (0..c.count()) |col| {
            const r = col * k_count + source;
            const lo = c.range_start[r];
            const at = c.place(lo, c.range_start[r + 1], index) orelse continue;
            const k = w.part_group[lo + at.part];
            if (k == Worker.no_group) continue; // (a local part)
            const g = &w.groups.items[k];
            if (at.local >= g.replica.geo.record_count) continue; // (the read names it)
            g.records.append(l.gpa, at.local) catch return error.OutOfMemory;
        }
    }
}

/// Waits until the step's bytes fit the budget beside those of the earlier
/// steps not yet handed over (or none is held), and counts them in `held`.
fn waitBudget(
    l: *Loader,
    groups: []const Group,
    step: u64,
    generation: u64,
    held: *u64,
) Error!void {
    var bytes: u64 = 0;
    for (groups) |g| bytes += g.replica.nbytes(g.records.items);
    const io = pool.io();
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    held.* = bytes;
    while (true) {
        if (l.closed) return diag.fail(error.Closed, "the loader is closed", .{});
        if (l.generation != generation) return dropped(step);
        var before: u64 = 0;
        for (l.slots) |slot| {
            if (slot.state != .free and slot.step < step) before += slot.held;
        }
        if (before == 0 or before + bytes <= l.config.budget) return;
        l.stage.budget_waiting += 1;
        l.fetched.waitUncancelable(io, &l.mutex);
        l.stage.budget_waiting -= 1;
    }
}

// ---------------------------------------------------------------- the stager

/// Fetches the queued requests until one needs bytes: then fills `f`
/// (status ranges, as lx_replica_begin fills it) and `out` and returns; the
/// caller fetches, lands it (lx_fetch_landed until status done) and calls
/// again with `failure` null, or, when the fetch failed, with its message
/// (the step fails with it). A group whose start fails returns its error
/// with `out` naming it (nothing of it stays reserved): call again with a
/// failure. Sleeps while nothing is queued. Errors: Closed (the loader
/// stopped: return), InvalidArgument (not a staged ring, or two callers),
/// and a group's.
pub fn run(l: *Loader, failure: ?[]const u8, f: *cache_fetch.Fetch, out: *Out) Error!void {
    const io = pool.io();
    const s = &l.stage;
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    if (l.config.gated != 2) return invalid("lx_loader_stage: the ring is not staged", .{});
    if (s.busy) return invalid("lx_loader_stage: one caller at a time", .{});
    s.busy = true;
    defer s.busy = false;
    if (s.handed) s.takeBack(l, failure);
    while (true) {
        if (l.closed) {
            out.* = .{};
            return diag.fail(error.Closed, "the loader is closed", .{});
        }
        const req = s.active orelse {
            const next = s.head orelse {
                l.fetch_wanted.waitUncancelable(io, &l.mutex);
                continue;
            };
            s.unlink(next);
            next.state = .active;
            s.active = next;
            s.group = 0;
            continue;
        };
        if (req.generation != l.generation) {
            s.finish(l, .dropped);
            continue;
        }
        if (s.group == req.groups.len) {
            s.finish(l, .done);
            continue;
        }
        const g = &req.groups[s.group];
        if (g.records.items.len == 0) { // (a replica this step does not read)
            s.group += 1;
            continue;
        }
        out.* = .{ .step = req.step, .generation = req.generation, .replica = g.replica };
        l.mutex.unlock(io);
        const started = start(g, f);
        l.mutex.lockUncancelable(io);
        const warm = started catch |e| {
            s.handed = true;
            return e;
        };
        if (!warm) {
            s.handed = true;
            return;
        }
        s.group += 1;
    }
}

/// The caller is back with the group `run` handed it: landed (the next
/// group), or failed with `failure` (the step fails with it).
fn takeBack(s: *Stage, l: *Loader, failure: ?[]const u8) void {
    assert(s.active != null);
    s.handed = false;
    const message = failure orelse {
        s.group += 1;
        return;
    };
    const req = s.active.?;
    req.message_len = @min(message.len, req.message.len);
    @memcpy(req.message[0..req.message_len], message[0..req.message_len]);
    s.finish(l, .failed);
}

/// The active request is over: its worker goes on.
fn finish(s: *Stage, l: *Loader, state: State) void {
    const req = s.active.?;
    assert(req.state == .active);
    req.state = state;
    s.active = null;
    s.group = 0;
    l.fetched.broadcast(pool.io());
}

/// Starts group `g` as a kept prefetch: true when it is ready (present and
/// checked), false with `f` holding the ranges to fetch.
fn start(g: *Group, f: *cache_fetch.Fetch) Error!bool {
    const records = g.records.items;
    if (try g.replica.beginWarm(records, true) != null) return true;
    f.* = std.mem.zeroes(cache_fetch.Fetch);
    try cache_fetch.begin(g.replica, records, cache_fetch.Begin.pin, f);
    return f.status == cache_fetch.Status.done;
}

fn enqueue(s: *Stage, req: *Request) void {
    req.next = null;
    if (s.tail) |t| t.next = req else s.head = req;
    s.tail = req;
}

fn unlink(s: *Stage, req: *Request) void {
    var prev: ?*Request = null;
    var at = s.head;
    while (at) |r| : ({
        prev = r;
        at = r.next;
    }) {
        if (r != req) continue;
        if (prev) |p| p.next = r.next else s.head = r.next;
        if (s.tail == r) s.tail = prev;
        r.next = null;
        return;
    }
    unreachable; // (queued requests only)
}

fn invalid(comptime fmt: []const u8, args: anytype) Error {
    return diag.fail(error.InvalidArgument, fmt, args);
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const sampler = @import("../sampler.zig");
const lt = @import("testing.zig");
const TestBed = @import("../cache_make.zig").TestBed;

/// The consumer of a staged test ring: takes steps `first` .. `first +
/// count - 1`, checks every record against the server's bytes (or the
/// failure of step `failing`, which the stager's driver sets before it
/// fails it: the ring's mutex orders the two), then stops the ring.
const Consumer = struct {
    l: *Loader,
    first: u64,
    count: u64,
    /// Fail the first step the stager hands a fetch plan of.
    fail_first: bool = false,
    failing: std.atomic.Value(u64) = .init(std.math.maxInt(u64)),
    bad: u32 = 0,

    fn main(c: *Consumer) void {
        var t: lt.Taken = .{};
        var indices: [4]u64 = undefined;
        for (c.first..c.first + c.count) |step| {
            lt.take(c.l, step, 0, &t, &indices, null) catch {
                if (c.failing.load(.acquire) != step) c.bad += 1;
                continue;
            };
            defer t.free();
            if (c.failing.load(.acquire) == step) c.bad += 1;
            var buf: [4096]u8 = undefined;
            for (indices, 0..) |i, k| {
                const want = TestBed.pattern(@intCast(i), &buf)[0..64];
                if (!std.mem.eql(u8, want, t.buffers[0].?[k * 64 ..][0..64])) c.bad += 1;
            }
        }
        c.l.stop();
    }
};

/// A staged, SEQUENTIAL ring (batch 4, window 4, 2 threads) from `step`
/// over the bed's replica of 400 records of 64 bytes.
fn stagedLoader(t: *TestBed, step: u64, budget: u64) !*Loader {
    const sources = [_]Loader.Source{.{ .length = 400, .seed = 0, .weight = 1 }};
    const parts = [_]Loader.Part{.{
        .store = t.replica.store.?,
        .first = 0,
        .source = 0,
        .column = 0,
        .replica = t.replica,
    }};
    const columns = [_]Loader.Column{.{ .kind = 0, .record_size = 64 }};
    var config = lt.testConfig(4, 4, 2, step);
    config.mode = @backingInt(sampler.Mode.sequential);
    config.gated = 2;
    config.budget = budget;
    return Loader.create(testing.allocator, config, &sources, &columns, &parts, null);
}

/// Runs a consumer of `count` steps from `first` against the stager, which
/// serves every fetch plan (and fails the first, with `fail_first`) until
/// the ring stops; returns the plans served.
fn drive(t: *TestBed, l: *Loader, c: *Consumer) !u64 {
    const thread = try std.Thread.spawn(.{}, Consumer.main, .{c});
    defer thread.join();
    var plans: u64 = 0;
    var failure: ?[]const u8 = null;
    while (true) {
        var f: cache_fetch.Fetch = undefined;
        var out: Out = .{};
        run(l, failure, &f, &out) catch |e| switch (e) {
            error.Closed => return plans,
            else => return e,
        };
        failure = null;
        try testing.expect(out.replica == t.replica);
        plans += 1;
        if (c.fail_first and plans == 1) c.failing.store(out.step, .release);
        if (c.failing.load(.monotonic) == out.step) {
            try cache_fetch.failed(&f, 0);
            failure = "the fetch failed";
            continue;
        }
        while (f.status == cache_fetch.Status.ranges) {
            try t.serve(&f);
            try cache_fetch.landed(&f);
        }
    }
}

test "a staged ring fetches each step's records before building it, then reads warm" {
    var t = try TestBed.init(64, 400);
    defer t.deinit();
    // Cold: every step's records are fetched, checked, then built exactly.
    const l = try stagedLoader(&t, 0, 0);
    defer l.destroy();
    var c: Consumer = .{ .l = l, .first = 0, .count = 20 };
    const plans = try drive(&t, l, &c);
    try testing.expectEqual(@as(u32, 0), c.bad);
    try testing.expect(plans >= 1 and plans <= 20 + 4);
    for (0..80) |i| try testing.expect(t.replica.isChecked(i));
    // Warm: the same steps again ask the stager for nothing (12 steps, and
    // at most a window more built: all among the 20 fetched above).
    const again = try stagedLoader(&t, 0, 0);
    defer again.destroy();
    var w: Consumer = .{ .l = again, .first = 0, .count = 12 };
    const served = t.steps;
    try testing.expectEqual(@as(u64, 0), try drive(&t, again, &w));
    try testing.expectEqual(@as(u32, 0), w.bad);
    try testing.expectEqual(served, t.steps);
}

test "a staged step whose fetch failed fails alone; the steps after it are built" {
    var t = try TestBed.init(64, 400);
    defer t.deinit();
    const l = try stagedLoader(&t, 30, 0);
    defer l.destroy();
    var c: Consumer = .{ .l = l, .first = 30, .count = 6, .fail_first = true };
    _ = try drive(&t, l, &c);
    try testing.expectEqual(@as(u32, 0), c.bad);
    try testing.expect(c.failing.load(.monotonic) >= 30 and c.failing.load(.monotonic) < 36);
    var f: cache_fetch.Fetch = undefined;
    var out: Out = .{};
    try testing.expectError(error.Closed, run(l, null, &f, &out));
    // A ring not staged has no stager.
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try lt.testStore(&tmp, "x", 30, 1);
    defer s.close();
    const gated = try lt.gatedTestLoader(s);
    defer gated.destroy();
    try testing.expectError(error.InvalidArgument, run(gated, null, &f, &out));
}

test "a staged ring within a budget of one step still delivers every step" {
    var t = try TestBed.init(64, 400);
    defer t.deinit();
    // 4 records of 64 bytes a step: a step waits until the ones before it
    // were handed over, and the earliest never waits.
    const l = try stagedLoader(&t, 0, 256);
    defer l.destroy();
    var c: Consumer = .{ .l = l, .first = 0, .count = 25 };
    _ = try drive(&t, l, &c);
    try testing.expectEqual(@as(u32, 0), c.bad);
}

test "a budget needs a staged ring" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const s = try lt.testStore(&tmp, "x", 30, 1);
    defer s.close();
    const sources = [_]Loader.Source{.{ .length = 30, .seed = 0, .weight = 1 }};
    const parts = [_]Loader.Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    var config = lt.testConfig(3, 4, 2, 0);
    config.budget = 100;
    const made = Loader.create(testing.allocator, config, &sources, &lt.dense8(), &parts, null);
    try testing.expectError(error.InvalidArgument, made);
}
