//! One replica of a remote store in the node-local cache (src/cache.zig owns
//! the cache, its files' format and the protocol its processes share). A
//! replica is a store directory whose `index` and `data` are sparse files
//! of their full sizes; fetched blocks land at their own offsets, and the
//! native engine reads cached records exactly as it reads a local store.
//! This file owns what a replica holds for this process and the node: its
//! presence bits and region ticks (mapped `cache.state`), its fetch locks,
//! the start of a read through it (the stamps, the checked records), the
//! fetch plans that say which byte ranges this process must fetch for a
//! read (reserving them) and take them in once they landed (checked
//! against the store's checksums, marked present, released), the making
//! of a replica from its store's meta (parsed here), and the drop of what
//! fails its check.
//!
//! A fetch plan is a small state machine that one thread drives through
//! the C ABI (`lx_replica_begin`, then `lx_fetch_landed` or
//! `lx_fetch_failed` after each step's ranges are fetched): a table
//! layout's index entries first (a record's place in the data), then the
//! read's start (tick, watermark, stamps: cache.zig) and its records' data
//! (with a fixed layout's checksums, in the same step), then the check;
//! records that fail are dropped and fetched once more. Blocks another
//! process (or thread) is fetching are waited for after this step's own,
//! never while holding any: no two processes wait for each other.
const Replica = @This();

const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const Io = std.Io;
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const format = @import("format.zig");
const Store = @import("Store.zig");
const Cache = @import("cache.zig");

const Error = Cache.Error;

/// The largest store the cache replicates: 2^36 records (a process keeps a
/// bit per record) and 2^51 bytes of data (2^27 blocks of 16 MiB).
pub const records_max: u64 = 1 << 36;
pub const data_max: u64 = 1 << 51;

/// `canary_value` while the replica is open (the ABI checks it).
canary: u64 = canary_value,
cache: *Cache,
key: [:0]u8,
dir: c_int,
geo: Cache.Geometry,
state_dev: u64,
state_ino: u64,
map: []align(std.heap.page_size_min) u8,
head: *Cache.ReplicaHead,
ibits: []u64,
dwords: []u64,
atime: []u64,
ptime: []u64,
/// index, data, index.fetch, data.fetch: opened once and kept (closing any
/// descriptor of a fetch file drops this process's locks on it).
fds: [4]c_int,
/// The table layout's index, mapped (a record's place in the data); only
/// entries of blocks marked present are ever read.
entries: []align(std.heap.page_size_min) const u8 = &.{},
/// The replica as a store, for checking records (lx_replica_open makes it;
/// null for a replica only eviction opened).
store: ?*Store = null,
/// The version is pinned by its index, fetched whole at open (a server
/// without ETags): it is never dropped or fetched again.
weak: bool = false,
/// Replaced in the directory by a newer replica of the key (its users keep
/// their files; eviction leaves it alone).
retired: bool = false,
/// One bit per record: checked by this process since `checked_at`.
checked: []u8 = &.{},
checked_map: []align(std.heap.page_size_min) u8 = &.{},
checked_at: u64 = 0,
/// This process's fetch locks on the fetch files, and its threads' block
/// runs reserved (`reserved[file]`): a POSIX lock belongs to the process,
/// so threads keep apart here, and eviction takes none of these.
mutex: Io.Mutex = .init,
reserved: [2]std.ArrayList([2]u64) = .{ .empty, .empty },
/// This process's fetches, for the whole-index policy and the figures.
fetched: std.atomic.Value(u64) = .init(0),
fetched_data: std.atomic.Value(u64) = .init(0),
index_gets: std.atomic.Value(u64) = .init(0),
whole_running: std.atomic.Value(u32) = .init(0),
whole_started: std.atomic.Value(bool) = .init(false),

/// "LXREPLI1" read as a little-endian u64.
pub const canary_value: u64 = 0x31494C504552584C;

pub const File = enum(u1) { index = 0, data = 1 };
const fd_index = 0;
const fd_data = 1;
const fd_lock = 2;

fn fileFd(r: *const Replica, f: File) c_int {
    return r.fds[@backingInt(f)];
}

fn lockFd(r: *const Replica, f: File) c_int {
    return r.fds[fd_lock + @as(usize, @backingInt(f))];
}

fn shift(r: *const Replica, f: File) u6 {
    return if (f == .index) r.geo.index_shift else r.geo.data_shift;
}

fn fileSize(r: *const Replica, f: File) u64 {
    return if (f == .index) r.geo.index_size else r.geo.data_size;
}

fn bits(r: *const Replica, f: File) []u64 {
    return if (f == .index) r.ibits else r.dwords;
}

// ---------------------------------------------------------------- opening

/// The open replica `key` of cache `c` (a current one; made anew when the
/// directory holds another since), opening it when this process has not.
pub fn lookup(c: *Cache, key: []const u8, weak: ?bool) Error!*Replica {
    const io = pool.io();
    c.table_mutex.lockUncancelable(io);
    defer c.table_mutex.unlock(io);
    for (c.replicas.items) |r| {
        if (r.retired or !std.mem.eql(u8, r.key, key)) continue;
        if (r.isCurrent()) return r;
        r.retired = true;
    }
    c.replicas.ensureUnusedCapacity(c.gpa, 1) catch return error.OutOfMemory;
    const r = try openReplica(c, key);
    if (weak) |w| r.weak = w;
    c.replicas.appendAssumeCapacity(r);
    return r;
}

fn isCurrent(r: *Replica) bool {
    const st = Cache.statAt(r.dir, "cache.state", r.key) catch return false;
    return st.dev == r.state_dev and st.ino == r.state_ino;
}

fn openReplica(c: *Cache, key: []const u8) Error!*Replica {
    var path: [320]u8 = undefined;
    const sub = std.fmt.bufPrintSentinel(&path, "stores/{s}", .{key}, 0) catch
        return diag.fail(error.InvalidArgument, "replica key too long", .{});
    const dir = Cache.openAt(c.root.handle, sub, .{ .ACCMODE = .RDONLY, .DIRECTORY = true, .CLOEXEC = true }, 0);
    if (dir < 0) return Cache.errnoFail(error.NotFound, "{s}/{s}", .{ c.root_path, sub });
    errdefer _ = std.c.close(dir);
    const r = c.gpa.create(Replica) catch return error.OutOfMemory;
    errdefer c.gpa.destroy(r);
    r.* = .{ .cache = c, .key = undefined, .dir = dir, .geo = undefined, .state_dev = 0, .state_ino = 0, .map = &.{}, .head = undefined, .ibits = &.{}, .dwords = &.{}, .atime = &.{}, .ptime = &.{}, .fds = .{ -1, -1, -1, -1 } };
    r.key = c.gpa.dupeSentinel(u8, key, 0) catch return error.OutOfMemory;
    errdefer r.destroyParts();
    try r.mapState();
    const names = [4][:0]const u8{ "index", "data", "index.fetch", "data.fetch" };
    for (names, 0..) |name, i| {
        r.fds[i] = Cache.openAt(dir, name, .{ .ACCMODE = .RDWR, .CLOEXEC = true }, 0);
        if (r.fds[i] < 0) return Cache.errnoFail(error.NotFound, "{s}/{s}/{s}", .{ c.root_path, sub, name });
    }
    try r.mapEntries();
    try r.mapChecked();
    return r;
}

fn mapState(r: *Replica) Error!void {
    const fd = Cache.openAt(r.dir, "cache.state", .{ .ACCMODE = .RDWR, .CLOEXEC = true }, 0);
    if (fd < 0) return Cache.errnoFail(error.NotFound, "{s}: cache.state", .{r.key});
    defer _ = std.c.close(fd);
    const st = try Cache.statFd(fd, "cache.state");
    const size = st.size;
    if (size < Cache.page) return diag.fail(error.Corrupt, "{s}: cache state is truncated", .{r.key});
    r.map = std.posix.mmap(null, @intCast(size), .{ .READ = true, .WRITE = true }, .{ .TYPE = .SHARED }, fd, 0) catch
        return diag.fail(error.OutOfMemory, "{s}: cache state cannot be mapped", .{r.key});
    r.state_dev = st.dev;
    r.state_ino = st.ino;
    r.head = @ptrCast(r.map.ptr);
    const g = Cache.Geometry.fromHead(r.head);
    if (!g.matches(r.head) or size < g.stateSize())
        return diag.fail(error.Corrupt, "{s}: not a loaderx cache state of this version", .{r.key});
    r.geo = g;
    const words: [*]u64 = @ptrCast(@alignCast(r.map.ptr + Cache.page));
    var at: usize = 0;
    r.ibits = words[at..][0..@intCast(g.index_words)];
    at += @intCast(g.index_words);
    r.dwords = words[at..][0..@intCast(g.regions)];
    at += @intCast(g.regions);
    r.atime = words[at..][0..@intCast(g.regions)];
    at += @intCast(g.regions);
    r.ptime = words[at..][0..@intCast(g.regions)];
}

fn mapEntries(r: *Replica) Error!void {
    if (r.geo.fixed_size != 0 or r.geo.record_count == 0) return;
    r.entries = std.posix.mmap(null, @intCast(r.geo.index_size), .{ .READ = true }, .{ .TYPE = .SHARED }, r.fds[fd_index], 0) catch
        return diag.fail(error.OutOfMemory, "{s}: its index cannot be mapped", .{r.key});
}

fn mapChecked(r: *Replica) Error!void {
    const n: usize = @intCast((r.geo.record_count + 7) / 8);
    if (n == 0) return;
    r.checked_map = std.posix.mmap(null, n, .{ .READ = true, .WRITE = true }, .{ .TYPE = .PRIVATE, .ANONYMOUS = true }, -1, 0) catch
        return diag.fail(error.OutOfMemory, "{s}: no memory for {d} records' checked bits", .{ r.key, r.geo.record_count });
    r.checked = r.checked_map[0..n];
    r.checked_at = @atomicLoad(u64, &r.head.evictions, .seq_cst);
}

fn destroyParts(r: *Replica) void {
    const gpa = r.cache.gpa;
    if (r.store) |s| {
        s.shutdown();
        s.unhold();
    }
    for (r.fds) |fd| {
        if (fd >= 0) _ = std.c.close(fd);
    }
    if (r.entries.len != 0) std.posix.munmap(r.entries);
    if (r.checked_map.len != 0) std.posix.munmap(r.checked_map);
    if (r.map.len != 0) std.posix.munmap(r.map);
    for (&r.reserved) |*l| l.deinit(gpa);
    gpa.free(r.key);
}

pub fn destroy(r: *Replica) void {
    _ = std.c.close(r.dir);
    r.destroyParts();
    r.canary = 0;
    r.cache.gpa.destroy(r);
}

/// In a forked child (inside fork()): the parent's threads' reservations
/// and locks are not the child's, nor are its fetch counts.
pub fn adoptInChild(r: *Replica) void {
    r.mutex = .init;
    for (&r.reserved) |*l| l.items.len = 0;
    r.fetched.raw = 0;
    r.fetched_data.raw = 0;
    r.index_gets.raw = 0;
    r.whole_running.raw = 0;
    r.whole_started.raw = false;
}

// ---------------------------------------------------------------- the meta

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
    if (meta.len < format.blob_offset)
        return diag.fail(error.NotAStore, "its meta is {d} bytes, shorter than a store's header and commit", .{meta.len});
    var h: format.Header = undefined;
    @memcpy(std.mem.asBytes(&h), meta[0..@sizeOf(format.Header)]);
    try Store.checkHeader(&h);
    var c: format.Commit = undefined;
    @memcpy(std.mem.asBytes(&c), meta[format.commit_offset..][0..@sizeOf(format.Commit)]);
    if (c.checksum != c.computeChecksum() or !c.consistent())
        return diag.fail(error.Corrupt, "its meta's commit fails its checksum (a damaged upload?)", .{});
    if (c.durable_count != c.record_count) {
        return diag.fail(error.Corrupt, "this store was uploaded while a writer had it open ({d} " ++
            "records since its last sync); open and close it locally, then upload it again", .{c.record_count - c.durable_count});
    }
    if (c.record_count > records_max or c.data_size > data_max) {
        return diag.fail(error.Corrupt, "its meta says {d} records and {d} bytes of data, more than " ++
            "a store read through the cache holds (at most {d} records and {d} bytes)", .{ c.record_count, c.data_size, records_max, data_max });
    }
    const g = Cache.Geometry.of(c.record_count, c.data_size, h.fixed_size);
    return .{ .record_count = c.record_count, .data_size = c.data_size, .fixed_size = h.fixed_size, .index_size = g.index_size };
}

// ---------------------------------------------------------------- making a replica

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
pub fn openFromSpec(c: *Cache, key: []const u8, meta: ?[]const u8, source: []const u8, index: ?[]const u8, weak: bool) Error!*Replica {
    if (key.len == 0 or key.len > 200 or std.mem.indexOfAny(u8, key, "/\\") != null or key[0] == '.')
        return diag.fail(error.InvalidArgument, "replica key {s} is not a plain name", .{key});
    try c.enterProcess();
    if (meta) |m| {
        const parsed = try parseMeta(m);
        const g = Cache.Geometry.of(parsed.record_count, parsed.data_size, parsed.fixed_size);
        if (index) |ix| {
            if (ix.len != g.index_size)
                return diag.fail(error.InvalidArgument, "the index given is {d} bytes, the meta says {d}", .{ ix.len, g.index_size });
        }
        if (!intact(c, key, g, m, index)) try make(c, key, g, m, source, index);
    } else if (!intact(c, key, null, null, null)) {
        return diag.fail(error.NotFound, "{s}: replica {s} is missing or not whole", .{ c.root_path, key });
    }
    const r = try lookup(c, key, weak);
    if (r.store == null) {
        var buf: [std.fs.max_path_bytes]u8 = undefined;
        const path = std.fmt.bufPrint(&buf, "{s}/stores/{s}", .{ c.root_path, key }) catch
            return diag.fail(error.InvalidArgument, "cache path too long", .{});
        r.store = try Store.open(c.gpa, path, .{});
    }
    return r;
}

/// Whether replica `key` is whole: every file there at the sizes of its
/// state's geometry (and of `want`), its meta `meta` and its index `index`
/// when given (a replica whose index came whole at its open).
fn intact(c: *Cache, key: []const u8, want: ?Cache.Geometry, meta: ?[]const u8, index: ?[]const u8) bool {
    var buf: [320]u8 = undefined;
    const sub = std.fmt.bufPrintSentinel(&buf, "stores/{s}", .{key}, 0) catch return false;
    const dir = Cache.openAt(c.root.handle, sub, .{ .ACCMODE = .RDONLY, .DIRECTORY = true, .CLOEXEC = true }, 0);
    if (dir < 0) return false;
    defer _ = std.c.close(dir);
    var head: Cache.ReplicaHead = undefined;
    if (!readFile(dir, "cache.state", std.mem.asBytes(&head), 0)) return false;
    const g = want orelse Cache.Geometry.fromHead(&head);
    if (!g.matches(&head)) return false;
    const sizes = [_]struct { [:0]const u8, ?u64 }{
        .{ "cache.state", null }, .{ "index", g.index_size }, .{ "data", g.data_size },
        .{ "lock", 0 },           .{ "index.fetch", null },   .{ "data.fetch", null },
    };
    for (sizes) |s| {
        const st = Cache.statAt(dir, s[0], key) catch return false;
        if (s[1]) |size| {
            if (st.size != size) return false;
        }
        if (std.mem.eql(u8, s[0], "cache.state") and st.size < g.stateSize()) return false;
    }
    if (index) |ix| {
        if (!sameBytes(dir, "index", ix)) return false;
    }
    if (meta) |m| return sameBytes(dir, "meta", m);
    const st = Cache.statAt(dir, "meta", key) catch return false;
    return st.size >= format.blob_offset;
}

fn readFile(dir: c_int, name: [:0]const u8, out: []u8, offset: u64) bool {
    const fd = Cache.openAt(dir, name, .{ .ACCMODE = .RDONLY, .CLOEXEC = true }, 0);
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
    const st = Cache.statAt(dir, name, "replica") catch return false;
    if (st.size != want.len) return false;
    var buf: [64 << 10]u8 = undefined;
    var at: usize = 0;
    while (at < want.len) {
        const n = @min(buf.len, want.len - at);
        if (!readFile(dir, name, buf[0..n], at) or !std.mem.eql(u8, buf[0..n], want[at..][0..n])) return false;
        at += n;
    }
    return true;
}

var tmp_counter: std.atomic.Value(u64) = .init(0);

/// Makes replica `key` aside, checks it opens as a store, and publishes it
/// under the cache's lock (unless another process did meanwhile).
fn make(c: *Cache, key: []const u8, g: Cache.Geometry, meta: []const u8, source: []const u8, index: ?[]const u8) Error!void {
    const n = tmp_counter.fetchAdd(1, .monotonic);
    var tb: [320]u8 = undefined;
    var ab: [320]u8 = undefined;
    const tmp = std.fmt.bufPrintSentinel(&tb, "stores/.tmp-{s}-{d}-{d}", .{ key, pool.currentPid(), n }, 0) catch unreachable;
    const aside = std.fmt.bufPrintSentinel(&ab, "stores/.damaged-{s}-{d}-{d}", .{ key, pool.currentPid(), n }, 0) catch unreachable;
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
    const dest = std.fmt.bufPrintSentinel(&kb, "stores/{s}", .{key}, 0) catch unreachable;
    if (std.c.renameat(c.root.handle, dest, c.root.handle, aside) != 0 and Cache.errnoNow() != .NOENT)
        return Cache.errnoFail(error.IoFailed, "{s}/{s}: moving a damaged replica aside", .{ c.root_path, dest });
    if (std.c.renameat(c.root.handle, tmp, c.root.handle, dest) != 0)
        return Cache.errnoFail(error.IoFailed, "{s}/{s}: publishing a replica", .{ c.root_path, dest });
    if (index != null) {
        const added = Cache.footprintWord(~@as(u64, 0), g.index_shift) * (g.index_blocks / 64) +
            Cache.footprintWord((@as(u64, 1) << @intCast(g.index_blocks % 64)) - 1, g.index_shift);
        _ = @atomicRmw(u64, &c.head.used, .Add, added, .monotonic);
    }
}

fn unbuildable(c: *Cache, g: Cache.Geometry, e: Error) Error {
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
    return diag.fail(kind, "its replica (index {d} bytes, data {d} bytes, sparse) cannot be made in {s}: {s}{s}", .{
        g.index_size, g.data_size, c.root_path, why, hint,
    });
}

/// A new replica's files in the directory `tmp` (made here); the message
/// of a failure is the system's reason alone (`unbuildable` says the rest).
fn build(c: *Cache, tmp: [:0]const u8, g: Cache.Geometry, meta: []const u8, source: []const u8, index: ?[]const u8) Error!void {
    if (std.c.mkdirat(c.root.handle, tmp, 0o755) != 0) return reason();
    const dir = Cache.openAt(c.root.handle, tmp, .{ .ACCMODE = .RDONLY, .DIRECTORY = true, .CLOEXEC = true }, 0);
    if (dir < 0) return reason();
    defer _ = std.c.close(dir);
    const files = [_]struct { [:0]const u8, u64 }{
        .{ "index", g.index_size }, .{ "data", g.data_size }, .{ "lock", 0 },
        .{ "index.fetch", 0 },      .{ "data.fetch", 0 },
    };
    for (files) |f| {
        const fd = try createIn(dir, f[0]);
        defer _ = std.c.close(fd);
        if (std.c.ftruncate(fd, @intCast(f[1])) != 0) return reason();
    }
    try buildState(dir, g, index != null);
    try writeNew(dir, "source.json", source);
    if (index) |ix| {
        const fd = Cache.openAt(dir, "index", .{ .ACCMODE = .WRONLY, .CLOEXEC = true }, 0);
        if (fd < 0) return reason();
        defer _ = std.c.close(fd);
        if (Cache.allocate(fd, 0, ix.len) != .SUCCESS) return reason();
        try writeFd(fd, ix);
    }
    try writeNew(dir, "meta", meta);
}

/// A replica's state, every page of it on disk (the bitmaps and ticks are
/// written through a shared mapping: a hole of a full tmpfs is a SIGBUS
/// there); its index bits all set when the index came whole.
fn buildState(dir: c_int, g: Cache.Geometry, whole_index: bool) Error!void {
    const fd = try createIn(dir, "cache.state");
    defer _ = std.c.close(fd);
    const size = g.stateSize();
    if (std.c.ftruncate(fd, @intCast(size)) != 0) return reason();
    if (Cache.allocate(fd, 0, size) != .SUCCESS) return reason();
    const st = Cache.statFd(fd, "cache.state") catch return reason();
    if (st.blocks * 512 < size) { // no fallocate here: real zeros
        const zeros: [64 << 10]u8 = @splat(0);
        var at: u64 = Cache.page;
        while (at < size) : (at += zeros.len) {
            const n: usize = @intCast(@min(zeros.len, size - at));
            Cache.writeAll(fd, zeros[0..n], at, "", "cache.state") catch return reason();
        }
    }
    var h = g.head();
    try writeAt(fd, std.mem.asBytes(&h), 0);
    if (!whole_index) return;
    const ones: [512]u64 = @splat(~@as(u64, 0));
    var w: u64 = 0;
    while (w < g.index_blocks / 64) : (w += ones.len) {
        const n: usize = @intCast(@min(ones.len, g.index_blocks / 64 - w));
        try writeAt(fd, std.mem.sliceAsBytes(ones[0..n]), Cache.page + w * 8);
    }
    if (g.index_blocks % 64 != 0) {
        const last: u64 = (@as(u64, 1) << @intCast(g.index_blocks % 64)) - 1;
        try writeAt(fd, std.mem.asBytes(&last), Cache.page + (g.index_blocks / 64) * 8);
    }
}

fn createIn(dir: c_int, name: [:0]const u8) Error!c_int {
    const fd = Cache.openAt(dir, name, .{ .ACCMODE = .RDWR, .CREAT = true, .EXCL = true, .CLOEXEC = true }, 0o644);
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
    Cache.writeAll(fd, bytes, offset, "", "") catch |e| {
        if (e == error.NoSpace) return diag.fail(error.NoSpace, "No space left on device", .{});
        return reason();
    };
}

/// The system's reason for the call that just failed, as the error.
fn reason() Error {
    const e = Cache.errnoNow();
    const kind: Error = switch (e) {
        .NOSPC, .DQUOT => error.NoSpace,
        else => error.IoFailed,
    };
    return diag.fail(kind, "{s}", .{Cache.errnoText(e)});
}

// ---------------------------------------------------------------- records

pub const entry_size = 32;

/// Where record `i`'s bytes lie in the data, `[start, end)`, clamped to the
/// data (a damaged entry must not send a fetch or a stamp outside it: it
/// fails its check). A table layout's entry must be present.
pub fn span(r: *const Replica, i: u64) [2]u64 {
    assert(i < r.geo.record_count);
    if (r.geo.fixed_size != 0) return .{ i * r.geo.fixed_size, (i + 1) * r.geo.fixed_size };
    const e = r.entries[@intCast(i * entry_size)..][0..entry_size];
    const offset = std.mem.readInt(u64, e[0..8], .little);
    const stored = std.mem.readInt(u64, e[8..16], .little);
    const aux = std.mem.readInt(u16, e[30..32], .little);
    const start = @min(offset, r.geo.data_size);
    return .{ start, @min(@max(offset +| stored +| aux, start), r.geo.data_size) };
}

/// `span`, for a record whose index entry must be present: never a read
/// of a hole (a full tmpfs faults on one), an error instead.
fn spanPresent(r: *const Replica, i: u64) Error![2]u64 {
    if (r.geo.fixed_size == 0 and !Cache.bitTest(r.ibits, r.indexBlock(i)))
        return diag.fail(error.Corrupt, "{s}: record {d}'s index entry is not in the cache", .{ r.key, i });
    return r.span(i);
}

fn indexBlock(r: *const Replica, i: u64) u64 {
    return (i * r.geo.entry_size) >> r.geo.index_shift;
}

pub fn isChecked(r: *const Replica, i: u64) bool {
    return @atomicLoad(u8, &r.checked[@intCast(i >> 3)], .monotonic) >> @intCast(i & 7) & 1 != 0;
}

fn markChecked(r: *Replica, records: []const u64) void {
    for (records) |i| _ = @atomicRmw(u8, &r.checked[@intCast(i >> 3)], .Or, @as(u8, 1) << @intCast(i & 7), .monotonic);
}

/// Whether the checked bits belong to the replica's eviction count (else
/// every record counts as unchecked: one checked before may be refetched).
fn checkedCurrent(r: *const Replica) bool {
    return @atomicLoad(u64, &r.head.evictions, .seq_cst) == @atomicLoad(u64, &r.checked_at, .seq_cst);
}

/// Whether any record of `records` (in the store) is unchecked.
fn anyUnchecked(r: *const Replica, records: []const u64) bool {
    const fresh = r.checkedCurrent();
    for (records) |i| {
        if (i < r.geo.record_count and (!fresh or !r.isChecked(i))) return true;
    }
    return false;
}

/// Stamps every region of `records` with `tick` (atime, and ptime for a
/// prefetch): a read's step 2. Records outside the store are skipped.
const Stamp = struct {
    r: *Replica,
    records: []const u64,
    pin: bool,

    fn stamp(s: Stamp, tick: u64) Error!void {
        const r = s.r;
        const region_shift: u6 = r.geo.data_shift + 6;
        for (s.records) |i| {
            if (i >= r.geo.record_count) continue;
            const sp = try r.spanPresent(i);
            if (sp[1] == sp[0]) continue; // (no bytes to keep)
            const first = sp[0] >> region_shift;
            const last = (sp[1] - 1) >> region_shift;
            assert(last < r.atime.len); // (spans are clamped to the data)
            var region = first;
            while (region <= last) : (region += 1) {
                Cache.raise(&r.atime[@intCast(region)], tick);
                if (s.pin) Cache.raise(&r.ptime[@intCast(region)], tick);
            }
        }
    }
};

/// Starts a read of `records` (cache.zig's steps 1 to 3): its tick (in
/// flight until `Cache.end`, or a kept prefetch with `pin`), then, after
/// any eviction that ran, the checked bits made current. Every table
/// entry of an unchecked record must be present.
fn startRead(r: *Replica, records: []const u64, pin: bool) Error!u64 {
    const c = r.cache;
    const s = try c.startRead(pin, Stamp{ .r = r, .records = records, .pin = pin }, Stamp.stamp);
    errdefer if (!pin) c.end(s.tick);
    if (s.odd) try c.waitEviction();
    const ev = @atomicLoad(u64, &r.head.evictions, .seq_cst);
    if (ev != @atomicLoad(u64, &r.checked_at, .seq_cst)) {
        @memset(r.checked, 0); // (a race with another thread's marks only costs a recheck)
        @atomicStore(u64, &r.checked_at, ev, .seq_cst);
    }
    return s.tick;
}

/// A warm read's start, all or nothing: when every record of `records` in
/// the store is checked and no eviction runs or ran since the checks, its
/// tick (a read in flight, or a kept prefetch with `pin`); otherwise null,
/// and no read in flight (a prefetch's stamps stay, harmless). It reads no
/// index entry of an unchecked record: that may be a hole.
pub fn beginWarm(r: *Replica, records: []const u64, pin: bool) Error!?u64 {
    if (r.anyUnchecked(records)) return null;
    const c = r.cache;
    const s = c.startRead(pin, Stamp{ .r = r, .records = records, .pin = pin }, Stamp.stamp) catch |e| switch (e) {
        error.Busy => return null,
        else => return e,
    };
    if (s.odd or r.anyUnchecked(records)) {
        if (!pin) c.end(s.tick);
        return null;
    }
    return s.tick;
}

/// Bytes records `records` take stored (a loader's prefetch budget): exact
/// for a fixed layout and for checked records, the mean record otherwise.
pub fn nbytes(r: *const Replica, records: []const u64) u64 {
    const g = r.geo;
    if (g.fixed_size != 0) return records.len * g.fixed_size;
    const mean = if (g.record_count != 0) g.data_size / g.record_count else 0;
    const fresh = r.checkedCurrent();
    var total: u64 = 0;
    for (records) |i| {
        if (i < g.record_count and fresh and r.isChecked(i)) {
            const sp = r.span(i);
            total += sp[1] - sp[0];
        } else total += mean;
    }
    return total;
}

/// Spans of `records` into `starts`/`ends`; each must be in the store and,
/// in a table layout, have its index block present.
pub fn spans(r: *const Replica, records: []const u64, starts: []u64, ends: []u64) Error!void {
    for (records, 0..) |i, k| {
        if (i >= r.geo.record_count)
            return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records", .{ i, r.geo.record_count });
        if (r.geo.fixed_size == 0 and !Cache.bitTest(r.ibits, r.indexBlock(i)))
            return diag.fail(error.InvalidArgument, "record {d}'s index entry is not in the cache", .{i});
        const sp = r.span(i);
        starts[k] = sp[0];
        ends[k] = sp[1];
    }
}

/// Bytes the replica's present blocks take on disk.
pub fn presentBytes(r: *const Replica) u64 {
    return Cache.footprint(r.dwords, r.geo.data_shift) + Cache.footprint(r.ibits, r.geo.index_shift);
}

/// A replica's geometry and counters (C: lx_replica_info_t).
pub const Info = extern struct {
    record_count: u64,
    data_size: u64,
    fixed_size: u64,
    index_size: u64,
    index_shift: u64,
    data_shift: u64,
    index_blocks: u64,
    data_blocks: u64,
    regions: u64,
    /// Bytes its present blocks take on disk; bytes of index not present.
    present_bytes: u64,
    index_missing: u64,
    /// Its eviction count, and the one this process's checked bits belong to.
    evictions: u64,
    checked_at: u64,
    /// This process's fetches: bytes (all; data), index requests.
    fetched: u64,
    fetched_data: u64,
    index_gets: u64,
    /// 1 while a whole-index fetch runs; 1 once one was found due.
    whole_running: u32,
    whole_started: u32,
};

pub fn info(r: *Replica) Info {
    const g = r.geo;
    return .{
        .record_count = g.record_count,
        .data_size = g.data_size,
        .fixed_size = g.fixed_size,
        .index_size = g.index_size,
        .index_shift = g.index_shift,
        .data_shift = g.data_shift,
        .index_blocks = g.index_blocks,
        .data_blocks = g.data_blocks,
        .regions = g.regions,
        .present_bytes = r.presentBytes(),
        .index_missing = r.indexMissingBytes(),
        .evictions = @atomicLoad(u64, &r.head.evictions, .seq_cst),
        .checked_at = @atomicLoad(u64, &r.checked_at, .seq_cst),
        .fetched = r.fetched.load(.monotonic),
        .fetched_data = r.fetched_data.load(.monotonic),
        .index_gets = r.index_gets.load(.monotonic),
        .whole_running = @intFromBool(r.whole_running.load(.monotonic) != 0),
        .whole_started = @intFromBool(r.whole_started.load(.monotonic)),
    };
}

pub fn indexMissingBytes(r: *const Replica) u64 {
    var present: u64 = 0;
    for (r.ibits) |*w| present += @popCount(@atomicLoad(u64, w, .monotonic));
    return (r.geo.index_blocks - present) << r.geo.index_shift;
}

// ---------------------------------------------------------------- eviction and sweeping

/// Whether a thread of this process reserved any block of [b0, b1) (r.mutex held).
fn reservedOverlap(r: *const Replica, f: File, b0: u64, b1: u64) bool {
    for (r.reserved[@backingInt(f)].items) |run| {
        if (run[0] < b1 and b0 < run[1]) return true;
    }
    return false;
}

/// Evicts data region `region` unless a fetch (of any process) holds part
/// of it (under the cache's lock, the sequence odd): its bits cleared, the
/// replica's eviction count moved, its bytes punched. Returns the bytes freed.
pub fn evictRegion(r: *Replica, region: u64) u64 {
    assert(region < r.dwords.len);
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    const b0 = region * Cache.region_blocks;
    if (r.reservedOverlap(.data, b0, b0 + Cache.region_blocks)) return 0;
    const fd = r.lockFd(.data);
    if (!(Cache.lockRange(fd, b0, Cache.region_blocks) catch false)) return 0;
    defer Cache.unlockRange(fd, b0, Cache.region_blocks);
    const freed = Cache.footprintWord(@atomicLoad(u64, &r.dwords[@intCast(region)], .monotonic), r.geo.data_shift);
    @atomicStore(u64, &r.dwords[@intCast(region)], 0, .release);
    _ = @atomicRmw(u64, &r.head.evictions, .Add, 1, .seq_cst);
    const lo = b0 << r.geo.data_shift;
    const hi = @min(r.geo.data_size, (b0 + Cache.region_blocks) << r.geo.data_shift);
    Cache.punch(r.fds[fd_data], lo, hi - lo, true);
    return freed;
}

/// Punches the bytes on disk of index and data that no block marks present
/// (what a process killed mid-fetch wrote, or an older loaderx after a
/// failed write), where no fetch holds them; found with SEEK_DATA, so it
/// costs what is on disk. Under the cache's lock.
pub fn sweep(r: *Replica) void {
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    for ([_]File{ .data, .index }) |f| {
        const sh = r.shift(f);
        const size = r.fileSize(f);
        var ext: Cache.Extents = .{ .fd = r.fileFd(f), .size = size };
        while (ext.next()) |x| {
            var b = x[0] >> sh;
            const last = (x[1] - 1) >> sh;
            while (b <= last) {
                if (Cache.bitTest(r.bits(f), b)) {
                    b += 1;
                    continue;
                }
                var e = b + 1;
                while (e <= last and !Cache.bitTest(r.bits(f), e)) e += 1;
                if (!r.reservedOverlap(f, b, e) and (Cache.lockRange(r.lockFd(f), b, e - b) catch false)) {
                    Cache.punch(r.fileFd(f), b << sh, @min(e << sh, size) - (b << sh), false);
                    Cache.unlockRange(r.lockFd(f), b, e - b);
                }
                b = e;
            }
        }
    }
}

/// Forgets records `records` (they failed their check): their data blocks,
/// and their index blocks unless the version is pinned by the index, become
/// missing; every process checks its records again (under the lock).
fn drop(r: *Replica, records: []const u64) Error!void {
    const c = r.cache;
    try c.lock();
    defer c.unlock();
    // Every record's data blocks before any index block: a record's entry
    // may share a block with another's.
    for (records) |i| {
        const sp: [2]u64 = r.spanPresent(i) catch .{ 0, 0 }; // (no entry: no data blocks known)
        if (sp[1] > sp[0]) Cache.bitsClear(r.dwords, sp[0] >> r.geo.data_shift, ((sp[1] - 1) >> r.geo.data_shift) + 1);
    }
    if (!r.weak) {
        for (records) |i| Cache.bitsClear(r.ibits, r.indexBlock(i), r.indexBlock(i) + 1);
    }
    _ = @atomicRmw(u64, &r.head.evictions, .Add, 1, .seq_cst);
}

// ---------------------------------------------------------------- fetch plans

/// One file's requests of a fetch step (C: lx_requests_t): request k is
/// bytes [starts[k], ends[k]) of the object; of its bytes, only the keeps
/// whose `keep_request` is k are written (at their own offsets: the rest
/// is on disk already, or another fetcher's).
pub const Requests = extern struct {
    count: u64,
    starts: ?[*]const u64,
    ends: ?[*]const u64,
    keep_count: u64,
    keep_request: ?[*]const u64,
    keep_lo: ?[*]const u64,
    keep_hi: ?[*]const u64,
};

/// A fetch through the cache (C: lx_fetch_t), which lx_replica_begin fills
/// and lx_fetch_landed / lx_fetch_failed move on.
pub const Fetch = extern struct {
    /// The read's tick, for lx_replica_end (0: none, a prefetch's or a
    /// whole-index fetch).
    tick: u64,
    /// `Status`: what the caller does next.
    status: u32,
    /// `Cache.Warn` bits and `index_due`, gathered over the fetch.
    flags: u32,
    /// For status `ranges`: this step's requests of the index [0] and the
    /// data [1]; valid until the next call on this fetch.
    files: [2]Requests,
    /// After a corrupt result: the first record whose server bytes fail.
    bad_record: u64,
    /// The library's state while status is `ranges` (null otherwise).
    plan: ?*anyopaque,
};

pub const Status = struct {
    /// Every record present and checked: read them, then end the read.
    pub const done: u32 = 0;
    /// Fetch `files`' ranges into the replica's files, then lx_fetch_landed.
    pub const ranges: u32 = 1;
    /// A warm-only start found records to fetch: nothing started.
    pub const miss: u32 = 2;
};

/// lx_replica_begin's flags.
pub const Begin = struct {
    /// A prefetch: kept from eviction for the process's next pin_calls
    /// prefetches instead of until the read ends.
    pub const pin: u32 = 1;
    /// Start only when every record is present and checked (status miss
    /// otherwise, nothing started).
    pub const warm_only: u32 = 2;
    /// No read: fetch the rest of the index whole, in rounds.
    pub const whole_index: u32 = 4;
};

/// Fetch.flags: the read found the rest of the index due (start a
/// whole-index fetch in the background; once per process and replica).
pub const index_due: u32 = 4;
/// Fetch.flags: `bad_record` names a record whose server bytes failed its
/// check twice (with the corrupt result).
pub const bad_record_flag: u32 = 8;

const Run = struct { b0: u64, b1: u64, locked: bool };

/// One file's part of a step.
const Step = struct {
    /// The block runs asked for (kept: a retry after a full disk plans again).
    want: std.ArrayList([2]u64) = .empty,
    /// Runs this fetch reserved (locked: holds their fetch locks; not, once
    /// a wait for another fetcher's ran out).
    held: std.ArrayList(Run) = .empty,
    /// Missing runs, to mark present when landed.
    todo: std.ArrayList([2]u64) = .empty,
    /// Runs another fetcher holds: waited for after this step.
    theirs: std.ArrayList([2]u64) = .empty,
    starts: std.ArrayList(u64) = .empty,
    ends: std.ArrayList(u64) = .empty,
    keep_request: std.ArrayList(u64) = .empty,
    keep_lo: std.ArrayList(u64) = .empty,
    keep_hi: std.ArrayList(u64) = .empty,
    request_max: u64 = 0,

    fn deinit(s: *Step, gpa: std.mem.Allocator) void {
        inline for (.{ &s.want, &s.held, &s.todo, &s.theirs, &s.starts, &s.ends, &s.keep_request, &s.keep_lo, &s.keep_hi }) |l| l.deinit(gpa);
    }

    fn bytes(s: *const Step) u64 {
        var total: u64 = 0;
        for (s.starts.items, s.ends.items) |a, b| total += b - a;
        return total;
    }
};

const Stage = enum { index_first, read, refetch_index, refetch_data, whole_index };

const Plan = struct {
    r: *Replica,
    stage: Stage,
    pin: bool,
    tick: u64 = 0,
    /// The read's records (a table layout starts the read after their entries).
    records: []u64 = &.{},
    /// The records being fetched and checked; then those that failed.
    todo: std.ArrayList(u64) = .empty,
    bad: std.ArrayList(u64) = .empty,
    steps: [2]Step = .{ .{}, .{} },
    /// A full disk made room once for this fetch.
    retried: bool = false,
    /// The next index block a whole-index round looks at.
    cursor: u64 = 0,
    flags: u32 = 0,

    fn destroy(p: *Plan) void {
        const gpa = p.r.cache.gpa;
        p.release();
        if (p.stage == .whole_index) _ = p.r.whole_running.fetchSub(1, .monotonic);
        for (&p.steps) |*s| s.deinit(gpa);
        p.todo.deinit(gpa);
        p.bad.deinit(gpa);
        gpa.free(p.records);
        gpa.destroy(p);
    }

    /// Releases every reservation of the current step.
    fn release(p: *Plan) void {
        p.releaseFile(.index);
        p.releaseFile(.data);
    }

    /// Releases the reservations of the current step's file `f`.
    fn releaseFile(p: *Plan, f: File) void {
        const r = p.r;
        const io = pool.io();
        r.mutex.lockUncancelable(io);
        defer r.mutex.unlock(io);
        const k = @backingInt(f);
        const s = &p.steps[k];
        for (s.held.items) |run| {
            if (!run.locked) continue;
            Cache.unlockRange(r.lockFd(f), run.b0, run.b1 - run.b0);
            const list = &r.reserved[k];
            for (list.items, 0..) |x, j| {
                if (x[0] == run.b0 and x[1] == run.b1) {
                    _ = list.swapRemove(j);
                    break;
                }
            }
        }
        s.held.clearRetainingCapacity();
    }

    fn clearStep(p: *Plan) void {
        for (&p.steps) |*s| {
            inline for (.{ &s.want, &s.todo, &s.starts, &s.ends, &s.keep_request, &s.keep_lo, &s.keep_hi }) |l| l.clearRetainingCapacity();
        }
    }

    fn hasRequests(p: *const Plan) bool {
        return p.steps[0].starts.items.len != 0 or p.steps[1].starts.items.len != 0;
    }
};

/// Starts a read of `records` through the replica (lx_replica_begin): see
/// `Begin` for `flags`, `Fetch` for what `f` says next.
pub fn begin(r: *Replica, records: []const u64, flags: u32, f: *Fetch) Error!void {
    f.* = std.mem.zeroes(Fetch);
    const pin = flags & Begin.pin != 0;
    if (flags & Begin.whole_index != 0) return r.beginWholeIndex(f);
    if (flags & Begin.warm_only != 0) {
        const tick = try r.beginWarm(records, pin);
        f.status = if (tick == null) Status.miss else Status.done;
        f.tick = if (pin) 0 else tick orelse 0;
        return;
    }
    const table = r.geo.fixed_size == 0;
    if (!r.anyUnchecked(records)) {
        const tick = try r.startRead(records, pin);
        if (!r.anyUnchecked(records)) {
            f.tick = if (pin) 0 else tick;
            return;
        }
        if (!pin) r.cache.end(tick); // an eviction since: the full start
    }
    const p = try r.newPlan(if (table) .index_first else .read, pin, records);
    errdefer p.destroy();
    if (table) {
        try r.planIndex(p, p.records, true);
    } else {
        try r.startReadStage(p, f);
    }
    try r.advance(p, f);
}

fn newPlan(r: *Replica, stage: Stage, pin: bool, records: []const u64) Error!*Plan {
    const gpa = r.cache.gpa;
    const p = gpa.create(Plan) catch return error.OutOfMemory;
    p.* = .{ .r = r, .stage = stage, .pin = pin };
    p.records = gpa.dupe(u64, records) catch {
        gpa.destroy(p);
        return error.OutOfMemory;
    };
    return p;
}

fn beginWholeIndex(r: *Replica, f: *Fetch) Error!void {
    try r.cache.enterProcess();
    const p = try r.newPlan(.whole_index, false, &.{});
    _ = r.whole_running.fetchAdd(1, .monotonic);
    errdefer p.destroy();
    try r.planWholeRound(p);
    try r.advance(p, f);
}

/// The read's start (the tick, the stamps) and its unchecked records'
/// data, with a fixed layout's checksums: the `read` stage's step.
fn startReadStage(r: *Replica, p: *Plan, f: *Fetch) Error!void {
    p.stage = .read;
    const tick = try r.startRead(p.records, p.pin);
    p.tick = tick;
    f.tick = if (p.pin) 0 else tick;
    const fresh = r.checkedCurrent();
    p.todo.clearRetainingCapacity();
    for (p.records) |i| {
        if (i < r.geo.record_count and (!fresh or !r.isChecked(i))) p.todo.append(r.cache.gpa, i) catch return error.OutOfMemory;
    }
    std.sort.pdq(u64, p.todo.items, {}, std.sort.asc(u64));
    p.todo.items.len = uniqueSorted(p.todo.items);
    if (r.geo.fixed_size != 0) try r.planIndex(p, p.todo.items, false);
    try r.planData(p, p.todo.items);
}

/// Moves the plan on until it has ranges to fetch or is done: the read
/// started after its entries, the check after its data, the refetch of
/// what failed, the next whole-index round.
fn advance(r: *Replica, p: *Plan, f: *Fetch) Error!void {
    while (!p.hasRequests()) {
        // Nothing to fetch: hold nothing (what was reserved is present).
        p.release();
        // Blocks another fetcher held: waited for (holding none), then
        // fetched here if they are still missing.
        if (try r.takeTheirs(p)) continue;
        switch (p.stage) {
            .index_first => try r.startReadStage(p, f),
            .read => {
                try r.check(p, p.todo.items);
                if (p.bad.items.len == 0) break;
                try r.drop(p.bad.items);
                p.stage = if (r.geo.fixed_size == 0) .refetch_index else .refetch_data;
                if (!r.weak) try r.planIndex(p, p.bad.items, false);
                if (p.stage == .refetch_data) try r.planData(p, p.bad.items);
            },
            .refetch_index => {
                p.stage = .refetch_data;
                try r.planData(p, p.bad.items);
            },
            .refetch_data => {
                const again = try r.gpaDupe(p.bad.items);
                defer r.cache.gpa.free(again);
                try r.check(p, again);
                if (p.bad.items.len == 0) break;
                try r.drop(p.bad.items);
                f.bad_record = p.bad.items[0];
                f.flags |= bad_record_flag;
                return diag.fail(error.Corrupt, "record {d} fails its checksum as the server holds it", .{p.bad.items[0]});
            },
            .whole_index => {
                try r.planWholeRound(p);
                if (!p.hasRequests()) break;
            },
        }
    }
    if (p.hasRequests()) {
        f.status = Status.ranges;
        f.plan = p;
        f.flags |= p.flags;
        for (&f.files, &p.steps) |*out, *s| out.* = .{
            .count = s.starts.items.len,
            .starts = s.starts.items.ptr,
            .ends = s.ends.items.ptr,
            .keep_count = s.keep_lo.items.len,
            .keep_request = s.keep_request.items.ptr,
            .keep_lo = s.keep_lo.items.ptr,
            .keep_hi = s.keep_hi.items.ptr,
        };
        return;
    }
    f.flags |= p.flags;
    if (p.stage != .whole_index and r.indexDue()) f.flags |= index_due;
    f.status = Status.done;
    f.plan = null;
    f.files = std.mem.zeroes([2]Requests);
    p.destroy();
}

fn gpaDupe(r: *Replica, items: []const u64) Error![]u64 {
    return r.cache.gpa.dupe(u64, items) catch error.OutOfMemory;
}

/// Checks records `records` against the store's checksums (its own handle
/// of the replica): those that pass are marked checked, those that fail
/// are `p.bad`.
fn check(r: *Replica, p: *Plan, records: []const u64) Error!void {
    const gpa = r.cache.gpa;
    p.bad.clearRetainingCapacity();
    if (records.len == 0) return;
    const s = r.store orelse return diag.fail(error.InvalidArgument, "replica {s} has no store to check records with", .{r.key});
    const positions = gpa.alloc(u64, records.len) catch return error.OutOfMemory;
    defer gpa.free(positions);
    try s.enter();
    defer s.leave();
    const n = try s.verifyRecords(records, positions);
    var k: usize = 0;
    for (records, 0..) |i, j| {
        if (k < n and positions[k] == j) {
            p.bad.append(gpa, i) catch return error.OutOfMemory;
            k += 1;
        } else markChecked(r, &.{i});
    }
    assert(k == n);
}

/// The step's index blocks of `records` (sorted or not), or the whole
/// missing index where that is cheaper (`wholeIndexWorth`), in requests of
/// `whole_index_chunk` bytes.
fn planIndex(r: *Replica, p: *Plan, records: []const u64, unchecked_only: bool) Error!void {
    const gpa = r.cache.gpa;
    var blocks: std.ArrayList(u64) = .empty;
    defer blocks.deinit(gpa);
    const fresh = r.checkedCurrent();
    for (records) |i| {
        if (i >= r.geo.record_count) continue;
        if (unchecked_only and fresh and r.isChecked(i)) continue;
        blocks.append(gpa, r.indexBlock(i)) catch return error.OutOfMemory;
    }
    std.sort.pdq(u64, blocks.items, {}, std.sort.asc(u64));
    blocks.items.len = uniqueSorted(blocks.items);
    const s = &p.steps[0];
    s.request_max = r.cache.policy.whole_index_chunk;
    if (r.wholeIndexWorth(blocks.items)) {
        if (r.geo.index_blocks != 0) s.want.append(gpa, .{ 0, r.geo.index_blocks }) catch return error.OutOfMemory;
    } else {
        try appendRuns(gpa, &s.want, blocks.items);
    }
    try r.prepare(p, .index, false);
}

/// The step's data blocks of `records`.
fn planData(r: *Replica, p: *Plan, records: []const u64) Error!void {
    const gpa = r.cache.gpa;
    const sh = r.geo.data_shift;
    var ranges: std.ArrayList([2]u64) = .empty;
    defer ranges.deinit(gpa);
    for (records) |i| {
        const sp = try r.spanPresent(i);
        if (sp[1] > sp[0]) ranges.append(gpa, .{ sp[0] >> sh, ((sp[1] - 1) >> sh) + 1 }) catch return error.OutOfMemory;
    }
    std.sort.pdq([2]u64, ranges.items, {}, struct {
        fn less(_: void, a: [2]u64, b: [2]u64) bool {
            return a[0] < b[0];
        }
    }.less);
    const s = &p.steps[1];
    s.request_max = r.cache.policy.request_max;
    for (ranges.items) |x| {
        if (s.want.items.len != 0 and x[0] <= s.want.items[s.want.items.len - 1][1]) {
            const last = &s.want.items[s.want.items.len - 1];
            last[1] = @max(last[1], x[1]);
        } else s.want.append(gpa, x) catch return error.OutOfMemory;
    }
    try r.prepare(p, .data, false);
}

/// The next round of a whole-index fetch: up to `index_with_batch_max`
/// bytes of missing index blocks from the cursor on.
fn planWholeRound(r: *Replica, p: *Plan) Error!void {
    const gpa = r.cache.gpa;
    const pol = r.cache.policy;
    const step = @max(1, pol.index_with_batch_max >> r.geo.index_shift);
    var blocks: std.ArrayList(u64) = .empty;
    defer blocks.deinit(gpa);
    var b = p.cursor;
    while (b < r.geo.index_blocks and blocks.items.len < step) : (b += 1) {
        if (!Cache.bitTest(r.ibits, b)) blocks.append(gpa, b) catch return error.OutOfMemory;
    }
    p.cursor = b;
    const s = &p.steps[0];
    s.request_max = pol.whole_index_chunk;
    try appendRuns(gpa, &s.want, blocks.items);
    try r.prepare(p, .index, false);
}

/// Whether to fetch the whole missing index instead of `blocks` (sorted,
/// unique): when it costs less than these blocks' requests and the
/// earlier ones at `index_request_bytes` a request, is at most
/// `index_with_batch_max` and fits the cache's share. Counts the requests
/// otherwise.
fn wholeIndexWorth(r: *Replica, blocks: []const u64) bool {
    const pol = r.cache.policy;
    var missing: u64 = 0;
    var gets: u64 = 0;
    var last: ?u64 = null;
    const gap_blocks = 1 + (pol.max_gap >> r.geo.index_shift);
    for (blocks) |b| {
        if (Cache.bitTest(r.ibits, b)) continue;
        if (last == null or b - last.? > gap_blocks) gets += 1;
        last = b;
        missing += 1;
    }
    if (missing == 0 or r.whole_running.load(.monotonic) != 0) return false;
    const worth = @min((r.index_gets.load(.monotonic) + gets) *| pol.index_request_bytes, pol.index_with_batch_max);
    if (r.indexMissingBytes() > worth or !r.indexFits()) {
        _ = r.index_gets.fetchAdd(gets, .monotonic);
        return false;
    }
    return true;
}

/// Whether the whole index is at most its share of the cache's limit.
fn indexFits(r: *Replica) bool {
    const c = r.cache;
    const limit = c.effectiveLimit(@atomicLoad(u64, &c.head.used, .monotonic));
    return r.geo.index_size *| c.policy.whole_index_share <= limit;
}

/// Whether to fetch the rest of the index now, whole, in the background:
/// once per process, once this process's data fetches reached
/// `whole_index_after` times the missing index or its index requests are
/// worth it, and only when it fits the cache's share.
fn indexDue(r: *Replica) bool {
    if (r.whole_started.load(.monotonic) or r.geo.index_blocks == 0) return false;
    const pol = r.cache.policy;
    const rented = r.index_gets.load(.monotonic) *| pol.index_request_bytes;
    const data = r.fetched_data.load(.monotonic);
    const half = r.geo.index_size / 2;
    if (data < pol.whole_index_after *| half and rented < half) return false;
    const missing = r.indexMissingBytes();
    if (missing == 0 or (data < pol.whole_index_after *| missing and rented < missing)) return false;
    if (!r.indexFits()) return false;
    return !r.whole_started.swap(true, .monotonic);
}

/// Reserves the missing blocks of step `f`'s wanted runs and plans their
/// requests (runs another fetcher holds go to `theirs`, or, with `wait`,
/// are waited for); allocates their bytes first where that is needed. A
/// full disk makes room and plans once more; then NoSpace.
fn prepare(r: *Replica, p: *Plan, f: File, wait: bool) Error!void {
    const s = &p.steps[@backingInt(f)];
    r.reserveStep(p, f, wait) catch |e| {
        p.releaseFile(f);
        return e;
    };
    try r.buildRequests(s, f);
    const need = r.preallocate(s, f) orelse {
        s.want.clearRetainingCapacity();
        return;
    };
    p.releaseFile(f);
    if (p.retried) return r.noSpace(need, f, .NOSPC);
    p.retried = true;
    try r.cache.makeRoom(need);
    inline for (.{ &s.todo, &s.theirs, &s.starts, &s.ends, &s.keep_request, &s.keep_lo, &s.keep_hi }) |l|
        l.clearRetainingCapacity();
    return r.prepare(p, f, wait);
}

fn reserveStep(r: *Replica, p: *Plan, f: File, wait: bool) Error!void {
    const gpa = r.cache.gpa;
    const s = &p.steps[@backingInt(f)];
    const words = r.bits(f);
    for (s.want.items) |w| {
        var b = w[0];
        while (b < w[1]) {
            if (Cache.bitTest(words, b)) {
                b += 1;
                continue;
            }
            var e = b + 1;
            while (e < w[1] and !Cache.bitTest(words, e)) e += 1;
            const got = if (wait) try r.waitReserve(f, b, e) else try r.tryReserve(f, b, e);
            if (got) |locked| {
                s.held.append(gpa, .{ .b0 = b, .b1 = e, .locked = locked }) catch {
                    if (locked) r.unreserve(f, b, e);
                    return error.OutOfMemory;
                };
                // Present meanwhile (another fetcher finished): not fetched again.
                var k = b;
                while (k < e) {
                    if (Cache.bitTest(words, k)) {
                        k += 1;
                        continue;
                    }
                    var j = k + 1;
                    while (j < e and !Cache.bitTest(words, j)) j += 1;
                    s.todo.append(gpa, .{ k, j }) catch return error.OutOfMemory;
                    k = j;
                }
            } else s.theirs.append(gpa, .{ b, e }) catch return error.OutOfMemory;
            b = e;
        }
    }
}

/// Reserves blocks [b0, b1) of `f` for this thread: true (locked) when no
/// thread of this process and no other process holds any of them, else null.
fn tryReserve(r: *Replica, f: File, b0: u64, b1: u64) Error!?bool {
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    if (r.reservedOverlap(f, b0, b1)) return null;
    r.reserved[@backingInt(f)].ensureUnusedCapacity(r.cache.gpa, 1) catch return error.OutOfMemory;
    if (!try Cache.lockRange(r.lockFd(f), b0, b1 - b0)) return null;
    r.reserved[@backingInt(f)].appendAssumeCapacity(.{ b0, b1 });
    return true;
}

fn unreserve(r: *Replica, f: File, b0: u64, b1: u64) void {
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    Cache.unlockRange(r.lockFd(f), b0, b1 - b0);
    const list = &r.reserved[@backingInt(f)];
    for (list.items, 0..) |x, j| {
        if (x[0] == b0 and x[1] == b1) {
            _ = list.swapRemove(j);
            return;
        }
    }
}

/// Waits (polling, with backoff) until blocks [b0, b1) can be reserved;
/// after `fetch_wait_ms` (a stuck fetcher) takes them unreserved (false):
/// the same bytes, fetched again.
fn waitReserve(r: *Replica, f: File, b0: u64, b1: u64) Error!?bool {
    const deadline_ms = r.cache.policy.fetch_wait_ms;
    var waited_ms: u64 = 0;
    var delay_ms: u64 = 1;
    while (true) {
        if (try r.tryReserve(f, b0, b1)) |locked| return locked;
        if (waited_ms >= deadline_ms) return false;
        sleepMs(delay_ms);
        waited_ms += delay_ms;
        delay_ms = @min(50, delay_ms * 2);
    }
}

fn sleepMs(ms: u64) void {
    const ts: std.c.timespec = .{ .sec = @intCast(ms / 1000), .nsec = @intCast((ms % 1000) * 1_000_000) };
    _ = std.c.nanosleep(&ts, null);
}

/// The step's requests: missing runs closer than `max_gap` merged into one
/// request of at most `request_max` bytes (the gap read and dropped),
/// longer runs split.
fn buildRequests(r: *Replica, s: *Step, f: File) Error!void {
    const gpa = r.cache.gpa;
    const sh = r.shift(f);
    const size = r.fileSize(f);
    const gap = r.cache.policy.max_gap;
    const max = s.request_max;
    assert(max >= 512);
    for (s.todo.items) |run| {
        var lo = run[0] << sh;
        const hi = @min(run[1] << sh, size);
        assert(lo < hi);
        const n = s.starts.items.len;
        if (n != 0 and lo - s.ends.items[n - 1] <= gap and hi - s.starts.items[n - 1] <= max) {
            s.ends.items[n - 1] = hi;
            try appendKeep(gpa, s, n - 1, lo, hi);
            continue;
        }
        while (hi - lo > max) : (lo += max) {
            try appendRequest(gpa, s, lo, lo + max);
        }
        try appendRequest(gpa, s, lo, hi);
    }
}

fn appendRequest(gpa: std.mem.Allocator, s: *Step, lo: u64, hi: u64) Error!void {
    s.starts.append(gpa, lo) catch return error.OutOfMemory;
    s.ends.append(gpa, hi) catch return error.OutOfMemory;
    try appendKeep(gpa, s, s.starts.items.len - 1, lo, hi);
}

fn appendKeep(gpa: std.mem.Allocator, s: *Step, request: u64, lo: u64, hi: u64) Error!void {
    s.keep_request.append(gpa, request) catch return error.OutOfMemory;
    s.keep_lo.append(gpa, lo) catch return error.OutOfMemory;
    s.keep_hi.append(gpa, hi) catch return error.OutOfMemory;
}

/// Allocates the keeps' bytes where the file system needs it (a mapped
/// hole of a full tmpfs faults); a full one punches what it allocated and
/// returns the bytes the step needs (null: done).
fn preallocate(r: *Replica, s: *Step, f: File) ?u64 {
    if (!r.cache.preallocate) return null;
    const fd = r.fileFd(f);
    for (s.keep_lo.items, s.keep_hi.items, 0..) |lo, hi, k| {
        switch (Cache.allocate(fd, lo, hi - lo)) {
            .SUCCESS => {},
            .NOSPC, .DQUOT => {
                for (s.keep_lo.items[0 .. k + 1], s.keep_hi.items[0 .. k + 1]) |a, b| Cache.punch(fd, a, b - a, false);
                var need: u64 = 0;
                for (s.keep_lo.items, s.keep_hi.items) |a, b| need += b - a;
                return need;
            },
            else => {}, // (a write that fails names it)
        }
    }
    return null;
}

/// The NoSpace error of a fetch of `need` bytes of `f` that found the
/// cache's file system full.
fn noSpace(r: *Replica, need: u64, f: File, e: std.posix.E) Error {
    const c = r.cache;
    const free: i64 = if (Cache.freeSpace(c.root.handle)) |sp| @intCast(sp.free) else -1;
    var lb: [64]u8 = undefined;
    const limit = if (c.policy.limit != 0)
        std.fmt.bufPrint(&lb, "cache_limit {d} bytes", .{c.policy.limit}) catch unreachable
    else
        "no cache_limit";
    return diag.fail(error.NoSpace, "{s}: the cache's file system is full ({s}): {d} bytes of a " ++
        "replica's {s} do not fit in {d} bytes free ({s}; the cache holds {d} bytes, and what is " ++
        "being read is never evicted); free space, set a cache_limit below the file system's " ++
        "size, or read smaller batches", .{
        c.root_path, Cache.errnoText(e), need, @tagName(f), free, limit, @atomicLoad(u64, &c.head.used, .monotonic),
    });
}

/// This step's ranges landed in the files (lx_fetch_landed): their blocks
/// are marked present (under the lock, counted against the limit, which
/// may evict), released, and the plan moves on: blocks another fetcher
/// held are waited for, then the next stage.
pub fn landed(f: *Fetch) Error!void {
    const p: *Plan = @ptrCast(@alignCast(f.plan orelse return diag.fail(error.InvalidArgument, "the fetch has no step to land", .{})));
    const r = p.r;
    f.plan = null;
    errdefer p.destroy();
    try r.mark(p);
    p.release();
    for (&p.steps, 0..) |*s, k| {
        const got = s.bytes();
        _ = r.fetched.fetchAdd(got, .monotonic);
        if (k == 1) _ = r.fetched_data.fetchAdd(got, .monotonic);
    }
    p.clearStep();
    try r.advance(p, f);
}

/// Waits for the runs another fetcher held in this step and plans what is
/// still missing of them; false when there were none.
fn takeTheirs(r: *Replica, p: *Plan) Error!bool {
    var any = false;
    for (&p.steps, 0..) |*s, k| {
        if (s.theirs.items.len == 0) continue;
        any = true;
        s.want.appendSlice(r.cache.gpa, s.theirs.items) catch return error.OutOfMemory;
        s.theirs.clearRetainingCapacity();
        try r.prepare(p, @fromBackingInt(@intCast(k)), true);
    }
    return any;
}

/// Marks the step's fetched blocks present (under the cache's lock) and
/// counts them; data may evict (Warn bits into the plan's flags).
fn mark(r: *Replica, p: *Plan) Error!void {
    const c = r.cache;
    try c.lock();
    defer c.unlock();
    var added: u64 = 0;
    for (&p.steps, 0..) |*s, k| {
        const f: File = @fromBackingInt(@intCast(k));
        const words = r.bits(f);
        const sh = r.shift(f);
        for (s.todo.items) |run| {
            const w0: usize = @intCast(run[0] >> 6);
            const w1: usize = @intCast(((run[1] - 1) >> 6) + 1);
            const before = Cache.footprint(words[w0..w1], sh);
            Cache.bitsSet(words, run[0], run[1]);
            added += Cache.footprint(words[w0..w1], sh) - before;
        }
    }
    _ = @atomicRmw(u64, &c.head.used, .Add, added, .monotonic);
    if (p.steps[1].todo.items.len != 0) p.flags |= try c.maybeEvict();
}

/// This step's fetch failed (lx_fetch_failed): every range it was to write
/// is punched (nothing of it is marked, so nothing else would ever free
/// it) and its reservations released. A full disk (`err` ENOSPC or
/// EDQUOT) makes room and plans the step again, once (status ranges);
/// then it is a NoSpace error. Anything else ends the fetch (status done,
/// for the caller's own error).
pub fn failed(f: *Fetch, err: c_int) Error!void {
    const p: *Plan = @ptrCast(@alignCast(f.plan orelse return));
    const r = p.r;
    f.plan = null;
    f.status = Status.done;
    errdefer p.destroy();
    var need: u64 = 0;
    for (&p.steps, 0..) |*s, k| {
        const fd = r.fileFd(@fromBackingInt(@intCast(k)));
        for (s.keep_lo.items, s.keep_hi.items) |lo, hi| {
            Cache.punch(fd, lo, hi - lo, false);
            need += hi - lo;
        }
    }
    p.release();
    const e: std.posix.E = if (err > 0) @fromBackingInt(@intCast(@as(u16, @intCast(err)))) else .SUCCESS;
    const full = e == .NOSPC or e == .DQUOT;
    if (!full) {
        p.destroy();
        return;
    }
    const which: File = if (p.steps[1].keep_lo.items.len != 0) .data else .index;
    if (p.retried) return r.noSpace(need, which, e);
    p.retried = true;
    try r.cache.makeRoom(need);
    for (&p.steps, 0..) |*s, k| {
        for (s.todo.items) |run| s.want.append(r.cache.gpa, run) catch return error.OutOfMemory;
        s.todo.clearRetainingCapacity();
        inline for (.{ &s.starts, &s.ends, &s.keep_request, &s.keep_lo, &s.keep_hi }) |l| l.clearRetainingCapacity();
        if (s.want.items.len != 0) try r.prepare(p, @fromBackingInt(@intCast(k)), false);
    }
    try r.advance(p, f);
}

// ---------------------------------------------------------------- helpers

fn uniqueSorted(items: []u64) usize {
    if (items.len == 0) return 0;
    var n: usize = 1;
    for (items[1..]) |x| {
        if (x != items[n - 1]) {
            items[n] = x;
            n += 1;
        }
    }
    return n;
}

/// Appends sorted unique `blocks` to `out` as runs [first, end).
fn appendRuns(gpa: std.mem.Allocator, out: *std.ArrayList([2]u64), blocks: []const u64) Error!void {
    var k: usize = 0;
    while (k < blocks.len) {
        var j = k + 1;
        while (j < blocks.len and blocks[j] == blocks[j - 1] + 1) j += 1;
        out.append(gpa, .{ blocks[k], blocks[j - 1] + 1 }) catch return error.OutOfMemory;
        k = j;
    }
}
