//! The fork side of Store.zig (see "Fork" in its file comment): the registry
//! of the handles whose files are open in this process, the `pthread_atfork`
//! handlers, and adoptInChild, which makes an inherited handle the child's
//! own. The same handlers adopt the node-local cache's handles (Cache.zig).
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;

const Store = @import("Store.zig");
const Cache = @import("Cache.zig");
const pool = @import("pool.zig");
const open = Store.open;

/// Every handle whose files are open in this process. `registry_mutex` is
/// held across fork() by the atfork handlers, so a child never finds the
/// list half-updated by a thread that does not exist there.
var registry_head: ?*Store = null;
var registry_mutex: std.atomic.Mutex = .unlocked;
/// 0: the atfork handlers are not installed, 1: being installed, 2: installed.
var atfork_state: std.atomic.Value(u8) = .init(0);
const has_fork = builtin.os.tag != .windows and builtin.os.tag != .wasi;

fn lockRegistry() void {
    while (!registry_mutex.tryLock()) std.atomic.spinLoopHint();
}

pub fn register(s: *Store) void {
    assert(s.registry_prev == null);
    assert(s.registry_next == null);
    installForkHandlers();
    lockRegistry();
    defer registry_mutex.unlock();
    s.registry_prev = null;
    s.registry_next = registry_head;
    if (registry_head) |head| head.registry_prev = s;
    registry_head = s;
}

pub fn unregister(s: *Store) void {
    lockRegistry();
    defer registry_mutex.unlock();
    if (s.registry_prev) |prev| prev.registry_next = s.registry_next else {
        assert(registry_head == s);
        registry_head = s.registry_next;
    }
    if (s.registry_next) |next| next.registry_prev = s.registry_prev;
    s.registry_prev = null;
    s.registry_next = null;
}

/// Installs the atfork handlers once per process, on the first open of a
/// store or of a node-local cache (src/Cache.zig, whose handles the same
/// handlers make the child's own).
pub fn installForkHandlers() void {
    if (!has_fork) return;
    while (true) {
        switch (atfork_state.load(.acquire)) {
            2 => return,
            0 => if (atfork_state.cmpxchgStrong(0, 1, .acquire, .monotonic) == null) {
                // Fails only without memory for the handler table: forks then
                // keep the behaviour of a plain inherited descriptor.
                _ = std.c.pthread_atfork(forkPrepare, forkParent, forkChild);
                atfork_state.store(2, .release);
                return;
            },
            else => std.atomic.spinLoopHint(),
        }
    }
}

fn forkPrepare() callconv(.c) void {
    lockRegistry();
    Cache.lockRegistry();
}

fn forkParent() callconv(.c) void {
    Cache.registry_mutex.unlock();
    registry_mutex.unlock();
}

fn forkChild() callconv(.c) void {
    var it = registry_head;
    while (it) |s| : (it = s.registry_next) s.adoptInChild();
    Cache.adoptAllInChild();
    Cache.registry_mutex.unlock();
    registry_mutex.unlock();
}

/// In a forked child, inside fork() (one thread; async-signal-safe calls
/// only): makes the inherited handle `s` the child's own. See "Fork" in the
/// file comment. A store whose `meta` is gone from its directory keeps the
/// inherited file (and no lock of its own).
pub fn adoptInChild(s: *Store) void {
    if (s.writer_lock) |l| {
        // Closing the child's copy leaves the parent's lock in place.
        _ = std.c.close(l.handle);
        s.writer_lock = null;
    }
    // Held, maybe, by parent threads that do not exist here: the child never
    // writes (open_pid), and its reads must not wait for them.
    s.write_mutex = .init;
    s.index_maps.mutex = .init;
    s.data_maps.mutex = .init;
    // `dir` pins the store's directory even if it was renamed; `meta` is never
    // replaced once a handle can open it, so this is the same file.
    var flags: std.posix.O = .{ .ACCMODE = .RDONLY, .CLOEXEC = true };
    flags.NOFOLLOW = true;
    const fd = std.c.openat(s.dir.handle, "meta", flags, @as(std.posix.mode_t, 0));
    if (fd < 0) return;
    if (!s.isClosed()) {
        // Blocks while the parent's delete or compact holds meta exclusively:
        // reading during it would see records move.
        while (std.c.flock(fd, std.posix.LOCK.SH) != 0) {
            if (std.posix.errno(@as(c_int, -1)) != .INTR) {
                _ = std.c.close(fd);
                return;
            }
        }
    }
    _ = std.c.close(s.meta.handle);
    s.meta = .{ .handle = fd, .flags = .{ .nonblocking = false } };
    // A delete, compact or gathers the parent was running: their threads do
    // not exist here, and their changes are published by now.
    s.exclusive.store(false, .seq_cst);
    s.readers_active.store(0, .seq_cst);
}

test "the registry holds exactly the open handles" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", std.testing.allocator);
    defer std.testing.allocator.free(base);
    var buf: [4096]u8 = undefined;
    const a = try open(std.testing.allocator, try std.fmt.bufPrint(&buf, "{s}/a", .{base}), .{
        .create = true,
    });
    var buf2: [4096]u8 = undefined;
    const b = try open(std.testing.allocator, try std.fmt.bufPrint(&buf2, "{s}/b", .{base}), .{
        .create = true,
    });
    try std.testing.expect(registered(a) and registered(b));
    a.close();
    try std.testing.expect(!registered(a) and registered(b));
    b.close();
}

fn registered(s: *Store) bool {
    lockRegistry();
    defer registry_mutex.unlock();
    var it = registry_head;
    while (it) |x| : (it = x.registry_next) if (x == s) return true;
    return false;
}

test "adopting a handle drops the writer lock and holds meta through its own file" {
    if (!has_fork) return error.SkipZigTest;
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realPathFileAlloc(pool.io(), ".", std.testing.allocator);
    defer std.testing.allocator.free(base);
    var buf: [4096]u8 = undefined;
    const path = try std.fmt.bufPrint(&buf, "{s}/s", .{base});
    const s = try open(std.testing.allocator, path, .{ .create = true });
    defer s.close();
    const rec: []const u8 = "abc";
    const ptrs = [_][*]const u8{rec.ptr};
    const sizes = [_]u64{rec.len};
    _ = try s.append(.{ .ptrs = &ptrs, .sizes = &sizes, .count = 1 }, false);
    try std.testing.expect(s.writer_lock != null);
    const old_meta = s.meta.handle;
    s.adoptInChild(); // here the only copy of the writer lock: closing it frees it
    try std.testing.expect(s.writer_lock == null and s.meta.handle != old_meta);
    const other = try open(std.testing.allocator, path, .{});
    defer other.close();
    const lock = try other.takeWriterLock();
    lock.close(pool.io());
    // The adopted handle's own shared lock refuses another handle's delete.
    try std.testing.expect(!(try other.upgradeMetaLock()));
}
