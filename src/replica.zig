//! The hot path of a read through the node-local cache of a remote store
//! (loaderx/_cache.py owns the cache; docs/remote.md): the start and the end
//! of a read, in one native call each and without the cache's lock.
//!
//! For each record of a read it finds the cache regions its bytes touch (a
//! region is 2^region_shift bytes of the store's data), stamps them with the
//! read's tick (`atime`, and `ptime` for a prefetch, which eviction reads to
//! keep what a reader uses), and reports the records this process has not
//! checked since the replica's last eviction (a clear bit in `checked`).
//!
//! The protocol that keeps eviction off the regions a read uses, lock-free
//! on the read side. Eviction runs under the cache's lock (flock) and makes
//! the cache's eviction sequence odd (`evicting`) before it reads a
//! watermark or a stamp, and even again once every region it dropped is
//! counted in its replica's eviction count. A read (`begin`):
//!   1. takes the next tick and publishes its process's watermark (the
//!      oldest tick of the process's reads in flight) in the process's slot;
//!   2. stamps its regions with the tick (never lowering a stamp);
//!   3. reads the sequence (a read-modify-write: ordered after 1 and 2).
//! An eviction that makes the sequence odd after 3 sees the watermark and
//! the stamps of 1 and 2, and keeps the regions. One that made it odd
//! before 3 either still runs (odd at 3: the read waits for it under the
//! lock) or is over and counted (even at 3: the eviction count differs
//! from the one the process's checked bits belong to, so every record is
//! unchecked, and Python fetches what is missing and checks it). A process
//! killed while evicting leaves the sequence odd: the next read that sees
//! it takes the lock, which the dead process no longer holds, and makes it
//! even. The caller orders its own threads (loaderx holds the process's
//! thread lock around `begin` and `end`).
const std = @import("std");
const builtin = @import("builtin");

/// A store's record layout, as the cache sees it.
pub const Layout = struct {
    record_count: u64,
    /// Bytes of every record (a raw dense store), or 0: then `entries` holds
    /// each record's 32-byte index entry.
    fixed: u64,
    entries: []const u8,
    data_size: u64,
    region_shift: u6,
};

/// Where a record's bytes lie in the data, `[start, end)`, clamped to the
/// data (a damaged entry must not stamp outside it: it fails its check).
fn span(lay: Layout, record: u64) [2]u64 {
    if (lay.fixed != 0) {
        const start = record * lay.fixed;
        return .{ start, start + lay.fixed };
    }
    const e = lay.entries[record * entry_size ..][0..entry_size];
    const offset = std.mem.readInt(u64, e[0..8], .little);
    const stored = std.mem.readInt(u64, e[8..16], .little);
    const aux = std.mem.readInt(u16, e[30..32], .little);
    const start = @min(offset, lay.data_size);
    const stop = @min(@max(offset +| stored +| aux, start), lay.data_size);
    return .{ start, stop };
}

pub const entry_size = 32;

pub const Error = error{ InvalidArgument, LockFailed, Unsupported, Busy };

/// A watermark slot with no read (or prefetch) in it.
pub const none: u64 = std.math.maxInt(u64);

/// Reads one process may have in flight through one cache at once.
pub const max_reads = 256;
/// Prefetches a process keeps protected from eviction (the loader reads
/// each prefetched step within this many later prefetches).
pub const pin_calls = 128;

/// One replica, as the start of a read through it needs it (C:
/// lx_replica_t; loaderx/_cache.py fills it once per replica and process).
pub const Replica = extern struct {
    record_count: u64,
    /// Bytes of every record, or 0: a table layout, `entries` holds them.
    fixed: u64,
    entries: ?[*]const u8,
    data_size: u64,
    region_shift: u32,
    _reserved: u32,
    /// The regions' last read and last prefetch ticks (the replica's state file).
    atime: ?[*]u64,
    ptime: ?[*]u64,
    regions: u64,
    /// One bit per record: checked by this process since `checked_at`.
    checked: ?[*]u8,
    /// The replica's eviction count (its state file).
    evictions: ?*u64,
    /// The eviction count `checked` belongs to.
    checked_at: u64,

    fn layout(r: *const Replica) Error!Layout {
        if (r.region_shift > 63 or r.atime == null or r.ptime == null or r.checked == null or
            r.evictions == null) return error.InvalidArgument;
        const table = r.fixed == 0 and r.record_count != 0;
        if (table and r.entries == null) return error.InvalidArgument;
        return .{
            .record_count = r.record_count,
            .fixed = r.fixed,
            .entries = if (table) r.entries.?[0..@intCast(r.record_count * entry_size)] else &.{},
            .data_size = r.data_size,
            .region_shift = @intCast(r.region_shift),
        };
    }
};

/// One process's reads through one cache (C: lx_reads_t; one per process,
/// made again in a forked child).
pub const Reads = extern struct {
    /// The cache's global tick (its state file's head word 2).
    tick: ?*u64,
    /// The cache's eviction sequence (head word 4): odd while an eviction runs.
    seq: ?*u64,
    /// This process's slot: the oldest read in flight, the oldest prefetch kept.
    marks: ?[*]u64,
    /// The cache's lock file, for the rare read that meets an eviction.
    lock_fd: c_int,
    /// Reads in flight (`active[0..reads]`).
    reads: u32,
    /// The prefetches kept, oldest first: `pins[(first + i) % pin_calls]`.
    pins_first: u32,
    pins_kept: u32,
    /// Held around every change of the fields above and `active`/`pins`
    /// (a spin lock: each holds it for a few instructions).
    lock: u32,
    _reserved: u32,
    active: [max_reads]u64,
    pins: [pin_calls]u64,
};

fn lockReads(p: *Reads) void {
    while (@cmpxchgWeak(u32, &p.lock, 0, 1, .acquire, .monotonic) != null) {
        std.Thread.yield() catch {};
    }
}

fn unlockReads(p: *Reads) void {
    @atomicStore(u32, &p.lock, 0, .release);
}

/// Takes the next tick and records it among the process's reads in flight
/// (or kept prefetches, with `pin`), publishing the watermark: step 1.
fn publish(p: *Reads, tick_word: *u64, marks: [*]u64, pin: bool) Error!u64 {
    lockReads(p);
    defer unlockReads(p);
    if (!pin and p.reads >= max_reads) return error.Busy;
    const tick = @atomicRmw(u64, tick_word, .Add, 1, .seq_cst) +% 1;
    if (pin) {
        if (p.pins_kept == pin_calls) {
            p.pins_first = (p.pins_first + 1) % pin_calls;
            p.pins_kept -= 1;
        }
        p.pins[(p.pins_first + p.pins_kept) % pin_calls] = tick;
        p.pins_kept += 1;
        // The oldest kept prefetch: lowered only from `none` (a new tick is
        // newer than any kept), raised as the oldest is dropped.
        @atomicStore(u64, &marks[1], p.pins[p.pins_first], .seq_cst);
    } else {
        p.active[p.reads] = tick;
        p.reads += 1;
        if (@atomicLoad(u64, &marks[0], .seq_cst) == none)
            @atomicStore(u64, &marks[0], tick, .seq_cst);
    }
    return tick;
}

/// Steps 1 to 3 of a read (see the file's comment): the tick, recorded and
/// published; the stamps; then whether the eviction sequence is odd (an
/// eviction runs, or died running). A read, not a prefetch, is left in
/// flight only when it returns.
const Started = struct { tick: u64, lay: Layout, evicting: bool };

fn startRead(p: *Reads, r: *Replica, records: []const u64, pin: bool) Error!Started {
    const lay = try r.layout();
    const tick_word = p.tick orelse return error.InvalidArgument;
    const seq = p.seq orelse return error.InvalidArgument;
    const marks = p.marks orelse return error.InvalidArgument;
    const regions: usize = @intCast(r.regions);
    // 1. The tick, and the watermark before any stamp.
    const tick = try publish(p, tick_word, marks, pin);
    errdefer if (!pin) end(p, tick);
    // 2. The stamps.
    try stamp(lay, records, r.atime.?[0..regions], if (pin) r.ptime.?[0..regions] else null, tick);
    // 3. The sequence, read after 1 and 2 (a read-modify-write orders it).
    const odd = @atomicRmw(u64, seq, .Add, 0, .seq_cst) & 1 != 0;
    return .{ .tick = tick, .lay = lay, .evicting = odd };
}

fn isChecked(checked: []const u8, record: u64) bool {
    return checked[@intCast(record >> 3)] >> @intCast(record & 7) & 1 != 0;
}

/// A warm read's start, all or nothing: as `begin` without `pin`, when every
/// record of `records` in the store is checked and no eviction runs or ran
/// since the checks; otherwise (a miss) nothing stays in flight and it
/// returns null, for the caller's full `begin`. Any thread may call it at
/// any time: it takes no lock but the spin lock of `p`.
pub fn beginWarm(p: *Reads, r: *Replica, records: []const u64) Error!?u64 {
    // The checked bits first: stamping reads each record's index entry (a
    // table layout), and an unchecked record's entry may be a hole of the
    // sparse replica, which a full tmpfs cannot back (a read of it through
    // the mapping is a SIGBUS). Checked records' entries are on disk (the
    // index is never evicted), so a miss touches no mapping at all.
    const lay = try r.layout();
    if (listUnchecked(lay, records, r.checked.?[0..@intCast(checkedBytes(lay))], null) != 0)
        return null;
    const s = startRead(p, r, records, false) catch |e| switch (e) {
        error.Busy => return null,
        else => return e,
    };
    const checked = r.checked.?[0..@intCast(checkedBytes(s.lay))];
    if (s.evicting or @atomicLoad(u64, r.evictions.?, .seq_cst) != r.checked_at or
        listUnchecked(s.lay, records, checked, null) != 0)
    {
        end(p, s.tick);
        return null;
    }
    return s.tick;
}

/// Starts a read of `records` through replica `r` (see the file's comment):
/// its tick, recorded among the process's reads in flight (or, with `pin`,
/// among its kept prefetches, the oldest of which `pin_calls` later
/// prefetches drop); the watermarks; the stamps; then the records this
/// process has not checked, in batch order, written to `unchecked` (their
/// number returned in `unchecked_count`). `locked`: the caller holds the
/// cache's lock already. Records outside the store are skipped (the read
/// that follows names them). Returns the tick, for `end`.
pub fn begin(
    p: *Reads,
    r: *Replica,
    records: []const u64,
    pin: bool,
    locked: bool,
    unchecked: []u64,
    unchecked_count: *usize,
) Error!u64 {
    const s = try startRead(p, r, records, pin);
    errdefer if (!pin) end(p, s.tick);
    if (s.evicting) {
        // An eviction runs (or died running): wait for it under the lock.
        const seq = p.seq.?;
        if (!locked) try flock(p.lock_fd, std.posix.LOCK.EX);
        defer if (!locked) flock(p.lock_fd, std.posix.LOCK.UN) catch {};
        if (@atomicLoad(u64, seq, .seq_cst) & 1 != 0) _ = @atomicRmw(u64, seq, .Add, 1, .seq_cst);
    }
    const checked = r.checked.?[0..@intCast(checkedBytes(s.lay))];
    const ev = @atomicLoad(u64, r.evictions.?, .seq_cst);
    if (ev != r.checked_at) {
        @memset(checked, 0);
        r.checked_at = ev;
    }
    unchecked_count.* = listUnchecked(s.lay, records, checked, unchecked);
    return s.tick;
}

/// The read of `tick` is over: the process's watermark rises to its oldest
/// read still in flight (none left: the slot is empty). A tick that is not
/// in flight (a prefetch's, or one ended already) changes nothing.
pub fn end(p: *Reads, tick: u64) void {
    const marks = p.marks orelse return;
    lockReads(p);
    defer unlockReads(p);
    var i: u32 = 0;
    while (i < p.reads) : (i += 1) {
        if (p.active[i] == tick) break;
    } else return;
    p.reads -= 1;
    p.active[i] = p.active[p.reads];
    var low: u64 = none;
    for (p.active[0..p.reads]) |t| low = @min(low, t);
    @atomicStore(u64, &marks[0], low, .seq_cst);
}

/// An eviction starts or ends (under the cache's lock): the sequence moves
/// to odd, or back to even, with a full barrier (an eviction's loads of
/// watermarks and stamps come after its start).
pub fn evicting(seq: *u64) void {
    _ = @atomicRmw(u64, seq, .Add, 1, .seq_cst);
}

fn checkedBytes(lay: Layout) u64 {
    return (lay.record_count + 7) / 8;
}

fn flock(fd: c_int, op: c_int) Error!void {
    if (builtin.os.tag == .windows) return error.Unsupported;
    while (std.c.flock(fd, op) != 0) {
        if (std.posix.errno(@as(c_int, -1)) != .INTR) return error.LockFailed;
    }
}

/// Raises `slot` to `tick` (never lowers it: reads of two processes stamp a
/// shared region in any order, and the newer must stay).
fn raise(slot: *u64, tick: u64) void {
    var cur = @atomicLoad(u64, slot, .monotonic);
    while (cur < tick) {
        cur = @cmpxchgWeak(u64, slot, cur, tick, .seq_cst, .monotonic) orelse return;
    }
}

/// Stamps every region of `records` with `tick` (in `atime`, and in `ptime`
/// when given). Records outside the store are skipped. A region beyond
/// `atime` is an InvalidArgument: the arrays do not match the layout.
fn stamp(lay: Layout, records: []const u64, atime: []u64, ptime: ?[]u64, tick: u64) Error!void {
    for (records) |record| {
        if (record >= lay.record_count) continue;
        const s = span(lay, record);
        const first = s[0] >> lay.region_shift;
        const last = (@max(s[1], s[0] + 1) - 1) >> lay.region_shift;
        if (last >= atime.len) return error.InvalidArgument;
        // Every region the record's bytes touch: a record of a ragged store
        // can be many times the mean (a region is ~4-8 mean records).
        var region = first;
        while (region <= last) : (region += 1) {
            raise(&atime[@intCast(region)], tick);
            if (ptime) |t| raise(&t[@intCast(region)], tick);
        }
    }
}

/// The records of `records` (in the store) whose `checked` bit is clear:
/// written to `unchecked`, in batch order, and counted; with `unchecked`
/// null, 1 at the first one found (or 0).
fn listUnchecked(lay: Layout, records: []const u64, checked: []const u8, unchecked: ?[]u64) usize {
    if (unchecked) |out| std.debug.assert(out.len >= records.len);
    var n: usize = 0;
    for (records) |record| {
        if (record < lay.record_count and !isChecked(checked, record)) {
            const out = unchecked orelse return 1;
            out[n] = record;
            n += 1;
        }
    }
    return n;
}

/// A replica of `count` records of `fixed` bytes (or of the table
/// `entries`), with the state arrays given, for the tests.
fn testReplica(
    count: u64,
    fixed: u64,
    entries: []const u8,
    data_size: u64,
    shift: u32,
    atime: []u64,
    ptime: []u64,
    checked: []u8,
    evictions: *u64,
) Replica {
    return .{
        .record_count = count,
        .fixed = fixed,
        .entries = if (entries.len != 0) entries.ptr else null,
        .data_size = data_size,
        .region_shift = shift,
        ._reserved = 0,
        .atime = atime.ptr,
        .ptime = ptime.ptr,
        .regions = atime.len,
        .checked = checked.ptr,
        .evictions = evictions,
        .checked_at = evictions.*,
    };
}

/// The cache's clock words and a process's slot, for the tests.
const TestClock = struct {
    tick: u64,
    seq: u64 = 0,
    marks: [2]u64 = .{ none, none },

    fn reads(c: *TestClock, lock_fd: c_int) Reads {
        var p: Reads = undefined;
        p.tick = &c.tick;
        p.seq = &c.seq;
        p.marks = &c.marks;
        p.lock_fd = lock_fd;
        p.reads = 0;
        p.pins_first = 0;
        p.pins_kept = 0;
        p.lock = 0;
        return p;
    }
};

test "begin stamps every region of each record and lists the unchecked" {
    // Records of 3000 B, regions of 4 KiB: record 1 spans regions 0 and 1.
    var atime: [8]u64 = @splat(0);
    var ptime: [8]u64 = @splat(0);
    var checked = [_]u8{ 0b0000_0010, 0 }; // record 1 checked
    var ev: u64 = 0;
    var r = testReplica(10, 3000, &.{}, 30000, 12, &atime, &ptime, &checked, &ev);
    var c = TestClock{ .tick = 6 };
    var p = c.reads(-1);
    var out: [4]u64 = undefined;
    var n: usize = 99;
    const t = try begin(&p, &r, &.{ 1, 9, std.math.maxInt(u64), 10 }, false, true, &out, &n);
    try std.testing.expectEqual(@as(u64, 7), t);
    try std.testing.expectEqual(@as(usize, 1), n);
    try std.testing.expectEqual(@as(u64, 9), out[0]);
    // 1: bytes 3000..6000 -> regions 0, 1; 9: 27000..30000 -> regions 6, 7.
    try std.testing.expectEqualSlices(u64, &.{ 7, 7, 0, 0, 0, 0, 7, 7 }, &atime);
    try std.testing.expectEqualSlices(u64, &(@as([8]u64, @splat(0))), &ptime);
}

test "begin stamps every region of a record many regions long, never lowering a stamp" {
    var entries: [2 * entry_size]u8 = @splat(0);
    const e1 = entries[entry_size..][0..entry_size];
    std.mem.writeInt(u64, e1[0..8], 100, .little); // record 1: 100..13000, regions 0..3
    std.mem.writeInt(u64, e1[8..16], 12900, .little);
    var atime = [_]u64{ 0, 50, 0, 0, 0 };
    var ptime: [5]u64 = @splat(0);
    var checked = [_]u8{0b11};
    var ev: u64 = 0;
    var r = testReplica(2, 0, &entries, 20000, 12, &atime, &ptime, &checked, &ev);
    var c = TestClock{ .tick = 8 };
    var p = c.reads(-1);
    var out: [1]u64 = undefined;
    var n: usize = 0;
    _ = try begin(&p, &r, &.{1}, true, true, &out, &n);
    try std.testing.expectEqual(@as(usize, 0), n);
    // Region 1 was stamped by a newer read of another process: it keeps 50.
    try std.testing.expectEqualSlices(u64, &.{ 9, 50, 9, 9, 0 }, &atime);
    try std.testing.expectEqualSlices(u64, &.{ 9, 9, 9, 9, 0 }, &ptime);
}

test "begin reads a table layout's entries, clamps them, and refuses short arrays" {
    var entries: [3 * entry_size]u8 = @splat(0);
    const put = struct {
        fn f(buf: []u8, i: usize, offset: u64, stored: u64, aux: u16) void {
            const e = buf[i * entry_size ..][0..entry_size];
            std.mem.writeInt(u64, e[0..8], offset, .little);
            std.mem.writeInt(u64, e[8..16], stored, .little);
            std.mem.writeInt(u16, e[30..32], aux, .little);
        }
    }.f;
    put(&entries, 0, 0, 100, 0);
    put(&entries, 1, 5000, 90, 10); // 5000..5100: region 1 (4 KiB regions)
    put(&entries, 2, 1 << 40, 1 << 62, 0); // damaged: clamped to the data's end
    var atime = [_]u64{ 0, 0, 0 };
    var ptime = [_]u64{ 0, 0, 0 };
    var checked = [_]u8{0};
    var ev: u64 = 0;
    var r = testReplica(3, 0, &entries, 8192, 12, &atime, &ptime, &checked, &ev);
    var c = TestClock{ .tick = 2 };
    var p = c.reads(-1);
    var out: [3]u64 = undefined;
    var n: usize = 0;
    _ = try begin(&p, &r, &.{ 1, 2 }, true, true, &out, &n);
    try std.testing.expectEqual(@as(usize, 2), n);
    try std.testing.expectEqualSlices(u64, &.{ 0, 3, 3 }, &atime);
    try std.testing.expectEqualSlices(u64, &.{ 0, 3, 3 }, &ptime);
    r.regions = 1; // the state's arrays shorter than the layout needs
    try std.testing.expectError(error.InvalidArgument, begin(&p, &r, &.{2}, false, true, &out, &n));
    try std.testing.expectEqual(@as(u32, 0), p.reads); // the failed read is not in flight
    r.regions = 3;
    r.entries = null; // a table layout without its entries
    try std.testing.expectError(error.InvalidArgument, begin(&p, &r, &.{0}, false, true, &out, &n));
}

test "the watermarks follow the oldest read in flight and the oldest kept prefetch" {
    var atime: [4]u64 = @splat(0);
    var ptime: [4]u64 = @splat(0);
    var checked = [_]u8{0b1111};
    var ev: u64 = 0;
    var r = testReplica(4, 4096, &.{}, 16384, 12, &atime, &ptime, &checked, &ev);
    var c = TestClock{ .tick = 41 };
    var p = c.reads(-1);
    var out: [2]u64 = undefined;
    var n: usize = 99;
    const a = try begin(&p, &r, &.{ 2, 3 }, false, true, &out, &n);
    try std.testing.expectEqual(@as(u64, 42), a);
    try std.testing.expectEqual(@as(usize, 0), n);
    try std.testing.expectEqual(@as(u64, 42), c.marks[0]);
    const b = try begin(&p, &r, &.{0}, false, true, &out, &n);
    try std.testing.expectEqual(@as(u64, 42), c.marks[0]); // the older read keeps it
    end(&p, a);
    try std.testing.expectEqual(b, c.marks[0]); // rises to the read still in flight
    end(&p, a); // ended already: nothing changes
    try std.testing.expectEqual(b, c.marks[0]);
    end(&p, b);
    try std.testing.expectEqual(none, c.marks[0]);
    // Prefetches: the oldest of the last pin_calls is kept.
    var first: u64 = 0;
    for (0..pin_calls + 3) |i| {
        const t = try begin(&p, &r, &.{1}, true, true, &out, &n);
        if (i == 0) first = t;
        end(&p, t); // a prefetch's tick is not a read in flight: no change
    }
    try std.testing.expectEqual(first + 3, c.marks[1]);
    try std.testing.expectEqual(none, c.marks[0]);
    try std.testing.expectEqual(@as(u32, pin_calls), p.pins_kept);
    // A process with max_reads reads in flight is told so.
    p.reads = max_reads;
    try std.testing.expectError(error.Busy, begin(&p, &r, &.{1}, false, true, &out, &n));
}

test "a read after an eviction lists every record; an odd sequence is waited for and fixed" {
    if (builtin.os.tag == .windows) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    var flags: std.posix.O = .{ .ACCMODE = .RDWR, .CREAT = true, .CLOEXEC = true };
    _ = &flags;
    const fd = std.c.openat(tmp.dir.handle, "lock", flags, @as(std.posix.mode_t, 0o644));
    try std.testing.expect(fd >= 0);
    defer _ = std.c.close(fd);
    var atime: [1]u64 = @splat(0);
    var ptime: [1]u64 = @splat(0);
    var checked = [_]u8{0b1};
    var ev: u64 = 3;
    var r = testReplica(1, 8, &.{}, 8, 12, &atime, &ptime, &checked, &ev);
    var c = TestClock{ .tick = 0 };
    var p = c.reads(fd);
    var out: [1]u64 = undefined;
    var n: usize = 0;
    end(&p, try begin(&p, &r, &.{0}, false, false, &out, &n));
    try std.testing.expectEqual(@as(usize, 0), n);
    // An eviction of this replica since: the checked bits are stale.
    ev = 4;
    evicting(&c.seq);
    evicting(&c.seq);
    end(&p, try begin(&p, &r, &.{0}, false, false, &out, &n));
    try std.testing.expectEqual(@as(usize, 1), n);
    try std.testing.expectEqual(@as(u64, 4), r.checked_at);
    try std.testing.expectEqual(@as(u8, 0), checked[0]);
    // An evictor that died mid-way left the sequence odd: the read takes
    // the lock (free: its holder is gone) and makes it even.
    evicting(&c.seq);
    end(&p, try begin(&p, &r, &.{0}, false, false, &out, &n));
    try std.testing.expectEqual(@as(u64, 4), c.seq);
    // The lock is released: another descriptor of the file takes it at once.
    const other = std.c.openat(tmp.dir.handle, "lock", flags, @as(std.posix.mode_t, 0o644));
    defer _ = std.c.close(other);
    const taken = std.c.flock(other, std.posix.LOCK.EX | std.posix.LOCK.NB);
    try std.testing.expectEqual(@as(c_int, 0), taken);
}

test "a warm read of an unchecked record reads no index entry and stamps nothing" {
    // Record 1's entry names bytes far outside the data: were it read, the
    // stamp would fail (a region past `atime`). A miss must not look at it.
    var entries: [2 * entry_size]u8 = @splat(0);
    std.mem.writeInt(u64, entries[entry_size..][0..8], 1 << 40, .little);
    std.mem.writeInt(u64, entries[entry_size..][8..16], 1 << 40, .little);
    var atime: [1]u64 = @splat(0);
    var ptime: [1]u64 = @splat(0);
    var checked = [_]u8{0b01}; // record 1 unchecked
    var ev: u64 = 0;
    var r = testReplica(2, 0, &entries, 1 << 50, 12, &atime, &ptime, &checked, &ev);
    var c = TestClock{ .tick = 3 };
    var p = c.reads(-1);
    try std.testing.expectEqual(@as(?u64, null), try beginWarm(&p, &r, &.{ 0, 1 }));
    try std.testing.expectEqual(@as(u64, 3), c.tick); // no tick taken
    try std.testing.expectEqual(@as(u64, 0), atime[0]);
    try std.testing.expectEqual(none, c.marks[0]);
}

test "a warm read starts only when every record is checked and no eviction ran or runs" {
    var atime: [4]u64 = @splat(0);
    var ptime: [4]u64 = @splat(0);
    var checked = [_]u8{0b0111}; // record 3 unchecked
    var ev: u64 = 5;
    var r = testReplica(4, 4096, &.{}, 16384, 12, &atime, &ptime, &checked, &ev);
    var c = TestClock{ .tick = 10 };
    var p = c.reads(-1);
    const t = (try beginWarm(&p, &r, &.{ 0, 2, 99 })).?; // 99: outside, skipped
    try std.testing.expectEqual(@as(u64, 11), t);
    try std.testing.expectEqual(t, c.marks[0]);
    try std.testing.expectEqualSlices(u64, &.{ 11, 0, 11, 0 }, &atime);
    end(&p, t);
    try std.testing.expectEqual(none, c.marks[0]);
    // A miss leaves nothing in flight: an unchecked record, an eviction
    // running, an eviction since the checks, a full table of reads.
    try std.testing.expectEqual(@as(?u64, null), try beginWarm(&p, &r, &.{ 0, 3 }));
    evicting(&c.seq);
    try std.testing.expectEqual(@as(?u64, null), try beginWarm(&p, &r, &.{0}));
    evicting(&c.seq);
    ev = 6;
    try std.testing.expectEqual(@as(?u64, null), try beginWarm(&p, &r, &.{0}));
    ev = 5;
    p.reads = max_reads;
    try std.testing.expectEqual(@as(?u64, null), try beginWarm(&p, &r, &.{0}));
    p.reads = 0;
    try std.testing.expectEqual(none, c.marks[0]);
    try std.testing.expectEqual(@as(u32, 0), p.reads);
    try std.testing.expectEqual(@as(u8, 0b0111), checked[0]); // a miss resets nothing
}
