//! The engine's file-system layer: every call that changes a file or a
//! directory (create, write, fsync, truncate, rename, unlink, mkdir, and the
//! directory fsync that makes a name durable) goes through this file, so that
//! tests can make the N-th such call fail (fault injection) or record every one
//! of them to simulate a power loss afterwards (see tests/faults/test_faults.py).
//!
//! Files the engine opens are opened relative to the store's directory handle
//! with no-follow semantics: a symlink planted inside a store (say `journal`
//! pointing at a user's file) makes the open fail; its target is never written.
//!
//! Both test hooks are process-global and cost one atomic load per call when
//! disarmed. They are exported by capi.zig as `lx_debug_*`; they exist for the
//! test suite and do nothing unless armed.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const Io = std.Io;
const File = Io.File;
const posix = std.posix;
const pool = @import("pool.zig");

/// The kinds of calls, as bits of a fault-injection mask.
pub const Op = enum(u5) {
    create = 0,
    write = 1,
    sync = 2,
    truncate = 3,
    rename = 4,
    unlink = 5,
    mkdir = 6,
    sync_dir = 7,

    fn bit(op: Op) u32 {
        return @as(u32, 1) << @backingInt(op);
    }
};

pub const ops_all: u32 = (1 << 8) - 1;

pub const Error = error{InjectedFault};

// ---------------------------------------------------------------- fault injection

var fault_mask: std.atomic.Value(u32) = .init(0);
/// Calls counted since arming; the call that makes this equal `fault_at` fails.
var fault_calls: std.atomic.Value(u64) = .init(0);
var fault_at: u64 = 0;
/// Fail every matching call from `fault_at` on (a dead disk), not just one.
var fault_sticky: bool = false;
var faults_injected: std.atomic.Value(u64) = .init(0);

/// Arms fault injection: the `nth` (1-based) call whose kind is in `mask`
/// fails, and with `sticky` every later one too. `nth` 0 only counts calls
/// (read them with `callCount`). A mask of 0 disarms.
pub fn armFault(mask: u32, nth: u64, sticky: bool) void {
    fault_mask.store(0, .release);
    fault_calls.store(0, .monotonic);
    faults_injected.store(0, .monotonic);
    fault_at = nth;
    fault_sticky = sticky;
    fault_mask.store(mask & ops_all, .release);
}

/// Matching calls since the last `armFault`.
pub fn callCount() u64 {
    return fault_calls.load(.monotonic);
}

/// Faults injected since the last `armFault`.
pub fn faultCount() u64 {
    return faults_injected.load(.monotonic);
}

fn hit(op: Op) Error!void {
    const mask = fault_mask.load(.acquire);
    if (mask & op.bit() == 0) return;
    const n = fault_calls.fetchAdd(1, .monotonic) + 1;
    if (fault_at == 0) return;
    if (n == fault_at or (fault_sticky and n > fault_at)) {
        _ = faults_injected.fetchAdd(1, .monotonic);
        return error.InjectedFault;
    }
}

// ---------------------------------------------------------------- recording

/// A recorded call, serialized as: op u8, name_len u16 (little-endian), the
/// name, offset u64, len u64, then `len` data bytes for writes. `name` is
/// the file's name inside its store directory (or the directory's path for
/// mkdir and sync_dir); `offset` is the write offset or the new length.
var recording: std.atomic.Value(bool) = .init(false);
var record_mutex: std.atomic.Mutex = .unlocked;
var record_log: std.ArrayList(u8) = .empty;
var record_failed: bool = false;

/// Starts (or stops) recording; starting drops what was recorded before.
pub fn setRecording(on: bool) void {
    lockRecord();
    defer record_mutex.unlock();
    if (on) {
        record_log.clearRetainingCapacity();
        record_failed = false;
    }
    recording.store(on, .release);
}

/// Copies the log into `out` (when it fits) and returns its size; null when
/// recording ran out of memory, so a test never reads a truncated log.
pub fn takeRecording(out: ?[]u8) ?usize {
    lockRecord();
    defer record_mutex.unlock();
    if (record_failed) return null;
    if (out) |o| {
        if (o.len >= record_log.items.len) @memcpy(o[0..record_log.items.len], record_log.items);
    }
    return record_log.items.len;
}

fn lockRecord() void {
    while (!record_mutex.tryLock()) std.atomic.spinLoopHint();
}

fn record(op: Op, name: []const u8, offset: u64, data: []const []const u8) void {
    if (!recording.load(.acquire)) return;
    lockRecord();
    defer record_mutex.unlock();
    if (record_failed) return;
    var len: u64 = 0;
    for (data) |d| len += d.len;
    appendRecord(op, name, offset, len, data) catch {
        record_failed = true;
    };
}

fn appendRecord(op: Op, name: []const u8, offset: u64, len: u64, data: []const []const u8) !void {
    const gpa = std.heap.c_allocator;
    const name_len: u16 = @intCast(@min(name.len, std.math.maxInt(u16)));
    try record_log.append(gpa, @backingInt(op));
    try record_log.appendSlice(gpa, &std.mem.toBytes(std.mem.nativeToLittle(u16, name_len)));
    try record_log.appendSlice(gpa, name[0..name_len]);
    try record_log.appendSlice(gpa, &std.mem.toBytes(std.mem.nativeToLittle(u64, offset)));
    try record_log.appendSlice(gpa, &std.mem.toBytes(std.mem.nativeToLittle(u64, len)));
    for (data) |d| try record_log.appendSlice(gpa, d);
}

// ---------------------------------------------------------------- calls

pub const Mode = enum { read_only, read_write };

/// Opens an existing file `name` in `dir` without following a symlink.
pub fn open(dir: Io.Dir, name: [:0]const u8, mode: Mode) !File {
    if (builtin.os.tag == .windows) {
        return dir.openFile(pool.io(), name, .{
            .mode = if (mode == .read_only) .read_only else .read_write,
        });
    }
    var flags: posix.O = .{
        .ACCMODE = if (mode == .read_only) .RDONLY else .RDWR,
        .CLOEXEC = true,
    };
    flags.NOFOLLOW = true;
    const fd = try openat(dir.handle, name, flags, 0);
    return .{ .handle = fd, .flags = .{ .nonblocking = false } };
}

pub const OpenError = error{
    FileNotFound,
    AccessDenied,
    PermissionDenied,
    ReadOnlyFileSystem,
    SymLinkLoop,
    IsDir,
    NotDir,
    NameTooLong,
    PathAlreadyExists,
    ProcessFdQuotaExceeded,
    SystemFdQuotaExceeded,
    NoSpaceLeft,
    FileTooBig,
    SystemResources,
    InputOutput,
    Unexpected,
};

/// openat(2) with its errors named (the std wrapper calls a read-only file
/// system "Unexpected", and a store on one must open read-only instead).
fn openat(
    dir_fd: posix.fd_t,
    name: [:0]const u8,
    flags: posix.O,
    mode: posix.mode_t,
) OpenError!posix.fd_t {
    while (true) {
        const rc = std.c.openat(dir_fd, name, flags, mode);
        return switch (posix.errno(rc)) {
            .SUCCESS => @intCast(rc),
            .INTR => continue,
            .NOENT => error.FileNotFound,
            .ACCES => error.AccessDenied,
            .PERM => error.PermissionDenied,
            .ROFS => error.ReadOnlyFileSystem,
            .LOOP => error.SymLinkLoop,
            .ISDIR => error.IsDir,
            .NOTDIR => error.NotDir,
            .NAMETOOLONG => error.NameTooLong,
            .EXIST => error.PathAlreadyExists,
            .MFILE => error.ProcessFdQuotaExceeded,
            .NFILE => error.SystemFdQuotaExceeded,
            .NOSPC, .DQUOT => error.NoSpaceLeft,
            .FBIG, .OVERFLOW => error.FileTooBig,
            .NOMEM => error.SystemResources,
            .IO => error.InputOutput,
            else => error.Unexpected,
        };
    }
}

/// Creates (or opens, and with `empty` truncates) file `name` in `dir` for
/// reading and writing, without following a symlink.
pub fn create(dir: Io.Dir, name: [:0]const u8, empty: bool) !File {
    try hit(.create);
    const file: File = if (builtin.os.tag == .windows)
        try dir.createFile(pool.io(), name, .{ .read = true, .truncate = empty })
    else blk: {
        var flags: posix.O = .{ .ACCMODE = .RDWR, .CREAT = true, .CLOEXEC = true };
        flags.NOFOLLOW = true;
        flags.TRUNC = empty;
        const fd = try openat(dir.handle, name, flags, 0o644);
        break :blk .{ .handle = fd, .flags = .{ .nonblocking = false } };
    };
    record(.create, name, @intFromBool(empty), &.{});
    return file;
}

/// Writes all of `bytes` at `offset` of file `name`.
pub fn write(file: File, name: []const u8, bytes: []const u8, offset: u64) !void {
    // A write ends inside a file a u64 can measure (and an offset is never a
    // wrapped negative number, which would land past any real file).
    assert(offset <= std.math.maxInt(u63));
    assert(bytes.len <= std.math.maxInt(u63) - offset);
    try hit(.write);
    try file.writePositionalAll(pool.io(), bytes, offset);
    record(.write, name, offset, &.{bytes});
}

/// One vectored positional write (may be short); returns the bytes written.
pub fn writeVec(file: File, name: []const u8, vec: []const []const u8, offset: u64) !usize {
    try hit(.write);
    assert(offset <= std.math.maxInt(u63));
    const n = try file.writePositional(pool.io(), vec, offset);
    recordPrefix(name, vec, offset, n);
    return n;
}

/// Records the first `n` bytes of a vectored write (what actually hit the file).
fn recordPrefix(name: []const u8, vec: []const []const u8, offset: u64, n: usize) void {
    var parts: [64][]const u8 = undefined;
    var left = n;
    var count: usize = 0;
    for (vec) |v| {
        if (left == 0 or count == parts.len) break;
        const take = @min(v.len, left);
        parts[count] = v[0..take];
        count += 1;
        left -= take;
    }
    // A write never reports more bytes than it was given.
    assert(left == 0 or count == parts.len);
    record(.write, name, offset, parts[0..count]);
}

pub fn sync(file: File, name: []const u8) !void {
    try hit(.sync);
    try file.sync(pool.io());
    record(.sync, name, 0, &.{});
}

pub fn truncate(file: File, name: []const u8, len: u64) !void {
    assert(len <= std.math.maxInt(u63));
    try hit(.truncate);
    try file.setLength(pool.io(), len);
    record(.truncate, name, len, &.{});
}

pub fn rename(dir: Io.Dir, from: []const u8, to: [:0]const u8) !void {
    try hit(.rename);
    try dir.rename(from, dir, to, pool.io());
    record(.rename, from, 0, &.{to});
}

pub fn unlink(dir: Io.Dir, name: []const u8) !void {
    try hit(.unlink);
    try dir.deleteFile(pool.io(), name);
    record(.unlink, name, 0, &.{});
}

/// Makes the names in `dir` durable (fsync of the directory). `name` labels
/// it in the recording. A no-op on Windows, which has no directory fsync.
pub fn syncDir(dir: Io.Dir, name: []const u8) !void {
    if (builtin.os.tag == .windows) return;
    try hit(.sync_dir);
    const io = pool.io();
    // A plain directory handle may be O_PATH, which cannot be synced.
    const d = try dir.openDir(io, ".", .{ .iterate = true });
    defer d.close(io);
    const f: File = .{ .handle = d.handle, .flags = .{ .nonblocking = false } };
    try f.sync(io);
    record(.sync_dir, name, 0, &.{});
}

/// Creates directory `path` and any missing parents (like `mkdir -p`), then
/// makes each new entry durable in its parent. Every level is tried once, so a
/// path that cannot be created (under /proc, say) fails instead of looping.
pub fn mkdirs(path: []const u8) !void {
    const io = pool.io();
    const cwd = Io.Dir.cwd();
    var levels: [256]usize = undefined;
    var count: usize = 0;
    // Walk up to the deepest existing ancestor.
    var end = path.len;
    while (true) {
        const prefix = path[0..end];
        if (prefix.len == 0) break;
        if (cwd.access(io, prefix, .{})) |_| break else |e| switch (e) {
            error.FileNotFound => {},
            else => return e,
        }
        if (count == levels.len) return error.TooDeep;
        levels[count] = end;
        count += 1;
        const parent = std.fs.path.dirname(prefix) orelse break;
        end = parent.len;
    }
    // Create from the top down, once each.
    var i = count;
    while (i > 0) {
        i -= 1;
        const level = path[0..levels[i]];
        try hit(.mkdir);
        cwd.createDir(io, level, .default_dir) catch |e| switch (e) {
            error.PathAlreadyExists => {}, // a concurrent creator won: fine
            else => return e,
        };
        record(.mkdir, level, 0, &.{});
        const parent = std.fs.path.dirname(level) orelse ".";
        const pd = try cwd.openDir(io, parent, .{});
        defer pd.close(io);
        try syncDir(pd, parent);
    }
}

// ---------------------------------------------------------------- tests

test "the n-th call fails once, then calls succeed again; sticky keeps failing" {
    armFault(Op.write.bit() | Op.sync.bit(), 2, false);
    defer armFault(0, 0, false);
    try hit(.write);
    try hit(.truncate); // not in the mask: not counted
    try std.testing.expectError(error.InjectedFault, hit(.sync));
    try hit(.write);
    try std.testing.expectEqual(@as(u64, 3), callCount());
    try std.testing.expectEqual(@as(u64, 1), faultCount());

    armFault(ops_all, 1, true);
    try std.testing.expectError(error.InjectedFault, hit(.mkdir));
    try std.testing.expectError(error.InjectedFault, hit(.write));
    try std.testing.expectEqual(@as(u64, 2), faultCount());
}

test "a create refuses to follow a symlink" {
    if (builtin.os.tag == .windows) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const io = pool.io();
    const victim = try tmp.dir.createFile(io, "victim", .{});
    try victim.writePositionalAll(io, "precious", 0);
    victim.close(io);
    try tmp.dir.symLink(io, "victim", "journal", .{});
    try std.testing.expectError(error.SymLinkLoop, create(tmp.dir, "journal", true));
    var buf: [16]u8 = undefined;
    const f = try tmp.dir.openFile(io, "victim", .{});
    defer f.close(io);
    const n = try f.readPositionalAll(io, &buf, 0);
    try std.testing.expectEqualStrings("precious", buf[0..n]);
}

test "mkdirs creates every level and fails cleanly where it cannot" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", std.testing.allocator);
    defer std.testing.allocator.free(base);
    var buf: [4096]u8 = undefined;
    const deep = try std.fmt.bufPrint(&buf, "{s}/a/b/c", .{base});
    try mkdirs(deep);
    try mkdirs(deep); // exists: fine
    try tmp.dir.access(pool.io(), "a/b/c", .{});
    if (builtin.os.tag == .linux) {
        if (mkdirs("/proc/loaderx-cannot/x")) |_| return error.TestUnexpectedResult else |_| {}
    }
}

test "recording captures writes in order" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    setRecording(true);
    const f = try create(tmp.dir, "data", true);
    defer f.close(pool.io());
    try write(f, "data", "abc", 5);
    try sync(f, "data");
    setRecording(false);
    const n = takeRecording(null).?;
    var buf: [256]u8 = undefined;
    try std.testing.expectEqual(n, takeRecording(&buf).?);
    // create: op 0, name "data", offset 1 (truncate), len 0
    try std.testing.expectEqual(@as(u8, 0), buf[0]);
    try std.testing.expectEqualStrings("data", buf[3..7]);
    const second = 3 + 4 + 16;
    try std.testing.expectEqual(@as(u8, 1), buf[second]);
    try std.testing.expectEqualStrings("abc", buf[second + 3 + 4 + 16 ..][0..3]);
}
