//! The CYCLIC sampler compiled a second time, for x86-64-v3 (AVX2): build.zig
//! links this unit into x86-64 libraries next to the portable one, and
//! `sampler.fill` calls it when the CPU has AVX2. Same source, same results;
//! only the instructions differ. The symbol is hidden: not part of the C ABI.
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

comptime {
    @export(&fillCyclic, .{ .name = "loaderx_fill_cyclic_avx2", .visibility = .hidden });
}
