//! Making a replica of a remote store in the node-local cache
//! (src/Cache.zig owns the cache, src/Replica.zig a replica): the store's
//! meta as fetched, parsed and checked (format.zig's header and commit);
//! whether a replica is whole; and a replica made aside (its files sparse
//! at their full sizes, its state allocated whole), checked to open as a
//! store, and published under the cache's lock, a damaged one moved aside
//! (its users keep their open files).
const std = @import("std");
const assert = std.debug.assert;
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const format = @import("format.zig");
const Store = @import("Store.zig");
const Cache = @import("Cache.zig");
const Replica = @import("Replica.zig");
const layout = @import("cache_format.zig");
const files = @import("cache_os.zig");

const Error = Cache.Error;

/// The largest store the cache replicates: 2^36 records (a process keeps a
/// bit per record) and 2^51 bytes of data (2^27 blocks of 16 MiB).
pub const records_max: u64 = 1 << 36;
pub const data_max: u64 = 1 << 51;

/// What the cache needs of a store's meta (C: lx_meta_t).
pub const Meta = extern struct {
    record_count: u64,
    data_size: u64,
    fixed_size: u64,
    index_size: u64,
};

/// Parses and checks a store's meta as fetched (its header and commit,
/// format.zig): a store uploaded with records not yet synced, or larger
/// than the cache replicates, is refused.
pub fn parseMeta(meta: []const u8) Error!Meta {
    if (meta.len < format.blob_offset) {
        const why = "its meta is {d} bytes, shorter than a store's header and commit";
        return diag.fail(error.NotAStore, why, .{meta.len});
    }
    var h: format.Header = undefined;
    @memcpy(std.mem.asBytes(&h), meta[0..@sizeOf(format.Header)]);
    try Store.checkHeader(&h);
    var c: format.Commit = undefined;
    @memcpy(std.mem.asBytes(&c), meta[format.commit_offset..][0..@sizeOf(format.Commit)]);
    if (c.checksum != c.computeChecksum() or !c.consistent()) {
        const why = "its meta's commit fails its checksum (a damaged upload?)";
        return diag.fail(error.Corrupt, why, .{});
    }
    if (c.durable_count != c.record_count) {
        const why = "this store was uploaded while a writer had it open ({d} records since its " ++
            "last sync); open and close it locally, then upload it again";
        return diag.fail(error.Corrupt, why, .{c.record_count - c.durable_count});
    }
    if (c.record_count > records_max or c.data_size > data_max) {
        const why = "its meta says {d} records and {d} bytes of data, more than a store read " ++
            "through the cache holds (at most {d} records and {d} bytes)";
        const args = .{ c.record_count, c.data_size, records_max, data_max };
        return diag.fail(error.Corrupt, why, args);
    }
    const g = layout.Geometry.of(c.record_count, c.data_size, h.fixed_size);
    return .{
        .record_count = c.record_count,
        .data_size = c.data_size,
        .fixed_size = h.fixed_size,
        .index_size = g.index_size,
    };
}

/// What lx_replica_open makes a replica from (C: lx_replica_spec_t).
pub const Spec = extern struct {
    /// The replica's name under stores/ (a version's key, from Python).
    key: ?[*:0]const u8,
    /// The store's meta as fetched; null: open the replica as it is (a
    /// pickled store's version), not_found when it is not whole.
    meta: ?[*]const u8,
    meta_len: u64,
    /// source.json's bytes (the URL and versions, for people).
    source: ?[*]const u8,
    source_len: u64,
    /// The whole index (a server without ETags pins its version by it), or null.
    index: ?[*]const u8,
    index_len: u64,
    /// Non-zero: the index above pins the version (never dropped or refetched).
    weak: u32,
    _reserved: u32,
};

/// Opens replica `key` (lx_replica_open): made first when it is not whole
/// (`intact`) from `meta` (and the whole `index`), then published under
/// the cache's lock (a damaged one moved aside: its users keep their
/// files), and its store opened (checking the meta as any open does).
pub fn openFromSpec(
    c: *Cache,
    key: []const u8,
    meta: ?[]const u8,
    source: []const u8,
    index: ?[]const u8,
    weak: bool,
) Error!*Replica {
    const plain = std.mem.indexOfAny(u8, key, "/\\") == null;
    if (key.len == 0 or key.len > 200 or !plain or key[0] == '.')
        return diag.fail(error.InvalidArgument, "replica key {s} is not a plain name", .{key});
    try c.enterProcess();
    if (meta) |m| {
        const parsed = try parseMeta(m);
        const g = layout.Geometry.of(parsed.record_count, parsed.data_size, parsed.fixed_size);
        if (index) |ix| {
            if (ix.len != g.index_size) {
                const why = "the index given is {d} bytes, the meta says {d}";
                return diag.fail(error.InvalidArgument, why, .{ ix.len, g.index_size });
            }
        }
        if (!intact(c, key, g, m, index)) try make(c, key, g, m, source, index);
    } else if (!intact(c, key, null, null, null)) {
        const why = "{s}: replica {s} is missing or not whole";
        return diag.fail(error.NotFound, why, .{ c.root_path, key });
    }
    return Replica.lookup(c, key, .{ .weak = weak, .store = true });
}

/// Whether replica `key` is whole: every file there at the sizes of its
/// state's geometry (and of `want`), its meta `meta` and its index `index`
/// when given (a replica whose index came whole at its open).
fn intact(
    c: *Cache,
    key: []const u8,
    want: ?layout.Geometry,
    meta: ?[]const u8,
    index: ?[]const u8,
) bool {
    var buf: [320]u8 = undefined;
    const sub = files.nameZ(&buf, "stores/{s}", .{key}) orelse return false;
    const dir = files.openAt(c.root.handle, sub, files.directory, 0);
    if (dir < 0) return false;
    defer _ = std.c.close(dir);
    var head: layout.ReplicaHead = undefined;
    if (!readFile(dir, "cache.state", std.mem.asBytes(&head), 0)) return false;
    const g = want orelse layout.Geometry.fromHead(&head);
    if (!g.matches(&head)) return false;
    const sizes = [_]struct { [:0]const u8, ?u64 }{
        .{ "cache.state", null }, .{ "index", g.index_size }, .{ "data", g.data_size },
        .{ "lock", 0 },           .{ "index.fetch", null },   .{ "data.fetch", null },
    };
    for (sizes) |s| {
        const st = files.statAt(dir, s[0], key) catch return false;
        if (s[1]) |size| {
            if (st.size != size) return false;
        }
        if (std.mem.eql(u8, s[0], "cache.state") and st.size < g.stateSize()) return false;
    }
    if (index) |ix| {
        if (!sameBytes(dir, "index", ix)) return false;
    }
    if (meta) |m| return sameBytes(dir, "meta", m);
    const st = files.statAt(dir, "meta", key) catch return false;
    return st.size >= format.blob_offset;
}

fn readFile(dir: c_int, name: [:0]const u8, out: []u8, offset: u64) bool {
    const fd = files.openAt(dir, name, files.read_only, 0);
    if (fd < 0) return false;
    defer _ = std.c.close(fd);
    var done: usize = 0;
    while (done < out.len) {
        const n = std.c.pread(fd, out[done..].ptr, out.len - done, @intCast(offset + done));
        if (n <= 0) return false;
        done += @intCast(n);
    }
    return true;
}

/// Whether file `name` holds exactly `want`.
fn sameBytes(dir: c_int, name: [:0]const u8, want: []const u8) bool {
    const st = files.statAt(dir, name, "replica") catch return false;
    if (st.size != want.len) return false;
    var buf: [64 << 10]u8 = undefined;
    var at: usize = 0;
    while (at < want.len) {
        const n = @min(buf.len, want.len - at);
        if (!readFile(dir, name, buf[0..n], at)) return false;
        if (!std.mem.eql(u8, buf[0..n], want[at..][0..n])) return false;
        at += n;
    }
    return true;
}

var tmp_counter: std.atomic.Value(u64) = .init(0);

/// Makes replica `key` aside, checks it opens as a store, and publishes it
/// under the cache's lock (unless another process did meanwhile).
fn make(
    c: *Cache,
    key: []const u8,
    g: layout.Geometry,
    meta: []const u8,
    source: []const u8,
    index: ?[]const u8,
) Error!void {
    const n = tmp_counter.fetchAdd(1, .monotonic);
    var tb: [320]u8 = undefined;
    var ab: [320]u8 = undefined;
    const pid = pool.currentPid();
    // (a key is at most 200 bytes: openFromSpec)
    const tmp = files.nameZ(&tb, "stores/.tmp-{s}-{d}-{d}", .{ key, pid, n }) orelse unreachable;
    const aside_name = "stores/.damaged-{s}-{d}-{d}";
    // (a key is at most 200 bytes: openFromSpec)
    const aside = files.nameZ(&ab, aside_name, .{ key, pid, n }) orelse unreachable;
    const io = pool.io();
    defer c.root.deleteTree(io, tmp) catch {};
    defer c.root.deleteTree(io, aside) catch {};
    _ = std.c.mkdirat(c.root.handle, "stores", 0o755);
    build(c, tmp, g, meta, source, index) catch |e| return unbuildable(c, g, e);
    {
        var buf: [std.fs.max_path_bytes]u8 = undefined;
        const path = std.fmt.bufPrint(&buf, "{s}/{s}", .{ c.root_path, tmp }) catch
            return diag.fail(error.InvalidArgument, "cache path too long", .{});
        const s = try Store.open(c.gpa, path, .{}); // the meta checked as any open checks it
        s.shutdown();
        s.unhold();
    }
    try c.lock();
    defer c.unlock();
    if (intact(c, key, g, meta, index)) return;
    var kb: [320]u8 = undefined;
    // (a key is at most 200 bytes: openFromSpec)
    const dest = files.nameZ(&kb, "stores/{s}", .{key}) orelse unreachable;
    const moved = std.c.renameat(c.root.handle, dest, c.root.handle, aside) == 0;
    if (!moved and files.errnoNow() != .NOENT) {
        const why = "{s}/{s}: moving a damaged replica aside";
        return files.errnoFail(error.IoFailed, why, .{ c.root_path, dest });
    }
    if (std.c.renameat(c.root.handle, tmp, c.root.handle, dest) != 0)
        return files.errnoFail(error.IoFailed, "{s}/{s}: publishing it", .{ c.root_path, dest });
    if (index != null) {
        const added = layout.footprintWord(~@as(u64, 0), g.index_shift) * (g.index_blocks / 64) +
            layout.footprintWord((@as(u64, 1) << @intCast(g.index_blocks % 64)) - 1, g.index_shift);
        _ = @atomicRmw(u64, &c.head.used, .Add, added, .monotonic);
    }
}

fn unbuildable(c: *Cache, g: layout.Geometry, e: Error) Error {
    const errno_text = std.mem.span(diag.get());
    const kind: Error = if (e == error.NoSpace) error.NoSpace else error.IoFailed;
    const hint: []const u8 = if (e == error.NoSpace)
        "; free space on the cache's file system"
    else if (std.mem.indexOf(u8, errno_text, "too large") != null)
        " (a file system that takes files this large is needed)"
    else
        "";
    var buf: [512]u8 = undefined;
    const why = std.fmt.bufPrint(&buf, "{s}", .{errno_text}) catch buf[0..0];
    const what = "its replica (index {d} bytes, data {d} bytes, sparse) cannot be made in " ++
        "{s}: {s}{s}";
    return diag.fail(kind, what, .{
        g.index_size, g.data_size, c.root_path, why, hint,
    });
}

/// A new replica's files in the directory `tmp` (made here); the message
/// of a failure is the system's reason alone (`unbuildable` says the rest).
fn build(
    c: *Cache,
    tmp: [:0]const u8,
    g: layout.Geometry,
    meta: []const u8,
    source: []const u8,
    index: ?[]const u8,
) Error!void {
    if (std.c.mkdirat(c.root.handle, tmp, 0o755) != 0) return reason();
    const dir = files.openAt(c.root.handle, tmp, files.directory, 0);
    if (dir < 0) return reason();
    defer _ = std.c.close(dir);
    const names = [_]struct { [:0]const u8, u64 }{
        .{ "index", g.index_size }, .{ "data", g.data_size }, .{ "lock", 0 },
        .{ "index.fetch", 0 },      .{ "data.fetch", 0 },
    };
    for (names) |f| {
        const fd = try createIn(dir, f[0]);
        defer _ = std.c.close(fd);
        if (std.c.ftruncate(fd, @intCast(f[1])) != 0) return reason();
    }
    try buildState(dir, g, index != null);
    try writeNew(dir, "source.json", source);
    if (index) |ix| {
        const fd = files.openAt(dir, "index", .{ .ACCMODE = .WRONLY, .CLOEXEC = true }, 0);
        if (fd < 0) return reason();
        defer _ = std.c.close(fd);
        if (files.allocate(fd, 0, ix.len) != .SUCCESS) return reason();
        try writeFd(fd, ix);
    }
    try writeNew(dir, "meta", meta);
}

/// A replica's state, every page of it on disk (the bitmaps and ticks are
/// written through a shared mapping: a hole of a full tmpfs is a SIGBUS
/// there); its index bits all set when the index came whole.
fn buildState(dir: c_int, g: layout.Geometry, whole_index: bool) Error!void {
    const fd = try createIn(dir, "cache.state");
    defer _ = std.c.close(fd);
    const size = g.stateSize();
    if (std.c.ftruncate(fd, @intCast(size)) != 0) return reason();
    if (files.allocate(fd, 0, size) != .SUCCESS) return reason();
    const st = files.statFd(fd, "cache.state") catch return reason();
    if (st.blocks * 512 < size) { // no fallocate here: real zeros
        const zeros: [64 << 10]u8 = @splat(0);
        var at: u64 = layout.page;
        while (at < size) : (at += zeros.len) {
            const n: usize = @intCast(@min(zeros.len, size - at));
            files.writeAll(fd, zeros[0..n], at, "", "cache.state") catch return reason();
        }
    }
    var h = g.head();
    try writeAt(fd, std.mem.asBytes(&h), 0);
    if (!whole_index) return;
    const ones: [512]u64 = @splat(~@as(u64, 0));
    var w: u64 = 0;
    while (w < g.index_blocks / 64) : (w += ones.len) {
        const n: usize = @intCast(@min(ones.len, g.index_blocks / 64 - w));
        try writeAt(fd, std.mem.sliceAsBytes(ones[0..n]), layout.page + w * 8);
    }
    if (g.index_blocks % 64 != 0) {
        const last: u64 = (@as(u64, 1) << @intCast(g.index_blocks % 64)) - 1;
        try writeAt(fd, std.mem.asBytes(&last), layout.page + (g.index_blocks / 64) * 8);
    }
}

fn createIn(dir: c_int, name: [:0]const u8) Error!c_int {
    const flags: std.posix.O = .{ .ACCMODE = .RDWR, .CREAT = true, .EXCL = true, .CLOEXEC = true };
    const fd = files.openAt(dir, name, flags, 0o644);
    if (fd < 0) return reason();
    return fd;
}

fn writeNew(dir: c_int, name: [:0]const u8, bytes: []const u8) Error!void {
    const fd = try createIn(dir, name);
    defer _ = std.c.close(fd);
    try writeFd(fd, bytes);
}

fn writeFd(fd: c_int, bytes: []const u8) Error!void {
    try writeAt(fd, bytes, 0);
}

fn writeAt(fd: c_int, bytes: []const u8, offset: u64) Error!void {
    files.writeAll(fd, bytes, offset, "", "") catch |e| {
        if (e == error.NoSpace) return diag.fail(error.NoSpace, "No space left on device", .{});
        return reason();
    };
}

/// The system's reason for the call that just failed, as the error.
fn reason() Error {
    const e = files.errnoNow();
    const kind: Error = switch (e) {
        .NOSPC, .DQUOT => error.NoSpace,
        else => error.IoFailed,
    };
    return diag.fail(kind, "{s}", .{files.errnoText(e)});
}

// ---------------------------------------------------------------- tests

const fetch = @import("cache_fetch.zig");

/// For the tests: a source store (the "server") in a temporary directory,
/// a cache beside it, and the replica of the store in the cache.
pub const TestBed = struct {
    tmp: std.testing.TmpDir,
    cache: *Cache,
    replica: *Replica,
    /// The source store's index and data (what `serve` copies from).
    src: [2]c_int,
    /// Fetch steps served, bytes copied.
    steps: u64 = 0,
    bytes: u64 = 0,
    /// Serve these bytes instead of the server's (a damaged server).
    garbage: bool = false,

    /// `count` records: of `fixed` bytes each (the fixed layout), or, with 0,
    /// record i of 100 + (i * 37) % 700 bytes (the table layout).
    pub fn init(fixed: u64, count: usize) !TestBed {
        const gpa = std.testing.allocator;
        const io = pool.io();
        var tmp = std.testing.tmpDir(.{});
        errdefer tmp.cleanup();
        const base = try tmp.dir.realPathFileAlloc(io, ".", gpa);
        defer gpa.free(base);
        var pb: [std.fs.max_path_bytes]u8 = undefined;
        const src = try std.fmt.bufPrint(&pb, "{s}/src", .{base});
        try makeSource(src, fixed, count);
        const meta = try tmp.dir.readFileAlloc(io, "src/meta", gpa, .unlimited);
        defer gpa.free(meta);
        var cb: [std.fs.max_path_bytes]u8 = undefined;
        const c = try Cache.open(gpa, try std.fmt.bufPrint(&cb, "{s}/cache", .{base}), true);
        errdefer c.close();
        const r = try openFromSpec(c, "k", meta, "{}", null, false);
        var t: TestBed = .{ .tmp = tmp, .cache = c, .replica = r, .src = undefined };
        for (&t.src, [_][:0]const u8{ "src/index", "src/data" }) |*fd, name| {
            fd.* = files.openAt(tmp.dir.handle, name, files.read_only, 0);
            try std.testing.expect(fd.* >= 0);
        }
        return t;
    }

    fn makeSource(path: []const u8, fixed: u64, count: usize) !void {
        const gpa = std.testing.allocator;
        const s = try Store.open(gpa, path, .{
            .create = true,
            .codec = .raw,
            .fixed_size = fixed,
        });
        defer s.close();
        const ptrs = try gpa.alloc([*]const u8, count);
        defer gpa.free(ptrs);
        const sizes = try gpa.alloc(u64, count);
        defer gpa.free(sizes);
        var bytes: [4096]u8 = undefined;
        assert(fixed <= bytes.len);
        for (0..count) |i| {
            sizes[i] = if (fixed != 0) fixed else 100 + (i * 37) % 700;
            ptrs[i] = pattern(i, &bytes)[0..@intCast(sizes[i])].ptr;
            const one: Store.Batch = .{
                .ptrs = ptrs[i..].ptr,
                .sizes = sizes[i..].ptr,
                .count = 1,
            };
            _ = try s.append(one, false);
        }
        try s.sync();
    }

    /// Record i's bytes: `i` and its position, so every record differs.
    pub fn pattern(i: usize, buf: *[4096]u8) *[4096]u8 {
        for (buf, 0..) |*b, k| b.* = @truncate(i *% 131 +% k *% 7);
        return buf;
    }

    pub fn deinit(t: *TestBed) void {
        for (t.src) |fd| _ = std.c.close(fd);
        t.cache.close();
        t.tmp.cleanup();
    }

    /// The network: copies each keep of fetch step `f` from the source
    /// store's files into the replica's, at its own offsets.
    pub fn serve(t: *TestBed, f: *const fetch.Fetch) !void {
        t.steps += 1;
        for (f.files, 0..) |req, k| {
            var buf: [64 << 10]u8 = undefined;
            for (0..@intCast(req.keep_count)) |q| {
                var at = req.keep_lo.?[q];
                while (at < req.keep_hi.?[q]) {
                    const n: usize = @intCast(@min(buf.len, req.keep_hi.?[q] - at));
                    const got = std.c.pread(t.src[k], &buf, n, @intCast(at));
                    try std.testing.expectEqual(@as(isize, @intCast(n)), got);
                    if (t.garbage and k == 1) @memset(buf[0..n], 0xEE);
                    try files.writeAll(t.replica.fds[k], buf[0..n], at, "test", "replica");
                    t.bytes += n;
                    at += n;
                }
            }
        }
    }

    /// Reads `records` through the replica as a loader would: begin, serve
    /// every step, land it; returns the read's tick (0 for a prefetch).
    pub fn read(t: *TestBed, records: []const u64, flags: u32) !u64 {
        var f: fetch.Fetch = undefined;
        try fetch.begin(t.replica, records, flags, &f);
        errdefer fetch.failed(&f, 0) catch {};
        while (f.status == fetch.Status.ranges) {
            try t.serve(&f);
            try fetch.landed(&f);
        }
        return f.tick;
    }
};

test "a meta is parsed, and refused when damaged, not synced or too large" {
    var t = try TestBed.init(8, 10);
    defer t.deinit();
    const gpa = std.testing.allocator;
    const meta = try t.tmp.dir.readFileAlloc(pool.io(), "src/meta", gpa, .unlimited);
    defer gpa.free(meta);
    const m = try parseMeta(meta);
    try std.testing.expectEqual(Meta{
        .record_count = 10,
        .data_size = 80,
        .fixed_size = 8,
        .index_size = 40,
    }, m);
    try std.testing.expectError(error.NotAStore, parseMeta(meta[0..100]));
    const bad = try gpa.dupe(u8, meta);
    defer gpa.free(bad);
    bad[0] ^= 1; // the magic
    try std.testing.expectError(error.NotAStore, parseMeta(bad));
    @memcpy(bad, meta);
    bad[format.commit_offset + 8] ^= 1; // the commit, its checksum not fixed
    try std.testing.expectError(error.Corrupt, parseMeta(bad));
    // Records since the last sync, or more than a replica holds: refused.
    var c: format.Commit = undefined;
    @memcpy(std.mem.asBytes(&c), meta[format.commit_offset..][0..@sizeOf(format.Commit)]);
    for ([_][2]u64{ .{ 11, 10 }, .{ records_max + 1, records_max + 1 } }) |counts| {
        var edited = c;
        edited.record_count = counts[0];
        edited.durable_count = counts[1];
        edited.checksum = edited.computeChecksum();
        @memcpy(bad[format.commit_offset..][0..@sizeOf(format.Commit)], std.mem.asBytes(&edited));
        try std.testing.expectError(error.Corrupt, parseMeta(bad));
    }
}

test "a replica is opened as it is, and made anew when damaged (its users keep theirs)" {
    var t = try TestBed.init(0, 50);
    defer t.deinit();
    const c = t.cache;
    const first = t.replica;
    try std.testing.expectEqual(first, try openFromSpec(c, "k", null, "", null, false));
    try std.testing.expectError(error.NotFound, openFromSpec(c, "other", null, "", null, false));
    const outside = openFromSpec(c, "../k", null, "", null, false);
    try std.testing.expectError(error.InvalidArgument, outside);
    const gpa = std.testing.allocator;
    const meta = try t.tmp.dir.readFileAlloc(pool.io(), "src/meta", gpa, .unlimited);
    defer gpa.free(meta);
    // Its index cut short: made anew from the meta; the old one is retired.
    const ix = files.openAt(first.dir, "index", files.read_write, 0);
    _ = std.c.ftruncate(ix, 10);
    _ = std.c.close(ix);
    try std.testing.expectError(error.NotFound, openFromSpec(c, "k", null, "", null, false));
    const second = try openFromSpec(c, "k", meta, "{}", null, false);
    try std.testing.expect(second != first and first.retired and !second.retired);
    const index = try files.statAt(second.dir, "index", "k");
    try std.testing.expectEqual(second.geo.index_size, index.size);
}
