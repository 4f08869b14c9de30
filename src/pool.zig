//! The parallel executor and the library's one `Io` instance.
//!
//! Work fans out over the cores this process may use (sched_getaffinity on
//! Linux), never `cpu_count * k`: lanes - 1 pooled worker threads plus the
//! calling thread, which always takes part. Callers split their work into
//! contiguous blocks and claim them with an atomic counter, so a lane that could
//! not be started (pool exhausted) only means fewer lanes, never lost work.
//!
//! The `Io.Threaded` instance is built from `init_single_threaded` so that it
//! installs no signal handlers in the host (Python) process. After a fork the
//! child gets a fresh instance: the parent's worker threads do not exist there.
const std = @import("std");
const builtin = @import("builtin");
const Io = std.Io;
const assert = std.debug.assert;

/// Upper bound on lanes for one call, whatever the machine says.
pub const lanes_max: usize = 64;

var state: std.atomic.Value(u8) = .init(0); // 0 = uninit, 1 = initializing, 2 = ready
var threaded: Io.Threaded = undefined;
var owner_pid: i64 = 0;
var lanes_usable: usize = 1;
var lanes_limit: std.atomic.Value(usize) = .init(0); // 0 = no user limit

fn currentPid() i64 {
    if (builtin.os.tag == .windows) return 0;
    return @intCast(std.c.getpid());
}

fn initLocked() void {
    const cpus = std.Thread.getCpuCount() catch 1;
    lanes_usable = @max(1, @min(cpus, lanes_max));
    threaded = .init_single_threaded;
    threaded.allocator = std.heap.c_allocator;
    // Several Python threads may gather at once, each fanning out: allow a few
    // pools' worth of threads; past that a call just runs on fewer lanes.
    threaded.async_limit = .limited(4 * lanes_usable);
    threaded.concurrent_limit = .limited(4 * lanes_usable);
    owner_pid = currentPid();
}

/// The library's Io; usable from any thread.
pub fn io() Io {
    while (true) {
        switch (state.load(.acquire)) {
            2 => {
                if (owner_pid == currentPid()) return threaded.io();
                // Forked child: the parent's pool threads are gone. Leak the old
                // instance (its threads do not exist here) and build a new one.
                if (state.cmpxchgStrong(2, 1, .acquire, .monotonic) == null) {
                    initLocked();
                    state.store(2, .release);
                }
            },
            0 => if (state.cmpxchgStrong(0, 1, .acquire, .monotonic) == null) {
                initLocked();
                state.store(2, .release);
            },
            else => std.atomic.spinLoopHint(),
        }
    }
}

/// Lanes one call may use: the usable cores, capped by `setLaneLimit`.
pub fn lanes() usize {
    _ = io();
    const limit = lanes_limit.load(.monotonic);
    return if (limit == 0) lanes_usable else @min(limit, lanes_usable);
}

/// 0 removes the limit.
pub fn setLaneLimit(n: usize) void {
    lanes_limit.store(n, .monotonic);
}

/// Runs `work(ctx, lane)` on `lane_count` lanes (the caller is lane 0) and
/// returns when all have finished. `work` must claim its share of the job itself.
pub fn run(lane_count: usize, ctx: anytype, comptime work: fn (@TypeOf(ctx), usize) void) void {
    assert(lane_count >= 1);
    if (lane_count == 1) return work(ctx, 0);
    const the_io = io();
    var group: Io.Group = .init;
    var lane: usize = 1;
    while (lane < @min(lane_count, lanes_max)) : (lane += 1) {
        group.concurrent(the_io, work, .{ ctx, lane }) catch break;
    }
    work(ctx, 0);
    group.await(the_io) catch {};
}

test "run executes every lane's share exactly once" {
    const Ctx = struct {
        next: std.atomic.Value(usize) = .init(0),
        hits: [1000]std.atomic.Value(u32) = @splat(.init(0)),

        fn work(c: *@This(), lane: usize) void {
            _ = lane;
            while (true) {
                const i = c.next.fetchAdd(1, .monotonic);
                if (i >= c.hits.len) return;
                _ = c.hits[i].fetchAdd(1, .monotonic);
            }
        }
    };
    var ctx: Ctx = .{};
    run(4, &ctx, Ctx.work);
    for (&ctx.hits) |*h| try std.testing.expectEqual(@as(u32, 1), h.load(.monotonic));
    try std.testing.expect(lanes() >= 1);
}
