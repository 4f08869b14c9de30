//! The node-local cache's system calls (src/Cache.zig owns the cache): file
//! identity and opens below a directory handle without following links,
//! POSIX byte-range locks (fetch locks, process slots) and flock (the
//! cache's lock), hole punching and pre-allocation (Linux fallocate),
//! the data extents of a sparse file (SEEK_DATA/SEEK_HOLE), the free space
//! of a file system, and errno as people read it. Each returns what the
//! cache needs to decide (a bool, an errno, a range) and decides nothing.
//! The cache needs POSIX locks: on Windows nothing here is reached (the
//! cache refuses to open there).
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const diag = @import("diag.zig");
const Store = @import("Store.zig");

pub const Error = Store.Error;

/// Open flags the cache uses (never following a link: `openAt`).
pub const read_only: std.posix.O = .{ .ACCMODE = .RDONLY, .CLOEXEC = true };
pub const read_write: std.posix.O = .{ .ACCMODE = .RDWR, .CLOEXEC = true };
pub const read_write_create: std.posix.O = .{ .ACCMODE = .RDWR, .CREAT = true, .CLOEXEC = true };
pub const directory: std.posix.O = .{ .ACCMODE = .RDONLY, .DIRECTORY = true, .CLOEXEC = true };

/// `fmt` of `args` into `buf`, NUL-terminated (a name below a directory);
/// null when it does not fit.
pub fn nameZ(buf: []u8, comptime fmt: []const u8, args: anytype) ?[:0]u8 {
    return std.fmt.bufPrintSentinel(buf, fmt, args, 0) catch null;
}

pub const FileId = struct { dev: u64, ino: u64, size: u64, blocks: u64 };

pub fn statAt(dirfd: c_int, name: [:0]const u8, what: []const u8) Error!FileId {
    return statRaw(dirfd, name, false) orelse {
        if (errnoNow() == .NOENT)
            return diag.fail(error.NotFound, "{s}: no {s} file", .{ what, name });
        return errnoFail(error.IoFailed, "{s}/{s}", .{ what, name });
    };
}

/// The identity and size of the open file `fd`.
pub fn statFd(fd: c_int, what: []const u8) Error!FileId {
    return statRaw(fd, "", true) orelse errnoFail(error.IoFailed, "{s}", .{what});
}

/// statx on Linux (the C library there may have no fstatat symbol),
/// fstatat elsewhere; null with errno set on failure.
fn statRaw(dirfd: c_int, name: [:0]const u8, empty_path: bool) ?FileId {
    if (builtin.os.tag == .linux) {
        const L = std.os.linux;
        var st: L.Statx = undefined;
        const flags: u32 = if (empty_path) L.AT.EMPTY_PATH else L.AT.SYMLINK_NOFOLLOW;
        const rc = L.statx(dirfd, name, flags, @bitCast(@as(u32, 0x7ff)), &st);
        const e = L.errno(rc);
        if (e != .SUCCESS) {
            std.c._errno().* = @intCast(@backingInt(e));
            return null;
        }
        return .{
            .dev = @as(u64, st.dev_major) << 32 | st.dev_minor,
            .ino = st.ino,
            .size = st.size,
            .blocks = st.blocks,
        };
    }
    var st: std.c.Stat = undefined;
    const rc = if (empty_path) std.c.fstat(dirfd, &st) else std.c.fstatat(dirfd, name, &st, 0);
    if (rc != 0) return null;
    return .{
        .dev = @bitCast(@as(i64, @intCast(st.dev))),
        .ino = @intCast(st.ino),
        .size = @intCast(st.size),
        .blocks = @intCast(st.blocks),
    };
}

pub fn openAt(dirfd: c_int, name: [:0]const u8, flags: std.posix.O, mode: std.posix.mode_t) c_int {
    var f = flags;
    if (@hasField(std.posix.O, "NOFOLLOW")) f.NOFOLLOW = true;
    while (true) {
        const fd = std.c.openat(dirfd, name, f, mode);
        if (fd >= 0 or errnoNow() != .INTR) return fd;
    }
}

pub fn errnoNow() std.posix.E {
    return std.posix.errno(@as(c_int, -1));
}

extern "c" fn strerror(errnum: c_int) [*:0]const u8;

/// The errno of the failed call just made, as people say it.
pub fn errnoText(e: std.posix.E) []const u8 {
    return std.mem.span(strerror(@intCast(@backingInt(e))));
}

/// `err` with a message naming what failed and the system's reason.
pub fn errnoFail(err: Error, comptime fmt: []const u8, args: anytype) Error {
    const e = errnoNow();
    var buf: [512]u8 = undefined;
    const what = std.fmt.bufPrint(&buf, fmt, args) catch buf[0..];
    const kind: Error = switch (e) {
        .NOSPC, .DQUOT => error.NoSpace,
        .ACCES, .PERM, .ROFS => error.ReadOnly,
        .NOMEM => error.OutOfMemory,
        else => err,
    };
    return diag.fail(kind, "{s}: {s}", .{ what, errnoText(e) });
}

pub fn ioError(e: anyerror, comptime fmt: []const u8, args: anytype) Error {
    var buf: [512]u8 = undefined;
    const what = std.fmt.bufPrint(&buf, fmt, args) catch buf[0..];
    return diag.fail(error.IoFailed, "{s}: {s}", .{ what, @errorName(e) });
}

pub fn writeAll(
    fd: c_int,
    bytes: []const u8,
    offset: u64,
    root: []const u8,
    what: []const u8,
) Error!void {
    var done: usize = 0;
    while (done < bytes.len) {
        const n = std.c.pwrite(fd, bytes[done..].ptr, bytes.len - done, @intCast(offset + done));
        if (n < 0 and errnoNow() == .INTR) continue;
        if (n < 0) return errnoFail(error.IoFailed, "{s}: writing {s}", .{ root, what });
        if (n == 0)
            return diag.fail(error.NoSpace, "{s}: writing {s}: no space left", .{ root, what });
        done += @intCast(n);
    }
}

pub fn flockRetry(fd: c_int, op: c_int) Error!void {
    while (std.c.flock(fd, op) != 0) {
        if (errnoNow() != .INTR) return errnoFail(error.IoFailed, "a cache lock (fd {d})", .{fd});
    }
}

/// An exclusive POSIX lock on bytes [start, start + len) of `fd`, without
/// waiting: false when another process holds part of it. The lock belongs
/// to this process (all its threads), and closing any descriptor of the
/// file drops it: each file is opened once per process and kept.
pub fn lockRange(fd: c_int, start: u64, len: u64) Error!bool {
    assert(fd >= 0);
    assert(len > 0);
    var fl = std.mem.zeroes(std.c.Flock);
    fl.type = std.c.F.WRLCK;
    fl.whence = std.c.SEEK.SET;
    fl.start = @intCast(start);
    fl.len = @intCast(len);
    while (std.c.fcntl(fd, std.c.F.SETLK, &fl) != 0) {
        switch (errnoNow()) {
            .INTR => continue,
            .AGAIN, .ACCES => return false,
            else => return errnoFail(error.IoFailed, "a cache fetch lock (fd {d})", .{fd}),
        }
    }
    return true;
}

pub fn unlockRange(fd: c_int, start: u64, len: u64) void {
    var fl = std.mem.zeroes(std.c.Flock);
    fl.type = std.c.F.UNLCK;
    fl.whence = std.c.SEEK.SET;
    fl.start = @intCast(start);
    fl.len = @intCast(len);
    _ = std.c.fcntl(fd, std.c.F.SETLK, &fl);
}

/// The pid of the process that holds byte `k` of `fd` (-1: one does, the
/// system does not say who), or null when none does.
pub fn lockHolder(fd: c_int, k: u64) Error!?i64 {
    var fl = std.mem.zeroes(std.c.Flock);
    fl.type = std.c.F.WRLCK;
    fl.whence = std.c.SEEK.SET;
    fl.start = @intCast(k);
    fl.len = 1;
    if (std.c.fcntl(fd, std.c.F.GETLK, &fl) != 0)
        return errnoFail(error.IoFailed, "slots.lock", .{});
    if (fl.type == std.c.F.UNLCK) return null;
    return if (builtin.os.tag == .linux) @as(i64, fl.pid) else -1;
}

/// Frees bytes [offset, offset + len) of a file (they read as zeros). Where
/// holes cannot be punched, `zero` writes zeros instead (same reads, the
/// space kept); best effort either way.
pub fn punch(fd: c_int, offset: u64, len: u64, zero: bool) void {
    if (len == 0) return;
    if (builtin.os.tag == .linux) {
        const mode = std.os.linux.FALLOC.FL_PUNCH_HOLE | std.os.linux.FALLOC.FL_KEEP_SIZE;
        const rc = std.os.linux.fallocate(fd, mode, @intCast(offset), @intCast(len));
        if (std.os.linux.errno(rc) == .SUCCESS or !zero) return;
    } else if (!zero) return;
    const zeros: [64 << 10]u8 = @splat(0);
    var done: u64 = 0;
    while (done < len) {
        const n: usize = @intCast(@min(zeros.len, len - done));
        const w = std.c.pwrite(fd, &zeros, n, @intCast(offset + done));
        if (w <= 0) return;
        done += @intCast(w);
    }
}

/// Gives bytes [offset, offset + len) their blocks before anything is
/// written there (the Linux system call, never glibc's posix_fallocate,
/// which writes zeros over bytes another process may be writing): a full
/// file system says so here (ENOSPC, EDQUOT) instead of in a write, and a
/// tmpfs page that exists reads through a mapping without a fault. Where
/// the system has no such call, nothing is done. Returns the errno.
pub fn allocate(fd: c_int, offset: u64, len: u64) std.posix.E {
    if (builtin.os.tag != .linux or len == 0) return .SUCCESS;
    while (true) {
        const rc = std.os.linux.fallocate(fd, 0, @intCast(offset), @intCast(len));
        switch (std.os.linux.errno(rc)) {
            .INTR => continue,
            .OPNOTSUPP, .NOSYS, .INVAL => return .SUCCESS, // (the writes report a full disk)
            else => |e| return e,
        }
    }
}

/// The [start, end) ranges below `size` of a sparse file that hold data
/// (SEEK_DATA/SEEK_HOLE; all of it where the system has no such seek).
pub const Extents = struct {
    fd: c_int,
    size: u64,
    at: u64 = 0,

    pub fn next(x: *Extents) ?[2]u64 {
        if (x.at >= x.size) return null;
        if (builtin.os.tag != .linux) {
            x.at = x.size;
            return .{ 0, x.size };
        }
        const lo = std.os.linux.lseek(x.fd, @intCast(x.at), 3); // SEEK_DATA
        if (std.os.linux.errno(lo) != .SUCCESS) {
            const all = std.os.linux.errno(lo) != .NXIO; // ENXIO: a hole to the end
            defer x.at = x.size;
            return if (all) .{ x.at, x.size } else null;
        }
        if (lo >= x.size) return null;
        const hi_raw = std.os.linux.lseek(x.fd, @intCast(lo), 4); // SEEK_HOLE
        const hi = if (std.os.linux.errno(hi_raw) == .SUCCESS) @min(hi_raw, x.size) else x.size;
        x.at = hi;
        return .{ lo, hi };
    }
};

/// Whether a fetch into this file system allocates its blocks before it
/// writes them: everything but ext2-4, xfs and btrfs (by statfs f_type),
/// whose holes read as the zero page through a mapping and whose writes
/// fail cleanly when full. A tmpfs, an overlay on one, a system that does
/// not say: yes.
pub fn needsPages(fd: c_int) bool {
    const st = statFs(fd) orelse return true;
    return switch (st.f_type) {
        0xEF53, 0x58465342, 0x9123683E => false,
        else => true,
    };
}

const StatFs = extern struct {
    f_type: i64,
    f_bsize: i64,
    f_blocks: u64,
    f_bfree: u64,
    f_bavail: u64,
    f_files: u64,
    f_ffree: u64,
    f_fsid: [2]i32,
    f_namelen: i64,
    f_frsize: i64,
    f_flags: i64,
    f_spare: [4]i64,
};

/// The kernel's statfs of a 64-bit Linux (x86_64, aarch64 share it).
fn statFs(fd: c_int) ?StatFs {
    if (builtin.os.tag != .linux or @sizeOf(usize) != 8) return null;
    var st: StatFs = undefined;
    const handle: usize = @bitCast(@as(isize, fd));
    const rc = std.os.linux.syscall2(.fstatfs, handle, @intFromPtr(&st));
    return if (std.os.linux.errno(rc) == .SUCCESS) st else null;
}

/// Bytes free to an unprivileged user, and the size, of the file system
/// of `fd` (null where the system does not say).
pub fn freeSpace(fd: c_int) ?struct { free: u64, total: u64 } {
    const st = statFs(fd) orelse return null;
    const unit: u64 = @intCast(if (st.f_frsize > 0) st.f_frsize else st.f_bsize);
    return .{ .free = st.f_bavail *| unit, .total = st.f_blocks *| unit };
}

/// Raises this process's soft limit of open files to its hard limit: each
/// replica holds a few descriptors, and a dataset may have thousands of
/// shards. Best effort.
pub fn moreDescriptors() void {
    if (builtin.os.tag != .linux and builtin.os.tag != .macos) return;
    var lim: std.c.rlimit = undefined;
    if (std.c.getrlimit(.NOFILE, &lim) != 0) return;
    const want = if (lim.max == std.c.RLIM.INFINITY) @max(lim.cur, 1 << 16) else lim.max;
    if (lim.cur != std.c.RLIM.INFINITY and lim.cur < want) {
        lim.cur = want;
        _ = std.c.setrlimit(.NOFILE, &lim);
    }
}

fn testFile(tmp: *std.testing.TmpDir, name: [:0]const u8, size: u64) !c_int {
    const fd = openAt(tmp.dir.handle, name, read_write_create, 0o644);
    try std.testing.expect(fd >= 0);
    try std.testing.expectEqual(@as(c_int, 0), std.c.ftruncate(fd, @intCast(size)));
    return fd;
}

test "hole punching frees a range that then reads as zeros; allocation gives blocks" {
    if (builtin.os.tag != .linux) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const fd = try testFile(&tmp, "f", 1 << 20);
    defer _ = std.c.close(fd);
    // A sparse file: allocating 256 KiB gives it blocks, and nothing else.
    const before = (try statFd(fd, "f")).blocks;
    try std.testing.expectEqual(std.posix.E.SUCCESS, allocate(fd, 0, 256 << 10));
    const allocated = (try statFd(fd, "f")).blocks;
    try std.testing.expect(allocated * 512 >= before * 512 + (256 << 10));
    const ones: [64 << 10]u8 = @splat(0xAB);
    try writeAll(fd, &ones, 0, "tmp", "f");
    punch(fd, 4096, 3 * 4096, false);
    var back: [64 << 10]u8 = undefined;
    try std.testing.expectEqual(@as(isize, back.len), std.c.pread(fd, &back, back.len, 0));
    for (back, 0..) |b, i| {
        const want: u8 = if (i >= 4096 and i < 16384) 0 else 0xAB;
        try std.testing.expectEqual(want, b);
    }
    try std.testing.expect((try statFd(fd, "f")).blocks < allocated);
    // The extents of a sparse file are where its data is (the rest holes).
    const g = try testFile(&tmp, "g", 1 << 20);
    defer _ = std.c.close(g);
    try writeAll(g, ones[0..4096], 512 << 10, "tmp", "g");
    var ext: Extents = .{ .fd = g, .size = 1 << 20 };
    const first = ext.next().?;
    try std.testing.expect(first[0] <= 512 << 10 and first[1] >= (512 << 10) + 4096);
    try std.testing.expect(ext.next() == null);
}

test "a byte-range lock is the process's: another process is refused and told who" {
    if (builtin.os.tag != .linux) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const fd = try testFile(&tmp, "locks", 0);
    defer _ = std.c.close(fd);
    try std.testing.expect(try lockRange(fd, 5, 3));
    try std.testing.expect(try lockRange(fd, 5, 3)); // (the same process: granted again)
    const parent: i64 = @intCast(std.c.getpid());
    const pid = std.c.fork();
    if (pid == 0) {
        // The child: bytes 5..8 are the parent's, byte 9 is free.
        var code: u8 = 0;
        if (lockRange(fd, 6, 1) catch true) code |= 1;
        if ((lockHolder(fd, 7) catch null) != parent) code |= 2;
        if (!(lockRange(fd, 9, 1) catch false)) code |= 4;
        std.c._exit(code);
    }
    var status: c_int = 0;
    _ = std.c.waitpid(pid, &status, 0);
    try std.testing.expectEqual(@as(c_int, 0), status);
    unlockRange(fd, 5, 3);
    try std.testing.expectEqual(@as(?i64, null), try lockHolder(fd, 6));
}

test "a name is NUL-terminated, or null when it does not fit" {
    var buf: [8]u8 = undefined;
    try std.testing.expectEqualStrings("ab/7", (nameZ(&buf, "{s}/{d}", .{ "ab", 7 }).?));
    try std.testing.expect(nameZ(&buf, "{s}", .{"much too long"}) == null);
}
