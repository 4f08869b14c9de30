//! Fixed-length token windows over a corpus of variable-length documents
//! (the records of a ragged token store, or a ShardSet of them): the batches
//! of LLM pretraining.
//!
//! The token stream is every document concatenated in index order, with an
//! optional separator token between two documents. `prefix[d]` is the first
//! token of document d in that stream (prefix[0] = 0; prefix[docs] = all
//! tokens); window i covers tokens [i * L, i * L + L + 1): the inputs and the
//! shifted targets, crossing document boundaries. A window's lookup is a
//! binary search of the prefix sums. `segments` (optional) receives each
//! token's document ordinal within its window (0 for the first document it
//! touches); a separator belongs to the document it ends.
//!
//! Bounded decode. A window copies only the bytes it returns: raw documents
//! straight from the store's mapping; a seekable document (format.zig: zstd
//! frames of `Header.frame_size` bytes and a seek table) decodes only the
//! frames its tokens lie in; any other compressed document is decoded whole.
//! Each lane keeps its last few decoded frames, so consecutive windows
//! (sequential reading) decode a shared frame once.
//!
//! The index (the prefix sums of a store, and its `windows.idx` file) is
//! windows_index.zig's; `index`, `epochOf` and `verifyFile` are re-exported
//! here.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const format = @import("format.zig");
const codec = @import("codec.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const Store = @import("Store.zig");
const store_read = @import("store_read.zig");
const store_parts = @import("store_parts.zig");
const Error = Store.Error;
const SeekTable = format.SeekTable;
const windows_index = @import("windows_index.zig");

pub const index = windows_index.index;
pub const epochOf = windows_index.epochOf;
pub const verifyFile = windows_index.verifyFile;

/// lx_windows_t: the window index of one document corpus.
pub const Spec = extern struct {
    /// docs + 1 token offsets (separators included), caller memory,
    /// nondecreasing (lx_windows_index builds them so; a gather checks only
    /// the ends, in O(1), and asserts the order where it reads them).
    prefix: [*]const u64,
    docs: u64,
    seq_len: u64,
    /// The separator token's value (its low `itemsize` bytes), when `has_separator`.
    separator: u64,
    has_separator: u32,
    /// Bytes of one token: 1, 2, 4 or 8.
    itemsize: u32,
    /// The delete epoch of the parts (lx_windows_epoch) read before the prefix
    /// sums were built: a read fails once it differs.
    epoch: u64,

    comptime {
        assert(@sizeOf(Spec) == 48);
    }

    pub fn windowCount(s: Spec) u64 {
        assert(s.seq_len >= 1); // checkSpec
        const tokens = s.prefix[@intCast(s.docs)];
        return if (tokens == 0) 0 else (tokens - 1) / s.seq_len;
    }

    fn separatorAfter(s: Spec, doc: u64) u64 {
        return @intFromBool(s.has_separator != 0 and doc + 1 < s.docs);
    }

    /// Tokens of document `doc` itself (its separator not counted).
    fn docTokens(s: Spec, doc: u64) u64 {
        assert(doc < s.docs);
        const d: usize = @intCast(doc);
        return s.prefix[d + 1] - s.prefix[d] - s.separatorAfter(doc);
    }

    /// The document holding token `t` (the last whose first token is <= t).
    fn docAt(s: Spec, t: u64) u64 {
        assert(t < s.prefix[@intCast(s.docs)]);
        var lo: u64 = 0;
        var hi: u64 = s.docs;
        while (hi - lo > 1) {
            const mid = (lo + hi) / 2;
            if (s.prefix[@intCast(mid)] <= t) lo = mid else hi = mid;
        }
        assert(s.prefix[@intCast(lo)] <= t);
        assert(t < s.prefix[@intCast(lo + 1)]);
        return lo;
    }
};

/// Most tokens a corpus may hold: window arithmetic (i * L + L + 1) then
/// never overflows.
pub const tokens_max: u64 = 1 << 62;

pub fn checkSpec(s: Spec) Error!void {
    if (s.seq_len == 0) return diag.fail(error.InvalidArgument, "seq_len must be >= 1", .{});
    if (s.seq_len >= tokens_max) {
        return diag.fail(error.InvalidArgument, "seq_len {d} is too large", .{s.seq_len});
    }
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
    if (s.prefix[@intCast(s.docs)] > tokens_max) {
        return diag.fail(error.InvalidArgument, "the window index holds too many tokens", .{});
    }
}

// ---------------------------------------------------------------- gathers

/// Decoded frames a lane keeps (consecutive windows share them).
const cache_slots = 4;

const Slot = struct {
    /// (document, frame) decoded into `buf`; frame `whole` is a whole record.
    doc: u64 = std.math.maxInt(u64),
    frame: u64 = 0,
    len: usize = 0,
    buf: std.ArrayList(u8) = .empty,
};

const whole: u64 = std.math.maxInt(u64);

const LaneCache = struct {
    slots: [cache_slots]Slot = @splat(.{}),
    next: usize = 0,

    fn find(lc: *LaneCache, doc: u64, frame: u64) ?[]const u8 {
        for (&lc.slots) |*sl| {
            if (sl.doc == doc and sl.frame == frame) return sl.buf.items[0..sl.len];
        }
        return null;
    }

    /// A slot of `len` bytes, evicting the oldest; the caller names its
    /// contents once they are decoded.
    fn claim(lc: *LaneCache, gpa: Allocator, len: usize) ?*Slot {
        assert(lc.next < cache_slots);
        const sl = &lc.slots[lc.next];
        lc.next = (lc.next + 1) % cache_slots;
        sl.doc = std.math.maxInt(u64);
        sl.buf.resize(gpa, len) catch return null;
        sl.len = len;
        assert(sl.buf.items.len >= sl.len);
        return sl;
    }

    fn forget(lc: *LaneCache) void {
        for (&lc.slots) |*sl| sl.doc = std.math.maxInt(u64);
    }

    fn deinit(lc: *LaneCache, gpa: Allocator) void {
        for (&lc.slots) |*sl| {
            sl.buf.deinit(gpa);
            sl.* = .{};
        }
    }

    fn capacityBytes(lc: *const LaneCache) usize {
        var n: usize = 0;
        for (&lc.slots) |*sl| n += sl.buf.capacity;
        return n;
    }
};

/// The buffers of window gathers, kept by their owner between batches.
pub const Scratch = struct {
    parts: store_parts.Scratch = .{},
    lanes: [pool.lanes_max]LaneCache = @splat(.{}),

    pub fn deinit(sc: *Scratch, gpa: Allocator) void {
        sc.parts.deinit(gpa);
        for (&sc.lanes) |*lc| lc.deinit(gpa);
    }

    pub fn capacityBytes(sc: *const Scratch) usize {
        var n = sc.parts.capacityBytes();
        for (&sc.lanes) |*lc| n += lc.capacityBytes();
        return n;
    }
};

/// The pool of the window gathers' scratches (see store_parts.ScratchPool).
pub const scratches = store_parts.ScratchPool(Scratch);

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
    const snaps = try store_parts.begin(gpa, parts, &sc.parts);
    defer store_parts.end(parts);
    try checkUnchanged(spec, parts, snaps);
    // Snapshots differ from call to call: what a lane kept is stale now.
    for (&sc.lanes) |*lc| lc.forget();
    var job: Job = .{
        .gpa = gpa,
        .spec = spec,
        .parts = parts,
        .snaps = snaps,
        .windows = windows,
        .out = out,
        .caches = &sc.lanes,
    };
    const width = spec.seq_len + 1;
    const bytes = windows.len * width * spec.itemsize;
    // Compressed documents cost about their decoded size more: lanes pay off sooner.
    const worth = bytes >= store_read.inline_raw_bytes or
        (out.tokens != null and anyCompressed(snaps) and
            bytes >= store_read.inline_decoded_bytes);
    const plan = pool.plan(windows.len, worth, lanes, 4);
    job.block_size = plan.block_size;
    pool.run(plan.lanes, &job, Job.work);
    if (job.failed.load(.acquire)) {
        const d = job.fail_doc;
        switch (job.fail_kind) {
            .decode => return diag.fail(
                error.Corrupt,
                "document {d} is damaged (cannot be decoded)",
                .{d},
            ),
            .memory => return diag.fail(
                error.OutOfMemory,
                "no memory to decode document {d}",
                .{d},
            ),
            .doc => {},
        }
        // Checked again on this thread, for its message.
        _ = try docRef(spec, parts, snaps, d);
        return diag.fail(error.Corrupt, "document {d} could not be read", .{d});
    }
}

fn anyCompressed(snaps: []const store_read.Snapshot) bool {
    for (snaps) |snap| {
        if (snap.store.codecOf() != .raw) return true;
    }
    return false;
}

/// Every part still holds the documents the index was built over: no delete
/// since (epochs), and no store shorter than the index says.
fn checkUnchanged(
    spec: Spec,
    parts: []const store_parts.Part,
    snaps: []const store_read.Snapshot,
) Error!void {
    if (epochOf(parts) != spec.epoch) {
        return diag.fail(
            error.SizeMismatch,
            "records were deleted since the window index was built: build a new TokenWindows",
            .{},
        );
    }
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

/// A document's record, checked: inside the committed data, 1-D, of the
/// size the index says, its seek table (if any) consistent with it.
const DocRef = struct {
    store: *Store,
    codec: format.Codec,
    /// The payload as stored (raw bytes, or zstd frames).
    stored: []const u8,
    raw_size: u64,
    seek: ?SeekTable,
};

fn docRef(
    spec: Spec,
    parts: []const store_parts.Part,
    snaps: []const store_read.Snapshot,
    d: u64,
) Error!DocRef {
    const at = store_parts.find(parts, snaps, d) orelse
        return diag.fail(
            error.OutOfRange,
            "document {d} is out of range: the store changed since its window index was built",
            .{d},
        );
    const snap = &snaps[at.part];
    const want = spec.docTokens(d) * spec.itemsize;
    if (snap.locs.fixed != 0) {
        // A store of single tokens is one document: its first records (its
        // part starts at the document, not at a record: lx_windows_index).
        if (snap.locs.fixed != spec.itemsize or at.local != 0 or
            want > snap.count * snap.locs.fixed)
        {
            return diag.fail(
                error.SizeMismatch,
                "document {d} (a store of single tokens) does not hold {d} bytes of " ++
                    "{d}-byte tokens",
                .{ d, want, spec.itemsize },
            );
        }
        return .{
            .store = snap.store,
            .codec = .raw,
            .stored = snap.data[0..@intCast(want)],
            .raw_size = want,
            .seek = null,
        };
    }
    const loc = snap.locs.get(at.local);
    try Store.checkLoc(loc, at.local, snap.data, snap.data_size, false);
    if (loc.aux_size != 0 or loc.raw_size != want) {
        return diag.fail(
            error.SizeMismatch,
            "document {d} holds {d} bytes, the window index says {d}: " ++
                "the store changed since the index was built",
            .{ d, loc.raw_size, want },
        );
    }
    const cd: format.Codec = @fromBackingInt(@intCast(loc.codec));
    const stored = (snap.data + loc.offset)[0..@intCast(loc.stored_size)];
    return .{
        .store = snap.store,
        .codec = cd,
        .stored = stored,
        .raw_size = loc.raw_size,
        .seek = if (cd == .raw) null else SeekTable.parse(stored),
    };
}

const FailKind = enum { doc, decode, memory };

const Job = struct {
    gpa: Allocator,
    spec: Spec,
    parts: []const store_parts.Part,
    snaps: []const store_read.Snapshot,
    windows: []const u64,
    out: Out,
    caches: *[pool.lanes_max]LaneCache,
    block_size: usize = 1,
    next_block: std.atomic.Value(usize) align(std.atomic.cache_line) = .init(0),
    failed: std.atomic.Value(bool) align(std.atomic.cache_line) = .init(false),
    fail_doc: u64 = 0,
    fail_kind: FailKind = .doc,

    fn work(job: *Job, lane: usize) void {
        // One lane cache per lane; blocks of at least one window.
        assert(lane < job.caches.len and job.block_size >= 1);
        var lease: ?codec.DPool.Lease = null;
        defer if (lease) |l| codec.DPool.release(l);
        const cache = &job.caches[lane];
        while (!job.failed.load(.monotonic)) {
            const start = job.next_block.fetchAdd(1, .monotonic) * job.block_size;
            if (start >= job.windows.len) return;
            for (start..@min(start + job.block_size, job.windows.len)) |k| {
                job.assemble(k, cache, &lease) catch return;
            }
        }
    }

    fn fail(job: *Job, doc: u64, kind: FailKind) error{Failed} {
        if (job.failed.cmpxchgStrong(false, true, .acq_rel, .monotonic) == null) {
            job.fail_doc = doc;
            job.fail_kind = kind;
        }
        return error.Failed;
    }

    /// Writes window k: each overlapped document's tokens, separators, segments.
    fn assemble(
        job: *Job,
        k: usize,
        cache: *LaneCache,
        lease: *?codec.DPool.Lease,
    ) error{Failed}!void {
        const s = job.spec;
        const size: usize = s.itemsize;
        const width: u64 = s.seq_len + 1;
        const row = job.out.row(k);
        // gather() checked the window; its L + 1 tokens lie inside the corpus.
        assert(job.windows[k] < s.windowCount());
        const t0 = job.windows[k] * s.seq_len;
        assert(t0 + width <= s.prefix[@intCast(s.docs)]);
        var t = t0;
        var d = s.docAt(t0);
        var ordinal: i32 = 0;
        while (t < t0 + width) : ({
            d += 1;
            ordinal += 1;
        }) {
            assert(d < s.docs);
            const first = s.prefix[@intCast(d)];
            assert(first <= t);
            const doc_end = first + s.docTokens(d);
            const span_end = @min(s.prefix[@intCast(d + 1)], t0 + width);
            if (job.out.tokens) |dst| {
                const base = dst + row * @as(usize, @intCast(width)) * size;
                const copy_end = @min(doc_end, span_end);
                if (copy_end > t) {
                    const at = base + @as(usize, @intCast(t - t0)) * size;
                    const lo: usize = @intCast((t - first) * size);
                    const hi: usize = @intCast((copy_end - first) * size);
                    try job.copyDoc(d, lo, hi, at, cache, lease);
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

    /// Copies bytes [lo, hi) of document d's tokens to `dst`, decoding only
    /// the frames that hold them.
    fn copyDoc(
        job: *Job,
        d: u64,
        lo: usize,
        hi: usize,
        dst: [*]u8,
        cache: *LaneCache,
        lease: *?codec.DPool.Lease,
    ) error{Failed}!void {
        const ref = docRef(job.spec, job.parts, job.snaps, d) catch return job.fail(d, .doc);
        // The bytes asked for lie inside the document (docRef checked its size).
        assert(lo < hi);
        assert(hi <= ref.raw_size);
        if (ref.codec == .raw) {
            codec.copy(dst[0 .. hi - lo], ref.stored[lo..hi]);
            return;
        }
        const table = ref.seek orelse {
            const size: usize = @intCast(ref.raw_size);
            const bytes = try job.decoded(ref, d, whole, ref.stored, size, cache, lease);
            codec.copy(dst[0 .. hi - lo], bytes[lo..hi]);
            return;
        };
        // The frames holding [lo, hi): walk the table to the first.
        var raw_at: usize = 0;
        var packed_at: usize = 0;
        var out_at: usize = 0;
        for (0..table.count()) |f| {
            const raw_len: usize = table.decompressed(f);
            const packed_len: usize = table.compressed(f);
            defer {
                raw_at += raw_len;
                packed_at += packed_len;
            }
            if (raw_at + raw_len <= lo) continue;
            if (raw_at >= hi) break;
            const frame = ref.stored[packed_at..][0..packed_len];
            const bytes = try job.decoded(ref, d, f, frame, raw_len, cache, lease);
            const from = @max(lo, raw_at) - raw_at;
            const to = @min(hi, raw_at + raw_len) - raw_at;
            codec.copy(dst[out_at..][0 .. to - from], bytes[from..to]);
            out_at += to - from;
        }
        assert(out_at == hi - lo);
    }

    /// Frame `frame` of document d (`whole`: the whole record) decoded, from
    /// the lane's cache or decoded into it.
    fn decoded(
        job: *Job,
        ref: DocRef,
        d: u64,
        frame: u64,
        src: []const u8,
        len: usize,
        cache: *LaneCache,
        lease: *?codec.DPool.Lease,
    ) error{Failed}![]const u8 {
        if (cache.find(d, frame)) |bytes| return bytes;
        if (lease.* == null) lease.* = codec.DPool.acquire() catch return job.fail(d, .memory);
        const slot = cache.claim(job.gpa, len) orelse return job.fail(d, .memory);
        assert(slot.buf.items.len >= len);
        const dst = slot.buf.items[0..len];
        codec.decode(lease.*.?.ctx, ref.codec, &ref.store.dict, src, dst) catch
            return job.fail(d, .decode);
        slot.doc = d;
        slot.frame = frame;
        return dst;
    }
};

fn writeToken(dst: [*]u8, value: u64, size: usize) void {
    assert(size >= 1);
    assert(size <= 8);
    const bytes = std.mem.toBytes(std.mem.nativeToLittle(u64, value));
    @memcpy(dst[0..size], bytes[0..size]);
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const Move = @import("store_maintain.zig").Move;

fn testStore(base: []const u8, name: []const u8, opts: Store.OpenOptions) !*Store {
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/{s}", .{ base, name });
    return Store.open(testing.allocator, path, opts);
}

fn testSpec(prefix: []const u64, seq_len: u64, sep: ?u64, itemsize: u32, epoch: u64) Spec {
    return .{
        .prefix = prefix.ptr,
        .docs = prefix.len - 1,
        .seq_len = seq_len,
        .separator = sep orelse 0,
        .has_separator = @intFromBool(sep != null),
        .itemsize = itemsize,
        .epoch = epoch,
    };
}

test "windows cross documents, with separators and segments, raw and compressed alike" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    inline for (.{ format.Codec.raw, format.Codec.zstd }) |cd| {
        const s = try testStore(base, @tagName(cd), .{ .create = true, .codec = cd });
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
        const epoch = epochOf(&parts);
        try index(testing.allocator, s, 2, true, &prefix);
        // With separators (id 0) between documents: 3+1, 0+1, 17+1, 1.
        try testing.expectEqualSlices(u64, &.{ 0, 4, 5, 23, 24 }, &prefix);
        const spec = testSpec(&prefix, 4, 0, 2, epoch);
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
        // window of the old index is refused, the untouched first one included,
        // also once appends bring the store back to its old length.
        var moves: [1]Move = undefined;
        _ = try s.delete(&.{1}, &moves);
        const stale = gather(testing.allocator, spec, &parts, &.{0}, tokens_only, 0, &sc);
        try testing.expectError(error.SizeMismatch, stale);
        _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = 1 }, false);
        const back = gather(testing.allocator, spec, &parts, &.{0}, tokens_only, 0, &sc);
        try testing.expectError(error.SizeMismatch, back);
    }
}

test "seekable documents decode only the frames a window reads, and whole records still read" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    const gpa = testing.allocator;
    // 40 documents of 0..700 u32 tokens, compressible (small ids), frames of 256 bytes.
    var prng = std.Random.DefaultPrng.init(7);
    const r = prng.random();
    var flat: std.ArrayList(u32) = .empty;
    defer flat.deinit(gpa);
    var sizes: [40]u64 = undefined;
    var ptrs: [40][*]const u8 = undefined;
    var starts: [41]usize = undefined;
    starts[0] = 0;
    for (0..40) |d| {
        const n = r.uintLessThan(usize, 700);
        for (0..n) |_| try flat.append(gpa, r.uintLessThan(u32, 50));
        starts[d + 1] = flat.items.len;
    }
    for (0..40) |d| {
        ptrs[d] = std.mem.sliceAsBytes(flat.items[starts[d]..]).ptr;
        sizes[d] = (starts[d + 1] - starts[d]) * 4;
    }
    const s = try testStore(base, "framed", .{ .create = true, .codec = .zstd, .frame_size = 256 });
    defer s.close();
    _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = 40 }, false);
    // Long records are seekable; every record still reads (and verifies) whole.
    const snap = try store_read.snapshot(s);
    var seekable: usize = 0;
    for (0..40) |d| {
        const loc = snap.locs.get(d);
        const stored = (snap.data + loc.offset)[0..@intCast(loc.stored_size)];
        if (loc.codec != 0 and SeekTable.parse(stored) != null) seekable += 1;
    }
    try testing.expect(seekable > 20);
    var bad: u64 = 0;
    try s.verify(&bad);
    var raw: [40]u64 = undefined;
    var aux: [40]u64 = undefined;
    var all_idx: [40]u64 = undefined;
    for (&all_idx, 0..) |*x, i| x.* = i;
    const whole_buf = try s.gatherAlloc(&all_idx, 0, &raw, &aux);
    defer @import("outbuf.zig").free(whole_buf.ptr);
    try testing.expectEqualSlices(u8, std.mem.sliceAsBytes(flat.items), whole_buf);
    // Every window, by a batch of all of them, matches the flat stream.
    const parts = [_]store_parts.Part{.{ .store = s, .first = 0 }};
    var prefix: [41]u64 = undefined;
    const epoch = epochOf(&parts);
    try index(gpa, s, 4, false, &prefix);
    const spec = testSpec(&prefix, 37, null, 4, epoch);
    const count: usize = @intCast(spec.windowCount());
    const got = try gpa.alloc(u32, count * 38);
    defer gpa.free(got);
    const ids = try gpa.alloc(u64, count);
    defer gpa.free(ids);
    for (ids, 0..) |*x, i| x.* = count - 1 - i; // reversed: no lane sees them in order
    var sc: Scratch = .{};
    defer sc.deinit(gpa);
    try gather(gpa, spec, &parts, ids, .{ .tokens = @ptrCast(got.ptr) }, 0, &sc);
    for (ids, 0..) |w, k| {
        const at: usize = @intCast(w * 37);
        try testing.expectEqualSlices(u32, flat.items[at..][0..38], got[k * 38 ..][0..38]);
    }
}

test {
    _ = windows_index;
}
