//! Helpers the loader's tests share (Loader.zig, loader/Builder.zig):
//! stores of u64 records, configs, and taking a step from a ring.
const std = @import("std");
const testing = std.testing;
const Loader = @import("../Loader.zig");
const Store = @import("../Store.zig");
const sampler = @import("../sampler.zig");
const outbuf = @import("../outbuf.zig");
const pool = @import("../pool.zig");
const Error = Loader.Error;
const Config = Loader.Config;
const Column = Loader.Column;
const ColumnKind = Loader.ColumnKind;
const Part = Loader.Part;
const Source = Loader.Source;

pub fn testStore(tmp: *testing.TmpDir, name: []const u8, count: u64, mul: u64) !*Store {
    return testStoreFrom(tmp, name, count, mul, 0);
}

/// A store of `count` u64 records: record i holds mul * (offset + i) + 1.
pub fn testStoreFrom(
    tmp: *testing.TmpDir,
    name: []const u8,
    count: u64,
    mul: u64,
    offset: u64,
) !*Store {
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/{s}", .{ base, name });
    const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    errdefer s.close();
    var values: [64]u64 = undefined;
    var ptrs: [64][*]const u8 = undefined;
    var sizes: [64]u64 = undefined;
    var first: u64 = 0;
    while (first < count) : (first += values.len) {
        const n: usize = @intCast(@min(values.len, count - first));
        for (0..n) |i| {
            values[i] = mul * (offset + first + i) + 1;
            ptrs[i] = @ptrCast(&values[i]);
            sizes[i] = 8;
        }
        _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = n }, false);
    }
    return s;
}

/// One dense column read from two sources: store `a` is source 0, `b` source 1.
pub fn twoSourceParts(a: *Store, b: *Store) [2]Part {
    return .{
        .{ .store = a, .first = 0, .source = 0, .column = 0 },
        .{ .store = b, .first = 0, .source = 1, .column = 0 },
    };
}

pub fn dense8() [1]Column {
    return .{.{ .kind = @backingInt(ColumnKind.dense), .record_size = 8 }};
}

pub fn testConfig(batch: u64, window: u32, threads: u32, step: u64) Config {
    return .{
        .batch_size = batch,
        .rank = 0,
        .world = 1,
        .position = step * batch,
        .step = step,
        .seed = 5,
        .mode = @backingInt(sampler.Mode.cyclic),
        .window = window,
        .threads = threads,
        .lanes = 0,
    };
}

/// What a test takes from one step: each column's buffer (the test frees
/// them), its indices and sources.
pub const Taken = struct {
    buffers: [2]?[*]u8 = @splat(null),
    lengths: [2]u64 = @splat(0),
    sizes: [16]u64 = undefined,
    failed_column: u32 = 0,

    pub fn free(t: *Taken) void {
        for (&t.buffers) |*b| {
            outbuf.free(b.*);
            b.* = null;
        }
    }

    pub fn values(t: *const Taken, c: usize) [*]align(1) const u64 {
        return @ptrCast(t.buffers[c].?);
    }
};

pub fn take(
    l: *Loader,
    step: u64,
    generation: u64,
    t: *Taken,
    indices: ?[*]u64,
    sources: ?[*]u16,
) Error!void {
    const n = l.columns.count();
    var owners: [2]?*?[*]u8 = .{ &t.buffers[0], &t.buffers[1] };
    try l.wait(step, generation, .{
        .failed_column = &t.failed_column,
        .buffers = owners[0..n],
        .lengths = t.lengths[0..n],
        .sizes = &t.sizes,
        .indices = indices,
        .sources = sources,
    });
}

/// A gated, SEQUENTIAL ring (batch 3, window 4, 2 threads) over store `s`
/// of 30 records (the gated-ring tests'; `create` copies what it is given).
pub fn gatedTestLoader(s: *Store) !*Loader {
    const sources = [_]Source{.{ .length = 30, .seed = 0, .weight = 1 }};
    const parts = [_]Part{.{ .store = s, .first = 0, .source = 0, .column = 0 }};
    var config = testConfig(3, 4, 2, 0);
    config.mode = @backingInt(sampler.Mode.sequential);
    config.gated = 1;
    return Loader.create(testing.allocator, config, &sources, &dense8(), &parts, null);
}
