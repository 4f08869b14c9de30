//! The node-local cache of remote stores (docs/remote.md is the user's view,
//! docs/design.md "Remote stores" the read path): one directory that every
//! process of a node shares. This file owns the cache and the protocol its
//! processes share: process slots and their liveness, the cache's lock,
//! the eviction sequence (both sides: a read's start in `startRead`, an
//! eviction in `evict`), eviction itself and the room a full disk needs,
//! the limit, and the fork of a process using it. Its parts:
//!   src/cache_format.zig  every byte of the cache's files (the mapped
//!                         `state` and each replica's `cache.state`),
//!                         a replica's geometry, the bitmaps;
//!   src/Replica.zig       one replica: its files, presence and checked
//!                         bits, a read's start and stamps, what eviction
//!                         and a failed check drop, the meta parse;
//!   src/cache_fetch.zig   fetch plans: the byte ranges a read must fetch
//!                         (reserved by fetch locks), taken in once landed;
//!   src/cache_make.zig    a replica made from its store's meta (parsed
//!                         and checked there), published under the lock;
//!   src/cache_admin.zig   `loaderx cache`: users, staging, clear;
//!   src/cache_os.zig      the system calls (locks, holes, allocation).
//! Python (loaderx/remote.py) keeps only the network: it fetches the byte
//! ranges a plan names into the replica's files and says when they landed.
//!
//! ## The protocol
//!
//! Presence: a process writes a block's bytes, then sets its bit under the
//! lock; a process killed mid-fetch leaves nothing marked. A fetcher holds
//! the fetch locks of its blocks (and its process's own reservation table
//! keeps its threads apart); eviction never takes a block whose lock is held.
//!
//! Eviction keeps what a reader uses without a lock on the read side. A read
//! (`startRead`) 1. takes the next tick and publishes its process's
//! watermarks (the oldest read in flight, the oldest kept prefetch) in its
//! slot; 2. stamps its regions with the tick (`atime`, and `ptime` for a
//! prefetch); 3. reads the eviction sequence (a read-modify-write, ordered
//! after 1 and 2). An eviction (`evict`, under the lock) makes the sequence
//! odd before it reads a watermark or a stamp, evicts only regions read
//! before every live process's oldest read and prefetched before every
//! oldest kept prefetch, counts each region it drops in its replica's
//! `evictions`, and makes the sequence even. A read that meets an odd
//! sequence waits for the lock (an evictor that died leaves it odd: the
//! waiter makes it even); one that follows an eviction sees the replica's
//! count moved and checks its records again. A slot whose process died is
//! ignored, and emptied by the first eviction that finds it so.
//!
//! Threads: any thread of a process may use a cache and its replicas at
//! once. `mutex` orders the process's threads before the flock (which
//! does not order them); a replica's `mutex` guards the process's fetch
//! locks on it. Lock order: the cache's lock, the replica table's, a
//! replica's. The cache starts no thread.
const Cache = @This();

const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const Io = std.Io;
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const Store = @import("Store.zig");
const Replica = @import("Replica.zig");
const layout = @import("cache_format.zig");
const files = @import("cache_os.zig");

pub const Error = Store.Error;

// ---------------------------------------------------------------- policy

/// How the cache sizes itself and plans fetches (C: lx_cache_policy_t;
/// loaderx/remote.py passes it at every open, from its CACHE_POLICY, whose
/// defaults are `Policy.default`, generated into loaderx/_abi.py).
pub const Policy = extern struct {
    /// Bytes the cache holds on disk at most; 0: no fixed limit, keep
    /// `free_reserve_ppm` of the file system (at least `reserve_min`) free.
    limit: u64,
    free_reserve_ppm: u64,
    reserve_min: u64,
    /// Missing blocks closer than `max_gap` bytes are fetched in one request
    /// (the gap read and dropped), of at most `request_max` bytes.
    max_gap: u64,
    request_max: u64,
    /// A process fetches the rest of an index whole (in the background)
    /// once its data fetches reach `whole_index_after` times the missing
    /// index, or its index requests are worth it at `index_request_bytes` a
    /// request; with a batch, while the missing index is at most
    /// `index_with_batch_max`; only while the index is at most
    /// 1/`whole_index_share` of the limit; in requests of `whole_index_chunk`.
    whole_index_after: u64,
    whole_index_share: u64,
    whole_index_chunk: u64,
    index_request_bytes: u64,
    index_with_batch_max: u64,
    /// How long a process waits for another's fetch of the same blocks
    /// before it fetches them itself.
    fetch_wait_ms: u64,

    pub const default: Policy = .{
        .limit = 0,
        .free_reserve_ppm = 50_000,
        .reserve_min = 1 << 30,
        .max_gap = 4 << 10,
        .request_max = 8 << 20,
        .whole_index_after = 4,
        .whole_index_share = 8,
        .whole_index_chunk = 1 << 20,
        .index_request_bytes = 64 << 10,
        .index_with_batch_max = 16 << 20,
        .fetch_wait_ms = 120_000,
    };

    pub fn problem(p: *const Policy) ?[]const u8 {
        if (p.free_reserve_ppm > 1_000_000) return "free_reserve_ppm is over 1000000";
        if (p.request_max < 512 or p.request_max > 1 << 30)
            return "request_max is not 512 B to 1 GiB";
        if (p.max_gap > p.request_max) return "max_gap is over request_max";
        if (p.whole_index_chunk < 512 or p.whole_index_chunk > 1 << 30)
            return "whole_index_chunk is not 512 B to 1 GiB";
        if (p.whole_index_share == 0) return "whole_index_share is 0";
        return null;
    }
};

// ---------------------------------------------------------------- the handle

/// `canary_value` while the handle is open (the ABI checks it).
canary: u64 = canary_value,
gpa: std.mem.Allocator,
/// The cache directory, for every name below it.
root: Io.Dir,
/// Its path as given, NUL-terminated, for messages.
root_path: [:0]u8,
map: []align(std.heap.page_size_min) u8,
head: *layout.StateHead,
slots: *[layout.slots_max]layout.Slot,
/// `state`'s identity: a directory deleted and made anew is another cache.
state_dev: u64,
state_ino: u64,
/// Opens of this handle (lx_cache_open of the same directory shares it;
/// under `registry_mutex`).
refs: u32 = 1,
policy: Policy = Policy.default,
/// Whether a fetch allocates its blocks before it writes them (a file
/// system whose mapped holes fault when full; see `needsPages`).
preallocate: bool,
/// This process's threads, before the flock of `lock` (and around the
/// process fields below).
mutex: Io.Mutex = .init,
/// The thread holding the cache's lock (its id + 1; 0: none), for assertions.
lock_owner: std.atomic.Value(u64) = .init(0),
/// This process's own files of `lock` and `slots.lock` (-1: not yet; a
/// forked child opens its own), its slot (`slot_none`: none yet).
lock_fd: c_int = -1,
slots_fd: c_int = -1,
slot: u32 = slot_none,
reads: Reads = .{},
/// Every replica this process opened here (current or replaced since),
/// under `table_mutex`; freed with the handle.
replicas: std.ArrayList(*Replica) = .empty,
table_mutex: Io.Mutex = .init,
registry_next: ?*Cache = null,

pub const slot_none = std.math.maxInt(u32);
/// "LXCACHE1" read as a little-endian u64.
pub const canary_value: u64 = 0x314548434143584C;

/// Opens the cache directory `path` (made, with its state, when `create`
/// and missing), or shares the handle this process has of it already.
pub fn open(gpa: std.mem.Allocator, path: []const u8, create: bool) Error!*Cache {
    if (builtin.os.tag == .windows) {
        const why = "the node-local cache needs POSIX file locks (not on Windows)";
        return diag.fail(error.IoFailed, why, .{});
    }
    const io = pool.io();
    if (create) Io.Dir.cwd().createDirPath(io, path) catch |e|
        return files.ioError(e, "{s}: making the cache directory", .{path});
    const root = Io.Dir.cwd().openDir(io, path, .{}) catch |e| switch (e) {
        error.FileNotFound, error.NotDir => return diag.fail(
            error.NotFound,
            "{s}: not a loaderx cache directory (no such directory)",
            .{path},
        ),
        else => return files.ioError(e, "{s}: opening the cache directory", .{path}),
    };
    errdefer root.close(io);
    if (create) try makeState(root, path);
    if (create) _ = std.c.mkdirat(root.handle, "stores", 0o755); // (a clear makes it anew)
    const st = files.statAt(root.handle, "state", path) catch |e| switch (e) {
        error.NotFound => return diag.fail(
            error.NotFound,
            "{s}: not a loaderx cache directory (no state file)",
            .{path},
        ),
        else => return e,
    };
    lockRegistry();
    defer registry_mutex.unlock();
    var it = registry_head;
    while (it) |c| : (it = c.registry_next) {
        if (c.state_dev == st.dev and c.state_ino == st.ino) {
            c.refs += 1;
            root.close(io);
            return c;
        }
    }
    const c = try openNew(gpa, root, path, st);
    installForkHandlers();
    c.registry_next = registry_head;
    registry_head = c;
    return c;
}

fn openNew(gpa: std.mem.Allocator, root: Io.Dir, path: []const u8, st: files.FileId) Error!*Cache {
    const fd = files.openAt(root.handle, "state", files.read_write, 0);
    if (fd < 0) return files.errnoFail(error.IoFailed, "{s}/state", .{path});
    defer _ = std.c.close(fd);
    if (st.size < layout.state_size) {
        return diag.fail(error.Corrupt, "{s}: not a loaderx cache directory of this version " ++
            "(its state file is {d} bytes)", .{ path, st.size });
    }
    const prot: std.posix.PROT = .{ .READ = true, .WRITE = true };
    const map = std.posix.mmap(null, layout.state_size, prot, .{ .TYPE = .SHARED }, fd, 0) catch
        return diag.fail(error.OutOfMemory, "{s}/state: cannot be mapped", .{path});
    errdefer std.posix.munmap(map);
    const head: *layout.StateHead = @ptrCast(map.ptr);
    const known = head.version == 1 or head.version == layout.state_version;
    if (head.magic != layout.state_magic or !known) {
        return diag.fail(error.Corrupt, "{s}: not a loaderx cache directory of this version " ++
            "(remove it)", .{path});
    }
    const c = gpa.create(Cache) catch return error.OutOfMemory;
    errdefer gpa.destroy(c);
    const root_path = gpa.dupeSentinel(u8, path, 0) catch return error.OutOfMemory;
    errdefer gpa.free(root_path);
    c.* = .{
        .gpa = gpa,
        .root = root,
        .root_path = root_path,
        .map = map,
        .head = head,
        .slots = @ptrCast(map[layout.page..][0 .. layout.slots_max * @sizeOf(layout.Slot)]),
        .state_dev = st.dev,
        .state_ino = st.ino,
        .preallocate = files.needsPages(root.handle),
    };
    errdefer c.releaseSlot();
    if (head.version == 1) try c.upgrade();
    files.moreDescriptors();
    return c;
}

/// A version-1 state (every read took the lock) becomes version 2: word 4,
/// unused and all ones there, is the eviction sequence, even.
fn upgrade(c: *Cache) Error!void {
    try c.lock();
    defer c.unlock();
    if (c.head.version == 1) {
        @atomicStore(u64, &c.head.seq, 0, .seq_cst);
        @atomicStore(u64, &c.head.version, layout.state_version, .seq_cst);
    }
}

/// Makes `state` when it is missing or short: written aside whole (head,
/// then every slot empty) and renamed into place under the cache's lock.
fn makeState(root: Io.Dir, path: []const u8) Error!void {
    if (files.statAt(root.handle, "state", path)) |st| {
        if (st.size >= layout.state_size) return;
    } else |_| {}
    const lfd = files.openAt(root.handle, "lock", files.read_write_create, 0o644);
    if (lfd < 0) return files.errnoFail(error.IoFailed, "{s}/lock", .{path});
    defer _ = std.c.close(lfd);
    try files.flockRetry(lfd, std.posix.LOCK.EX);
    if (files.statAt(root.handle, "state", path)) |st| {
        if (st.size >= layout.state_size) return;
    } else |_| {}
    var name_buf: [32]u8 = undefined;
    // (a pid in hex is at most 16 digits)
    const tmp = files.nameZ(&name_buf, "state.{x}", .{pool.currentPid()}) orelse unreachable;
    var bytes: [layout.state_size]u8 = undefined;
    @memset(bytes[0..layout.page], 0);
    @memset(bytes[layout.page..], 0xFF); // every slot `none`
    const h: layout.StateHead = .{
        .magic = layout.state_magic,
        .version = layout.state_version,
        .tick = 0,
        .used = 0,
        .seq = 0,
    };
    @memcpy(bytes[0..@sizeOf(layout.StateHead)], std.mem.asBytes(&h));
    var flags: std.posix.O = files.read_write_create;
    flags.TRUNC = true;
    const fd = files.openAt(root.handle, tmp, flags, 0o644);
    if (fd < 0) return files.errnoFail(error.IoFailed, "{s}/{s}", .{ path, tmp });
    defer _ = std.c.close(fd);
    try files.writeAll(fd, &bytes, 0, path, "state");
    if (std.c.renameat(root.handle, tmp, root.handle, "state") != 0)
        return files.errnoFail(error.IoFailed, "{s}/state: renaming it into place", .{path});
}

/// Drops one open of the handle; the last frees it, with every replica.
pub fn close(c: *Cache) void {
    lockRegistry();
    assert(c.refs > 0);
    c.refs -= 1;
    if (c.refs > 0) {
        registry_mutex.unlock();
        return;
    }
    var link = &registry_head;
    while (link.*) |it| : (link = &it.registry_next) {
        if (it == c) {
            link.* = c.registry_next;
            break;
        }
    }
    registry_mutex.unlock();
    for (c.replicas.items) |r| r.destroy();
    c.replicas.deinit(c.gpa);
    c.releaseSlot();
    std.posix.munmap(c.map);
    c.root.close(pool.io());
    c.gpa.free(c.root_path);
    c.canary = 0;
    c.gpa.destroy(c);
}

/// Whether `state` in the directory is still the file this handle maps
/// (false once the directory was deleted and made anew).
pub fn current(c: *Cache) bool {
    const st = files.statAt(c.root.handle, "state", c.root_path) catch return false;
    return st.dev == c.state_dev and st.ino == c.state_ino;
}

/// A cache's shared counters and this process's part (C: lx_cache_stats_t).
pub const Stats = extern struct {
    /// The last tick taken, bytes held on disk, the eviction sequence.
    tick: u64,
    used: u64,
    seq: u64,
    /// Bytes the cache may hold now, and (without a limit; else 0) the
    /// file system's free bytes and the reserve the cache leaves free.
    limit: u64,
    free: u64,
    reserve: u64,
    /// This process's slot (-1: none yet), its watermarks, its reads in
    /// flight and kept prefetches.
    slot: i64,
    read_mark: u64,
    pin_mark: u64,
    reads: u64,
    pins: u64,
    /// 1 while the directory holds the state this handle maps.
    current: u32,
    /// 1 where a fetch allocates its blocks before it writes them.
    preallocate: u32,
};

pub fn stats(c: *Cache) Stats {
    const used = @atomicLoad(u64, &c.head.used, .monotonic);
    const space = if (c.policy.limit == 0) files.freeSpace(c.root.handle) else null;
    const slot = @atomicLoad(u32, &c.slot, .acquire);
    var out: Stats = .{
        .tick = @atomicLoad(u64, &c.head.tick, .seq_cst),
        .used = used,
        .seq = @atomicLoad(u64, &c.head.seq, .seq_cst),
        .limit = c.effectiveLimit(used),
        .free = if (space) |sp| sp.free else 0,
        .reserve = if (space) |sp| c.reserve(sp.total) else 0,
        .slot = if (slot == slot_none) -1 else slot,
        .read_mark = layout.none,
        .pin_mark = layout.none,
        .reads = 0,
        .pins = 0,
        .current = @intFromBool(c.current()),
        .preallocate = @intFromBool(c.preallocate),
    };
    if (slot != slot_none) {
        out.read_mark = @atomicLoad(u64, &c.slots[slot].read, .seq_cst);
        out.pin_mark = @atomicLoad(u64, &c.slots[slot].pin, .seq_cst);
        c.reads.lockSpin();
        defer c.reads.spin.unlock();
        out.reads = c.reads.count;
        out.pins = c.reads.pins_kept;
    }
    return out;
}

/// Evicts now what the limit asks (lx_cache_evict), after dropping this
/// process's kept prefetches with `drop_pins`; returns the Warn bits.
pub fn evictNow(c: *Cache, drop_pins: bool) Error!u32 {
    try c.enterProcess();
    if (drop_pins) c.unpin();
    try c.lock();
    defer c.unlock();
    return c.maybeEvict();
}

pub fn configure(c: *Cache, p: Policy) Error!void {
    if (p.problem()) |why| return diag.fail(error.InvalidArgument, "cache policy: {s}", .{why});
    const io = pool.io();
    c.mutex.lockUncancelable(io);
    defer c.mutex.unlock(io);
    c.policy = p;
}

// ---------------------------------------------------------------- this process

/// Claims this process's slot, and its own files of `lock` and `slots.lock`,
/// when it has none yet (its first read or fetch; a forked child's first).
pub fn enterProcess(c: *Cache) Error!void {
    if (@atomicLoad(u32, &c.slot, .acquire) != slot_none) return;
    const io = pool.io();
    c.mutex.lockUncancelable(io);
    defer c.mutex.unlock(io);
    if (c.slot != slot_none) return;
    try c.openFiles();
    for (0..layout.slots_max) |k| {
        if (try files.lockRange(c.slots_fd, k, 1)) {
            // Emptied while held: a process that took it before us is gone,
            // and nothing reads this slot's marks as ours until they are.
            @atomicStore(u64, &c.slots[k].read, layout.none, .seq_cst);
            @atomicStore(u64, &c.slots[k].pin, layout.none, .seq_cst);
            c.reads = .{};
            @atomicStore(u32, &c.slot, @intCast(k), .release);
            return;
        }
    }
    return diag.fail(error.InvalidArgument, "{s}: more than {d} processes share this cache " ++
        "directory", .{ c.root_path, layout.slots_max });
}

/// This process's own files of `lock` and `slots.lock` (c.mutex held).
fn openFiles(c: *Cache) Error!void {
    if (c.lock_fd < 0) c.lock_fd = try c.openLockFile("lock");
    if (c.slots_fd < 0) c.slots_fd = try c.openLockFile("slots.lock");
}

fn openLockFile(c: *Cache, name: [:0]const u8) Error!c_int {
    const fd = files.openAt(c.root.handle, name, files.read_write_create, 0o644);
    if (fd < 0) return files.errnoFail(error.IoFailed, "{s}/{s}", .{ c.root_path, name });
    return fd;
}

fn releaseSlot(c: *Cache) void {
    if (c.slot != slot_none) {
        @atomicStore(u64, &c.slots[c.slot].read, layout.none, .seq_cst);
        @atomicStore(u64, &c.slots[c.slot].pin, layout.none, .seq_cst);
    }
    // Closing our file of slots.lock drops our slot's lock.
    if (c.slots_fd >= 0) _ = std.c.close(c.slots_fd);
    if (c.lock_fd >= 0) _ = std.c.close(c.lock_fd);
    c.slots_fd = -1;
    c.lock_fd = -1;
    c.slot = slot_none;
}

/// The cache's lock: this process's threads, then other processes. It
/// claims no slot: a process that only looks (`loaderx cache`) is no user.
pub fn lock(c: *Cache) Error!void {
    const io = pool.io();
    c.mutex.lockUncancelable(io);
    errdefer c.mutex.unlock(io);
    try c.openFiles();
    try files.flockRetry(c.lock_fd, std.posix.LOCK.EX);
    assert(c.lock_owner.load(.monotonic) == 0);
    c.lock_owner.store(threadMark(), .monotonic);
}

pub fn unlock(c: *Cache) void {
    assert(c.lock_fd >= 0);
    assert(c.holdsLock());
    c.lock_owner.store(0, .monotonic);
    _ = std.c.flock(c.lock_fd, std.posix.LOCK.UN);
    c.mutex.unlock(pool.io());
}

/// Whether this thread holds the cache's lock (for assertions).
pub fn holdsLock(c: *const Cache) bool {
    return c.lock_owner.load(.monotonic) == threadMark();
}

fn threadMark() u64 {
    return @as(u64, std.Thread.getCurrentId()) + 1;
}

// ---------------------------------------------------------------- reads in flight

/// Reads one process may have in flight through one cache at once.
pub const reads_max = 256;
/// Prefetches a process keeps protected from eviction (the loader reads
/// each prefetched step within this many later prefetches).
pub const pin_calls = 128;

/// One process's reads in flight and kept prefetches (under `spin`).
pub const Reads = struct {
    spin: std.atomic.Mutex = .unlocked,
    count: u32 = 0,
    active: [reads_max]u64 = undefined,
    pins_first: u32 = 0,
    pins_kept: u32 = 0,
    pins: [pin_calls]u64 = undefined,

    fn lockSpin(p: *Reads) void {
        while (!p.spin.tryLock()) std.Thread.yield() catch {};
    }
};

/// Takes the next tick and records it among this process's reads in
/// flight (or kept prefetches, with `pin`), publishing the watermark: a
/// read's step 1.
fn publish(c: *Cache, pin: bool) Error!u64 {
    const p = &c.reads;
    const slot = &c.slots[c.slot];
    p.lockSpin();
    defer p.spin.unlock();
    if (!pin and p.count >= reads_max) {
        const why = "{d} reads in flight in one process through one cache";
        return diag.fail(error.Busy, why, .{reads_max});
    }
    const tick = @atomicRmw(u64, &c.head.tick, .Add, 1, .seq_cst) +% 1;
    if (pin) {
        if (p.pins_kept == pin_calls) {
            p.pins_first = (p.pins_first + 1) % pin_calls;
            p.pins_kept -= 1;
        }
        p.pins[(p.pins_first + p.pins_kept) % pin_calls] = tick;
        p.pins_kept += 1;
        // The oldest kept prefetch: lowered only from `none` (a new tick is
        // newer than any kept), raised as the oldest is dropped.
        @atomicStore(u64, &slot.pin, p.pins[p.pins_first], .seq_cst);
    } else {
        p.active[p.count] = tick;
        p.count += 1;
        if (@atomicLoad(u64, &slot.read, .seq_cst) == layout.none)
            @atomicStore(u64, &slot.read, tick, .seq_cst);
    }
    assert(p.count <= reads_max and p.pins_kept <= pin_calls);
    return tick;
}

/// The read of `tick` is over: the watermark rises to the oldest read still
/// in flight. A tick not in flight (a prefetch's, one ended) changes nothing.
pub fn end(c: *Cache, tick: u64) void {
    if (c.slot == slot_none) return;
    const p = &c.reads;
    p.lockSpin();
    defer p.spin.unlock();
    var i: u32 = 0;
    while (i < p.count) : (i += 1) {
        if (p.active[i] == tick) break;
    } else return;
    p.count -= 1;
    p.active[i] = p.active[p.count];
    var low: u64 = layout.none;
    for (p.active[0..p.count]) |t| low = @min(low, t);
    assert((low == layout.none) == (p.count == 0));
    @atomicStore(u64, &c.slots[c.slot].read, low, .seq_cst);
}

/// Drops this process's kept prefetches (they protect nothing any more).
pub fn unpin(c: *Cache) void {
    if (c.slot == slot_none) return;
    const p = &c.reads;
    p.lockSpin();
    defer p.spin.unlock();
    p.pins_kept = 0;
    p.pins_first = 0;
    @atomicStore(u64, &c.slots[c.slot].pin, layout.none, .seq_cst);
}

/// What `startRead` found: the read's tick, and whether the eviction
/// sequence was odd.
pub const Started = struct { tick: u64, odd: bool };

/// A read's steps 1 to 3 (the file's comment): its tick, published; the
/// stamps, by `stamp(ctx, tick)`; then the eviction sequence. Returns the
/// tick and whether the sequence was odd (an eviction runs, or died
/// running). A read, not a prefetch, is in flight only when this returns.
pub fn startRead(
    c: *Cache,
    pin: bool,
    ctx: anytype,
    comptime stamp: fn (@TypeOf(ctx), u64) Error!void,
) Error!Started {
    try c.enterProcess();
    const tick = try c.publish(pin);
    errdefer if (!pin) c.end(tick);
    try stamp(ctx, tick);
    const odd = @atomicRmw(u64, &c.head.seq, .Add, 0, .seq_cst) & 1 != 0;
    return .{ .tick = tick, .odd = odd };
}

/// A read that met an odd sequence waits for the eviction under the lock;
/// an evictor that died left it odd, and this makes it even.
pub fn waitEviction(c: *Cache) Error!void {
    try c.lock();
    defer c.unlock();
    if (@atomicLoad(u64, &c.head.seq, .seq_cst) & 1 != 0)
        _ = @atomicRmw(u64, &c.head.seq, .Add, 1, .seq_cst);
}

/// Raises `slot` to `tick`, never lowering it: reads of two processes stamp
/// a shared region in any order, and the newer must stay.
pub fn raise(slot: *u64, tick: u64) void {
    var cur = @atomicLoad(u64, slot, .monotonic);
    while (cur < tick) cur = @cmpxchgWeak(u64, slot, cur, tick, .seq_cst, .monotonic) orelse return;
}

// ---------------------------------------------------------------- eviction (the write side)

/// The oldest read in flight and the oldest kept prefetch of every live
/// process (under the lock). A slot whose process died is emptied, its
/// lock held meanwhile, so a process that claims it next finds it empty.
fn lowWatermarks(c: *Cache) Error![2]u64 {
    assert(c.holdsLock());
    var low: [2]u64 = .{ layout.none, layout.none };
    for (c.slots, 0..) |*s, k| {
        const marks: [2]u64 = .{
            @atomicLoad(u64, &s.read, .seq_cst),
            @atomicLoad(u64, &s.pin, .seq_cst),
        };
        if (marks[0] == layout.none and marks[1] == layout.none) continue;
        if (k != c.slot and try files.lockRange(c.slots_fd, k, 1)) {
            @atomicStore(u64, &s.read, layout.none, .seq_cst);
            @atomicStore(u64, &s.pin, layout.none, .seq_cst);
            files.unlockRange(c.slots_fd, k, 1);
            continue;
        }
        low = .{ @min(low[0], marks[0]), @min(low[1], marks[1]) };
    }
    return low;
}

/// Bytes the cache may hold now: its limit, or (none) what leaves its file
/// system's reserve free; `reserve` and `free` are set when asked.
pub fn effectiveLimit(c: *Cache, used: u64) u64 {
    if (c.policy.limit != 0) return c.policy.limit;
    const space = files.freeSpace(c.root.handle) orelse return std.math.maxInt(u64);
    return (used + space.free) -| c.reserve(space.total);
}

pub fn reserve(c: *Cache, total: u64) u64 {
    const share: u128 = @as(u128, total) * c.policy.free_reserve_ppm / 1_000_000;
    return @max(c.policy.reserve_min, @as(u64, @intCast(@min(share, std.math.maxInt(u64)))));
}

/// What a call that may evict tells its caller (lx_fetch_t.flags).
pub const Warn = struct {
    pub const over_limit: u32 = 1;
    pub const disk_nearly_full: u32 = 2;
};

/// Evicts least recently used regions no reader uses until the cache is at
/// 90% of its limit (under the lock); what is in use stays, past the limit.
/// Returns `Warn` bits: over its limit with everything in use, or a disk so
/// full that the cache without a limit holds less than its reserve.
pub fn maybeEvict(c: *Cache) Error!u32 {
    assert(c.holdsLock());
    const used0 = @atomicLoad(u64, &c.head.used, .monotonic);
    const limit = c.effectiveLimit(used0);
    if (used0 <= limit) return 0;
    try c.scanReplicas();
    var used = c.presentBytes();
    @atomicStore(u64, &c.head.used, used, .monotonic);
    if (used <= limit) return 0;
    var warn: u32 = 0;
    if (c.policy.limit == 0) {
        if (files.freeSpace(c.root.handle)) |space| {
            if (limit < c.reserve(space.total)) warn |= Warn.disk_nearly_full;
        }
    }
    used = try c.evict(used, limit / 10 * 9);
    if (used > limit) warn |= Warn.over_limit;
    return warn;
}

/// The eviction proper, between an odd and an even sequence: the least
/// recently read regions no reader uses, until `used` <= `target` or none
/// is left. Returns the new `used` (also stored in the head).
pub fn evict(c: *Cache, used_now: u64, target: u64) Error!u64 {
    assert(c.holdsLock());
    // Odd under the lock: an evictor killed mid-way. Even first, then odd.
    if (@atomicLoad(u64, &c.head.seq, .seq_cst) & 1 != 0)
        _ = @atomicRmw(u64, &c.head.seq, .Add, 1, .seq_cst);
    _ = @atomicRmw(u64, &c.head.seq, .Add, 1, .seq_cst); // odd: reads that start now wait
    defer _ = @atomicRmw(u64, &c.head.seq, .Add, 1, .seq_cst); // even: every drop counted
    assert(@atomicLoad(u64, &c.head.seq, .seq_cst) & 1 == 1);
    var used = used_now;
    const low = try c.lowWatermarks();
    const Candidate = struct { atime: u64, replica: u32, region: u64 };
    var cands: std.ArrayList(Candidate) = .empty;
    defer cands.deinit(c.gpa);
    const all = c.snapshot();
    defer c.gpa.free(all);
    for (all, 0..) |r, k| {
        for (r.dwords, 0..) |*w, region| {
            const at = @atomicLoad(u64, &r.atime[region], .seq_cst);
            if (@atomicLoad(u64, w, .monotonic) == 0 or at >= low[0]) continue;
            if (@atomicLoad(u64, &r.ptime[region], .seq_cst) >= low[1]) continue;
            // Without memory for the list the cache grows instead.
            const cand: Candidate = .{ .atime = at, .replica = @intCast(k), .region = region };
            cands.append(c.gpa, cand) catch break;
        }
    }
    std.sort.pdq(Candidate, cands.items, {}, struct {
        fn less(_: void, a: Candidate, b: Candidate) bool {
            return a.atime < b.atime;
        }
    }.less);
    for (cands.items, 0..) |cand, k| {
        if (used <= target) break;
        used -|= all[cand.replica].evictRegion(cand.region);
        if (k == 0) debugPause();
    }
    @atomicStore(u64, &c.head.used, used, .monotonic);
    return used;
}

/// For the tests (lx_debug_cache_pause): an eviction sleeps this long after
/// it dropped its first region, the sequence odd and the lock held, so a
/// test can kill its process there. 0: off (the default).
pub var debug_evict_pause_ms: std.atomic.Value(u32) = .init(0);

fn debugPause() void {
    const ms = debug_evict_pause_ms.load(.monotonic);
    if (ms == 0) return;
    const ts: std.c.timespec = .{
        .sec = @intCast(ms / 1000),
        .nsec = @intCast((ms % 1000) * 1_000_000),
    };
    _ = std.c.nanosleep(&ts, null);
}

/// After a fetch found the file system full: evicts what no reader uses
/// until `need` bytes are free of the cache's own, and punches the bytes no
/// block marks present (what a process killed mid-fetch wrote).
pub fn makeRoom(c: *Cache, need: u64) Error!void {
    try c.lock();
    defer c.unlock();
    try c.scanReplicas();
    const used = c.presentBytes();
    _ = try c.evict(used, used -| (need + need / 8));
    const all = c.snapshot();
    defer c.gpa.free(all);
    for (all) |r| r.sweep();
}

/// Bytes every current replica's present blocks take (under the lock).
fn presentBytes(c: *Cache) u64 {
    const all = c.snapshot();
    defer c.gpa.free(all);
    var total: u64 = 0;
    for (all) |r| total += r.presentBytes();
    return total;
}

/// The current replicas this process opened (a copy the caller frees: the
/// table may grow meanwhile); empty without memory for it.
fn snapshot(c: *Cache) []*Replica {
    const io = pool.io();
    c.table_mutex.lockUncancelable(io);
    defer c.table_mutex.unlock(io);
    var n: usize = 0;
    for (c.replicas.items) |r| n += @intFromBool(!r.retired);
    const out = c.gpa.alloc(*Replica, n) catch return &.{};
    var k: usize = 0;
    for (c.replicas.items) |r| {
        if (r.retired) continue;
        out[k] = r;
        k += 1;
    }
    assert(k == n);
    return out;
}

/// Opens every replica in `stores/` this process has not (eviction reaches
/// them all); one that cannot be opened is skipped (under the lock).
fn scanReplicas(c: *Cache) Error!void {
    const io = pool.io();
    var dir = c.root.openDir(io, "stores", .{ .iterate = true }) catch return;
    defer dir.close(io);
    var it = dir.iterate();
    while (it.next(io) catch null) |entry| {
        if (entry.name.len == 0 or entry.name[0] == '.' or entry.kind != .directory) continue;
        _ = Replica.lookup(c, entry.name, .{}) catch continue;
    }
}

// ---------------------------------------------------------------- fork

/// Every open cache handle of this process (for the fork handler), under
/// `registry_mutex`, which Store.zig's atfork handlers hold across fork().
var registry_head: ?*Cache = null;
pub var registry_mutex: std.atomic.Mutex = .unlocked;

pub fn lockRegistry() void {
    while (!registry_mutex.tryLock()) std.atomic.spinLoopHint();
}

fn installForkHandlers() void {
    Store.installForkHandlers();
}

/// In a forked child, inside fork() (one thread; async-signal-safe calls
/// only): what the parent held in each cache is not the child's. Its
/// slot's lock stays the parent's (POSIX locks are not inherited), and its
/// file of `lock` is the parent's open file (an flock through it would
/// share the parent's), so both are closed and the child claims its own
/// on first use; its reads in flight and kept prefetches, its threads'
/// mutexes and fetch reservations are the parent's and are forgotten.
pub fn adoptAllInChild() void {
    var it = registry_head;
    while (it) |c| : (it = c.registry_next) {
        if (c.lock_fd >= 0) _ = std.c.close(c.lock_fd);
        if (c.slots_fd >= 0) _ = std.c.close(c.slots_fd);
        c.lock_fd = -1;
        c.slots_fd = -1;
        c.slot = slot_none;
        c.reads = .{};
        c.mutex = .init;
        c.table_mutex = .init;
        c.lock_owner = .init(0);
        for (c.replicas.items) |r| r.adoptInChild();
    }
}

// ---------------------------------------------------------------- tests

/// A cache in a fresh directory of `tmp`, for the tests.
pub fn openTest(tmp: *std.testing.TmpDir) !*Cache {
    const io = pool.io();
    const base = try tmp.dir.realPathFileAlloc(io, ".", std.testing.allocator);
    defer std.testing.allocator.free(base);
    var buf: [std.fs.max_path_bytes]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/cache", .{base});
    return open(std.testing.allocator, path, true);
}

fn noStamp(_: void, _: u64) Error!void {}

test "one handle and one slot per process; a dead process's slot is emptied, a live one's kept" {
    if (builtin.os.tag != .linux) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const c = try openTest(&tmp);
    defer c.close();
    try std.testing.expectEqual(c, try openTest(&tmp)); // the same directory: the same handle
    c.close();
    try c.enterProcess();
    try std.testing.expectEqual(@as(u32, 0), c.slot);
    // Marks in a slot no process holds: a process that died. Ignored, emptied.
    c.slots[7] = .{ .read = 3, .pin = 4 };
    var pipe: [2]c_int = undefined;
    try std.testing.expectEqual(@as(c_int, 0), std.c.pipe(&pipe));
    defer for (pipe) |fd| {
        _ = std.c.close(fd);
    };
    const pid = std.c.fork();
    if (pid == 0) { // a reader of its own (the handle adopted at fork: a slot of its own)
        const s = c.startRead(false, {}, noStamp) catch std.c._exit(1);
        if (c.slot == 0 or c.slots[c.slot].read != s.tick) std.c._exit(2);
        _ = std.c.write(pipe[1], std.mem.asBytes(&s.tick), 8);
        while (true) _ = std.c.nanosleep(&.{ .sec = 1, .nsec = 0 }, null);
    }
    var alive = true;
    defer if (alive) {
        _ = std.c.kill(pid, .KILL);
        _ = std.c.waitpid(pid, null, 0);
    };
    var tick: u64 = 0;
    try std.testing.expectEqual(@as(isize, 8), std.c.read(pipe[0], std.mem.asBytes(&tick), 8));
    try c.lock();
    const live = try c.lowWatermarks();
    c.unlock();
    try std.testing.expectEqual([2]u64{ tick, layout.none }, live); // the child's read kept
    try std.testing.expectEqual(layout.none, c.slots[7].read); // slot 7 emptied
    _ = std.c.kill(pid, .KILL);
    _ = std.c.waitpid(pid, null, 0);
    alive = false;
    try c.lock();
    const after = try c.lowWatermarks();
    c.unlock();
    try std.testing.expectEqual([2]u64{ layout.none, layout.none }, after); // it died
}

test "the watermarks follow the oldest read in flight and the oldest kept prefetch" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const c = try openTest(&tmp);
    defer c.close();
    const a = (try c.startRead(false, {}, noStamp)).tick;
    const slot = &c.slots[c.slot];
    try std.testing.expectEqual(a, slot.read);
    const b = (try c.startRead(false, {}, noStamp)).tick;
    try std.testing.expectEqual(a, slot.read); // the older read keeps it
    c.end(a);
    try std.testing.expectEqual(b, slot.read); // rises to the read still in flight
    c.end(a); // ended already: nothing changes
    try std.testing.expectEqual(b, slot.read);
    c.end(b);
    try std.testing.expectEqual(layout.none, slot.read);
    // Prefetches: the oldest of the last pin_calls is kept.
    var first: u64 = 0;
    for (0..pin_calls + 3) |i| {
        const t = (try c.startRead(true, {}, noStamp)).tick;
        if (i == 0) first = t;
        c.end(t); // a prefetch's tick is not a read in flight: no change
    }
    try std.testing.expectEqual(first + 3, slot.pin);
    try std.testing.expectEqual(layout.none, slot.read);
    c.unpin();
    try std.testing.expectEqual(layout.none, slot.pin);
    // A process with reads_max reads in flight is told so.
    c.reads.count = reads_max;
    try std.testing.expectError(error.Busy, c.startRead(false, {}, noStamp));
    c.reads.count = 0;
}

test "the eviction sequence: odd while evicting; a dead evictor's odd one is made even" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const c = try openTest(&tmp);
    defer c.close();
    try c.enterProcess();
    try c.lock();
    _ = try c.evict(0, 0); // nothing to evict: odd, then even again
    c.unlock();
    try std.testing.expectEqual(@as(u64, 2), c.head.seq);
    // An evictor killed mid-way left it odd: a read sees it so, waits for
    // the lock (free: its holder is gone) and makes it even.
    c.head.seq = 3;
    const s = try c.startRead(false, {}, noStamp);
    try std.testing.expect(s.odd);
    try c.waitEviction();
    try std.testing.expectEqual(@as(u64, 4), c.head.seq);
    c.end(s.tick);
    // The next eviction under the lock also repairs one: even, odd, even.
    c.head.seq = 5;
    try c.lock();
    _ = try c.evict(0, 0);
    c.unlock();
    try std.testing.expectEqual(@as(u64, 8), c.head.seq);
    // The lock is released: another file of `lock` takes it at once.
    const other = files.openAt(c.root.handle, "lock", files.read_write, 0);
    defer _ = std.c.close(other);
    const nb = std.posix.LOCK.EX | std.posix.LOCK.NB;
    try std.testing.expectEqual(@as(c_int, 0), std.c.flock(other, nb));
}

test "a policy out of its bounds is refused" {
    var p = Policy.default;
    try std.testing.expect(p.problem() == null);
    p.request_max = 100;
    try std.testing.expect(p.problem() != null);
    p = Policy.default;
    p.whole_index_share = 0;
    try std.testing.expect(p.problem() != null);
}
