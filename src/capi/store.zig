//! The C ABI, one store: open, close and free a handle, what it holds (its
//! length, header, identity and blobs), and appends.
const std = @import("std");
const assert = std.debug.assert;
const capi = @import("../capi.zig");
const Store = @import("../Store.zig");
const format = @import("../format.zig");
const codec = @import("../codec.zig");
const diag = @import("../diag.zig");

const Result = capi.Result;
const IdentitySpec = capi.IdentitySpec;
const Info = capi.Info;
const Blob = capi.Blob;
const code = capi.code;
const invalid = capi.invalid;
const enter = capi.enter;
const storeHandle = capi.storeHandle;
const notAStore = capi.notAStore;
const gpa = capi.gpa;

/// The identity `spec` names, its fields bounded (format.Identity.parse
/// checks the rest when the store is created); null with a message when
/// a field cannot even be represented.
fn identityOf(spec: *const IdentitySpec) ?format.Identity.Full {
    const Identity = format.Identity;
    const kind = std.enums.fromInt(format.Kind, spec.kind) orelse {
        diag.set("unknown store kind {d}", .{spec.kind});
        return null;
    };
    if (spec.ndim > Identity.ndim_max or spec.flags > std.math.maxInt(u16) or
        spec.descr_size > Identity.descr_size_max or spec.name_size > Identity.name_size_max)
    {
        const why = "the identity has out-of-range fields " ++
            "(ndim {d}, flags {d}, text sizes {d}, {d})";
        diag.set(why, .{ spec.ndim, spec.flags, spec.descr_size, spec.name_size });
        return null;
    }
    const missing_descr = spec.descr_size > 0 and spec.descr == null;
    if (missing_descr or (spec.name_size > 0 and spec.name == null)) {
        diag.set("the identity's descr or name is null", .{});
        return null;
    }
    var head = Identity.init(kind, @intCast(spec.descr_size), @intCast(spec.name_size));
    head.flags = @intCast(spec.flags);
    head.ndim = @intCast(spec.ndim);
    head.itemsize = spec.itemsize;
    head.item_shape = spec.item_shape;
    return .{
        .head = head,
        .descr = if (spec.descr) |d| d[0..@intCast(spec.descr_size)] else "",
        .name = if (spec.name) |n| n[0..@intCast(spec.name_size)] else "",
    };
}

/// Opens the store in directory `path` (NUL-terminated). With `create` != 0 a
/// missing store is created (with any missing parent directories) with
/// `codec` (Codec: raw, zstd, zstd_dict), `level` (zstd level; 0 = default
/// 3; 19 for zstd_dict), dictionary `dict` (zstd_dict only, required) and the
/// type identity `identity` (null: none, a plain byte store; checked in
/// full, else invalid); these are ignored when the store exists (compare
/// them with lx_info and lx_identity). `fixed_size` != 0 (raw codec only,
/// a dense identity of exactly that record size) creates the fixed-width layout:
/// every record exactly that many bytes, found by arithmetic instead of a
/// table lookup, 4 bytes of index per record. `frame_size` != 0 (zstd codecs
/// only, 64 B to 1 GiB) writes records longer than that many bytes in the
/// seekable format: frames of `frame_size` raw bytes and a seek table, so a
/// token window decodes only the frames it reads (format.zig). Files inside the store are
/// opened without following symlinks. An open may finish a delete a crash
/// interrupted, or check the records a dead writer appended after its last
/// sync (see Durability). Errors: not_found, not_a_store, corrupt,
/// newer_format, busy (a delete/compact is running, or an unfinished delete
/// waits for another handle to close), locked, read_only, bad_dictionary,
/// invalid, io, no_space. On success `*out` owns the handle until lx_free.
pub export fn lx_open(
    path: ?[*:0]const u8,
    create: c_int,
    codec_id: c_int,
    level: c_int,
    dict: ?[*]const u8,
    dict_len: u64,
    identity: ?*const IdentitySpec,
    fixed_size: u64,
    frame_size: u64,
    out: ?*?*Store,
) c_int {
    diag.clear();
    const p = path orelse return invalid("path is null", .{});
    const o = out orelse return invalid("out is null", .{});
    o.* = null;
    const c = std.enums.fromInt(format.Codec, codec_id) orelse
        return invalid("unknown codec {d}", .{codec_id});
    if (dict_len > 0 and dict == null) return invalid("dict is null", .{});
    const ident: ?format.Identity.Full = if (identity) |spec|
        identityOf(spec) orelse return @backingInt(Result.invalid)
    else
        null;
    const s = Store.open(gpa, std.mem.span(p), .{
        .create = create != 0,
        .codec = c,
        .level = if (level != 0)
            level
        else if (c == .zstd_dict)
            codec.level_default_dict
        else
            codec.level_default,
        .dict = if (dict) |d| d[0..@intCast(dict_len)] else &.{},
        .identity = ident,
        .fixed_size = fixed_size,
        .frame_size = frame_size,
    }) catch |e| return code(e);
    assert(storeHandle(s) == s); // live until lx_free
    o.* = s;
    return 0;
}

/// Marks the handle closed: later calls return closed. The files are unmapped
/// and closed, and the writer lock released, when the last call in flight on
/// another thread returns (at once when there is none) or, if a loader ring
/// reads the store, when the ring is freed. Does not sync. Idempotent.
pub export fn lx_close(h: ?*Store) void {
    if (storeHandle(h)) |s| s.shutdown();
}

/// Closes the handle (as lx_close) and frees it. Call once, when no thread
/// can pass `h` any more.
pub export fn lx_free(h: ?*Store) void {
    if (storeHandle(h)) |s| {
        s.shutdown();
        s.unhold();
    }
}

/// Writes the number of committed records (0..len are live) to `*out`.
/// Errors: closed, failed, corrupt (the published commit is unreadable).
pub export fn lx_len(handle: ?*Store, out: ?*u64) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const o = out orelse return invalid("out is null", .{});
    o.* = h.recordCount() catch |e| return code(e);
    return 0;
}

/// Fills `*out` with the store's identity. Errors: closed.
pub export fn lx_info(handle: ?*Store, out: ?*Info) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const o = out orelse return invalid("out is null", .{});
    o.* = .{
        .codec = @backingInt(h.codecOf()),
        .level = h.header.level,
        .format_version = h.header.format_version,
        .writable = @intFromBool(h.writable),
        .dict_size = h.header.dict_size,
        .user_size = h.header.user_size,
        .fixed_size = h.header.fixed_size,
        .frame_size = h.header.frame_size,
        .uid = h.header.uid,
    };
    return 0;
}

/// Fills `*out` with the store's type identity (see IdentitySpec; read its
/// texts with lx_blob). Errors: closed.
pub export fn lx_identity(handle: ?*Store, out: ?*IdentitySpec) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const o = out orelse return invalid("out is null", .{});
    const id = h.identity.head;
    o.* = std.mem.zeroes(IdentitySpec);
    o.encoding = @backingInt(h.identity_encoding);
    if (h.identity_encoding != .native) return 0;
    // Checked at open (format.Identity.parse): the texts are the sizes it states.
    assert(h.identity.descr.len == id.descr_size and h.identity.name.len == id.name_size);
    o.kind = id.kind;
    o.flags = id.flags;
    o.ndim = id.ndim;
    o.itemsize = id.itemsize;
    o.item_shape = id.item_shape;
    o.descr_size = id.descr_size;
    o.name_size = id.name_size;
    return 0;
}

/// Copies the store's blob `which` (Blob) into `out` (`cap` bytes) when it
/// fits, and writes its size to `*len` either way (call with cap 0 to size
/// the buffer). Errors: closed, invalid (unknown blob, out null with cap > 0).
pub export fn lx_blob(handle: ?*Store, which: c_int, out: ?[*]u8, cap: u64, len: ?*u64) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const n = len orelse return invalid("len is null", .{});
    const w = std.enums.fromInt(Blob, which) orelse return invalid("unknown blob {d}", .{which});
    const b = switch (w) {
        .dictionary => h.dictionary(),
        .user => h.userBlob(),
        .dtype_descr => h.identity.descr,
        .dtype_name => h.identity.name,
    };
    n.* = b.len;
    if (cap >= b.len and b.len > 0) {
        const o = out orelse return invalid("out is null", .{});
        @memcpy(o[0..b.len], b);
    }
    return 0;
}

/// Appends `count` records: record i is `sizes[i]` bytes at `ptrs[i]`, with
/// optional raw aux bytes `aux_sizes[i]` (<= 65535) at `aux_ptrs[i]` (both
/// null for none). Writes the first new index to `*first`. Compresses on all
/// usable cores; records that do not shrink are stored raw. With `stage` != 0
/// the records are written but stay invisible until `lx_publish`, so several
/// calls can form one atomic append. Errors: closed, failed, locked,
/// read_only, invalid, size_mismatch, no_space, io, out_of_memory (nothing is
/// committed then).
pub export fn lx_append(
    handle: ?*Store,
    count: u64,
    ptrs: ?[*]const [*]const u8,
    sizes: ?[*]const u64,
    aux_ptrs: ?[*]const [*]const u8,
    aux_sizes: ?[*]const u64,
    stage: c_int,
    first: ?*u64,
) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const f = first orelse return invalid("first is null", .{});
    if (count > 0 and (ptrs == null or sizes == null)) return invalid("ptrs or sizes is null", .{});
    if ((aux_ptrs == null) != (aux_sizes == null)) {
        return invalid("aux_ptrs and aux_sizes must both be given or both be null", .{});
    }
    const empty: [*]const [*]const u8 = @ptrFromInt(@alignOf([*]const u8));
    f.* = h.append(.{
        .ptrs = ptrs orelse empty,
        .sizes = sizes orelse @ptrFromInt(@alignOf(u64)),
        .aux_ptrs = aux_ptrs,
        .aux_sizes = aux_sizes,
        .count = @intCast(count),
    }, stage != 0) catch |e| return code(e);
    return 0;
}

/// Publishes the records of staged appends (`keep` != 0) or drops them
/// (`keep` == 0, e.g. after an error). While records are staged, delete and
/// compact return busy. Errors: closed, failed, io.
pub export fn lx_publish(handle: ?*Store, keep: c_int) c_int {
    const h = storeHandle(handle) orelse return notAStore();
    if (enter(h)) |rc| return rc;
    defer h.leave();
    h.publish(keep != 0) catch |e| return code(e);
    return 0;
}
