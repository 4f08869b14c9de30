//! The node-local cache's files, every byte of them (src/Cache.zig owns the
//! cache and its protocol; this file is to it what format.zig is to a
//! store): the directory, the mapped `state` and each replica's
//! `cache.state`, their structs with each field's offset proved at compile
//! time, a replica's geometry (its block sizes, from its store's shape),
//! and the bitmaps' bit operations and on-disk footprint. tests/_lxlayout.py
//! (the test forger's layouts) carries the structs and constants, generated
//! by `zig build forger-layout` (src/gen_layout.zig).
//!
//! ## The directory
//!
//!   state        `StateHead` at 0 (40 bytes; the rest of page 0 zeros), then
//!                `slots_max` `Slot`s of 16 bytes from 4096 (20480 bytes in
//!                all). Mapped shared by every process using the cache.
//!   lock         empty; its exclusive flock is the cache's lock, held for
//!                short sections only (marking blocks present, eviction,
//!                publishing a replica, housekeeping), never across network
//!                I/O. A process's threads take its mutex first: flock
//!                does not order the threads of one process.
//!   slots.lock   empty; byte k is POSIX-locked (fcntl) by the live process
//!                in slot k: the kernel frees a slot when its process dies,
//!                and `users` asks it who holds which (F_GETLK).
//!   stores/<key>/  a replica (src/Replica.zig): a store directory (meta,
//!                index, data, lock) whose index and data are sparse files of
//!                their full sizes, plus `cache.state`, `index.fetch` and
//!                `data.fetch` (fetch locks: byte b locked = block b being
//!                fetched) and `source.json` (URL and versions, for people).
//!   stores/.tmp-*, .damaged-*   a replica being made, or moved aside.
//!   uploads/<name>/  a conversion's files on their way to a bucket, held by a
//!                shared flock on the directory while in use.
//!   .cleared-*   what an interrupted clear left.
//!
//! ## cache.state (one per replica; `ReplicaGeometry` sizes it)
//!
//!   [0, 4096)    `ReplicaHead` at 0 (80 bytes), then zeros.
//!   4096         the index bitmap: bit b of u64 word w set = index block
//!                64w + b holds the server's bytes; `index_words` words.
//!   then         the data bitmap: one u64 word per region of 64 data blocks.
//!   then         `atime`, a u64 per region: the tick of its last read.
//!   then         `ptime`, a u64 per region: the tick of its last prefetch.
//! The file is allocated whole when it is made: a hole of a full tmpfs read
//! or written through a mapping is a SIGBUS.
//!
//! ## Versions
//!
//! `StateHead.version` 2 (version 1 locked every read and left word 4 all
//! ones: upgraded in place at open). `ReplicaHead.version` 1.
const std = @import("std");
const assert = std.debug.assert;

/// "LXCHE1" read as a little-endian u64.
pub const state_magic: u64 = 0x31454843584C;
pub const state_version: u64 = 2;
/// "LXSTA1" read as a little-endian u64.
pub const replica_magic: u64 = 0x31415453584C;
pub const replica_version: u64 = 1;
pub const page: u64 = 4096;
/// Processes that can use one cache at once.
pub const slots_max = 1024;
pub const state_size: u64 = page + slots_max * @sizeOf(Slot);
/// Data blocks per eviction region: one u64 of the data bitmap.
pub const region_blocks = 64;
/// A watermark with no read (or prefetch) behind it.
pub const none: u64 = std.math.maxInt(u64);
/// A file system allocates whole units of 2^12 bytes (a tmpfs page, an ext4
/// or xfs block): the cache counts a present block as the units it touches.
pub const disk_shift = 12;

/// `state` page 0.
pub const StateHead = extern struct {
    /// 0: `state_magic`.
    magic: u64,
    /// 8: `state_version`.
    version: u64,
    /// 16: the last tick taken (a read's start takes the next).
    tick: u64,
    /// 24: bytes the replicas' present blocks take on disk, in whole units
    /// (`footprint`); kept under the lock, recounted when over the limit.
    used: u64,
    /// 32: the eviction sequence: odd while an eviction runs.
    seq: u64,

    comptime {
        const at = .{ .magic = 0, .version = 8, .tick = 16, .used = 24, .seq = 32 };
        assertLayout(StateHead, 40, at);
    }
};

/// One process's watermarks (`state` from 4096, slot k at 4096 + 16k).
pub const Slot = extern struct {
    /// 0: the tick of its oldest read in flight, or `none`.
    read: u64,
    /// 8: the tick of its oldest kept prefetch, or `none`.
    pin: u64,

    comptime {
        assertLayout(Slot, 16, .{ .read = 0, .pin = 8 });
    }
};

/// `cache.state` page 0: the replica's geometry and its eviction count.
pub const ReplicaHead = extern struct {
    /// 0: `replica_magic`.
    magic: u64,
    /// 8: `replica_version`.
    version: u64,
    /// 16, 24, 32: the store's records, data bytes and fixed record size
    /// (0: the table layout), from its meta.
    record_count: u64,
    data_size: u64,
    fixed_size: u64,
    /// 40, 48: log2 of an index block's and a data block's bytes.
    index_shift: u64,
    data_shift: u64,
    /// 56: index blocks; 64: regions (data bitmap words).
    index_blocks: u64,
    regions: u64,
    /// 72: regions evicted and records dropped, ever: a process's checked
    /// bits belong to one value of it.
    evictions: u64,

    comptime {
        assertLayout(ReplicaHead, 80, .{
            .magic = 0,
            .version = 8,
            .record_count = 16,
            .data_size = 24,
            .fixed_size = 32,
            .index_shift = 40,
            .data_shift = 48,
            .index_blocks = 56,
            .regions = 64,
            .evictions = 72,
        });
    }
};

/// The structs of the cache's files, for the generated test layout.
pub const structs = .{
    .{ "CACHE_HEAD", StateHead },
    .{ "CACHE_SLOT", Slot },
    .{ "REPLICA_HEAD", ReplicaHead },
};

/// A replica's geometry, from its store's shape: blocks about an eighth of
/// a mean record (a random record costs about one block of overfetch), at
/// least 512 B; at most 2^27 data blocks and about 4096 index blocks.
pub const Geometry = struct {
    record_count: u64,
    data_size: u64,
    fixed_size: u64,
    entry_size: u64,
    index_size: u64,
    index_shift: u6,
    data_shift: u6,
    index_blocks: u64,
    data_blocks: u64,
    regions: u64,
    index_words: u64,

    pub fn of(record_count: u64, data_size: u64, fixed_size: u64) Geometry {
        const entry: u64 = if (fixed_size != 0) 4 else 32;
        const index_size = record_count * entry;
        const eighth = if (record_count != 0) data_size / record_count / 8 else 0;
        const dshift = @min(24, @max(9, log2Floor(eighth), log2Ceil(divCeil(data_size, 1 << 27))));
        const want = if (record_count != 0) @min(index_size / 4096, eighth) else 0;
        const ishift = @min(16, @max(9, log2Floor(want)));
        const dblocks = divCeil(data_size, @as(u64, 1) << @intCast(dshift));
        const iblocks = divCeil(index_size, @as(u64, 1) << @intCast(ishift));
        return .{
            .record_count = record_count,
            .data_size = data_size,
            .fixed_size = fixed_size,
            .entry_size = entry,
            .index_size = index_size,
            .index_shift = @intCast(ishift),
            .data_shift = @intCast(dshift),
            .index_blocks = iblocks,
            .data_blocks = dblocks,
            .regions = divCeil(dblocks, region_blocks),
            .index_words = divCeil(iblocks, 64),
        };
    }

    pub fn fromHead(h: *const ReplicaHead) Geometry {
        return of(h.record_count, h.data_size, h.fixed_size);
    }

    /// Whether head `h` describes this geometry.
    pub fn matches(g: Geometry, h: *const ReplicaHead) bool {
        return h.magic == replica_magic and h.version == replica_version and
            h.record_count == g.record_count and h.data_size == g.data_size and
            h.fixed_size == g.fixed_size and h.index_shift == g.index_shift and
            h.data_shift == g.data_shift and h.index_blocks == g.index_blocks and
            h.regions == g.regions;
    }

    pub fn stateSize(g: Geometry) u64 {
        return page + (g.index_words + 3 * g.regions) * 8;
    }

    pub fn head(g: Geometry) ReplicaHead {
        return .{
            .magic = replica_magic,
            .version = replica_version,
            .record_count = g.record_count,
            .data_size = g.data_size,
            .fixed_size = g.fixed_size,
            .index_shift = g.index_shift,
            .data_shift = g.data_shift,
            .index_blocks = g.index_blocks,
            .regions = g.regions,
            .evictions = 0,
        };
    }
};

fn divCeil(a: u64, b: u64) u64 {
    return if (a == 0) 0 else (a - 1) / b + 1;
}

fn log2Floor(x: u64) u64 {
    return if (x == 0) 0 else 63 - @as(u64, @clz(x));
}

fn log2Ceil(x: u64) u64 {
    return if (x <= 1) 0 else 64 - @as(u64, @clz(x - 1));
}

// ---------------------------------------------------------------- bitmaps

pub fn bitTest(words: []const u64, b: u64) bool {
    const w = @atomicLoad(u64, &words[@intCast(b >> 6)], .acquire);
    return w >> @intCast(b & 63) & 1 != 0;
}

/// Sets bits [b0, b1) (under the lock: writers never race).
pub fn bitsSet(words: []u64, b0: u64, b1: u64) void {
    assert(b0 <= b1);
    assert(b1 <= words.len * 64);
    var b = b0;
    while (b < b1) {
        const w: usize = @intCast(b >> 6);
        const lo: u6 = @intCast(b & 63);
        const n = @min(b1 - b, 64 - @as(u64, lo));
        const mask = (if (n == 64) ~@as(u64, 0) else (@as(u64, 1) << @intCast(n)) - 1) << lo;
        @atomicStore(u64, &words[w], words[w] | mask, .release);
        b += n;
    }
}

pub fn bitsClear(words: []u64, b0: u64, b1: u64) void {
    assert(b0 <= b1);
    assert(b1 <= words.len * 64);
    var b = b0;
    while (b < b1) {
        const w: usize = @intCast(b >> 6);
        const lo: u6 = @intCast(b & 63);
        const n = @min(b1 - b, 64 - @as(u64, lo));
        const mask = (if (n == 64) ~@as(u64, 0) else (@as(u64, 1) << @intCast(n)) - 1) << lo;
        @atomicStore(u64, &words[w], words[w] & ~mask, .release);
        b += n;
    }
}

/// Bytes on disk of the blocks of 2^shift bytes that `word`'s bits mark,
/// in whole 2^disk_shift units: eight random 512 B blocks are eight units.
pub fn footprintWord(word: u64, shift: u6) u64 {
    if (shift >= disk_shift) return @as(u64, @popCount(word)) << shift;
    const per: u7 = @as(u7, 1) << @intCast(disk_shift - shift); // blocks per unit: 2 to 8
    const mask: u64 = (@as(u64, 1) << @intCast(per)) - 1;
    var units: u64 = 0;
    var k: u7 = 0;
    while (k < 64) : (k += per) units += @intFromBool(word >> @intCast(k) & mask != 0);
    return units << disk_shift;
}

pub fn footprint(words: []const u64, shift: u6) u64 {
    var total: u64 = 0;
    for (words) |*w| total += footprintWord(@atomicLoad(u64, w, .monotonic), shift);
    return total;
}

/// Proves at compile time that extern struct `T` is exactly `size` bytes of
/// the fields named in `offsets`, at those offsets, with no padding.
fn assertLayout(comptime T: type, comptime size: usize, comptime offsets: anytype) void {
    var end_at: usize = 0;
    for (@typeInfo(T).@"struct".field_names, @typeInfo(T).@"struct".field_types) |name, F| {
        if (@offsetOf(T, name) != @field(offsets, name) or @offsetOf(T, name) != end_at)
            @compileError(@typeName(T) ++ "." ++ name ++ " is not at its documented offset");
        end_at += @sizeOf(F);
    }
    if (end_at != size or @sizeOf(T) != size)
        @compileError(@typeName(T) ++ " is not its documented size");
}

test "a replica's blocks are an eighth of a mean record, 512 B to 16 MiB" {
    // 400 records of 3,000 B, fixed: 4 B of index each.
    const a = Geometry.of(400, 400 * 3000, 3000);
    try std.testing.expectEqual(@as(u64, 1600), a.index_size);
    try std.testing.expectEqual(@as(u6, 9), a.index_shift);
    try std.testing.expectEqual(@as(u6, 9), a.data_shift);
    try std.testing.expectEqual(@as(u64, 4), a.index_blocks);
    try std.testing.expectEqual(divCeil(400 * 3000, 512), a.data_blocks);
    try std.testing.expectEqual(divCeil(a.data_blocks, 64), a.regions);
    try std.testing.expectEqual(page + (1 + 3 * a.regions) * 8, a.stateSize());
    // Records of 1 MiB: blocks of 128 KiB; a table layout's 32 B entries.
    const b = Geometry.of(1000, 1000 << 20, 0);
    try std.testing.expectEqual(@as(u6, 17), b.data_shift);
    try std.testing.expectEqual(@as(u64, 32_000), b.index_size);
    // 2^50 bytes in 2^20 records: at most 2^27 data blocks (16 MiB cap aside).
    const c = Geometry.of(1 << 20, 1 << 50, 0);
    try std.testing.expect(c.data_blocks <= 1 << 27);
    try std.testing.expect(c.data_shift <= 24);
    // A head made from a geometry matches it; one field off does not.
    var h = a.head();
    try std.testing.expect(a.matches(&h));
    h.regions += 1;
    try std.testing.expect(!a.matches(&h));
    const empty = Geometry.of(0, 0, 0);
    try std.testing.expectEqual(@as(u64, 0), empty.regions);
    try std.testing.expectEqual(page, empty.stateSize());
}

test "bitmaps: runs across words set, clear and test exactly their bits" {
    var words: [4]u64 = @splat(0);
    bitsSet(&words, 60, 130);
    for (0..256) |b| try std.testing.expectEqual(b >= 60 and b < 130, bitTest(&words, b));
    bitsClear(&words, 64, 128);
    for (0..256) |b| {
        const set = (b >= 60 and b < 64) or (b >= 128 and b < 130);
        try std.testing.expectEqual(set, bitTest(&words, b));
    }
    bitsSet(&words, 0, 256);
    try std.testing.expectEqual(~@as(u64, 0), words[3]);
    bitsClear(&words, 5, 5); // an empty run changes nothing
    try std.testing.expect(bitTest(&words, 5));
}

test "the footprint counts whole 4 KiB units of the blocks marked" {
    // 512 B blocks: eight a unit. Bits 0 and 7 share one, bit 8 starts another.
    try std.testing.expectEqual(@as(u64, 4096), footprintWord(0b1000_0001, 9));
    try std.testing.expectEqual(@as(u64, 8192), footprintWord(0b1_0000_0001, 9));
    try std.testing.expectEqual(@as(u64, 8 * 4096), footprintWord(~@as(u64, 0), 9));
    // 4 KiB blocks and larger: a unit or more each.
    try std.testing.expectEqual(@as(u64, 3 << 12), footprintWord(0b111, 12));
    try std.testing.expectEqual(@as(u64, 2 << 16), footprintWord(0b11, 16));
    const words = [_]u64{ 0b1, 0, 1 << 63 };
    try std.testing.expectEqual(@as(u64, 2 * 4096), footprint(&words, 10));
}
