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
const Cache = @import("Cache.zig");
const layout = @import("cache_format.zig");
const files = @import("cache_os.zig");

const Error = Cache.Error;

/// The largest store the cache replicates: 2^36 records (a process keeps a
/// bit per record) and 2^51 bytes of data (2^27 blocks of 16 MiB).
pub const records_max: u64 = 1 << 36;
pub const data_max: u64 = 1 << 51;

/// `canary_value` while the replica is open (the ABI checks it).
canary: u64 = canary_value,
cache: *Cache,
key: [:0]u8 = undefined,
/// The replica's directory (stores/<key>).
dir: c_int,
geo: layout.Geometry = undefined,
/// `cache.state`'s identity: the directory may hold a newer replica since.
state_dev: u64 = 0,
state_ino: u64 = 0,
/// `cache.state`, mapped: its head, bitmaps and region ticks.
map: []align(std.heap.page_size_min) u8 = &.{},
head: *layout.ReplicaHead = undefined,
ibits: []u64 = &.{},
dwords: []u64 = &.{},
atime: []u64 = &.{},
ptime: []u64 = &.{},
/// index, data, index.fetch, data.fetch: opened once and kept (closing any
/// descriptor of a fetch file drops this process's locks on it).
fds: [4]c_int = .{ -1, -1, -1, -1 },
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

pub fn fileFd(r: *const Replica, f: File) c_int {
    return r.fds[@backingInt(f)];
}

pub fn lockFd(r: *const Replica, f: File) c_int {
    return r.fds[fd_lock + @as(usize, @backingInt(f))];
}

pub fn shift(r: *const Replica, f: File) u6 {
    return if (f == .index) r.geo.index_shift else r.geo.data_shift;
}

pub fn fileSize(r: *const Replica, f: File) u64 {
    return if (f == .index) r.geo.index_size else r.geo.data_size;
}

pub fn bits(r: *const Replica, f: File) []u64 {
    return if (f == .index) r.ibits else r.dwords;
}

pub fn blockCount(r: *const Replica, f: File) u64 {
    return if (f == .index) r.geo.index_blocks else r.geo.data_blocks;
}

// ---------------------------------------------------------------- opening

/// How `lookup` opens a replica: `weak` (when given) sets its pinning by
/// the index; `store` opens its store (to check records with) too.
pub const Want = struct { weak: ?bool = null, store: bool = false };

/// The open replica `key` of cache `c` (a current one; made anew when the
/// directory holds another since), opening it when this process has not.
pub fn lookup(c: *Cache, key: []const u8, want: Want) Error!*Replica {
    const io = pool.io();
    c.table_mutex.lockUncancelable(io);
    defer c.table_mutex.unlock(io);
    const r = for (c.replicas.items) |r| {
        if (r.retired or !std.mem.eql(u8, r.key, key)) continue;
        if (r.isCurrent()) break r;
        r.retired = true;
    } else blk: {
        c.replicas.ensureUnusedCapacity(c.gpa, 1) catch return error.OutOfMemory;
        const r = try openReplica(c, key);
        c.replicas.appendAssumeCapacity(r);
        break :blk r;
    };
    if (want.weak) |w| r.weak = w;
    if (want.store and r.store == null) {
        var buf: [std.fs.max_path_bytes]u8 = undefined;
        const path = std.fmt.bufPrint(&buf, "{s}/stores/{s}", .{ c.root_path, key }) catch
            return diag.fail(error.InvalidArgument, "cache path too long", .{});
        r.store = try Store.open(c.gpa, path, .{});
    }
    assert(!r.retired);
    return r;
}

fn isCurrent(r: *Replica) bool {
    const st = files.statAt(r.dir, "cache.state", r.key) catch return false;
    return st.dev == r.state_dev and st.ino == r.state_ino;
}

fn openReplica(c: *Cache, key: []const u8) Error!*Replica {
    var path: [320]u8 = undefined;
    const sub = files.nameZ(&path, "stores/{s}", .{key}) orelse
        return diag.fail(error.InvalidArgument, "replica key too long", .{});
    const dir = files.openAt(c.root.handle, sub, files.directory, 0);
    if (dir < 0) return files.errnoFail(error.NotFound, "{s}/{s}", .{ c.root_path, sub });
    errdefer _ = std.c.close(dir);
    const r = c.gpa.create(Replica) catch return error.OutOfMemory;
    errdefer c.gpa.destroy(r);
    r.* = .{ .cache = c, .dir = dir };
    r.key = c.gpa.dupeSentinel(u8, key, 0) catch return error.OutOfMemory;
    errdefer r.destroyParts();
    try r.mapState();
    const names = [4][:0]const u8{ "index", "data", "index.fetch", "data.fetch" };
    for (names, 0..) |name, i| {
        r.fds[i] = files.openAt(dir, name, files.read_write, 0);
        if (r.fds[i] < 0)
            return files.errnoFail(error.NotFound, "{s}/{s}/{s}", .{ c.root_path, sub, name });
    }
    try r.mapEntries();
    try r.mapChecked();
    return r;
}

fn mapState(r: *Replica) Error!void {
    const fd = files.openAt(r.dir, "cache.state", files.read_write, 0);
    if (fd < 0) return files.errnoFail(error.NotFound, "{s}: cache.state", .{r.key});
    defer _ = std.c.close(fd);
    const st = try files.statFd(fd, "cache.state");
    const size = st.size;
    if (size < layout.page)
        return diag.fail(error.Corrupt, "{s}: cache state is truncated", .{r.key});
    const prot: std.posix.PROT = .{ .READ = true, .WRITE = true };
    r.map = std.posix.mmap(null, @intCast(size), prot, .{ .TYPE = .SHARED }, fd, 0) catch
        return diag.fail(error.OutOfMemory, "{s}: cache state cannot be mapped", .{r.key});
    r.state_dev = st.dev;
    r.state_ino = st.ino;
    r.head = @ptrCast(r.map.ptr);
    const g = layout.Geometry.fromHead(r.head);
    if (!g.matches(r.head) or size < g.stateSize())
        return diag.fail(error.Corrupt, "{s}: not a loaderx cache state of this version", .{r.key});
    r.geo = g;
    const words: [*]u64 = @ptrCast(@alignCast(r.map.ptr + layout.page));
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
    const len: usize = @intCast(r.geo.index_size);
    const fd = r.fds[fd_index];
    r.entries = std.posix.mmap(null, len, .{ .READ = true }, .{ .TYPE = .SHARED }, fd, 0) catch
        return diag.fail(error.OutOfMemory, "{s}: its index cannot be mapped", .{r.key});
}

fn mapChecked(r: *Replica) Error!void {
    const n: usize = @intCast((r.geo.record_count + 7) / 8);
    if (n == 0) return;
    const prot: std.posix.PROT = .{ .READ = true, .WRITE = true };
    const flags: std.posix.MAP = .{ .TYPE = .PRIVATE, .ANONYMOUS = true };
    r.checked_map = std.posix.mmap(null, n, prot, flags, -1, 0) catch {
        const why = "{s}: no memory for {d} records' checked bits";
        return diag.fail(error.OutOfMemory, why, .{ r.key, r.geo.record_count });
    };
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
    return lookup(c, key, .{ .weak = weak, .store = true });
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
pub fn spanPresent(r: *const Replica, i: u64) Error![2]u64 {
    if (r.geo.fixed_size == 0 and !layout.bitTest(r.ibits, r.indexBlock(i)))
        return diag.fail(error.Corrupt, "{s}: record {d}'s entry is not cached", .{ r.key, i });
    return r.span(i);
}

pub fn indexBlock(r: *const Replica, i: u64) u64 {
    return (i * r.geo.entry_size) >> r.geo.index_shift;
}

pub fn isChecked(r: *const Replica, i: u64) bool {
    return @atomicLoad(u8, &r.checked[@intCast(i >> 3)], .monotonic) >> @intCast(i & 7) & 1 != 0;
}

pub fn markChecked(r: *Replica, records: []const u64) void {
    for (records) |i| {
        assert(i < r.geo.record_count);
        const bit = @as(u8, 1) << @intCast(i & 7);
        _ = @atomicRmw(u8, &r.checked[@intCast(i >> 3)], .Or, bit, .monotonic);
    }
}

/// Whether the checked bits belong to the replica's eviction count (else
/// every record counts as unchecked: one checked before may be refetched).
pub fn checkedCurrent(r: *const Replica) bool {
    const ev = @atomicLoad(u64, &r.head.evictions, .seq_cst);
    return ev == @atomicLoad(u64, &r.checked_at, .seq_cst);
}

/// Whether any record of `records` (in the store) is unchecked.
pub fn anyUnchecked(r: *const Replica, records: []const u64) bool {
    const fresh = r.checkedCurrent();
    for (records) |i| {
        if (i < r.geo.record_count and (!fresh or !r.isChecked(i))) return true;
    }
    return false;
}

/// Stamps every region of `records` with `tick` (atime, and ptime for a
/// prefetch): a read's step 2. Records outside the store are skipped, and
/// so is a record whose index entry is not present (it may be a hole), in
/// `missing`: such a read must not go on.
const Stamp = struct {
    r: *Replica,
    records: []const u64,
    pin: bool,
    missing: *bool,

    fn stamp(s: Stamp, tick: u64) Error!void {
        const r = s.r;
        const region_shift: u6 = r.geo.data_shift + 6;
        for (s.records) |i| {
            if (i >= r.geo.record_count) continue;
            if (r.geo.fixed_size == 0 and !layout.bitTest(r.ibits, r.indexBlock(i))) {
                s.missing.* = true;
                continue;
            }
            const sp = r.span(i);
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

/// Starts a read of `records` (Cache.zig's steps 1 to 3): its tick (in
/// flight until `Cache.end`, or a kept prefetch with `pin`), then, after
/// any eviction that ran, the checked bits made current. Null (nothing in
/// flight) when a record's index entry is not present: fetch it first.
pub fn startRead(r: *Replica, records: []const u64, pin: bool) Error!?u64 {
    const c = r.cache;
    var missing = false;
    const stamp: Stamp = .{ .r = r, .records = records, .pin = pin, .missing = &missing };
    const s = try c.startRead(pin, stamp, Stamp.stamp);
    errdefer if (!pin) c.end(s.tick);
    if (missing) {
        if (!pin) c.end(s.tick);
        return null;
    }
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
    var missing = false;
    const stamp: Stamp = .{ .r = r, .records = records, .pin = pin, .missing = &missing };
    const s = c.startRead(pin, stamp, Stamp.stamp) catch |e| switch (e) {
        error.Busy => return null,
        else => return e,
    };
    if (s.odd or missing or r.anyUnchecked(records)) {
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
            return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records", .{
                i, r.geo.record_count,
            });
        if (r.geo.fixed_size == 0 and !layout.bitTest(r.ibits, r.indexBlock(i)))
            return diag.fail(error.InvalidArgument, "record {d}'s entry is not in the cache", .{i});
        const sp = r.span(i);
        starts[k] = sp[0];
        ends[k] = sp[1];
    }
}

/// Bytes the replica's present blocks take on disk.
pub fn presentBytes(r: *const Replica) u64 {
    const data = layout.footprint(r.dwords, r.geo.data_shift);
    return data + layout.footprint(r.ibits, r.geo.index_shift);
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
pub fn reservedOverlap(r: *const Replica, f: File, b0: u64, b1: u64) bool {
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
    assert(r.cache.holdsLock());
    assert(@atomicLoad(u64, &r.cache.head.seq, .seq_cst) & 1 == 1);
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    const b0 = region * layout.region_blocks;
    if (r.reservedOverlap(.data, b0, b0 + layout.region_blocks)) return 0;
    const fd = r.lockFd(.data);
    if (!(files.lockRange(fd, b0, layout.region_blocks) catch false)) return 0;
    defer files.unlockRange(fd, b0, layout.region_blocks);
    const word = @atomicLoad(u64, &r.dwords[@intCast(region)], .monotonic);
    const freed = layout.footprintWord(word, r.geo.data_shift);
    const ev = @atomicRmw(u64, &r.head.evictions, .Add, 1, .seq_cst);
    @atomicStore(u64, &r.dwords[@intCast(region)], 0, .release);
    assert(@atomicLoad(u64, &r.head.evictions, .seq_cst) > ev);
    const lo = b0 << r.geo.data_shift;
    const hi = @min(r.geo.data_size, (b0 + layout.region_blocks) << r.geo.data_shift);
    files.punch(r.fds[fd_data], lo, hi - lo, true);
    return freed;
}

/// Punches the bytes on disk of index and data that no block marks present
/// (what a process killed mid-fetch wrote, or an older loaderx after a
/// failed write), where no fetch holds them; found with SEEK_DATA, so it
/// costs what is on disk. Under the cache's lock.
pub fn sweep(r: *Replica) void {
    assert(r.cache.holdsLock());
    const io = pool.io();
    r.mutex.lockUncancelable(io);
    defer r.mutex.unlock(io);
    for ([_]File{ .data, .index }) |f| {
        const sh = r.shift(f);
        const size = r.fileSize(f);
        var ext: files.Extents = .{ .fd = r.fileFd(f), .size = size };
        while (ext.next()) |x| {
            var b = x[0] >> sh;
            const last = (x[1] - 1) >> sh;
            while (b <= last) {
                if (layout.bitTest(r.bits(f), b)) {
                    b += 1;
                    continue;
                }
                var e = b + 1;
                while (e <= last and !layout.bitTest(r.bits(f), e)) e += 1;
                const free = !r.reservedOverlap(f, b, e);
                if (free and (files.lockRange(r.lockFd(f), b, e - b) catch false)) {
                    files.punch(r.fileFd(f), b << sh, @min(e << sh, size) - (b << sh), false);
                    files.unlockRange(r.lockFd(f), b, e - b);
                }
                b = e;
            }
        }
    }
}

/// Forgets records `records` (they failed their check): their data blocks,
/// and their index blocks unless the version is pinned by the index, become
/// missing; every process checks its records again (under the lock).
pub fn drop(r: *Replica, records: []const u64) Error!void {
    const c = r.cache;
    try c.lock();
    defer c.unlock();
    // Counted first: a reader that sees a bit cleared below sees the count
    // moved too, and checks its records again.
    const ev = @atomicRmw(u64, &r.head.evictions, .Add, 1, .seq_cst);
    // Every record's data blocks before any index block: a record's entry
    // may share a block with another's.
    for (records) |i| {
        const sp: [2]u64 = r.spanPresent(i) catch .{ 0, 0 }; // (no entry: no data blocks known)
        const sh = r.geo.data_shift;
        if (sp[1] > sp[0]) layout.bitsClear(r.dwords, sp[0] >> sh, ((sp[1] - 1) >> sh) + 1);
    }
    if (!r.weak) {
        for (records) |i| layout.bitsClear(r.ibits, r.indexBlock(i), r.indexBlock(i) + 1);
    }
    assert(@atomicLoad(u64, &r.head.evictions, .seq_cst) > ev);
}
