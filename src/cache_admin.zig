//! The node-local cache as `loaderx cache` sees it (src/Cache.zig owns the
//! cache): the processes using it (who holds which slot), the staging
//! directories of conversions on their way to a bucket (held by a shared
//! flock while in use), and clearing it, refused while any process uses it.
//! Every step runs under the cache's lock; none claims a slot, so a process
//! that only looks is no user.
const std = @import("std");
const assert = std.debug.assert;
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const Cache = @import("Cache.zig");
const layout = @import("cache_format.zig");
const files = @import("cache_os.zig");

const Error = Cache.Error;
const slot_none = Cache.slot_none;

/// The pids of the processes using the cache (holding a slot), under its
/// lock: this process's first when it holds one; -1 each where the system
/// does not say (not Linux). Writes at most `out.len`; returns how many
/// there are.
pub fn usersLocked(c: *Cache, out: []i64) Error!usize {
    try c.lock();
    defer c.unlock();
    return users(c, out);
}

/// `usersLocked`, the lock held.
fn users(c: *Cache, out: []i64) Error!usize {
    assert(c.slots_fd >= 0);
    var n: usize = 0;
    if (c.slot != slot_none) {
        if (n < out.len) out[n] = pool.currentPid();
        n += 1;
    }
    for (0..layout.slots_max) |k| {
        if (k == c.slot) continue; // (locking our own again would succeed, unlocking drop it)
        const holder = try files.lockHolder(c.slots_fd, k) orelse continue;
        if (n < out.len) out[n] = holder;
        n += 1;
    }
    return n;
}

/// Makes `uploads/<name>` for a conversion's files and holds it (a shared
/// flock on the directory, taken under the cache's lock): returns that
/// descriptor, which the caller closes once it removed the directory.
pub fn stage(c: *Cache, name: [:0]const u8) Error!c_int {
    try c.lock();
    defer c.unlock();
    _ = std.c.mkdirat(c.root.handle, "uploads", 0o755);
    var buf: [320]u8 = undefined;
    const sub = files.nameZ(&buf, "uploads/{s}", .{name}) orelse
        return diag.fail(error.InvalidArgument, "staging name too long", .{});
    if (std.c.mkdirat(c.root.handle, sub, 0o755) != 0)
        return files.errnoFail(error.IoFailed, "{s}/{s}", .{ c.root_path, sub });
    const fd = files.openAt(c.root.handle, sub, files.directory, 0);
    if (fd < 0) return files.errnoFail(error.IoFailed, "{s}/{s}", .{ c.root_path, sub });
    files.flockRetry(fd, std.posix.LOCK.SH) catch |e| {
        _ = std.c.close(fd);
        return e;
    };
    return fd;
}

/// The staging directories under `uploads/` whose conversion is gone (no
/// process holds them): their names, each followed by a NUL, into `out`
/// (cut short when it is full); `out_len` the bytes written, `live` the
/// count of those still held. Under the cache's lock.
pub fn uploads(c: *Cache, out: []u8, out_len: *usize, live: *u64) Error!void {
    try c.lock();
    defer c.unlock();
    out_len.* = 0;
    live.* = 0;
    var ctx: struct { out: []u8, len: *usize } = .{ .out = out, .len = out_len };
    try eachUpload(c, &ctx, live, struct {
        fn left(x: anytype, name: []const u8) Error!void {
            if (x.len.* + name.len + 1 > x.out.len) return;
            @memcpy(x.out[x.len.*..][0..name.len], name);
            x.out[x.len.* + name.len] = 0;
            x.len.* += name.len + 1;
        }
    }.left);
}

fn eachUpload(c: *Cache, ctx: anytype, live: *u64, comptime left: anytype) Error!void {
    const io = pool.io();
    var dir = c.root.openDir(io, "uploads", .{ .iterate = true }) catch return;
    defer dir.close(io);
    var it = dir.iterate();
    while (it.next(io) catch null) |entry| {
        if (entry.kind != .directory) continue;
        var buf: [320]u8 = undefined;
        const sub = files.nameZ(&buf, "{s}", .{entry.name}) orelse continue;
        const fd = files.openAt(dir.handle, sub, files.directory, 0);
        if (fd < 0) continue;
        defer _ = std.c.close(fd);
        if (std.c.flock(fd, std.posix.LOCK.EX | std.posix.LOCK.NB) != 0) {
            live.* += 1;
            continue;
        }
        try left(ctx, entry.name);
    }
}

/// Empties the cache (under its lock; `users` must be none, else Busy naming
/// them): `stores/` becomes `<aside>/stores` and a new one is made, and into
/// `<aside>/` go the staging directories no conversion holds and what an
/// interrupted clear left; the caller removes `<aside>`.
pub fn clear(c: *Cache, aside: [:0]const u8) Error!void {
    if (aside.len == 0 or aside.len > 200 or std.mem.indexOfScalar(u8, aside, '/') != null)
        return diag.fail(error.InvalidArgument, "clear: {s} is not a plain name", .{aside});
    try c.lock();
    defer c.unlock();
    var pids: [8]i64 = undefined;
    const n = try users(c, &pids);
    if (n > 0) {
        var text: [160]u8 = undefined;
        var w: usize = 0;
        for (pids[0..@min(n, pids.len)]) |pid| {
            if (pid < 0) continue;
            const sep = if (w > 0) ", " else "";
            const s = std.fmt.bufPrint(text[w..], "{s}{d}", .{ sep, pid }) catch break;
            w += s.len;
        }
        // (a count is at most 20 digits)
        if (w == 0) w = (std.fmt.bufPrint(&text, "{d}", .{n}) catch unreachable).len;
        const why = "{s}: in use by process{s} {s}; clear it once they have exited";
        return diag.fail(error.Busy, why, .{
            c.root_path, if (n > 1) "es" else "", text[0..w],
        });
    }
    if (std.c.mkdirat(c.root.handle, aside, 0o755) != 0)
        return files.errnoFail(error.IoFailed, "{s}/{s}", .{ c.root_path, aside });
    var buf: [640]u8 = undefined;
    // (`aside` is at most 200 bytes: checked above)
    const to = files.nameZ(&buf, "{s}/stores", .{aside}) orelse unreachable;
    const moved = std.c.renameat(c.root.handle, "stores", c.root.handle, to) == 0;
    if (!moved and files.errnoNow() != .NOENT)
        return files.errnoFail(error.IoFailed, "{s}/stores: moving it aside", .{c.root_path});
    _ = std.c.mkdirat(c.root.handle, "stores", 0o755);
    var ctx: struct { c: *Cache, aside: [:0]const u8, k: u32 = 0 } = .{ .c = c, .aside = aside };
    var live: u64 = 0;
    try eachUpload(c, &ctx, &live, struct {
        fn left(x: anytype, name: []const u8) Error!void {
            var a: [320]u8 = undefined;
            var b: [640]u8 = undefined;
            const from = files.nameZ(&a, "uploads/{s}", .{name}) orelse return;
            const dest = files.nameZ(&b, "{s}/upload-{d}", .{ x.aside, x.k }) orelse return;
            x.k += 1;
            _ = std.c.renameat(x.c.root.handle, from, x.c.root.handle, dest);
        }
    }.left);
    try moveClearedAside(c, aside);
    @atomicStore(u64, &c.head.used, 0, .monotonic);
}

fn moveClearedAside(c: *Cache, aside: [:0]const u8) Error!void {
    const io = pool.io();
    var dir = c.root.openDir(io, ".", .{ .iterate = true }) catch
        return files.errnoFail(error.IoFailed, "{s}: listing it", .{c.root_path});
    defer dir.close(io);
    var it = dir.iterate();
    while (it.next(io) catch null) |entry| {
        if (!std.mem.startsWith(u8, entry.name, ".cleared-")) continue;
        if (std.mem.eql(u8, entry.name, aside)) continue;
        var a: [320]u8 = undefined;
        var b: [640]u8 = undefined;
        const from = files.nameZ(&a, "{s}", .{entry.name}) orelse continue;
        const dest = files.nameZ(&b, "{s}/{s}", .{ aside, entry.name }) orelse continue;
        _ = std.c.renameat(c.root.handle, from, c.root.handle, dest);
    }
}
