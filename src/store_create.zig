//! Creating a store: the checks a create's options pass before anything is
//! written (validate, identityBytes), and the new store's files: `index`,
//! `data` and a complete `meta` (its header, first commit, dictionary and
//! identity), published by one rename (createIfMissing). Store.open calls
//! these; everything after the first open is Store.zig's.
const std = @import("std");
const builtin = @import("builtin");
const Io = std.Io;
const Allocator = std.mem.Allocator;
const assert = std.debug.assert;

const Store = @import("Store.zig");
const format = @import("format.zig");
const codec = @import("codec.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const fsio = @import("fsio.zig");
const store_maintain = @import("store_maintain.zig");
const Codec = format.Codec;
const Commit = format.Commit;
const Header = format.Header;
const Error = Store.Error;
const ioFail = Store.ioFail;

pub const OpenOptions = struct {
    create: bool = false,
    codec: Codec = .zstd,
    level: i32 = codec.level_default,
    dict: []const u8 = &.{},
    /// The type identity (null: none, a plain byte store). Checked in full
    /// (format.Identity.parse) before anything is created.
    identity: ?format.Identity.Full = null,
    /// Non-zero (raw codec only): the fixed-width layout, see format.Header.
    fixed_size: u64 = 0,
    /// Non-zero (zstd codecs only): records longer than this are written
    /// seekable, in frames of this many raw bytes (format.zig).
    frame_size: u64 = 0,
};

/// The bounds of `OpenOptions.frame_size`: a seek table entry holds a frame's
/// sizes in 32 bits, and frames below a few dozen bytes only add overhead.
pub const frame_size_min: u64 = 64;
pub const frame_size_max: u64 = 1 << 30;

pub fn validateCreate(opts: OpenOptions) Error!void {
    if (opts.fixed_size != 0 and opts.codec != .raw) {
        return diag.fail(error.InvalidArgument, "the fixed-width layout needs codec raw", .{});
    }
    if (!codec.levelValid(opts.level)) {
        return diag.fail(error.InvalidArgument, "zstd level {d} is out of range", .{opts.level});
    }
    if (opts.frame_size != 0 and opts.codec == .raw) {
        return diag.fail(error.InvalidArgument, "frame_size applies to the zstd codecs", .{});
    }
    if (opts.frame_size != 0 and
        (opts.frame_size < frame_size_min or opts.frame_size > frame_size_max))
    {
        return diag.fail(
            error.InvalidArgument,
            "frame_size {d} is out of range ({d} to {d} bytes)",
            .{ opts.frame_size, frame_size_min, frame_size_max },
        );
    }
    if (opts.codec == .zstd_dict) {
        if (opts.dict.len == 0) {
            return diag.fail(
                error.BadDictionary,
                "codec zstd_dict needs a dictionary (dict_bytes); train one with train_dict",
                .{},
            );
        }
        var d = codec.Dict.init(opts.dict, opts.level) catch
            return diag.fail(
                error.BadDictionary,
                "dict_bytes ({d} bytes) is not a zstd dictionary; train one with train_dict",
                .{opts.dict.len},
            );
        d.deinit();
    } else if (opts.dict.len != 0) {
        return diag.fail(
            error.BadDictionary,
            "dict_bytes given but codec is {s}; use codec zstd_dict",
            .{@tagName(opts.codec)},
        );
    }
}

/// The stored form of a create's identity (empty for none), checked as
/// every open checks it. The caller frees it.
pub fn identityBytes(gpa: Allocator, opts: OpenOptions) Error![]u8 {
    const id = opts.identity orelse return &.{};
    if (id.descr.len > format.Identity.descr_size_max or
        id.name.len > format.Identity.name_size_max or
        id.head.descr_size != id.descr.len or id.head.name_size != id.name.len)
    {
        const why = "the type identity's dtype texts are too long";
        return diag.fail(error.InvalidArgument, why, .{});
    }
    const bytes = gpa.alloc(u8, id.size()) catch return error.OutOfMemory;
    errdefer gpa.free(bytes);
    id.write(bytes);
    const why = switch (format.Identity.parse(bytes)) {
        .ok => |full| blk: {
            var h = std.mem.zeroes(Header);
            h.fixed_size = opts.fixed_size;
            break :blk full.head.layoutProblem(&h) orelse return bytes;
        },
        .newer => "it names a version this library does not write",
        .bad => |b| b,
    };
    return diag.fail(error.InvalidArgument, "the type identity is invalid: {s}", .{why});
}

fn initialCommit() Commit {
    var c = std.mem.zeroes(Commit);
    c.checksum = c.computeChecksum();
    return c;
}

fn newHeader(opts: OpenOptions, user: []const u8) Header {
    var header = std.mem.zeroes(Header);
    header.magic = format.magic;
    header.format_version = format.format_version;
    header.header_size = @sizeOf(Header);
    header.codec = @backingInt(opts.codec);
    header.level = opts.level;
    header.dict_size = opts.dict.len;
    header.user_size = user.len;
    header.fixed_size = opts.fixed_size;
    header.frame_size = opts.frame_size;
    header.uid = newUid();
    header.blob_checksum = format.blobChecksum(opts.dict, user);
    header.checksum = header.computeChecksum();
    // validateCreate's rules, which every open checks again (checkHeader).
    assert(header.fixed_size == 0 or opts.codec == .raw);
    assert(header.frame_size == 0 or opts.codec != .raw);
    assert(header.uid != 0);
    return header;
}

/// A random store id, never 0 (0 marks stores written before ids existed).
fn newUid() u64 {
    return randomU64() | 1;
}

var random_calls: std.atomic.Value(u64) = .init(0);

/// 64 random bits for names and ids (unique, not secret): the kernel's
/// getrandom on Linux (a system call: no descriptor kept open, unlike a
/// cached /dev/urandom), mixed with the clock, the process and a counter,
/// which alone keep values distinct where there is no such call.
pub fn randomU64() u64 {
    var bytes: [8]u8 = @splat(0);
    if (builtin.os.tag == .linux) _ = std.os.linux.getrandom(&bytes, bytes.len, 0);
    var h = std.hash.XxHash64.init(0x4C5F);
    h.update(&bytes);
    h.update(std.mem.asBytes(&pool.currentPid()));
    const now = Io.Timestamp.now(pool.io(), .real);
    h.update(std.mem.asBytes(&now));
    h.update(std.mem.asBytes(&random_calls.fetchAdd(1, .monotonic)));
    return h.final();
}

pub fn createIfMissing(dir: Io.Dir, opts: OpenOptions, user: []const u8) Error!void {
    const io = pool.io();
    if (dir.access(io, "meta", .{})) |_| return else |_| {}
    // Before creating anything: a refused create leaves the directory as it was.
    try refuseForeignFiles(dir);
    // The writer lock serializes concurrent creators: only one writes meta.
    const lock = fsio.create(dir, "lock", false) catch |e| return ioFail(e, "creating lock");
    defer lock.close(io);
    lock.lock(io, .exclusive) catch |e| return ioFail(e, "locking lock");
    if (dir.access(io, "meta", .{})) |_| return else |_| {}

    for ([_][:0]const u8{ "index", "data" }) |name| {
        const f = fsio.create(dir, name, true) catch |e| return ioFail(e, "creating store files");
        f.close(io);
    }
    try writeNewMeta(dir, newHeader(opts, user), opts.dict, user);
    // meta appears atomically, complete: a crash before this leaves no store.
    fsio.rename(dir, "meta.tmp", "meta") catch |e| return ioFail(e, "publishing meta");
    fsio.syncDir(dir, ".") catch |e| return ioFail(e, "syncing the store directory");
}

fn writeNewMeta(dir: Io.Dir, header: Header, dict: []const u8, user: []const u8) Error!void {
    assert(header.dict_size == dict.len);
    assert(header.user_size == user.len);
    assert(header.blob_checksum == format.blobChecksum(dict, user));
    const io = pool.io();
    const commit = initialCommit();
    const tmp = fsio.create(dir, "meta.tmp", true) catch |e| return ioFail(e, "creating meta");
    defer tmp.close(io);
    var page: [format.page_size]u8 = @splat(0);
    @memcpy(page[0..@sizeOf(Header)], std.mem.asBytes(&header));
    fsio.write(tmp, "meta.tmp", &page, 0) catch |e| return ioFail(e, "writing meta");
    @memset(&page, 0);
    @memcpy(page[0..@sizeOf(Commit)], std.mem.asBytes(&commit));
    fsio.write(tmp, "meta.tmp", &page, format.commit_offset) catch |e|
        return ioFail(e, "writing meta");
    fsio.write(tmp, "meta.tmp", dict, format.blob_offset) catch |e|
        return ioFail(e, "writing meta");
    fsio.write(tmp, "meta.tmp", user, format.blob_offset + dict.len) catch |e|
        return ioFail(e, "writing meta");
    fsio.sync(tmp, "meta.tmp") catch |e| return ioFail(e, "syncing meta");
}

fn refuseForeignFiles(dir: Io.Dir) Error!void {
    const io = pool.io();
    const known = [_][]const u8{ "lock", "index", "data", "meta.tmp", "journal" };
    const d = dir.openDir(io, ".", .{ .iterate = true }) catch |e|
        return ioFail(e, "listing the store directory");
    defer d.close(io);
    var it = d.iterate();
    while (it.next(io) catch |e| return ioFail(e, "listing the store directory")) |entry| {
        if (store_maintain.isWindowsIndexName(entry.name)) continue; // bound to its store's uid
        for (known) |k| {
            if (std.mem.eql(u8, k, entry.name)) break;
        } else return diag.fail(
            error.NotAStore,
            "directory is not empty and holds no loaderx store (found '{s}')",
            .{entry.name},
        );
    }
}
