//! Read-only shared mappings of a store's files, grown by generations.
//!
//! A reader loads the newest generation's base address with one atomic load
//! and no lock. A generation is never unmapped while the handle lives (only
//! when its last user leaves, see Store.zig), and each new one is at least
//! twice the last, so a handle maps at most ~2x a file's size of address
//! space and a reader never sees its mapping disappear.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const Io = std.Io;
const File = Io.File;
const pool = @import("pool.zig");
const diag = @import("diag.zig");

pub const Error = error{ Corrupt, OutOfMemory, IoFailed };

pub const Region = struct {
    memory: []align(std.heap.page_size_min) u8,
    mm: if (builtin.os.tag == .windows) File.MemoryMap else void,

    pub fn map(file: File, len: usize, file_len: u64) !Region {
        if (builtin.os.tag == .windows) {
            // A Windows section cannot extend past the end of a read-only file.
            const n: usize = @intCast(@min(len, file_len));
            const mm = try file.createMemoryMap(pool.io(), .{
                .len = n,
                .protection = .{ .read = true },
                .populate = false,
            });
            return .{ .memory = mm.memory, .mm = mm };
        }
        const memory = try std.posix.mmap(
            null,
            len,
            .{ .READ = true },
            .{ .TYPE = .SHARED },
            file.handle,
            0,
        );
        return .{ .memory = memory, .mm = {} };
    }

    pub fn unmap(r: *Region) void {
        if (builtin.os.tag == .windows) {
            r.mm.destroy(pool.io());
        } else {
            std.posix.munmap(r.memory);
        }
    }
};

/// What reads have learned about whether a file's pages are in memory
/// (store_cold.zig decides; it only ever costs a gather time when it is
/// set or when a gather was slow).
pub const Residency = struct {
    /// Reads bring their records in explicitly before they copy.
    cold: std.atomic.Value(bool) = .init(false),
    /// A residency check has run (the first read of a handle makes one).
    checked: std.atomic.Value(bool) = .init(false),
    /// Residency checks in a row that found every page in memory.
    streak: std.atomic.Value(u32) = .init(0),
    /// Prefetch calls made while the file was believed warm.
    probes: std.atomic.Value(u32) = .init(0),
};

/// Generations of one file's mapping; readers load the newest lock-free.
pub const MapSet = struct {
    const generations_max = 48;
    const first_len: usize = 1 << 20;

    regions: [generations_max]Region = undefined,
    count: std.atomic.Value(usize) = .init(0),
    mutex: Io.Mutex = .init,
    residency: Residency = .{},
    /// MADV_RANDOM on every generation (set while the file is read cold).
    random: bool = false,

    /// Base address valid for bytes [0, end) of `file`.
    pub fn cover(ms: *MapSet, file: File, end: u64, what: []const u8) Error![*]const u8 {
        const n = ms.count.load(.acquire);
        if (n > 0 and ms.regions[n - 1].memory.len >= end) return ms.regions[n - 1].memory.ptr;
        return ms.grow(file, end, what);
    }

    fn grow(ms: *MapSet, file: File, end: u64, what: []const u8) Error![*]const u8 {
        const io = pool.io();
        ms.mutex.lockUncancelable(io);
        defer ms.mutex.unlock(io);
        const n = ms.count.load(.acquire);
        const last_len: usize = if (n > 0) ms.regions[n - 1].memory.len else 0;
        if (n > 0 and last_len >= end) return ms.regions[n - 1].memory.ptr;
        if (n == generations_max) {
            return diag.fail(error.OutOfMemory, "{s}: too many mapping generations", .{what});
        }
        const file_len = file.length(io) catch |e| {
            return diag.fail(error.IoFailed, "{s}: {s}", .{ what, @errorName(e) });
        };
        if (file_len < end) {
            return diag.fail(
                error.Corrupt,
                "{s} file is truncated: {d} bytes, committed records need {d}",
                .{ what, file_len, end },
            );
        }
        if (end > std.math.maxInt(usize) / 2) {
            return diag.fail(
                error.OutOfMemory,
                "{s}: store too large for this address space",
                .{what},
            );
        }
        const want = @max(@max(end, 2 * last_len), @max(first_len, file_len));
        const len = std.mem.alignForward(usize, @intCast(want), std.heap.pageSize());
        // Each generation covers the request and at least doubles the last.
        assert(len >= end);
        assert(len >= last_len);
        const region = Region.map(file, len, file_len) catch |e| {
            return diag.fail(
                error.OutOfMemory,
                "{s}: cannot map {d} bytes: {s}",
                .{ what, len, @errorName(e) },
            );
        };
        assert(n < generations_max);
        assert(region.memory.len >= end);
        if (ms.random) adviseRegion(region.memory, true);
        ms.regions[n] = region;
        ms.count.store(n + 1, .release);
        return region.memory.ptr;
    }

    /// Random access advice for every generation, now and later: a fault then
    /// reads its own page instead of the device's readahead window around it
    /// (8 MiB on the bench machine: 2.4k random 12 KiB records per second
    /// through a mapping, against 3k with the advice; explicit reads do the
    /// rest, see store_cold.zig).
    pub fn adviseRandom(ms: *MapSet, random: bool) void {
        const io = pool.io();
        ms.mutex.lockUncancelable(io);
        defer ms.mutex.unlock(io);
        if (ms.random == random) return;
        ms.random = random;
        for (ms.regions[0..ms.count.raw]) |r| adviseRegion(r.memory, random);
    }

    /// The newest generation (empty before the first `cover`).
    pub fn newest(ms: *const MapSet) []align(std.heap.page_size_min) const u8 {
        const n = ms.count.load(.acquire);
        return if (n == 0) &.{} else ms.regions[n - 1].memory;
    }

    pub fn deinit(ms: *MapSet) void {
        for (ms.regions[0..ms.count.raw]) |*r| r.unmap();
        ms.count.raw = 0;
    }
};

fn adviseRegion(memory: []align(std.heap.page_size_min) u8, random: bool) void {
    if (builtin.os.tag != .linux) return;
    const advice: u32 = if (random) std.os.linux.MADV.RANDOM else std.os.linux.MADV.NORMAL;
    // Advice only: a kernel that refuses it reads as before.
    _ = std.os.linux.madvise(memory.ptr, memory.len, advice);
}
