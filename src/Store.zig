//! One record store (a directory; every byte of it in format.zig),
//! batch-only. One type spread over several files: this file owns the
//! handle's state and lifetime, and the operations live in files of their
//! own that take `*Store` first; the public ones are re-exported below as
//! methods (`s.gather(...)`). Where each method lives:
//!
//!   Store.zig           the struct and its lifetime (open, enter, leave,
//!                       shutdown, hold, unhold, close), errors (ioFail,
//!                       failWith, checkUsable), the header, blobs and
//!                       identity read at open, the commit (readCommit,
//!                       writeCommit, syncFile, syncLocked), the mapped table
//!                       and data (table, Table, dataMap, checkLoc), readers
//!                       (enterRead, exitRead), the writer lock and exclusive
//!                       access (beginMutation, takeWriterLock,
//!                       acquireExclusive, releaseExclusive), stats.
//!   store_create.zig    a create: its options (OpenOptions) and their checks,
//!                       the new store's files, randomU64.
//!   store_fork.zig      the registry of open handles and the atfork
//!                       handlers (installForkHandlers, adoptInChild).
//!   store_read.zig      gather, gatherAlloc, verify; for multi-store reads
//!                       snapshot, publishedCommit, gatherReads, packedReads.
//!   store_append.zig    append, publish, sync (Batch, Scratch).
//!   store_maintain.zig  delete, compact, and what an open finishes after a
//!                       crash (finishJournal, checkTail, dropDeadJournal,
//!                       removeWindowsIndex).
//!   store_parts.zig     reads over several stores as one index space
//!                       (ShardSet shards, loader sources): not methods.
//!   store_test.zig      the engine's tests.
//!
//! Reads of committed records go through read-only shared mappings of the
//! table and data files (mapping.zig), so a gather costs no syscall per record
//! and takes no lock. Committed records are immutable; only delete and compact
//! rewrite them, and both demand exclusive access (refused, never forced).
//!
//! Lifetime: `users` counts the opener, every call in flight and every loader
//! reading the store. `shutdown` (lx_close) marks the handle closed, so later
//! calls fail with `Closed`, and the files are unmapped and closed only when
//! the last user leaves: a close racing a gather on another thread never
//! unmaps memory under it. The struct itself stays allocated for whoever may
//! still hold its address (the opener's handle, loaders: `holders`).
//!
//! Writers: the first mutation through a handle takes the store's writer lock
//! (an exclusive file lock on `lock`), held until close; a mutation through
//! any other handle, in this process or another, then fails with `Locked`. A
//! handle inherited by a forked child never writes (the lock belongs to the
//! parent): its mutations fail with `Locked`, its reads work. Mutations of one
//! handle are serialized by `write_mutex`. Every handle holds a shared lock on
//! `meta`; delete and compact upgrade it to exclusive (`Busy` while any other
//! handle has the store open).
//!
//! Fork: a file lock belongs to an open file, which parent and child share
//! after fork(). So the library keeps a registry of the handles whose files
//! are open, and a `pthread_atfork` child handler (`adoptInChild`) makes
//! every inherited handle the child's own: it closes the child's copy of the
//! writer lock (so the lock goes with the parent's close), and reopens `meta`
//! and locks it shared through a file of the child's own (so the parent's
//! delete and compact see the child as another handle), waiting while the
//! parent's own delete or compact holds it exclusively.
//!
//! Failure: an error after which this handle cannot know what is on disk (a
//! failed fsync, a failed commit write, a failure inside delete or compact
//! after it began changing records) puts the handle in a failed state: every
//! later call but close fails with `Failed`, and the next open of the store
//! finishes or discards what was interrupted. After a failed fsync nothing is
//! retried (the kernel may already have dropped the pages it could not write).
//!
//! Durability (see also capi.zig): after a process crash (kill -9) at any
//! instant, the store opens and holds a prefix of what was appended,
//! byte-exact. After a power loss, everything a completed `sync()`, `delete`
//! or `compact` covered survives; of later appends a prefix survives, and the
//! first open after the crash checks those records and drops any damaged tail.
const Store = @This();

const std = @import("std");
const Io = std.Io;
const File = Io.File;
const Allocator = std.mem.Allocator;
const assert = std.debug.assert;

const format = @import("format.zig");
const codec = @import("codec.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const fsio = @import("fsio.zig");
const mapping = @import("mapping.zig");
const store_read = @import("store_read.zig");
const store_append = @import("store_append.zig");
const store_maintain = @import("store_maintain.zig");
const store_create = @import("store_create.zig");
const store_fork = @import("store_fork.zig");
const Codec = format.Codec;
const RecordLoc = format.RecordLoc;
const Commit = format.Commit;
const Header = format.Header;

pub const Error = error{
    NotFound,
    NotAStore,
    Corrupt,
    NewerFormat,
    Locked,
    Busy,
    OutOfRange,
    SizeMismatch,
    BadDictionary,
    InvalidArgument,
    ReadOnly,
    OutOfMemory,
    NoSpace,
    IoFailed,
    Closed,
    Failed,
    /// A record is not an image the image stage can decode (image/stage.zig).
    BadImage,
};

pub const aux_size_max: usize = std.math.maxInt(u16);

// The operations, as methods.
pub const Part = store_read.Part;
pub const Dest = store_read.Dest;
pub const gather = store_read.gather;
pub const gatherAlloc = store_read.gatherAlloc;
pub const verify = store_read.verify;
pub const verifyRecords = store_read.verifyRecords;
pub const Batch = store_append.Batch;
pub const append = store_append.append;
pub const publish = store_append.publish;
pub const sync = store_append.sync;
pub const delete = store_maintain.delete;
pub const compact = store_maintain.compact;
pub const OpenOptions = store_create.OpenOptions;
pub const frame_size_min = store_create.frame_size_min;
pub const frame_size_max = store_create.frame_size_max;
pub const randomU64 = store_create.randomU64;
pub const installForkHandlers = store_fork.installForkHandlers;
pub const adoptInChild = store_fork.adoptInChild;

/// `canary_value` from open until the handle is freed (the C ABI checks
/// it: a null, foreign or freed pointer is refused, not followed).
canary: u64 = canary_value,
gpa: Allocator,
dir: Io.Dir,
meta: File,
index: File,
data: File,
/// The writer lock file, open and locked once this handle has mutated.
writer_lock: ?File = null,
writable: bool,
header: Header,
/// Owned copies of the blobs stored in meta (one allocation, dict first).
dict_bytes: []u8,
user_bytes: []u8,
/// The type identity, checked at open: native (its texts are slices of
/// `user_bytes`), msgpack (format 2: Python reads `user_bytes`), or none.
identity: format.Identity.Full = .{ .head = format.Identity.init(.bytes, 0, 0) },
identity_encoding: format.Identity.Encoding = .none,
dict: codec.Dict = .{},
/// Header and commit pages of meta, mapped shared read-only: other handles'
/// commits show up here without a syscall.
meta_map: mapping.Region,
index_maps: mapping.MapSet = .{},
data_maps: mapping.MapSet = .{},
/// Serializes mutations through this handle (and guards `scratch`).
write_mutex: Io.Mutex = .init,
/// The last commit this handle published; valid while it holds the writer lock.
commit: Commit = undefined,
/// The end state of appends made with `stage`, written to disk but not yet
/// published: readers (and a crash) see only `commit`.
staged: ?Commit = null,
/// Buffers of append, kept between calls (under write_mutex).
scratch: store_append.Scratch = .{},
/// Gathers in flight through this handle, and the flag delete/compact raise.
readers_active: std.atomic.Value(u32) = .init(0),
exclusive: std.atomic.Value(bool) = .init(false),
/// Bit 63: closed. Below it: the opener (1 until shutdown), calls in
/// flight, loaders. The last one out releases the files and mappings.
users: std.atomic.Value(u64) = .init(1),
/// Who may still hold this struct's address: the opener's handle (until
/// lx_free) and loaders. The last one frees the struct.
holders: std.atomic.Value(u32) = .init(1),
/// Set once; then every call but close fails (see "Failure" above).
failed: std.atomic.Value(bool) = .init(false),
failed_what: []const u8 = "",
failed_error: []const u8 = "",
/// The process that opened the handle: only it may write through it.
open_pid: i64,
/// Bumped by every delete through this handle (the only operation that
/// changes records in place). While this handle is open no other handle can
/// delete (delete needs the store to itself), so a reader that saw one value
/// knows its records are unchanged while the value is the same (token
/// window indexes, windows.zig).
delete_epoch: std.atomic.Value(u64) = .init(0),
/// This handle's links in the registry of open stores (see "Fork" above).
registry_prev: ?*Store = null,
registry_next: ?*Store = null,

pub const closed_bit: u64 = 1 << 63;

pub const canary_value: u64 = 0x45524F5453584C31;

// ---------------------------------------------------------------- lifetime

/// Counts a call in; fails with Closed once the opener has let go.
pub fn enter(s: *Store) Error!void {
    var current = s.users.load(.monotonic);
    while (true) {
        if (current & closed_bit != 0) return diag.fail(error.Closed, "store is closed", .{});
        // Only the opener's count (1) can bring a handle above 0 users: a
        // call may enter only while the opener still holds it.
        assert(current >= 1);
        current = s.users.cmpxchgWeak(current, current + 1, .acquire, .monotonic) orelse return;
    }
}

/// Counts a call (or a loader) out; the last user of a closed handle
/// releases its files and mappings.
pub fn leave(s: *Store) void {
    const before = s.users.fetchSub(1, .acq_rel);
    assert(before & ~closed_bit >= 1);
    if (before == closed_bit | 1) s.releaseResources();
}

/// The opener lets go (lx_close): later calls fail with Closed. Idempotent.
pub fn shutdown(s: *Store) void {
    const before = s.users.fetchOr(closed_bit, .acq_rel);
    if (before & closed_bit != 0) return;
    s.leave();
}

pub fn isClosed(s: *const Store) bool {
    return s.users.load(.acquire) & closed_bit != 0;
}

/// Another holder of this struct's address (a loader).
pub fn hold(s: *Store) void {
    const before = s.holders.fetchAdd(1, .monotonic);
    // Only a holder (the opener, a loader) can hand the address on.
    assert(before >= 1);
}

/// Drops a holder; the last frees the struct, whose resources must be gone.
pub fn unhold(s: *Store) void {
    if (s.holders.fetchSub(1, .acq_rel) != 1) return;
    assert(s.users.load(.acquire) == closed_bit);
    s.canary = 0;
    s.gpa.destroy(s);
}

fn releaseResources(s: *Store) void {
    const io = pool.io();
    // The last user is gone: no call and no gather can touch what is freed.
    assert(s.users.load(.acquire) == closed_bit);
    assert(s.readers_active.load(.acquire) == 0);
    store_fork.unregister(s);
    s.index_maps.deinit();
    s.data_maps.deinit();
    s.meta_map.unmap();
    s.dict.deinit();
    s.gpa.free(s.dict_bytes.ptr[0 .. s.dict_bytes.len + s.user_bytes.len]);
    s.scratch.deinit(s.gpa);
    // Closing the descriptor releases the flock; an explicit unlock would
    // also release a lock that a forked parent still holds through it.
    if (s.writer_lock) |l| l.close(io);
    s.closeFiles();
    s.dir.close(io);
}

/// Opens (and, for the tests, frees at once on failure) without the C ABI.
pub fn close(s: *Store) void {
    s.shutdown();
    s.unhold();
}

// ---------------------------------------------------------------- errors

/// Maps an operating-system error to the engine's, naming what failed.
/// `e` is the concrete error set of the failed call: every name in it is
/// classified at compile time by `classify`, so a call that can fail in a
/// new way (a new std error, another target's) fails the build until the
/// new name is classified, instead of being lumped in by a catch-all.
pub fn ioFail(e: anytype, what: []const u8) Error {
    diag.set("{s}: {s}", .{ what, ioMessage(e) });
    return switch (e) {
        inline else => |x| comptime classify(@errorName(x)),
    };
}

const no_space_errors = [_][]const u8{ "NoSpaceLeft", "DiskQuota", "FileTooBig" };
const read_only_errors = [_][]const u8{ "AccessDenied", "PermissionDenied", "ReadOnlyFileSystem" };
const memory_errors = [_][]const u8{
    "OutOfMemory", "SystemResources", "LockedMemoryLimitExceeded",
};
const not_found_errors = [_][]const u8{"FileNotFound"};
/// I/O failures of the named file: a dead device, a descriptor limit, a file
/// of the wrong kind where a store file should be, an unexpected errno, a
/// fault injected by a test. The message keeps the name.
const io_errors = [_][]const u8{
    "InputOutput",             "Unexpected",                "InjectedFault",
    "ProcessFdQuotaExceeded",  "SystemFdQuotaExceeded",     "SymLinkLoop",
    "IsDir",                   "NotDir",                    "NameTooLong",
    "PathAlreadyExists",       "BadPathName",               "DeviceBusy",
    "FileBusy",                "NoDevice",                  "WouldBlock",
    "Canceled",                "FileLocksUnsupported",      "NotOpenForWriting",
    "NotOpenForReading",       "Unseekable",                "BrokenPipe",
    "ConnectionResetByPeer",   "InvalidArgument",           "NetworkNotFound",
    "AntivirusInterference",   "PipeBusy",                  "HardwareFailure",
    "NotSupported",            "ProcessNotFound",           "OperationUnsupported",
    "MappingAlreadyExists",    "NonCanonical",              "LinkQuotaExceeded",
    "RenameAcrossMountPoints", "FileSystem",                "Overflow",
    "StreamTooLong",           "IsTerminal",                "EndOfStream",
    "ReadFailed",              "WriteFailed",               "SharingViolation",
    "PathNotFound",            "NetNameDeleted",            "Interrupted",
    "NotCapable",              "MemoryMappingNotSupported", "FileDescriptorNotASocket",
    "Timeout",                 "OperationAborted",          "LockViolation",
    "DirNotEmpty",             "InvalidExe",                "NotLink",
    "ConnectionTimedOut",      "SocketNotConnected",        "CrossDevice",
    "NonResizable",            "Streaming",                 "TooDeep",
};

fn classify(comptime name: []const u8) Error {
    @setEvalBranchQuota(100_000);
    if (inList(&no_space_errors, name)) return error.NoSpace;
    if (inList(&read_only_errors, name)) return error.ReadOnly;
    if (inList(&memory_errors, name)) return error.OutOfMemory;
    if (inList(&not_found_errors, name)) return error.NotFound;
    if (inList(&io_errors, name)) return error.IoFailed;
    @compileError("unclassified I/O error: " ++ name ++ " (add it to a list in Store.zig)");
}

fn inList(comptime list: []const []const u8, comptime name: []const u8) bool {
    inline for (list) |n| {
        if (comptime std.mem.eql(u8, n, name)) return true;
    }
    return false;
}

fn ioMessage(e: anyerror) []const u8 {
    return switch (e) {
        error.InjectedFault => "injected fault (test)",
        error.SymLinkLoop => "a symlink where the store expects a file (refused)",
        error.ProcessFdQuotaExceeded, error.SystemFdQuotaExceeded => "too many open files",
        else => @errorName(e),
    };
}

/// Puts the handle in the failed state (see the file comment) and returns
/// the error `e` maps to, with a message saying the handle is now unusable.
/// Later calls fail with Failed.
pub fn failWith(s: *Store, e: anytype, what: []const u8) Error {
    s.markFailed(e, what);
    const err = ioFail(e, what);
    diag.set("{s}: {s}; this handle can no longer be used: close it and reopen the store " ++
        "(the reopen finishes or rolls back the interrupted operation)", .{ what, ioMessage(e) });
    return err;
}

fn markFailed(s: *Store, e: anyerror, what: []const u8) void {
    if (s.failed.swap(true, .acq_rel)) return;
    s.failed_what = what;
    s.failed_error = ioMessage(e);
    assert(s.failed.load(.acquire));
}

/// Fails with Failed when an earlier error left this handle unusable.
pub fn checkUsable(s: *const Store) Error!void {
    if (!s.failed.load(.acquire)) return;
    return diag.fail(
        error.Failed,
        "this handle failed earlier ({s}: {s}); close it and reopen the store",
        .{ s.failed_what, s.failed_error },
    );
}

// ---------------------------------------------------------------- open

pub fn open(gpa: Allocator, path: []const u8, opts: OpenOptions) Error!*Store {
    const io = pool.io();
    var user: []u8 = &.{};
    if (opts.create) {
        try store_create.validateCreate(opts);
        user = try store_create.identityBytes(gpa, opts);
    }
    defer gpa.free(user);
    const dir = try openDir(path, opts.create);
    errdefer dir.close(io);
    if (opts.create) try store_create.createIfMissing(dir, opts, user);

    const s = gpa.create(Store) catch return error.OutOfMemory;
    errdefer gpa.destroy(s);
    s.* = .{
        .gpa = gpa,
        .dir = dir,
        .meta = undefined,
        .index = undefined,
        .data = undefined,
        .writable = true,
        .header = undefined,
        .dict_bytes = &.{},
        .user_bytes = &.{},
        .meta_map = undefined,
        .open_pid = pool.currentPid(),
    };
    try s.openFiles();
    errdefer s.closeFiles();
    try s.load();
    assert(s.header.format_version >= format.format_version_min);
    assert(s.header.format_version <= format.format_version);
    assert(s.commit.consistent());
    assert(s.users.load(.monotonic) == 1);
    store_fork.register(s);
    return s;
}

fn openDir(path: []const u8, create: bool) Error!Io.Dir {
    const io = pool.io();
    const cwd = Io.Dir.cwd();
    if (cwd.openDir(io, path, .{})) |d| return d else |e| switch (e) {
        error.FileNotFound => if (!create) {
            return diag.fail(error.NotFound, "no store at this path", .{});
        },
        error.NotDir => {
            return diag.fail(error.NotAStore, "path is a file, not a store directory", .{});
        },
        else => return ioFail(e, "opening the store directory"),
    }
    fsio.mkdirs(path) catch |e| switch (e) {
        error.NotDir => return diag.fail(error.NotAStore, "a parent of the path is a file", .{}),
        else => return ioFail(e, "creating the store directory"),
    };
    return cwd.openDir(io, path, .{}) catch |e| ioFail(e, "opening the store directory");
}

fn openFile(s: *Store, name: [:0]const u8) Error!File {
    if (s.writable) {
        if (fsio.open(s.dir, name, .read_write)) |f| return f else |e| switch (e) {
            error.AccessDenied,
            error.PermissionDenied,
            error.ReadOnlyFileSystem,
            => s.writable = false,
            error.FileNotFound => return error.NotFound,
            else => return ioFail(e, name),
        }
    }
    return fsio.open(s.dir, name, .read_only) catch |e| switch (e) {
        error.FileNotFound => error.NotFound,
        else => ioFail(e, name),
    };
}

fn openFiles(s: *Store) Error!void {
    const io = pool.io();
    s.meta = s.openFile("meta") catch |e| switch (e) {
        error.NotFound => {
            return diag.fail(
                error.NotAStore,
                "directory holds no loaderx store (no meta file)",
                .{},
            );
        },
        else => return e,
    };
    errdefer s.meta.close(io);
    // Shared: delete and compact need every other handle gone.
    const got = s.meta.tryLock(io, .shared) catch |e| return ioFail(e, "locking meta");
    if (!got) {
        return diag.fail(error.Busy, "another handle is deleting or compacting this store", .{});
    }
    s.index = s.openFile("index") catch |e| switch (e) {
        error.NotFound => return diag.fail(error.Corrupt, "index file is missing", .{}),
        else => return e,
    };
    errdefer s.index.close(io);
    s.data = s.openFile("data") catch |e| switch (e) {
        error.NotFound => return diag.fail(error.Corrupt, "data file is missing", .{}),
        else => return e,
    };
}

fn closeFiles(s: *Store) void {
    const io = pool.io();
    s.data.close(io);
    s.index.close(io);
    s.meta.close(io);
}

pub fn readExact(file: File, buf: []u8, offset: u64, what: []const u8) Error!void {
    const n = file.readPositionalAll(pool.io(), buf, offset) catch |e| return ioFail(e, what);
    if (n != buf.len) return diag.fail(error.Corrupt, "{s} is truncated", .{what});
}

pub fn checkHeader(h: *const Header) Error!void {
    if (h.magic == format.magic_swapped) {
        return diag.fail(error.NotAStore, "store was written with the other byte order", .{});
    }
    if (h.magic != format.magic) {
        return diag.fail(error.NotAStore, "meta has no loaderx magic number", .{});
    }
    if (h.format_version > format.format_version) {
        return diag.fail(
            error.NewerFormat,
            "store format version {d} is newer than this loaderx supports ({d}); upgrade loaderx",
            .{ h.format_version, format.format_version },
        );
    }
    if (h.format_version < format.format_version_min) {
        return diag.fail(
            error.NotAStore,
            "store format version {d} was written by a pre-release " ++
                "loaderx; rebuild it with this version",
            .{h.format_version},
        );
    }
    if (h.header_size != @sizeOf(Header)) {
        return diag.fail(error.Corrupt, "meta header has a bad size", .{});
    }
    if (h.checksum != h.computeChecksum()) {
        return diag.fail(error.Corrupt, "meta header checksum mismatch", .{});
    }
    if (h.codec > @backingInt(Codec.zstd_dict)) {
        return diag.fail(error.Corrupt, "meta names unknown codec {d}", .{h.codec});
    }
    if (h.fixed_size != 0 and h.codec != @backingInt(Codec.raw)) {
        return diag.fail(error.Corrupt, "meta names a fixed-width layout with a codec", .{});
    }
    if (h.frame_size != 0 and (h.codec == @backingInt(Codec.raw) or
        h.frame_size < frame_size_min or h.frame_size > frame_size_max))
    {
        return diag.fail(error.Corrupt, "meta names an invalid frame size", .{});
    }
}

/// The commit on disk (not the mapped page: open reads it before mapping).
pub fn readCommit(s: *Store) Error!Commit {
    var c: Commit = undefined;
    try readExact(s.meta, std.mem.asBytes(&c), format.commit_offset, "meta commit");
    if (c.checksum != c.computeChecksum()) {
        return diag.fail(error.Corrupt, "meta commit checksum mismatch", .{});
    }
    if (!c.consistent()) return diag.fail(error.Corrupt, "meta commit is inconsistent", .{});
    if (s.header.fixed_size != 0) {
        const want = std.math.mul(u64, c.record_count, s.header.fixed_size) catch
            std.math.maxInt(u64);
        const durable = std.math.mul(u64, c.durable_count, s.header.fixed_size) catch
            std.math.maxInt(u64);
        if (c.data_size != want or c.live_bytes != want or c.durable_data_size != durable) {
            return diag.fail(
                error.Corrupt,
                "fixed-width store's commit disagrees with its record count",
                .{},
            );
        }
    }
    return c;
}

fn load(s: *Store) Error!void {
    try readExact(s.meta, std.mem.asBytes(&s.header), 0, "meta header");
    try checkHeader(&s.header);
    try s.loadBlobs();
    errdefer s.gpa.free(s.dict_bytes.ptr[0 .. s.dict_bytes.len + s.user_bytes.len]);
    try s.loadIdentity();
    if (s.header.codec == @backingInt(Codec.zstd_dict)) {
        s.dict = codec.Dict.init(s.dict_bytes, s.header.level) catch
            return diag.fail(error.Corrupt, "stored dictionary is damaged", .{});
    }
    errdefer s.dict.deinit();
    errdefer s.index_maps.deinit();
    errdefer s.data_maps.deinit();
    try store_maintain.finishJournal(s);
    s.commit = try store_maintain.checkTail(s);
    assert(s.commit.consistent());
    assert(s.commit.checksum == s.commit.computeChecksum());
    s.meta_map = mapping.Region.map(s.meta, format.meta_map_size, format.meta_map_size) catch |e|
        return ioFail(e, "mapping meta");
}

fn loadBlobs(s: *Store) Error!void {
    const blob_len = std.math.add(u64, s.header.dict_size, s.header.user_size) catch
        return diag.fail(error.Corrupt, "meta blob sizes overflow", .{});
    const meta_len = s.meta.length(pool.io()) catch |e| return ioFail(e, "meta");
    if (blob_len > meta_len -| format.blob_offset) {
        return diag.fail(
            error.Corrupt,
            "meta is truncated: its dictionary and identity need {d} bytes",
            .{blob_len},
        );
    }
    const blob = s.gpa.alloc(u8, @intCast(blob_len)) catch return error.OutOfMemory;
    errdefer s.gpa.free(blob);
    try readExact(s.meta, blob, format.blob_offset, "meta dictionary and identity");
    const dict_len: usize = @intCast(s.header.dict_size);
    if (format.blobChecksum(blob[0..dict_len], blob[dict_len..]) != s.header.blob_checksum) {
        return diag.fail(error.Corrupt, "meta identity checksum mismatch", .{});
    }
    s.dict_bytes = blob[0..dict_len];
    s.user_bytes = blob[dict_len..];
    assert(s.dict_bytes.len == s.header.dict_size);
    assert(s.user_bytes.len == s.header.user_size);
}

/// Checks the type identity in full (format.Identity): a native one in a
/// format-3 store, msgpack (left to Python) in a format-2 one, none in a
/// plain byte store of either.
fn loadIdentity(s: *Store) Error!void {
    if (s.user_bytes.len == 0) {
        s.identity_encoding = .none;
        return;
    }
    if (s.header.format_version < 3) {
        s.identity_encoding = .msgpack;
        return;
    }
    const full = switch (format.Identity.parse(s.user_bytes)) {
        .ok => |full| full,
        .newer => |v| return diag.fail(
            error.NewerFormat,
            "the stored type identity has version {d}, newer than this loaderx reads ({d}); " ++
                "upgrade loaderx",
            .{ v, format.Identity.version_value },
        ),
        .bad => |why| return diag.fail(
            error.Corrupt,
            "the stored type identity is invalid: {s}",
            .{why},
        ),
    };
    if (full.head.layoutProblem(&s.header)) |why| {
        return diag.fail(error.Corrupt, "the stored type identity is invalid: {s}", .{why});
    }
    s.identity = full;
    s.identity_encoding = .native;
    assert(s.identity.descr.len == s.identity.head.descr_size);
    assert(s.identity.name.len == s.identity.head.name_size);
}

// ---------------------------------------------------------------- state

/// Committed records, as published by whichever handle writes.
pub fn recordCount(s: *const Store) Error!u64 {
    return (try store_read.publishedCommit(s)).record_count;
}

pub const Stats = extern struct {
    records: u64,
    live_bytes: u64,
    chunk_bytes: u64,
    reclaimable: u64,
    /// Bumped by every commit: a cache derived from the records (a token
    /// window index) is stale once it differs.
    generation: u64,

    comptime {
        assert(@sizeOf(Stats) == 40);
        assert(@alignOf(Stats) == 8);
    }
};

pub fn stats(s: *Store) Error!Stats {
    const c = try store_read.publishedCommit(s);
    return .{
        .records = c.record_count,
        .live_bytes = c.live_bytes,
        .chunk_bytes = c.data_size,
        .reclaimable = c.data_size - c.live_bytes,
        .generation = c.generation,
    };
}

pub fn entrySize(s: *const Store) u64 {
    return if (s.header.fixed_size != 0) @sizeOf(u32) else @sizeOf(RecordLoc);
}

/// The record table of either layout: a mapped RecordLoc array, or (fixed
/// width) locations computed from the index and a mapped u32 checksum array.
pub const Table = struct {
    locs: [*]const RecordLoc = undefined,
    sums: [*]const u32 = undefined,
    fixed: u64 = 0,
    /// Entries mapped: only records below it may be looked up.
    count: u64 = 0,

    /// Record `i`'s location. In the fixed layout this touches no memory and
    /// leaves `checksum` 0 (use `withChecksum`).
    pub fn get(t: Table, i: u64) RecordLoc {
        assert(i < t.count);
        if (t.fixed == 0) return t.locs[i];
        return .{
            .offset = i * t.fixed,
            .stored_size = t.fixed,
            .raw_size = t.fixed,
            .checksum = 0,
            .codec = @backingInt(Codec.raw),
            ._reserved = 0,
            .aux_size = 0,
        };
    }

    /// Record `i`'s location with its checksum, in either layout.
    pub fn withChecksum(t: Table, i: u64) RecordLoc {
        var loc = t.get(i);
        if (t.fixed != 0) loc.checksum = t.sums[i];
        return loc;
    }

    /// Starts fetching record `i`'s table entry (nothing to fetch when fixed).
    pub fn prefetch(t: Table, i: u64) void {
        assert(i < t.count);
        if (t.fixed == 0) @prefetch(&t.locs[i], .{});
    }
};

/// The table of the first `count` records, mapped.
pub fn table(s: *Store, count: u64) Error!Table {
    const bytes = std.math.mul(u64, count, s.entrySize()) catch
        return diag.fail(error.Corrupt, "record count overflows", .{});
    const base = s.index_maps.cover(s.index, bytes, "index") catch |e| return e;
    const fixed = s.header.fixed_size;
    if (fixed != 0) return .{ .sums = @ptrCast(@alignCast(base)), .fixed = fixed, .count = count };
    return .{ .locs = @ptrCast(@alignCast(base)), .count = count };
}

/// The data file mapped up to `size` bytes.
pub fn dataMap(s: *Store, size: u64) Error![*]const u8 {
    return s.data_maps.cover(s.data, size, "data") catch |e| return e;
}

/// A table entry is trusted only once it lies inside the committed data and
/// its sizes agree with its payload: a damaged entry is an error, never an
/// out-of-bounds read or an allocation sized by garbage.
///
/// `sizes_trusted` skips the payload check (which reads the frame header): a
/// gather decodes into exactly the recorded size and fails on any mismatch, so
/// only callers that size allocations by the entry need it. Skipping it keeps
/// the gather's first pass free of blocking reads, so the frames' cache misses
/// overlap (prefetched) instead of queueing one per record.
pub fn checkLoc(
    loc: RecordLoc,
    index: u64,
    data: [*]const u8,
    data_size: u64,
    sizes_trusted: bool,
) Error!void {
    if (loc.codec > @backingInt(Codec.zstd_dict)) {
        return diag.fail(error.Corrupt, "record {d} has an unknown codec", .{index});
    }
    const end = loc.checkedEnd() orelse std.math.maxInt(u64);
    if (end > data_size) {
        return diag.fail(error.Corrupt, "record {d} lies outside the committed data", .{index});
    }
    assert(loc.end() == end);
    if (sizes_trusted) return;
    const stored = (data + loc.offset + loc.aux_size)[0..@intCast(loc.stored_size)];
    if (!codec.plausible(@fromBackingInt(@intCast(loc.codec)), stored, loc.raw_size)) {
        return diag.fail(
            error.Corrupt,
            "record {d} is damaged (its sizes disagree with its payload)",
            .{index},
        );
    }
}

pub fn dictionary(s: *const Store) []const u8 {
    return s.dict_bytes;
}

pub fn userBlob(s: *const Store) []const u8 {
    return s.user_bytes;
}

pub fn codecOf(s: *const Store) Codec {
    return @fromBackingInt(@intCast(s.header.codec));
}

// ---------------------------------------------------------------- readers

/// Counts a read in; refused while delete/compact runs or after a failure.
pub fn enterRead(s: *Store) Error!void {
    try s.checkUsable();
    _ = s.readers_active.fetchAdd(1, .seq_cst);
    if (s.exclusive.load(.seq_cst)) {
        _ = s.readers_active.fetchSub(1, .seq_cst);
        return diag.fail(error.Busy, "a delete or compact is running on this handle", .{});
    }
}

pub fn exitRead(s: *Store) void {
    const before = s.readers_active.fetchSub(1, .release);
    assert(before >= 1);
}

// ---------------------------------------------------------------- writer side

/// Checks that this handle may mutate the store now, and takes the writer
/// lock on its first mutation. Caller holds write_mutex.
pub fn beginMutation(s: *Store) Error!void {
    assert(s.write_mutex.state.load(.monotonic) != .unlocked);
    try s.checkUsable();
    const pid = pool.currentPid();
    if (pid != s.open_pid) {
        return diag.fail(
            error.Locked,
            "this handle was opened by process {d} and cannot write from process {d} " ++
                "(a forked child): open the store again in the child to write",
            .{ s.open_pid, pid },
        );
    }
    if (s.writer_lock != null) return;
    if (!s.writable) {
        return diag.fail(error.ReadOnly, "store is opened read-only (no write permission)", .{});
    }
    const lock = try s.takeWriterLock();
    // Another writer may have committed since we opened.
    s.commit = s.readCommit() catch |e| {
        lock.close(pool.io());
        return e;
    };
    s.writer_lock = lock;
    assert(s.commit.consistent());
    try store_maintain.dropDeadJournal(s);
}

/// Opens `lock` and takes its exclusive file lock; Locked when another
/// handle holds it. The caller closes the file to release the lock.
pub fn takeWriterLock(s: *Store) Error!File {
    const io = pool.io();
    const lock = fsio.create(s.dir, "lock", false) catch |e| return ioFail(e, "opening lock");
    const got = lock.tryLock(io, .exclusive) catch |e| {
        lock.close(io);
        return ioFail(e, "taking the writer lock");
    };
    if (!got) {
        lock.close(io);
        return diag.fail(error.Locked, "another handle holds this store's writer lock", .{});
    }
    return lock;
}

/// Publishes commit `c` (one positional write of the commit page); its
/// generation follows the last one. A failed write leaves the handle failed:
/// what reached the disk is unknown.
pub fn writeCommit(s: *Store, c: Commit) Error!void {
    var next = c;
    next.generation = s.commit.generation + 1;
    next.checksum = next.computeChecksum();
    assert(next.consistent());
    assert(next.checksum == next.computeChecksum());
    if (s.header.fixed_size != 0) {
        // readCommit refuses any other fixed-width commit: publishing one
        // would leave a store that never opens again.
        assert(next.data_size == next.record_count * s.header.fixed_size);
        assert(next.live_bytes == next.data_size);
        assert(next.durable_data_size == next.durable_count * s.header.fixed_size);
    }
    fsio.write(s.meta, "meta", std.mem.asBytes(&next), format.commit_offset) catch |e|
        return s.failWith(e, "writing the commit");
    s.commit = next;
}

/// The store's files a writer fsyncs.
pub const FileId = enum { meta, index, data };

/// Fsyncs one of the store's files; a failure leaves the handle failed.
pub fn syncFile(s: *Store, id: FileId) Error!void {
    const file = switch (id) {
        .meta => s.meta,
        .index => s.index,
        .data => s.data,
    };
    const what = switch (id) {
        .meta => "syncing meta",
        .index => "syncing the record table",
        .data => "syncing data",
    };
    fsio.sync(file, @tagName(id)) catch |e| return s.failWith(e, what);
}

/// Makes every appended record durable and records that in the commit:
/// data, then table, then the commit. Caller holds write_mutex as a writer.
pub fn syncLocked(s: *Store) Error!void {
    assert(s.write_mutex.state.load(.monotonic) != .unlocked);
    try s.syncFile(.data);
    try s.syncFile(.index);
    var c = s.commit;
    c.durable_count = c.record_count;
    c.durable_data_size = c.data_size;
    c.durable_live_bytes = c.live_bytes;
    try s.writeCommit(c);
    try s.syncFile(.meta);
    assert(s.commit.durable_count == s.commit.record_count);
    assert(s.commit.durable_data_size == s.commit.data_size);
}

/// Claims exclusive access for delete/compact: no gather in flight through
/// this handle, and no other handle open anywhere. Caller holds write_mutex.
pub fn acquireExclusive(s: *Store) Error!void {
    assert(s.write_mutex.state.load(.monotonic) != .unlocked);
    assert(!s.exclusive.load(.seq_cst));
    s.exclusive.store(true, .seq_cst);
    if (s.readers_active.load(.seq_cst) != 0) {
        s.exclusive.store(false, .seq_cst);
        return diag.fail(
            error.Busy,
            "gathers are running on this handle; delete and compact need exclusive access",
            .{},
        );
    }
    const got = s.upgradeMetaLock() catch |e| {
        s.exclusive.store(false, .seq_cst);
        return e;
    };
    if (!got) {
        s.exclusive.store(false, .seq_cst);
        return diag.fail(
            error.Busy,
            "another handle has this store open; delete and compact need exclusive access",
            .{},
        );
    }
    assert(s.exclusive.load(.seq_cst));
}

/// Trades this handle's shared lock on meta for an exclusive one; false when
/// another handle holds a lock. flock converts non-atomically: a refused
/// conversion has already dropped the shared lock, so it is taken back, and
/// failing that fails the handle.
pub fn upgradeMetaLock(s: *Store) Error!bool {
    const io = pool.io();
    const got = s.meta.tryLock(io, .exclusive) catch |e| return ioFail(e, "locking meta");
    if (got) return true;
    const back = s.meta.tryLock(io, .shared) catch |e|
        return s.failWith(e, "taking back the shared lock on meta");
    if (!back) return s.failWith(error.WouldBlock, "taking back the shared lock on meta");
    return false;
}

/// Gives exclusive access back. The shared lock must come back too: without
/// it another process could delete under this handle, so failing to get it
/// fails the handle.
pub fn releaseExclusive(s: *Store) void {
    s.meta.downgradeLock(pool.io()) catch |e| s.markFailed(e, "returning to a shared lock on meta");
    s.exclusive.store(false, .seq_cst);
}

test {
    _ = @import("store_test.zig");
    _ = store_create;
    _ = store_fork;
}
