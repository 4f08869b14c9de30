//! Fixed-length token windows over a corpus of variable-length documents
//! (the records of a ragged token store, or a ShardSet of them): the batches
//! of LLM pretraining.
//!
//! The token stream is every document concatenated in index order, with an
//! optional separator token between two documents. `prefix[d]` is the first
//! token of document d in that stream (prefix[0] = 0; prefix[docs] = all
//! tokens); window i covers tokens [i * L, i * L + L + 1): the inputs and the
//! shifted targets, crossing document boundaries. A window's lookup is a
//! binary search of the prefix sums; a batch copies only the documents its
//! windows overlap, raw ones straight from the store's mapping, compressed
//! ones decoded once per batch (two windows sharing one decode it once).
//! `segments` (optional) receives each token's document ordinal within its
//! window (0 for the first document it touches); a separator belongs to the
//! document it ends.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const format = @import("format.zig");
const codec = @import("codec.zig");
const outbuf = @import("outbuf.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const Store = @import("Store.zig");
const store_read = @import("store_read.zig");
const store_parts = @import("store_parts.zig");
const Error = Store.Error;

/// lx_windows_t: the window index of one document corpus.
pub const Spec = extern struct {
    /// docs + 1 token offsets (separators included), caller memory.
    prefix: [*]const u64,
    docs: u64,
    seq_len: u64,
    /// The separator token's value (its low `itemsize` bytes), when `has_separator`.
    separator: u64,
    has_separator: u32,
    /// Bytes of one token: 1, 2, 4 or 8.
    itemsize: u32,

    comptime {
        assert(@sizeOf(Spec) == 40);
    }

    pub fn windowCount(s: Spec) u64 {
        const tokens = s.prefix[@intCast(s.docs)];
        return if (tokens == 0) 0 else (tokens - 1) / s.seq_len;
    }

    fn separatorAfter(s: Spec, doc: u64) u64 {
        return @intFromBool(s.has_separator != 0 and doc + 1 < s.docs);
    }

    /// Tokens of document `doc` itself (its separator not counted).
    fn docTokens(s: Spec, doc: u64) u64 {
        const d: usize = @intCast(doc);
        return s.prefix[d + 1] - s.prefix[d] - s.separatorAfter(doc);
    }

    /// The document holding token `t` (the last whose first token is <= t).
    fn docAt(s: Spec, t: u64) u64 {
        var lo: u64 = 0;
        var hi: u64 = s.docs;
        while (hi - lo > 1) {
            const mid = (lo + hi) / 2;
            if (s.prefix[@intCast(mid)] <= t) lo = mid else hi = mid;
        }
        return lo;
    }
};

pub fn checkSpec(s: Spec) Error!void {
    if (s.seq_len == 0) return diag.fail(error.InvalidArgument, "seq_len must be >= 1", .{});
    if (s.docs == 0) {
        return diag.fail(error.InvalidArgument, "a window index needs at least one document", .{});
    }
    switch (s.itemsize) {
        1, 2, 4, 8 => {},
        else => return diag.fail(
            error.InvalidArgument,
            "tokens of {d} bytes are not supported",
            .{s.itemsize},
        ),
    }
    if (s.prefix[0] != 0) {
        return diag.fail(error.InvalidArgument, "the window index must start at 0", .{});
    }
}

/// Builds `out[0..docs+1]`, the prefix sums of a corpus: the documents are
/// records [0, docs) of `parts`, 1-D, each a whole number of tokens.
pub fn index(
    gpa: Allocator,
    parts: []const store_parts.Part,
    itemsize: u32,
    has_separator: bool,
    out: []u64,
) Error!void {
    assert(out.len >= 1);
    const docs = out.len - 1;
    var sc: store_parts.Scratch = .{};
    defer sc.deinit(gpa);
    const snaps = try store_parts.begin(gpa, parts, &sc);
    defer store_parts.end(parts);
    out[0] = 0;
    for (0..docs) |d| {
        const at = store_parts.find(parts, snaps, d) orelse
            return diag.fail(error.OutOfRange, "document {d} is out of range", .{d});
        const loc = snaps[at.part].locs.get(at.local);
        try Store.checkLoc(loc, at.local, snaps[at.part].data, snaps[at.part].data_size, true);
        if (loc.aux_size != 0) {
            return diag.fail(
                error.SizeMismatch,
                "document {d} is not 1-D (token documents must be)",
                .{d},
            );
        }
        if (loc.raw_size % itemsize != 0) {
            return diag.fail(error.Corrupt, "document {d} is not a whole number of tokens", .{d});
        }
        const sep: u64 = @intFromBool(has_separator and d + 1 < docs);
        out[d + 1] = out[d] + loc.raw_size / itemsize + sep;
    }
}

/// Where a needed document's tokens are during a batch.
const Doc = struct {
    id: u64,
    tokens: [*]const u8,
};

/// The buffers of window gathers, kept by their owner between batches.
pub const Scratch = struct {
    parts: store_parts.Scratch = .{},
    ids: std.ArrayList(u64) = .empty,
    docs: std.ArrayList(Doc) = .empty,
    decode_ids: std.ArrayList(u64) = .empty,
    decode_of: std.ArrayList(u16) = .empty,
    decode_local: std.ArrayList(u64) = .empty,
    raw: std.ArrayList(u64) = .empty,
    aux: std.ArrayList(u64) = .empty,

    pub fn deinit(sc: *Scratch, gpa: Allocator) void {
        sc.parts.deinit(gpa);
        inline for (.{
            "ids", "docs", "decode_ids", "decode_of", "decode_local", "raw", "aux",
        }) |name| {
            @field(sc, name).deinit(gpa);
        }
    }
};

/// Where window k of a batch goes: row `rows[k]` (k when null) of `tokens`
/// ((L + 1) * itemsize bytes a row) and of `segments` ((L + 1) int32 a row).
pub const Out = struct {
    tokens: ?[*]u8 = null,
    segments: ?[*]i32 = null,
    rows: ?[]const u64 = null,

    fn row(o: Out, k: usize) usize {
        return if (o.rows) |r| @intCast(r[k]) else k;
    }
};

/// Gathers windows `windows` of corpus `spec` (documents in `parts`) into `out`.
pub fn gather(
    gpa: Allocator,
    spec: Spec,
    parts: []const store_parts.Part,
    windows: []const u64,
    out: Out,
    lanes: usize,
    sc: *Scratch,
) Error!void {
    if (windows.len == 0) return;
    const count = spec.windowCount();
    for (windows) |w| {
        if (w >= count) {
            return diag.fail(
                error.OutOfRange,
                "window {d} is out of range for {d} windows",
                .{ w, count },
            );
        }
    }
    try neededDocs(gpa, spec, windows, sc);
    const snaps = try store_parts.begin(gpa, parts, &sc.parts);
    defer store_parts.end(parts);
    try checkCounts(spec, parts, snaps);
    var decoded: []u8 = &.{};
    defer if (decoded.len > 0) outbuf.free(decoded.ptr);
    try locateDocs(gpa, spec, parts, snaps, sc, &decoded, lanes);
    var job: AssembleJob = .{ .spec = spec, .windows = windows, .out = out, .docs = sc.docs.items };
    const raw_bytes = windows.len * spec.seq_len * spec.itemsize;
    const plan = pool.plan(windows.len, raw_bytes >= store_read.inline_raw_bytes, lanes, 4);
    job.block_size = plan.block_size;
    pool.run(plan.lanes, &job, AssembleJob.work);
}

/// Every part still holds the documents the index was built over. A delete
/// moves a store's last records into the holes and shrinks it, so a moved
/// document of the deleted one's length would otherwise read as the old one.
/// (Appends after a delete that bring the count back are not detected.)
fn checkCounts(
    spec: Spec,
    parts: []const store_parts.Part,
    snaps: []const store_read.Snapshot,
) Error!void {
    for (parts, snaps, 0..) |p, snap, k| {
        const end = if (k + 1 < parts.len) parts[k + 1].first else spec.docs;
        if (snap.count < end -| p.first) {
            return diag.fail(
                error.SizeMismatch,
                "the window index covers {d} documents of store {d}, which now holds {d}: " ++
                    "records were deleted since the index was built; build a new TokenWindows",
                .{ end -| p.first, k, snap.count },
            );
        }
    }
}

/// The sorted, distinct documents the windows overlap, into sc.ids.
fn neededDocs(gpa: Allocator, spec: Spec, windows: []const u64, sc: *Scratch) Error!void {
    sc.ids.clearRetainingCapacity();
    for (windows) |w| {
        const t0 = w * spec.seq_len;
        const t1 = t0 + spec.seq_len + 1;
        var d = spec.docAt(t0);
        while (d < spec.docs and spec.prefix[@intCast(d)] < t1) : (d += 1) {
            sc.ids.append(gpa, d) catch return error.OutOfMemory;
        }
    }
    std.mem.sortUnstable(u64, sc.ids.items, {}, std.sort.asc(u64));
    var n: usize = 0;
    for (sc.ids.items) |id| {
        if (n == 0 or sc.ids.items[n - 1] != id) {
            sc.ids.items[n] = id;
            n += 1;
        }
    }
    sc.ids.shrinkRetainingCapacity(n);
}

/// Points every needed document at its tokens: raw ones in the mapping,
/// compressed ones decoded (all at once, on the lanes) into `decoded`.
fn locateDocs(
    gpa: Allocator,
    spec: Spec,
    parts: []const store_parts.Part,
    snaps: []const store_read.Snapshot,
    sc: *Scratch,
    decoded: *[]u8,
    lanes: usize,
) Error!void {
    sc.docs.resize(gpa, sc.ids.items.len) catch return error.OutOfMemory;
    sc.decode_ids.clearRetainingCapacity();
    sc.decode_of.clearRetainingCapacity();
    sc.decode_local.clearRetainingCapacity();
    for (sc.ids.items, sc.docs.items, 0..) |id, *doc, i| {
        const at = store_parts.find(parts, snaps, id) orelse
            return diag.fail(
                error.OutOfRange,
                "document {d} is out of range: the store changed since its window index was built",
                .{id},
            );
        const snap = &snaps[at.part];
        const loc = snap.locs.get(at.local);
        try Store.checkLoc(loc, at.local, snap.data, snap.data_size, false);
        if (loc.aux_size != 0 or loc.raw_size != spec.docTokens(id) * spec.itemsize) {
            return diag.fail(
                error.SizeMismatch,
                "document {d} holds {d} bytes, the window index says {d}: " ++
                    "the store changed since the index was built",
                .{ id, loc.raw_size, spec.docTokens(id) * spec.itemsize },
            );
        }
        doc.* = .{ .id = id, .tokens = snap.data + loc.offset };
        if (loc.codec != @backingInt(format.Codec.raw)) {
            sc.decode_ids.append(gpa, i) catch return error.OutOfMemory;
            sc.decode_of.append(gpa, at.part) catch return error.OutOfMemory;
            sc.decode_local.append(gpa, at.local) catch return error.OutOfMemory;
        }
    }
    if (sc.decode_local.items.len == 0) return;
    const n = sc.decode_local.items.len;
    sc.raw.resize(gpa, n) catch return error.OutOfMemory;
    sc.aux.resize(gpa, n) catch return error.OutOfMemory;
    const reads: store_read.Reads = .{
        .snaps = snaps,
        .of = sc.decode_of.items,
        .indices = sc.decode_local.items,
    };
    decoded.* = try store_read.packedReads(gpa, reads, lanes, sc.raw.items, sc.aux.items);
    var at: usize = 0;
    for (sc.decode_ids.items, sc.raw.items) |i, size| {
        sc.docs.items[@intCast(i)].tokens = decoded.ptr + at;
        at += @intCast(size);
    }
}

const AssembleJob = struct {
    spec: Spec,
    windows: []const u64,
    out: Out,
    docs: []const Doc,
    block_size: usize = 1,
    next_block: std.atomic.Value(usize) = .init(0),

    fn work(job: *AssembleJob, lane: usize) void {
        _ = lane;
        while (true) {
            const start = job.next_block.fetchAdd(1, .monotonic) * job.block_size;
            if (start >= job.windows.len) return;
            for (start..@min(start + job.block_size, job.windows.len)) |k| job.assemble(k);
        }
    }

    /// Copies window k: each overlapped document's slice, separators, segments.
    fn assemble(job: *AssembleJob, k: usize) void {
        const s = job.spec;
        const size: usize = s.itemsize;
        const width: u64 = s.seq_len + 1;
        const row = job.out.row(k);
        const t0 = job.windows[k] * s.seq_len;
        var t = t0;
        var d = s.docAt(t0);
        var ordinal: i32 = 0;
        var slot = findDoc(job.docs, d);
        while (t < t0 + width) : ({
            d += 1;
            ordinal += 1;
            slot += 1;
        }) {
            const first = s.prefix[@intCast(d)];
            const doc_end = first + s.docTokens(d);
            const span_end = @min(s.prefix[@intCast(d + 1)], t0 + width);
            if (job.out.tokens) |dst| {
                const base = dst + row * @as(usize, @intCast(width)) * size;
                const copy_end = @min(doc_end, span_end);
                if (copy_end > t) {
                    const from = job.docs[slot].tokens + @as(usize, @intCast(t - first)) * size;
                    const n: usize = @intCast((copy_end - t) * size);
                    codec.copy(base[@as(usize, @intCast(t - t0)) * size ..][0..n], from[0..n]);
                }
                if (span_end > doc_end) {
                    writeToken(base + @as(usize, @intCast(doc_end - t0)) * size, s.separator, size);
                }
            }
            if (job.out.segments) |seg| {
                const base = seg + row * @as(usize, @intCast(width));
                @memset(base[@intCast(t - t0)..@intCast(span_end - t0)], ordinal);
            }
            t = span_end;
        }
    }
};

/// The index in `docs` (sorted by id) of document `id`, which is there.
fn findDoc(docs: []const Doc, id: u64) usize {
    var lo: usize = 0;
    var hi: usize = docs.len;
    while (lo < hi) {
        const mid = (lo + hi) / 2;
        if (docs[mid].id < id) lo = mid + 1 else hi = mid;
    }
    assert(lo < docs.len and docs[lo].id == id);
    return lo;
}

fn writeToken(dst: [*]u8, value: u64, size: usize) void {
    const bytes = std.mem.toBytes(std.mem.nativeToLittle(u64, value));
    @memcpy(dst[0..size], bytes[0..size]);
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const Move = @import("store_maintain.zig").Move;

test "windows cross documents, with separators and segments, raw and compressed alike" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    inline for (.{ format.Codec.raw, format.Codec.zstd }) |cd| {
        var buf: [4096]u8 = undefined;
        const path = try std.fmt.bufPrint(&buf, "{s}/{s}", .{ base, @tagName(cd) });
        const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = cd });
        defer s.close();
        // Documents of u16 tokens: [1,2,3], [], [4,5,...,20] (17 tokens), [21].
        var tokens: [21]u16 = undefined;
        for (&tokens, 1..) |*t, v| t.* = @intCast(v);
        const bytes = std.mem.sliceAsBytes(&tokens);
        const ptrs = [_][*]const u8{ bytes.ptr, bytes.ptr, bytes[6..].ptr, bytes[40..].ptr };
        const sizes = [_]u64{ 6, 0, 34, 2 };
        _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = 4 }, false);
        const parts = [_]store_parts.Part{.{ .store = s, .first = 0 }};
        var prefix: [5]u64 = undefined;
        try index(testing.allocator, &parts, 2, true, &prefix);
        // With separators (id 0) between documents: 3+1, 0+1, 17+1, 1.
        try testing.expectEqualSlices(u64, &.{ 0, 4, 5, 23, 24 }, &prefix);
        const spec: Spec = .{
            .prefix = &prefix,
            .docs = 4,
            .seq_len = 4,
            .separator = 0,
            .has_separator = 1,
            .itemsize = 2,
        };
        try testing.expectEqual(@as(u64, 5), spec.windowCount());
        var out: [2][5]u16 = undefined;
        var seg: [2][5]i32 = undefined;
        var sc: Scratch = .{};
        defer sc.deinit(testing.allocator);
        const both: Out = .{ .tokens = @ptrCast(&out), .segments = @ptrCast(&seg) };
        const tokens_only: Out = .{ .tokens = @ptrCast(&out) };
        try gather(testing.allocator, spec, &parts, &.{ 0, 1 }, both, 0, &sc);
        try testing.expectEqualSlices(u16, &.{ 1, 2, 3, 0, 0 }, &out[0]);
        try testing.expectEqualSlices(i32, &.{ 0, 0, 0, 0, 1 }, &seg[0]);
        try testing.expectEqualSlices(u16, &.{ 0, 4, 5, 6, 7 }, &out[1]);
        try testing.expectEqualSlices(i32, &.{ 0, 1, 1, 1, 1 }, &seg[1]);
        try gather(testing.allocator, spec, &parts, &.{4}, tokens_only, 0, &sc);
        try testing.expectEqualSlices(u16, &.{ 15, 16, 17, 18, 19 }, &out[0]);
        const past_end = gather(testing.allocator, spec, &parts, &.{5}, tokens_only, 0, &sc);
        try testing.expectError(error.OutOfRange, past_end);
        // Deleting a document moves the last one ([21]) into its hole; every
        // window of the old index is refused, the untouched first one included.
        var moves: [1]Move = undefined;
        _ = try s.delete(&.{1}, &moves);
        const stale = gather(testing.allocator, spec, &parts, &.{0}, tokens_only, 0, &sc);
        try testing.expectError(error.SizeMismatch, stale);
    }
}
