//! Reads of records that are not in memory: stores larger than the page cache.
//!
//! A gather copies records out of shared mappings. When their pages are not
//! in the page cache, each fault reads one page (or the device's readahead
//! window around it) on the faulting thread, one at a time: on the bench
//! machine's virtio disk, random 12 KiB records came through a mapping at
//! 28 MiB/s (each fault read the 8 MiB readahead window) or 36 MiB/s with
//! MADV_RANDOM (one 4 KiB read at queue depth 1), against 990 MiB/s for
//! `fio` at queue depth 32.
//!
//! So reads of a cold store first bring in the batch's exact byte ranges:
//! `mincore` says which ranges are missing and `posix_fadvise(WILLNEED)`
//! queues reads for all of them at once. The kernel reads them
//! asynchronously, so one thread keeps the device's queue full, and the copy
//! that follows waits only for reads that are already in flight (590 MiB/s in
//! the same test). Ranges adjacent in request order are merged: a slice or a
//! sequential batch is one read.
//!
//! Whether a store is cold is learned, never checked per warm gather:
//! - the first read through a handle checks residency (once: 70 us for 256
//!   random 12 KiB records), so a store opened cold is read explicitly from
//!   its first batch (a fault through the mapping read the whole 8 MiB
//!   readahead window here: 1 s for the first 256 random records);
//! - a gather times itself (two clock reads); one slower than a batch of
//!   cached records can be (`slowNs`) marks its stores cold;
//! - while a store is cold, every read of it checks residency first, and
//!   `warm_streak` checks in a row that find every page in memory make it
//!   warm again;
//! - `prefetch` (the loader's prefetch of the next steps, lx_prefetch) also
//!   checks on every `probe_every`th call while the store is warm, so a store
//!   that is cold from the start is found before a gather pays for it.
//! A cold store's mappings are advised MADV_RANDOM, so a stray fault reads
//! its own page, not a readahead window. Linux only; elsewhere gathers read
//! through the mappings as before.
const std = @import("std");
const builtin = @import("builtin");
const linux = std.os.linux;
const format = @import("format.zig");
const pool = @import("pool.zig");
const Store = @import("Store.zig");
const store_read = @import("store_read.zig");

const Reads = store_read.Reads;
const Snapshot = store_read.Snapshot;

pub const enabled = builtin.os.tag == .linux;

/// Residency checks in a row that find everything in memory before a cold
/// store counts as warm again. A loader that prefetches ahead keeps finding
/// misses in its own checks, so its store stays cold while it is read cold.
const warm_streak: u32 = 8;

/// A warm store's residency is probed on every this-many prefetch calls.
const probe_every: u32 = 32;

/// Pages one `mincore` call covers (its vector lives on the stack).
const mincore_pages: usize = 256;

/// How long a gather of cached records may take before it counts as having
/// waited for the disk: a fixed allowance for a preempted thread on a shared
/// machine, plus time per record and per byte well below what a fault that
/// reads the device costs (~100 us here), and far above a copy (~1 us per
/// 12 KiB). Decoded bytes get 5x the raw allowance (zstd on a busy core).
fn slowNs(records: usize, raw_bytes: u64, decoded_bytes: u64) u64 {
    return 2_000_000 + @as(u64, records) * 20_000 + raw_bytes * 4 + decoded_bytes * 20;
}

/// Monotonic nanoseconds, 0 when unknown (the pool's clock).
pub fn now() u64 {
    if (!enabled) return 0;
    return pool.monotonicNs();
}

fn isCold(s: *const Store) bool {
    return s.data_maps.residency.cold.load(.monotonic);
}

/// A gather checks residency on a cold store, and on the first read of a handle.
fn gatherChecks(s: *const Store) bool {
    const r = &s.data_maps.residency;
    return r.cold.load(.monotonic) or !r.checked.load(.monotonic);
}

/// Before a gather of `reads`: brings in the records of cold stores (without
/// waiting: the copy waits in its faults). Returns the clock to time the
/// gather with, or null when a store was cold (then it is not timed).
pub fn beforeGather(reads: Reads) ?u64 {
    if (!enabled) return null;
    var any = false;
    for (reads.snaps) |*snap| any = any or gatherChecks(snap.store);
    if (!any) return now();
    const missing = bringIn(reads, null, false);
    for (reads.snaps) |*snap| {
        if (gatherChecks(snap.store)) note(snap.store, missing);
    }
    return null;
}

/// After a timed gather (`start` from beforeGather): a gather slower than
/// cached records allow marks its stores cold.
pub fn afterGather(reads: Reads, start: ?u64, raw_bytes: u64, decoded_bytes: u64) void {
    const t0 = start orelse return;
    if (t0 == 0) return;
    const elapsed = now() -| t0;
    if (elapsed <= slowNs(reads.indices.len, raw_bytes, decoded_bytes)) return;
    for (reads.snaps) |*snap| note(snap.store, true);
}

/// The loader's prefetch of a step (lx_prefetch): brings the records of
/// `reads` into memory (with `wait`, returns once they are there), when their
/// store is cold, when `force`, or on a warm store's probe. `check` holds one
/// flag per snapshot (scratch of the caller's).
pub fn prefetch(reads: Reads, force: bool, wait: bool, check: []bool) void {
    if (!enabled) return;
    std.debug.assert(check.len == reads.snaps.len);
    var any = false;
    for (reads.snaps, check) |*snap, *c| {
        const r = &snap.store.data_maps.residency;
        const probe = r.probes.fetchAdd(1, .monotonic) % probe_every == 0;
        c.* = force or r.cold.load(.monotonic) or probe;
        any = any or c.*;
    }
    if (!any) return;
    const missing = bringIn(reads, check, wait);
    for (reads.snaps, check) |*snap, c| {
        if (c) note(snap.store, missing);
    }
}

/// What a residency check found: a miss makes the store cold at once; a
/// streak of full hits makes a cold store warm.
fn note(s: *Store, missing: bool) void {
    const maps = &s.data_maps;
    const r = &maps.residency;
    r.checked.store(true, .monotonic);
    if (missing) {
        r.streak.store(0, .monotonic);
        if (!r.cold.swap(true, .monotonic)) {
            maps.adviseRandom(true);
            s.index_maps.adviseRandom(true);
        }
        return;
    }
    const streak = r.streak.fetchAdd(1, .monotonic) + 1;
    if (streak >= warm_streak and r.cold.swap(false, .monotonic)) {
        maps.adviseRandom(false);
        s.index_maps.adviseRandom(false);
    }
}

/// Checks the byte ranges of the records of `reads` (those of snapshots
/// flagged in `check`, or of the stores gatherChecks() picks when null) and
/// queues reads of the missing ones, all before waiting for any; with
/// `wait`, returns only once they are in memory (and mapped). Table entries
/// come first for stores whose locations live in a table. Returns whether
/// anything was missing.
fn bringIn(reads: Reads, check: ?[]const bool, wait: bool) bool {
    // A location must be in memory to be read: entries are waited for.
    const entries_missing = eachRange(reads, check, .entries, .queue);
    if (entries_missing) _ = eachRange(reads, check, .entries, .touch);
    const data_missing = eachRange(reads, check, .data, .queue);
    if (data_missing and wait) _ = eachRange(reads, check, .data, .touch);
    return entries_missing or data_missing;
}

const What = enum { entries, data };

/// Runs `mode` over the ranges of `what` of the selected records: the
/// table entries of table-layout stores, or the records' bytes.
fn eachRange(reads: Reads, check: ?[]const bool, what: What, mode: Mode) bool {
    var ranges: Ranges = .{ .mode = mode };
    for (reads.indices, 0..) |index, i| {
        const snap = reads.snap(i);
        if (!selected(reads, check, i) or index >= snap.count) continue;
        switch (what) {
            .entries => {
                if (snap.locs.fixed != 0) continue;
                const size = @sizeOf(format.RecordLoc);
                const table: [*]const u8 = @ptrCast(snap.locs.locs);
                const file: Mapped = .{
                    .base = table,
                    .limit = snap.count * size,
                    .fd = snap.store.index.handle,
                };
                ranges.add(file, index * size, size);
            },
            .data => {
                const loc = snap.locs.get(index);
                const end = loc.checkedEnd() orelse continue;
                if (end > snap.data_size or end == loc.offset) continue; // the gather reports it
                const file: Mapped = .{
                    .base = snap.data,
                    .limit = snap.data_size,
                    .fd = snap.store.data.handle,
                };
                ranges.add(file, loc.offset, end - loc.offset);
            },
        }
    }
    return ranges.finish();
}

fn selected(reads: Reads, check: ?[]const bool, i: usize) bool {
    const k = if (reads.of) |o| o[i] else 0;
    return if (check) |c| c[k] else gatherChecks(reads.snaps[k].store);
}

/// A mapped file: `base` maps its bytes [0, limit).
const Mapped = struct {
    base: [*]const u8,
    limit: u64,
    fd: linux.fd_t,
};

const Mode = enum {
    /// Queue a read of each range not wholly in memory.
    queue,
    /// Touch every page of each range: returns once they are in, and mapped.
    touch,
};

/// Byte ranges of mapped files, merged while adjacent in request order.
const Ranges = struct {
    mode: Mode,
    file: ?Mapped = null,
    start: u64 = 0,
    end: u64 = 0,
    missing: bool = false,

    fn add(r: *Ranges, file: Mapped, start: u64, len: u64) void {
        if (r.file) |f| {
            if (f.base == file.base and r.end == start) {
                r.end += len;
                return;
            }
        }
        r.flush();
        r.file = file;
        r.start = start;
        r.end = start + len;
    }

    fn finish(r: *Ranges) bool {
        r.flush();
        return r.missing;
    }

    fn flush(r: *Ranges) void {
        const f = r.file orelse return;
        r.file = null;
        if (r.end > f.limit) return; // the gather reports it
        const page = std.heap.pageSize();
        const first = std.mem.alignBackward(u64, r.start, page);
        const last = std.mem.alignForward(u64, r.end, page);
        switch (r.mode) {
            .queue => if (!resident(f.base, first, last)) {
                r.missing = true;
                // Advice: where the kernel refuses it, the copy's faults read the pages.
                const len: i64 = @intCast(r.end - r.start);
                _ = linux.fadvise(f.fd, @intCast(r.start), len, linux.POSIX_FADV.WILLNEED);
            },
            .touch => {
                var at = first;
                while (at < last) : (at += page) {
                    _ = @as(*const volatile u8, @ptrCast(f.base + @as(usize, @intCast(at)))).*;
                }
            },
        }
    }
};

/// Whether every page of [first, last) (page-aligned offsets) is in memory.
fn resident(base: [*]const u8, first: u64, last: u64) bool {
    const page = std.heap.pageSize();
    var vec: [mincore_pages]u8 = undefined;
    var at = first;
    while (at < last) {
        const len: usize = @intCast(@min(last - at, mincore_pages * page));
        const addr: [*]u8 = @constCast(base + @as(usize, @intCast(at)));
        if (linux.errno(linux.mincore(addr, len, &vec)) != .SUCCESS) return false;
        for (vec[0 .. len / page]) |v| if (v & 1 == 0) return false;
        at += len;
    }
    return true;
}

test "a cold store is found on its first read, read exactly, and turns warm again" {
    if (!enabled) return error.SkipZigTest;
    const testing = std.testing;
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", gpa);
    defer gpa.free(base);
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/cold", .{base});
    const size = 3 * 4096;
    const s = try Store.open(gpa, path, .{ .create = true, .codec = .raw, .fixed_size = size });
    defer s.close();
    const block = try gpa.alloc(u8, 64 * size);
    defer gpa.free(block);
    for (block, 0..) |*b, i| b.* = @truncate(i / size);
    var ptrs: [64][*]const u8 = undefined;
    var szs: [64]u64 = @splat(size);
    for (&ptrs, 0..) |*p, i| p.* = block[i * size ..].ptr;
    _ = try s.append(.{ .ptrs = &ptrs, .sizes = &szs, .count = 64 }, false);
    try s.sync();
    _ = linux.fadvise(s.data.handle, 0, 0, linux.POSIX_FADV.DONTNEED);
    const out = try gpa.alloc(u8, 2 * size);
    defer gpa.free(out);
    const dest: Store.Dest = .{ .base = out.ptr, .len = out.len, .stride = size };
    const r = &s.data_maps.residency;
    try s.gather(&.{ 3, 40 }, dest, .payload, 0);
    try testing.expectEqual(@as(u8, 3), out[0]);
    try testing.expectEqual(@as(u8, 40), out[size]);
    const memory = s.data_maps.newest();
    if (resident(memory.ptr, 20 * size, 21 * size)) return error.SkipZigTest; // no page cache here
    try testing.expect(r.checked.load(.monotonic) and r.cold.load(.monotonic));
    try testing.expect(s.data_maps.random);
    try testing.expect(resident(memory.ptr, 3 * size, 4 * size));
    try testing.expect(resident(memory.ptr, 40 * size, 41 * size));
    // Reads that find everything in memory make it warm again, advice undone.
    for (0..warm_streak) |_| try s.gather(&.{ 3, 40 }, dest, .payload, 0);
    try testing.expect(!r.cold.load(.monotonic));
    try testing.expect(!s.data_maps.random);
}

test "a gather slower than cached records allow is one that waited for the disk" {
    try std.testing.expect(slowNs(256, 3 << 20, 0) < 20_000_000);
    try std.testing.expect(slowNs(256, 3 << 20, 0) > 2_000_000 + 256 * 10_000);
    try std.testing.expect(slowNs(1, 0, 1 << 20) > slowNs(1, 1 << 20, 0));
}
