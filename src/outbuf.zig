//! The library's output memory: the one pool behind every buffer handed to a
//! caller — a dense gather's batch array (Python's `loaderx._buffers` asks for
//! it by size), a variable-size gather's one-buffer result (ragged records,
//! bytes), and every column of a loader step (dense or variable). Callers give
//! a buffer back with `free` (lx_free_buffer), from any thread, and a returned
//! buffer is kept idle for the next request of its size.
//!
//! Why one pool, and why here (native) rather than in Python: two of the
//! three kinds of output are sized while the library works (a variable batch's
//! bytes are known only after its records' sizes are read) or written while
//! no Python runs (a loader ring builds steps ahead on its own threads), so
//! their memory must come from native code; and memory that library threads
//! write must be owned by the library until they have provably stopped
//! touching it (issue: a batch freed by a Python finalizer while a ring thread
//! still wrote into it). The Python side only wraps a buffer in a numpy array
//! whose last reference frees it (loaderx/_buffers.py), so a Python finalizer
//! never runs pool code: nothing can fail at interpreter exit or be cut short
//! by a signal handler.
//!
//! Why pooled: a fresh multi-MiB allocation is a fresh mmap, so every batch
//! paid a page fault per 4 KiB, the kernel's zeroing of each page and, after
//! several threads wrote it, a TLB shootdown at munmap. Measured on a 2-vCPU
//! Xeon VM: a 64 MiB batch of 256 KiB records took ~590 faults, and reusing
//! faulted memory made that gather 1.8-3.7x faster; ragged batches of 256 x 12
//! KiB took ~200 faults each (scripts/bench_faults.py measures faults per
//! batch).
//!
//! Blocks. Requests of at least a pool's `min_bytes` (default 1 MiB) get a
//! block of their own anonymous mapping (never malloc, so the process's malloc
//! state, e.g. glibc's dynamic mmap threshold, is left alone): page-aligned,
//! and for 2 MiB or more 2 MiB-aligned and advised MADV_HUGEPAGE (whole huge
//! pages only). A page in front of the block holds its header (capacity, pool,
//! mapping). Smaller requests are plain malloc with a 64-byte header: glibc
//! serves them from its heap. A variable-size request (`alloc`) gets an
//! eighth of slack, in 64 KiB steps, so the next, slightly larger ragged batch
//! still fits the block; an exact request (`allocExact`, dense batches) gets
//! its size rounded up to pages.
//!
//! Reuse. A request takes the smallest idle block that holds it and is at most
//! twice its size, the most recently returned of equal ones. Idle blocks are
//! bounded by `max_idle_bytes` (default 256 MiB) and `idle_count_max`: a
//! block returned over a bound pushes the least recently returned out
//! (unmapped at once); so is a block left idle while `stale_checkouts` other
//! blocks were handed out (the one-off shape of an evaluation pass does not
//! stay resident). `max_idle_bytes` 0 keeps nothing: every block is unmapped
//! when its buffer comes back.
//!
//! Threads and fork. Every function may be called from any thread. A pool's
//! lock word holds 1 + the pid of the thread's process: a forked child whose
//! parent's thread held the lock at the fork takes it over and starts with an
//! empty idle list (the list may have been half updated); a child that forked
//! while the lock was free keeps the parent's idle blocks (copied with the
//! rest of its memory).
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const pool = @import("pool.zig");

const page_bytes: usize = std.heap.page_size_min;
const huge_page_bytes: usize = 2 << 20;
/// Bytes right in front of every buffer holding its header.
const header_bytes: usize = 64;
/// Idle blocks one pool keeps, at most.
pub const idle_count_max = 256;
/// A block left idle while this many blocks were handed out is unmapped.
pub const stale_checkouts: u64 = 256;
pub const min_bytes_default: usize = 1 << 20;
pub const max_idle_bytes_default: usize = 256 << 20;
/// Buffers below this size are plain malloc (the default pool's min_bytes).
pub const reuse_min: usize = min_bytes_default;
const header_magic: u32 = 0x6c786266; // "lxbf"
/// Mappings are POSIX-only; elsewhere blocks are aligned malloc memory.
const can_map = builtin.os.tag != .windows;

const Kind = enum(u32) { heap, block };

/// The header right in front of every buffer: how to give it back.
const Header = extern struct {
    magic: u32,
    kind: u32,
    /// The pool of a block (null for heap buffers).
    pool: ?*Pool,
    /// Usable bytes from the buffer's start.
    capacity: usize,
    /// The memory to release: the mapping (or malloc base) of a block.
    base: usize,
    len: usize,
    _pad: [24]u8 = @splat(0),

    comptime {
        assert(@sizeOf(Header) == header_bytes);
    }
};

fn headerOf(ptr: [*]u8) *Header {
    const h: *Header = @ptrCast(@alignCast(ptr - header_bytes));
    assert(h.magic == header_magic);
    // A heap buffer has no pool; a block's data is page aligned (2 MiB from
    // 2 MiB, where blocks are mappings), its header in the page in front.
    switch (h.kind) {
        @backingInt(Kind.heap) => {
            assert(h.pool == null and h.base + header_bytes == @intFromPtr(ptr));
        },
        @backingInt(Kind.block) => {
            assert(h.base < @intFromPtr(ptr) and h.capacity < h.len);
            assert(!can_map or @intFromPtr(ptr) % page_bytes == 0);
        },
        // Only allocHeap and mapBlock write headers, with one of the two kinds.
        else => unreachable,
    }
    return h;
}

const Idle = struct {
    data: [*]u8,
    capacity: usize,
    /// The pool's checkout count when the block came back.
    returned_at: u64,
};

/// lx_pool_stats_t: a pool's counters.
pub const Stats = extern struct {
    /// Blocks mapped, handed out again, handed back, and unmapped so far.
    created: u64,
    reused: u64,
    returned: u64,
    unmapped: u64,
    idle_bytes: u64,
    idle_blocks: u64,
    max_idle_bytes: u64,
    min_bytes: u64,

    comptime {
        assert(@sizeOf(Stats) == 64);
    }
};

/// A pool of blocks. The library's one pool, `default_pool`, lives for the
/// process and serves every buffer it hands out; the tests below make pools
/// of their own (`create`), freed once released and their last block is back.
pub const Pool = struct {
    lock_word: std.atomic.Value(i64) = .init(0),
    /// 1 + the pid of the process the idle list belongs to (under the lock).
    list_owner: i64 = 0,
    idle: [idle_count_max]Idle = undefined,
    idle_len: usize = 0,
    idle_bytes: usize = 0,
    max_idle_bytes: usize = max_idle_bytes_default,
    min_bytes: usize = min_bytes_default,
    created: u64 = 0,
    reused: u64 = 0,
    returned: u64 = 0,
    unmapped: u64 = 0,
    /// The owner's reference (until `release`) plus one per block out.
    refs: u64 = 1,
    released: bool = false,
    /// Heap-allocated (freed with its last reference) or static.
    heap: bool = false,

    fn lock(p: *Pool) void {
        const me = pool.currentPid() + 1;
        var stolen = false;
        while (true) {
            const word = p.lock_word.load(.monotonic);
            if (word == me) {
                std.atomic.spinLoopHint();
                continue;
            }
            if (p.lock_word.cmpxchgWeak(word, me, .acquire, .monotonic) == null) {
                stolen = word != 0;
                break;
            }
        }
        if (p.list_owner != me) {
            // First use in this process. A lock taken over from the parent
            // (held by a thread that does not exist here) may guard a half
            // updated list: leave its blocks. A free one guards a whole list.
            if (stolen) {
                p.idle_len = 0;
                p.idle_bytes = 0;
            }
            p.list_owner = me;
        }
    }

    fn unlock(p: *Pool) void {
        p.invariants();
        p.lock_word.store(0, .release);
    }

    /// The idle list's bookkeeping, checked at every unlock (Debug and
    /// ReleaseSafe; at most idle_count_max entries): `idle_bytes` is the sum
    /// of the idle capacities and within the cap, the list runs oldest
    /// return first, every entry is a block of this pool, and a released
    /// pool keeps nothing idle and is referenced by its blocks out only.
    fn invariants(p: *const Pool) void {
        if (!std.debug.runtime_safety) return;
        assert(p.idle_len <= idle_count_max);
        assert(p.idle_bytes <= p.max_idle_bytes and p.min_bytes >= 1);
        assert(!p.released or p.idle_len == 0);
        assert(p.released or p.refs >= 1);
        var bytes: usize = 0;
        var previous: u64 = 0;
        for (p.idle[0..p.idle_len]) |b| {
            const h = headerOf(b.data);
            assert(h.kind == @backingInt(Kind.block) and h.pool == p);
            assert(h.capacity == b.capacity);
            assert(b.returned_at >= previous and b.returned_at <= p.checkouts());
            previous = b.returned_at;
            bytes += b.capacity;
        }
        assert(bytes == p.idle_bytes);
    }

    fn checkouts(p: *const Pool) u64 {
        return p.created + p.reused;
    }
};

/// The pool of every buffer the library hands out by itself.
pub var default_pool: Pool = .{};
/// Buffers handed out and not yet given back, of every pool and size (the
/// native tests check that nothing leaks).
pub var live: std.atomic.Value(i64) = .init(0);

/// A new pool (freed by `release` and its last block's return), or null:
/// the native tests' isolated pools (the C ABI reaches `default_pool` only).
pub fn create(max_idle_bytes: usize, min_bytes: usize) ?*Pool {
    const p = std.heap.c_allocator.create(Pool) catch return null;
    p.* = .{ .max_idle_bytes = max_idle_bytes, .min_bytes = @max(1, min_bytes), .heap = true };
    p.invariants();
    return p;
}

/// The owner lets go: idle blocks are unmapped now, blocks still out when
/// they come back, and the pool is freed with the last of them.
pub fn release(p: *Pool) void {
    assert(p.heap);
    var spill: [idle_count_max]Idle = undefined;
    var spill_len: usize = 0;
    var last = false;
    {
        p.lock();
        defer p.unlock();
        assert(!p.released);
        p.released = true;
        spill_len = p.idle_len;
        @memcpy(spill[0..spill_len], p.idle[0..p.idle_len]);
        p.unmapped += spill_len;
        p.idle_len = 0;
        p.idle_bytes = 0;
        assert(p.refs >= 1);
        p.refs -= 1;
        last = p.refs == 0;
    }
    for (spill[0..spill_len]) |b| unmapBlock(b.data);
    if (last) std.heap.c_allocator.destroy(p);
}

/// Changes a pool's bounds; idle blocks over a lowered cap are unmapped now.
pub fn configure(p: *Pool, max_idle_bytes: usize, min_bytes: usize) void {
    var spill: [idle_count_max]Idle = undefined;
    var spill_len: usize = 0;
    {
        p.lock();
        defer p.unlock();
        p.max_idle_bytes = max_idle_bytes;
        p.min_bytes = @max(1, min_bytes);
        spill_len = spillOver(p, &spill);
    }
    for (spill[0..spill_len]) |b| unmapBlock(b.data);
}

pub fn stats(p: *Pool) Stats {
    p.lock();
    defer p.unlock();
    return .{
        .created = p.created,
        .reused = p.reused,
        .returned = p.returned,
        .unmapped = p.unmapped,
        .idle_bytes = p.idle_bytes,
        .idle_blocks = p.idle_len,
        .max_idle_bytes = p.max_idle_bytes,
        .min_bytes = p.min_bytes,
    };
}

/// A buffer of at least `size` bytes from the default pool, with slack for a
/// slightly larger next request (variable-size results), or null when out of
/// memory.
pub fn alloc(size: usize) ?[*]u8 {
    const capacity = withSlack(size) orelse return null;
    return allocIn(&default_pool, size, capacity);
}

/// A buffer of `size` bytes from `p`, sized exactly (rounded up to pages when
/// it is a block): dense batches, whose next request has the same size.
pub fn allocExact(p: *Pool, size: usize) ?[*]u8 {
    return allocExactFrom(p, size, @atomicLoad(usize, &p.min_bytes, .monotonic));
}

/// Buffers written on one thread and freed on another (the loader ring's
/// dense steps: a ring thread builds them, the consumer drops them) are pool
/// blocks from this size on, whatever the pool's `min_bytes`: glibc serves
/// such a malloc from the writing thread's arena, and the free from another
/// thread lets that arena trim and fault the memory in again (17-24 faults
/// per 256 KiB token-window batch in a fresh process, against 0.1 when the
/// consumer allocated them; bench.py tokens).
pub const cross_thread_min: usize = 64 << 10;

/// `allocExact` for a buffer another thread will free (see `cross_thread_min`).
pub fn allocExactCrossThread(p: *Pool, size: usize) ?[*]u8 {
    const min = @min(@atomicLoad(usize, &p.min_bytes, .monotonic), cross_thread_min);
    return allocExactFrom(p, size, min);
}

fn allocExactFrom(p: *Pool, size: usize, min: usize) ?[*]u8 {
    const capacity = std.mem.alignForward(usize, size, page_bytes);
    if (capacity < size) return null;
    assert(capacity % page_bytes == 0 and capacity - size < page_bytes);
    return allocInFrom(p, size, capacity, min);
}

fn allocIn(p: *Pool, size: usize, capacity: usize) ?[*]u8 {
    return allocInFrom(p, size, capacity, @atomicLoad(usize, &p.min_bytes, .monotonic));
}

fn allocInFrom(p: *Pool, size: usize, capacity: usize, min: usize) ?[*]u8 {
    assert(capacity >= size);
    const data = allocBuffer(p, size, capacity, min) orelse return null;
    // Whatever served it (malloc, an idle block, a new one), it holds `size`.
    assert(headerOf(data).capacity >= size);
    _ = live.fetchAdd(1, .monotonic);
    return data;
}

/// A heap buffer below `min` bytes, else a block (idle or new) of `capacity`.
fn allocBuffer(p: *Pool, size: usize, capacity: usize, min: usize) ?[*]u8 {
    if (size < min) return allocHeap(size);
    if (take(p, size)) |data| return data;
    const data = mapBlock(capacity) orelse return null;
    const h = headerOf(data);
    assert(h.kind == @backingInt(Kind.block) and h.pool == null and h.capacity == capacity);
    h.pool = p;
    p.lock();
    p.created += 1;
    p.refs += 1;
    p.unlock();
    return data;
}

/// Gives back a buffer from `alloc`/`allocExact` (null is ignored).
pub fn free(ptr: ?[*]u8) void {
    const data = ptr orelse return;
    const h = headerOf(data);
    const out = live.fetchSub(1, .monotonic);
    assert(out > 0); // a buffer given back twice, or never handed out
    switch (@as(Kind, @fromBackingInt(h.kind))) {
        .heap => std.c.free(@ptrFromInt(h.base)),
        .block => giveBack(h.pool.?, data),
    }
}

/// The capacity of a buffer from this file (its usable bytes).
pub fn capacityOf(ptr: [*]u8) usize {
    return headerOf(ptr).capacity;
}

fn allocHeap(size: usize) ?[*]u8 {
    const total = std.math.add(usize, size, header_bytes) catch return null;
    const base: [*]u8 = @ptrCast(std.c.malloc(total) orelse return null);
    const data = base + header_bytes;
    const h: *Header = @ptrCast(@alignCast(base));
    h.* = .{
        .magic = header_magic,
        .kind = @backingInt(Kind.heap),
        .pool = null,
        .capacity = size,
        .base = @intFromPtr(base),
        .len = total,
    };
    assert(headerOf(data) == h);
    return data;
}

/// The size plus an eighth, in 64 KiB steps: the next, slightly larger ragged
/// batch still fits.
fn withSlack(size: usize) ?usize {
    const padded = std.math.add(usize, size, size / 8) catch return null;
    if (padded > std.math.maxInt(usize) - (64 << 10)) return null;
    const capacity = std.mem.alignForward(usize, padded, 64 << 10);
    // 64 KiB steps, never less than asked.
    assert(capacity >= size and capacity % (64 << 10) == 0);
    return capacity;
}

/// The data of the smallest idle block of `p` holding `size` bytes (at most
/// twice that; the most recently returned of equal ones), taken out of the
/// idle list; null if none fits.
fn take(p: *Pool, size: usize) ?[*]u8 {
    p.lock();
    defer p.unlock();
    var best: ?usize = null;
    var i = p.idle_len;
    while (i > 0) {
        i -= 1;
        const b = p.idle[i];
        if (b.capacity < size or b.capacity / 2 > size) continue;
        if (best == null or b.capacity < p.idle[best.?].capacity) best = i;
    }
    const at = best orelse return null;
    assert(at < p.idle_len and p.idle_bytes >= p.idle[at].capacity);
    const data = p.idle[at].data;
    p.idle_bytes -= p.idle[at].capacity;
    std.mem.copyForwards(Idle, p.idle[at .. p.idle_len - 1], p.idle[at + 1 .. p.idle_len]);
    p.idle_len -= 1;
    p.reused += 1;
    p.refs += 1;
    const capacity = headerOf(data).capacity;
    assert(capacity >= size and capacity / 2 <= size);
    return data;
}

/// Keeps a returned block idle, unmapping what falls over the bounds (the
/// block itself when it alone is over the cap, or its pool was released).
fn giveBack(p: *Pool, data: [*]u8) void {
    const capacity = headerOf(data).capacity;
    assert(headerOf(data).pool == p);
    var spill: [idle_count_max + 1]Idle = undefined;
    var spill_len: usize = 0;
    var last = false;
    {
        p.lock();
        defer p.unlock();
        p.returned += 1;
        if (p.released or capacity > p.max_idle_bytes) {
            p.unmapped += 1;
            spill[0] = .{ .data = data, .capacity = capacity, .returned_at = 0 };
            spill_len = 1;
        } else {
            if (p.idle_len == idle_count_max) {
                spill[0] = p.idle[0];
                spill_len = 1;
                p.unmapped += 1;
                p.idle_bytes -= p.idle[0].capacity;
                std.mem.copyForwards(Idle, p.idle[0 .. p.idle_len - 1], p.idle[1..p.idle_len]);
                p.idle_len -= 1;
            }
            const now = p.checkouts();
            p.idle[p.idle_len] = .{ .data = data, .capacity = capacity, .returned_at = now };
            p.idle_len += 1;
            p.idle_bytes += capacity;
            spill_len += spillOver(p, spill[spill_len..][0..idle_count_max]);
        }
        // The owner's reference (until released) and this block's.
        assert(p.refs >= @as(u64, if (p.released) 1 else 2));
        p.refs -= 1;
        last = p.refs == 0;
        assert(!last or (p.released and p.heap));
    }
    for (spill[0..spill_len]) |b| unmapBlock(b.data);
    if (last) std.heap.c_allocator.destroy(p);
}

/// Takes the idle blocks over the byte cap or gone stale out of the list,
/// oldest first, into `out`. Caller holds the lock and unmaps them after
/// releasing it.
fn spillOver(p: *Pool, out: *[idle_count_max]Idle) usize {
    var n: usize = 0;
    const now = p.checkouts();
    while (p.idle_len > 0) {
        const oldest = p.idle[0];
        const stale = oldest.returned_at + stale_checkouts <= now;
        if (p.idle_bytes <= p.max_idle_bytes and !stale) break;
        out[n] = oldest;
        n += 1;
        p.idle_bytes -= oldest.capacity;
        std.mem.copyForwards(Idle, p.idle[0 .. p.idle_len - 1], p.idle[1..p.idle_len]);
        p.idle_len -= 1;
    }
    assert(p.idle_bytes <= p.max_idle_bytes);
    p.unmapped += n;
    return n;
}

/// A new block of `capacity` bytes (a multiple of pages, or any size where
/// blocks are malloc memory), its header filled but for the pool.
fn mapBlock(capacity: usize) ?[*]u8 {
    const huge = can_map and capacity >= huge_page_bytes;
    const alignment = if (huge) huge_page_bytes else page_bytes;
    // A mapping starts on a page, so sliding to the alignment takes at most
    // alignment - page_bytes; malloc memory (no mappings) starts anywhere and
    // may need a whole `alignment` more.
    const slack = if (can_map) alignment - page_bytes else alignment;
    // One page in front for the header, and room to slide to the alignment.
    const len = std.math.add(usize, capacity, page_bytes + slack) catch return null;
    const base = reserve(len) orelse return null;
    const data = std.mem.alignForward(usize, base + page_bytes, alignment);
    const start = data - page_bytes;
    const end = data + std.mem.alignForward(usize, capacity, page_bytes);
    // The block, header page included, lies inside what was reserved.
    assert(data % alignment == 0 and start >= base and data + capacity <= base + len);
    assert(!can_map or end <= base + len);
    if (can_map) {
        // Give back the slack on either side; the block is [start, end).
        if (start > base) unreserve(base, start - base);
        if (base + len > end) unreserve(end, base + len - end);
        if (huge) advise(data, capacity);
    }
    const h: *Header = @ptrFromInt(data - header_bytes);
    h.* = .{
        .magic = header_magic,
        .kind = @backingInt(Kind.block),
        .pool = null,
        .capacity = capacity,
        .base = if (can_map) start else base,
        .len = if (can_map) end - start else len,
    };
    return @ptrFromInt(data);
}

fn unmapBlock(data: [*]u8) void {
    const h = headerOf(data);
    assert(h.kind == @backingInt(Kind.block));
    const base = h.base;
    const len = h.len;
    assert(!can_map or (base % page_bytes == 0 and len % page_bytes == 0));
    h.magic = 0;
    unreserve(base, len);
}

fn reserve(len: usize) ?usize {
    if (can_map) {
        const m = std.posix.mmap(
            null,
            len,
            .{ .READ = true, .WRITE = true },
            .{ .TYPE = .PRIVATE, .ANONYMOUS = true },
            -1,
            0,
        ) catch return null;
        return @intFromPtr(m.ptr);
    } else {
        const p = std.c.malloc(len) orelse return null;
        return @intFromPtr(p);
    }
}

fn unreserve(base: usize, len: usize) void {
    if (can_map) {
        const m: [*]align(page_bytes) u8 = @ptrFromInt(base);
        std.posix.munmap(m[0..len]);
    } else {
        std.c.free(@ptrFromInt(base));
    }
}

/// Whole huge pages of a block, where the platform has transparent ones.
fn advise(data: usize, capacity: usize) void {
    if (builtin.os.tag == .linux) {
        const huge = capacity / huge_page_bytes * huge_page_bytes;
        if (huge == 0) return;
        const m: [*]align(page_bytes) u8 = @ptrFromInt(data);
        // THP disabled or unsupported: small pages still work.
        std.posix.madvise(m, huge, std.posix.MADV.HUGEPAGE) catch {};
    }
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

test "large buffers are reused when they fit, small ones are plain malloc" {
    const p = create(64 << 20, reuse_min).?;
    defer release(p);
    const a = allocIn(p, reuse_min, withSlack(reuse_min).?).?;
    a[0] = 1;
    a[reuse_min - 1] = 2;
    free(a);
    // Fits (and is not more than twice the request): the same memory again.
    const b = allocIn(p, reuse_min + 1000, withSlack(reuse_min + 1000).?).?;
    try testing.expectEqual(a, b);
    // Held: another request gets other memory.
    const c = allocExact(p, reuse_min).?;
    try testing.expect(c != b);
    free(b);
    free(c);
    // More than twice the request: not reused for a small large request.
    const big = allocExact(p, 8 * reuse_min).?;
    free(big);
    const d = allocExact(p, reuse_min).?;
    try testing.expect(d != big);
    free(d);
    const small = allocExact(p, 100).?;
    @memset(small[0..100], 7);
    free(small);
    free(null);
    const st = stats(p);
    try testing.expectEqual(st.created + st.reused, st.returned);
}

test "buffers another thread frees are blocks from 64 KiB, below the pool's min_bytes" {
    const p = create(64 << 20, reuse_min).?;
    defer release(p);
    const ring = allocExactCrossThread(p, cross_thread_min).?;
    try testing.expectEqual(@backingInt(Kind.block), headerOf(ring).kind);
    const same_size = allocExact(p, cross_thread_min).?;
    try testing.expectEqual(@backingInt(Kind.heap), headerOf(same_size).kind);
    const small = allocExactCrossThread(p, cross_thread_min - 1).?;
    try testing.expectEqual(@backingInt(Kind.heap), headerOf(small).kind);
    free(small);
    free(same_size);
    free(ring);
    // Handed back, the block serves the next step of the same size.
    try testing.expectEqual(ring, allocExactCrossThread(p, cross_thread_min).?);
    free(ring);
}

test "blocks are page aligned, 2 MiB aligned from 2 MiB, and their pages are ours" {
    const p = create(64 << 20, 1).?;
    defer release(p);
    const a = allocExact(p, 3 * page_bytes + 1).?;
    defer free(a);
    try testing.expectEqual(@as(usize, 0), @intFromPtr(a) % page_bytes);
    @memset(a[0 .. 4 * page_bytes], 0x5a);
    const h = allocExact(p, 3 * huge_page_bytes).?;
    defer free(h);
    try testing.expectEqual(@as(usize, 0), @intFromPtr(h) % huge_page_bytes);
    h[3 * huge_page_bytes - 1] = 1;
}

test "idle blocks stay within their bounds and go stale" {
    const p = create(4 * page_bytes, 1).?;
    defer release(p);
    var held: [idle_count_max + 4][*]u8 = undefined;
    for (&held) |*b| b.* = allocExact(p, page_bytes).?;
    for (held) |b| free(b);
    var st = stats(p);
    try testing.expectEqual(@as(u64, 4), st.idle_blocks);
    try testing.expectEqual(@as(u64, 4 * page_bytes), st.idle_bytes);
    try testing.expectEqual(st.created, st.returned);
    // A one-off size left idle while stale_checkouts other blocks went out.
    const odd = allocExact(p, 3 * page_bytes).?;
    free(odd);
    for (0..stale_checkouts) |_| free(allocExact(p, page_bytes).?);
    st = stats(p);
    for (p.idle[0..p.idle_len]) |b| try testing.expectEqual(page_bytes, b.capacity);
    configure(p, 0, 1);
    try testing.expectEqual(@as(u64, 0), stats(p).idle_blocks);
}

test "a released pool is freed when its last block comes back" {
    const p = create(64 << 20, 1).?;
    const a = allocExact(p, page_bytes).?;
    const b = allocExact(p, page_bytes).?;
    free(b);
    release(p);
    a[0] = 3;
    free(a); // the pool's last reference: testing.allocator is not involved
}
