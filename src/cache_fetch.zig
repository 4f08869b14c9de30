//! Fetch plans of the node-local cache (src/Cache.zig owns the cache,
//! src/Replica.zig one replica): which byte ranges this process must fetch
//! for a read (reserving them), and their intake once they landed (checked
//! against the store's checksums, marked present, released).
//!
//! A plan is a small state machine one thread drives through the C ABI
//! (`lx_replica_begin`, then `lx_fetch_landed` or `lx_fetch_failed` after
//! each step's ranges are fetched): a table layout's index entries first
//! (a record's place in the data), then the read's start (tick, watermark,
//! stamps) and its records' data (with a fixed layout's checksums, in the
//! same step), then the check; records that fail are dropped and fetched
//! once more. Blocks another process (or thread) is fetching are waited
//! for after this step's own are landed and released, never while holding
//! any: no two fetchers wait for each other. A full disk makes room once
//! (eviction, then the bytes nothing marks) and plans the step again.
const std = @import("std");
const assert = std.debug.assert;
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const Cache = @import("Cache.zig");
const Replica = @import("Replica.zig");
const layout = @import("cache_format.zig");
const files = @import("cache_os.zig");

const Error = Cache.Error;
const File = Replica.File;

/// One file's requests of a fetch step (C: lx_requests_t): request k is
/// bytes [starts[k], ends[k]) of the object; of its bytes, only the keeps
/// whose `keep_request` is k are written (at their own offsets: the rest
/// is on disk already, or another fetcher's).
pub const Requests = extern struct {
    count: u64,
    starts: ?[*]const u64,
    ends: ?[*]const u64,
    keep_count: u64,
    keep_request: ?[*]const u64,
    keep_lo: ?[*]const u64,
    keep_hi: ?[*]const u64,
};

/// A fetch through the cache (C: lx_fetch_t), which lx_replica_begin fills
/// and lx_fetch_landed / lx_fetch_failed move on.
pub const Fetch = extern struct {
    /// The read's tick, for lx_replica_end (0: none, a prefetch's or a
    /// whole-index fetch).
    tick: u64,
    /// `Status`: what the caller does next.
    status: u32,
    /// `Cache.Warn` bits and `index_due`, gathered over the fetch.
    flags: u32,
    /// For status `ranges`: this step's requests of the index [0] and the
    /// data [1]; valid until the next call on this fetch.
    files: [2]Requests,
    /// After a corrupt result: the first record whose server bytes fail.
    bad_record: u64,
    /// The library's state while status is `ranges` (null otherwise).
    plan: ?*anyopaque,
};

pub const Status = struct {
    /// Every record present and checked: read them, then end the read.
    pub const done: u32 = 0;
    /// Fetch `files`' ranges into the replica's files, then lx_fetch_landed.
    pub const ranges: u32 = 1;
    /// A warm-only start found records to fetch: nothing started.
    pub const miss: u32 = 2;
};

/// lx_replica_begin's flags.
pub const Begin = struct {
    /// A prefetch: kept from eviction for the process's next pin_calls
    /// prefetches instead of until the read ends.
    pub const pin: u32 = 1;
    /// Start only when every record is present and checked (status miss
    /// otherwise, nothing started).
    pub const warm_only: u32 = 2;
    /// No read: fetch the rest of the index whole, in rounds.
    pub const whole_index: u32 = 4;
};

/// Fetch.flags: the read found the rest of the index due (start a
/// whole-index fetch in the background; once per process and replica).
pub const index_due: u32 = 4;
/// Fetch.flags: `bad_record` names a record whose server bytes failed its
/// check twice (with the corrupt result).
pub const bad_record_flag: u32 = 8;

const Run = struct { b0: u64, b1: u64, locked: bool };

/// One file's part of a step.
const Step = struct {
    /// The block runs asked for (kept: a retry after a full disk plans again).
    want: std.ArrayList([2]u64) = .empty,
    /// Runs this fetch reserved (locked: holds their fetch locks; not, once
    /// a wait for another fetcher's ran out).
    held: std.ArrayList(Run) = .empty,
    /// Missing runs, to mark present when landed.
    todo: std.ArrayList([2]u64) = .empty,
    /// Runs another fetcher holds: waited for after this step.
    theirs: std.ArrayList([2]u64) = .empty,
    starts: std.ArrayList(u64) = .empty,
    ends: std.ArrayList(u64) = .empty,
    keep_request: std.ArrayList(u64) = .empty,
    keep_lo: std.ArrayList(u64) = .empty,
    keep_hi: std.ArrayList(u64) = .empty,
    request_max: u64 = 0,

    fn deinit(s: *Step, gpa: std.mem.Allocator) void {
        s.want.deinit(gpa);
        s.held.deinit(gpa);
        s.todo.deinit(gpa);
        s.theirs.deinit(gpa);
        s.starts.deinit(gpa);
        s.ends.deinit(gpa);
        s.keep_request.deinit(gpa);
        s.keep_lo.deinit(gpa);
        s.keep_hi.deinit(gpa);
    }

    /// Forgets the step's requests (its runs stay).
    fn clearRequests(s: *Step) void {
        s.starts.clearRetainingCapacity();
        s.ends.clearRetainingCapacity();
        s.keep_request.clearRetainingCapacity();
        s.keep_lo.clearRetainingCapacity();
        s.keep_hi.clearRetainingCapacity();
        assert(s.keep_lo.items.len == 0);
    }

    fn bytes(s: *const Step) u64 {
        var total: u64 = 0;
        for (s.starts.items, s.ends.items) |a, b| total += b - a;
        return total;
    }
};

/// Restarts a read's start allows (entries another process keeps dropping).
const restarts_max = 8;

const Stage = enum { index_first, read, refetch_index, refetch_data, whole_index };

const Plan = struct {
    /// `plan_canary` while the plan lives (the ABI's fetches point at it).
    canary: u64 = plan_canary,
    r: *Replica,
    stage: Stage,
    pin: bool,
    tick: u64 = 0,
    /// The read's records (a table layout starts the read after their entries).
    records: []u64 = &.{},
    /// The records being fetched and checked; then those that failed.
    todo: std.ArrayList(u64) = .empty,
    bad: std.ArrayList(u64) = .empty,
    steps: [2]Step = .{ .{}, .{} },
    /// A full disk made room once for this fetch.
    retried: bool = false,
    /// The next index block a whole-index round looks at.
    cursor: u64 = 0,
    /// Starts of the read undone by entries dropped meanwhile.
    restarts: u32 = 0,
    flags: u32 = 0,

    fn destroy(p: *Plan) void {
        const gpa = p.r.cache.gpa;
        p.release();
        if (p.stage == .whole_index) _ = p.r.whole_running.fetchSub(1, .monotonic);
        for (&p.steps) |*s| s.deinit(gpa);
        p.todo.deinit(gpa);
        p.bad.deinit(gpa);
        gpa.free(p.records);
        p.canary = 0;
        gpa.destroy(p);
    }

    /// Releases every reservation of the current step.
    fn release(p: *Plan) void {
        p.releaseFile(.index);
        p.releaseFile(.data);
    }

    /// Releases the reservations of the current step's file `f`.
    fn releaseFile(p: *Plan, f: File) void {
        const r = p.r;
        const io = pool.io();
        r.mutex.lockUncancelable(io);
        defer r.mutex.unlock(io);
        const k = @backingInt(f);
        const s = &p.steps[k];
        for (s.held.items) |run| {
            if (!run.locked) continue;
            files.unlockRange(r.lockFd(f), run.b0, run.b1 - run.b0);
            const list = &r.reserved[k];
            for (list.items, 0..) |x, j| {
                if (x[0] == run.b0 and x[1] == run.b1) {
                    _ = list.swapRemove(j);
                    break;
                }
            }
        }
        s.held.clearRetainingCapacity();
    }

    fn clearStep(p: *Plan) void {
        for (&p.steps) |*s| {
            s.want.clearRetainingCapacity();
            s.todo.clearRetainingCapacity();
            s.clearRequests();
        }
    }

    fn hasRequests(p: *const Plan) bool {
        return p.steps[0].starts.items.len != 0 or p.steps[1].starts.items.len != 0;
    }
};

/// Starts a read of `records` through the replica (lx_replica_begin): see
/// `Begin` for `flags`, `Fetch` for what `f` says next.
pub fn begin(r: *Replica, records: []const u64, flags: u32, f: *Fetch) Error!void {
    f.* = std.mem.zeroes(Fetch);
    const pin = flags & Begin.pin != 0;
    if (flags & Begin.whole_index != 0) return beginWholeIndex(r, f);
    if (flags & Begin.warm_only != 0) {
        const tick = try r.beginWarm(records, pin);
        f.status = if (tick == null) Status.miss else Status.done;
        f.tick = if (pin) 0 else tick orelse 0;
        return;
    }
    const table = r.geo.fixed_size == 0;
    if (!r.anyUnchecked(records)) {
        if (try r.startRead(records, pin)) |tick| {
            if (!r.anyUnchecked(records)) {
                f.tick = if (pin) 0 else tick;
                return;
            }
            if (!pin) r.cache.end(tick); // an eviction since: the full start
        }
    }
    const p = try newPlan(r, if (table) .index_first else .read, pin, records);
    errdefer p.destroy();
    if (table) {
        try planIndex(r, p, p.records, true);
    } else {
        try startReadStage(r, p, f);
    }
    try advance(r, p, f);
}

fn newPlan(r: *Replica, stage: Stage, pin: bool, records: []const u64) Error!*Plan {
    const gpa = r.cache.gpa;
    const p = gpa.create(Plan) catch return error.OutOfMemory;
    p.* = .{ .r = r, .stage = stage, .pin = pin };
    p.records = gpa.dupe(u64, records) catch {
        gpa.destroy(p);
        return error.OutOfMemory;
    };
    return p;
}

fn beginWholeIndex(r: *Replica, f: *Fetch) Error!void {
    try r.cache.enterProcess();
    const p = try newPlan(r, .whole_index, false, &.{});
    _ = r.whole_running.fetchAdd(1, .monotonic);
    errdefer p.destroy();
    try planWholeRound(r, p);
    try advance(r, p, f);
}

/// The read's start (the tick, the stamps) and its unchecked records'
/// data, with a fixed layout's checksums: the `read` stage's step.
fn startReadStage(r: *Replica, p: *Plan, f: *Fetch) Error!void {
    const tick = try r.startRead(p.records, p.pin) orelse {
        // An entry dropped meanwhile (another process's failed check):
        // fetched again before the read starts.
        assert(r.geo.fixed_size == 0);
        p.restarts += 1;
        if (p.restarts > restarts_max) {
            const why = "{s}: records' entries dropped {d} times while a read started";
            return diag.fail(error.Corrupt, why, .{ r.key, restarts_max });
        }
        p.stage = .index_first;
        return planIndex(r, p, p.records, false);
    };
    p.stage = .read;
    p.tick = tick;
    f.tick = if (p.pin) 0 else tick;
    const fresh = r.checkedCurrent();
    p.todo.clearRetainingCapacity();
    for (p.records) |i| {
        if (i >= r.geo.record_count or (fresh and r.isChecked(i))) continue;
        p.todo.append(r.cache.gpa, i) catch return error.OutOfMemory;
    }
    std.sort.pdq(u64, p.todo.items, {}, std.sort.asc(u64));
    p.todo.items.len = uniqueSorted(p.todo.items);
    if (r.geo.fixed_size != 0) try planIndex(r, p, p.todo.items, false);
    try planData(r, p, p.todo.items);
}

/// Moves the plan on until it has ranges to fetch or is done: the read
/// started after its entries, the check after its data, the refetch of
/// what failed, the next whole-index round.
fn advance(r: *Replica, p: *Plan, f: *Fetch) Error!void {
    while (!p.hasRequests()) {
        // Nothing to fetch: hold nothing (what was reserved is present).
        p.release();
        // Blocks another fetcher held: waited for (holding none), then
        // fetched here if they are still missing.
        if (try takeTheirs(r, p)) continue;
        switch (p.stage) {
            .index_first => try startReadStage(r, p, f),
            .read => {
                try check(r, p, p.todo.items);
                if (p.bad.items.len == 0) break;
                try r.drop(p.bad.items);
                p.stage = if (r.geo.fixed_size == 0) .refetch_index else .refetch_data;
                if (!r.weak) try planIndex(r, p, p.bad.items, false);
                if (p.stage == .refetch_data) try planData(r, p, p.bad.items);
            },
            .refetch_index => {
                p.stage = .refetch_data;
                try planData(r, p, p.bad.items);
            },
            .refetch_data => {
                const again = try gpaDupe(r, p.bad.items);
                defer r.cache.gpa.free(again);
                try check(r, p, again);
                if (p.bad.items.len == 0) break;
                try r.drop(p.bad.items);
                f.bad_record = p.bad.items[0];
                f.flags |= bad_record_flag;
                const why = "record {d} fails its checksum as the server holds it";
                return diag.fail(error.Corrupt, why, .{p.bad.items[0]});
            },
            .whole_index => {
                try planWholeRound(r, p);
                if (!p.hasRequests()) break;
            },
        }
    }
    if (p.hasRequests()) {
        f.status = Status.ranges;
        f.plan = p;
        f.flags |= p.flags;
        for (&f.files, &p.steps) |*out, *s| out.* = .{
            .count = s.starts.items.len,
            .starts = s.starts.items.ptr,
            .ends = s.ends.items.ptr,
            .keep_count = s.keep_lo.items.len,
            .keep_request = s.keep_request.items.ptr,
            .keep_lo = s.keep_lo.items.ptr,
            .keep_hi = s.keep_hi.items.ptr,
        };
        return;
    }
    f.flags |= p.flags;
    if (p.stage != .whole_index and indexDue(r)) f.flags |= index_due;
    f.status = Status.done;
    f.plan = null;
    f.files = std.mem.zeroes([2]Requests);
    p.destroy();
}

fn gpaDupe(r: *Replica, items: []const u64) Error![]u64 {
    return r.cache.gpa.dupe(u64, items) catch error.OutOfMemory;
}

/// Checks records `records` against the store's checksums (its own handle
/// of the replica): those that pass are marked checked, those that fail
/// are `p.bad`.
fn check(r: *Replica, p: *Plan, records: []const u64) Error!void {
    const gpa = r.cache.gpa;
    p.bad.clearRetainingCapacity();
    if (records.len == 0) return;
    const s = r.store orelse
        return diag.fail(error.InvalidArgument, "replica {s} has no store to check with", .{r.key});
    const positions = gpa.alloc(u64, records.len) catch return error.OutOfMemory;
    defer gpa.free(positions);
    try s.enter();
    defer s.leave();
    const n = try s.verifyRecords(records, positions);
    var k: usize = 0;
    for (records, 0..) |i, j| {
        if (k < n and positions[k] == j) {
            p.bad.append(gpa, i) catch return error.OutOfMemory;
            k += 1;
        } else r.markChecked(&.{i});
    }
    assert(k == n);
}

/// The step's index blocks of `records` (sorted or not), or the whole
/// missing index where that is cheaper (`wholeIndexWorth`), in requests of
/// `whole_index_chunk` bytes.
fn planIndex(r: *Replica, p: *Plan, records: []const u64, unchecked_only: bool) Error!void {
    const gpa = r.cache.gpa;
    var blocks: std.ArrayList(u64) = .empty;
    defer blocks.deinit(gpa);
    const fresh = r.checkedCurrent();
    for (records) |i| {
        if (i >= r.geo.record_count) continue;
        if (unchecked_only and fresh and r.isChecked(i)) continue;
        blocks.append(gpa, r.indexBlock(i)) catch return error.OutOfMemory;
    }
    std.sort.pdq(u64, blocks.items, {}, std.sort.asc(u64));
    blocks.items.len = uniqueSorted(blocks.items);
    const s = &p.steps[0];
    s.request_max = r.cache.policy.whole_index_chunk;
    if (wholeIndexWorth(r, blocks.items)) {
        if (r.geo.index_blocks != 0)
            s.want.append(gpa, .{ 0, r.geo.index_blocks }) catch return error.OutOfMemory;
    } else {
        try appendRuns(gpa, &s.want, blocks.items);
    }
    try prepare(r, p, .index, false);
}

/// The step's data blocks of `records`.
fn planData(r: *Replica, p: *Plan, records: []const u64) Error!void {
    const gpa = r.cache.gpa;
    const sh = r.geo.data_shift;
    var ranges: std.ArrayList([2]u64) = .empty;
    defer ranges.deinit(gpa);
    for (records) |i| {
        const sp = try r.spanPresent(i);
        if (sp[1] == sp[0]) continue;
        const blocks: [2]u64 = .{ sp[0] >> sh, ((sp[1] - 1) >> sh) + 1 };
        ranges.append(gpa, blocks) catch return error.OutOfMemory;
    }
    std.sort.pdq([2]u64, ranges.items, {}, struct {
        fn less(_: void, a: [2]u64, b: [2]u64) bool {
            return a[0] < b[0];
        }
    }.less);
    const s = &p.steps[1];
    s.request_max = r.cache.policy.request_max;
    for (ranges.items) |x| {
        if (s.want.items.len != 0 and x[0] <= s.want.items[s.want.items.len - 1][1]) {
            const last = &s.want.items[s.want.items.len - 1];
            last[1] = @max(last[1], x[1]);
        } else s.want.append(gpa, x) catch return error.OutOfMemory;
    }
    try prepare(r, p, .data, false);
}

/// The next round of a whole-index fetch: up to `index_with_batch_max`
/// bytes of missing index blocks from the cursor on.
fn planWholeRound(r: *Replica, p: *Plan) Error!void {
    const gpa = r.cache.gpa;
    const pol = r.cache.policy;
    const step = @max(1, pol.index_with_batch_max >> r.geo.index_shift);
    var blocks: std.ArrayList(u64) = .empty;
    defer blocks.deinit(gpa);
    var b = p.cursor;
    while (b < r.geo.index_blocks and blocks.items.len < step) : (b += 1) {
        if (!layout.bitTest(r.ibits, b)) blocks.append(gpa, b) catch return error.OutOfMemory;
    }
    p.cursor = b;
    const s = &p.steps[0];
    s.request_max = pol.whole_index_chunk;
    try appendRuns(gpa, &s.want, blocks.items);
    try prepare(r, p, .index, false);
}

/// Whether to fetch the whole missing index instead of `blocks` (sorted,
/// unique): when it costs less than these blocks' requests and the
/// earlier ones at `index_request_bytes` a request, is at most
/// `index_with_batch_max` and fits the cache's share. Counts the requests
/// otherwise.
fn wholeIndexWorth(r: *Replica, blocks: []const u64) bool {
    const pol = r.cache.policy;
    var missing: u64 = 0;
    var gets: u64 = 0;
    var last: ?u64 = null;
    const gap_blocks = 1 + (pol.max_gap >> r.geo.index_shift);
    for (blocks) |b| {
        if (layout.bitTest(r.ibits, b)) continue;
        if (last == null or b - last.? > gap_blocks) gets += 1;
        last = b;
        missing += 1;
    }
    if (missing == 0 or r.whole_running.load(.monotonic) != 0) return false;
    const rented = (r.index_gets.load(.monotonic) + gets) *| pol.index_request_bytes;
    const worth = @min(rented, pol.index_with_batch_max);
    if (r.indexMissingBytes() > worth or !indexFits(r)) {
        _ = r.index_gets.fetchAdd(gets, .monotonic);
        return false;
    }
    return true;
}

/// Whether the whole index is at most its share of the cache's limit.
fn indexFits(r: *Replica) bool {
    const c = r.cache;
    const limit = c.effectiveLimit(@atomicLoad(u64, &c.head.used, .monotonic));
    return r.geo.index_size *| c.policy.whole_index_share <= limit;
}

/// Whether to fetch the rest of the index now, whole, in the background:
/// once per process, once this process's data fetches reached
/// `whole_index_after` times the missing index or its index requests are
/// worth it, and only when it fits the cache's share.
fn indexDue(r: *Replica) bool {
    if (r.whole_started.load(.monotonic) or r.geo.index_blocks == 0) return false;
    const pol = r.cache.policy;
    const rented = r.index_gets.load(.monotonic) *| pol.index_request_bytes;
    const data = r.fetched_data.load(.monotonic);
    const half = r.geo.index_size / 2;
    if (data < pol.whole_index_after *| half and rented < half) return false;
    const missing = r.indexMissingBytes();
    if (missing == 0) return false;
    if (data < pol.whole_index_after *| missing and rented < missing) return false;
    if (!indexFits(r)) return false;
    return !r.whole_started.swap(true, .monotonic);
}

/// Reserves the missing blocks of step `f`'s wanted runs and plans their
/// requests (runs another fetcher holds go to `theirs`, or, with `wait`,
/// are waited for); allocates their bytes first where that is needed. A
/// full disk makes room and plans once more; then NoSpace.
fn prepare(r: *Replica, p: *Plan, f: File, wait: bool) Error!void {
    const s = &p.steps[@backingInt(f)];
    reserveStep(r, p, f, wait) catch |e| {
        p.releaseFile(f);
        return e;
    };
    try buildRequests(r, s, f);
    const need = preallocate(r, s, f) orelse {
        s.want.clearRetainingCapacity();
        return;
    };
    p.releaseFile(f);
    if (p.retried) return noSpace(r, need, f, .NOSPC);
    p.retried = true;
    try r.cache.makeRoom(need);
    s.todo.clearRetainingCapacity();
    s.theirs.clearRetainingCapacity();
    s.clearRequests();
    return prepare(r, p, f, wait);
}

fn reserveStep(r: *Replica, p: *Plan, f: File, wait: bool) Error!void {
    const gpa = r.cache.gpa;
    const s = &p.steps[@backingInt(f)];
    const words = r.bits(f);
    for (s.want.items) |w| {
        var b = w[0];
        while (b < w[1]) {
            if (layout.bitTest(words, b)) {
                b += 1;
                continue;
            }
            var e = b + 1;
            while (e < w[1] and !layout.bitTest(words, e)) e += 1;
            const got = if (wait) try waitReserve(r, f, b, e) else try tryReserve(r, f, b, e);
            if (got) |locked| {
                s.held.append(gpa, .{ .b0 = b, .b1 = e, .locked = locked }) catch {
                    if (locked) unreserve(r, f, b, e);
                    return error.OutOfMemory;
                };
                // Present meanwhile (another fetcher finished): not fetched again.
                var k = b;
                while (k < e) {
                    if (layout.bitTest(words, k)) {
                        k += 1;
                        continue;
                    }
                    var j = k + 1;
                    while (j < e and !layout.bitTest(words, j)) j += 1;
                    s.todo.append(gpa, .{ k, j }) catch return error.OutOfMemory;
                    k = j;
                }
            } else s.theirs.append(gpa, .{ b, e }) catch return error.OutOfMemory;
            b = e;
        }
    }
}

/// Reserves blocks [b0, b1) of `f` for this thread: true (locked) when no
/// thread of this process and no other process holds any of them, else null.
fn tryReserve(r: *Replica, f: File, b0: u64, b1: u64) Error!?bool {
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    if (r.reservedOverlap(f, b0, b1)) return null;
    r.reserved[@backingInt(f)].ensureUnusedCapacity(r.cache.gpa, 1) catch return error.OutOfMemory;
    if (!try files.lockRange(r.lockFd(f), b0, b1 - b0)) return null;
    r.reserved[@backingInt(f)].appendAssumeCapacity(.{ b0, b1 });
    return true;
}

fn unreserve(r: *Replica, f: File, b0: u64, b1: u64) void {
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    files.unlockRange(r.lockFd(f), b0, b1 - b0);
    const list = &r.reserved[@backingInt(f)];
    for (list.items, 0..) |x, j| {
        if (x[0] == b0 and x[1] == b1) {
            _ = list.swapRemove(j);
            return;
        }
    }
}

/// Waits (polling, with backoff) until blocks [b0, b1) can be reserved;
/// after `fetch_wait_ms` (a stuck fetcher) takes them unreserved (false):
/// the same bytes, fetched again.
fn waitReserve(r: *Replica, f: File, b0: u64, b1: u64) Error!?bool {
    const deadline_ms = r.cache.policy.fetch_wait_ms;
    var waited_ms: u64 = 0;
    var delay_ms: u64 = 1;
    while (true) {
        if (try tryReserve(r, f, b0, b1)) |locked| return locked;
        if (waited_ms >= deadline_ms) return false;
        sleepMs(delay_ms);
        waited_ms += delay_ms;
        delay_ms = @min(50, delay_ms * 2);
    }
}

fn sleepMs(ms: u64) void {
    const ts: std.c.timespec = .{
        .sec = @intCast(ms / 1000),
        .nsec = @intCast((ms % 1000) * 1_000_000),
    };
    _ = std.c.nanosleep(&ts, null);
}

/// The step's requests: missing runs closer than `max_gap` merged into one
/// request of at most `request_max` bytes (the gap read and dropped),
/// longer runs split.
fn buildRequests(r: *Replica, s: *Step, f: File) Error!void {
    const gpa = r.cache.gpa;
    const sh = r.shift(f);
    const size = r.fileSize(f);
    const gap = r.cache.policy.max_gap;
    const max = s.request_max;
    assert(max >= 512);
    for (s.todo.items) |run| {
        var lo = run[0] << sh;
        const hi = @min(run[1] << sh, size);
        assert(lo < hi);
        const n = s.starts.items.len;
        if (n != 0 and lo - s.ends.items[n - 1] <= gap and hi - s.starts.items[n - 1] <= max) {
            s.ends.items[n - 1] = hi;
            try appendKeep(gpa, s, n - 1, lo, hi);
            continue;
        }
        while (hi - lo > max) : (lo += max) {
            try appendRequest(gpa, s, lo, lo + max);
        }
        try appendRequest(gpa, s, lo, hi);
    }
}

fn appendRequest(gpa: std.mem.Allocator, s: *Step, lo: u64, hi: u64) Error!void {
    s.starts.append(gpa, lo) catch return error.OutOfMemory;
    s.ends.append(gpa, hi) catch return error.OutOfMemory;
    try appendKeep(gpa, s, s.starts.items.len - 1, lo, hi);
}

fn appendKeep(gpa: std.mem.Allocator, s: *Step, request: u64, lo: u64, hi: u64) Error!void {
    s.keep_request.append(gpa, request) catch return error.OutOfMemory;
    s.keep_lo.append(gpa, lo) catch return error.OutOfMemory;
    s.keep_hi.append(gpa, hi) catch return error.OutOfMemory;
}

/// Allocates the keeps' bytes where the file system needs it (a mapped
/// hole of a full tmpfs faults); a full one punches what it allocated and
/// returns the bytes the step needs (null: done).
fn preallocate(r: *Replica, s: *Step, f: File) ?u64 {
    if (!r.cache.preallocate) return null;
    const fd = r.fileFd(f);
    for (s.keep_lo.items, s.keep_hi.items, 0..) |lo, hi, k| {
        switch (files.allocate(fd, lo, hi - lo)) {
            .SUCCESS => {},
            .NOSPC, .DQUOT => {
                for (s.keep_lo.items[0 .. k + 1], s.keep_hi.items[0 .. k + 1]) |a, b|
                    punchUnmarked(r, f, a, b);
                var need: u64 = 0;
                for (s.keep_lo.items, s.keep_hi.items) |a, b| need += b - a;
                return need;
            },
            else => {}, // (a write that fails names it)
        }
    }
    return null;
}

/// Punches bytes [lo, hi) of file `f` that no block marks present: what a
/// fetch that failed was to write (nothing of it is marked, so nothing
/// else would ever free it). Blocks marked meanwhile (another fetcher's,
/// after a wait that ran out) keep their bytes.
fn punchUnmarked(r: *Replica, f: File, lo: u64, hi: u64) void {
    assert(lo < hi);
    const sh = r.shift(f);
    const words = r.bits(f);
    var b = lo >> sh;
    const last = ((hi - 1) >> sh) + 1;
    while (b < last) {
        if (layout.bitTest(words, b)) {
            b += 1;
            continue;
        }
        var e = b + 1;
        while (e < last and !layout.bitTest(words, e)) e += 1;
        const a = @max(lo, b << sh);
        files.punch(r.fileFd(f), a, @min(hi, e << sh) - a, false);
        b = e;
    }
}

/// The NoSpace error of a fetch of `need` bytes of `f` that found the
/// cache's file system full.
fn noSpace(r: *Replica, need: u64, f: File, e: std.posix.E) Error {
    const c = r.cache;
    const free: i64 = if (files.freeSpace(c.root.handle)) |sp| @intCast(sp.free) else -1;
    var lb: [64]u8 = undefined;
    const limit = if (c.policy.limit != 0)
        // (a u64 is at most 20 digits)
        std.fmt.bufPrint(&lb, "cache_limit {d} bytes", .{c.policy.limit}) catch unreachable
    else
        "no cache_limit";
    const why = "{s}: the cache's file system is full ({s}): {d} bytes of a replica's {s} " ++
        "do not fit in {d} bytes free ({s}; the cache holds {d} bytes, and what is being read " ++
        "is never evicted); free space, set a cache_limit below the file system's size, or " ++
        "read smaller batches";
    return diag.fail(error.NoSpace, why, .{
        c.root_path, files.errnoText(e),                         need, @tagName(f), free,
        limit,       @atomicLoad(u64, &c.head.used, .monotonic),
    });
}

/// "LXPLAN01" read as a little-endian u64.
const plan_canary: u64 = 0x31304E414C50584C;

/// The plan fetch `f` points at, checked (null: none, or not a live plan).
fn planOf(f: *const Fetch) ?*Plan {
    const p: *Plan = @ptrCast(@alignCast(f.plan orelse return null));
    return if (p.canary == plan_canary) p else null;
}

/// This step's ranges landed in the files (lx_fetch_landed): their blocks
/// are marked present (under the lock, counted against the limit, which
/// may evict), released, and the plan moves on: blocks another fetcher
/// held are waited for, then the next stage.
pub fn landed(f: *Fetch) Error!void {
    const p = planOf(f) orelse
        return diag.fail(error.InvalidArgument, "the fetch has no step to land", .{});
    const r = p.r;
    f.plan = null;
    errdefer p.destroy();
    try mark(r, p);
    p.release();
    for (&p.steps, 0..) |*s, k| {
        const got = s.bytes();
        _ = r.fetched.fetchAdd(got, .monotonic);
        if (k == 1) _ = r.fetched_data.fetchAdd(got, .monotonic);
    }
    p.clearStep();
    try advance(r, p, f);
}

/// Waits for the runs another fetcher held in this step and plans what is
/// still missing of them; false when there were none.
fn takeTheirs(r: *Replica, p: *Plan) Error!bool {
    var any = false;
    for (&p.steps, 0..) |*s, k| {
        if (s.theirs.items.len == 0) continue;
        any = true;
        s.want.appendSlice(r.cache.gpa, s.theirs.items) catch return error.OutOfMemory;
        s.theirs.clearRetainingCapacity();
        try prepare(r, p, @fromBackingInt(@intCast(k)), true);
    }
    return any;
}

/// Marks the step's fetched blocks present (under the cache's lock) and
/// counts them; data may evict (Warn bits into the plan's flags).
fn mark(r: *Replica, p: *Plan) Error!void {
    const c = r.cache;
    try c.lock();
    defer c.unlock();
    var added: u64 = 0;
    for (&p.steps, 0..) |*s, k| {
        const f: File = @fromBackingInt(@intCast(k));
        const words = r.bits(f);
        const sh = r.shift(f);
        for (s.todo.items) |run| {
            assert(run[0] < run[1]);
            assert(run[1] <= r.blockCount(f));
            const w0: usize = @intCast(run[0] >> 6);
            const w1: usize = @intCast(((run[1] - 1) >> 6) + 1);
            const before = layout.footprint(words[w0..w1], sh);
            layout.bitsSet(words, run[0], run[1]);
            const after = layout.footprint(words[w0..w1], sh);
            assert(after >= before);
            assert(layout.bitTest(words, run[0]) and layout.bitTest(words, run[1] - 1));
            added += after - before;
        }
    }
    _ = @atomicRmw(u64, &c.head.used, .Add, added, .monotonic);
    if (p.steps[1].todo.items.len != 0) p.flags |= try c.maybeEvict();
}

/// This step's fetch failed (lx_fetch_failed): every range it was to write
/// is punched (nothing of it is marked, so nothing else would ever free
/// it) and its reservations released. A full disk (`err` ENOSPC or
/// EDQUOT) makes room and plans the step again, once (status ranges);
/// then it is a NoSpace error. Anything else ends the fetch (status done,
/// for the caller's own error).
pub fn failed(f: *Fetch, err: c_int) Error!void {
    if (f.plan == null) return;
    const p = planOf(f) orelse
        return diag.fail(error.InvalidArgument, "the fetch's state is not a plan", .{});
    const r = p.r;
    f.plan = null;
    f.status = Status.done;
    errdefer p.destroy();
    var need: u64 = 0;
    for (&p.steps, 0..) |*s, k| {
        const file: File = @fromBackingInt(@intCast(k));
        for (s.keep_lo.items, s.keep_hi.items) |lo, hi| {
            punchUnmarked(r, file, lo, hi);
            need += hi - lo;
        }
    }
    p.release();
    const e: std.posix.E = if (err > 0 and err < 4096) @fromBackingInt(@intCast(err)) else .SUCCESS;
    const full = e == .NOSPC or e == .DQUOT;
    if (!full) {
        p.destroy();
        return;
    }
    const which: File = if (p.steps[1].keep_lo.items.len != 0) .data else .index;
    if (p.retried) return noSpace(r, need, which, e);
    p.retried = true;
    try r.cache.makeRoom(need);
    for (&p.steps, 0..) |*s, k| {
        for (s.todo.items) |run| s.want.append(r.cache.gpa, run) catch return error.OutOfMemory;
        s.todo.clearRetainingCapacity();
        s.clearRequests();
        if (s.want.items.len != 0) try prepare(r, p, @fromBackingInt(@intCast(k)), false);
    }
    try advance(r, p, f);
}

// ---------------------------------------------------------------- helpers

fn uniqueSorted(items: []u64) usize {
    if (items.len == 0) return 0;
    var n: usize = 1;
    for (items[1..]) |x| {
        if (x != items[n - 1]) {
            items[n] = x;
            n += 1;
        }
    }
    return n;
}

/// Appends sorted unique `blocks` to `out` as runs [first, end).
fn appendRuns(gpa: std.mem.Allocator, out: *std.ArrayList([2]u64), blocks: []const u64) Error!void {
    var k: usize = 0;
    while (k < blocks.len) {
        var j = k + 1;
        while (j < blocks.len and blocks[j] == blocks[j - 1] + 1) j += 1;
        out.append(gpa, .{ blocks[k], blocks[j - 1] + 1 }) catch return error.OutOfMemory;
        k = j;
    }
}

// ---------------------------------------------------------------- tests

const TestBed = @import("cache_make.zig").TestBed;

test "a plan fetches the missing blocks, checks the records and marks them present" {
    for ([_]u64{ 3000, 0 }) |fixed| {
        var t = try TestBed.init(fixed, 400);
        defer t.deinit();
        const r = t.replica;
        const idx = [_]u64{ 5, 399, 0, 5, 200 };
        const tick = try t.read(&idx, 0);
        try std.testing.expect(tick != 0 and t.steps >= 1);
        for (idx) |i| try std.testing.expect(r.isChecked(i));
        try std.testing.expect(!r.isChecked(6) and !r.isChecked(398));
        const sp = r.span(200);
        try std.testing.expect(layout.bitTest(r.dwords, sp[0] >> r.geo.data_shift));
        try std.testing.expect(layout.bitTest(r.ibits, r.indexBlock(200)));
        try std.testing.expect(@atomicLoad(u64, &t.cache.head.used, .monotonic) > 0);
        r.cache.end(tick);
        // Warm: one call, no step, nothing served.
        const bytes = t.bytes;
        const warm = try t.read(&idx, 0);
        try std.testing.expectEqual(bytes, t.bytes);
        r.cache.end(warm);
        r.cache.end((try r.beginWarm(&idx, false)).?);
        // A warm-only start of a record not fetched is a miss and starts nothing.
        var f: Fetch = undefined;
        try begin(r, &.{ 5, 7 }, Begin.warm_only, &f);
        try std.testing.expectEqual(Status.miss, f.status);
        try std.testing.expectEqual(@as(u32, 0), t.cache.reads.count);
    }
}

test "a step that failed is punched and released; a full disk makes room and plans it again" {
    var t = try TestBed.init(3000, 200);
    defer t.deinit();
    const r = t.replica;
    var f: Fetch = undefined;
    try begin(r, &.{ 10, 11, 150 }, 0, &f);
    try std.testing.expectEqual(Status.ranges, f.status);
    try t.serve(&f); // the bytes are written, then the fetch fails
    try failed(&f, @backingInt(std.posix.E.IO));
    try std.testing.expectEqual(Status.done, f.status);
    try std.testing.expect(f.plan == null);
    try std.testing.expectEqual(@as(usize, 0), r.reserved[0].items.len + r.reserved[1].items.len);
    try std.testing.expect(!layout.bitTest(r.dwords, @as(u64, 10 * 3000) >> r.geo.data_shift));
    var back: [3000]u8 = undefined;
    _ = std.c.pread(r.fds[1], &back, back.len, 10 * 3000);
    for (back) |b| try std.testing.expectEqual(@as(u8, 0), b); // punched: zeros again
    r.cache.end(f.tick);
    // A full disk: room made, the same step planned again (once).
    try begin(r, &.{ 10, 11 }, 0, &f);
    try failed(&f, @backingInt(std.posix.E.NOSPC));
    try std.testing.expectEqual(Status.ranges, f.status);
    try std.testing.expectError(error.NoSpace, failed(&f, @backingInt(std.posix.E.NOSPC)));
    r.cache.end(f.tick);
}

test "a record whose bytes fail its check is fetched again, then named" {
    var t = try TestBed.init(0, 100);
    defer t.deinit();
    t.garbage = true;
    var f: Fetch = undefined;
    try begin(t.replica, &.{ 7, 8 }, 0, &f);
    const e = while (f.status == Status.ranges) {
        try t.serve(&f);
        landed(&f) catch |e| break e;
    } else error.TestUnexpectedResult;
    try std.testing.expectEqual(error.Corrupt, e);
    try std.testing.expect(f.flags & bad_record_flag != 0 and f.bad_record == 7);
    try std.testing.expect(t.steps >= 3); // the index, the data, the data again
    t.cache.end(f.tick);
    t.garbage = false; // the server's bytes, good this time
    t.cache.end(try t.read(&.{ 7, 8 }, 0));
    try std.testing.expect(t.replica.isChecked(7) and t.replica.isChecked(8));
}

test "the whole index comes in rounds; then a batch's step is its data only" {
    var t = try TestBed.init(0, 300);
    defer t.deinit();
    _ = try t.read(&.{}, Begin.whole_index);
    try std.testing.expectEqual(@as(u64, 0), t.replica.indexMissingBytes());
    const steps = t.steps;
    t.cache.end(try t.read(&.{ 3, 250 }, 0));
    try std.testing.expectEqual(steps + 1, t.steps);
}
