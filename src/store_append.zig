//! The write path of a store: append (compress on all lanes, place serially,
//! write data, then the table, then publish the commit), staged appends that
//! publish together, and sync.
//!
//! Publication order is what makes a kill -9 safe: a reader trusts only
//! records below the published record count, and the data and table entries
//! of those records are written before the commit that counts them.
//!
//! An append holds the handle's write mutex from start to end, compression
//! included: its buffers live in the handle (`Scratch`, grown when a batch
//! needs more and kept), so a steady stream of appends allocates nothing.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const format = @import("format.zig");
const codec = @import("codec.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const fsio = @import("fsio.zig");
const Store = @import("Store.zig");
const store_read = @import("store_read.zig");
const Error = Store.Error;
const Codec = format.Codec;
const RecordLoc = format.RecordLoc;
const Commit = format.Commit;

pub const Batch = struct {
    ptrs: [*]const [*]const u8,
    sizes: [*]const u64,
    aux_ptrs: ?[*]const [*]const u8 = null,
    aux_sizes: ?[*]const u64 = null,
    count: usize,

    fn record(b: Batch, i: usize) []const u8 {
        assert(i < b.count);
        return b.ptrs[i][0..@intCast(b.sizes[i])];
    }

    fn aux(b: Batch, i: usize) []const u8 {
        assert(i < b.count);
        const sz = b.aux_sizes orelse return &.{};
        // Both given or neither (lx_append checks it).
        assert(b.aux_ptrs != null);
        return b.aux_ptrs.?[i][0..@intCast(sz[i])];
    }
};

/// The buffers of one append, owned by the handle and reused.
pub const Scratch = struct {
    locs: std.ArrayList(RecordLoc) = .empty,
    stored: std.ArrayList([]const u8) = .empty,
    /// Where record i's frame may go in `frames`: [bounds[i], bounds[i + 1]).
    bounds: std.ArrayList(usize) = .empty,
    frames: std.ArrayList(u8) = .empty,
    slices: std.ArrayList([]const u8) = .empty,
    sums: std.ArrayList(u32) = .empty,
    /// Short records are copied here and written together (see SliceWriter).
    stage: std.ArrayList(u8) = .empty,

    /// Frame space kept between appends; a larger batch's is given back.
    const frames_kept_max: usize = 128 << 20;

    fn reserve(sc: *Scratch, gpa: Allocator, count: usize) Error!void {
        sc.locs.resize(gpa, count) catch return error.OutOfMemory;
        sc.stored.resize(gpa, count) catch return error.OutOfMemory;
        sc.slices.resize(gpa, 2 * count) catch return error.OutOfMemory;
        sc.sums.resize(gpa, count) catch return error.OutOfMemory;
        sc.bounds.resize(gpa, count + 1) catch return error.OutOfMemory;
        sc.stage.resize(gpa, stage_size) catch return error.OutOfMemory;
        assert(sc.locs.items.len == count);
        assert(sc.bounds.items.len == count + 1);
    }

    fn trim(sc: *Scratch, gpa: Allocator) void {
        if (sc.frames.capacity > frames_kept_max) sc.frames.clearAndFree(gpa);
    }

    pub fn deinit(sc: *Scratch, gpa: Allocator) void {
        sc.locs.deinit(gpa);
        sc.stored.deinit(gpa);
        sc.bounds.deinit(gpa);
        sc.frames.deinit(gpa);
        sc.slices.deinit(gpa);
        sc.sums.deinit(gpa);
        sc.stage.deinit(gpa);
    }
};

fn validate(s: *const Store, batch: Batch) Error!void {
    const fixed = s.header.fixed_size;
    for (0..batch.count) |i| {
        if (batch.aux(i).len > Store.aux_size_max) {
            return diag.fail(error.InvalidArgument, "record {d}: aux of {d} bytes exceeds {d}", .{
                i, batch.aux(i).len, Store.aux_size_max,
            });
        }
        if (fixed != 0 and (batch.sizes[i] != fixed or batch.aux(i).len != 0)) {
            return diag.fail(
                error.SizeMismatch,
                "record {d} holds {d} bytes; this fixed-width store takes exactly {d}",
                .{ i, batch.sizes[i], fixed },
            );
        }
    }
}

/// Appends `batch`; returns the index of its first record. With `stage`, the
/// records are written but not published: several staged appends become
/// visible together at `publish(true)` (an append larger than memory, atomic
/// as a whole), or are dropped by `publish(false)`.
pub fn append(s: *Store, batch: Batch, stage: bool) Error!u64 {
    try validate(s, batch);
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    if (batch.count == 0) {
        try s.checkUsable();
        if (s.staged) |st| return st.record_count;
        return s.recordCount();
    }
    try s.beginMutation();
    if (s.header.fixed_size != 0 and contiguous(batch, s.header.fixed_size)) {
        return appendDense(s, batch, stage);
    }
    defer s.scratch.trim(s.gpa);
    try encode(s, batch);
    return place(s, batch, stage);
}

const EncodeJob = struct {
    store: *Store,
    batch: Batch,
    block_size: usize,
    next_block: std.atomic.Value(usize) = .init(0),
    failed: std.atomic.Value(bool) = .init(false),

    fn work(job: *EncodeJob, lane: usize) void {
        _ = lane;
        var lease: ?codec.CPool.Lease = null;
        defer if (lease) |l| codec.CPool.release(l);
        while (true) {
            const block = job.next_block.fetchAdd(1, .monotonic);
            const start = block * job.block_size;
            if (start >= job.batch.count) return;
            for (start..@min(start + job.block_size, job.batch.count)) |i| {
                if (!job.encodeOne(i, &lease)) return;
            }
        }
    }

    fn encodeOne(job: *EncodeJob, i: usize, lease: *?codec.CPool.Lease) bool {
        const s = job.store;
        const sc = &s.scratch;
        const store_codec: Codec = @fromBackingInt(@intCast(s.header.codec));
        const src = job.batch.record(i);
        var c: Codec = .raw;
        var stored = src;
        if (store_codec != .raw and src.len > 0) {
            if (lease.* == null) {
                lease.* = codec.CPool.acquire() catch {
                    job.failed.store(true, .release);
                    return false;
                };
                codec.configure(lease.*.?.ctx, store_codec, s.header.level, &s.dict);
            }
            const dst = sc.frames.items[sc.bounds.items[i]..sc.bounds.items[i + 1]];
            const frame_size = s.header.frame_size;
            const got = if (codec.frameCount(src.len, frame_size) > 1)
                codec.encodeSeekable(lease.*.?.ctx, src, dst, frame_size)
            else
                codec.encode(lease.*.?.ctx, src, dst);
            if (got) |n| {
                // A frame is kept only when smaller than the record (else raw).
                assert(n < src.len);
                c = store_codec;
                stored = dst[0..n];
            }
        }
        const aux = job.batch.aux(i);
        assert(aux.len <= Store.aux_size_max); // validate() refused longer ones
        assert(c != .raw or stored.len == src.len);
        sc.stored.items[i] = stored;
        sc.locs.items[i] = .{
            .offset = 0,
            .stored_size = stored.len,
            .raw_size = src.len,
            .checksum = format.recordChecksum(aux, stored),
            .codec = @backingInt(c),
            ._reserved = 0,
            .aux_size = @intCast(aux.len),
        };
        return true;
    }
};

/// Compresses the batch into the handle's scratch, on all lanes when it is
/// large enough to be worth them. Fills scratch.locs (offsets still 0) and
/// scratch.stored (the bytes to write for each payload).
fn encode(s: *Store, batch: Batch) Error!void {
    const sc = &s.scratch;
    try sc.reserve(s.gpa, batch.count);
    const compressing = s.header.codec != @backingInt(Codec.raw);
    var raw_total: u64 = 0;
    sc.bounds.items[0] = 0;
    for (0..batch.count) |i| {
        const size: usize = @intCast(batch.sizes[i]);
        raw_total += size;
        const frames = codec.frameCount(size, s.header.frame_size);
        const bound = if (!compressing or size == 0)
            0
        else if (frames > 1)
            codec.seekableBound(size, s.header.frame_size)
        else
            codec.compressBound(size);
        sc.bounds.items[i + 1] = sc.bounds.items[i] + bound;
    }
    sc.frames.resize(s.gpa, sc.bounds.items[batch.count]) catch return error.OutOfMemory;
    assert(sc.frames.items.len == sc.bounds.items[batch.count]);
    const threshold: u64 = if (compressing) 64 << 10 else store_read.inline_raw_bytes;
    const p = pool.plan(batch.count, raw_total >= threshold, 0, 4);
    var job: EncodeJob = .{ .store = s, .batch = batch, .block_size = p.block_size };
    pool.run(p.lanes, &job, EncodeJob.work);
    if (job.failed.load(.acquire)) {
        return diag.fail(error.OutOfMemory, "no memory for a compression context", .{});
    }
}

/// Places the encoded records after the last one, writes data then table,
/// and publishes (or stages) the commit that counts them.
fn place(s: *Store, batch: Batch, stage: bool) Error!u64 {
    const sc = &s.scratch;
    var c = s.staged orelse s.commit;
    assert(c.consistent());
    const first = c.record_count;
    const fixed = s.header.fixed_size;
    // Fixed width: record i lives at i * fixed_size, so the data must end
    // exactly at the first new record (readCommit holds every commit to it).
    assert(fixed == 0 or c.data_size == first * fixed);
    var at = c.data_size;
    for (sc.locs.items[0..batch.count], 0..) |*loc, i| {
        loc.offset = at;
        loc.checksum ^= format.indexTweak(first + i);
        assert(fixed == 0 or loc.storedTotal() == fixed); // validate() and raw codec
        at += loc.storedTotal();
        sc.slices.items[2 * i] = batch.aux(i);
        sc.slices.items[2 * i + 1] = sc.stored.items[i];
    }
    const stored_total = at - c.data_size;
    const slices = sc.slices.items[0 .. 2 * batch.count];
    writeSlices(s.data, slices, c.data_size, sc.stage.items) catch |e|
        return Store.ioFail(e, "writing data");
    if (s.header.fixed_size != 0) {
        // Fixed width: the location is implied; only the checksums are stored.
        for (sc.locs.items[0..batch.count], sc.sums.items[0..batch.count]) |loc, *sum| {
            sum.* = loc.checksum;
        }
        const sums = std.mem.sliceAsBytes(sc.sums.items[0..batch.count]);
        assert(sums.len == batch.count * format.fixed_entry_size);
        fsio.write(s.index, "index", sums, first * format.fixed_entry_size) catch |e|
            return Store.ioFail(e, "writing the record table");
    } else {
        // The new entries name exactly the bytes just written, back to back.
        for (sc.locs.items[0..batch.count]) |loc| assert(loc.offset >= c.data_size);
        for (sc.locs.items[0..batch.count]) |loc| assert(loc.end() <= at);
        const locs = std.mem.sliceAsBytes(sc.locs.items[0..batch.count]);
        fsio.write(s.index, "index", locs, first * @sizeOf(RecordLoc)) catch |e|
            return Store.ioFail(e, "writing the record table");
    }
    c.record_count = first + batch.count;
    c.data_size = at;
    c.live_bytes += stored_total;
    assert(fixed == 0 or c.data_size == c.record_count * fixed);
    try settle(s, c, stage);
    return first;
}

/// Runs of adjacent slices up to this many bytes are copied into the stage
/// and written together; longer ones go to the file directly, with no copy.
/// Zig's vectored write passes at most 8 buffers per syscall, so writing 200 B
/// frames slice by slice cost one syscall per 8 records (20978 `pwritev`
/// calls for 32 MiB of 200 B records); staged, it is one per `stage_size`.
const stage_run_max: usize = 32 << 10;
const stage_size: usize = 1 << 20;

/// Writes slices back to back from file offset `at`: adjacent slices (a dense
/// array) become one run, short runs are staged, long runs written directly.
const SliceWriter = struct {
    file: std.Io.File,
    stage: []u8,
    at: u64,
    staged: usize = 0,
    run: []const u8 = &.{},

    fn add(w: *SliceWriter, sl: []const u8) !void {
        if (sl.len == 0) return;
        if (w.run.len > 0 and w.run.ptr + w.run.len == sl.ptr) {
            w.run = w.run.ptr[0 .. w.run.len + sl.len];
            return;
        }
        try w.emit();
        w.run = sl;
    }

    fn emit(w: *SliceWriter) !void {
        assert(w.staged <= w.stage.len);
        const run = w.run;
        w.run = &.{};
        if (run.len == 0) return;
        if (run.len > stage_run_max or run.len > w.stage.len) {
            try w.flush();
            try fsio.write(w.file, "data", run, w.at);
        } else {
            if (w.staged + run.len > w.stage.len) try w.flush();
            assert(w.staged + run.len <= w.stage.len);
            @memcpy(w.stage[w.staged..][0..run.len], run);
            w.staged += run.len;
        }
        w.at += run.len;
    }

    /// Writes the staged bytes, which end at `at`.
    fn flush(w: *SliceWriter) !void {
        if (w.staged == 0) return;
        assert(w.staged <= w.stage.len);
        assert(w.at >= w.staged);
        try fsio.write(w.file, "data", w.stage[0..w.staged], w.at - w.staged);
        w.staged = 0;
    }

    fn finish(w: *SliceWriter) !void {
        try w.emit();
        try w.flush();
    }
};

/// Writes `slices` back to back at `offset` through `stage` (see SliceWriter).
fn writeSlices(file: std.Io.File, slices: []const []const u8, offset: u64, stage: []u8) !void {
    var w: SliceWriter = .{ .file = file, .stage = stage, .at = offset };
    var total: u64 = 0;
    for (slices) |sl| {
        total += sl.len;
        try w.add(sl);
    }
    try w.finish();
    // Every byte went to its place: nothing left staged, the file written
    // up to exactly offset + total.
    assert(w.staged == 0);
    assert(w.at == offset + total);
}

/// True when the batch's records lie back to back in memory (a dense array).
fn contiguous(batch: Batch, fixed: u64) bool {
    const base = @intFromPtr(batch.ptrs[0]);
    for (0..batch.count) |i| {
        if (@intFromPtr(batch.ptrs[i]) != base + i * fixed) return false;
    }
    return true;
}

const WriteError = @typeInfo(
    @typeInfo(@TypeOf(fsio.write)).@"fn".return_type.?,
).error_union.error_set;

/// The dense append's two jobs, overlapped: lane 0 writes the block to the
/// data file while the other lanes checksum it, then lane 0 joins them.
const DenseAppendJob = struct {
    src: [*]const u8,
    fixed: usize,
    sums: []u32,
    block_size: usize,
    file: std.Io.File,
    offset: u64,
    /// The index of the block's first record (checksums are bound to it).
    first: u64,
    next_block: std.atomic.Value(usize) = .init(0),
    write_error: ?WriteError = null,

    fn work(job: *DenseAppendJob, lane: usize) void {
        assert(job.fixed >= 1);
        if (lane == 0) {
            const block = job.src[0 .. job.sums.len * job.fixed];
            fsio.write(job.file, "data", block, job.offset) catch |e| {
                job.write_error = e;
            };
        }
        while (true) {
            const start = job.next_block.fetchAdd(1, .monotonic) * job.block_size;
            if (start >= job.sums.len) return;
            for (start..@min(start + job.block_size, job.sums.len)) |i| {
                const record = job.src[i * job.fixed ..][0..job.fixed];
                job.sums[i] = format.storedChecksum(&.{}, record, job.first + i);
            }
        }
    }
};

/// append() for a fixed-width store given one contiguous array: one write of
/// the whole block, overlapped with its checksums, which go straight into the
/// index; no per-record tables.
fn appendDense(s: *Store, batch: Batch, stage: bool) Error!u64 {
    const fixed: usize = @intCast(s.header.fixed_size);
    const total = batch.count * fixed;
    s.scratch.sums.resize(s.gpa, batch.count) catch return error.OutOfMemory;
    const sums = s.scratch.sums.items[0..batch.count];
    var c = s.staged orelse s.commit;
    const first = c.record_count;
    assert(batch.count >= 1);
    assert(c.data_size == first * fixed);
    assert(c.live_bytes == c.data_size);

    const p = pool.plan(batch.count, total >= store_read.inline_raw_bytes, 0, 8);
    var job: DenseAppendJob = .{
        .src = batch.ptrs[0],
        .fixed = fixed,
        .sums = sums,
        .block_size = p.block_size,
        .file = s.data,
        .offset = c.data_size,
        .first = first,
    };
    pool.run(p.lanes, &job, DenseAppendJob.work);
    if (job.write_error) |e| return Store.ioFail(e, "writing data");
    fsio.write(s.index, "index", std.mem.sliceAsBytes(sums), first * @sizeOf(u32)) catch |e|
        return Store.ioFail(e, "writing the record table");
    c.record_count = first + batch.count;
    c.data_size += total;
    c.live_bytes += total;
    assert(c.data_size == c.record_count * fixed);
    try settle(s, c, stage);
    return first;
}

/// Ends an append whose data and table are written: publishes commit `c`, or
/// with `stage` keeps it staged (written, invisible) for a later publish.
fn settle(s: *Store, c: Commit, stage: bool) Error!void {
    // An append only adds: the records and bytes of the last commit stay.
    assert(c.consistent());
    assert(c.record_count > s.commit.record_count);
    assert(c.data_size >= s.commit.data_size);
    // (A sync between two staged appends makes the published commit's
    // durable count the larger: publishing the staged one lowers it back,
    // which only makes the next open check more records.)
    assert(c.durable_count <= s.commit.durable_count);
    if (stage) {
        s.staged = c;
        return;
    }
    s.staged = null;
    try s.writeCommit(c);
}

/// Publishes (or, with `keep` false, drops) the records of staged appends.
pub fn publish(s: *Store, keep: bool) Error!void {
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    const st = s.staged orelse return;
    s.staged = null;
    assert(st.record_count > s.commit.record_count);
    if (!keep) return;
    try s.checkUsable();
    try s.writeCommit(st);
}

/// Makes everything appended through this handle durable: data, then table,
/// then the commit. A no-op for a handle that never wrote, and for a handle
/// a forked child inherited (its parent owns the writes).
pub fn sync(s: *Store) Error!void {
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    if (s.writer_lock == null or s.open_pid != pool.currentPid()) return;
    try s.checkUsable();
    try s.syncLocked();
}

test "writeSlices: adjacent runs merge, short runs are staged, long runs go direct" {
    const gpa = std.testing.allocator;
    const io = std.testing.io;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const file = try tmp.dir.createFile(io, "data", .{ .read = true });
    defer file.close(io);

    const mem = try gpa.alloc(u8, 3 * stage_run_max);
    defer gpa.free(mem);
    for (mem, 0..) |*b, i| b.* = @truncate(i *% 31 +% 7);
    // Out of order, adjacent pairs, an empty slice, runs on both sides of
    // stage_run_max, and more short bytes than the (tiny) stage holds.
    const slices = [_][]const u8{
        mem[100..300],   mem[300..500],               "",
        mem[10..20],     mem[0 .. stage_run_max + 1], mem[stage_run_max + 1 ..][0..40],
        mem[5000..5090], mem[7..9],                   mem[2 * stage_run_max ..][0..stage_run_max],
        mem[1..2],
    };
    var stage: [128]u8 = undefined;
    const offset: u64 = 4096 + 3;
    try writeSlices(file, &slices, offset, &stage);

    var want: std.ArrayList(u8) = .empty;
    defer want.deinit(gpa);
    for (slices) |sl| try want.appendSlice(gpa, sl);
    const got = try gpa.alloc(u8, want.items.len);
    defer gpa.free(got);
    try std.testing.expectEqual(got.len, try file.readPositionalAll(io, got, offset));
    try std.testing.expectEqualSlices(u8, want.items, got);
    try std.testing.expectEqual(offset + want.items.len, try file.length(io));
}
