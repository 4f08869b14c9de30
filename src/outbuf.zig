//! The buffers the library hands out whole: a gather's one-buffer result
//! (ragged records, bytes) and a loader step's variable columns. Callers free
//! them with `free` (lx_free_buffer), which keeps large ones for reuse.
//!
//! Why: a fresh multi-MiB malloc is a fresh mmap, or memory from an arena
//! heap that glibc trimmed, so every batch paid a page fault per 4 KiB and
//! the kernel's zeroing of the page. Measured on a 2-vCPU Xeon VM: batches of
//! 256 x 12 KiB ragged records through the loader took ~200 faults each and
//! ran at 0.43x the same bytes read as a dense store, whose outputs come from
//! the Python-side pool (loaderx/_buffers.py).
//!
//! Why not the Python pool: a dense output has its shape before the call, so
//! Python allocates it (huge-page-aligned, freed with its last numpy view);
//! a variable-size result is sized here, during the gather, so the memory
//! must come from native code, and Python only wraps and frees it.
//!
//! Buffers of `reuse_min` bytes and more are malloc'ed with a little slack
//! (ragged batches vary in size) and, when freed, kept idle: at most
//! `idle_count_max` of them and `idle_bytes_max` bytes, the least recently
//! freed dropped first. A request takes the smallest idle buffer that holds
//! it, if that is at most twice its size. Smaller buffers are plain malloc.
//! Any thread may allocate and free; a forked child starts with no idle
//! buffers (the parent's lock may have been held at the fork).
const std = @import("std");
const assert = std.debug.assert;
const pool = @import("pool.zig");

/// Buffers below this size are plain malloc: glibc serves them from its heap.
pub const reuse_min: usize = 1 << 20;
const idle_count_max = 16;
const idle_bytes_max: usize = 256 << 20;
/// Bytes in front of every buffer holding its capacity (keeps 64-byte alignment).
const header: usize = 64;

const Idle = struct { base: [*]u8, capacity: usize };

var idle: [idle_count_max]Idle = undefined;
var idle_len: usize = 0;
var idle_bytes: usize = 0;
/// 0 when free, else 1 + the pid of the process whose thread holds it: a
/// forked child takes a lock that its parent's (absent) threads held.
var lock_word: std.atomic.Value(i64) = .init(0);
/// The process the idle list belongs to (under the lock).
var list_owner: i64 = 0;

/// A buffer of at least `size` bytes, or null when out of memory.
pub fn alloc(size: usize) ?[*]u8 {
    if (size >= reuse_min) {
        if (take(size)) |base| return base + header;
    }
    const capacity = if (size >= reuse_min) withSlack(size) orelse return null else size;
    const total = std.math.add(usize, capacity, header) catch return null;
    const base: [*]u8 = @ptrCast(std.c.malloc(total) orelse return null);
    capacityOf(base).* = capacity;
    return base + header;
}

/// Gives back a buffer from `alloc` (null is ignored).
pub fn free(ptr: ?[*]u8) void {
    const p = ptr orelse return;
    const base = p - header;
    const capacity = capacityOf(base).*;
    if (capacity >= reuse_min and keep(base, capacity)) return;
    std.c.free(base);
}

fn capacityOf(base: [*]u8) *usize {
    return @ptrCast(@alignCast(base));
}

/// The size plus an eighth, in 64 KiB steps: the next, slightly larger ragged
/// batch still fits.
fn withSlack(size: usize) ?usize {
    const padded = std.math.add(usize, size, size / 8) catch return null;
    if (padded > std.math.maxInt(usize) - (64 << 10)) return null;
    return std.mem.alignForward(usize, padded, 64 << 10);
}

fn lock() void {
    const me = pool.currentPid() + 1;
    while (true) {
        const word = lock_word.load(.monotonic);
        if (word == me) {
            std.atomic.spinLoopHint();
        } else if (lock_word.cmpxchgWeak(word, me, .acquire, .monotonic) == null) {
            break;
        }
    }
    if (list_owner != me) {
        // First use, or a forked child: the parent's idle buffers were being
        // handed over by threads that do not exist here; leave them.
        idle_len = 0;
        idle_bytes = 0;
        list_owner = me;
    }
}

fn unlock() void {
    lock_word.store(0, .release);
}

/// The base of the smallest idle buffer holding `size` bytes (at most twice
/// that), taken out of the idle list; null if none fits.
fn take(size: usize) ?[*]u8 {
    lock();
    defer unlock();
    var best: ?usize = null;
    for (idle[0..idle_len], 0..) |b, i| {
        if (b.capacity < size or b.capacity / 2 > size) continue;
        if (best == null or b.capacity < idle[best.?].capacity) best = i;
    }
    const i = best orelse return null;
    const base = idle[i].base;
    idle_bytes -= idle[i].capacity;
    std.mem.copyForwards(Idle, idle[i .. idle_len - 1], idle[i + 1 .. idle_len]);
    idle_len -= 1;
    return base;
}

/// Keeps a freed buffer idle, dropping the least recently freed ones over the
/// bounds; false if the buffer alone is over them (the caller frees it).
fn keep(base: [*]u8, capacity: usize) bool {
    if (capacity > idle_bytes_max) return false;
    var dropped: [idle_count_max]Idle = undefined;
    var dropped_len: usize = 0;
    {
        lock();
        defer unlock();
        while (idle_len == idle_count_max or idle_bytes + capacity > idle_bytes_max) {
            assert(idle_len > 0);
            dropped[dropped_len] = idle[0];
            dropped_len += 1;
            idle_bytes -= idle[0].capacity;
            std.mem.copyForwards(Idle, idle[0 .. idle_len - 1], idle[1..idle_len]);
            idle_len -= 1;
        }
        idle[idle_len] = .{ .base = base, .capacity = capacity };
        idle_len += 1;
        idle_bytes += capacity;
    }
    for (dropped[0..dropped_len]) |d| std.c.free(d.base);
    return true;
}

const testing = std.testing;

test "large buffers are reused when they fit, small ones are plain malloc" {
    const a = alloc(reuse_min).?;
    a[0] = 1;
    a[reuse_min - 1] = 2;
    free(a);
    // Fits (and is not more than twice the request): the same memory again.
    const b = alloc(reuse_min + 1000).?;
    try testing.expectEqual(a, b);
    // Held: another request gets other memory.
    const c = alloc(reuse_min).?;
    try testing.expect(c != b);
    free(b);
    free(c);
    // More than twice the request: not reused for a small large request.
    const big = alloc(8 * reuse_min).?;
    free(big);
    const d = alloc(reuse_min).?;
    try testing.expect(d != big);
    free(d);
    const small = alloc(100).?;
    @memset(small[0..100], 7);
    free(small);
    free(null);
}

test "idle buffers stay within their bounds" {
    var held: [idle_count_max + 4][*]u8 = undefined;
    for (&held) |*h| h.* = alloc(reuse_min).?;
    for (held) |h| free(h);
    lock();
    defer unlock();
    try testing.expect(idle_len <= idle_count_max);
    try testing.expect(idle_bytes <= idle_bytes_max);
    var sum: usize = 0;
    for (idle[0..idle_len]) |b| sum += b.capacity;
    try testing.expectEqual(idle_bytes, sum);
}
