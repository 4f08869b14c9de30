//! The routines compiled a second time, for x86-64-v3 (AVX2): build.zig links
//! this unit into x86-64 libraries next to the portable code (which targets
//! baseline x86-64, SSE2 only), and the portable code calls them only when
//! the CPU has AVX2 (cpu.zig). Their symbols are hidden: not part of the C ABI.
//!
//! - The CYCLIC sampler's fill (sampler.zig): the same source, with the same
//!   results; the Feistel lanes run four to a register instead of two.
//! - The streaming copy (codec.copyStream): 32-byte non-temporal stores.
const sampler = @import("sampler.zig");

fn fillCyclic(
    length: u64,
    seed: u64,
    position_first: *const [3]u64,
    out: [*]u64,
    count: usize,
) callconv(.c) void {
    sampler.fillCyclicWords(length, seed, position_first, out, count);
}

/// Copies `len` bytes (a multiple of 64) to a 32-byte-aligned `dst` with
/// non-temporal stores: the lines go to memory without being read into the
/// cache first. The caller fences (sfence) before another thread reads them.
fn streamCopy(dst: [*]u8, src: [*]const u8, len: usize) callconv(.c) void {
    const V = @Vector(32, u8);
    var at: usize = 0;
    while (at < len) : (at += 64) {
        const a: V = @as(*align(1) const V, @ptrCast(src + at)).*;
        const b: V = @as(*align(1) const V, @ptrCast(src + at + 32)).*;
        asm volatile (
            \\vmovntdq %[a], (%[d])
            \\vmovntdq %[b], 32(%[d])
            :
            : [a] "x" (a),
              [b] "x" (b),
              [d] "r" (dst + at),
            : .{ .memory = true });
    }
}

comptime {
    @export(&fillCyclic, .{ .name = "loaderx_fill_cyclic_avx2", .visibility = .hidden });
    @export(&streamCopy, .{ .name = "loaderx_stream_copy_avx2", .visibility = .hidden });
}
