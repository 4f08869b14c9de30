//! One record store (a directory; layout in format.zig), batch-only.
//!
//! Reads of committed records go through read-only shared memory mappings of
//! the table and data files, so a gather costs no syscall per record. Mappings
//! grow by generations (each at least twice the last) and old generations stay
//! mapped until close, so a reader never sees a mapping disappear: the read
//! path takes no lock. Committed records are immutable; only delete and compact
//! rewrite them, and both demand exclusive access (refused, never forced).
//!
//! Two layouts share every code path through `Table`: the general one (a
//! 32-byte RecordLoc per record: any size, codec and aux bytes) and the
//! fixed-width raw one (locations computed as i * fixed_size, a u32 checksum
//! per record; deletes move survivors' bytes so the data stays dense).
//!
//! Writers: the first mutation through a handle takes the store's writer lock
//! (an exclusive file lock on `lock`), held until close; a mutation through any
//! other handle, in this process or another, then fails with `Locked`. Within a
//! handle, appends are serialized by a mutex around placement and publication;
//! compression runs before it, on all lanes.
//!
//! Every handle holds a shared lock on `meta`; delete and compact upgrade it to
//! exclusive and fail with `Busy` while any other handle has the store open.
//!
//! Durability: after a process crash (kill -9) at any instant, the store opens
//! and holds a prefix of what was appended, byte-exact (the page cache keeps
//! every completed write). After a power loss, what `sync()` covered survives;
//! records appended after the last sync may be missing or, if the OS wrote
//! pages out of order, reported by `verify()`.
const Store = @This();

const std = @import("std");
const builtin = @import("builtin");
const Io = std.Io;
const File = Io.File;
const Allocator = std.mem.Allocator;
const assert = std.debug.assert;

const format = @import("format.zig");
const codec = @import("codec.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
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
};

pub const aux_size_max: usize = std.math.maxInt(u16);

gpa: Allocator,
dir: Io.Dir,
meta: File,
index: File,
data: File,
/// The writer lock file, open and locked once this handle has mutated.
writer_lock: ?File = null,
writable: bool,
header: Header,
/// Owned copies of the blobs stored in meta.
dict_bytes: []u8,
user_bytes: []u8,
dict: codec.Dict = .{},
/// Header and commit pages of meta, mapped shared read-only: other handles'
/// commits show up here without a syscall.
meta_map: Region,
index_maps: MapSet = .{},
data_maps: MapSet = .{},
/// Serializes mutations through this handle.
write_mutex: Io.Mutex = .init,
/// The last commit this handle published; valid while it holds the writer lock.
commit: Commit = undefined,
/// The end state of appends made with `stage`, written to disk but not yet
/// published: readers (and a crash) see only `commit`.
staged: ?Commit = null,
/// Gathers in flight through this handle, and the flag delete/compact raise.
readers_active: std.atomic.Value(u32) = .init(0),
exclusive: std.atomic.Value(bool) = .init(false),
/// Owners of this handle: its opener, plus every Loader reading it. The last
/// `release` closes it, so a loader's threads never read an unmapped store.
refs: std.atomic.Value(u32) = .init(1),
/// Set when the opener has let go (lx_close); loaders stop reading then.
owner_closed: std.atomic.Value(bool) = .init(false),

// ---------------------------------------------------------------- mappings

const Region = struct {
    memory: []align(std.heap.page_size_min) u8,
    mm: if (builtin.os.tag == .windows) File.MemoryMap else void,

    fn map(file: File, len: usize, file_len: u64) !Region {
        if (builtin.os.tag == .windows) {
            // A Windows section cannot extend past the end of a read-only file.
            const n: usize = @intCast(@min(len, file_len));
            const mm = try file.createMemoryMap(pool.io(), .{
                .len = n,
                .protection = .{ .read = true },
                .populate = false,
            });
            return .{ .memory = mm.memory, .mm = mm };
        }
        const memory = try std.posix.mmap(null, len, .{ .READ = true }, .{ .TYPE = .SHARED }, file.handle, 0);
        return .{ .memory = memory, .mm = {} };
    }

    fn unmap(r: *Region) void {
        if (builtin.os.tag == .windows) {
            r.mm.destroy(pool.io());
        } else {
            std.posix.munmap(r.memory);
        }
    }
};

/// Generations of one file's mapping; readers load the newest lock-free.
const MapSet = struct {
    const generations_max = 48;
    const first_len: usize = 1 << 20;

    regions: [generations_max]Region = undefined,
    count: std.atomic.Value(usize) = .init(0),
    mutex: Io.Mutex = .init,

    /// Base address valid for bytes [0, end) of `file`.
    fn cover(ms: *MapSet, file: File, end: u64, what: []const u8) Error![*]const u8 {
        const n = ms.count.load(.acquire);
        if (n > 0 and ms.regions[n - 1].memory.len >= end) return ms.regions[n - 1].memory.ptr;
        return ms.grow(file, end, what);
    }

    fn grow(ms: *MapSet, file: File, end: u64, what: []const u8) Error![*]const u8 {
        const io = pool.io();
        ms.mutex.lockUncancelable(io);
        defer ms.mutex.unlock(io);
        const n = ms.count.load(.acquire);
        const last_len: usize = if (n > 0) ms.regions[n - 1].memory.len else 0;
        if (n > 0 and last_len >= end) return ms.regions[n - 1].memory.ptr;
        if (n == generations_max) return diag.fail(error.OutOfMemory, "{s}: too many mapping generations", .{what});
        const file_len = file.length(io) catch |e| return ioFail(e, what);
        if (file_len < end) {
            return diag.fail(error.Corrupt, "{s} file is truncated: {d} bytes, committed records need {d}", .{ what, file_len, end });
        }
        if (end > std.math.maxInt(usize) / 2) return diag.fail(error.OutOfMemory, "{s}: store too large for this address space", .{what});
        const want = @max(@max(end, 2 * last_len), @max(first_len, file_len));
        const len = std.mem.alignForward(usize, @intCast(want), std.heap.pageSize());
        const region = Region.map(file, len, file_len) catch |e| return ioFail(e, what);
        ms.regions[n] = region;
        ms.count.store(n + 1, .release);
        return region.memory.ptr;
    }

    fn deinit(ms: *MapSet) void {
        for (ms.regions[0..ms.count.raw]) |*r| r.unmap();
        ms.count.raw = 0;
    }
};

fn ioFail(e: anyerror, what: []const u8) Error {
    diag.set("{s}: {s}", .{ what, @errorName(e) });
    return switch (e) {
        error.OutOfMemory, error.SystemResources, error.LockedMemoryLimitExceeded => error.OutOfMemory,
        error.NoSpaceLeft, error.DiskQuota, error.FileTooBig => error.NoSpace,
        error.AccessDenied, error.PermissionDenied, error.ReadOnlyFileSystem => error.ReadOnly,
        else => error.IoFailed,
    };
}

// ---------------------------------------------------------------- open / create

pub const OpenOptions = struct {
    create: bool = false,
    codec: Codec = .zstd,
    level: i32 = codec.level_default,
    dict: []const u8 = &.{},
    user: []const u8 = &.{},
    /// Non-zero (raw codec only): the fixed-width layout, see format.Header.
    fixed_size: u64 = 0,
};

fn validateCreate(opts: OpenOptions) Error!void {
    if (opts.fixed_size != 0 and opts.codec != .raw) return diag.fail(error.InvalidArgument, "the fixed-width layout needs codec raw", .{});
    if (!codec.levelValid(opts.level)) return diag.fail(error.InvalidArgument, "zstd level {d} is out of range", .{opts.level});
    if (opts.codec == .zstd_dict) {
        if (opts.dict.len == 0) return diag.fail(error.BadDictionary, "codec zstd_dict needs a dictionary (dict_bytes); train one with train_dict", .{});
        var d = codec.Dict.init(opts.dict, opts.level) catch
            return diag.fail(error.BadDictionary, "dict_bytes ({d} bytes) is not a zstd dictionary; train one with train_dict", .{opts.dict.len});
        d.deinit();
    } else if (opts.dict.len != 0) {
        return diag.fail(error.BadDictionary, "dict_bytes given but codec is {s}; use codec zstd_dict", .{@tagName(opts.codec)});
    }
}

pub fn open(gpa: Allocator, path: []const u8, opts: OpenOptions) Error!*Store {
    const io = pool.io();
    if (opts.create) try validateCreate(opts);
    const cwd = Io.Dir.cwd();
    const dir = cwd.openDir(io, path, .{}) catch |e| switch (e) {
        error.FileNotFound => blk: {
            if (!opts.create) return diag.fail(error.NotFound, "no store at this path", .{});
            cwd.createDirPath(io, path) catch |e2| return ioFail(e2, "creating the store directory");
            break :blk cwd.openDir(io, path, .{}) catch |e2| return ioFail(e2, "opening the store directory");
        },
        error.NotDir => return diag.fail(error.NotAStore, "path is a file, not a store directory", .{}),
        else => return ioFail(e, "opening the store directory"),
    };
    errdefer dir.close(io);
    if (opts.create) try createIfMissing(dir, opts);

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
    };
    try s.openFiles();
    errdefer s.closeFiles();
    try s.load();
    return s;
}

fn openRw(dir: Io.Dir, name: []const u8, writable: *bool) !File {
    const io = pool.io();
    if (writable.*) {
        if (dir.openFile(io, name, .{ .mode = .read_write })) |f| return f else |e| switch (e) {
            error.AccessDenied, error.PermissionDenied, error.ReadOnlyFileSystem => writable.* = false,
            else => return e,
        }
    }
    return dir.openFile(io, name, .{ .mode = .read_only });
}

fn openFiles(s: *Store) Error!void {
    const io = pool.io();
    s.meta = openRw(s.dir, "meta", &s.writable) catch |e| switch (e) {
        error.FileNotFound => return diag.fail(error.NotAStore, "directory holds no loaderx store (no meta file)", .{}),
        else => return ioFail(e, "opening meta"),
    };
    errdefer s.meta.close(io);
    // Shared: delete and compact need every other handle gone.
    const got = s.meta.tryLock(io, .shared) catch |e| return ioFail(e, "locking meta");
    if (!got) return diag.fail(error.Busy, "another handle is deleting or compacting this store", .{});
    s.index = openRw(s.dir, "index", &s.writable) catch |e| switch (e) {
        error.FileNotFound => return diag.fail(error.Corrupt, "index file is missing", .{}),
        else => return ioFail(e, "opening index"),
    };
    errdefer s.index.close(io);
    s.data = openRw(s.dir, "data", &s.writable) catch |e| switch (e) {
        error.FileNotFound => return diag.fail(error.Corrupt, "data file is missing", .{}),
        else => return ioFail(e, "opening data"),
    };
}

fn closeFiles(s: *Store) void {
    const io = pool.io();
    s.data.close(io);
    s.index.close(io);
    s.meta.close(io);
}

fn readExact(file: File, buf: []u8, offset: u64, what: []const u8) Error!void {
    const n = file.readPositionalAll(pool.io(), buf, offset) catch |e| return ioFail(e, what);
    if (n != buf.len) return diag.fail(error.Corrupt, "{s} is truncated", .{what});
}

fn checkHeader(h: *const Header) Error!void {
    if (h.magic == format.magic_swapped) return diag.fail(error.NotAStore, "store was written with the other byte order", .{});
    if (h.magic != format.magic) return diag.fail(error.NotAStore, "meta has no loaderx magic number", .{});
    if (h.format_version > format.format_version) {
        return diag.fail(error.NewerFormat, "store format version {d} is newer than this loaderx supports ({d}); upgrade loaderx", .{ h.format_version, format.format_version });
    }
    if (h.format_version == 0 or h.header_size != @sizeOf(Header)) return diag.fail(error.Corrupt, "meta header is damaged (bad version or size)", .{});
    if (h.checksum != h.computeChecksum()) return diag.fail(error.Corrupt, "meta header checksum mismatch", .{});
    if (h.codec > @intFromEnum(Codec.zstd_dict)) return diag.fail(error.Corrupt, "meta names unknown codec {d}", .{h.codec});
}

fn readCommit(s: *Store) Error!Commit {
    var c: Commit = undefined;
    try readExact(s.meta, std.mem.asBytes(&c), format.commit_offset, "meta commit");
    if (c.checksum != c.computeChecksum()) return diag.fail(error.Corrupt, "meta commit checksum mismatch", .{});
    if (c.live_bytes > c.data_size) return diag.fail(error.Corrupt, "meta commit is inconsistent", .{});
    return c;
}

fn load(s: *Store) Error!void {
    const io = pool.io();
    try readExact(s.meta, std.mem.asBytes(&s.header), 0, "meta header");
    try checkHeader(&s.header);
    try s.replayJournal();
    const c = try s.readCommit();

    const blob_len = std.math.add(u64, s.header.dict_size, s.header.user_size) catch
        return diag.fail(error.Corrupt, "meta blob sizes overflow", .{});
    if (blob_len > 1 << 32) return diag.fail(error.Corrupt, "meta blob sizes are implausible", .{});
    const blob = s.gpa.alloc(u8, @intCast(blob_len)) catch return error.OutOfMemory;
    errdefer s.gpa.free(blob);
    try readExact(s.meta, blob, format.blob_offset, "meta dictionary and identity");
    if (std.hash.XxHash64.hash(0x4C5C, blob) != s.header.blob_checksum) return diag.fail(error.Corrupt, "meta identity checksum mismatch", .{});
    const dict_len: usize = @intCast(s.header.dict_size);
    s.dict_bytes = blob[0..dict_len];
    s.user_bytes = blob[dict_len..];

    const index_len = s.index.length(io) catch |e| return ioFail(e, "index");
    const entry_size = s.entrySize();
    if (index_len / entry_size < c.record_count) {
        return diag.fail(error.Corrupt, "index file is truncated: holds {d} of {d} committed records", .{ index_len / entry_size, c.record_count });
    }
    if (s.header.fixed_size != 0) {
        const want = std.math.mul(u64, c.record_count, s.header.fixed_size) catch std.math.maxInt(u64);
        if (s.header.codec != @intFromEnum(Codec.raw) or c.data_size != want or c.live_bytes != want) {
            return diag.fail(error.Corrupt, "fixed-width store's commit disagrees with its record count", .{});
        }
    }
    const data_len = s.data.length(io) catch |e| return ioFail(e, "data");
    if (data_len < c.data_size) return diag.fail(error.Corrupt, "data file is truncated: {d} of {d} committed bytes", .{ data_len, c.data_size });

    if (s.header.codec == @intFromEnum(Codec.zstd_dict)) {
        s.dict = codec.Dict.init(s.dict_bytes, s.header.level) catch return diag.fail(error.Corrupt, "stored dictionary is damaged", .{});
    }
    errdefer s.dict.deinit();
    s.meta_map = Region.map(s.meta, format.meta_map_size, format.meta_map_size) catch |e| return ioFail(e, "mapping meta");
    s.commit = c;
}

fn initialCommit() Commit {
    var c = std.mem.zeroes(Commit);
    c.checksum = c.computeChecksum();
    return c;
}

fn createIfMissing(dir: Io.Dir, opts: OpenOptions) Error!void {
    const io = pool.io();
    if (dir.access(io, "meta", .{})) |_| return else |_| {}
    // Before creating anything: a refused create leaves the directory as it was.
    try refuseForeignFiles(dir);
    // The writer lock serializes concurrent creators: only one writes meta.
    const lock = dir.createFile(io, "lock", .{ .truncate = false, .read = true }) catch |e| return ioFail(e, "creating lock");
    defer lock.close(io);
    lock.lock(io, .exclusive) catch |e| return ioFail(e, "locking lock");
    defer lock.unlock(io);
    if (dir.access(io, "meta", .{})) |_| return else |_| {}

    for ([_][]const u8{ "index", "data" }) |name| {
        const f = dir.createFile(io, name, .{ .truncate = true }) catch |e| return ioFail(e, "creating store files");
        f.close(io);
    }
    var header = std.mem.zeroes(Header);
    header.magic = format.magic;
    header.format_version = format.format_version;
    header.header_size = @sizeOf(Header);
    header.codec = @intFromEnum(opts.codec);
    header.level = opts.level;
    header.dict_size = opts.dict.len;
    header.user_size = opts.user.len;
    header.fixed_size = opts.fixed_size;
    var hasher = std.hash.XxHash64.init(0x4C5C);
    hasher.update(opts.dict);
    hasher.update(opts.user);
    header.blob_checksum = hasher.final();
    header.checksum = header.computeChecksum();
    const commit = initialCommit();

    const tmp = dir.createFile(io, "meta.tmp", .{ .truncate = true }) catch |e| return ioFail(e, "creating meta");
    {
        defer tmp.close(io);
        var page: [format.page_size]u8 = @splat(0);
        @memcpy(page[0..@sizeOf(Header)], std.mem.asBytes(&header));
        tmp.writePositionalAll(io, &page, 0) catch |e| return ioFail(e, "writing meta");
        @memset(&page, 0);
        @memcpy(page[0..@sizeOf(Commit)], std.mem.asBytes(&commit));
        tmp.writePositionalAll(io, &page, format.commit_offset) catch |e| return ioFail(e, "writing meta");
        tmp.writePositionalAll(io, opts.dict, format.blob_offset) catch |e| return ioFail(e, "writing meta");
        tmp.writePositionalAll(io, opts.user, format.blob_offset + opts.dict.len) catch |e| return ioFail(e, "writing meta");
        tmp.sync(io) catch |e| return ioFail(e, "syncing meta");
    }
    // meta appears atomically, complete: a crash before this leaves no store.
    dir.rename("meta.tmp", dir, "meta", io) catch |e| return ioFail(e, "publishing meta");
    syncDir(dir);
}

fn syncDir(dir: Io.Dir) void {
    if (builtin.os.tag == .windows) return;
    // A plain directory handle may be O_PATH, which cannot be synced.
    const io = pool.io();
    const d = dir.openDir(io, ".", .{ .iterate = true }) catch return;
    defer d.close(io);
    const f: File = .{ .handle = d.handle, .flags = .{ .nonblocking = false } };
    f.sync(io) catch {};
}

fn refuseForeignFiles(dir: Io.Dir) Error!void {
    const io = pool.io();
    const known = [_][]const u8{ "lock", "index", "data", "meta.tmp", "journal" };
    const d = dir.openDir(io, ".", .{ .iterate = true }) catch |e| return ioFail(e, "listing the store directory");
    defer d.close(io);
    var it = d.iterate();
    while (it.next(io) catch |e| return ioFail(e, "listing the store directory")) |entry| {
        for (known) |k| {
            if (std.mem.eql(u8, k, entry.name)) break;
        } else return diag.fail(error.NotAStore, "directory is not empty and holds no loaderx store (found '{s}')", .{entry.name});
    }
}

/// Adds an owner (see `refs`).
pub fn retain(s: *Store) void {
    _ = s.refs.fetchAdd(1, .monotonic);
}

/// Drops an owner; the last one closes the handle.
pub fn release(s: *Store) void {
    if (s.refs.fetchSub(1, .acq_rel) == 1) s.close();
}

pub fn close(s: *Store) void {
    const io = pool.io();
    s.index_maps.deinit();
    s.data_maps.deinit();
    s.meta_map.unmap();
    s.dict.deinit();
    s.gpa.free(s.dict_bytes.ptr[0 .. s.dict_bytes.len + s.user_bytes.len]);
    if (s.writer_lock) |l| l.close(io);
    s.closeFiles();
    s.dir.close(io);
    s.gpa.destroy(s);
}

// ---------------------------------------------------------------- state

fn mappedCommit(s: *const Store) *const Commit {
    return @ptrCast(@alignCast(s.meta_map.memory[format.commit_offset..].ptr));
}

/// Committed records, as published by whichever handle writes.
pub fn recordCount(s: *const Store) u64 {
    return @atomicLoad(u64, &mappedCommit(s).record_count, .acquire);
}

pub const Stats = extern struct {
    records: u64,
    live_bytes: u64,
    chunk_bytes: u64,
    reclaimable: u64,
};

pub fn stats(s: *Store) Stats {
    const c = mappedCommit(s);
    const data_size = @atomicLoad(u64, &c.data_size, .acquire);
    const live = @min(@atomicLoad(u64, &c.live_bytes, .acquire), data_size);
    return .{
        .records = s.recordCount(),
        .live_bytes = live,
        .chunk_bytes = data_size,
        .reclaimable = data_size - live,
    };
}

fn entrySize(s: *const Store) u64 {
    return if (s.header.fixed_size != 0) @sizeOf(u32) else @sizeOf(RecordLoc);
}

/// The record table of either layout: a mapped RecordLoc array, or (fixed
/// width) locations computed from the index and a mapped u32 checksum array.
const Table = struct {
    locs: [*]const RecordLoc = undefined,
    sums: [*]const u32 = undefined,
    fixed: u64 = 0,

    /// Record `i`'s location. In the fixed layout this touches no memory and
    /// leaves `checksum` 0 (use `checksumOf`).
    fn get(t: Table, i: u64) RecordLoc {
        if (t.fixed == 0) return t.locs[i];
        return .{
            .offset = i * t.fixed,
            .stored_size = t.fixed,
            .raw_size = t.fixed,
            .checksum = 0,
            .codec = @intFromEnum(Codec.raw),
            ._reserved = 0,
            .aux_size = 0,
        };
    }

    /// Starts fetching record `i`'s table entry (nothing to fetch when fixed).
    fn prefetch(t: Table, i: u64) void {
        if (t.fixed == 0) @prefetch(&t.locs[i], .{});
    }

    fn checksumOf(t: Table, i: u64) u32 {
        return if (t.fixed == 0) t.locs[i].checksum else t.sums[i];
    }
};

fn table(s: *Store, count: u64) Error!Table {
    const bytes = std.math.mul(u64, count, s.entrySize()) catch return diag.fail(error.Corrupt, "record count overflows", .{});
    const base = try s.index_maps.cover(s.index, bytes, "index");
    if (s.header.fixed_size != 0) return .{ .sums = @ptrCast(@alignCast(base)), .fixed = s.header.fixed_size };
    return .{ .locs = @ptrCast(@alignCast(base)) };
}

fn enterRead(s: *Store) Error!void {
    _ = s.readers_active.fetchAdd(1, .seq_cst);
    if (s.exclusive.load(.seq_cst)) {
        _ = s.readers_active.fetchSub(1, .seq_cst);
        return diag.fail(error.Busy, "a delete or compact is running on this handle", .{});
    }
}

fn exitRead(s: *Store) void {
    _ = s.readers_active.fetchSub(1, .release);
}

// ---------------------------------------------------------------- gather

pub const Part = enum(u8) { payload = 0, aux = 1 };

/// Where record i of a batch goes: at `offsets[i]` when given, else at
/// `i * stride` and then every record must be exactly `stride` bytes.
pub const Dest = struct {
    base: [*]u8,
    len: usize,
    stride: usize = 0,
    offsets: ?[*]const u64 = null,
};

const GatherJob = struct {
    store: *Store,
    indices: []const u64,
    locs: Table,
    data: [*]const u8,
    dest: Dest,
    part: Part,
    block_size: usize,
    multi_lane: bool,
    next_block: std.atomic.Value(usize) = .init(0),
    failed: std.atomic.Value(bool) = .init(false),
    fail_index: u64 = 0,

    fn destOffset(job: *const GatherJob, i: usize) usize {
        return if (job.dest.offsets) |o| @intCast(o[i]) else i * job.dest.stride;
    }

    fn work(job: *GatherJob, lane: usize) void {
        _ = lane;
        var lease: ?codec.DPool.Lease = null;
        defer if (lease) |l| codec.DPool.release(l);
        while (!job.failed.load(.monotonic)) {
            const block = job.next_block.fetchAdd(1, .monotonic);
            const start = block * job.block_size;
            if (start >= job.indices.len) return;
            const stop = @min(start + job.block_size, job.indices.len);
            // With several lanes, pull this block's records into this lane's
            // cache, all misses in flight at once (the first pass prefetched
            // them to lane 0's core). A single lane has them already.
            if (job.multi_lane) for (start..stop) |i| prefetchRecord(job.data, job.locs.get(job.indices[i]));
            for (start..stop) |i| {
                const loc = job.locs.get(job.indices[i]);
                const at = job.destOffset(i);
                const src_aux = job.data + loc.offset;
                if (job.part == .aux) {
                    codec.copy(job.dest.base[at..][0..loc.aux_size], src_aux[0..loc.aux_size]);
                    continue;
                }
                const src = (src_aux + loc.aux_size)[0..@intCast(loc.stored_size)];
                const dst = job.dest.base[at..][0..@intCast(loc.raw_size)];
                const c: Codec = @enumFromInt(loc.codec);
                if (c != .raw and lease == null) {
                    lease = codec.DPool.acquire() catch {
                        job.fail(job.indices[i]);
                        return;
                    };
                }
                codec.decode(if (lease) |l| l.ctx else null, c, &job.store.dict, src, dst) catch {
                    job.fail(job.indices[i]);
                    return;
                };
            }
        }
    }

    fn fail(job: *GatherJob, index: u64) void {
        if (job.failed.cmpxchgStrong(false, true, .acq_rel, .monotonic) == null) job.fail_index = index;
    }
};

/// Starts fetching a record's first lines: every line of a small record (a
/// 200 B record spans up to 4), the first few of a large one, after which the
/// hardware prefetcher follows the sequential copy.
inline fn prefetchRecord(data: [*]const u8, loc: RecordLoc) void {
    const first = data + loc.offset;
    const span = @min(loc.storedTotal(), prefetch_span_max);
    const lines = (span + (loc.offset & 63) + 63) / 64;
    for (0..@intCast(lines)) |line| @prefetch(first + line * 64, .{});
}

const prefetch_span_max: u64 = 256;

/// Bytes of work below which a batch runs inline on the caller: handing half
/// to a second lane costs more than it saves. Measured on 200 B records (batch
/// sweep, 2 cores): random raw copies gain from ~50 KiB (1.25x there, a loss at
/// 25 KiB); zstd frames from ~6 KiB decoded (32 records: 1.27x).
const inline_raw_bytes: u64 = 32 << 10;
const inline_decoded_bytes: u64 = 4 << 10;

/// Reads records `indices` into `dest`, decoding straight into it. All indices
/// and sizes are checked before any byte is written. `lane_cap` 0 = no cap.
pub fn gather(s: *Store, indices: []const u64, dest: Dest, part: Part, lane_cap: usize) Error!void {
    try s.enterRead();
    defer s.exitRead();
    if (indices.len == 0) return;
    const count = s.recordCount();
    const locs = try s.table(count);
    const data_size = s.committedDataSize();
    const data = try s.data_maps.cover(s.data, data_size, "data");
    var raw_bytes: u64 = 0;
    var decoded_bytes: u64 = 0;
    // Random indices miss the cache on their table entries: put every miss in
    // flight before the checks below wait on the first one.
    for (indices) |index| {
        if (index < count) locs.prefetch(index);
    }
    for (indices, 0..) |index, i| {
        if (index >= count) return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records", .{ index, count });
        const loc = locs.get(index);
        // Raw records must still be exactly their stored size (a memcpy has no
        // frame to fail on); compressed ones are checked by the decoder.
        try checkLoc(loc, index, data, data_size, loc.codec != @intFromEnum(Codec.raw));
        // Start fetching the record now: the copy pass then finds it in cache,
        // and the misses of many records overlap instead of queueing.
        prefetchRecord(data, loc);
        const size: u64 = if (part == .aux) loc.aux_size else loc.raw_size;
        if (dest.offsets) |offsets| {
            const stop = std.math.add(u64, offsets[i], size) catch std.math.maxInt(u64);
            if (stop > dest.len) return diag.fail(error.SizeMismatch, "record {d} ({d} bytes) does not fit the destination at offset {d}", .{ index, size, offsets[i] });
        } else if (size != dest.stride) {
            return diag.fail(error.SizeMismatch, "record {d} holds {d} bytes, expected {d}", .{ index, size, dest.stride });
        }
        if (loc.codec == @intFromEnum(Codec.raw) or part == .aux) raw_bytes += size else decoded_bytes += size;
    }
    if (dest.offsets == null and indices.len * dest.stride > dest.len) {
        return diag.fail(error.SizeMismatch, "destination holds {d} bytes, the batch needs {d}", .{ dest.len, indices.len * dest.stride });
    }
    var lanes = pool.lanes();
    if (lane_cap != 0) lanes = @min(lanes, lane_cap);
    if (raw_bytes < inline_raw_bytes and decoded_bytes < inline_decoded_bytes) lanes = 1;
    lanes = @min(lanes, indices.len);
    // A few blocks per lane balance uneven records; blocks stay contiguous.
    const block_count = if (lanes == 1) 1 else @min(indices.len, lanes * 16);
    var job: GatherJob = .{
        .store = s,
        .indices = indices,
        .locs = locs,
        .data = data,
        .dest = dest,
        .part = part,
        .block_size = std.math.divCeil(usize, indices.len, block_count) catch unreachable,
        .multi_lane = lanes > 1,
    };
    pool.run(lanes, &job, GatherJob.work);
    if (job.failed.load(.acquire)) {
        return diag.fail(error.Corrupt, "record {d} is damaged (cannot be decoded)", .{job.fail_index});
    }
}

fn committedDataSize(s: *const Store) u64 {
    return @atomicLoad(u64, &mappedCommit(s).data_size, .acquire);
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
fn checkLoc(loc: RecordLoc, index: u64, data: [*]const u8, data_size: u64, sizes_trusted: bool) Error!void {
    if (loc.codec > @intFromEnum(Codec.zstd_dict)) return diag.fail(error.Corrupt, "record {d} has an unknown codec", .{index});
    const end = std.math.add(u64, loc.offset, loc.storedTotal()) catch std.math.maxInt(u64);
    if (end > data_size) return diag.fail(error.Corrupt, "record {d} lies outside the committed data", .{index});
    if (sizes_trusted) return;
    const stored = (data + loc.offset + loc.aux_size)[0..@intCast(loc.stored_size)];
    if (!codec.plausible(@enumFromInt(loc.codec), stored, loc.raw_size)) {
        return diag.fail(error.Corrupt, "record {d} is damaged (its sizes disagree with its payload)", .{index});
    }
}

/// Payload (raw) and aux sizes of records `indices`; either output may be null.
pub fn sizes(s: *Store, indices: []const u64, raw_out: ?[*]u64, aux_out: ?[*]u64) Error!void {
    try s.enterRead();
    defer s.exitRead();
    const count = s.recordCount();
    const locs = try s.table(count);
    const data_size = s.committedDataSize();
    const data = try s.data_maps.cover(s.data, data_size, "data");
    for (indices, 0..) |index, i| {
        if (index >= count) return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records", .{ index, count });
        const loc = locs.get(index);
        try checkLoc(loc, index, data, data_size, false);
        if (raw_out) |r| r[i] = loc.raw_size;
        if (aux_out) |a| a[i] = loc.aux_size;
    }
}

// ---------------------------------------------------------------- writer side

fn becomeWriter(s: *Store) Error!void {
    if (s.writer_lock != null) return;
    if (!s.writable) return diag.fail(error.ReadOnly, "store is opened read-only (no write permission)", .{});
    const io = pool.io();
    const lock = s.dir.createFile(io, "lock", .{ .truncate = false, .read = true }) catch |e| return ioFail(e, "opening lock");
    const got = lock.tryLock(io, .exclusive) catch |e| {
        lock.close(io);
        return ioFail(e, "taking the writer lock");
    };
    if (!got) {
        lock.close(io);
        return diag.fail(error.Locked, "another handle holds this store's writer lock", .{});
    }
    // Another writer may have committed since we opened.
    s.commit = s.readCommit() catch |e| {
        lock.close(io);
        return e;
    };
    s.writer_lock = lock;
}

fn writeCommit(s: *Store, c: Commit) Error!void {
    var next = c;
    next.generation = s.commit.generation + 1;
    next.checksum = next.computeChecksum();
    s.meta.writePositionalAll(pool.io(), std.mem.asBytes(&next), format.commit_offset) catch |e| return ioFail(e, "writing the commit");
    s.commit = next;
}

/// Writes `slices` back to back at `offset`, handling short writes.
fn writeSlices(file: File, slices: []const []const u8, offset: u64) !void {
    const io = pool.io();
    var at = offset;
    var first: usize = 0;
    var skip: usize = 0; // bytes of slices[first] already written
    var vec: [64][]const u8 = undefined;
    while (first < slices.len) {
        var n: usize = 0;
        var i = first;
        while (i < slices.len and n < vec.len) : (i += 1) {
            const sl = if (i == first) slices[i][skip..] else slices[i];
            if (sl.len == 0) continue;
            // Records adjacent in memory (a dense array) become one large write,
            // which also lets the page cache use large folios.
            if (n > 0 and vec[n - 1].ptr + vec[n - 1].len == sl.ptr) {
                vec[n - 1] = vec[n - 1].ptr[0 .. vec[n - 1].len + sl.len];
                continue;
            }
            vec[n] = sl;
            n += 1;
        }
        if (n == 0) return;
        var written = try file.writePositional(io, vec[0..n], at);
        if (written == 0) return error.NoSpaceLeft;
        at += written;
        while (first < slices.len) {
            const left = slices[first].len - skip;
            if (written < left) {
                skip += written;
                break;
            }
            written -= left;
            first += 1;
            skip = 0;
        }
    }
}

pub const Batch = struct {
    ptrs: [*]const [*]const u8,
    sizes: [*]const u64,
    aux_ptrs: ?[*]const [*]const u8 = null,
    aux_sizes: ?[*]const u64 = null,
    count: usize,

    fn record(b: Batch, i: usize) []const u8 {
        return b.ptrs[i][0..@intCast(b.sizes[i])];
    }

    fn aux(b: Batch, i: usize) []const u8 {
        const sz = b.aux_sizes orelse return &.{};
        return b.aux_ptrs.?[i][0..@intCast(sz[i])];
    }
};

const EncodeJob = struct {
    store: *Store,
    batch: Batch,
    locs: []RecordLoc,
    stored: [][]const u8,
    scratch: []u8,
    scratch_offsets: []usize,
    block_size: usize,
    next_block: std.atomic.Value(usize) = .init(0),
    failed: std.atomic.Value(bool) = .init(false),

    fn work(job: *EncodeJob, lane: usize) void {
        _ = lane;
        const s = job.store;
        const store_codec: Codec = @enumFromInt(s.header.codec);
        var lease: ?codec.CPool.Lease = null;
        defer if (lease) |l| codec.CPool.release(l);
        while (true) {
            const block = job.next_block.fetchAdd(1, .monotonic);
            const start = block * job.block_size;
            if (start >= job.batch.count) return;
            for (start..@min(start + job.block_size, job.batch.count)) |i| {
                const src = job.batch.record(i);
                var c: Codec = .raw;
                var stored = src;
                if (store_codec != .raw and src.len > 0) {
                    if (lease == null) {
                        lease = codec.CPool.acquire() catch {
                            job.failed.store(true, .release);
                            return;
                        };
                        codec.configure(lease.?.ctx, store_codec, s.header.level, &s.dict);
                    }
                    const dst = job.scratch[job.scratch_offsets[i]..job.scratch_offsets[i + 1]];
                    if (codec.encode(lease.?.ctx, src, dst)) |n| {
                        c = store_codec;
                        stored = dst[0..n];
                    }
                }
                const aux = job.batch.aux(i);
                job.stored[i] = stored;
                job.locs[i] = .{
                    .offset = 0,
                    .stored_size = stored.len,
                    .raw_size = src.len,
                    .checksum = format.recordChecksum(aux, stored),
                    .codec = @intFromEnum(c),
                    ._reserved = 0,
                    .aux_size = @intCast(aux.len),
                };
            }
        }
    }
};

/// Appends `batch`; returns the index of its first record. Compresses on all
/// lanes, then places, writes and publishes under the handle's write mutex.
/// With `stage`, the records are written but not published: several staged
/// appends become visible together at `publish(true)` (an append larger than
/// memory, atomic as a whole), or are dropped by `publish(false)`.
pub fn append(s: *Store, batch: Batch, stage: bool) Error!u64 {
    const io = pool.io();
    if (batch.count == 0) {
        if (s.staged) |st| return st.record_count;
        return s.recordCount();
    }
    var raw_total: u64 = 0;
    const fixed = s.header.fixed_size;
    for (0..batch.count) |i| {
        if (batch.aux(i).len > aux_size_max) return diag.fail(error.InvalidArgument, "record {d}: aux of {d} bytes exceeds {d}", .{ i, batch.aux(i).len, aux_size_max });
        if (fixed != 0 and (batch.sizes[i] != fixed or batch.aux(i).len != 0)) {
            return diag.fail(error.SizeMismatch, "record {d} holds {d} bytes; this fixed-width store takes exactly {d}", .{ i, batch.sizes[i], fixed });
        }
        raw_total += batch.sizes[i];
    }
    if (fixed != 0 and contiguous(batch, fixed)) return s.appendDense(batch, stage);
    const gpa = s.gpa;
    const locs = gpa.alloc(RecordLoc, batch.count) catch return error.OutOfMemory;
    defer gpa.free(locs);
    const stored = gpa.alloc([]const u8, batch.count) catch return error.OutOfMemory;
    defer gpa.free(stored);
    const scratch_offsets = gpa.alloc(usize, batch.count + 1) catch return error.OutOfMemory;
    defer gpa.free(scratch_offsets);
    scratch_offsets[0] = 0;
    const compressing = s.header.codec != @intFromEnum(Codec.raw);
    for (0..batch.count) |i| {
        const bound = if (compressing and batch.sizes[i] > 0) codec.compressBound(@intCast(batch.sizes[i])) else 0;
        scratch_offsets[i + 1] = scratch_offsets[i] + bound;
    }
    const scratch = gpa.alloc(u8, scratch_offsets[batch.count]) catch return error.OutOfMemory;
    defer gpa.free(scratch);

    var lanes = pool.lanes();
    if (raw_total < (if (compressing) @as(u64, 64 << 10) else inline_raw_bytes)) lanes = 1;
    lanes = @min(lanes, batch.count);
    const block_count = if (lanes == 1) 1 else @min(batch.count, lanes * 4);
    var job: EncodeJob = .{
        .store = s,
        .batch = batch,
        .locs = locs,
        .stored = stored,
        .scratch = scratch,
        .scratch_offsets = scratch_offsets,
        .block_size = std.math.divCeil(usize, batch.count, block_count) catch unreachable,
    };
    pool.run(lanes, &job, EncodeJob.work);
    if (job.failed.load(.acquire)) return diag.fail(error.OutOfMemory, "no memory for a compression context", .{});

    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    try s.becomeWriter();

    // Place serially, then write: data, then table, then the commit.
    var c = s.staged orelse s.commit;
    const first = c.record_count;
    var at = c.data_size;
    var stored_total: u64 = 0;
    for (locs) |*loc| {
        loc.offset = at;
        at += loc.storedTotal();
        stored_total += loc.storedTotal();
    }
    const slices = gpa.alloc([]const u8, 2 * batch.count) catch return error.OutOfMemory;
    defer gpa.free(slices);
    for (0..batch.count) |i| {
        slices[2 * i] = batch.aux(i);
        slices[2 * i + 1] = stored[i];
    }
    writeSlices(s.data, slices, c.data_size) catch |e| return ioFail(e, "writing data");
    if (fixed != 0) {
        // Fixed width: the location is implied; only the checksums are stored.
        const sums = gpa.alloc(u32, batch.count) catch return error.OutOfMemory;
        defer gpa.free(sums);
        for (locs, sums) |loc, *sum| sum.* = loc.checksum;
        s.index.writePositionalAll(io, std.mem.sliceAsBytes(sums), first * @sizeOf(u32)) catch |e| return ioFail(e, "writing the record table");
    } else {
        s.index.writePositionalAll(io, std.mem.sliceAsBytes(locs), first * @sizeOf(RecordLoc)) catch |e| return ioFail(e, "writing the record table");
    }
    c.record_count = first + batch.count;
    c.data_size = at;
    c.live_bytes += stored_total;
    try s.settle(c, stage);
    return first;
}

/// True when the batch's records lie back to back in memory (a dense array).
fn contiguous(batch: Batch, fixed: u64) bool {
    const base = @intFromPtr(batch.ptrs[0]);
    for (0..batch.count) |i| {
        if (@intFromPtr(batch.ptrs[i]) != base + i * fixed) return false;
    }
    return true;
}

/// The dense append's two jobs, overlapped: lane 0 writes the block to the
/// data file while the other lanes checksum it, then lane 0 joins them.
const DenseAppendJob = struct {
    src: [*]const u8,
    fixed: usize,
    sums: []u32,
    block_size: usize,
    file: File,
    offset: u64,
    next_block: std.atomic.Value(usize) = .init(0),
    write_error: ?anyerror = null,

    fn work(job: *DenseAppendJob, lane: usize) void {
        if (lane == 0) {
            job.file.writePositionalAll(pool.io(), job.src[0 .. job.sums.len * job.fixed], job.offset) catch |e| {
                job.write_error = e;
            };
        }
        while (true) {
            const start = job.next_block.fetchAdd(1, .monotonic) * job.block_size;
            if (start >= job.sums.len) return;
            for (start..@min(start + job.block_size, job.sums.len)) |i| {
                job.sums[i] = format.recordChecksum(&.{}, job.src[i * job.fixed ..][0..job.fixed]);
            }
        }
    }
};

/// append() for a fixed-width store given one contiguous array: one write of
/// the whole block, overlapped with its checksums, which go straight into the
/// index; no per-record tables.
fn appendDense(s: *Store, batch: Batch, stage: bool) Error!u64 {
    const io = pool.io();
    const fixed: usize = @intCast(s.header.fixed_size);
    const total = batch.count * fixed;
    const sums = s.gpa.alloc(u32, batch.count) catch return error.OutOfMemory;
    defer s.gpa.free(sums);

    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    try s.becomeWriter();
    var c = s.staged orelse s.commit;
    const first = c.record_count;
    assert(c.data_size == first * fixed);

    var lanes = pool.lanes();
    if (total < inline_raw_bytes) lanes = 1;
    lanes = @min(lanes, batch.count);
    const block_count = if (lanes == 1) 1 else @min(batch.count, lanes * 8);
    var job: DenseAppendJob = .{
        .src = batch.ptrs[0],
        .fixed = fixed,
        .sums = sums,
        .block_size = std.math.divCeil(usize, batch.count, block_count) catch unreachable,
        .file = s.data,
        .offset = c.data_size,
    };
    pool.run(lanes, &job, DenseAppendJob.work);
    if (job.write_error) |e| return ioFail(e, "writing data");
    s.index.writePositionalAll(io, std.mem.sliceAsBytes(sums), first * @sizeOf(u32)) catch |e| return ioFail(e, "writing the record table");
    c.record_count = first + batch.count;
    c.data_size += total;
    c.live_bytes += total;
    try s.settle(c, stage);
    return first;
}

/// Ends an append whose data and table are written: publishes commit `c`, or
/// with `stage` keeps it staged (written, invisible) for a later publish.
fn settle(s: *Store, c: Commit, stage: bool) Error!void {
    if (stage) {
        s.staged = c;
        return;
    }
    s.staged = null;
    try s.writeCommit(c);
}

/// Publishes (or, with `keep` false, drops) the records of staged appends.
pub fn publish(s: *Store, keep: bool) Error!void {
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    const st = s.staged orelse return;
    s.staged = null;
    if (keep) try s.writeCommit(st);
}

fn refuseStaged(s: *Store) Error!void {
    if (s.staged != null) return diag.fail(error.Busy, "a staged append is not yet published on this handle", .{});
}

/// Makes everything appended so far durable: data, then table, then the commit.
pub fn sync(s: *Store) Error!void {
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    if (s.writer_lock == null) return; // nothing written through this handle
    s.data.sync(io) catch |e| return ioFail(e, "syncing data");
    s.index.sync(io) catch |e| return ioFail(e, "syncing the record table");
    var c = s.commit;
    c.durable_count = c.record_count;
    try s.writeCommit(c);
    s.meta.sync(io) catch |e| return ioFail(e, "syncing meta");
}

/// Claims exclusive access for delete/compact: no gather in flight through this
/// handle, and no other handle open anywhere. Caller holds write_mutex.
fn acquireExclusive(s: *Store) Error!void {
    const io = pool.io();
    s.exclusive.store(true, .seq_cst);
    if (s.readers_active.load(.seq_cst) != 0) {
        s.exclusive.store(false, .seq_cst);
        return diag.fail(error.Busy, "gathers are running on this handle; delete and compact need exclusive access", .{});
    }
    s.meta.unlock(io);
    const got = s.meta.tryLock(io, .exclusive) catch false;
    if (!got) {
        s.meta.lock(io, .shared) catch {};
        s.exclusive.store(false, .seq_cst);
        return diag.fail(error.Busy, "another handle has this store open; delete and compact need exclusive access", .{});
    }
}

fn releaseExclusive(s: *Store) void {
    s.meta.downgradeLock(pool.io()) catch {};
    s.exclusive.store(false, .seq_cst);
}

fn writeLoc(s: *Store, index: u64, loc: RecordLoc) Error!void {
    s.index.writePositionalAll(pool.io(), std.mem.asBytes(&loc), index * @sizeOf(RecordLoc)) catch |e| return ioFail(e, "writing the record table");
}

/// Deletes records `indices` (any order, duplicates allowed). Each deleted
/// position below the new length is filled by the highest surviving record
/// above it ("swap-last"), so live records stay exactly 0..len. Atomic across
/// crashes: the moves go to a journal first, replayed on open if interrupted.
pub fn delete(s: *Store, indices: []const u64) Error!void {
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    try s.becomeWriter();
    try s.refuseStaged();
    try s.acquireExclusive();
    defer s.releaseExclusive();

    const count = s.commit.record_count;
    for (indices) |index| {
        if (index >= count) return diag.fail(error.OutOfRange, "index {d} is out of range for {d} records", .{ index, count });
    }
    const sorted = s.gpa.dupe(u64, indices) catch return error.OutOfMemory;
    defer s.gpa.free(sorted);
    std.mem.sortUnstable(u64, sorted, {}, std.sort.asc(u64));
    const unique = dedupe(sorted);
    if (unique.len == 0) return;
    const new_count = count - unique.len;
    const locs = try s.table(count);

    var freed: u64 = 0;
    for (unique) |index| freed += locs.get(index).storedTotal();
    // Holes: deleted positions below new_count, ascending. Survivors: live
    // positions at or above new_count, taken from the top.
    const entries = s.gpa.alloc(format.JournalEntry, unique.len) catch return error.OutOfMemory;
    defer s.gpa.free(entries);
    var entry_count: usize = 0;
    var survivor = count;
    var deleted_top = unique.len; // unique[0..deleted_top] may still hide survivor positions
    for (unique) |hole| {
        if (hole >= new_count) break;
        while (true) {
            survivor -= 1;
            if (deleted_top > 0 and unique[deleted_top - 1] == survivor) {
                deleted_top -= 1;
                continue;
            }
            break;
        }
        assert(survivor >= new_count);
        var moved = locs.get(survivor);
        moved.checksum = locs.checksumOf(survivor);
        entries[entry_count] = .{ .index = hole, .loc = moved };
        entry_count += 1;
    }
    var c = s.commit;
    c.record_count = new_count;
    c.live_bytes -= freed;
    // Fixed width: survivors' bytes move into the holes, so the data stays
    // exactly record_count * fixed_size (nothing for compact to reclaim).
    if (s.header.fixed_size != 0) c.data_size = new_count * s.header.fixed_size;
    try s.writeJournal(entries[0..entry_count], c);
    try s.applyJournal(entries[0..entry_count], c);
}

fn dedupe(sorted: []u64) []u64 {
    if (sorted.len == 0) return sorted;
    var n: usize = 1;
    for (sorted[1..]) |v| {
        if (v != sorted[n - 1]) {
            sorted[n] = v;
            n += 1;
        }
    }
    return sorted[0..n];
}

fn writeJournal(s: *Store, entries: []const format.JournalEntry, c: Commit) Error!void {
    const io = pool.io();
    var h: format.JournalHeader = .{
        .magic = format.JournalHeader.magic_value,
        .entry_count = entries.len,
        .commit = c,
        .entries_checksum = std.hash.XxHash64.hash(0, std.mem.sliceAsBytes(entries)),
        .checksum = 0,
    };
    h.checksum = h.computeChecksum();
    const f = s.dir.createFile(io, "journal", .{ .truncate = true }) catch |e| return ioFail(e, "creating the delete journal");
    defer f.close(io);
    f.writePositionalAll(io, std.mem.sliceAsBytes(entries), @sizeOf(format.JournalHeader)) catch |e| return ioFail(e, "writing the delete journal");
    // The header last: a journal without a valid header is ignored.
    f.writePositionalAll(io, std.mem.asBytes(&h), 0) catch |e| return ioFail(e, "writing the delete journal");
}

fn applyJournal(s: *Store, entries: []const format.JournalEntry, c: Commit) Error!void {
    const fixed = s.header.fixed_size;
    for (entries) |e| {
        if (fixed == 0) {
            try s.writeLoc(e.index, e.loc);
            continue;
        }
        // The survivor sits at or above the new length, which nothing writes
        // until this delete is published: replaying the copy is idempotent.
        try s.copyData(e.loc.offset, e.index * fixed, fixed);
        s.index.writePositionalAll(pool.io(), std.mem.asBytes(&e.loc.checksum), e.index * @sizeOf(u32)) catch |err|
            return ioFail(err, "writing the record table");
    }
    try s.writeCommit(c);
    s.dir.deleteFile(pool.io(), "journal") catch |e| return ioFail(e, "removing the delete journal");
}

/// Finishes a delete interrupted by a crash (called at open, under the shared
/// meta lock, so no delete is running anywhere).
fn replayJournal(s: *Store) Error!void {
    const io = pool.io();
    const f = s.dir.openFile(io, "journal", .{}) catch |e| switch (e) {
        error.FileNotFound => return,
        else => return ioFail(e, "opening the delete journal"),
    };
    defer f.close(io);
    var h: format.JournalHeader = undefined;
    const n = f.readPositionalAll(io, std.mem.asBytes(&h), 0) catch |e| return ioFail(e, "reading the delete journal");
    const valid_header = n == @sizeOf(format.JournalHeader) and h.magic == format.JournalHeader.magic_value and
        h.checksum == h.computeChecksum() and h.entry_count < (1 << 40);
    if (!s.writable) return diag.fail(error.ReadOnly, "store has an unfinished delete and is read-only", .{});
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    try s.becomeWriter();
    if (!valid_header) {
        // The crash came before the journal was complete: the delete never began.
        s.dir.deleteFile(io, "journal") catch |e| return ioFail(e, "removing the delete journal");
        return;
    }
    const entries = s.gpa.alloc(format.JournalEntry, @intCast(h.entry_count)) catch return error.OutOfMemory;
    defer s.gpa.free(entries);
    const m = f.readPositionalAll(io, std.mem.sliceAsBytes(entries), @sizeOf(format.JournalHeader)) catch |e| return ioFail(e, "reading the delete journal");
    if (m != entries.len * @sizeOf(format.JournalEntry) or
        std.hash.XxHash64.hash(0, std.mem.sliceAsBytes(entries)) != h.entries_checksum)
    {
        return diag.fail(error.Corrupt, "delete journal is damaged", .{});
    }
    try s.applyJournal(entries, h.commit);
}

const ByOffset = struct {
    offset: u64,
    index: u64,

    fn less(_: void, a: ByOffset, b: ByOffset) bool {
        return a.offset < b.offset;
    }
};

/// Copies `len` bytes of the data file from `from` to `to` (ranges disjoint).
fn copyData(s: *Store, from: u64, to: u64, len: u64) Error!void {
    assert(to + len <= from or from + len <= to);
    const base = try s.data_maps.cover(s.data, from + len, "data");
    s.data.writePositionalAll(pool.io(), base[@intCast(from)..][0..@intCast(len)], to) catch |e| return ioFail(e, "compacting data");
}

/// Reclaims the bytes of deleted records in place. Records move only toward
/// lower addresses, one at a time, and each table entry is rewritten only once
/// its record's new copy is complete, so an interrupted compact leaves a
/// consistent store and running compact again finishes the job. A record whose
/// new place overlaps its old one is first copied past the end of the data.
pub fn compact(s: *Store) Error!void {
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    try s.becomeWriter();
    try s.refuseStaged();
    try s.acquireExclusive();
    defer s.releaseExclusive();

    const count = s.commit.record_count;
    if (s.header.fixed_size != 0) {
        // Deletes already keep the data dense: only a longer file to trim.
        s.data.setLength(io, s.commit.data_size) catch |e| return ioFail(e, "shrinking data");
        return;
    }
    const locs = (try s.table(count)).locs;
    const order = s.gpa.alloc(ByOffset, @intCast(count)) catch return error.OutOfMemory;
    defer s.gpa.free(order);
    for (order, 0..) |*o, i| o.* = .{ .offset = locs[i].offset, .index = i };
    std.mem.sortUnstable(ByOffset, order, {}, ByOffset.less);

    var cursor: u64 = 0;
    for (order) |o| {
        var loc = locs[o.index];
        const size = loc.storedTotal();
        if (loc.offset == cursor or size == 0) {
            if (size == 0 and loc.offset != cursor) {
                loc.offset = cursor;
                try s.writeLoc(o.index, loc);
            }
            cursor += size;
            continue;
        }
        assert(loc.offset > cursor);
        if (loc.offset - cursor < size) {
            // Overlap: park a copy past the end first (and commit that space,
            // so no append can claim it while the table points there).
            const tail = s.commit.data_size;
            try s.copyData(loc.offset, tail, size);
            var c = s.commit;
            c.data_size = tail + size;
            try s.writeCommit(c);
            loc.offset = tail;
            try s.writeLoc(o.index, loc);
        }
        try s.copyData(loc.offset, cursor, size);
        loc.offset = cursor;
        try s.writeLoc(o.index, loc);
        cursor += size;
    }
    var c = s.commit;
    c.data_size = cursor;
    c.live_bytes = cursor;
    try s.writeCommit(c);
    s.data.setLength(io, cursor) catch |e| return ioFail(e, "shrinking data");
}

/// Checks every committed record: location, checksum, and that it decodes to
/// its recorded size. Returns the first damaged record's index in `bad_index`.
pub fn verify(s: *Store, bad_index: *u64) Error!void {
    try s.enterRead();
    defer s.exitRead();
    bad_index.* = std.math.maxInt(u64);
    const count = s.recordCount();
    const c = mappedCommit(s);
    const data_size = @atomicLoad(u64, &c.data_size, .acquire);
    const locs = try s.table(count);
    const data = try s.data_maps.cover(s.data, data_size, "data");
    var live: u64 = 0;
    var scratch: std.ArrayList(u8) = .empty;
    defer scratch.deinit(s.gpa);
    const lease = codec.DPool.acquire() catch return error.OutOfMemory;
    defer codec.DPool.release(lease);
    for (0..@intCast(count)) |i| {
        var loc = locs.get(i);
        loc.checksum = locs.checksumOf(i);
        bad_index.* = i;
        try checkLoc(loc, i, data, data_size, false);
        const aux = data[@intCast(loc.offset)..][0..loc.aux_size];
        const stored = (data + loc.offset + loc.aux_size)[0..@intCast(loc.stored_size)];
        if (format.recordChecksum(aux, stored) != loc.checksum) return diag.fail(error.Corrupt, "record {d} fails its checksum", .{i});
        scratch.resize(s.gpa, @intCast(loc.raw_size)) catch return error.OutOfMemory;
        codec.decode(lease.ctx, @enumFromInt(loc.codec), &s.dict, stored, scratch.items) catch
            return diag.fail(error.Corrupt, "record {d} does not decode to its recorded size", .{i});
        live += loc.storedTotal();
    }
    bad_index.* = std.math.maxInt(u64);
    if (live != @atomicLoad(u64, &c.live_bytes, .acquire) and s.recordCount() == count) {
        return diag.fail(error.Corrupt, "live byte count {d} disagrees with the records ({d})", .{ c.live_bytes, live });
    }
}

pub fn dictionary(s: *const Store) []const u8 {
    return s.dict_bytes;
}

pub fn userBlob(s: *const Store) []const u8 {
    return s.user_bytes;
}

pub fn codecOf(s: *const Store) Codec {
    return @enumFromInt(s.header.codec);
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

fn tmpPath(tmp: *testing.TmpDir, buf: []u8, name: []const u8) ![]const u8 {
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", testing.allocator);
    defer testing.allocator.free(base);
    return std.fmt.bufPrint(buf, "{s}/{s}", .{ base, name });
}

fn appendSlices(s: *Store, records: []const []const u8) !u64 {
    var ptrs: [64][*]const u8 = undefined;
    var szs: [64]u64 = undefined;
    for (records, 0..) |r, i| {
        ptrs[i] = r.ptr;
        szs[i] = r.len;
    }
    return s.append(.{ .ptrs = &ptrs, .sizes = &szs, .count = records.len }, false);
}

fn readOne(s: *Store, index: u64, out: *std.ArrayList(u8)) !void {
    var raw: [1]u64 = undefined;
    try s.sizes(&.{index}, &raw, null);
    try out.resize(testing.allocator, @intCast(raw[0]));
    const off = [_]u64{0};
    try s.gather(&.{index}, .{ .base = out.items.ptr, .len = out.items.len, .offsets = &off }, .payload, 0);
}

test "append, gather, reopen for every codec" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    inline for (.{ Codec.raw, Codec.zstd }) |cd| {
        const path = try tmpPath(&tmp, &buf, @tagName(cd));
        const text = "hello hello hello hello hello hello hello";
        {
            const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = cd });
            defer s.close();
            try testing.expectEqual(@as(u64, 0), try appendSlices(s, &.{ "a", "", text }));
            try testing.expectEqual(@as(u64, 3), s.recordCount());
        }
        const s = try Store.open(testing.allocator, path, .{});
        defer s.close();
        var out: std.ArrayList(u8) = .empty;
        defer out.deinit(testing.allocator);
        try readOne(s, 2, &out);
        try testing.expectEqualStrings(text, out.items);
        try readOne(s, 1, &out);
        try testing.expectEqual(@as(usize, 0), out.items.len);
        try testing.expectError(error.OutOfRange, readOne(s, 3, &out));
        var bad: u64 = 0;
        try s.verify(&bad);
    }
}

test "open refuses a missing store and a foreign directory" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    try testing.expectError(error.NotFound, Store.open(testing.allocator, try tmpPath(&tmp, &buf, "none"), .{}));
    try tmp.dir.createDirPath(pool.io(), "foreign");
    const f = try tmp.dir.createFile(pool.io(), "foreign/x.txt", .{});
    f.close(pool.io());
    try testing.expectError(error.NotAStore, Store.open(testing.allocator, try tmpPath(&tmp, &buf, "foreign"), .{}));
    try testing.expectError(error.NotAStore, Store.open(testing.allocator, try tmpPath(&tmp, &buf, "foreign"), .{ .create = true }));
}

test "second writer is locked out; delete refuses while another handle is open" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "s");
    const a = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw });
    defer a.close();
    _ = try appendSlices(a, &.{ "x", "y" });
    const b = try Store.open(testing.allocator, path, .{});
    try testing.expectError(error.Locked, appendSlices(b, &.{"z"}));
    try testing.expectEqual(@as(u64, 2), b.recordCount());
    try testing.expectError(error.Busy, a.delete(&.{0}));
    b.close();
    try a.delete(&.{0});
    try testing.expectEqual(@as(u64, 1), a.recordCount());
}

// A seeded fuzzer: random appends, deletes, compacts and reopens against a
// model kept in memory; every record's bytes are checked after each step.
test "fuzz against an in-memory model" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "fuzz");
    var prng = std.Random.DefaultPrng.init(0xC0FFEE);
    const rnd = prng.random();

    var model: std.ArrayList([]u8) = .empty;
    defer {
        for (model.items) |r| gpa.free(r);
        model.deinit(gpa);
    }
    var s = try Store.open(gpa, path, .{ .create = true, .codec = .zstd });
    defer s.close();
    try fuzzStore(gpa, path, &s, &model, rnd, 0);
}

test "fuzz the fixed-width layout against an in-memory model" {
    const gpa = testing.allocator;
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "fixed");
    var prng = std.Random.DefaultPrng.init(0xF1AED);
    var model: std.ArrayList([]u8) = .empty;
    defer {
        for (model.items) |r| gpa.free(r);
        model.deinit(gpa);
    }
    var s = try Store.open(gpa, path, .{ .create = true, .codec = .raw, .fixed_size = 24 });
    defer s.close();
    try testing.expectError(error.SizeMismatch, appendSlices(s, &.{"too short"}));
    try fuzzStore(gpa, path, &s, &model, prng.random(), 24);
}

/// Random appends (records of `fixed` bytes when non-zero), deletes, compacts
/// and reopens of `s`, checking every record against `model` after each step.
fn fuzzStore(gpa: Allocator, path: []const u8, s: **Store, model: *std.ArrayList([]u8), rnd: std.Random, fixed: usize) !void {
    var out: std.ArrayList(u8) = .empty;
    defer out.deinit(gpa);

    for (0..300) |_| {
        switch (rnd.uintLessThan(u8, 10)) {
            0...4 => {
                const n = rnd.uintLessThan(usize, 8) + 1;
                var recs: [8][]const u8 = undefined;
                for (0..n) |i| {
                    const len = if (fixed != 0) fixed else switch (rnd.uintLessThan(u8, 4)) {
                        0 => 0,
                        1 => rnd.uintLessThan(usize, 16),
                        2 => rnd.uintLessThan(usize, 2000),
                        else => rnd.uintLessThan(usize, 70000),
                    };
                    const r = try gpa.alloc(u8, len);
                    // Half compressible, half noise.
                    if (rnd.boolean()) rnd.bytes(r) else for (r, 0..) |*b, j| {
                        b.* = @truncate(j / 7);
                    }
                    recs[i] = r;
                    try model.append(gpa, r);
                }
                _ = try appendSlices(s.*, recs[0..n]);
            },
            5, 6 => if (model.items.len > 0) {
                const k = rnd.uintLessThan(usize, @min(model.items.len, 6)) + 1;
                var idx: [6]u64 = undefined;
                for (0..k) |i| idx[i] = rnd.uintLessThan(u64, model.items.len);
                try s.*.delete(idx[0..k]);
                try modelDelete(gpa, model, idx[0..k]);
            },
            7 => try s.*.compact(),
            else => {
                s.*.close();
                s.* = try Store.open(gpa, path, .{});
            },
        }
        try testing.expectEqual(@as(u64, model.items.len), s.*.recordCount());
        for (model.items, 0..) |r, i| {
            try readOne(s.*, i, &out);
            try testing.expectEqualSlices(u8, r, out.items);
        }
        const st = s.*.stats();
        try testing.expectEqual(st.chunk_bytes, st.live_bytes + st.reclaimable);
    }
    var bad: u64 = 0;
    try s.*.verify(&bad);
    try s.*.compact();
    const st = s.*.stats();
    try testing.expectEqual(@as(u64, 0), st.reclaimable);
}

/// The model of delete: holes below the new length filled from the top.
fn modelDelete(gpa: Allocator, model: *std.ArrayList([]u8), indices: []const u64) !void {
    const sorted = try gpa.dupe(u64, indices);
    defer gpa.free(sorted);
    std.mem.sortUnstable(u64, sorted, {}, std.sort.asc(u64));
    const unique = dedupe(sorted);
    const new_len = model.items.len - unique.len;
    var survivor = model.items.len;
    var top = unique.len;
    for (unique) |hole| {
        gpa.free(model.items[hole]);
        model.items[hole] = &.{};
    }
    for (unique) |hole| {
        if (hole >= new_len) break;
        while (true) {
            survivor -= 1;
            if (top > 0 and unique[top - 1] == survivor) {
                top -= 1;
                continue;
            }
            break;
        }
        model.items[hole] = model.items[survivor];
        model.items[survivor] = &.{};
    }
    model.shrinkRetainingCapacity(new_len);
}

test "fixed-width append of one contiguous block takes the dense path and reads back" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    var buf: [4096]u8 = undefined;
    const path = try tmpPath(&tmp, &buf, "dense");
    const s = try Store.open(testing.allocator, path, .{ .create = true, .codec = .raw, .fixed_size = 8 });
    defer s.close();
    var block: [10 * 8]u8 = undefined;
    for (&block, 0..) |*b, i| b.* = @intCast(i);
    var ptrs: [10][*]const u8 = undefined;
    var szs: [10]u64 = @splat(8);
    for (&ptrs, 0..) |*p, i| p.* = block[i * 8 ..].ptr;
    try testing.expectEqual(@as(u64, 0), try s.append(.{ .ptrs = &ptrs, .sizes = &szs, .count = 10 }, false));
    try testing.expectEqual(@as(u64, 10), try s.append(.{ .ptrs = &ptrs, .sizes = &szs, .count = 10 }, false));
    var out: [20 * 8]u8 = undefined;
    var idx: [20]u64 = undefined;
    for (&idx, 0..) |*x, i| x.* = 19 - i;
    try s.gather(&idx, .{ .base = &out, .len = out.len, .stride = 8 }, .payload, 0);
    for (0..20) |i| try testing.expectEqualSlices(u8, block[((19 - i) % 10) * 8 ..][0..8], out[i * 8 ..][0..8]);
    var bad: u64 = 0;
    try s.verify(&bad);
    try s.delete(&.{ 0, 5 });
    try s.verify(&bad);
    try testing.expectEqual(@as(u64, 18 * 8), s.stats().chunk_bytes);
}
