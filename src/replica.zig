//! The hot path of a read through the node-local cache of a remote store
//! (loaderx/_cache.py owns the cache; docs/remote.md): the warm part of
//! `Binding.begin`, in one pass over a batch instead of a dozen numpy calls.
//!
//! For each record of the batch it finds the cache regions its bytes touch
//! (a region is 2^region_shift bytes of the store's data), stamps them with
//! the read's tick (`atime`, and `ptime` for a prefetch, which eviction
//! reads to keep what a reader uses), and reports the records this process
//! has not checked yet (a clear bit in `checked`). Python holds the cache's
//! lock around the call; the arrays are the cache's shared state file and
//! the replica's own bitmap, which Python sized for the store.
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
    const end = @min(@max(offset +| stored +| aux, start), lay.data_size);
    return .{ start, end };
}

pub const entry_size = 32;

pub const Error = error{ InvalidArgument, LockFailed, Unsupported };

/// A watermark slot with no read (or prefetch) in it.
pub const none: u64 = std.math.maxInt(u64);

/// The read's place in the cache's shared state (the state file's head and
/// this process's watermark slot, as loaderx/_cache.py maps them).
pub const Clock = struct {
    /// The cache's lock file, taken with flock around the read's start; null
    /// when the caller holds it already.
    lock_fd: ?c_int,
    /// The cache's global tick (the state file's head word 2).
    tick: *u64,
    /// This process's watermark of reads in flight, or of prefetches kept.
    watermark: *u64,
};

/// Starts a read under the cache's lock: the next tick; the process's
/// watermark set to it when the process has no read (or prefetch) in the
/// slot yet (otherwise it is already older, and keeps the regions of every
/// newer tick); then `touch`. Eviction runs under the same lock and keeps
/// every region stamped at or after the oldest watermark, so the records'
/// regions are safe from the moment the lock is released. Returns the tick.
pub fn begin(
    clock: Clock,
    lay: Layout,
    records: []const u64,
    atime: []u64,
    ptime: ?[]u64,
    checked: []const u8,
    unchecked: []u64,
    unchecked_count: *usize,
) Error!u64 {
    if (clock.lock_fd) |fd| try flock(fd, std.posix.LOCK.EX);
    defer if (clock.lock_fd) |fd| flock(fd, std.posix.LOCK.UN) catch {};
    const tick = clock.tick.* + 1;
    clock.tick.* = tick;
    if (clock.watermark.* == none) clock.watermark.* = tick;
    unchecked_count.* = try touch(lay, records, atime, ptime, tick, checked, unchecked);
    return tick;
}

fn flock(fd: c_int, op: c_int) Error!void {
    if (builtin.os.tag == .windows) return error.Unsupported;
    while (std.c.flock(fd, op) != 0) {
        if (std.posix.errno(@as(c_int, -1)) != .INTR) return error.LockFailed;
    }
}

/// Stamps the regions of `records` with `tick` (in `atime`, and in `ptime`
/// when given) and writes the records whose `checked` bit is clear to
/// `unchecked`, in batch order; returns their number. Records outside the
/// store (a negative index seen as a u64 among them) are skipped (the read
/// that follows names them). A region beyond
/// `atime` is an InvalidArgument: the arrays do not match the layout.
pub fn touch(
    lay: Layout,
    records: []const u64,
    atime: []u64,
    ptime: ?[]u64,
    tick: u64,
    checked: []const u8,
    unchecked: []u64,
) Error!usize {
    std.debug.assert(unchecked.len >= records.len);
    if (lay.fixed == 0 and lay.entries.len < lay.record_count * entry_size)
        return error.InvalidArgument;
    if (checked.len * 8 < lay.record_count) return error.InvalidArgument;
    var n: usize = 0;
    for (records) |record| {
        if (record >= lay.record_count) continue;
        const s = span(lay, record);
        const first = s[0] >> lay.region_shift;
        const last = (@max(s[1], s[0] + 1) - 1) >> lay.region_shift;
        if (last >= atime.len) return error.InvalidArgument;
        if (ptime) |p| if (last >= p.len) return error.InvalidArgument;
        for ([_]u64{ first, last }) |region| {
            atime[@intCast(region)] = tick;
            if (ptime) |p| p[@intCast(region)] = tick;
        }
        if (checked[@intCast(record >> 3)] >> @intCast(record & 7) & 1 == 0) {
            unchecked[n] = record;
            n += 1;
        }
    }
    return n;
}

test "touch stamps the first and last region of each record and lists the unchecked" {
    // Records of 3000 B, regions of 4 KiB: record 1 spans regions 0 and 1.
    const lay = Layout{
        .record_count = 10,
        .fixed = 3000,
        .entries = &.{},
        .data_size = 30000,
        .region_shift = 12,
    };
    var atime: [8]u64 = @splat(0);
    var checked = [_]u8{ 0b0000_0010, 0 }; // record 1 checked
    var out: [4]u64 = undefined;
    const n = try touch(lay, &.{ 1, 9, std.math.maxInt(u64), 10 }, &atime, null, 7, &checked, &out);
    try std.testing.expectEqual(@as(usize, 1), n);
    try std.testing.expectEqual(@as(u64, 9), out[0]);
    // 1: bytes 3000..6000 -> regions 0, 1; 9: 27000..30000 -> regions 6, 7.
    try std.testing.expectEqualSlices(u64, &.{ 7, 7, 0, 0, 0, 0, 7, 7 }, &atime);
}

test "touch reads a table layout's entries, clamps them, and refuses short arrays" {
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
    const lay = Layout{
        .record_count = 3,
        .fixed = 0,
        .entries = &entries,
        .data_size = 8192,
        .region_shift = 12,
    };
    var atime = [_]u64{ 0, 0, 0 };
    var ptime = [_]u64{ 0, 0, 0 };
    const checked = [_]u8{0};
    var out: [3]u64 = undefined;
    const n = try touch(lay, &.{ 1, 2 }, &atime, &ptime, 3, &checked, &out);
    try std.testing.expectEqual(@as(usize, 2), n);
    try std.testing.expectEqualSlices(u64, &.{ 0, 3, 3 }, &atime);
    try std.testing.expectEqualSlices(u64, &.{ 0, 3, 3 }, &ptime);
    var short = [_]u64{0};
    const too_short = touch(lay, &.{2}, &short, null, 1, &checked, &out);
    try std.testing.expectError(error.InvalidArgument, too_short);
    const bad = Layout{
        .record_count = 3,
        .fixed = 0,
        .entries = entries[0..64],
        .data_size = 8192,
        .region_shift = 12,
    };
    const no_entries = touch(bad, &.{0}, &atime, null, 1, &checked, &out);
    try std.testing.expectError(error.InvalidArgument, no_entries);
}

test "begin takes the next tick and sets the watermark only when the slot is empty" {
    const lay = Layout{
        .record_count = 4,
        .fixed = 4096,
        .entries = &.{},
        .data_size = 16384,
        .region_shift = 12,
    };
    var atime: [4]u64 = @splat(0);
    const checked = [_]u8{0b1111};
    var out: [2]u64 = undefined;
    var n: usize = 99;
    var tick: u64 = 41;
    var mark: u64 = none;
    const clock = Clock{ .lock_fd = null, .tick = &tick, .watermark = &mark };
    const first = try begin(clock, lay, &.{ 2, 3 }, &atime, null, &checked, &out, &n);
    try std.testing.expectEqual(@as(u64, 42), first);
    try std.testing.expectEqual(@as(usize, 0), n);
    try std.testing.expectEqual(@as(u64, 42), mark);
    try std.testing.expectEqualSlices(u64, &.{ 0, 0, 42, 42 }, &atime);
    // A second read while the first is in flight: the older watermark stays.
    const second = try begin(clock, lay, &.{0}, &atime, null, &checked, &out, &n);
    try std.testing.expectEqual(@as(u64, 43), second);
    try std.testing.expectEqual(@as(u64, 42), mark);
    try std.testing.expectEqualSlices(u64, &.{ 43, 0, 42, 42 }, &atime);
}

test "begin takes and releases the lock file" {
    if (builtin.os.tag == .windows) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    var flags: std.posix.O = .{ .ACCMODE = .RDWR, .CREAT = true, .CLOEXEC = true };
    _ = &flags;
    const fd = std.c.openat(tmp.dir.handle, "lock", flags, @as(std.posix.mode_t, 0o644));
    try std.testing.expect(fd >= 0);
    defer _ = std.c.close(fd);
    const lay = Layout{
        .record_count = 1,
        .fixed = 8,
        .entries = &.{},
        .data_size = 8,
        .region_shift = 12,
    };
    var atime: [1]u64 = @splat(0);
    const checked = [_]u8{0};
    var out: [1]u64 = undefined;
    var n: usize = 0;
    var tick: u64 = 0;
    var mark: u64 = none;
    const clock = Clock{ .lock_fd = fd, .tick = &tick, .watermark = &mark };
    _ = try begin(clock, lay, &.{0}, &atime, null, &checked, &out, &n);
    try std.testing.expectEqual(@as(usize, 1), n);
    // Released: another descriptor of the file takes it at once.
    const other = std.c.openat(tmp.dir.handle, "lock", flags, @as(std.posix.mode_t, 0o644));
    defer _ = std.c.close(other);
    const taken = std.c.flock(other, std.posix.LOCK.EX | std.posix.LOCK.NB);
    try std.testing.expectEqual(@as(c_int, 0), taken);
}
