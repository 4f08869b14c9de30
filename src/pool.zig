//! The parallel executor and the library's one `Io` instance.
//!
//! Work fans out over the cores this process may use (sched_getaffinity on
//! Linux), never `cpu_count * k`: lanes - 1 persistent worker threads parked
//! on a futex, plus the calling thread, which always takes part. Callers split their work into
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

pub fn currentPid() i64 {
    if (builtin.os.tag == .windows) return 0;
    return @intCast(std.c.getpid());
}

fn initLocked() void {
    const cpus = std.Thread.getCpuCount() catch 1;
    lanes_usable = @max(1, @min(cpus, lanes_max));
    threaded = .init_single_threaded;
    threaded.allocator = std.heap.c_allocator;
    // The Io serves files and futexes only; parallel work runs on this file's
    // own worker pool, so it needs no async or concurrent task threads.
    threaded.async_limit = .nothing;
    threaded.concurrent_limit = .nothing;
    owner_pid = currentPid();
    assert(lanes_usable >= 1 and lanes_usable <= lanes_max);
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

/// Takes `m`, spinning a little before sleeping on its futex: the loader's
/// ring holds its mutex for a few lines of bookkeeping, far less than a futex
/// sleep and wake-up costs (a context switch each, and on a VM an interrupt
/// across CPUs).
pub fn lockSpin(m: *Io.Mutex) void {
    for (0..lock_spins) |_| {
        if (m.state.load(.monotonic) == .unlocked and m.tryLock()) return;
        std.atomic.spinLoopHint();
    }
    m.lockUncancelable(io());
}

const lock_spins = 100;

/// Lanes one call may use: the usable cores, capped by `setLaneLimit`.
pub fn lanes() usize {
    _ = io();
    const limit = lanes_limit.load(.monotonic);
    const n = if (limit == 0) lanes_usable else @min(limit, lanes_usable);
    assert(n >= 1 and n <= lanes_max);
    return n;
}

/// 0 removes the limit.
pub fn setLaneLimit(n: usize) void {
    lanes_limit.store(n, .monotonic);
}

/// How a job of `count` items runs: on how many lanes, in blocks of how many
/// items. One lane when the caller says the job is too small to be worth a
/// wake-up (`worth_lanes` false), else up to the usable lanes capped by `cap`
/// (0: no cap), each with about `blocks_per_lane` contiguous blocks, so lanes
/// that finish early take over uneven work.
pub const Plan = struct {
    lanes: usize,
    block_size: usize,
};

pub fn plan(count: usize, worth_lanes: bool, cap: usize, blocks_per_lane: usize) Plan {
    assert(count >= 1);
    assert(blocks_per_lane >= 1);
    var n: usize = if (worth_lanes) lanes() else 1;
    if (cap != 0) n = @min(n, cap);
    n = @max(1, @min(n, count));
    const blocks = if (n == 1) 1 else @min(count, n * blocks_per_lane);
    // blocks >= 1 (count >= 1 and n >= 1), so the division cannot fail.
    const block_size = std.math.divCeil(usize, count, blocks) catch unreachable;
    // Lanes within the job, the cap and lanes_max; the blocks (the smallest
    // size that makes at most `blocks` of them) cover the job.
    assert(n >= 1 and n <= count and n <= lanes_max and (cap == 0 or n <= cap));
    assert(block_size >= 1 and block_size <= count);
    assert(block_size * blocks >= count and (block_size - 1) * blocks < count);
    return .{ .lanes = n, .block_size = block_size };
}

// The worker pool: lanes_usable - 1 persistent threads, started on first use,
// sleeping on a futex between jobs. One job runs at a time; a caller that finds
// the pool busy (another thread's gather) runs its job alone rather than
// oversubscribing the cores. Job state lives in globals, never on a caller's
// stack, and lanes are claimed with a generation-tagged CAS, so a worker that
// wakes late can never join a finished job or a newer one it was not woken for.

const Job = struct {
    /// (generation << 32) | next lane to hand out; lane == closed when closed.
    claim: std.atomic.Value(u64) = .init(0),
    /// Futex word: bumped to start a job; workers sleep on it.
    generation: std.atomic.Value(u32) = .init(0),
    /// Futex word: workers that claimed a lane and finished it.
    finished: std.atomic.Value(u32) = .init(0),
    lanes: u32 = 0,
    ctx: *anyopaque = undefined,
    run: *const fn (*anyopaque, usize) void = undefined,
};

const lane_closed: u32 = std.math.maxInt(u32);

/// How long a waiting thread polls before it sleeps on its futex. Measured in
/// time, not in pause instructions: a pause takes ~10-40 cycles on recent
/// Intel parts and ~65-140 on AMD and older Intel, and varies on a virtual
/// CPU: the old count of 4,000 polled for 20-40 us on this Xeon in one run
/// and over 80 us in a later one (by those latencies ~100 us on an EPYC; not
/// measured). A worker that
/// sleeps costs the next gather its wake-up (a 256 x 12 KiB gather: 152 us
/// after a 20 us gap, 215-240 us after 80 us or more on a 2-vCPU KVM guest),
/// so the window spans the Python work a caller does between back-to-back
/// gathers (a remote batch's cache bookkeeping, a user's loop) and not much
/// more: polling longer took CPU from a caller's own threads (numpy matmul
/// between gathers, +5% at 100 us, +47% at 500 us). scripts/probe_pool_gap.py.
const poll_ns: u64 = 100 * std.time.ns_per_us;

/// Monotonic nanoseconds, 0 when unknown. Through libc, which reads the
/// vDSO: std.os.linux.clock_gettime made a syscall per call from inside a
/// shared library (0.5 us per gather measured).
pub fn monotonicNs() u64 {
    if (builtin.os.tag != .linux) return 0;
    var ts: std.c.timespec = undefined;
    if (std.c.clock_gettime(.MONOTONIC, &ts) != 0) return 0;
    return @as(u64, @intCast(ts.sec)) * std.time.ns_per_s + @as(u64, @intCast(ts.nsec));
}

/// Polls for `poll_ns`, then tells its thread to sleep. Where the clock is
/// unknown (it reads 0) a count of pauses bounds the poll instead.
const Poll = struct {
    start: u64,
    spins: u32 = 0,
    expired: bool = false,

    const check_every: u32 = 64;
    const spins_without_clock: u32 = 4000;

    fn init() Poll {
        return .{ .start = monotonicNs() };
    }

    /// Pauses once and returns true while the window lasts; false after.
    fn again(p: *Poll) bool {
        if (p.expired) return false;
        p.spins +|= 1;
        if (p.spins % check_every == 0) {
            const now = monotonicNs();
            const over = if (now == 0 or p.start == 0)
                p.spins >= spins_without_clock
            else
                now -% p.start >= poll_ns;
            if (over) {
                p.expired = true;
                return false;
            }
        }
        std.atomic.spinLoopHint();
        return true;
    }
};
var job: Job = .{};
var pool_busy: std.atomic.Value(bool) = .init(false);
var workers_started: usize = 0;
var workers_pid: i64 = 0;

fn workerMain() void {
    const the_io = io();
    var seen = job.generation.load(.acquire);
    while (true) {
        var poll: Poll = .init();
        while (job.generation.load(.acquire) == seen) {
            if (!poll.again()) the_io.futexWaitUncancelable(u32, &job.generation.raw, seen);
        }
        seen = job.generation.load(.acquire);
        // Claim a lane of generation `seen`, if it still has one to give.
        var c = job.claim.load(.acquire);
        while (true) {
            const gen: u32 = @truncate(c >> 32);
            const lane: u32 = @truncate(c);
            if (gen != seen or lane == lane_closed or lane >= job.lanes) break;
            // Lane 0 is the caller's; the counter starts at 1.
            assert(lane >= 1 and job.lanes <= lanes_max);
            if (job.claim.cmpxchgWeak(c, c + 1, .acq_rel, .acquire)) |cur| {
                c = cur;
                continue;
            }
            job.run(job.ctx, lane);
            _ = job.finished.fetchAdd(1, .acq_rel);
            the_io.futexWake(u32, &job.finished.raw, 1);
            break;
        }
    }
}

fn ensureWorkers(want: usize) void {
    assert(want < lanes_max);
    const pid = currentPid();
    if (workers_pid != pid) {
        // First use, or a forked child: the parent's workers do not exist here.
        workers_pid = pid;
        workers_started = 0;
    }
    while (workers_started < want) : (workers_started += 1) {
        const t = std.Thread.spawn(.{ .stack_size = 1 << 20 }, workerMain, .{}) catch return;
        t.detach();
    }
}

/// Runs `work(ctx, lane)` on up to `lane_count` lanes (the caller is lane 0)
/// and returns when all have finished. `work` must claim its share of the job
/// itself, so however many lanes actually join, all the work is done.
pub fn run(lane_count: usize, ctx: anytype, comptime work: fn (@TypeOf(ctx), usize) void) void {
    assert(lane_count >= 1);
    const Ctx = @TypeOf(ctx);
    const Erased = struct {
        fn call(p: *anyopaque, lane: usize) void {
            work(@as(Ctx, @ptrCast(@alignCast(p))), lane);
        }
    };
    if (lane_count == 1 or pool_busy.swap(true, .acquire)) return work(ctx, 0);
    defer pool_busy.store(false, .release);
    const the_io = io();
    const lanes_wanted: u32 = @intCast(@min(lane_count, lanes_usable, lanes_max));
    assert(lanes_wanted >= 1);
    ensureWorkers(lanes_wanted - 1);

    job.ctx = @ptrCast(ctx);
    job.run = Erased.call;
    job.lanes = lanes_wanted;
    job.finished.store(0, .release);
    const gen = job.generation.load(.monotonic) +% 1;
    job.claim.store((@as(u64, gen) << 32) | 1, .release);
    job.generation.store(gen, .release);
    the_io.futexWake(u32, &job.generation.raw, lanes_wanted - 1);

    work(ctx, 0);

    // Close the job to late wakers, then wait for the lanes that were claimed.
    var c = job.claim.load(.acquire);
    const closed = (@as(u64, gen) << 32) | lane_closed;
    while (job.claim.cmpxchgWeak(c, closed, .acq_rel, .acquire)) |cur| c = cur;
    // Only this call closes its generation; workers hand out lanes 1.. up to
    // lanes_wanted - 1 (the counter stops at lanes_wanted).
    assert(@as(u32, @truncate(c >> 32)) == gen);
    assert(@as(u32, @truncate(c)) >= 1 and @as(u32, @truncate(c)) <= lanes_wanted);
    const claimed: u32 = @as(u32, @truncate(c)) - 1;
    // The other lanes are usually a block or two from done: spin briefly, as
    // a futex sleep would add a wake-up (tens of µs on a virtual CPU) to a job
    // that may itself be only ~100 µs long.
    var poll: Poll = .init();
    while (true) {
        const f = job.finished.load(.acquire);
        assert(f <= claimed); // a lane finishes only once it was claimed
        if (f >= claimed) break;
        if (!poll.again()) the_io.futexWaitUncancelable(u32, &job.finished.raw, f);
    }
}

test "a poll lasts its window, then stays over" {
    var p: Poll = .init();
    var polls: u64 = 0;
    while (p.again()) polls += 1;
    try std.testing.expect(polls >= Poll.check_every - 1);
    try std.testing.expect(!p.again());
    const now = monotonicNs();
    if (now != 0 and p.start != 0) try std.testing.expect(now - p.start >= poll_ns);
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
