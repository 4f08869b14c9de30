//! The C ABI of libloaderx: the only file that exports symbols. Read it as the
//! library's header. loaderx/_abi.py (the cffi declarations and every shared
//! constant) is generated from this file by `zig build bindings`
//! (src/gen_bindings.zig); tests/project/test_abi.py regenerates it and fails on any
//! difference, and checks that the library exports nothing else.
//!
//! Conventions for every function below:
//! - Results are `lx_result` codes: 0 is success, negative is an error. After
//!   an error, `lx_last_error()` returns a message naming what was wrong (the
//!   offending index, size, file); it is thread-local and valid until the next
//!   failing call on the same thread.
//! - Store handles (`lx_store*`) are opaque, created by `lx_open`. Any number
//!   of threads may call any function on one handle at once, `lx_close`
//!   included: each call counts itself in and out, `lx_close` only marks the
//!   handle closed (later calls return LX_CLOSED), and the files are unmapped
//!   and closed when the last call in flight returns. The handle's memory is
//!   freed by `lx_free`, which the opener calls once, when no other thread
//!   can still pass the handle (Python: when the handle object is collected).
//!   `lx_delete` and `lx_compact` need exclusive use of the store: they return
//!   LX_BUSY (changing nothing) while another handle has the store open or a
//!   gather is running on this one.
//! - A handle inherited by a forked child reads normally but never writes: its
//!   mutations return LX_LOCKED (the writer lock is the parent's) and its
//!   `lx_sync` does nothing. A child that writes opens the store itself. The
//!   library's `pthread_atfork` child handler gives the child its own shared
//!   lock on every inherited store (so the parent's delete and compact return
//!   LX_BUSY while the child has it open; a fork during the parent's own
//!   delete or compact waits in fork() until it is done) and closes the
//!   child's copy of the writer lock.
//! - After an error that leaves a handle unsure of what is on disk (a failed
//!   fsync or commit write, a failure inside delete or compact after it began
//!   changing records), every later call on it but lx_close/lx_free returns
//!   LX_FAILED; the next open of the store finishes or rolls back the
//!   interrupted operation.
//! - Loader rings (`lx_loader*`) are opaque too, created by `lx_loader_open`
//!   and freed by `lx_loader_free`; they keep the stores they read alive.
//! - Sizes and indices are uint64. Pointers to caller memory are only read or
//!   written during the call; the library keeps none of them, except what
//!   `lx_loader_open` is given (a dense column's `out` buffers, which the
//!   ring's threads write until lx_loader_stop returned; parts' `rows`; the
//!   window indices), which must stay valid until lx_loader_free.
//!   Memory the library returns (lx_pool_alloc, lx_gather_alloc, and every
//!   column of a loader step from lx_loader_wait) belongs to the caller, who
//!   frees it with lx_free_buffer (or lx_free_buffer_at), from any thread;
//!   it comes from the output pool (outbuf.zig), so it must not be freed
//!   any other way. Until a buffer is handed over, the library owns it: a
//!   loader frees a step's buffers only once its threads stopped writing.
//!
//! Durability, per operation (what survives what):
//! - lx_append: atomic. It writes data, then the record table, then one commit
//!   write; a process crash (kill -9) at any instant leaves a store that opens
//!   and holds a committed prefix, byte-exact. Not durable against a power
//!   loss until lx_sync.
//! - lx_sync: makes every record appended through the handle survive a power
//!   loss (fsync of data, then table, then the commit). After a power loss,
//!   records appended after the last sync may be missing: the first open after
//!   a writer died without syncing checks them and keeps the longest intact
//!   prefix (O(records since the last sync)).
//! - lx_delete, lx_compact: sync first, and are durable when they return.
//!   Atomic: a crash or power loss during a delete leaves the store as before
//!   it or as after it (the next writable open finishes it from its fsynced
//!   journal); during a compact, every record stays readable and a second
//!   compact finishes the job.
//! - lx_open with create: the new store (its directory entries included) is
//!   durable when lx_open returns.
//! - lx_close does not sync (Python's close() calls lx_sync first).
const std = @import("std");
const builtin = @import("builtin");
const Store = @import("Store.zig");
const format = @import("format.zig");
const codec = @import("codec.zig");
const outbuf = @import("outbuf.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const sampler = @import("sampler.zig");
const mixture = @import("mixture.zig");
const fsio = @import("fsio.zig");
const Loader = @import("Loader.zig");
const store_maintain = @import("store_maintain.zig");
const store_parts = @import("store_parts.zig");
const windows = @import("windows.zig");
const image_plan = @import("image/plan.zig");
const image = @import("image/stage.zig");
const jpeg = @import("image/jpeg.zig");
const Cache = @import("Cache.zig");
const Replica = @import("Replica.zig");
const cache_fetch = @import("cache_fetch.zig");
const cache_make = @import("cache_make.zig");
const cache_admin = @import("cache_admin.zig");

comptime {
    // The ABI passes sizes as uint64 and hands them to zstd as size_t.
    std.debug.assert(@sizeOf(usize) == 8);
}

pub const version_major = 3;
pub const version_minor = 0;
pub const version_patch = 0;

/// lx_result: every code a function here can return.
pub const Result = enum(c_int) {
    ok = 0,
    /// An operating-system I/O error (message names the file and the error).
    io = -1,
    /// A bad argument (unknown codec, level out of range, null pointer, ...).
    invalid = -2,
    /// No store at the path (and create was not asked for).
    not_found = -3,
    /// The path holds something that is not a loaderx store.
    not_a_store = -4,
    /// The store is damaged (truncated file, checksum mismatch, bad record).
    corrupt = -5,
    /// The store was written by a newer format version.
    newer_format = -6,
    /// Another handle holds the store's writer lock (or this handle belongs
    /// to the process that forked this one).
    locked = -7,
    /// Exclusive access (delete/compact) refused: other handles or gathers.
    busy = -8,
    /// A record index is >= the number of records.
    out_of_range = -9,
    out_of_memory = -10,
    /// A destination is too small or a record has an unexpected size.
    size_mismatch = -11,
    /// A missing, unexpected or invalid zstd dictionary.
    bad_dictionary = -12,
    /// The store cannot be written (permissions, read-only file system).
    read_only = -13,
    /// The disk is full.
    no_space = -14,
    /// The store handle (or loader, or a store it reads) was closed.
    closed = -15,
    /// An earlier error left this handle unusable; reopen the store.
    failed = -16,
    /// A record is not an image the image stage decodes, or a damaged one.
    bad_image = -17,
};

fn code(err: Loader.Error) c_int {
    const r: Result = switch (err) {
        error.IoFailed => .io,
        error.InvalidArgument => .invalid,
        error.NotFound => .not_found,
        error.NotAStore => .not_a_store,
        error.Corrupt => .corrupt,
        error.NewerFormat => .newer_format,
        error.Locked => .locked,
        error.Busy => .busy,
        error.OutOfRange => .out_of_range,
        error.OutOfMemory => .out_of_memory,
        error.SizeMismatch => .size_mismatch,
        error.BadDictionary => .bad_dictionary,
        error.ReadOnly => .read_only,
        error.NoSpace => .no_space,
        error.Closed => .closed,
        error.Failed => .failed,
        error.BadImage => .bad_image,
    };
    return @backingInt(r);
}

fn invalid(comptime fmt: []const u8, args: anytype) c_int {
    diag.set(fmt, args);
    return @backingInt(Result.invalid);
}

fn io(comptime fmt: []const u8, args: anytype) c_int {
    diag.set(fmt, args);
    return @backingInt(Result.io);
}

/// Counts a call on `h` in (the caller defers h.leave()); a result code when
/// the handle is closed.
fn enter(h: *Store) ?c_int {
    diag.clear();
    h.enter() catch |e| return code(e);
    return null;
}

const gpa = std.heap.c_allocator;

/// Library version as (major << 16) | (minor << 8) | patch.
pub export fn lx_version() u32 {
    return (version_major << 16) | (version_minor << 8) | version_patch;
}

/// The on-disk format version this library writes. It reads this one and
/// every version from format.format_version_min (2) on.
pub export fn lx_format_version() u32 {
    return format.format_version;
}

/// The version of the zstd compiled in, as zstd's ZSTD_versionNumber().
pub export fn lx_zstd_version() u32 {
    return codec.versionNumber();
}

/// A static description of a result code (never null).
pub export fn lx_strerror(result: c_int) [*:0]const u8 {
    const r = std.enums.fromInt(Result, result) orelse return "unknown error";
    return switch (r) {
        .ok => "ok",
        .io => "I/O error",
        .invalid => "invalid argument",
        .not_found => "store not found",
        .not_a_store => "not a loaderx store",
        .corrupt => "store is damaged",
        .newer_format => "store format is newer than this library",
        .locked => "store is locked by another writer",
        .busy => "store is busy",
        .out_of_range => "index out of range",
        .out_of_memory => "out of memory",
        .size_mismatch => "size mismatch",
        .bad_dictionary => "bad dictionary",
        .read_only => "store is read-only",
        .no_space => "no space left on device",
        .closed => "closed",
        .failed => "handle failed after an earlier error; reopen the store",
        .bad_image => "not an image the image stage decodes",
    };
}

/// The calling thread's message for its last failed call (never null).
pub export fn lx_last_error() [*:0]const u8 {
    return diag.get();
}

/// lx_identity_t: a store's type identity (format.zig, `Identity`), as
/// lx_open takes it and lx_identity gives it.
pub const IdentitySpec = extern struct {
    /// format.Kind: 0 bytes, 1 dense, 2 ragged.
    kind: u32,
    /// format.Identity.Flags bits (1: dtype_by_name).
    flags: u32,
    /// lx_identity only: how the store keeps it (format.Identity.Encoding:
    /// 0 none, 1 native, 2 msgpack in a format-2 store, whose bytes
    /// lx_blob's `user` gives; every other field is then 0). lx_open ignores it.
    encoding: u32,
    /// Dimensions of a dense record's shape (at most 32).
    ndim: u32,
    /// Bytes of one dtype element.
    itemsize: u64,
    /// A dense record's shape: item_shape[0..ndim], then zeros.
    item_shape: [format.Identity.ndim_max]u64,
    /// lx_open: the dtype description (numpy's, as a Python literal in
    /// printable ASCII, see format.zig) and the dtype name, `descr_size` and
    /// `name_size` bytes. lx_identity writes the sizes and leaves the
    /// pointers null: lx_blob copies the texts.
    descr: ?[*]const u8,
    descr_size: u64,
    name: ?[*]const u8,
    name_size: u64,

    comptime {
        std.debug.assert(@sizeOf(IdentitySpec) == 312);
        std.debug.assert(@alignOf(IdentitySpec) == 8);
    }
};

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
    o.* = s;
    return 0;
}

/// Marks the handle closed: later calls return closed. The files are unmapped
/// and closed, and the writer lock released, when the last call in flight on
/// another thread returns (at once when there is none) or, if a loader ring
/// reads the store, when the ring is freed. Does not sync. Idempotent.
pub export fn lx_close(h: ?*Store) void {
    if (h) |s| s.shutdown();
}

/// Closes the handle (as lx_close) and frees it. Call once, when no thread
/// can pass `h` any more.
pub export fn lx_free(h: ?*Store) void {
    if (h) |s| {
        s.shutdown();
        s.unhold();
    }
}

/// Writes the number of committed records (0..len are live) to `*out`.
/// Errors: closed, failed, corrupt (the published commit is unreadable).
pub export fn lx_len(h: *Store, out: *u64) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    out.* = h.recordCount() catch |e| return code(e);
    return 0;
}

pub const Info = extern struct {
    codec: u32,
    level: i32,
    format_version: u32,
    writable: u32,
    dict_size: u64,
    user_size: u64,
    /// Non-zero: the fixed-width layout, every record exactly this many bytes.
    fixed_size: u64,
    /// Non-zero: longer records are written seekable, in frames of this many bytes.
    frame_size: u64,
    /// The random id written at create (never 0; 0: a store written before
    /// format.Header had one). Copies of the store's files keep it: it names
    /// the records, not the place (a subset's checkpoint fingerprint uses it).
    uid: u64,

    comptime {
        std.debug.assert(@sizeOf(Info) == 56);
        std.debug.assert(@alignOf(Info) == 8);
    }
};

/// Fills `*out` with the store's identity. Errors: closed.
pub export fn lx_info(h: *Store, out: *Info) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    out.* = .{
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
pub export fn lx_identity(h: *Store, out: *IdentitySpec) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const id = h.identity.head;
    out.* = std.mem.zeroes(IdentitySpec);
    out.encoding = @backingInt(h.identity_encoding);
    if (h.identity_encoding != .native) return 0;
    out.kind = id.kind;
    out.flags = id.flags;
    out.ndim = id.ndim;
    out.itemsize = id.itemsize;
    out.item_shape = id.item_shape;
    out.descr_size = id.descr_size;
    out.name_size = id.name_size;
    return 0;
}

/// Which stored blob lx_blob copies.
pub const Blob = enum(c_int) {
    /// The zstd dictionary (zstd_dict stores).
    dictionary = 0,
    /// The stored identity as it is: the native struct with its texts, or a
    /// format-2 store's msgpack.
    user = 1,
    /// The native identity's dtype description (empty for other stores).
    dtype_descr = 2,
    /// The native identity's dtype name (empty for other stores).
    dtype_name = 3,
};

/// Copies the store's blob `which` (Blob) into `out` (`cap` bytes) when it
/// fits, and writes its size to `*len` either way (call with cap 0 to size
/// the buffer). Errors: closed, invalid (unknown blob, out null with cap > 0).
pub export fn lx_blob(h: *Store, which: c_int, out: ?[*]u8, cap: u64, len: *u64) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    const w = std.enums.fromInt(Blob, which) orelse return invalid("unknown blob {d}", .{which});
    const b = switch (w) {
        .dictionary => h.dictionary(),
        .user => h.userBlob(),
        .dtype_descr => h.identity.descr,
        .dtype_name => h.identity.name,
    };
    len.* = b.len;
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
    h: *Store,
    count: u64,
    ptrs: ?[*]const [*]const u8,
    sizes: ?[*]const u64,
    aux_ptrs: ?[*]const [*]const u8,
    aux_sizes: ?[*]const u64,
    stage: c_int,
    first: *u64,
) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    if (count > 0 and (ptrs == null or sizes == null)) return invalid("ptrs or sizes is null", .{});
    if ((aux_ptrs == null) != (aux_sizes == null)) {
        return invalid("aux_ptrs and aux_sizes must both be given or both be null", .{});
    }
    const empty: [*]const [*]const u8 = @ptrFromInt(@alignOf([*]const u8));
    first.* = h.append(.{
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
pub export fn lx_publish(h: *Store, keep: c_int) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    h.publish(keep != 0) catch |e| return code(e);
    return 0;
}

/// A part of an index space: `store` holds the records from index `first`
/// up to the next part's `first` (or its own length). One store is the
/// part {store, 0}; a ShardSet's shards are parts in order.
pub const Part = store_parts.Part;

/// Counts a call in on every part's store; a result code when one is closed
/// (the caller defers leaveParts).
fn enterParts(parts: []const Part) ?c_int {
    diag.clear();
    for (parts, 0..) |p, i| {
        p.store.enter() catch |e| {
            leaveParts(parts[0..i]);
            return code(e);
        };
    }
    return null;
}

fn leaveParts(parts: []const Part) void {
    for (parts) |p| p.store.leave();
}

/// The parts of a gather, checked: 1 to 65535, sorted by `first` from 0.
fn partsOf(parts: ?[*]const Part, part_count: u32) ?[]const Part {
    const p = parts orelse return null;
    if (part_count == 0 or part_count > store_parts.parts_max) return null;
    const slice = p[0..part_count];
    if (slice[0].first != 0) return null;
    for (slice[1..], slice[0 .. slice.len - 1]) |b, a| if (b.first <= a.first) return null;
    return slice;
}

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
    const ps = partsOf(parts, part_count) orelse
        return invalid("parts must be 1 to {d}, sorted by first from 0", .{store_parts.parts_max});
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const d = dest orelse return invalid("dest is null", .{});
    const p = std.enums.fromInt(Store.Part, part) orelse
        return invalid("unknown part {d}", .{part});
    const sc = store_parts.threadScratch();
    defer store_parts.releaseThreadScratch(gpa);
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
    out: *?[*]u8,
    out_len: *u64,
) c_int {
    const ps = partsOf(parts, part_count) orelse
        return invalid("parts must be 1 to {d}, sorted by first from 0", .{store_parts.parts_max});
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    out.* = null;
    out_len.* = 0;
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const raw = raw_sizes orelse return invalid("raw_sizes is null", .{});
    const aux = aux_sizes orelse return invalid("aux_sizes is null", .{});
    const n: usize = @intCast(count);
    const sc = store_parts.threadScratch();
    defer store_parts.releaseThreadScratch(gpa);
    const buf = store_parts.gatherAlloc(
        gpa,
        ps,
        idx[0..n],
        lanes,
        raw[0..n],
        aux[0..n],
        sc,
    ) catch |e| return code(e);
    if (buf.len > 0) out.* = buf.ptr;
    out_len.* = buf.len;
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
    const ps = partsOf(parts, part_count) orelse
        return invalid("parts must be 1 to {d}, sorted by first from 0", .{store_parts.parts_max});
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    if (flags & ~@as(u32, 3) != 0) return invalid("unknown prefetch flags {d}", .{flags});
    const sc = store_parts.threadScratch();
    defer store_parts.releaseThreadScratch(gpa);
    const force = flags & 1 != 0;
    const wait = flags & 2 == 0;
    store_parts.prefetch(gpa, ps, idx[0..@intCast(count)], force, wait, sc) catch |e|
        return code(e);
    return 0;
}

/// Frees a buffer the library handed out (lx_pool_alloc, lx_gather_alloc,
/// lx_loader_wait; null is ignored). Any thread; a large one goes back to
/// the output pool for reuse.
pub export fn lx_free_buffer(buf: ?[*]u8) void {
    outbuf.free(buf);
}

/// lx_free_buffer(*at), then sets *at to null: the destructor of an owner
/// slot that a call filled (Python wraps buffers this way, so that no
/// Python code runs when one is freed).
pub export fn lx_free_buffer_at(at: ?*?[*]u8) void {
    const slot = at orelse return;
    outbuf.free(slot.*);
    slot.* = null;
}

// ---------------------------------------------------------------- output pool

/// lx_pool_stats_t.
pub const PoolStats = outbuf.Stats;

// The library has one output pool (src/outbuf.zig), which serves every buffer
// it hands out; these calls reach it. There is no call to make another: the
// library never needed one, only tests did (the native tests make pools of
// their own inside outbuf.zig).

/// Writes to `*out` a buffer of at least `size` bytes from the output pool:
/// page aligned from the pool's min_bytes on (2 MiB aligned from 2 MiB),
/// uninitialised. The caller frees it with lx_free_buffer. Any thread.
/// Errors: out_of_memory.
pub export fn lx_pool_alloc(size: u64, out: ?*?[*]u8) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    o.* = outbuf.allocExact(&outbuf.default_pool, @intCast(size)) orelse {
        diag.set("no memory for {d} bytes", .{size});
        return @backingInt(Result.out_of_memory);
    };
    return 0;
}

/// Sets the output pool's bounds: at most `max_idle_bytes` of returned
/// buffers kept for reuse (idle buffers over a lowered cap are unmapped now;
/// 0 keeps none), requests below `min_bytes` plain malloc.
pub export fn lx_pool_configure(max_idle_bytes: u64, min_bytes: u64) void {
    outbuf.configure(&outbuf.default_pool, @intCast(max_idle_bytes), @intCast(min_bytes));
}

/// The output pool's counters (buffers created, reused, returned, unmapped;
/// idle bytes and blocks; the bounds): how a caller sees that batches reuse
/// memory instead of faulting in fresh pages.
pub export fn lx_pool_stats(out: *PoolStats) void {
    out.* = outbuf.stats(&outbuf.default_pool);
}

/// One record's move in a delete: the survivor at index `from` is now at `to`.
pub const Move = store_maintain.Move;

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
    h: *Store,
    indices: ?[*]const u64,
    count: u64,
    moves: ?[*]Move,
    move_count: *u64,
) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    move_count.* = 0;
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const n: usize = @intCast(count);
    const own = moves == null;
    const out: [*]Move = moves orelse (gpa.alloc(Move, n) catch return code(error.OutOfMemory)).ptr;
    defer if (own) gpa.free(out[0..n]);
    move_count.* = h.delete(idx[0..n], out[0..n]) catch |e| return code(e);
    return 0;
}

/// Reclaims deleted bytes in place (see Durability). Errors: closed, failed,
/// busy, locked, read_only, io, no_space.
pub export fn lx_compact(h: *Store) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    h.compact() catch |e| return code(e);
    return 0;
}

/// Fills `*out` with {records, live_bytes, chunk_bytes, reclaimable,
/// generation}; O(1).
/// Errors: closed, corrupt.
pub export fn lx_stats(h: *Store, out: *Store.Stats) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    out.* = h.stats() catch |e| return code(e);
    return 0;
}

/// Makes every record appended through this handle durable (fsync of data,
/// table, then commit). A no-op for a handle that never wrote (or that a
/// forked child inherited). Errors: closed, failed (also from now on, when
/// the fsync fails: the kernel may have dropped the pages), io.
pub export fn lx_sync(h: *Store) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    h.sync() catch |e| return code(e);
    return 0;
}

/// Checks every record (location, checksum, decode). On corrupt, `*bad_index`
/// is the first damaged record (UINT64_MAX when the damage is not one record's).
/// Errors: closed, failed, corrupt, busy, out_of_memory.
pub export fn lx_verify(h: *Store, bad_index: *u64) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    h.verify(bad_index) catch |e| return code(e);
    return 0;
}

/// Checks the records `indices[0..count]` (location, sizes, checksum; no
/// decode), for a cache that must check bytes it filled before serving them.
/// Writes the positions (into `indices`) of the records that fail to
/// `bad[0..]`, which holds `count` entries, and their number to `*bad_count`;
/// damaged records are not an error. Errors: closed, failed, out_of_range,
/// busy, corrupt (the commit), invalid.
pub export fn lx_verify_records(
    h: *Store,
    indices: ?[*]const u64,
    count: u64,
    bad: ?[*]u64,
    bad_count: *u64,
) c_int {
    if (enter(h)) |rc| return rc;
    defer h.leave();
    bad_count.* = 0;
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const out = bad orelse return invalid("bad is null", .{});
    const n = h.verifyRecords(idx[0..@intCast(count)], out[0..@intCast(count)]) catch |e|
        return code(e);
    bad_count.* = n;
    return 0;
}

// ---------------------------------------------------------------- node-local cache
// The node-local cache of remote stores: src/Cache.zig owns the cache
// directory and the protocol its processes share (its files are
// src/cache_format.zig's), src/Replica.zig one replica, src/cache_fetch.zig
// the fetch plans. Python (loaderx/remote.py) keeps only the network: it opens a
// cache and a replica, starts a read (lx_replica_begin), fetches the byte
// ranges the returned fetch names into the replica's files, says they
// landed (lx_fetch_landed), and reads the records with the store calls.
// `lx_cache *` and `lx_replica *` are opaque; a replica belongs to its
// cache and lives until the cache's last lx_cache_close. Any thread may
// use a cache and its replicas at once, except one fetch (lx_fetch_t),
// which one thread at a time moves on. The cache needs POSIX file locks:
// on Windows every call returns io.

/// lx_cache_policy_t: how a cache sizes itself and plans fetches (the
/// fields' meanings in src/Cache.zig, `Policy`; defaults in CACHE_POLICY).
pub const CachePolicy = Cache.Policy;
/// lx_replica_spec_t: what lx_replica_open makes a replica from.
pub const ReplicaSpec = cache_make.Spec;
/// lx_meta_t: what the cache reads of a store's meta.
pub const MetaInfo = cache_make.Meta;
/// lx_fetch_t: a read's fetch through the cache (src/cache_fetch.zig, `Fetch`).
pub const Fetch = cache_fetch.Fetch;
/// lx_requests_t: one file's requests of a fetch step.
pub const FetchRequests = cache_fetch.Requests;

/// lx_cache_stats_t: a cache's shared counters and this process's part.
pub const CacheStats = Cache.Stats;
/// lx_replica_info_t: a replica's geometry and counters.
pub const ReplicaInfo = Replica.Info;

fn cacheHandle(c: ?*Cache) ?*Cache {
    const h = c orelse return null;
    return if (h.canary == Cache.canary_value) h else null;
}

fn replicaHandle(r: ?*Replica) ?*Replica {
    const h = r orelse return null;
    return if (h.canary == Replica.canary_value) h else null;
}

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
    defer rep.cache.end(tick);
    done.* = 1;
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

/// Trains a zstd dictionary of at most `cap` bytes into `out` from `count`
/// samples laid end to end at `samples` with sizes `sizes`; writes its size to
/// `*out_len`. Errors: bad_dictionary (training failed: too few or too uniform
/// samples), invalid.
pub export fn lx_train_dict(
    samples: ?[*]const u8,
    sizes: ?[*]const u64,
    count: u64,
    out: ?[*]u8,
    cap: u64,
    out_len: *u64,
) c_int {
    const smp = samples orelse return invalid("samples is null", .{});
    const szs = sizes orelse return invalid("sizes is null", .{});
    const o = out orelse return invalid("out is null", .{});
    if (count == 0) return invalid("no samples", .{});
    var total: u64 = 0;
    for (szs[0..@intCast(count)]) |s| {
        total = std.math.add(u64, total, s) catch return invalid("sample sizes overflow", .{});
    }
    const sz: [*]const usize = @ptrCast(szs);
    var why: [*:0]const u8 = "";
    out_len.* = codec.trainDict(
        smp[0..@intCast(total)],
        sz[0..@intCast(count)],
        o[0..@intCast(cap)],
        &why,
    ) catch {
        diag.set("zstd could not train a dictionary: {s}", .{why});
        return @backingInt(Result.bad_dictionary);
    };
    return 0;
}

/// Decodes `count` records stored by another writer (the original package's
/// stores, read by `loaderx convert`): record i is the `src_sizes[i]` bytes at
/// `src_offsets[i]` of `src[0..src_len]`, stored with `codecs[i]` (0 raw, 1
/// zstd, 2 zstd with the dictionary `dict`, trained or raw content; dict_len 0
/// for none), and must decode to exactly `dst_sizes[i]` bytes; the records are
/// laid end to end in `dst[0..dst_len]`. On a record that does not,
/// `*bad_index` is its index and the message says why. Errors: corrupt,
/// bad_dictionary, invalid, out_of_memory.
pub export fn lx_decode_frames(
    src: ?[*]const u8,
    src_len: u64,
    src_offsets: ?[*]const u64,
    src_sizes: ?[*]const u64,
    codecs: ?[*]const u8,
    count: u64,
    dst: ?[*]u8,
    dst_len: u64,
    dst_sizes: ?[*]const u64,
    dict: ?[*]const u8,
    dict_len: u64,
    bad_index: *u64,
) c_int {
    diag.clear();
    bad_index.* = std.math.maxInt(u64);
    if (count == 0) return 0;
    const n: usize = @intCast(count);
    const offs = (src_offsets orelse return invalid("src_offsets is null", .{}))[0..n];
    const ss = (src_sizes orelse return invalid("src_sizes is null", .{}))[0..n];
    const cs = (codecs orelse return invalid("codecs is null", .{}))[0..n];
    const ds = (dst_sizes orelse return invalid("dst_sizes is null", .{}))[0..n];
    const d = dst orelse return invalid("dst is null", .{});
    if (src_len > 0 and src == null) return invalid("src is null", .{});
    if (dict_len > 0 and dict == null) return invalid("dict is null", .{});
    var total: u64 = 0;
    for (ds) |x| total = std.math.add(u64, total, x) catch return invalid("sizes overflow", .{});
    if (total != dst_len) return invalid("dst_sizes add up to {d}, not {d}", .{ total, dst_len });
    var why: [*:0]const u8 = "";
    codec.decodeFrames(
        if (src) |p| p[0..@intCast(src_len)] else &.{},
        offs,
        ss,
        cs,
        d[0..@intCast(dst_len)],
        ds,
        if (dict) |p| p[0..@intCast(dict_len)] else &.{},
        bad_index,
        &why,
    ) catch |e| switch (e) {
        error.Corrupt => {
            diag.set("{s}", .{why});
            return @backingInt(Result.corrupt);
        },
        error.BadDictionary => {
            diag.set("zstd cannot use the dictionary ({d} bytes)", .{dict_len});
            return @backingInt(Result.bad_dictionary);
        },
        error.OutOfMemory => return @backingInt(Result.out_of_memory),
        error.BadLevel => unreachable, // decoding sets no level
    };
    return 0;
}

/// Fills `out[0..steps * batch_size]` with the sampler's indices for the
/// `steps` steps from `step`, one batch after another (mode 0 sequential,
/// 1 iid, 2 cyclic; rank < world; see src/sampler.zig). Pure; any thread.
/// Errors: invalid (length 0, batch_size or steps 0, world 0, rank >= world,
/// bad mode, a step past 2^64 - 1, more than 2^64 - 1 indices, or CYCLIC with
/// batch_size * world > length: a batch would have to repeat an index).
pub export fn lx_sampler_fill(
    length: u64,
    batch_size: u64,
    steps: u64,
    mode: c_int,
    seed: u64,
    step: u64,
    rank: u64,
    world: u64,
    out: ?[*]u64,
) c_int {
    const o = out orelse return invalid("out is null", .{});
    const m = std.enums.fromInt(sampler.Mode, mode) orelse
        return invalid("unknown sampler mode {d}", .{mode});
    if (length == 0) return invalid("length must be >= 1", .{});
    if (batch_size == 0) return invalid("batch_size must be >= 1", .{});
    if (steps == 0) return invalid("steps must be >= 1", .{});
    if (world == 0 or rank >= world) return invalid("bad shard ({d}, {d})", .{ rank, world });
    _ = std.math.add(u64, step, steps - 1) catch
        return invalid("steps {d} from step {d} pass step 2^64 - 1", .{ steps, step });
    const count = std.math.mul(u64, batch_size, steps) catch
        return invalid("steps * batch_size overflows", .{});
    if (m == .cyclic and @as(u128, batch_size) * world > length) {
        return invalid(
            "CYCLIC needs batch_size * world <= length, got {d} * {d} > {d}",
            .{ batch_size, world, length },
        );
    }
    const indices = o[0..@intCast(count)];
    sampler.fillSteps(length, m, seed, step, rank, world, @intCast(batch_size), indices);
    return 0;
}

/// lx_cursor_t: a CYCLIC mixture source's place at a step (src/mixture.zig).
pub const Cursor = mixture.Cursor;

/// For a weighted mixture of `source_count` sources (their `length` and
/// `weight`; `seed` is not read) with `global` records per step: `out[k]` is
/// the most records of source k one step can hold (mixture.windowMax). A
/// CYCLIC loader refuses a source whose length is below it. Pure; any thread.
/// Errors: invalid (no or too many sources, a zero weight, weights adding up
/// past the bound, global 0).
pub export fn lx_mixture_step_max(
    sources: ?[*]const LoaderSource,
    source_count: u32,
    global: u64,
    out: ?[*]u64,
) c_int {
    var mix: mixture.Mixture = undefined;
    const rc = mixtureOf(sources, source_count, &mix);
    if (rc != 0) return rc;
    const o = out orelse return invalid("out is null", .{});
    if (global == 0) return invalid("global must be >= 1", .{});
    for (0..source_count) |k| o[k] = @intCast(mix.windowMax(k, global));
    return 0;
}

/// The cursors at `step` of a CYCLIC mixture's sources (see
/// src/mixture.zig), for a run of `global` records per step whose step
/// `base_step` starts at mixed position `base_position` with source k at
/// `sources[k].cursor` (`steps_left` 0: as many steps as the rest of its
/// cycle holds from there, as for a fresh run or another global batch).
/// `out[k]` receives source k's cursor at `step` (`steps_left >= 1`). Pure;
/// any thread. Errors: invalid (what lx_mixture_step_max refuses; a source
/// that one step can hold more of than it has; a cursor with an offset past
/// its length or more steps left than the rest of its cycle holds; step
/// before base_step; a cycle past 2^64 - 1).
pub export fn lx_mixture_cursors(
    sources: ?[*]const LoaderSource,
    source_count: u32,
    global: u64,
    base_step: u64,
    base_position: u64,
    step: u64,
    out: ?[*]Cursor,
) c_int {
    var mix: mixture.Mixture = undefined;
    const rc = mixtureOf(sources, source_count, &mix);
    if (rc != 0) return rc;
    const o = out orelse return invalid("out is null", .{});
    if (global == 0) return invalid("global must be >= 1", .{});
    if (step < base_step) {
        return invalid("step {d} is before the base step {d}", .{ step, base_step });
    }
    const s = sources.?[0..source_count];
    for (s, 0..) |source, k| {
        const steps_per_cycle = mix.stepsPerCycle(k, source.length, global);
        if (steps_per_cycle == 0) {
            return invalid(
                "source {d} has {d} records, but one step of {d} can take up to {d} of them",
                .{ k, source.length, global, mix.windowMax(k, global) },
            );
        }
        if (!mix.cursorFits(k, source.length, global, base_position, source.cursor)) {
            return invalid(
                "source {d}: cursor (cycle {d}, offset {d}, steps_left {d}) " ++
                    "does not fit its {d} records",
                .{
                    k,                        source.cursor.cycle, source.cursor.offset,
                    source.cursor.steps_left, source.length,
                },
            );
        }
        const base_cursor = mix.normalize(k, source.length, global, base_position, source.cursor);
        const base: mixture.Base = .{ .step = base_step, .position = base_position };
        const place = mix.cursorAt(k, global, steps_per_cycle, base, base_cursor, step);
        o[k] = .{
            .cycle = std.math.cast(u64, place.cycle) orelse
                return invalid("source {d}: cycle {d} past 2^64 - 1", .{ k, place.cycle }),
            .offset = @intCast(place.offset),
            .steps_left = place.steps_left,
        };
    }
    return 0;
}

/// The mixture of `sources`' weights into `out`, or an error code.
fn mixtureOf(sources: ?[*]const LoaderSource, source_count: u32, out: *mixture.Mixture) c_int {
    const s = sources orelse return invalid("sources is null", .{});
    if (source_count == 0 or source_count > mixture.sources_max) {
        return invalid(
            "a mixture takes 1 to {d} sources, got {d}",
            .{ mixture.sources_max, source_count },
        );
    }
    var weights: [mixture.sources_max]u64 = undefined;
    var total: u64 = 0;
    for (s[0..source_count], 0..) |source, k| {
        if (source.weight == 0) return invalid("source {d} has weight 0", .{k});
        if (source.length == 0) return invalid("source {d} is empty", .{k});
        total = std.math.add(u64, total, source.weight) catch
            return invalid("weights overflow", .{});
        weights[k] = source.weight;
    }
    if (total > mixture.weight_total_max) {
        return invalid("weights add up to more than {d}", .{mixture.weight_total_max});
    }
    out.* = mixture.Mixture.init(weights[0..source_count]);
    return 0;
}

/// Lanes (threads, the caller included) one call may use: the cores this
/// process may run on (sched_getaffinity where the platform has it, counted
/// when the library starts and again in a forked child; at most 64), capped
/// by lx_set_lanes. The one core count of the package: Python's default
/// loader and converter worker counts come from it.
pub export fn lx_lanes() u32 {
    return @intCast(pool.lanes());
}

/// Caps the lanes of every later call (0 removes the cap).
pub export fn lx_set_lanes(n: u32) void {
    pool.setLaneLimit(n);
}

// ---------------------------------------------------------------- token windows

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
    h: *Store,
    itemsize: u32,
    has_separator: c_int,
    out: ?[*]u64,
    docs: u64,
) c_int {
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
pub export fn lx_windows_epoch(parts: ?[*]const Part, part_count: u32, out: *u64) c_int {
    const ps = partsOf(parts, part_count) orelse
        return invalid("parts must be 1 to {d}, sorted by first from 0", .{store_parts.parts_max});
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    out.* = windows.epochOf(ps);
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
    const ps = partsOf(parts, part_count) orelse
        return invalid("parts must be 1 to {d}, sorted by first from 0", .{store_parts.parts_max});
    if (enterParts(ps)) |rc| return rc;
    defer leaveParts(ps);
    const sp = spec orelse return invalid("spec is null", .{});
    windows.checkSpec(sp.*) catch |e| return code(e);
    if (count == 0) return 0;
    const idx = indices orelse return invalid("indices is null", .{});
    const sc = windows.threadScratch();
    defer windows.releaseThreadScratch(gpa);
    const o: windows.Out = .{ .tokens = tokens, .segments = segments };
    windows.gather(gpa, sp.*, ps, idx[0..@intCast(count)], o, lanes, sc) catch |e| return code(e);
    return 0;
}

// ---------------------------------------------------------------- loader ring

pub const LoaderConfig = Loader.Config;
/// lx_windows_t: the window index of a token corpus (see src/windows.zig).
pub const WindowsSpec = windows.Spec;
pub const LoaderSource = Loader.Source;
pub const LoaderColumn = Loader.Column;
pub const LoaderPart = Loader.Part;
/// The kinds of a loader column (lx_column_t.kind).
pub const ColumnKind = Loader.ColumnKind;

/// Starts a prefetch ring (see src/Loader.zig): `config->threads` library
/// threads build steps in order — the step's indices over `sources` (one, or
/// a weighted mixture) and every column of `columns` read from `parts` (the
/// stores of each (source, column): one store, or a ShardSet's shards). A
/// windows or segments column reads token windows: `specs[c * source_count
/// + k]` is its window index for source k (`specs` may be null without such
/// columns; the prefix sums it points at must outlive the ring). At
/// most `config->window` steps are submitted and not yet waited for; the
/// first to submit is `config->step`, whose first record is at global
/// position `config->position`. The stores are kept alive until
/// lx_loader_free: lx_close on one while the ring runs makes its next step
/// fail with closed instead of unmapping it under the threads. Errors:
/// invalid, closed, out_of_memory. On success `*out` owns the ring until
/// lx_loader_free.
pub export fn lx_loader_open(
    config: ?*const LoaderConfig,
    sources: ?[*]const LoaderSource,
    source_count: u32,
    columns: ?[*]const LoaderColumn,
    column_count: u32,
    parts: ?[*]const LoaderPart,
    part_count: u32,
    specs: ?[*]const WindowsSpec,
    out: ?*?*Loader,
) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    o.* = null;
    const c = config orelse return invalid("config is null", .{});
    const s = sources orelse return invalid("sources is null", .{});
    const cols = columns orelse return invalid("columns is null", .{});
    const p = parts orelse return invalid("parts is null", .{});
    o.* = Loader.create(
        gpa,
        c.*,
        s[0..source_count],
        cols[0..column_count],
        p[0..part_count],
        specs,
    ) catch |e| return code(e);
    return 0;
}

/// Releases steps `step` .. `step + count - 1` of a gated ring
/// (config->gated = 1; the next steps in order) to its threads; with a
/// non-null `failure` (a message, NUL terminated) fails them instead of
/// building them: their lx_loader_wait returns LX_FAILED with that message
/// and `*failed_column` = column_count. `generation` is the caller's count
/// of lx_loader_reset calls. At most `config->window` steps may be released
/// and not yet handed over. All or nothing. Errors: closed, invalid (not
/// gated, count 0, out of order, too far ahead, or an older generation:
/// dropped by a reset).
pub export fn lx_loader_submit(
    l: *Loader,
    step: u64,
    count: u64,
    generation: u64,
    failure: ?[*:0]const u8,
) c_int {
    diag.clear();
    const message: ?[]const u8 = if (failure) |f| std.mem.span(f) else null;
    l.submit(step, count, generation, message) catch |e| return code(e);
    return 0;
}

/// Blocks until step `step` of `generation` is built and hands it over; any
/// thread may wait, each step is handed over once. Column c's buffer goes to
/// `*buffers[c]` (null for a column built into the caller's `out` buffer, or
/// without bytes) and its length to `lengths[c]`; the caller owns it from
/// then on and frees it with lx_free_buffer (a null `buffers[c]` has it
/// freed now). `sizes` (2 * batch_size uint64 per variable column, in column
/// order: payload sizes, then aux sizes), `indices` and `sources`
/// (batch_size each) receive the step's record sizes, indices and sources;
/// each may be null, and so may `images_skipped` (the image records the
/// step replaced: an image column's Decode on_error skip). A step that
/// failed hands nothing over: returns its error (message in lx_last_error)
/// with the failing column in `*failed_column` (column_count: failed by
/// lx_loader_submit). Errors: closed (the ring was stopped, also while
/// waiting; or a store was closed), invalid (before the first step, already
/// handed over, or dropped by a reset, also while waiting), failed,
/// bad_image (an image column's record; the message names its index), or
/// any lx_gather error.
pub export fn lx_loader_wait(
    l: *Loader,
    step: u64,
    generation: u64,
    failed_column: *u32,
    buffers: ?[*]const ?*?[*]u8,
    lengths: ?[*]u64,
    sizes: ?[*]u64,
    indices: ?[*]u64,
    sources: ?[*]u16,
    images_skipped: ?*u32,
) c_int {
    diag.clear();
    const b = buffers orelse return invalid("buffers is null", .{});
    const n = lengths orelse return invalid("lengths is null", .{});
    const count = l.columns.count();
    l.wait(step, generation, .{
        .failed_column = failed_column,
        .buffers = b[0..count],
        .lengths = n[0..count],
        .sizes = sizes,
        .indices = indices,
        .sources = sources,
        .images_skipped = images_skipped,
    }) catch |e| return code(e);
    return 0;
}

/// Writes the batch_size indices (and, when `sources` is not null, their
/// sources) that the ring builds steps `step` .. `step + count - 1` with,
/// one step after the other, under its current base, without building
/// them: a pure function of the step (the sampler, or the mixture). Any
/// thread may call it. Errors: invalid (before the ring's first step, count
/// 0 or above the ring's window, or `indices` null), out_of_memory.
pub export fn lx_loader_indices(
    l: *Loader,
    step: u64,
    count: u64,
    indices: ?[*]u64,
    sources: ?[*]u16,
) c_int {
    diag.clear();
    const out = indices orelse return invalid("indices is null", .{});
    if (count == 0 or count > l.config.window) {
        return invalid("count must be 1 to the window ({d}), got {d}", .{ l.config.window, count });
    }
    const n: usize = @intCast(l.config.batch_size * count);
    const s: ?[]u16 = if (sources) |p| p[0..n] else null;
    l.indicesAt(step, out[0..n], s) catch |e| return code(e);
    return 0;
}

/// Drops every step (after the ones being built finish, so no buffer is
/// written afterwards; their buffers are freed) and wakes every waiter of
/// the old generation (they return invalid); the next step is `step`, with
/// its first record at global `position`. A CYCLIC mixture also takes each
/// source's cursor at `step` in `cursors[0..source_count]` (as
/// lx_mixture_cursors gives them; any other ring ignores `cursors`, which
/// may be null). Writes the new generation (the number of resets so far) to
/// `generation`. Does nothing once stopped (the generation stays). Errors:
/// invalid (a CYCLIC mixture without cursors, or `generation` null;
/// nothing is dropped then).
pub export fn lx_loader_reset(
    l: *Loader,
    step: u64,
    position: u64,
    cursors: ?[*]const Cursor,
    generation: ?*u64,
) c_int {
    diag.clear();
    const out = generation orelse return invalid("generation is null", .{});
    if (!l.hasCursors()) {
        out.* = l.reset(step, position, &.{});
        return 0;
    }
    const c = cursors orelse return invalid("a CYCLIC mixture needs every source's cursor", .{});
    out.* = l.reset(step, position, c[0..l.sources.len]);
    return 0;
}

/// Stops and joins the ring's threads; waiters return closed. Idempotent; any
/// thread may call it, also while another waits.
pub export fn lx_loader_stop(l: *Loader) void {
    l.stop();
}

/// Stops the ring, lets go of its stores and frees it. Must not race any
/// other call on the same ring.
pub export fn lx_loader_free(l: ?*Loader) void {
    if (l) |ring| ring.destroy();
}

// ---------------------------------------------------------------- images

/// lx_image_op_t, lx_image_spec_t, lx_image_column_t: an image pipeline (see
/// src/image/plan.zig for every field), and a column of it (what its records
/// are, and the seed its random draws are keyed by).
pub const ImageOp = image_plan.Op;
pub const ImageSpec = image_plan.Spec;
pub const ImageColumn = image.Column;

/// Runs `column`'s pipeline on `count` records outside a loader, into `out`
/// (`count` * the pipeline's bytes a record, exactly `out_len`): record i is
/// keyed at step `step`, global position `position + i`, so it comes out as
/// a loader's step `step` makes the record at that position. Encoded input:
/// record i is data[offsets[i] .. offsets[i] + sizes[i]]; pixel input: the
/// i-th block of height * width * channels bytes of `data` (offsets and
/// sizes may be null). Runs on every usable core, the GIL released. Writes
/// the records replaced (on_error skip) to `*skipped`, and on bad_image the
/// failing record's number to `*failed`. Errors: invalid, bad_image (the
/// message names the record and what is wrong), out_of_memory.
pub export fn lx_image_apply(
    column: ?*const ImageColumn,
    data: ?[*]const u8,
    data_len: u64,
    offsets: ?[*]const u64,
    sizes: ?[*]const u64,
    count: u64,
    step: u64,
    position: u64,
    out: ?[*]u8,
    out_len: u64,
    skipped: *u32,
    failed: *u64,
) c_int {
    diag.clear();
    skipped.* = 0;
    failed.* = 0;
    const col = column orelse return invalid("column is null", .{});
    image.checkColumn(col) catch |e| return code(e);
    const dest = out orelse return invalid("out is null", .{});
    const want = std.math.mul(
        u64,
        count,
        col.spec.outBytes(),
    ) catch return invalid("count overflows", .{});
    if (out_len != want) return invalid(
        "out holds {d} bytes, the records need {d}",
        .{ out_len, want },
    );
    if (count == 0) return 0;
    const bytes = (data orelse return invalid("data is null", .{}))[0..@intCast(data_len)];
    const records = imageRecords(
        col,
        bytes,
        offsets,
        sizes,
        count,
    ) orelse return @backingInt(Result.invalid);
    var lanes: image.Lanes = .{};
    defer lanes.deinit(gpa);
    var outcome: image.Outcome = .{};
    const key: image.Key = .{ .seed = col.seed, .step = step, .position = position };
    image.batch(gpa, &col.spec, records, key, dest, &lanes, 0, &outcome) catch |e| switch (e) {
        error.OutOfMemory => return code(error.OutOfMemory),
        error.BadRecord => {
            failed.* = outcome.failed_slot.?;
            diag.set("record {d}: {s}", .{ failed.*, outcome.message[0..outcome.message_len] });
            return @backingInt(Result.bad_image);
        },
    };
    skipped.* = outcome.skipped;
    return 0;
}

/// The records of lx_image_apply, checked against `data` (null: invalid,
/// message set).
fn imageRecords(
    col: *const ImageColumn,
    data: []const u8,
    offsets: ?[*]const u64,
    sizes: ?[*]const u64,
    count: u64,
) ?image.Records {
    const n: usize = @intCast(count);
    if (col.input == @backingInt(image.InputKind.pixels)) {
        const size = @as(u64, col.height) * col.width * col.channels;
        if (data.len != size * count) {
            diag.set(
                "data holds {d} bytes, {d} records of {d} x {d} x {d} need {d}",
                .{ data.len, count, col.height, col.width, col.channels, size * count },
            );
            return null;
        }
        return .{
            .pixels = .{
                .data = data,
                .height = col.height,
                .width = col.width,
                .channels = col.channels,
            },
        };
    }
    const o = (offsets orelse {
        diag.set("offsets is null", .{});
        return null;
    })[0..n];
    const s = (sizes orelse {
        diag.set("sizes is null", .{});
        return null;
    })[0..n];
    for (o, s, 0..) |at, size, i| {
        if (at > data.len or size > data.len - at) {
            diag.set(
                "record {d} ({d} bytes at {d}) runs past the {d} bytes of data",
                .{ i, size, at, data.len },
            );
            return null;
        }
    }
    return .{ .encoded = .{ .bytes = data, .offsets = o, .sizes = s } };
}

/// Decodes JPEGs with the libjpeg at `path` (a libjpeg-turbo with SIMD: the
/// one Pillow ships, or the system's) instead of the built-in one, from now
/// on, for the whole process. It is taken only if it exports the libjpeg 6b
/// API with libjpeg-turbo's crop and skip calls and decodes the library's
/// test images exactly as the built-in decoder does. Must come before the
/// first JPEG decode. Errors: not_found (no such library, or a symbol is
/// missing), invalid (it decodes differently, a decode already ran, or this
/// platform cannot load libraries).
pub export fn lx_image_use_jpeg(path: ?[*:0]const u8) c_int {
    diag.clear();
    const p = std.mem.span(path orelse return invalid("path is null", .{}));
    jpeg.useLibrary(p) catch |e| {
        diag.set("{s}: {s}", .{ p, switch (e) {
            error.NotFound => "cannot be loaded",
            error.MissingSymbol => "is not a libjpeg-turbo (a symbol is missing)",
            error.Mismatch => "decodes the test images differently from the built-in decoder",
            error.Unsupported => "libraries are not loaded on this platform",
            error.AlreadyChosen => "the decoder was chosen already (before the first decode)",
        } });
        const missing = e == error.NotFound or e == error.MissingSymbol;
        const r: Result = if (missing) .not_found else .invalid;
        return @backingInt(r);
    };
    return 0;
}

/// Writes the path of the libjpeg decoding JPEGs ("" for the built-in
/// libjpeg-turbo) to `out` (up to `cap` bytes, NUL-terminated when it fits)
/// and its length to `*len`. Choosing nothing by then chooses the built-in.
pub export fn lx_image_jpeg_library(out: ?[*]u8, cap: u64, len: *u64) c_int {
    const path = jpeg.libraryPath();
    len.* = path.len;
    const o = out orelse return 0;
    if (cap < path.len + 1) return 0;
    @memcpy(o[0..path.len], path);
    o[path.len] = 0;
    return 0;
}

// ---------------------------------------------------------------- test hooks

/// Test hook (does nothing unless armed): the `nth` (1-based) file-system call
/// whose kind is in `mask` (bits of fsio.Op: create, write, sync, truncate,
/// rename, unlink, mkdir, sync_dir) fails with an I/O error, and with
/// `sticky` != 0 every later one too. `nth` 0 only counts; mask 0 disarms.
/// Process-wide.
pub export fn lx_debug_fault(mask: u32, nth: u64, sticky: c_int) void {
    fsio.armFault(mask, nth, sticky != 0);
}

/// Test hook: matching file-system calls and injected faults since the last
/// lx_debug_fault.
pub export fn lx_debug_fault_counts(calls: *u64, faults: *u64) void {
    calls.* = fsio.callCount();
    faults.* = fsio.faultCount();
}

/// Test hook: starts (`on` != 0, dropping any earlier log) or stops recording
/// every file-system call the engine makes (see fsio.zig for the format).
pub export fn lx_debug_record(on: c_int) void {
    fsio.setRecording(on != 0);
}

/// Test hook: copies the recording into `out` when it fits in `cap` bytes and
/// writes its size to `*len`. Errors: out_of_memory (recording ran out of
/// memory and is incomplete).
pub export fn lx_debug_recording(out: ?[*]u8, cap: u64, len: *u64) c_int {
    const n = fsio.takeRecording(if (out) |o| o[0..@intCast(cap)] else null) orelse {
        diag.set("the recording ran out of memory and is incomplete", .{});
        return @backingInt(Result.out_of_memory);
    };
    len.* = n;
    return 0;
}

test {
    _ = Loader;
    _ = @import("image/stage.zig");
    _ = @import("image/plan.zig");
    _ = @import("image/png.zig");
    _ = @import("image/resample.zig");
    _ = @import("image/jpeg.zig");
    _ = Cache;
    _ = Replica;
    _ = cache_fetch;
    _ = cache_make;
    _ = cache_admin;
    _ = @import("cache_format.zig");
    _ = @import("cache_os.zig");
    _ = fsio;
    _ = store_maintain;
    _ = mixture;
    _ = store_parts;
    _ = windows;
    _ = @import("cpu.zig");
    _ = format;
    _ = codec;
    _ = pool;
    _ = outbuf;
    _ = diag;
    _ = sampler;
    _ = Store;
}
