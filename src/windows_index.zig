//! The index of a token corpus (see windows.zig): `index` builds the prefix
//! sums of one store from `windows.idx` (format.zig), copied into memory and
//! checked, plus the records it does not
//! cover, read from the record table; then rewrites the file when it can
//! cover more (a durable prefix only). A window index in memory carries the
//! delete epoch of its stores (Store.delete_epoch): after a delete through
//! any of them, every read of it fails instead of reading moved documents.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const format = @import("format.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const fsio = @import("fsio.zig");
const Store = @import("Store.zig");
const store_read = @import("store_read.zig");
const store_parts = @import("store_parts.zig");
const windows = @import("windows.zig");
const Error = Store.Error;
const WindowsIndex = format.WindowsIndex;
const tokens_max = windows.tokens_max;

/// Builds `out[0..docs+1]`, the prefix sums of records [0, docs) of store
/// `s` read as documents of `itemsize`-byte tokens (1-D records, each a whole
/// number of tokens), with a separator token after every document but the
/// last when `has_separator`. A fixed-width store of `itemsize`-byte records
/// (single tokens) is one document (`docs` 1): its records in order; a
/// corpus's part for it then starts at that document's number. Reads
/// windows.idx where it is valid, the record table for the rest, and
/// rewrites windows.idx (best effort) when the store's durable records reach
/// past what it covered. The caller reads the delete epoch (`epochOf`)
/// before: a delete meanwhile then shows.
pub fn index(
    gpa: Allocator,
    s: *Store,
    itemsize: u32,
    has_separator: bool,
    out: []u64,
) Error!void {
    assert(out.len >= 1);
    const docs = out.len - 1;
    try s.enterRead();
    defer s.exitRead();
    const c = try store_read.publishedCommit(s);
    if (docs > c.record_count) {
        return diag.fail(
            error.OutOfRange,
            "the store holds {d} documents, not {d}: it changed while the index was built",
            .{ c.record_count, docs },
        );
    }
    if (s.header.fixed_size != 0) {
        // A store of single tokens (a DenseStore of scalars, fixed width):
        // one document, its records in order. Nothing to index.
        if (s.header.fixed_size != itemsize or docs != 1) {
            return diag.fail(
                error.SizeMismatch,
                "a fixed-width store of {d}-byte records is one document of {d}-byte tokens " ++
                    "only when each record is one token",
                .{ s.header.fixed_size, itemsize },
            );
        }
        out[0] = 0;
        out[1] = c.record_count;
        return;
    }
    const table = try s.table(c.record_count);
    const data = try s.dataMap(c.data_size);
    const ends = gpa.alloc(u64, docs) catch return error.OutOfMemory;
    defer gpa.free(ends);
    var loaded = loadFile(gpa, s, c, table, ends);
    try tableEnds(c, table, data, ends, loaded);
    if (loaded > 0) {
        // A file that passed its checks but does not add up (a record that is
        // not a whole number of tokens by it) is set aside like any bad one.
        tokenPrefix(ends, itemsize, has_separator, out) catch {
            loaded = 0;
            try tableEnds(c, table, data, ends, 0);
        };
    }
    const durable: usize = @intCast(@min(docs, c.durable_count));
    if (durable > loaded and s.writable) saveFile(s, c, ends[0..durable]);
    try tokenPrefix(ends, itemsize, has_separator, out);
    assert(out[0] == 0);
    assert(out[docs] <= tokens_max);
}

/// The delete epoch of an index space: the sum of its stores' (Spec.epoch).
pub fn epochOf(parts: []const store_parts.Part) u64 {
    var epoch: u64 = 0;
    for (parts) |p| epoch +%= p.store.delete_epoch.load(.acquire);
    return epoch;
}

/// ends[from..] from the record table (ends[from - 1] is already set).
fn tableEnds(
    c: format.Commit,
    table: Store.Table,
    data: [*]const u8,
    ends: []u64,
    from: u64,
) Error!void {
    assert(from <= ends.len);
    assert(ends.len <= c.record_count);
    var prev: u64 = if (from == 0) 0 else ends[@intCast(from - 1)];
    for (@intCast(from)..ends.len) |d| {
        const loc = table.get(d);
        try Store.checkLoc(loc, d, data, c.data_size, true);
        if (loc.aux_size != 0) {
            return diag.fail(
                error.SizeMismatch,
                "document {d} is not 1-D (token documents must be)",
                .{d},
            );
        }
        prev = std.math.add(u64, prev, loc.raw_size) catch
            return diag.fail(error.Corrupt, "document sizes overflow", .{});
        ends[d] = prev;
    }
}

/// out[d + 1] = tokens of documents 0..d, separators included.
fn tokenPrefix(ends: []const u64, itemsize: u32, has_separator: bool, out: []u64) Error!void {
    assert(std.math.isPowerOfTwo(itemsize));
    const shift: u6 = @intCast(std.math.log2_int(u32, itemsize));
    const mask: u64 = itemsize - 1;
    out[0] = 0;
    // out[d] is ends[d - 1] / itemsize plus separators (documents are whole
    // tokens), at most the last one: bounded here, no sum below can wrap.
    const last = if (ends.len == 0) 0 else ends[ends.len - 1];
    if ((last >> shift) > tokens_max - ends.len) {
        return diag.fail(error.InvalidArgument, "the corpus holds too many tokens", .{});
    }
    var before: u64 = 0;
    for (ends, 0..) |end, d| {
        const bytes = end - before;
        before = end;
        if (bytes & mask != 0) {
            return diag.fail(error.Corrupt, "document {d} is not a whole number of tokens", .{d});
        }
        const sep: u64 = @intFromBool(has_separator and d + 1 < ends.len);
        out[d + 1] = out[d] + (bytes >> shift) + sep;
    }
    assert(out[ends.len] <= tokens_max);
}

/// Spot checks of a loaded index against the record table: this many
/// documents spread over it (its first and last among them). The file is
/// otherwise trusted as the record table is, on its checksum and on the
/// rule that only a delete changes records (and removes it); verify()
/// checks every entry.
const spot_checks: u64 = 1024;

/// Reads windows.idx into `ends` when it is valid for store `s` at commit `c`;
/// returns how many documents it gave (0: absent or not valid, every problem
/// alike: the index is then rebuilt from the table, never trusted).
fn loadFile(
    gpa: Allocator,
    s: *Store,
    c: format.Commit,
    table: Store.Table,
    ends: []u64,
) u64 {
    const io = pool.io();
    const f = fsio.open(s.dir, WindowsIndex.file_name, .read_only) catch return 0;
    defer f.close(io);
    var h: WindowsIndex = undefined;
    const got = f.readPositionalAll(io, std.mem.asBytes(&h), 0) catch return 0;
    if (got != @sizeOf(WindowsIndex)) return 0;
    if (h.magic != WindowsIndex.magic_value or h.version != WindowsIndex.version_value or
        h.header_size != @sizeOf(WindowsIndex) or h.checksum != h.computeChecksum())
    {
        return 0;
    }
    // Bound to this store, and to a durable past of it.
    if (h.store_uid != s.header.uid or h.store_header_checksum != s.header.checksum) return 0;
    if (h.docs == 0 or h.docs > h.durable_count or h.durable_count > c.durable_count or
        h.generation > c.generation or h.durable_data_size > c.durable_data_size)
    {
        return 0;
    }
    const body = std.math.mul(u64, h.docs, 8) catch return 0;
    const size = f.length(io) catch return 0;
    if (size != @sizeOf(WindowsIndex) + body) return 0;
    // Read straight into `ends` when it covers no more than asked (the usual case).
    const own = h.docs > ends.len;
    const all = if (own)
        gpa.alloc(u64, @intCast(h.docs)) catch return 0
    else
        ends[0..@intCast(h.docs)];
    defer if (own) gpa.free(all);
    const n = f.readPositionalAll(io, std.mem.sliceAsBytes(all), @sizeOf(WindowsIndex)) catch
        return 0;
    if (n != body or WindowsIndex.endsChecksum(all) != h.ends_checksum) return 0;
    var before: u64 = 0;
    for (all) |end| {
        if (end < before) return 0;
        before = end;
    }
    // The sizes it claims are the records' (a few, spread out, and the last).
    const step = @max(1, h.docs / spot_checks);
    var d: u64 = 0;
    while (true) : (d += step) {
        const at = @min(d, h.docs - 1);
        const start = if (at == 0) 0 else all[@intCast(at - 1)];
        if (all[@intCast(at)] - start != table.get(at).raw_size) return 0;
        if (at == h.docs - 1) break;
    }
    const take: usize = @intCast(@min(h.docs, ends.len));
    assert(take <= c.durable_count); // only durable records are ever covered
    if (own) @memcpy(ends[0..take], all[0..take]);
    return take;
}

/// Part of verify(): when the store has a windows.idx that an index build
/// would use, every one of its entries must be the records' (a file that
/// fails its own checks is never used, and is not an error).
pub fn verifyFile(gpa: Allocator, s: *Store, c: format.Commit) Error!void {
    const table = try s.table(c.record_count);
    const data = try s.dataMap(c.data_size);
    const docs: usize = @intCast(c.durable_count);
    const ends = gpa.alloc(u64, docs) catch return error.OutOfMemory;
    defer gpa.free(ends);
    const loaded: usize = @intCast(loadFile(gpa, s, c, table, ends));
    var prev: u64 = 0;
    for (ends[0..loaded], 0..) |end, d| {
        const loc = table.get(d);
        try Store.checkLoc(loc, d, data, c.data_size, true);
        if (end -% prev != loc.raw_size) {
            return diag.fail(
                error.Corrupt,
                "{s} does not match record {d} (it is derived data: delete the file " ++
                    "and the next TokenWindows rebuilds it)",
                .{ WindowsIndex.file_name, d },
            );
        }
        prev = end;
    }
}

/// Writes windows.idx for `ends` (records 0..ends.len, all durable in `c`):
/// a temporary file, fsync, rename, directory fsync. Best effort: the index
/// is derived data, so any failure (a read-only directory, a full disk)
/// leaves the store as it was and the index in memory only.
fn saveFile(s: *Store, c: format.Commit, ends: []const u64) void {
    // A durable prefix only: what a power loss can take must never be covered.
    assert(ends.len >= 1);
    assert(ends.len <= c.durable_count);
    var name_buf: [64]u8 = undefined;
    const tmp = std.mem.printSentinel(&name_buf, "{s}.{x:0>16}.tmp", .{
        WindowsIndex.file_name,
        Store.randomU64(),
    }, 0) catch unreachable; // 11 + 1 + 16 + 4 bytes fit name_buf
    var h: WindowsIndex = .{
        .magic = WindowsIndex.magic_value,
        .version = WindowsIndex.version_value,
        .header_size = @sizeOf(WindowsIndex),
        .store_uid = s.header.uid,
        .store_header_checksum = s.header.checksum,
        .docs = ends.len,
        .generation = c.generation,
        .durable_count = c.durable_count,
        .durable_data_size = c.durable_data_size,
        .ends_checksum = WindowsIndex.endsChecksum(ends),
        ._reserved = 0,
        .checksum = 0,
    };
    h.checksum = h.computeChecksum();
    sweepTemporaries(s);
    writeFile(s, tmp, &h, ends) catch {
        fsio.unlink(s.dir, tmp) catch {};
        diag.clear();
    };
}

/// Removes temporary index files a writer that failed or was killed left.
/// One that another process is writing right now may go too: its rename
/// then fails, and that process keeps its index in memory only.
fn sweepTemporaries(s: *Store) void {
    const io = pool.io();
    const d = s.dir.openDir(io, ".", .{ .iterate = true }) catch return;
    defer d.close(io);
    var it = d.iterate();
    while (it.next(io) catch null) |entry| {
        const name = entry.name;
        if (!std.mem.startsWith(u8, name, WindowsIndex.file_name ++ ".")) continue;
        if (!std.mem.endsWith(u8, name, ".tmp")) continue;
        fsio.unlink(s.dir, name) catch {};
    }
    diag.clear();
}

fn writeFile(s: *Store, tmp: [:0]const u8, h: *const WindowsIndex, ends: []const u64) !void {
    const io = pool.io();
    {
        const f = try fsio.create(s.dir, tmp, true);
        defer f.close(io);
        try fsio.write(f, tmp, std.mem.sliceAsBytes(ends), @sizeOf(WindowsIndex));
        try fsio.write(f, tmp, std.mem.asBytes(h), 0);
        try fsio.sync(f, tmp);
    }
    try fsio.rename(s.dir, tmp, WindowsIndex.file_name);
    try fsio.syncDir(s.dir, ".");
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const Move = @import("store_maintain.zig").Move;

fn testStore(base: []const u8, name: []const u8, opts: Store.OpenOptions) !*Store {
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/{s}", .{ base, name });
    return Store.open(testing.allocator, path, opts);
}

test "the index file is written for durable records, read back, and refused when it lies" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    const gpa = testing.allocator;
    const s = try testStore(base, "idx", .{ .create = true, .codec = .raw });
    defer s.close();
    const words: [64]u8 = @splat(7);
    const ptrs: [8][*]const u8 = @splat(&words);
    const sizes = [_]u64{ 8, 16, 0, 64, 8, 8, 32, 24 };
    _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = 8 }, false);
    var prefix: [9]u64 = undefined;
    try index(gpa, s, 8, false, &prefix);
    // Not durable yet: no file.
    try testing.expectError(error.FileNotFound, tmp.dir.access(pool.io(), "idx/windows.idx", .{}));
    try s.sync();
    try index(gpa, s, 8, false, &prefix);
    try tmp.dir.access(pool.io(), "idx/windows.idx", .{});
    try testing.expectEqualSlices(u64, &.{ 0, 1, 3, 3, 11, 12, 13, 17, 20 }, &prefix);
    // A file that lies about a size (checksums re-sealed) is not used.
    const io = pool.io();
    const f = try tmp.dir.openFile(io, "idx/windows.idx", .{ .mode = .read_write });
    var h: WindowsIndex = undefined;
    _ = try f.readPositionalAll(io, std.mem.asBytes(&h), 0);
    var ends: [8]u64 = undefined;
    _ = try f.readPositionalAll(io, std.mem.sliceAsBytes(&ends), @sizeOf(WindowsIndex));
    for (ends[1..]) |*e| e.* += 8; // document 1 one token longer
    h.ends_checksum = WindowsIndex.endsChecksum(&ends);
    h.checksum = h.computeChecksum();
    try f.writePositionalAll(io, std.mem.sliceAsBytes(&ends), @sizeOf(WindowsIndex));
    try f.writePositionalAll(io, std.mem.asBytes(&h), 0);
    f.close(io);
    var again: [9]u64 = undefined;
    try index(gpa, s, 8, false, &again);
    try testing.expectEqualSlices(u64, &prefix, &again);
    // A delete removes the file before it changes anything.
    var moves: [1]Move = undefined;
    _ = try s.delete(&.{0}, &moves);
    try testing.expectError(error.FileNotFound, tmp.dir.access(pool.io(), "idx/windows.idx", .{}));
}
