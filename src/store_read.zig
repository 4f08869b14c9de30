//! The read path of a store: gathers into caller memory (dense batches, the
//! loader ring), the single-snapshot gather into library memory (ragged and
//! byte records, whose sizes the caller cannot know in advance), record sizes
//! and verify. Every function here works on one snapshot of the published
//! commit, takes no lock and makes no syscall per record.
const std = @import("std");
const assert = std.debug.assert;
const format = @import("format.zig");
const codec = @import("codec.zig");
const outbuf = @import("outbuf.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const store_cold = @import("store_cold.zig");
const Store = @import("Store.zig");
const Error = Store.Error;
const Codec = format.Codec;
const RecordLoc = format.RecordLoc;
const Commit = format.Commit;

pub const Part = enum(u8) { payload = 0, aux = 1 };

/// Where record i of a batch goes: at `offsets[i]` when given, else at
/// `i * stride` and then every record must be exactly `stride` bytes.
pub const Dest = struct {
    base: [*]u8,
    len: usize,
    stride: usize = 0,
    offsets: ?[*]const u64 = null,
    /// Written now and read only much later (a loader's step buffer): raw
    /// records are copied with codec.copyStream, and each lane fences its
    /// streaming stores before the gather returns.
    stream: bool = false,
};

/// Bytes of work below which a batch runs inline on the caller: handing half
/// to a second lane costs more than it saves. Measured on a 2-vCPU Xeon VM,
/// 1 lane against 2 (scripts/bench.py dense and scale, a sweep of batch sizes):
/// random raw copies of 50 KiB gain nothing (0.99-1.04x), of 192-384 KiB
/// 0.8-1.3x (256 x 1 KiB: 0.85x), of 1 MiB and more 1.6-2.2x; a second lane
/// that another tenant preempts makes the small ones lose. zstd frames gain
/// from ~6 KiB decoded (1.5-1.8x).
pub const inline_raw_bytes: u64 = 256 << 10;
pub const inline_decoded_bytes: u64 = 4 << 10;

/// Tries before a commit page that never reads consistently is called damaged.
const commit_reads_max: u32 = 1 << 20;

/// The published commit, read from the shared mapping. Another handle may be
/// rewriting the page while we read it, and a copy into the page cache is not
/// atomic, so a read is kept only when its checksum matches (a torn read is
/// retried): the record count and the data size always belong together.
pub fn publishedCommit(s: *const Store) Error!Commit {
    const commit_bytes = s.meta_map.memory[format.commit_offset..];
    const page: *const [@sizeOf(Commit) / 8]u64 = @ptrCast(@alignCast(commit_bytes.ptr));
    var tries: u32 = 0;
    while (tries < commit_reads_max) : (tries += 1) {
        var words: [@sizeOf(Commit) / 8]u64 = undefined;
        for (&words, page) |*w, *p| w.* = @atomicLoad(u64, p, .acquire);
        const c = std.mem.bytesToValue(Commit, std.mem.asBytes(&words));
        if (c.checksum == c.computeChecksum() and c.consistent()) return c;
        std.atomic.spinLoopHint();
    }
    return diag.fail(
        error.Corrupt,
        "the published commit is damaged (its checksum never matches)",
        .{},
    );
}

/// One consistent view of a store's committed records.
pub const Snapshot = struct {
    store: *Store,
    count: u64,
    locs: Store.Table,
    data: [*]const u8,
    data_size: u64,
};

pub fn snapshot(s: *Store) Error!Snapshot {
    const c = try publishedCommit(s);
    assert(c.consistent());
    return .{
        .store = s,
        .count = c.record_count,
        .locs = try s.table(c.record_count),
        .data = try s.dataMap(c.data_size),
        .data_size = c.data_size,
    };
}

/// The records one gather reads: record i is record `indices[i]` of the
/// store of snapshot `of[i]` (of snapshot 0 when `of` is null). One gather
/// may so span several stores (the shards of a ShardSet, a mixture's
/// sources): the checks, the lanes and the copies are the same code.
pub const Reads = struct {
    snaps: []const Snapshot,
    of: ?[]const u16 = null,
    indices: []const u64,

    pub fn snap(r: *const Reads, i: usize) *const Snapshot {
        assert(i < r.indices.len);
        if (r.of) |o| assert(o.len == r.indices.len);
        return &r.snaps[if (r.of) |o| o[i] else 0];
    }

    pub fn loc(r: *const Reads, i: usize) RecordLoc {
        return r.snap(i).locs.get(r.indices[i]);
    }

    /// Random indices miss the cache on their table entries: put every miss
    /// in flight before the checks wait on the first one.
    fn prefetchEntries(r: *const Reads) void {
        for (r.indices, 0..) |index, i| {
            const s = r.snap(i);
            if (index < s.count) s.locs.prefetch(index);
        }
    }
};

const GatherJob = struct {
    reads: Reads,
    dest: Dest,
    part: Part,
    /// Nonzero: a fixedStride() read of records of this size.
    fixed: u64 = 0,
    block_size: usize,
    // Written while the lanes run: on a cache line of its own, so a claim does
    // not evict the read-only fields above from the other lanes' caches.
    next_block: std.atomic.Value(usize) align(std.atomic.cache_line) = .init(0),
    failed: std.atomic.Value(bool) align(std.atomic.cache_line) = .init(false),
    fail_index: u64 = 0,

    fn destOffset(job: *const GatherJob, i: usize) usize {
        return if (job.dest.offsets) |o| @intCast(o[i]) else i * job.dest.stride;
    }

    fn work(job: *GatherJob, lane: usize) void {
        _ = lane;
        var lease: ?codec.DPool.Lease = null;
        defer if (lease) |l| codec.DPool.release(l);
        defer if (job.dest.stream) codec.streamFence();
        while (!job.failed.load(.monotonic)) {
            const block = job.next_block.fetchAdd(1, .monotonic);
            const start = block * job.block_size;
            if (start >= job.reads.indices.len) return;
            const stop = @min(start + job.block_size, job.reads.indices.len);
            if (job.fixed != 0) {
                job.copyFixed(start, stop);
                continue;
            }
            // Each lane fetches its own records a few ahead of its copy: the
            // misses overlap, and the lines land in the cache of the core that
            // copies them.
            const ahead = @min(stop, start + prefetch_distance);
            for (start..ahead) |i| prefetchRecord(job.reads.snap(i).data, job.reads.loc(i));
            for (start..stop) |i| {
                const next = i + prefetch_distance;
                if (next < stop) prefetchRecord(job.reads.snap(next).data, job.reads.loc(next));
                if (!job.copyOne(i, &lease)) return;
            }
        }
    }

    /// Records start..stop of a fixedStride() read, prefetched as in work().
    fn copyFixed(job: *const GatherJob, start: usize, stop: usize) void {
        const data = job.reads.snaps[0].data;
        const size: usize = @intCast(job.fixed);
        const idx = job.reads.indices;
        const span: usize = @intCast(@min(job.fixed, prefetch_span_max));
        // checkFixed proved them before any byte was written: the block's
        // rows fit the destination, and every record below the count lies
        // inside the committed data.
        assert(start < stop and stop <= idx.len and stop * size <= job.dest.len);
        assert(job.reads.snaps[0].count * job.fixed <= job.reads.snaps[0].data_size);
        const ahead = @min(stop, start + prefetch_distance);
        for (start..ahead) |i| prefetchSpan(data + @as(usize, @intCast(idx[i])) * size, span);
        for (start..stop) |i| {
            const next = i + prefetch_distance;
            if (next < stop) prefetchSpan(data + @as(usize, @intCast(idx[next])) * size, span);
            assert(idx[i] < job.reads.snaps[0].count);
            const src = data + @as(usize, @intCast(idx[i])) * size;
            const dst = job.dest.base[i * size ..][0..size];
            if (job.dest.stream) {
                codec.copyStream(dst, src[0..size]);
            } else {
                codec.copy(dst, src[0..size]);
            }
        }
    }

    fn copyOne(job: *GatherJob, i: usize, lease: *?codec.DPool.Lease) bool {
        const snap = job.reads.snap(i);
        const loc = snap.locs.get(job.reads.indices[i]);
        const at = job.destOffset(i);
        // checkBatch proved both before any byte was written: the record lies
        // inside its snapshot's data, and its part fits the destination.
        assert(loc.end() <= snap.data_size);
        assert(at + (if (job.part == .aux) loc.aux_size else loc.raw_size) <= job.dest.len);
        const src_aux = snap.data + loc.offset;
        if (job.part == .aux) {
            codec.copy(job.dest.base[at..][0..loc.aux_size], src_aux[0..loc.aux_size]);
            return true;
        }
        const src = (src_aux + loc.aux_size)[0..@intCast(loc.stored_size)];
        const dst = job.dest.base[at..][0..@intCast(loc.raw_size)];
        const c: Codec = @fromBackingInt(@intCast(loc.codec));
        if (c == .raw and job.dest.stream and src.len == dst.len) {
            codec.copyStream(dst, src);
            return true;
        }
        if (c != .raw and lease.* == null) {
            lease.* = codec.DPool.acquire() catch {
                job.fail(job.reads.indices[i]);
                return false;
            };
        }
        codec.decode(if (lease.*) |l| l.ctx else null, c, &snap.store.dict, src, dst) catch {
            job.fail(job.reads.indices[i]);
            return false;
        };
        return true;
    }

    fn fail(job: *GatherJob, index: u64) void {
        if (job.failed.cmpxchgStrong(false, true, .acq_rel, .monotonic) == null) {
            job.fail_index = index;
        }
    }
};

/// Starts fetching a record's first lines: every line of a small record (a
/// 200 B record spans up to 4), the first few of a large one, after which the
/// hardware prefetcher follows the sequential copy.
inline fn prefetchRecord(data: [*]const u8, loc: RecordLoc) void {
    const first = data + loc.offset;
    const span = @min(loc.storedTotal(), prefetch_span_max);
    const lines = (span + (loc.offset & 63) + 63) / 64;
    for (0..@intCast(lines)) |line| @prefetch(first + line * 64, .{});
}

const prefetch_span_max: u64 = 256;

/// Starts fetching the cache lines of bytes [first, first + span).
inline fn prefetchSpan(first: [*]const u8, span: usize) void {
    const lines = (span + (@intFromPtr(first) & 63) + 63) / 64;
    for (0..lines) |line| @prefetch(first + line * 64, .{});
}

/// How many records ahead of its copy a lane prefetches. Prefetching a whole
/// batch up front (in the check pass) stalled on the line-fill buffers and
/// pulled every record into the checking core's cache: 4096 random 200 B
/// records took 180-285 us on two lanes against 90-98 us now (2-vCPU Xeon;
/// 4, 8 and 16 measured alike).
const prefetch_distance: usize = 8;

/// Bytes a batch copies raw and decodes, which decide its lanes.
const Work = struct {
    raw_bytes: u64 = 0,
    decoded_bytes: u64 = 0,

    fn add(w: *Work, loc: RecordLoc, size: u64, part: Part) void {
        if (loc.codec == @backingInt(Codec.raw) or part == .aux) {
            w.raw_bytes += size;
        } else {
            w.decoded_bytes += size;
        }
    }

    fn worthLanes(w: Work) bool {
        return w.raw_bytes >= inline_raw_bytes or w.decoded_bytes >= inline_decoded_bytes;
    }

    /// Blocks per lane: as many as keep a lane that finishes early busy, but
    /// none smaller than `block_work_min`, since every claim is an atomic on a
    /// line that both lanes write (~0.1-0.2 µs across the cores of a VM).
    fn blocksPerLane(w: Work, lanes: usize) usize {
        const cost = w.raw_bytes + w.decoded_bytes * (inline_raw_bytes / inline_decoded_bytes);
        const blocks = cost / (block_work_min * @max(1, lanes));
        return @intCast(std.math.clamp(blocks, 1, 16));
    }
};

/// The least work (bytes copied, or their decoding's equivalent) in one block.
const block_work_min: u64 = 16 << 10;

/// Reads records `indices` into `dest`, decoding straight into it. All indices
/// and sizes are checked before any byte is written. `lane_cap` 0 = no cap.
pub fn gather(s: *Store, indices: []const u64, dest: Dest, part: Part, lane_cap: usize) Error!void {
    try s.enterRead();
    defer s.exitRead();
    if (indices.len == 0) return;
    const snap = [1]Snapshot{try snapshot(s)};
    try gatherReads(.{ .snaps = &snap, .indices = indices }, dest, part, lane_cap);
}

/// gather() of prepared reads (the caller holds a read on every store).
pub fn gatherReads(reads: Reads, dest: Dest, part: Part, lane_cap: usize) Error!void {
    for (reads.snaps) |sn| assert(sn.store.readers_active.load(.monotonic) >= 1);
    // Cold stores get their records' ranges read in first (store_cold.zig).
    const start = store_cold.beforeGather(reads);
    var work: Work = undefined;
    if (fixedStride(reads, dest, part)) |fixed| {
        try checkFixed(reads, dest, fixed);
        work = .{ .raw_bytes = reads.indices.len * fixed };
        try copyRecords(reads, dest, part, lane_cap, work, fixed);
    } else {
        work = try checkBatch(reads, dest, part);
        try copyRecords(reads, dest, part, lane_cap, work, 0);
    }
    store_cold.afterGather(reads, start, work.raw_bytes, work.decoded_bytes);
}

/// The record size when every read is a raw record of one fixed-width store
/// (computed locations, no table to read) going to a plain stride
/// destination, else null. Then the checks are one bound per index and the
/// copy is a strided memcpy: 256 random 200 B records took 20 ns each through
/// the general path and 12 here (2-vCPU Xeon, records in the last-level
/// cache), about what a bare C loop takes.
fn fixedStride(reads: Reads, dest: Dest, part: Part) ?u64 {
    if (reads.of != null or part != .payload or dest.offsets != null) return null;
    const fixed = reads.snaps[0].locs.fixed;
    if (fixed == 0 or fixed != dest.stride) return null;
    return fixed;
}

/// checkBatch() of a fixedStride() read: the committed data holds every
/// record below the count (checked once), so each index needs one compare.
fn checkFixed(reads: Reads, dest: Dest, fixed: u64) Error!void {
    const snap = &reads.snaps[0];
    const end = std.math.mul(u64, snap.count, fixed) catch std.math.maxInt(u64);
    if (end > snap.data_size) {
        return diag.fail(
            error.Corrupt,
            "{d} records of {d} bytes lie outside the committed data ({d} bytes)",
            .{ snap.count, fixed, snap.data_size },
        );
    }
    var highest: u64 = 0;
    for (reads.indices) |index| highest = @max(highest, index);
    if (highest >= snap.count) {
        // Name the first bad index in request order, as checkBatch does.
        for (reads.indices) |index| {
            if (index >= snap.count) return outOfRange(index, snap.count);
        }
    }
    const need = std.math.mul(u64, reads.indices.len, fixed) catch std.math.maxInt(u64);
    if (need > dest.len) {
        return diag.fail(error.SizeMismatch, "destination holds {d} bytes, the batch needs {d}", .{
            dest.len, need,
        });
    }
}

/// The checks of a gather into caller memory: every index in range, every
/// entry inside the committed data, every record fitting its destination.
fn checkBatch(reads: Reads, dest: Dest, part: Part) Error!Work {
    reads.prefetchEntries();
    var work: Work = .{};
    for (reads.indices, 0..) |index, i| {
        const snap = reads.snap(i);
        if (index >= snap.count) return outOfRange(index, snap.count);
        const loc = snap.locs.get(index);
        // Raw records must still be exactly their stored size (a memcpy has no
        // frame to fail on); compressed ones are checked by the decoder.
        const compressed = loc.codec != @backingInt(Codec.raw);
        try Store.checkLoc(loc, index, snap.data, snap.data_size, compressed);
        const size: u64 = if (part == .aux) loc.aux_size else loc.raw_size;
        try checkFits(dest, i, index, size);
        work.add(loc, size, part);
    }
    if (dest.offsets == null and reads.indices.len * dest.stride > dest.len) {
        return diag.fail(error.SizeMismatch, "destination holds {d} bytes, the batch needs {d}", .{
            dest.len, reads.indices.len * dest.stride,
        });
    }
    return work;
}

fn checkFits(dest: Dest, i: usize, index: u64, size: u64) Error!void {
    if (dest.offsets) |offsets| {
        const stop = std.math.add(u64, offsets[i], size) catch std.math.maxInt(u64);
        if (stop > dest.len) {
            return diag.fail(
                error.SizeMismatch,
                "record {d} ({d} bytes) does not fit the destination at offset {d}",
                .{ index, size, offsets[i] },
            );
        }
    } else if (size != dest.stride) {
        return diag.fail(
            error.SizeMismatch,
            "record {d} holds {d} bytes, expected {d}",
            .{ index, size, dest.stride },
        );
    }
}

fn outOfRange(index: u64, count: u64) Error {
    return diag.fail(
        error.OutOfRange,
        "index {d} is out of range for {d} records",
        .{ index, count },
    );
}

/// Copies (decodes) checked records into `dest` on the lanes `work` is worth;
/// `fixed` (from fixedStride, else 0) takes the strided copy.
fn copyRecords(
    reads: Reads,
    dest: Dest,
    part: Part,
    lane_cap: usize,
    work: Work,
    fixed: u64,
) Error!void {
    // An inline batch never asks for the lane count (pool.lanes() checks the
    // pid for a fork, a syscall per call).
    const worth = work.worthLanes();
    const per_lane = if (worth) work.blocksPerLane(pool.lanes()) else 1;
    const p = pool.plan(reads.indices.len, worth, lane_cap, per_lane);
    var job: GatherJob = .{
        .reads = reads,
        .dest = dest,
        .part = part,
        .fixed = fixed,
        .block_size = p.block_size,
    };
    pool.run(p.lanes, &job, GatherJob.work);
    if (job.failed.load(.acquire)) {
        return diag.fail(
            error.Corrupt,
            "record {d} is damaged (cannot be decoded)",
            .{job.fail_index},
        );
    }
}

/// Reads records `indices` back to back into one new buffer (from outbuf.zig;
/// the caller frees it with `outbuf.free`): every payload in request order, then
/// every record's aux bytes in request order. Writes each record's payload
/// and aux size to `raw_out[i]`/`aux_out[i]`. Sizes and bytes come from one
/// snapshot, so a record is never stitched from two. Returns an empty slice
/// (null pointer) when there are no bytes at all.
pub fn gatherAlloc(
    s: *Store,
    indices: []const u64,
    lane_cap: usize,
    raw_out: []u64,
    aux_out: []u64,
) Error![]u8 {
    try s.enterRead();
    defer s.exitRead();
    if (indices.len == 0) return &.{};
    const snap = [1]Snapshot{try snapshot(s)};
    return packedReads(s.gpa, .{ .snaps = &snap, .indices = indices }, lane_cap, raw_out, aux_out);
}

/// gatherAlloc() of prepared reads (the caller holds a read on every store).
pub fn packedReads(
    gpa: std.mem.Allocator,
    reads: Reads,
    lane_cap: usize,
    raw_out: []u64,
    aux_out: []u64,
) Error![]u8 {
    assert(raw_out.len == reads.indices.len);
    assert(aux_out.len == reads.indices.len);
    for (reads.snaps) |sn| assert(sn.store.readers_active.load(.monotonic) >= 1);
    const start = store_cold.beforeGather(reads);
    var work: Work = .{};
    var aux_total: u64 = 0;
    reads.prefetchEntries();
    for (reads.indices, raw_out, aux_out, 0..) |index, *raw, *aux, i| {
        const snap = reads.snap(i);
        if (index >= snap.count) return outOfRange(index, snap.count);
        const loc = snap.locs.get(index);
        // The buffer is sized by the entries: check them against their payloads.
        try Store.checkLoc(loc, index, snap.data, snap.data_size, false);
        raw.* = loc.raw_size;
        aux.* = loc.aux_size;
        work.add(loc, loc.raw_size, .payload);
        aux_total += loc.aux_size;
    }
    const payload_total = std.math.add(u64, work.raw_bytes, work.decoded_bytes) catch
        return tooLarge();
    const total = std.math.add(u64, payload_total, aux_total) catch return tooLarge();
    if (total == 0) return &.{};
    if (total > std.math.maxInt(usize) / 2) return tooLarge();
    const raw_ptr = outbuf.alloc(@intCast(total)) orelse
        return diag.fail(error.OutOfMemory, "no memory for a batch of {d} bytes", .{total});
    const buf = raw_ptr[0..@intCast(total)];
    errdefer outbuf.free(raw_ptr);
    const offsets = gpa.alloc(u64, reads.indices.len) catch return error.OutOfMemory;
    defer gpa.free(offsets);
    try copyPacked(reads, buf, raw_out, offsets, 0, .payload, lane_cap, work);
    assert(buf.len == payload_total + aux_total);
    if (aux_total > 0) {
        const aux_work: Work = .{ .raw_bytes = aux_total };
        try copyPacked(reads, buf, aux_out, offsets, payload_total, .aux, lane_cap, aux_work);
    }
    store_cold.afterGather(reads, start, work.raw_bytes + aux_total, work.decoded_bytes);
    return buf;
}

fn tooLarge() Error {
    return diag.fail(
        error.OutOfMemory,
        "the batch's records add up to more bytes than fit in memory",
        .{},
    );
}

/// Copies `part` of checked records back to back into `buf` from `start`.
fn copyPacked(
    reads: Reads,
    buf: []u8,
    part_sizes: []const u64,
    offsets: []u64,
    start: u64,
    part: Part,
    lane_cap: usize,
    work: Work,
) Error!void {
    assert(offsets.len == part_sizes.len);
    var at = start;
    for (offsets, part_sizes) |*o, size| {
        o.* = at;
        at += size;
    }
    // The parts end inside the buffer: payloads before `start` + their sum,
    // aux bytes from there to the end.
    assert(at <= buf.len);
    const dest: Dest = .{ .base = buf.ptr, .len = buf.len, .offsets = offsets.ptr };
    try copyRecords(reads, dest, part, lane_cap, work, 0);
}

/// Checks every committed record: location, checksum, and that it decodes to
/// its recorded size. Returns the first damaged record's index in `bad_index`.
pub fn verify(s: *Store, bad_index: *u64) Error!void {
    try s.enterRead();
    defer s.exitRead();
    bad_index.* = std.math.maxInt(u64);
    const c = try publishedCommit(s);
    const locs = try s.table(c.record_count);
    const data = try s.dataMap(c.data_size);
    var live: u64 = 0;
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(s.gpa);
    const lease = codec.DPool.acquire() catch return error.OutOfMemory;
    defer codec.DPool.release(lease);
    for (0..@intCast(c.record_count)) |i| {
        bad_index.* = i;
        const loc = locs.withChecksum(i);
        try checkRecord(s, loc, i, data, c.data_size, lease.ctx, &scratch);
        live +|= loc.storedTotal();
    }
    bad_index.* = std.math.maxInt(u64);
    if (live != c.live_bytes) {
        return diag.fail(
            error.Corrupt,
            "live byte count {d} disagrees with the records ({d})",
            .{ c.live_bytes, live },
        );
    }
    try @import("windows.zig").verifyFile(s.gpa, s, c);
}

/// Checks the records at `indices` (location inside the committed data,
/// sizes plausible, checksum; no decode): for a cache that filled them from
/// elsewhere and must not trust them until checked. Writes the positions in
/// `indices` of the records that fail to `bad[0..]` (capacity indices.len)
/// and returns how many failed. A damaged record is a result, not an error;
/// an index past the committed records is OutOfRange.
pub fn verifyRecords(s: *Store, indices: []const u64, bad: []u64) Error!usize {
    assert(bad.len >= indices.len);
    try s.enterRead();
    defer s.exitRead();
    const c = try publishedCommit(s);
    for (indices) |i| {
        if (i >= c.record_count) {
            return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records", .{
                i, c.record_count,
            });
        }
    }
    const locs = try s.table(c.record_count);
    const data = try s.dataMap(c.data_size);
    var failed: usize = 0;
    for (indices, 0..) |i, k| {
        const loc = locs.withChecksum(i);
        const ok = if (Store.checkLoc(loc, i, data, c.data_size, false)) |_| blk: {
            const aux = data[@intCast(loc.offset)..][0..loc.aux_size];
            const stored = (data + loc.offset + loc.aux_size)[0..@intCast(loc.stored_size)];
            break :blk format.storedChecksum(aux, stored, i) == loc.checksum;
        } else |e| switch (e) {
            error.Corrupt => false,
            else => return e,
        };
        if (!ok) {
            bad[failed] = k;
            failed += 1;
        }
    }
    return failed;
}

/// One record's full check: inside the data, checksum, decodes to its size.
pub fn checkRecord(
    s: *Store,
    loc: RecordLoc,
    i: u64,
    data: [*]const u8,
    data_size: u64,
    dctx: *codec.ZSTD_DCtx,
    scratch: *std.ArrayList(u8),
) Error!void {
    try Store.checkLoc(loc, i, data, data_size, false);
    assert(loc.end() <= data_size);
    const aux = data[@intCast(loc.offset)..][0..loc.aux_size];
    const stored = (data + loc.offset + loc.aux_size)[0..@intCast(loc.stored_size)];
    if (format.storedChecksum(aux, stored, i) != loc.checksum) {
        return diag.fail(error.Corrupt, "record {d} fails its checksum", .{i});
    }
    scratch.resize(s.gpa, @intCast(loc.raw_size)) catch return error.OutOfMemory;
    codec.decode(dctx, @fromBackingInt(@intCast(loc.codec)), &s.dict, stored, scratch.items) catch
        return diag.fail(error.Corrupt, "record {d} does not decode to its recorded size", .{i});
    if (loc.codec != @backingInt(Codec.raw) and !codec.seekTableMatches(stored, loc.raw_size)) {
        return diag.fail(error.Corrupt, "record {d} has a seek table that does not match it", .{i});
    }
}
