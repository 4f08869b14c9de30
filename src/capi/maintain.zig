//! The C ABI, keeping a store: delete and compact (which need the store to
//! themselves), its byte counts, sync, and verifying every record or some.
const std = @import("std");
const assert = std.debug.assert;
const capi = @import("../capi.zig");
const Store = @import("../Store.zig");

const Move = capi.Move;
const code = capi.code;
const invalid = capi.invalid;
const enter = capi.enter;
const storeHandle = capi.storeHandle;
const notAStore = capi.notAStore;
const gpa = capi.gpa;

/// Deletes records (any order, duplicates allowed) by the original swap-last
/// rule: in descending index order, each deleted index receives the current
/// last record, then the length drops by one (deleting {2, 3} from ten
/// records leaves [0,1,8,9,4,5,6,7]). Indices stay 0..len and are stable only
/// until a delete. Writes the net moves, ascending by `to`, to `moves` (room
/// for `count`; may be null) and their number to `*move_count`; every other
/// survivor keeps its index. Durable and atomic (see Durability).
/// Errors: closed, failed, out_of_range (nothing deleted), busy, locked,
/// read_only, io, no_space.
pub export fn lx_delete(
    handle: ?*Store,
    indices: ?[*]const u64,
    count: u64,
    moves: ?[*]Move,
    move_count: ?*u64,
) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const moved = move_count orelse return invalid("move_count is null", .{});
    moved.* = 0;
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const n: usize = @intCast(count);
    const own = moves == null;
    const out: [*]Move = moves orelse (gpa.alloc(Move, n) catch return code(error.OutOfMemory)).ptr;
    defer if (own) gpa.free(out[0..n]);
    moved.* = h.delete(idx[0..n], out[0..n]) catch |e| return code(e);
    assert(moved.* <= n); // a survivor moves only into a deleted index
    return 0;
}

/// Reclaims deleted bytes in place (see Durability). Errors: closed, failed,
/// busy, locked, read_only, io, no_space.
pub export fn lx_compact(handle: ?*Store) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    h.compact() catch |e| return code(e);
    return 0;
}

/// Fills `*out` with {records, live_bytes, chunk_bytes, reclaimable,
/// generation}; O(1).
/// Errors: closed, corrupt.
pub export fn lx_stats(handle: ?*Store, out: ?*Store.Stats) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const o = out orelse return invalid("out is null", .{});
    o.* = h.stats() catch |e| return code(e);
    return 0;
}

/// Makes every record appended through this handle durable (fsync of data,
/// table, then commit). A no-op for a handle that never wrote (or that a
/// forked child inherited). Errors: closed, failed (also from now on, when
/// the fsync fails: the kernel may have dropped the pages), io.
pub export fn lx_sync(handle: ?*Store) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    h.sync() catch |e| return code(e);
    return 0;
}

/// Checks every record (location, checksum, decode). On corrupt, `*bad_index`
/// is the first damaged record (UINT64_MAX when the damage is not one record's).
/// Errors: closed, failed, corrupt, busy, out_of_memory.
pub export fn lx_verify(handle: ?*Store, bad_index: ?*u64) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const bad = bad_index orelse return invalid("bad_index is null", .{});
    h.verify(bad) catch |e| return code(e);
    return 0;
}

/// Checks the records `indices[0..count]` (location, sizes, checksum; no
/// decode), for a cache that must check bytes it filled before serving them.
/// Writes the positions (into `indices`) of the records that fail to
/// `bad[0..]`, which holds `count` entries, and their number to `*bad_count`;
/// damaged records are not an error. Errors: closed, failed, out_of_range,
/// busy, corrupt (the commit), invalid.
pub export fn lx_verify_records(
    handle: ?*Store,
    indices: ?[*]const u64,
    count: u64,
    bad: ?[*]u64,
    bad_count: ?*u64,
) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const failed = bad_count orelse return invalid("bad_count is null", .{});
    failed.* = 0;
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const out = bad orelse return invalid("bad is null", .{});
    const n = h.verifyRecords(idx[0..@intCast(count)], out[0..@intCast(count)]) catch |e|
        return code(e);
    assert(n <= count); // positions into `indices`, each at most once
    failed.* = n;
    return 0;
}
