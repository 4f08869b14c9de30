//! Reads over several stores that form one index space: the shards of a
//! ShardSet (one gather splits its indices by shard in one native call) and
//! the streams of a loader's sources. Part k covers indices from `first` up
//! to the next part's `first` (the last part: up to its length); each part's
//! store is read from one snapshot, under a read hold, for the whole call.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const diag = @import("diag.zig");
const Store = @import("Store.zig");
const store_read = @import("store_read.zig");
const store_cold = @import("store_cold.zig");
const Error = Store.Error;
const Snapshot = store_read.Snapshot;

/// A part of an index space (lx_part_t): `store` holds records from `first`.
pub const Part = extern struct {
    store: *Store,
    first: u64,

    comptime {
        assert(@sizeOf(Part) == 16);
        assert(@alignOf(Part) == 8);
    }
};

/// Parts one read may span (their ids are 16-bit).
pub const parts_max: usize = std.math.maxInt(u16);

/// The buffers of multi-part reads, kept by their owner between reads.
pub const Scratch = struct {
    snaps: std.ArrayList(Snapshot) = .empty,
    of: std.ArrayList(u16) = .empty,
    local: std.ArrayList(u64) = .empty,

    pub fn deinit(sc: *Scratch, gpa: Allocator) void {
        sc.snaps.deinit(gpa);
        sc.of.deinit(gpa);
        sc.local.deinit(gpa);
        sc.* = .{};
    }

    /// Bytes its buffers hold.
    pub fn capacityBytes(sc: *const Scratch) usize {
        return sc.snaps.capacity * @sizeOf(Snapshot) + sc.of.capacity * @sizeOf(u16) +
            sc.local.capacity * @sizeOf(u64);
    }
};

/// What a kept scratch may hold between calls (see `ScratchPool`): a call
/// that needed more frees it when it ends.
pub const scratch_keep_bytes: usize = 256 << 10;

/// Scratches kept between C-ABI calls, shared by every thread: a call takes
/// one (a kept one, or a new one), uses it, and gives it back. At most
/// `kept` of at most `scratch_keep_bytes` each stay, owned by the pool, so a
/// thread that exits leaves nothing behind (a thread-local scratch leaked its
/// bytes with every thread that ended). `T` has `capacityBytes` and `deinit`.
pub fn ScratchPool(comptime T: type) type {
    return struct {
        const kept = 8;
        var lock: std.atomic.Mutex = .unlocked;
        var free: [kept]T = undefined;
        var free_len: usize = 0;

        /// A scratch for one call, owned by the caller until `give`.
        pub fn take() T {
            while (!lock.tryLock()) std.atomic.spinLoopHint();
            defer lock.unlock();
            assert(free_len <= kept);
            if (free_len == 0) return .{};
            free_len -= 1;
            return free[free_len];
        }

        /// Ends a call's use of `sc`: kept for the next call when it is small
        /// and the pool has room, freed otherwise.
        pub fn give(sc: *T, gpa: Allocator) void {
            if (sc.capacityBytes() <= scratch_keep_bytes) {
                while (!lock.tryLock()) std.atomic.spinLoopHint();
                defer lock.unlock();
                if (free_len < kept) {
                    free[free_len] = sc.*;
                    free_len += 1;
                    sc.* = .{};
                    return;
                }
            }
            sc.deinit(gpa);
            sc.* = .{};
        }
    };
}

/// The pool of the gathers' and prefetches' scratches.
pub const scratches = ScratchPool(Scratch);

/// Holds a read on every part's store and snapshots them all; `end` gives
/// the holds back. Nothing is held when it fails.
pub fn begin(gpa: Allocator, parts: []const Part, sc: *Scratch) Error![]const Snapshot {
    assert(parts.len >= 1);
    assert(parts.len <= parts_max);
    sc.snaps.resize(gpa, parts.len) catch return error.OutOfMemory;
    var held: usize = 0;
    errdefer for (parts[0..held]) |p| p.store.exitRead();
    for (parts, sc.snaps.items) |p, *snap| {
        if (p.store.isClosed()) {
            return diag.fail(error.Closed, "a store of this read was closed", .{});
        }
        try p.store.enterRead();
        held += 1;
        snap.* = try store_read.snapshot(p.store);
    }
    return sc.snaps.items;
}

pub fn end(parts: []const Part) void {
    for (parts) |p| p.store.exitRead();
}

/// Where `index` of the space lives: (part, index inside it); null when no
/// part holds it.
pub fn find(
    parts: []const Part,
    snaps: []const Snapshot,
    index: u64,
) ?struct { part: u16, local: u64 } {
    assert(parts.len >= 1);
    assert(snaps.len == parts.len);
    var lo: usize = 0;
    var hi: usize = parts.len;
    while (hi - lo > 1) {
        const mid = (lo + hi) / 2;
        if (parts[mid].first <= index) lo = mid else hi = mid;
    }
    if (index < parts[lo].first) return null;
    // The last part that starts at or before `index` (parts sorted by first).
    assert(lo + 1 == parts.len or parts[lo + 1].first > index);
    const local = index - parts[lo].first;
    if (local >= snaps[lo].count) return null;
    return .{ .part = @intCast(lo), .local = local };
}

/// The reads of global `indices` over `parts` (sorted by `first`), their
/// per-record part and local index kept in `sc` (one part from index 0: the
/// indices are the store's own, nothing to map).
pub fn locate(
    gpa: Allocator,
    parts: []const Part,
    snaps: []const Snapshot,
    indices: []const u64,
    sc: *Scratch,
) Error!store_read.Reads {
    assert(snaps.len == parts.len);
    if (single(parts)) return .{ .snaps = snaps, .indices = indices };
    sc.of.resize(gpa, indices.len) catch return error.OutOfMemory;
    sc.local.resize(gpa, indices.len) catch return error.OutOfMemory;
    for (indices, sc.of.items, sc.local.items) |index, *of, *local| {
        const at = find(parts, snaps, index) orelse return outOfRange(parts, snaps, index);
        of.* = at.part;
        local.* = at.local;
    }
    return .{ .snaps = snaps, .of = sc.of.items, .indices = sc.local.items };
}

fn outOfRange(parts: []const Part, snaps: []const Snapshot, index: u64) Error {
    const last = parts.len - 1;
    const end_index = parts[last].first + snaps[last].count;
    return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records ({d} parts)", .{
        index, end_index, parts.len,
    });
}

/// Gathers global `indices` over `parts` into `dest` (see store_read.gather).
pub fn gather(
    gpa: Allocator,
    parts: []const Part,
    indices: []const u64,
    dest: store_read.Dest,
    part: store_read.Part,
    lanes: usize,
    sc: *Scratch,
) Error!void {
    if (indices.len == 0) return;
    const snaps = try begin(gpa, parts, sc);
    defer end(parts);
    const reads = try locate(gpa, parts, snaps, indices, sc);
    try store_read.gatherReads(reads, dest, part, lanes);
}

/// Gathers global `indices` over `parts` into new memory (see
/// store_read.gatherAlloc).
pub fn gatherAlloc(
    gpa: Allocator,
    parts: []const Part,
    indices: []const u64,
    lanes: usize,
    raw_out: []u64,
    aux_out: []u64,
    sc: *Scratch,
) Error![]u8 {
    if (indices.len == 0) return &.{};
    const snaps = try begin(gpa, parts, sc);
    defer end(parts);
    const reads = try locate(gpa, parts, snaps, indices, sc);
    return store_read.packedReads(gpa, reads, lanes, raw_out, aux_out);
}

/// Brings the records at global `indices` over `parts` into memory (see
/// store_cold.prefetch); `force` checks every store, cold or not; `wait`
/// returns once they are in.
pub fn prefetch(
    gpa: Allocator,
    parts: []const Part,
    indices: []const u64,
    force: bool,
    wait: bool,
    sc: *Scratch,
) Error!void {
    if (indices.len == 0) return;
    const snaps = try begin(gpa, parts, sc);
    defer end(parts);
    const reads = try locate(gpa, parts, snaps, indices, sc);
    for (reads.indices, 0..) |index, i| {
        const snap = reads.snap(i);
        if (index >= snap.count) return outOfRangeLocal(index, snap.count);
    }
    const check = gpa.alloc(bool, snaps.len) catch return error.OutOfMemory;
    defer gpa.free(check);
    store_cold.prefetch(reads, force, wait, check);
}

fn outOfRangeLocal(index: u64, count: u64) Error {
    return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records", .{
        index, count,
    });
}

/// One part from index 0: indices are the store's own, nothing to map.
fn single(parts: []const Part) bool {
    return parts.len == 1 and parts[0].first == 0;
}

test "indices map to the part that holds them" {
    const fake: *Store = @ptrFromInt(0x1000);
    const parts = [_]Part{
        .{ .store = fake, .first = 0 },
        .{ .store = fake, .first = 10 },
        .{ .store = fake, .first = 25 },
    };
    var snaps: [3]Snapshot = undefined;
    for (&snaps, [_]u64{ 10, 15, 4 }) |*s, count| s.count = count;
    try std.testing.expectEqual(@as(u64, 3), find(&parts, &snaps, 3).?.local);
    const at = find(&parts, &snaps, 24).?;
    try std.testing.expectEqual(@as(u16, 1), at.part);
    try std.testing.expectEqual(@as(u64, 14), at.local);
    try std.testing.expectEqual(@as(u16, 2), find(&parts, &snaps, 28).?.part);
    try std.testing.expect(find(&parts, &snaps, 29) == null);
}

test "a scratch pool keeps small scratches for the next call and frees the rest" {
    const gpa = std.testing.allocator;
    const pool = ScratchPool(Scratch);
    var a = pool.take();
    try a.local.resize(gpa, 16);
    pool.give(&a, gpa);
    try std.testing.expectEqual(@as(usize, 0), a.local.capacity); // the pool owns it now
    var b = pool.take(); // the kept one, its capacity reused
    try std.testing.expect(b.local.capacity >= 16);
    try b.local.resize(gpa, scratch_keep_bytes); // over the limit: freed, not kept
    pool.give(&b, gpa);
    var c = pool.take();
    try std.testing.expectEqual(@as(usize, 0), c.capacityBytes());
    var more: [10]Scratch = undefined; // more than the pool keeps: the rest freed
    for (&more) |*m| {
        m.* = pool.take();
        try m.local.resize(gpa, 8);
    }
    for (&more) |*m| pool.give(m, gpa);
    pool.give(&c, gpa);
    for (0..pool.kept) |_| { // empty the pool, for the leak check
        var k = pool.take();
        k.deinit(gpa);
    }
}
