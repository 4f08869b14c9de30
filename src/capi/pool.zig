//! The C ABI, the output pool (src/outbuf.zig): the buffers the library hands
//! out and how the caller frees them, and the pool's bounds and counters.
const std = @import("std");
const capi = @import("../capi.zig");
const outbuf = @import("../outbuf.zig");
const diag = @import("../diag.zig");

const Result = capi.Result;
const PoolStats = capi.PoolStats;
const invalid = capi.invalid;

// The library has one output pool (src/outbuf.zig), which serves every buffer
// it hands out; these calls reach it. There is no call to make another: the
// library never needed one, only tests did (the native tests make pools of
// their own inside outbuf.zig).

/// Frees a buffer the library handed out (lx_pool_alloc, lx_gather_alloc,
/// lx_loader_wait; null is ignored). Any thread; a large one goes back to
/// the output pool for reuse.
pub export fn lx_free_buffer(buf: ?[*]u8) void {
    outbuf.free(buf);
}

/// lx_free_buffer(*at), then sets *at to null: the destructor of an owner
/// slot that a call filled (Python wraps buffers this way, so that no
/// Python code runs when one is freed).
pub export fn lx_free_buffer_at(at: ?*?[*]u8) void {
    const slot = at orelse return;
    outbuf.free(slot.*);
    slot.* = null;
}

/// Writes to `*out` a buffer of at least `size` bytes from the output pool:
/// page aligned from the pool's min_bytes on (2 MiB aligned from 2 MiB),
/// uninitialised. The caller frees it with lx_free_buffer. Any thread.
/// Errors: out_of_memory.
pub export fn lx_pool_alloc(size: u64, out: ?*?[*]u8) c_int {
    diag.clear();
    const o = out orelse return invalid("out is null", .{});
    o.* = outbuf.allocExact(&outbuf.default_pool, @intCast(size)) orelse {
        diag.set("no memory for {d} bytes", .{size});
        return @backingInt(Result.out_of_memory);
    };
    return 0;
}

/// Sets the output pool's bounds: at most `max_idle_bytes` of returned
/// buffers kept for reuse (idle buffers over a lowered cap are unmapped now;
/// 0 keeps none), requests below `min_bytes` plain malloc.
pub export fn lx_pool_configure(max_idle_bytes: u64, min_bytes: u64) void {
    outbuf.configure(&outbuf.default_pool, @intCast(max_idle_bytes), @intCast(min_bytes));
}

/// The output pool's counters (buffers created, reused, returned, unmapped;
/// idle bytes and blocks; the bounds): how a caller sees that batches reuse
/// memory instead of faulting in fresh pages.
pub export fn lx_pool_stats(out: ?*PoolStats) void {
    const o = out orelse return;
    o.* = outbuf.stats(&outbuf.default_pool);
}
