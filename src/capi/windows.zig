//! The C ABI, token windows (src/windows.zig): a corpus's prefix sums, its
//! delete epoch, and reading windows of tokens with their document ordinals.
const std = @import("std");
const capi = @import("../capi.zig");
const Store = @import("../Store.zig");
const windows = @import("../windows.zig");

const Part = capi.Part;
const WindowsSpec = capi.WindowsSpec;
const code = capi.code;
const invalid = capi.invalid;
const enter = capi.enter;
const enterParts = capi.enterParts;
const leaveParts = capi.leaveParts;
const partsOf = capi.partsOf;
const refuse = capi.refuse;
const storeHandle = capi.storeHandle;
const notAStore = capi.notAStore;
const gpa = capi.gpa;

/// Writes the prefix sums of a token corpus to `out[0..docs+1]`: the
/// documents are records [0, docs) of store `h`, 1-D records of
/// `itemsize`-byte tokens; `has_separator` != 0 counts one separator token
/// after every document but the last; a fixed-width store of `itemsize`-byte
/// records (single tokens) is one document (`docs` 1, and its part in
/// lx_windows_gather starts at that document's number, not a record's).
/// Reads the
/// store's windows.idx where it is valid (copied in and checked, never
/// trusted: a damaged, foreign or stale one is ignored) and the record table
/// for the rest, O(documents it does not cover); rewrites windows.idx,
/// durably, when the store's durable records reach past it and the directory
/// is writable (failures to write it are ignored). Errors: closed, failed,
/// out_of_range (docs > the store's records), size_mismatch (a record is not
/// 1-D), corrupt, invalid.
pub export fn lx_windows_index(
    handle: ?*Store,
    itemsize: u32,
    has_separator: c_int,
    out: ?[*]u64,
    docs: u64,
) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const o = out orelse return invalid("out is null", .{});
    switch (itemsize) {
        1, 2, 4, 8 => {},
        else => return invalid("tokens of {d} bytes are not supported", .{itemsize}),
    }
    if (docs >= std.math.maxInt(u64) / 8) return invalid("docs {d} is too large", .{docs});
    const prefix = o[0..@intCast(docs + 1)];
    windows.index(gpa, h, itemsize, has_separator != 0, prefix) catch |e| return code(e);
    return 0;
}

/// Writes to `*out` the delete epoch of the index space `parts`: the sum of
/// its stores' counts of deletes through those handles (lx_windows_t.epoch).
/// Read it before building a corpus's prefix sums: a delete after that
/// changes it, and every lx_windows_gather of the corpus then fails with
/// size_mismatch. Errors: closed, invalid.
pub export fn lx_windows_epoch(parts: ?[*]const Part, part_count: u32, out: ?*u64) c_int {
    const ps = partsOf(parts, part_count) orelse return refuse();
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    const o = out orelse return invalid("out is null", .{});
    o.* = windows.epochOf(ps);
    return 0;
}

/// Reads windows `indices[0..count]` of corpus `spec` (its documents in
/// `parts`) into `tokens` (count * (seq_len + 1) tokens) and their document
/// ordinals into `segments` (count * (seq_len + 1) int32); either may be
/// null. Raw documents are copied from the store's mapping, compressed ones
/// decoded once per call. Errors: closed, failed, out_of_range,
/// size_mismatch (the store changed since the index was built), corrupt,
/// invalid.
pub export fn lx_windows_gather(
    spec: ?*const WindowsSpec,
    parts: ?[*]const Part,
    part_count: u32,
    indices: ?[*]const u64,
    count: u64,
    tokens: ?[*]u8,
    segments: ?[*]i32,
    lanes: u32,
) c_int {
    const ps = partsOf(parts, part_count) orelse return refuse();
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    const sp = spec orelse return invalid("spec is null", .{});
    windows.checkSpec(sp.*) catch |e| return code(e);
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    var scratch = windows.scratches.take();
    defer windows.scratches.give(&scratch, gpa);
    const sc = &scratch;
    const o: windows.Out = .{ .tokens = tokens, .segments = segments };
    windows.gather(gpa, sp.*, ps, idx[0..@intCast(count)], o, lanes, sc) catch |e| return code(e);
    return 0;
}
