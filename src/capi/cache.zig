//! The C ABI, the node-local cache of remote stores: src/Cache.zig owns the cache
//! directory and the protocol its processes share (its files are
//! src/cache_format.zig's), src/Replica.zig one replica, src/cache_fetch.zig
//! the fetch plans. Python (loaderx/remote.py) keeps only the network: it opens a
//! cache and a replica, starts a read (lx_replica_begin), fetches the byte
//! ranges the returned fetch names into the replica's files, says they
//! landed (lx_fetch_landed), and reads the records with the store calls.
//! `lx_cache *` and `lx_replica *` are opaque; a replica belongs to its
//! cache and lives until the cache's last lx_cache_close. Any thread may
//! use a cache and its replicas at once, except one fetch (lx_fetch_t),
//! which one thread at a time moves on. The cache needs POSIX file locks:
//! on Windows every call returns io.
const std = @import("std");
const assert = std.debug.assert;
const capi = @import("../capi.zig");
const Cache = @import("../Cache.zig");
const Replica = @import("../Replica.zig");
const cache_fetch = @import("../cache_fetch.zig");
const cache_make = @import("../cache_make.zig");
const cache_admin = @import("../cache_admin.zig");
const diag = @import("../diag.zig");
const gather = @import("gather.zig");

const CachePolicy = capi.CachePolicy;
const ReplicaSpec = capi.ReplicaSpec;
const MetaInfo = capi.MetaInfo;
const Fetch = capi.Fetch;
const CacheStats = capi.CacheStats;
const ReplicaInfo = capi.ReplicaInfo;
const Part = capi.Part;
const code = capi.code;
const invalid = capi.invalid;
const gpa = capi.gpa;
const cacheHandle = capi.cacheHandle;
const replicaHandle = capi.replicaHandle;

/// The records a call names: `count` of them at `records` (null when 0),
/// at most 2^32 a call.
fn recordSlice(records: ?[*]const u64, count: u64) ?[]const u64 {
    if (count == 0) return &.{};
    if (count > 1 << 32) return null;
    return (records orelse return null)[0..@intCast(count)];
}

/// Opens the cache directory `path` (NUL-terminated): with `create` != 0
/// made first when missing (the directory, its state, stores/). A process
/// has one handle per directory: opening it again returns the same one
/// with one more open (each lx_cache_close drops one). `policy` (may be
/// null: keep the current one) is applied as lx_cache_configure does.
/// Errors: not_found (no cache there, without create), corrupt (not a
/// cache of this version), invalid (policy), io, out_of_memory. On success
/// `*out` holds the handle until its lx_cache_close.
pub export fn lx_cache_open(
    path: ?[*:0]const u8,
    create: u32,
    policy: ?*const CachePolicy,
    out: ?*?*Cache,
) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    o.* = null;
    const p = path orelse return invalid("path is null", .{});
    const c = Cache.open(gpa, std.mem.span(p), create != 0) catch |e| return code(e);
    if (policy) |pol| c.configure(pol.*) catch |e| {
        c.close();
        return code(e);
    };
    assert(cacheHandle(c) == c); // live until its last lx_cache_close
    o.* = c;
    return 0;
}

/// Drops one open of `c`; the last frees the handle and its replicas (no
/// thread may use them after). Releases this process's slot then. Null
/// is ignored.
pub export fn lx_cache_close(c: ?*Cache) void {
    if (cacheHandle(c)) |h| h.close();
}

/// Sets the cache's limit and planning (for this process; the last call
/// wins). Errors: invalid (a bad handle, a policy out of its bounds).
pub export fn lx_cache_configure(c: ?*Cache, policy: ?*const CachePolicy) c_int {
    diag.clear();
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const p = policy orelse return invalid("policy is null", .{});
    h.configure(p.*) catch |e| return code(e);
    return 0;
}

/// Fills `*out` with the cache's counters. Errors: invalid.
pub export fn lx_cache_stats(c: ?*Cache, out: ?*CacheStats) c_int {
    diag.clear();
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const o = out orelse return invalid("out is null", .{});
    o.* = h.stats();
    return 0;
}

/// Evicts now what the limit asks (as a fetch does after it landed), after
/// dropping this process's kept prefetches when `unpin` != 0; writes the
/// Warn bits (FETCH_FLAGS) to `*warn`. Errors: invalid, io.
pub export fn lx_cache_evict(c: ?*Cache, unpin: u32, warn: ?*u32) c_int {
    diag.clear();
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const w = warn orelse return invalid("warn is null", .{});
    w.* = h.evictNow(unpin != 0) catch |e| return code(e);
    return 0;
}

/// Writes the pids of the processes using the cache (this one first when
/// it does; -1 where the system does not say) to `pids` (room for `cap`)
/// and their number to `*count` (may exceed `cap`). Errors: invalid, io.
pub export fn lx_cache_users(c: ?*Cache, pids: ?[*]i64, cap: u64, count: ?*u64) c_int {
    diag.clear();
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const n = count orelse return invalid("count is null", .{});
    if (cap > 0 and pids == null) return invalid("pids is null", .{});
    const room: []i64 = if (cap > 0) pids.?[0..@intCast(@min(cap, 1 << 20))] else &.{};
    n.* = cache_admin.usersLocked(h, room) catch |e| return code(e);
    return 0;
}

/// Makes `uploads/<name>` and holds it (a shared flock): writes the
/// descriptor to `*fd`; the caller removes the directory, then closes it.
/// Errors: invalid, io.
pub export fn lx_cache_stage(c: ?*Cache, name: ?[*:0]const u8, fd: ?*i32) c_int {
    diag.clear();
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const n = name orelse return invalid("name is null", .{});
    const o = fd orelse return invalid("fd is null", .{});
    o.* = cache_admin.stage(h, std.mem.span(n)) catch |e| return code(e);
    return 0;
}

/// Writes the names of the staging directories no conversion holds, each
/// followed by a NUL, to `out` (`cap` bytes; what fits) and their bytes to
/// `*len`, and the count of held ones to `*live`. Errors: invalid, io.
pub export fn lx_cache_uploads(c: ?*Cache, out: ?[*]u8, cap: u64, len: ?*u64, live: ?*u64) c_int {
    diag.clear();
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const l = len orelse return invalid("len is null", .{});
    const v = live orelse return invalid("live is null", .{});
    if (cap > 0 and out == null) return invalid("out is null", .{});
    var n: usize = 0;
    const room: []u8 = if (cap > 0) out.?[0..@intCast(cap)] else &.{};
    cache_admin.uploads(h, room, &n, v) catch |e| return code(e);
    assert(n <= room.len); // whole names that fit, never a part of one past `cap`
    l.* = n;
    return 0;
}

/// Empties the cache into `<aside>` (a new name in the cache directory),
/// which the caller removes: refused while any process uses the cache.
/// Errors: invalid, busy (naming the processes), io.
pub export fn lx_cache_clear(c: ?*Cache, aside: ?[*:0]const u8) c_int {
    diag.clear();
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const a = aside orelse return invalid("aside is null", .{});
    cache_admin.clear(h, std.mem.span(a)) catch |e| return code(e);
    return 0;
}

/// Parses a store's meta as fetched (`len` bytes at `meta`) into `*out`.
/// Errors: not_a_store (no loaderx header), newer_format, corrupt (damaged,
/// uploaded with records not synced, larger than the cache replicates).
pub export fn lx_meta_parse(meta: ?[*]const u8, len: u64, out: ?*MetaInfo) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    if (len > 0 and meta == null) return invalid("meta is null", .{});
    const bytes: []const u8 = if (len > 0) meta.?[0..@intCast(len)] else &.{};
    o.* = cache_make.parseMeta(bytes) catch |e| return code(e);
    return 0;
}

/// Opens replica `spec.key` of cache `c` (made when missing or not whole:
/// see ReplicaSpec), claiming this process's slot. The replica stays open
/// until the cache's last lx_cache_close; opening it again returns the
/// same handle unless the directory holds a newer replica of the key.
/// Errors: invalid, not_found (meta null and no whole replica), those of
/// lx_meta_parse and lx_open, no_space and io (naming the cache).
pub export fn lx_replica_open(c: ?*Cache, spec: ?*const ReplicaSpec, out: ?*?*Replica) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    o.* = null;
    const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
    const s = spec orelse return invalid("spec is null", .{});
    const key = s.key orelse return invalid("spec.key is null", .{});
    if ((s.meta_len > 0 and s.meta == null) or (s.source_len > 0 and s.source == null) or
        (s.index_len > 0 and s.index == null)) return invalid("a spec pointer is null", .{});
    const meta: ?[]const u8 = if (s.meta) |m| m[0..@intCast(s.meta_len)] else null;
    const source: []const u8 = if (s.source) |x| x[0..@intCast(s.source_len)] else &.{};
    const index: ?[]const u8 = if (s.index) |x| x[0..@intCast(s.index_len)] else null;
    o.* = cache_make.openFromSpec(h, std.mem.span(key), meta, source, index, s.weak != 0) catch |e|
        return code(e);
    return 0;
}

/// Fills `*out` with replica `r`'s geometry and counters, or (`r` null)
/// those of replica `key` of cache `c`, opened without claiming a slot.
/// Errors: invalid, not_found, corrupt (its state), io.
pub export fn lx_replica_info(
    c: ?*Cache,
    key: ?[*:0]const u8,
    r: ?*Replica,
    out: ?*ReplicaInfo,
) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    const rep = if (r != null) replicaHandle(r) orelse
        return invalid("not a replica handle", .{}) else blk: {
        const h = cacheHandle(c) orelse return invalid("not a cache handle", .{});
        const k = key orelse return invalid("key is null", .{});
        break :blk Replica.lookup(h, std.mem.span(k), .{}) catch |e| return code(e);
    };
    o.* = rep.info();
    return 0;
}

/// Starts a read of `records[0..count]` through replica `r` and fills `*f`
/// (FETCH_STATUS, BEGIN_FLAGS): status done (every record present and
/// checked: read them, then lx_replica_end(f.tick)), ranges (fetch
/// `f.files`' ranges into the replica's index and data at their own
/// offsets, then lx_fetch_landed, or lx_fetch_failed when that failed),
/// or miss (BEGIN_WARM_ONLY: nothing started). A read's tick protects its
/// records from eviction until lx_replica_end; a prefetch's (BEGIN_PIN)
/// for the process's next 128 prefetches. Records outside the store are
/// skipped (the read that follows names them). The library keeps none of
/// the pointers; `f` is the caller's until status done. Errors: invalid,
/// busy (256 reads in flight in this process), no_space (the cache's file
/// system, after making room once), io; corrupt with f.bad_record (a
/// record's server bytes fail their checksum, fetched twice). After an
/// error nothing is reserved; a tick in `f.tick` is still in flight.
/// Ownership: while status is ranges, `f.plan` is the library's state and
/// `f.files` point into it: pass `f` to lx_fetch_landed or lx_fetch_failed
/// until status is done (the ranges stay reserved, for every process,
/// until then or until this process exits). Threads: any, one per fetch.
pub export fn lx_replica_begin(
    r: ?*Replica,
    records: ?[*]const u64,
    count: u64,
    flags: u32,
    f: ?*Fetch,
) c_int {
    diag.clear();
    const fetch = f orelse return invalid("f is null", .{});
    fetch.* = std.mem.zeroes(Fetch);
    const rep = replicaHandle(r) orelse return invalid("not a replica handle", .{});
    const recs = recordSlice(records, count) orelse
        return invalid("records: {d} records at null, or over 2^32", .{count});
    if (flags & ~@as(u32, 7) != 0) return invalid("unknown begin flags {d}", .{flags});
    cache_fetch.begin(rep, recs, flags, fetch) catch |e| return code(e);
    return 0;
}

/// The ranges of fetch `f`'s step landed in the replica's files: marks
/// them present (may evict), releases them, and moves `*f` on as
/// lx_replica_begin fills it (waiting for blocks another process was
/// fetching first). Errors: as lx_replica_begin's.
pub export fn lx_fetch_landed(f: ?*Fetch) c_int {
    diag.clear();
    const fetch = f orelse return invalid("f is null", .{});
    if (fetch.status != cache_fetch.Status.ranges)
        return invalid("the fetch has no step to land", .{});
    cache_fetch.landed(fetch) catch |e| return code(e);
    return 0;
}

/// Fetching the ranges of `f`'s step failed with errno `err` (0: not an
/// OS error): punches every range it was to write and releases them. A
/// full disk (ENOSPC, EDQUOT) makes room and plans the step again once
/// (status ranges: fetch again); then no_space. Otherwise the fetch ends
/// (status done; the caller raises its own error). Nothing to do for a
/// fetch without a step. Errors: no_space, io.
pub export fn lx_fetch_failed(f: ?*Fetch, err: c_int) c_int {
    diag.clear();
    const fetch = f orelse return invalid("f is null", .{});
    cache_fetch.failed(fetch, err) catch |e| return code(e);
    return 0;
}

/// The read of `tick` through replica `r` is over: its process's watermark
/// rises. A tick not in flight (0, a prefetch's, one ended) changes
/// nothing. Any thread, any time. Errors: invalid.
pub export fn lx_replica_end(r: ?*Replica, tick: u64) c_int {
    diag.clear();
    const rep = replicaHandle(r) orelse return invalid("not a replica handle", .{});
    rep.cache.end(tick);
    return 0;
}

/// lx_gather (payloads at `stride` bytes) of a remote store's records
/// through replica `r`, when every one is present and checked: the read's
/// start, the gather and its end in one call, taking no lock. `*read` is 1
/// when it read them, 0 (a miss) when it read nothing and left nothing in
/// flight: the caller then starts the read with lx_replica_begin. Errors:
/// those of lx_gather, and invalid for `r`.
pub export fn lx_gather_cached(
    r: ?*Replica,
    parts: ?[*]const Part,
    part_count: u32,
    indices: ?[*]const u64,
    count: u64,
    dest: ?[*]u8,
    dest_len: u64,
    stride: u64,
    lanes: u32,
    read: ?*u32,
) c_int {
    diag.clear();
    const done = read orelse return invalid("read is null", .{});
    done.* = 0;
    const rep = replicaHandle(r) orelse return invalid("not a replica handle", .{});
    const records = recordSlice(indices, count) orelse return invalid("indices is null", .{});
    const tick = (rep.beginWarm(records, false) catch |e| return code(e)) orelse return 0;
    assert(tick != 0); // 0 is no read: lx_replica_end ignores it
    defer rep.cache.end(tick);
    done.* = 1;
    const lx_gather = gather.lx_gather;
    return lx_gather(parts, part_count, indices, count, dest, dest_len, stride, null, 0, lanes);
}

/// Writes the data byte ranges of `records[0..count]` to `starts`/`ends`
/// (room for `count`). Errors: invalid (a record's index entry not in the
/// cache), out_of_range.
pub export fn lx_replica_spans(
    r: ?*Replica,
    records: ?[*]const u64,
    count: u64,
    starts: ?[*]u64,
    ends: ?[*]u64,
) c_int {
    diag.clear();
    const rep = replicaHandle(r) orelse return invalid("not a replica handle", .{});
    const recs = recordSlice(records, count) orelse return invalid("records is null", .{});
    if (count > 0 and (starts == null or ends == null))
        return invalid("starts or ends is null", .{});
    if (count == 0) return 0;
    rep.spans(recs, starts.?[0..recs.len], ends.?[0..recs.len]) catch |e| return code(e);
    return 0;
}

/// For the tests: every eviction of the node-local cache in this process
/// sleeps `ms` milliseconds after it dropped its first region (its lock
/// held, its sequence odd), so a test can kill the process mid-eviction.
/// 0 (the default) turns it off. Any thread.
pub export fn lx_debug_cache_pause(ms: u32) void {
    Cache.debug_evict_pause_ms.store(ms, .monotonic);
}

/// Writes to `*out` the stored bytes of `records[0..count]` (a loader's
/// prefetch budget): exact for a fixed layout and for records this
/// process checked, the store's mean otherwise. Errors: invalid.
pub export fn lx_replica_nbytes(
    r: ?*Replica,
    records: ?[*]const u64,
    count: u64,
    out: ?*u64,
) c_int {
    diag.clear();
    const rep = replicaHandle(r) orelse return invalid("not a replica handle", .{});
    const recs = recordSlice(records, count) orelse return invalid("records is null", .{});
    const o = out orelse return invalid("out is null", .{});
    o.* = rep.nbytes(recs);
    return 0;
}
