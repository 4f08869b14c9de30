//! The C ABI of libloaderx, its root: this file and the area files under
//! src/capi/ (one per area, listed in `areas` below) are the only files that
//! export symbols. Read them as the library's header: this file holds the
//! conventions, the result codes and every struct C sees; each area file the
//! functions of one area. loaderx/_abi.py (the cffi declarations and every
//! shared constant) is generated from them by `zig build bindings`
//! (src/gen_bindings.zig); tests/project/test_abi.py regenerates it and fails
//! on any difference, and checks that the library exports nothing else.
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
const assert = std.debug.assert;
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
const Cache = @import("Cache.zig");
const Replica = @import("Replica.zig");
const cache_fetch = @import("cache_fetch.zig");
const cache_make = @import("cache_make.zig");
const cache_admin = @import("cache_admin.zig");

/// The areas of the ABI, one file each, in the order loaderx/_abi.py
/// declares their functions (src/gen_bindings.zig reads them from here).
pub const areas = .{
    @import("capi/errors.zig"),
    @import("capi/store.zig"),
    @import("capi/gather.zig"),
    @import("capi/pool.zig"),
    @import("capi/maintain.zig"),
    @import("capi/cache.zig"),
    @import("capi/codec.zig"),
    @import("capi/sampler.zig"),
    @import("capi/windows.zig"),
    @import("capi/loader.zig"),
    @import("capi/image.zig"),
    @import("capi/debug.zig"),
};

comptime {
    // The ABI passes sizes as uint64 and hands them to zstd as size_t.
    std.debug.assert(@sizeOf(usize) == 8);
    // Every area's exports are compiled into the library.
    for (areas) |area| _ = area;
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

pub fn code(err: Loader.Error) c_int {
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

pub fn invalid(comptime fmt: []const u8, args: anytype) c_int {
    diag.set(fmt, args);
    return @backingInt(Result.invalid);
}

pub fn io(comptime fmt: []const u8, args: anytype) c_int {
    diag.set(fmt, args);
    return @backingInt(Result.io);
}

/// `invalid`, with the message the check that refused an argument set.
pub fn refuse() c_int {
    return @backingInt(Result.invalid);
}

// Handles. Every export that takes one checks it before it reads through it:
// null, a pointer to anything else, or a handle already freed (its canary is
// cleared before its memory goes) is refused with `invalid`, never followed.

/// `h` when it is a live store handle, else null.
pub fn storeHandle(h: ?*Store) ?*Store {
    const s = h orelse return null;
    return if (s.canary == Store.canary_value) s else null;
}

/// The store an extern struct's `store` field names, read as C may have
/// written it (null included), checked as storeHandle checks a handle.
pub fn storeField(field: *const *Store) ?*Store {
    return storeHandle(@as(*const ?*Store, @ptrCast(field)).*);
}

/// `invalid` for a store handle storeHandle refused.
pub fn notAStore() c_int {
    return invalid("not a store handle (null, or freed)", .{});
}

/// `l` when it is a live loader handle, else null.
pub fn loaderHandle(l: ?*Loader) ?*Loader {
    const h = l orelse return null;
    return if (h.canary == Loader.canary_value) h else null;
}

/// `c` when it is a live cache handle, else null.
pub fn cacheHandle(c: ?*Cache) ?*Cache {
    const h = c orelse return null;
    return if (h.canary == Cache.canary_value) h else null;
}

/// `r` when it is a live replica handle, else null.
pub fn replicaHandle(r: ?*Replica) ?*Replica {
    const h = r orelse return null;
    return if (h.canary == Replica.canary_value) h else null;
}

/// Counts a call on the live handle `h` in (the caller defers h.leave()); a
/// result code when the handle is closed.
pub fn enter(h: *Store) ?c_int {
    diag.clear();
    h.enter() catch |e| return code(e);
    // Counted in: the files stay mapped until this call leaves, even if
    // another thread closes the handle meanwhile.
    assert(h.users.load(.monotonic) & ~Store.closed_bit >= 1);
    return null;
}

pub const gpa = std.heap.c_allocator;

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

/// A part of an index space: `store` holds the records from index `first`
/// up to the next part's `first` (or its own length). One store is the
/// part {store, 0}; a ShardSet's shards are parts in order.
pub const Part = store_parts.Part;

/// Counts a call in on every part's store; a result code when one is closed
/// (the caller defers leaveParts).
pub fn enterParts(parts: []const Part) ?c_int {
    diag.clear();
    for (parts, 0..) |p, i| {
        p.store.enter() catch |e| {
            leaveParts(parts[0..i]);
            return code(e);
        };
    }
    return null;
}

pub fn leaveParts(parts: []const Part) void {
    for (parts) |p| p.store.leave();
}

/// The parts of a gather, checked: 1 to 65535, sorted by `first` from 0,
/// each a live store handle; null with the message set (return refuse()).
pub fn partsOf(parts: ?[*]const Part, part_count: u32) ?[]const Part {
    const max = store_parts.parts_max;
    const p = parts orelse {
        diag.set("parts is null", .{});
        return null;
    };
    if (part_count == 0 or part_count > max) {
        diag.set("parts must be 1 to {d}, got {d}", .{ max, part_count });
        return null;
    }
    const slice = p[0..part_count];
    for (slice, 0..) |*part, k| {
        if (storeField(&part.store) == null) {
            diag.set("part {d}: not a store handle (null, or freed)", .{k});
            return null;
        }
        if ((k == 0 and part.first != 0) or (k > 0 and part.first <= slice[k - 1].first)) {
            diag.set("parts must be sorted by first from 0 (part {d})", .{k});
            return null;
        }
    }
    return slice;
}

/// lx_pool_stats_t.
pub const PoolStats = outbuf.Stats;

/// One record's move in a delete: the survivor at index `from` is now at `to`.
pub const Move = store_maintain.Move;

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

/// lx_cursor_t: a CYCLIC mixture source's place at a step (src/mixture.zig).
pub const Cursor = mixture.Cursor;

pub const LoaderConfig = Loader.Config;
/// lx_windows_t: the window index of a token corpus (see src/windows.zig).
pub const WindowsSpec = windows.Spec;
pub const LoaderSource = Loader.Source;
pub const LoaderColumn = Loader.Column;
pub const LoaderPart = Loader.Part;
/// lx_stage_t: where lx_loader_stage stopped (src/loader/Stage.zig, `Out`).
pub const LoaderStage = Loader.Stage.Out;
/// The kinds of a loader column (lx_column_t.kind).
pub const ColumnKind = Loader.ColumnKind;

/// lx_image_op_t, lx_image_spec_t, lx_image_column_t: an image pipeline (see
/// src/image/plan.zig for every field), and a column of it (what its records
/// are, and the seed its random draws are keyed by).
pub const ImageOp = image_plan.Op;
pub const ImageSpec = image_plan.Spec;
pub const ImageColumn = image.Column;

test {
    inline for (areas) |area| _ = area;
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
