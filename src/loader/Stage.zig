//! The loader's native staging (a ring opened with `gated` 2): the ring
//! releases its own steps once their records are in the node-local cache,
//! so a remote loader's steps need no Python between the sampler and the
//! batch. One caller thread drives it (`run`, through lx_loader_stage):
//! for each step of the window, in order, the step's indices are computed
//! (Builder.indicesOf), mapped through every column's parts (a view's rows
//! included) to the records of each replica (one group per replica), and
//! each group is started as a kept prefetch (Replica.beginWarm: present and
//! checked, nothing to fetch; else cache_fetch.begin with Begin.pin). A
//! group with bytes to fetch is handed back to the caller as a fetch plan
//! (the network is Python's: obstore); the caller lands it and calls again,
//! and once every group of the step is ready the step is released to the
//! workers (Loader.submitLocked). A warm run of steps costs the caller no
//! call at all: it sleeps in `run` until the consumer frees half the window.
//!
//! Budget. With a `budget`, a step is staged only while the stored bytes of
//! the steps staged and not handed over (Replica.nbytes of each group) plus
//! its own stay within it, or when nothing is held (so a step larger than
//! the budget still runs, alone).
//!
//! Resets. `Loader.reset` moves `next` to the new base step and wakes the
//! caller; a step of an older generation whose fetch the caller still
//! holds is dropped when the caller comes back (its pins stay, as a
//! prefetch's do), never released.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const Loader = @import("../Loader.zig");
const Builder = @import("Builder.zig");
const Replica = @import("../Replica.zig");
const cache_fetch = @import("../cache_fetch.zig");
const mixture = @import("../mixture.zig");
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

/// One replica's records of the step being staged.
const Group = struct {
    replica: *Replica,
    records: std.ArrayList(u64) = .empty,
};

// Under the loader's mutex:
/// The next step to stage.
next: u64 = 0,
/// The caller sleeps on `Loader.room` until the consumer hands `wake_at`
/// over (or anything frees held bytes, with a budget).
waiting: bool = false,
wake_at: u64 = 0,
/// A caller is in `run` (one at a time).
busy: bool = false,

// The caller's alone (one caller at a time), kept between calls:
builder: ?Builder = null,
cursors: []mixture.Cursor = &.{},
/// The step being staged, of `generation`; `group` is the next of its
/// groups to start (the one before it was handed back when `handed`).
current: ?struct { step: u64, generation: u64 } = null,
group: usize = 0,
handed: bool = false,
groups: std.ArrayList(Group) = .empty,
bytes: u64 = 0,

pub fn deinit(s: *Stage, gpa: Allocator) void {
    if (s.builder) |*b| b.deinit(gpa);
    gpa.free(s.cursors);
    for (s.groups.items) |*g| g.records.deinit(gpa);
    s.groups.deinit(gpa);
    s.* = .{};
}

/// Stages steps until one needs a fetch: then fills `f` (status ranges, as
/// lx_replica_begin fills it) and `out` and returns; the caller fetches,
/// lands it (lx_fetch_landed until status done) and calls again with
/// `failure` null, or, when the fetch failed, with its message (the step
/// fails with it). A group whose start fails returns its error with `out`
/// naming it (nothing of it stays reserved): call again with a failure.
/// Errors: Closed (the loader stopped: return), InvalidArgument (not a
/// staged ring, or two callers), OutOfMemory, and a group's errors.
pub fn run(
    l: *Loader,
    budget: u64,
    failure: ?[]const u8,
    f: *cache_fetch.Fetch,
    out: *Out,
) Error!void {
    const io = pool.io();
    const s = &l.stage;
    l.mutex.lockUncancelable(io);
    defer l.mutex.unlock(io);
    if (l.config.gated != 2) return invalid("lx_loader_stage: the ring is not staged", .{});
    if (s.busy) return invalid("lx_loader_stage: one caller at a time", .{});
    s.busy = true;
    defer s.busy = false;
    if (s.builder == null) try s.init(l);
    if (s.handed) try s.takeBack(l, failure);
    while (true) {
        if (l.closed) {
            out.* = .{};
            return diag.fail(error.Closed, "the loader is closed", .{});
        }
        const cur = s.current orelse {
            try s.begin(l);
            continue;
        };
        if (cur.generation != l.generation) {
            s.done(l, cur.generation);
            continue;
        }
        if (s.group == 0 and budget != 0 and !s.fits(l, budget)) {
            s.sleep(l, 0);
            continue;
        }
        if (s.group < s.groups.items.len) {
            const g = &s.groups.items[s.group];
            out.* = .{ .step = cur.step, .generation = cur.generation, .replica = g.replica };
            l.mutex.unlock(io);
            const ready = start(g, f);
            l.mutex.lockUncancelable(io);
            if (ready) |warm| {
                if (warm) {
                    s.group += 1;
                    continue;
                }
                s.handed = true;
                return;
            } else |e| {
                s.handed = true;
                return e;
            }
        }
        // Every group ready: the workers may build it.
        try l.submitLocked(cur.step, 1, null, s.bytes);
        s.done(l, cur.generation);
    }
}

/// The caller is back with the group `run` handed it: landed (the step's
/// next group), or failed with `failure` (the step fails with it).
fn takeBack(s: *Stage, l: *Loader, failure: ?[]const u8) Error!void {
    const cur = s.current.?;
    s.handed = false;
    const message = failure orelse {
        s.group += 1;
        return;
    };
    if (cur.generation == l.generation) try l.submitLocked(cur.step, 1, message, 0);
    s.done(l, cur.generation);
}

/// Makes step `next` current once its slot is free, or sleeps until the
/// consumer frees a run of slots. A step that cannot be mapped (out of
/// memory) fails, and the next goes on.
fn begin(s: *Stage, l: *Loader) Error!void {
    if (!s.roomFor(l, s.next)) {
        s.sleep(l, s.next + runLength(l) - 1 -| l.config.window);
        return;
    }
    const generation = l.generation;
    s.plan(l) catch |e| {
        if (generation != l.generation) return; // (reset meanwhile: `next` moved)
        var message: [256]u8 = undefined;
        const text = std.fmt.bufPrint(&message, "staging step {d}: {s}", .{
            s.next, @errorName(e),
        }) catch "staging a step failed";
        try l.submitLocked(s.next, 1, text, 0);
        s.next += 1;
    };
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

fn init(s: *Stage, l: *Loader) Error!void {
    s.builder = try Builder.init(l);
    s.cursors = l.gpa.alloc(mixture.Cursor, if (l.hasCursors()) l.sources.len else 0) catch
        return error.OutOfMemory;
}

/// The current step is over (released, failed or dropped): the next one.
fn done(s: *Stage, l: *const Loader, generation: u64) void {
    const cur = s.current.?;
    if (generation == l.generation) s.next = cur.step + 1;
    s.current = null;
    s.group = 0;
    s.handed = false;
}

/// Steps the caller stages per wake-up: half the window (as the consumer
/// frees it), so a warm loader wakes its stager once per run.
fn runLength(l: *const Loader) u64 {
    return @max(1, l.config.window / 2);
}

/// Whether step `step`'s slot is free for it. Caller holds the mutex.
fn roomFor(_: *const Stage, l: *const Loader, step: u64) bool {
    return l.slots[@intCast(step % l.config.window)].state == .free;
}

/// Whether the current step's bytes fit the budget beside the held ones.
fn fits(s: *const Stage, l: *const Loader, budget: u64) bool {
    var held: u64 = 0;
    var any = false;
    for (l.slots) |slot| {
        if (slot.state == .free) continue;
        held += slot.held;
        any = true;
    }
    return !any or held + s.bytes <= budget;
}

/// Sleeps until the consumer hands step `wake_at` over (or a reset, or
/// stop). Caller holds the mutex.
fn sleep(s: *Stage, l: *Loader, wake_at: u64) void {
    s.waiting = true;
    s.wake_at = wake_at;
    l.room.waitUncancelable(pool.io(), &l.mutex);
    s.waiting = false;
}

/// Makes step `next` current: its indices (of the current base), and the
/// records of each replica it reads. Runs unlocked (the caller holds the
/// mutex on entry and exit).
fn plan(s: *Stage, l: *Loader) Error!void {
    const io = pool.io();
    const step = s.next;
    const generation = l.generation;
    const base: mixture.Base = .{ .step = l.config.step, .position = l.config.position };
    @memcpy(s.cursors, l.cursors[0..s.cursors.len]);
    assert(step >= base.step);
    l.mutex.unlock(io);
    defer l.mutex.lockUncancelable(io);
    const b = &s.builder.?;
    b.indicesOf(l, step, base, s.cursors);
    for (s.groups.items) |*g| g.records.clearRetainingCapacity();
    const c = &l.columns;
    const k_count = c.source_count;
    for (b.indices, b.sources) |index, source| {
        for (0..c.count()) |col| {
            const r = col * k_count + source;
            const lo = c.range_start[r];
            const hi = c.range_start[r + 1];
            const at = c.place(lo, hi, index) orelse continue;
            const rep = c.replicas[lo + at.part] orelse continue;
            if (at.local >= rep.geo.record_count) continue; // (the read names it)
            const g = try s.groupOf(l.gpa, rep);
            g.records.append(l.gpa, at.local) catch return error.OutOfMemory;
        }
    }
    // Groups without records (a replica this step does not read) go.
    var kept: usize = 0;
    s.bytes = 0;
    for (s.groups.items) |g| {
        if (g.records.items.len == 0) {
            var dropped = g;
            dropped.records.deinit(l.gpa);
            continue;
        }
        s.bytes += g.replica.nbytes(g.records.items);
        s.groups.items[kept] = g;
        kept += 1;
    }
    s.groups.shrinkRetainingCapacity(kept);
    s.current = .{ .step = step, .generation = generation };
    s.group = 0;
}

fn groupOf(s: *Stage, gpa: Allocator, rep: *Replica) Error!*Group {
    for (s.groups.items) |*g| if (g.replica == rep) return g;
    s.groups.append(gpa, .{ .replica = rep }) catch return error.OutOfMemory;
    return &s.groups.items[s.groups.items.len - 1];
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
/// count - 1` and checks every record against the server's bytes (or the
/// failure of step `failing`).
const Consumer = struct {
    l: *Loader,
    first: u64,
    count: u64,
    generation: u64 = 0,
    failing: ?u64 = null,
    record: usize,
    bad: u32 = 0,

    fn main(c: *Consumer) void {
        var t: lt.Taken = .{};
        var indices: [4]u64 = undefined;
        for (c.first..c.first + c.count) |step| {
            lt.take(c.l, step, c.generation, &t, &indices, null) catch {
                if (c.failing != step) c.bad += 1;
                continue;
            };
            defer t.free();
            if (c.failing == step) c.bad += 1;
            var buf: [4096]u8 = undefined;
            for (indices, 0..) |i, k| {
                const want = TestBed.pattern(@intCast(i), &buf)[0..c.record];
                const got = t.buffers[0].?[k * c.record ..][0..c.record];
                if (!std.mem.eql(u8, want, got)) c.bad += 1;
            }
        }
        c.l.stop();
    }
};

/// A staged, SEQUENTIAL ring (batch 4, window 4, 2 threads) over the bed's
/// replica of 400 records of 64 bytes.
fn stagedLoader(t: *TestBed, step: u64) !*Loader {
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
    return Loader.create(testing.allocator, config, &sources, &columns, &parts, null);
}

/// Drives the stager until the ring stops, serving every fetch plan (and
/// failing the one of step `failing`); returns the plans served.
fn drive(l: *Loader, t: *TestBed, failing: ?u64) !u64 {
    var plans: u64 = 0;
    var failure: ?[]const u8 = null;
    while (true) {
        var f: cache_fetch.Fetch = undefined;
        var out: Out = .{};
        run(l, 0, failure, &f, &out) catch |e| switch (e) {
            error.Closed => return plans,
            else => return e,
        };
        failure = null;
        try testing.expect(out.replica == t.replica);
        plans += 1;
        if (failing == out.step) {
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
    const l = try stagedLoader(&t, 0);
    var c: Consumer = .{ .l = l, .first = 0, .count = 20, .record = 64 };
    const thread = try std.Thread.spawn(.{}, Consumer.main, .{&c});
    const plans = try drive(l, &t, null);
    thread.join();
    l.destroy();
    try testing.expectEqual(@as(u32, 0), c.bad);
    try testing.expect(plans >= 1 and plans <= 20 + 4);
    for (0..80) |i| try testing.expect(t.replica.isChecked(i));
    // Warm: the same steps again fetch nothing (12 steps, and at most a
    // window more staged: all of them among the 20 fetched above).
    const again = try stagedLoader(&t, 0);
    var w: Consumer = .{ .l = again, .first = 0, .count = 12, .record = 64 };
    const second = try std.Thread.spawn(.{}, Consumer.main, .{&w});
    try testing.expectEqual(@as(u64, 0), try drive(again, &t, null));
    second.join();
    again.destroy();
    try testing.expectEqual(@as(u32, 0), w.bad);
}

test "a staged step whose fetch failed fails alone; the steps after it are built" {
    var t = try TestBed.init(64, 400);
    defer t.deinit();
    const l = try stagedLoader(&t, 30);
    defer l.destroy();
    var c: Consumer = .{ .l = l, .first = 30, .count = 6, .failing = 32, .record = 64 };
    const thread = try std.Thread.spawn(.{}, Consumer.main, .{&c});
    _ = try drive(l, &t, 32);
    thread.join();
    try testing.expectEqual(@as(u32, 0), c.bad);
    // A second caller, or a ring not staged, is refused.
    var f: cache_fetch.Fetch = undefined;
    var out: Out = .{};
    try testing.expectError(error.Closed, run(l, 0, null, &f, &out));
}

test "a staged ring keeps within its budget, and a reset restarts its stager" {
    var t = try TestBed.init(64, 400);
    defer t.deinit();
    const l = try stagedLoader(&t, 0);
    defer l.destroy();
    // A budget of one step's bytes (4 records of 64): one step staged at a time.
    var f: cache_fetch.Fetch = undefined;
    var out: Out = .{};
    try run(l, 256, null, &f, &out);
    try testing.expectEqual(@as(u64, 0), out.step);
    while (f.status == cache_fetch.Status.ranges) {
        try t.serve(&f);
        try cache_fetch.landed(&f);
    }
    // Step 0 is released; step 1 waits for room in the budget (step 0 is
    // held until handed over), so the stager sleeps: hand step 0 over from
    // another thread, then stop.
    const Taker = struct {
        fn main(ring: *Loader, bad: *u32) void {
            var taken: lt.Taken = .{};
            lt.take(ring, 0, 0, &taken, null, null) catch {
                bad.* += 1;
                return;
            };
            taken.free();
            // The next stage call fetches step 1 only now.
            ring.stop();
        }
    };
    var bad: u32 = 0;
    const taker = try std.Thread.spawn(.{}, Taker.main, .{ l, &bad });
    const next = run(l, 256, null, &f, &out);
    taker.join();
    try testing.expectEqual(@as(u32, 0), bad);
    if (next) |_| {
        try testing.expectEqual(@as(u64, 1), out.step);
        try cache_fetch.failed(&f, 0);
    } else |e| try testing.expectEqual(error.Closed, e);
    // A reset moves the stager to the new base (under the mutex).
    const fresh = try stagedLoader(&t, 0);
    defer fresh.destroy();
    _ = fresh.reset(50, 200, &.{});
    try testing.expectEqual(@as(u64, 50), fresh.stage.next);
}
