//! One replica of a remote store in the node-local cache (src/Cache.zig
//! owns the cache and the protocol its processes share). A replica is a
//! store directory whose `index` and `data` are sparse files of their full
//! sizes; fetched blocks land at their own offsets, and the native engine
//! reads cached records exactly as it reads a local store. This file owns
//! what a replica holds for this process and the node: its mapped
//! `cache.state` (presence bits, region ticks, eviction count), its files
//! and fetch locks (and the process's reservations beside them), the
//! records' places in the data, the start of a read through it (the
//! stamps, the records this process checked), and what eviction, a full
//! disk's sweep and a failed check drop. Its fetch plans are
//! src/cache_fetch.zig's; making it, src/cache_make.zig's.
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

// ---------------------------------------------------------------- tests

const TestBed = @import("cache_make.zig").TestBed;
const Begin = @import("cache_fetch.zig").Begin;

test "a read stamps exactly its records' regions, a prefetch its ptime too, never lowering" {
    var t = try TestBed.init(3000, 400); // regions of 32 KiB: about 11 records each
    defer t.deinit();
    const r = t.replica;
    try std.testing.expectEqual(@as(u6, 9), r.geo.data_shift);
    const tick = try t.read(&.{ 20, 21, 399 }, 0);
    r.cache.end(tick);
    const rsh = r.geo.data_shift + 6;
    const region = struct {
        fn of(byte: u64, sh: u6) usize {
            return @intCast(byte >> sh);
        }
    }.of;
    for (r.atime, 0..) |at, k| {
        const mine = k == region(20 * 3000, rsh) or k == region(22 * 3000 - 1, rsh) or
            k == region(399 * 3000, rsh) or k == region(400 * 3000 - 1, rsh);
        try std.testing.expectEqual(if (mine) tick else 0, at);
        try std.testing.expectEqual(@as(u64, 0), r.ptime[k]);
    }
    // A newer stamp of another process stays.
    r.atime[region(399 * 3000, rsh)] = 1 << 40;
    _ = try t.read(&.{ 20, 399 }, Begin.pin);
    const pin = r.cache.slots[r.cache.slot].pin;
    try std.testing.expectEqual(@as(u64, 1 << 40), r.atime[region(399 * 3000, rsh)]);
    try std.testing.expectEqual(pin, r.atime[region(20 * 3000, rsh)]);
    try std.testing.expectEqual(pin, r.ptime[region(20 * 3000, rsh)]);
    try std.testing.expectEqual(pin, r.ptime[region(399 * 3000, rsh)]);
}

test "a warm start needs every record checked since the last eviction, and reads no hole" {
    var t = try TestBed.init(0, 200);
    defer t.deinit();
    const r = t.replica;
    try std.testing.expect(try r.beginWarm(&.{ 4, 9 }, false) == null); // unchecked
    try std.testing.expectEqual(@as(u32, 0), r.cache.reads.count);
    r.cache.end(try t.read(&.{ 4, 9 }, 0));
    const tick = (try r.beginWarm(&.{ 4, 9, 1 << 40 }, false)).?; // (outside: skipped)
    r.cache.end(tick);
    // An eviction since (a region of this replica dropped): checked again.
    _ = @atomicRmw(u64, &r.head.evictions, .Add, 1, .seq_cst);
    try std.testing.expect(try r.beginWarm(&.{ 4, 9 }, false) == null);
    try std.testing.expectEqual(@as(u32, 0), r.cache.reads.count);
    // A read's start with an entry not present stops short (nothing in flight).
    layout.bitsClear(r.ibits, 0, r.geo.index_blocks);
    try std.testing.expect(try r.startRead(&.{4}, false) == null);
    try std.testing.expectEqual(@as(u32, 0), r.cache.reads.count);
}

test "eviction spares a region a read stamped after the sequence went odd, drops the rest" {
    var t = try TestBed.init(3000, 400);
    defer t.deinit();
    const r = t.replica;
    const c = r.cache;
    c.end(try t.read(&.{ 0, 200 }, 0)); // two regions present, no read in flight
    const kept = try t.read(&.{200}, 0); // a read in flight of one of them
    const before = r.presentBytes();
    try c.lock();
    const used = try c.evict(before, 0);
    c.unlock();
    try std.testing.expect(used < before);
    try std.testing.expectEqual(@as(u64, 0), r.dwords[0]); // region of record 0: evicted
    const in_use = @as(u64, 200 * 3000) >> (r.geo.data_shift + 6);
    try std.testing.expect(r.dwords[@intCast(in_use)] != 0); // in use
    try std.testing.expect(!r.checkedCurrent()); // the eviction counted: checked again
    var back: [3000]u8 = undefined;
    _ = std.c.pread(r.fds[1], &back, back.len, 0);
    for (back) |b| try std.testing.expectEqual(@as(u8, 0), b); // punched
    c.end(kept);
}
