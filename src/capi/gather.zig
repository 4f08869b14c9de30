//! The C ABI, reading records: gathers over an index space of one or more
//! stores (its parts), into the caller's memory or a buffer the library
//! allocates, and the prefetch that brings records into memory ahead of a read.
const std = @import("std");
const capi = @import("../capi.zig");
const Store = @import("../Store.zig");
const store_parts = @import("../store_parts.zig");

const Part = capi.Part;
const code = capi.code;
const invalid = capi.invalid;
const enterParts = capi.enterParts;
const leaveParts = capi.leaveParts;
const partsOf = capi.partsOf;
const refuse = capi.refuse;
const gpa = capi.gpa;

/// Reads records `indices[0..count]` of the index space `parts` into `dest`
/// (`dest_len` bytes), decoding straight into it: record i goes to
/// `dest + offsets[i]` when `offsets` is not null, else to `dest + i *
/// stride` and must then be exactly `stride` bytes. `part` (Part kind) 0
/// reads payloads, 1 reads aux bytes. `lanes` caps the threads used (0 =
/// every usable core; small batches run on the caller alone). All indices and
/// sizes are checked before anything is written; every store is read from
/// one snapshot. Errors: closed, failed, out_of_range, size_mismatch,
/// corrupt, busy, invalid (parts not sorted from 0).
pub export fn lx_gather(
    parts: ?[*]const Part,
    part_count: u32,
    indices: ?[*]const u64,
    count: u64,
    dest: ?[*]u8,
    dest_len: u64,
    stride: u64,
    offsets: ?[*]const u64,
    part: c_int,
    lanes: u32,
) c_int {
    const ps = partsOf(parts, part_count) orelse return refuse();
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const d = dest orelse return invalid("dest is null", .{});
    const p = std.enums.fromInt(Store.Part, part) orelse
        return invalid("unknown part {d}", .{part});
    var scratch = store_parts.scratches.take();
    defer store_parts.scratches.give(&scratch, gpa);
    const sc = &scratch;
    store_parts.gather(gpa, ps, idx[0..@intCast(count)], .{
        .base = d,
        .len = @intCast(dest_len),
        .stride = @intCast(stride),
        .offsets = offsets,
    }, p, lanes, sc) catch |e| return code(e);
    return 0;
}

/// Reads records `indices[0..count]` of the index space `parts` back to back
/// into one new buffer that the library allocates: every payload in request
/// order, then every record's aux bytes in request order. Writes record i's
/// payload size to `raw_sizes[i]` and its aux size to `aux_sizes[i]`, the
/// buffer to `*out` and its length to `*out_len` (`*out` is null when the
/// length is 0). Sizes and bytes come from one snapshot of each store, so a
/// record is never stitched from two. The caller owns the buffer and frees
/// it with lx_free_buffer. Errors: closed, failed, out_of_range, corrupt,
/// busy, out_of_memory, invalid.
pub export fn lx_gather_alloc(
    parts: ?[*]const Part,
    part_count: u32,
    indices: ?[*]const u64,
    count: u64,
    lanes: u32,
    raw_sizes: ?[*]u64,
    aux_sizes: ?[*]u64,
    out: ?*?[*]u8,
    out_len: ?*u64,
) c_int {
    const ps = partsOf(parts, part_count) orelse return refuse();
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    const o = out orelse return invalid("out is null", .{});
    const ol = out_len orelse return invalid("out_len is null", .{});
    o.* = null;
    ol.* = 0;
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const raw = raw_sizes orelse return invalid("raw_sizes is null", .{});
    const aux = aux_sizes orelse return invalid("aux_sizes is null", .{});
    const n: usize = @intCast(count);
    var scratch = store_parts.scratches.take();
    defer store_parts.scratches.give(&scratch, gpa);
    const sc = &scratch;
    const buf = store_parts.gatherAlloc(
        gpa,
        ps,
        idx[0..n],
        lanes,
        raw[0..n],
        aux[0..n],
        sc,
    ) catch |e| return code(e);
    if (buf.len > 0) o.* = buf.ptr;
    ol.* = buf.len;
    return 0;
}

/// Brings records `indices[0..count]` of the index space `parts` into memory
/// ahead of a read, and returns once they are there: the loader's prefetch of
/// its next steps, and `prefetch()` of a local store. It reads (explicitly,
/// all at once, the records' exact byte ranges) only what a store's page
/// cache misses, and only for stores that reads found cold, plus a probe on
/// every 32nd call. `flags`: bit 0 checks every store regardless; bit 1
/// returns once the reads are queued, without waiting for them (a local
/// record is readable either way; a later read waits for what is still in
/// flight). A store whose records are in memory costs a few atomics per
/// call. Errors: closed, failed, out_of_range, busy, out_of_memory, invalid.
pub export fn lx_prefetch(
    parts: ?[*]const Part,
    part_count: u32,
    indices: ?[*]const u64,
    count: u64,
    flags: u32,
) c_int {
    const ps = partsOf(parts, part_count) orelse return refuse();
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    if (flags & ~@as(u32, 3) != 0) return invalid("unknown prefetch flags {d}", .{flags});
    var scratch = store_parts.scratches.take();
    defer store_parts.scratches.give(&scratch, gpa);
    const sc = &scratch;
    const force = flags & 1 != 0;
    const wait = flags & 2 == 0;
    store_parts.prefetch(gpa, ps, idx[0..@intCast(count)], force, wait, sc) catch |e|
        return code(e);
    return 0;
}
