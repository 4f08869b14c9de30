//! Tests of the store engine (Store.zig and its store_*.zig parts): round
//! trips, locking, the delete rule against an independent model, seeded
//! fuzzers against an in-memory model, the close-vs-call lifetime, and every
//! allocation failure of open, append, delete and compact.
const std = @import("std");
const testing = std.testing;
const Allocator = std.mem.Allocator;
const Store = @import("Store.zig");
const format = @import("format.zig");
const outbuf = @import("outbuf.zig");
const pool = @import("pool.zig");
const fsio = @import("fsio.zig");
const Codec = format.Codec;
const Move = @import("store_maintain.zig").Move;

fn tmpPath(tmp: *testing.TmpDir, buf: []u8, name: []const u8) ![]const u8 {
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    return std.fmt.bufPrint(buf, "{s}/{s}", .{ base, name });
}

fn appendSlices(s: *Store, records: []const []const u8) !u64 {
    var ptrs: [64][*]const u8 = undefined;
    var szs: [64]u64 = undefined;
    for (records, 0..) |r, i| {
        ptrs[i] = r.ptr;
        szs[i] = r.len;
    }
    return s.append(.{ .ptrs = &ptrs, .sizes = &szs, .count = records.len }, false);
}

/// `count` records of `size` bytes in one block (record i's bytes vary with
/// i and with their place), with the pointers and sizes an append takes.
const Patterned = struct {
    block: []u8,
    ptrs: [][*]const u8,
    szs: []u64,

    fn init(gpa: Allocator, count: usize, size: usize) !Patterned {
        const block = try gpa.alloc(u8, count * size);
        errdefer gpa.free(block);
        for (block, 0..) |*b, i| b.* = @truncate(i / size *% 31 +% i);
        const ptrs = try gpa.alloc([*]const u8, count);
        errdefer gpa.free(ptrs);
        const szs = try gpa.alloc(u64, count);
        for (ptrs, szs, 0..) |*p, *z, i| {
            p.* = block[i * size ..].ptr;
            z.* = size;
        }
        return .{ .block = block, .ptrs = ptrs, .szs = szs };
    }

    fn deinit(r: Patterned, gpa: Allocator) void {
        gpa.free(r.szs);
        gpa.free(r.ptrs);
        gpa.free(r.block);
    }

    fn appendTo(r: Patterned, s: *Store) !u64 {
        return s.append(.{ .ptrs = r.ptrs.ptr, .sizes = r.szs.ptr, .count = r.ptrs.len }, false);
    }

    fn record(r: Patterned, index: u64) []const u8 {
        const size = r.block.len / r.ptrs.len;
        return r.block[@intCast(index * size)..][0..size];
    }
};

fn readOne(s: *Store, index: u64, out: *std.ArrayList(u8)) !void {
    var raw: [1]u64 = undefined;
    var aux: [1]u64 = undefined;
    const buf = try s.gatherAlloc(&.{index}, 0, &raw, &aux);
    defer if (buf.len > 0) outbuf.free(buf.ptr);
    out.clearRetainingCapacity();
    try out.appendSlice(testing.allocator, buf[0..@intCast(raw[0])]);
}

fn deleteIndices(s: *Store, indices: []const u64) !void {
    var moves: [64]Move = undefined;
    _ = try s.delete(indices, moves[0..indices.len]);
}

test "append, gather, reopen for every codec" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    inline for (.{ Codec.raw, Codec.zstd }) |cd| {
        const path = try tmpPath(&tmp, &buf, @tagName(cd));
        const text = "hello hello hello hello hello hello hello";
        {
            const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = cd });
            defer s.close();
            try testing.expectEqual(@as(u64, 0), try appendSlices(s, &.{ "a", "", text }));
            try testing.expectEqual(@as(u64, 3), try s.recordCount());
        }
        const s = try Store.open(testing.allocator, path, .{});
        defer s.close();
        var out: std.ArrayList(u8) = .empty;
        defer out.deinit(testing.allocator);
        try readOne(s, 2, &out);
        try testing.expectEqualStrings(text, out.items);
        try readOne(s, 1, &out);
        try testing.expectEqual(@as(usize, 0), out.items.len);
        try testing.expectError(error.OutOfRange, readOne(s, 3, &out));
        var bad: u64 = 0;
        try s.verify(&bad);
    }
}

test "gatherAlloc returns payloads then aux bytes from one snapshot" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const s = try Store.open(testing.allocator, try tmpPath(&tmp, &buf, "a"), .{ .create = true });
    defer s.close();
    const ptrs = [_][*]const u8{ "xyz", "", "hello hello hello hello hello hello" };
    const sizes = [_]u64{ 3, 0, 35 };
    const auxp = [_][*]const u8{ "AB", "C", "" };
    const auxs = [_]u64{ 2, 1, 0 };
    _ = try s.append(
        .{ .ptrs = &ptrs, .sizes = &sizes, .aux_ptrs = &auxp, .aux_sizes = &auxs, .count = 3 },
        false,
    );
    var raw: [3]u64 = undefined;
    var aux: [3]u64 = undefined;
    const out = try s.gatherAlloc(&.{ 2, 0, 1 }, 0, &raw, &aux);
    defer outbuf.free(out.ptr);
    try testing.expectEqualSlices(u64, &.{ 35, 3, 0 }, &raw);
    try testing.expectEqualSlices(u64, &.{ 0, 2, 1 }, &aux);
    try testing.expectEqualStrings("hello hello hello hello hello helloxyzABC", out);
    try testing.expectError(error.OutOfRange, s.gatherAlloc(&.{3}, 0, raw[0..1], aux[0..1]));
}

test "verifyRecords names the damaged records and passes the intact ones, in both layouts" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    inline for (.{ @as(u64, 0), @as(u64, 4) }, .{ "var", "fixed" }) |fixed, name| {
        const path = try tmpPath(&tmp, &buf, name);
        const cd: Codec = if (fixed != 0) .raw else .zstd;
        const s = try Store.open(testing.allocator, path, .{
            .create = true,
            .codec = cd,
            .fixed_size = fixed,
        });
        defer s.close();
        _ = try appendSlices(s, &.{ "abcd", "efgh", "ijkl" });
        var bad: [4]u64 = undefined;
        try testing.expectEqual(@as(usize, 0), try s.verifyRecords(&.{ 2, 0, 1, 2 }, &bad));
        // Damage record 1's bytes on disk (the raw records sit back to back).
        const data = try tmp.dir.openFile(pool.io(), name ++ "/data", .{ .mode = .read_write });
        defer data.close(pool.io());
        var zero = [_]u8{'X'};
        const at: u64 = if (fixed != 0) 4 else (try s.table(3)).get(1).offset;
        try fsio.write(data, "data", &zero, at);
        try testing.expectEqual(@as(usize, 2), try s.verifyRecords(&.{ 1, 0, 2, 1 }, &bad));
        try testing.expectEqualSlices(u64, &.{ 0, 3 }, bad[0..2]);
        try testing.expectError(error.OutOfRange, s.verifyRecords(&.{3}, &bad));
    }
}

test "open refuses a missing store and a foreign directory" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    try testing.expectError(
        error.NotFound,
        Store.open(testing.allocator, try tmpPath(&tmp, &buf, "none"), .{}),
    );
    try tmp.dir.createDirPath(pool.io(), "foreign");
    const f = try tmp.dir.createFile(pool.io(), "foreign/x.txt", .{});
    f.close(pool.io());
    try testing.expectError(
        error.NotAStore,
        Store.open(testing.allocator, try tmpPath(&tmp, &buf, "foreign"), .{}),
    );
    try testing.expectError(
        error.NotAStore,
        Store.open(testing.allocator, try tmpPath(&tmp, &buf, "foreign"), .{ .create = true }),
    );
}

test "second writer is locked out; delete refuses while another handle is open" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "s");
    const a = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    defer a.close();
    _ = try appendSlices(a, &.{ "x", "y" });
    const b = try Store.open(testing.allocator, path, .{});
    try testing.expectError(error.Locked, appendSlices(b, &.{"z"}));
    try testing.expectEqual(@as(u64, 2), try b.recordCount());
    try testing.expectError(error.Busy, deleteIndices(a, &.{0}));
    b.close();
    try deleteIndices(a, &.{0});
    try testing.expectEqual(@as(u64, 1), try a.recordCount());
}

test "close while calls are in flight: the last one out releases the files" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "s");
    const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    _ = try appendSlices(s, &.{ "abc", "def" });
    try s.enter(); // a call in flight
    s.shutdown();
    try testing.expect(s.isClosed());
    try testing.expectError(error.Closed, s.enter());
    // The call in flight still reads mapped memory.
    var out: [3]u8 = undefined;
    try s.gather(&.{1}, .{ .base = &out, .len = 3, .stride = 3 }, .payload, 0);
    try testing.expectEqualStrings("def", &out);
    s.leave(); // releases the files
    s.unhold(); // frees the struct
}

/// The original one-at-a-time rule, written independently of the engine:
/// in descending order, the deleted index takes the last record, then the
/// last position goes.
fn modelDelete(gpa: Allocator, model: *std.ArrayList([]u8), indices: []const u64) !void {
    const sorted = try gpa.dupe(u64, indices);
    defer gpa.free(sorted);
    std.mem.sortUnstable(u64, sorted, {}, std.sort.desc(u64));
    var previous: ?u64 = null;
    for (sorted) |d| {
        if (previous == d) continue;
        previous = d;
        const i: usize = @intCast(d);
        gpa.free(model.items[i]);
        model.items[i] = model.items[model.items.len - 1];
        _ = model.pop();
    }
}

test "delete order and moves match the original rule" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    inline for (.{ 0, 1 }, .{ "general", "fixed" }) |fixed, name| {
        const path = try tmpPath(&tmp, &buf, name);
        const options: Store.OpenOptions = .{ .create = true, .codec = .raw, .fixed_size = fixed };
        const s = try Store.open(gpa, path, options);
        defer s.close();
        var recs: [10][1]u8 = undefined;
        var slices: [10][]const u8 = undefined;
        for (&recs, &slices, 0..) |*r, *sl, i| {
            r.* = .{@intCast(i)};
            sl.* = r;
        }
        _ = try appendSlices(s, &slices);
        var moves: [2]Move = undefined;
        const n = try s.delete(&.{ 3, 2 }, &moves);
        const expected = [_]Move{ .{ .from = 8, .to = 2 }, .{ .from = 9, .to = 3 } };
        try testing.expectEqualSlices(Move, &expected, moves[0..n]);
        var out: [8]u8 = undefined;
        const idx = [_]u64{ 0, 1, 2, 3, 4, 5, 6, 7 };
        try s.gather(&idx, .{ .base = &out, .len = 8, .stride = 1 }, .payload, 0);
        try testing.expectEqualSlices(u8, &.{ 0, 1, 8, 9, 4, 5, 6, 7 }, &out);
    }
}

// A seeded fuzzer: random appends, deletes, compacts and reopens against a
// model kept in memory; every record's bytes are checked after each step.
test "fuzz against an in-memory model" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "fuzz");
    var prng = std.Random.DefaultPrng.init(0xC0FFEE);
    var model: std.ArrayList([]u8) = .empty;
    defer freeModel(gpa, &model);
    var s = try Store.open(gpa, path, .{ .create = true, .codec = .zstd });
    defer s.close();
    try fuzzStore(gpa, path, &s, &model, prng.random(), 0);
}

test "fuzz the fixed-width layout against an in-memory model" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "fixed");
    var prng = std.Random.DefaultPrng.init(0xF1AED);
    var model: std.ArrayList([]u8) = .empty;
    defer freeModel(gpa, &model);
    var s = try Store.open(gpa, path, .{ .create = true, .codec = .raw, .fixed_size = 24 });
    defer s.close();
    try testing.expectError(error.SizeMismatch, appendSlices(s, &.{"too short"}));
    try fuzzStore(gpa, path, &s, &model, prng.random(), 24);
}

fn freeModel(gpa: Allocator, model: *std.ArrayList([]u8)) void {
    for (model.items) |r| gpa.free(r);
    model.deinit(gpa);
}

fn randomRecord(gpa: Allocator, rnd: std.Random, fixed: usize) ![]u8 {
    const len = if (fixed != 0) fixed else switch (rnd.uintLessThan(u8, 4)) {
        0 => 0,
        1 => rnd.uintLessThan(usize, 16),
        2 => rnd.uintLessThan(usize, 2000),
        else => rnd.uintLessThan(usize, 70000),
    };
    const r = try gpa.alloc(u8, len);
    // Half compressible, half noise.
    if (rnd.boolean()) {
        rnd.bytes(r);
    } else for (r, 0..) |*b, j| {
        b.* = @truncate(j / 7);
    }
    return r;
}

/// Random appends (records of `fixed` bytes when non-zero), deletes, compacts
/// and reopens of `s`, checking every record against `model` after each step.
fn fuzzStore(
    gpa: Allocator,
    path: []const u8,
    s: **Store,
    model: *std.ArrayList([]u8),
    rnd: std.Random,
    fixed: usize,
) !void {
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    for (0..300) |_| {
        switch (rnd.uintLessThan(u8, 10)) {
            0...4 => {
                const n = rnd.uintLessThan(usize, 8) + 1;
                var recs: [8][]const u8 = undefined;
                for (0..n) |i| {
                    const r = try randomRecord(gpa, rnd, fixed);
                    recs[i] = r;
                    try model.append(gpa, r);
                }
                _ = try appendSlices(s.*, recs[0..n]);
            },
            5, 6 => if (model.items.len > 0) {
                const k = rnd.uintLessThan(usize, @min(model.items.len, 6)) + 1;
                var idx: [6]u64 = undefined;
                for (0..k) |i| idx[i] = rnd.uintLessThan(u64, model.items.len);
                try deleteIndices(s.*, idx[0..k]);
                try modelDelete(gpa, model, idx[0..k]);
            },
            7 => try s.*.compact(),
            else => {
                s.*.close();
                s.* = try Store.open(gpa, path, .{});
            },
        }
        try testing.expectEqual(@as(u64, model.items.len), try s.*.recordCount());
        for (model.items, 0..) |r, i| {
            try readOne(s.*, i, &out);
            try testing.expectEqualSlices(u8, r, out.items);
        }
        const st = try s.*.stats();
        try testing.expectEqual(st.chunk_bytes, st.live_bytes + st.reclaimable);
    }
    var bad: u64 = 0;
    try s.*.verify(&bad);
    try s.*.compact();
    const st = try s.*.stats();
    try testing.expectEqual(@as(u64, 0), st.reclaimable);
}

test "fixed-width append of one contiguous block takes the dense path and reads back" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "dense");
    const s = try Store.open(
        testing.allocator,
        path,
        .{ .create = true, .codec = .raw, .fixed_size = 8 },
    );
    defer s.close();
    var block: [10 * 8]u8 = undefined;
    for (&block, 0..) |*b, i| b.* = @intCast(i);
    var ptrs: [10][*]const u8 = undefined;
    var szs: [10]u64 = @splat(8);
    for (&ptrs, 0..) |*p, i| p.* = block[i * 8 ..].ptr;
    const batch: Store.Batch = .{ .ptrs = &ptrs, .sizes = &szs, .count = 10 };
    try testing.expectEqual(@as(u64, 0), try s.append(batch, false));
    try testing.expectEqual(@as(u64, 10), try s.append(batch, false));
    var out: [20 * 8]u8 = undefined;
    var idx: [20]u64 = undefined;
    for (&idx, 0..) |*x, i| x.* = 19 - i;
    try s.gather(&idx, .{ .base = &out, .len = out.len, .stride = 8 }, .payload, 0);
    for (0..20) |i| {
        try testing.expectEqualSlices(u8, block[((19 - i) % 10) * 8 ..][0..8], out[i * 8 ..][0..8]);
    }
    var bad: u64 = 0;
    try s.verify(&bad);
    try deleteIndices(s, &.{ 0, 5 });
    try s.verify(&bad);
    try testing.expectEqual(@as(u64, 18 * 8), (try s.stats()).chunk_bytes);
}

test "fixed-width gathers into a stride: inline and on every lane, checked first" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "strided");
    const size = 200;
    const count = 3000;
    const s = try Store.open(gpa, path, .{ .create = true, .codec = .raw, .fixed_size = size });
    defer s.close();
    const records = try Patterned.init(gpa, count, size);
    defer records.deinit(gpa);
    _ = try records.appendTo(s);
    var prng = std.Random.DefaultPrng.init(0x57A1D);
    const idx = try gpa.alloc(u64, 2000);
    defer gpa.free(idx);
    for (idx) |*x| x.* = prng.random().uintLessThan(u64, count);
    const out = try gpa.alloc(u8, idx.len * size);
    defer gpa.free(out);
    // 5 records run inline, 2000 (400 KB) on every lane.
    for ([_]usize{ 5, idx.len }) |n| {
        @memset(out, 0xEE);
        try s.gather(idx[0..n], .{ .base = out.ptr, .len = n * size, .stride = size }, .payload, 0);
        for (idx[0..n], 0..) |x, i| {
            const want = records.record(x);
            try testing.expectEqualSlices(u8, want, out[i * size ..][0..size]);
        }
        if (n < idx.len) try testing.expectEqual(@as(u8, 0xEE), out[n * size]);
    }
    // Every index is checked before a byte is written; so is the room.
    @memset(out, 0xEE);
    const bad = [_]u64{ 1, 2, count + 4, count };
    const dest: Store.Dest = .{ .base = out.ptr, .len = 4 * size, .stride = size };
    try testing.expectError(error.OutOfRange, s.gather(&bad, dest, .payload, 0));
    try testing.expectEqualStrings("index 3004 is out of range for 3000 records", diagText());
    const short: Store.Dest = .{ .base = out.ptr, .len = 4 * size - 1, .stride = size };
    try testing.expectError(error.SizeMismatch, s.gather(idx[0..4], short, .payload, 0));
    try testing.expect(std.mem.allEqual(u8, out, 0xEE));
    // Another stride takes the general path, which refuses the record size.
    const half: Store.Dest = .{ .base = out.ptr, .len = out.len, .stride = size / 2 };
    try testing.expectError(error.SizeMismatch, s.gather(idx[0..4], half, .payload, 0));
}

test "streaming gathers write what plain ones do, on the strided and the general path" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    // 4100 B: above codec.stream_min, and every record after the first starts
    // off a 32-byte boundary (the streaming copy's head and tail run too).
    const size = 4100;
    const count = 300;
    const records = try Patterned.init(gpa, count, size);
    defer records.deinit(gpa);
    var prng = std.Random.DefaultPrng.init(0x57EA);
    var idx: [256]u64 = undefined;
    for (&idx) |*x| x.* = prng.random().uintLessThan(u64, count);
    const plain = try gpa.alloc(u8, idx.len * size);
    defer gpa.free(plain);
    const streamed = try gpa.alloc(u8, idx.len * size);
    defer gpa.free(streamed);
    // fixed_size: the strided copy; 0: the general path (a table per record).
    for ([_]u64{ size, 0 }, [_][]const u8{ "fixed", "general" }) |fixed, name| {
        const path = try tmpPath(&tmp, &buf, name);
        const options: Store.OpenOptions = .{ .create = true, .codec = .raw, .fixed_size = fixed };
        const s = try Store.open(gpa, path, options);
        defer s.close();
        _ = try records.appendTo(s);
        // Inline (one lane) and on every lane.
        for ([_]usize{ 1, 0 }) |lanes| {
            @memset(plain, 0xEE);
            @memset(streamed, 0x11);
            const dest: Store.Dest = .{ .base = plain.ptr, .len = plain.len, .stride = size };
            try s.gather(&idx, dest, .payload, lanes);
            var to_stream = dest;
            to_stream.base = streamed.ptr;
            to_stream.stream = true;
            try s.gather(&idx, to_stream, .payload, lanes);
            try testing.expectEqualSlices(u8, plain, streamed);
            for (idx, 0..) |x, i| {
                const want = records.record(x);
                try testing.expectEqualSlices(u8, want, streamed[i * size ..][0..size]);
            }
        }
    }
}

fn diagText() []const u8 {
    return std.mem.span(@import("diag.zig").get());
}

test "compact parks records when the free space ahead is small, and keeps every record" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const s = try Store.open(gpa, try tmpPath(&tmp, &buf, "c"), .{ .create = true, .codec = .raw });
    defer s.close();
    var prng = std.Random.DefaultPrng.init(7);
    var model: std.ArrayList([]u8) = .empty;
    defer freeModel(gpa, &model);
    for (0..40) |_| {
        const r = try randomRecord(gpa, prng.random(), 0);
        try model.append(gpa, r);
        _ = try appendSlices(s, &.{r});
    }
    // One small hole at the front: every later record needs to move.
    try deleteIndices(s, &.{1});
    try modelDelete(gpa, &model, &.{1});
    try s.compact();
    const st = try s.stats();
    try testing.expectEqual(@as(u64, 0), st.reclaimable);
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);
    for (model.items, 0..) |r, i| {
        try readOne(s, i, &out);
        try testing.expectEqualSlices(u8, r, out.items);
    }
    var bad: u64 = 0;
    try s.verify(&bad);
}

/// open, append, delete and compact of a new store, with `gpa`.
fn lifecycleWith(gpa: Allocator, path: []const u8) !void {
    const s = try Store.open(gpa, path, .{ .create = true, .codec = .zstd });
    defer s.close();
    const text = "abcabcabcabcabcabcabcabcabcabcabcabcabcabc";
    _ = try appendSlices(s, &.{ text, "x", text, "" });
    var moves: [2]Move = undefined;
    _ = try s.delete(&.{ 0, 2 }, &moves);
    try s.compact();
    var bad: u64 = 0;
    try s.verify(&bad);
}

test "every allocation failure in open, append, delete and compact is a clean error" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    var n: usize = 0;
    while (true) : (n += 1) {
        var name_buf: [32]u8 = undefined;
        const path = try tmpPath(&tmp, &buf, try std.fmt.bufPrint(&name_buf, "s{d}", .{n}));
        var failing = testing.FailingAllocator.init(testing.allocator, .{ .fail_index = n });
        lifecycleWith(failing.allocator(), path) catch |e| {
            try testing.expectEqual(error.OutOfMemory, e);
            try testing.expect(failing.has_induced_failure);
            continue;
        };
        // No allocation left to fail: every earlier index failed cleanly.
        try testing.expect(!failing.has_induced_failure);
        break;
    }
    try testing.expect(n > 5);
}

test "an injected write fault fails the append cleanly and the handle stays usable" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "f");
    const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    defer s.close();
    _ = try appendSlices(s, &.{"one"});
    fsio.armFault(@as(u32, 1) << @backingInt(fsio.Op.write), 1, false);
    try testing.expectError(error.IoFailed, appendSlices(s, &.{"two"}));
    fsio.armFault(0, 0, false);
    try testing.expectEqual(@as(u64, 1), try s.recordCount());
    try testing.expectEqual(@as(u64, 1), try appendSlices(s, &.{"two"}));
    // A failed fsync fails the handle for good (the pages may be gone).
    fsio.armFault(@as(u32, 1) << @backingInt(fsio.Op.sync), 1, false);
    try testing.expectError(error.IoFailed, s.sync());
    fsio.armFault(0, 0, false);
    try testing.expectError(error.Failed, s.sync());
    try testing.expectError(error.Failed, appendSlices(s, &.{"three"}));
}
