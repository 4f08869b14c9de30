//! The batch sampler: which record indices make up the batch at a given step.
//!
//! Everything here is a pure function of `(length, batch size, mode, seed, step,
//! rank, world)`: there is no state to save, seeking is O(1), and the sequence is
//! the same whatever thread or process asks. Nothing allocates and nothing is
//! global, so every function may be called from any thread.
//!
//! Positions. Each mode reads a sequence of global positions; step `s` of a run
//! with per-rank batch `B` and `world` ranks owns the `G = B*world` consecutive
//! positions from `positionAt(s)`, and rank `r` takes its slice `[r*B, (r+1)*B)`
//! of them. SEQUENTIAL and IID put step `s` at `s*G`. CYCLIC reads position `p`
//! as offset `p % length` of cycle `p / length`, and a cycle holds `length / G`
//! whole steps: step `s` starts at `(s / (length/G)) * length + (s % (length/G)) * G`,
//! so a step never straddles two cycles and the positions from
//! `(length/G) * G` to the cycle's end are never read (see Modes). Positions
//! are exact 192-bit integers: with `s`, `B` and `world` each below 2^64,
//! `p < 2^64 * (2^64-1)^2 < 2^192`, so no input can wrap. The cycle number and
//! offset of a run's first position are computed once and then advanced
//! incrementally, so the per-index cost has no division. Each mode is a function
//! of the position alone (and the seed), so the union of the ranks' batches is
//! exactly the batch of one process with `G` per step.
//!
//! Modes.
//! - `sequential`: index `p mod length`, a circular window that never truncates.
//! - `iid`: uniform on `[0, length)` with replacement. A counter-based generator
//!   keyed by `(seed, p, attempt)` gives 64-bit words; Lemire's multiply-shift
//!   with rejection maps them without bias.
//! - `cyclic`: without replacement. Cycle `c` is a permutation `perm_{seed,c}`
//!   of `[0, length)`, evaluated at offsets `0 .. (length/G)*G`: each cycle
//!   serves `length / G` whole global batches and drops the rest of its
//!   permutation (a different rest each cycle, as each cycle is shuffled
//!   afresh), so no global batch repeats an index and within a cycle every
//!   index appears at most once. The original loaderx's rule; it needs
//!   `G <= length` (callers refuse anything else). Lengths up to
//!   `shuffle_length_max` get an exact Fisher-Yates shuffle, drawn again from
//!   `(seed, c)` in a fixed-size table. Longer ones use a keyed, mixed-radix
//!   Feistel network over a domain slightly larger than `length` (see
//!   `Feistel` in sampler_cyclic.zig), restricted to `[0, length)` by cycle
//!   walking: O(1) memory for every length up to 2^64-1, and a few
//!   nanoseconds per index.
//!
//! A run resumed with another global batch (the loader's elastic resume)
//! passes `positionAt` the position it stopped at: the new run finishes that
//! cycle from the same offset with as many whole new batches as its rest
//! holds, drops the remainder, and continues with whole cycles.
//!
//! Trade-offs. The Feistel round function is a keyed multiply hash, chosen for
//! speed, not a cryptographic one; the shuffle is statistically sound (see the
//! round count) but not unpredictable to an adversary. Small Feistel domains
//! are weak shufflers, which is why small lengths use Fisher-Yates instead.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const cpu = @import("cpu.zig");
const cyclic = @import("sampler_cyclic.zig");

pub const Mode = enum(u8) { sequential = 0, iid = 1, cyclic = 2 };

/// A global sample position. See the file comment for why 192 bits never wrap.
pub const Position = u192;

/// Fills `out` (len = per-rank batch size B) with the indices for global step `step`.
/// Global batch G = B * world; rank r takes positions [r*B, (r+1)*B) of the step's G
/// (see `positionAt`). Pure function of (length, B, mode, seed, step, rank, world).
/// Every index written is `< length`. The caller validates the arguments (for CYCLIC,
/// G <= length); breaking a precondition is a programmer error.
pub fn fill(length: u64, mode: Mode, seed: u64, step: u64, rank: u64, world: u64, out: []u64) void {
    fillSteps(length, mode, seed, step, rank, world, out.len, out);
}

/// `fill` for the `out.len / batch_size` consecutive steps from `step_first`, one
/// batch after another. Steps whose positions follow each other (one rank, and in
/// CYCLIC the steps of one cycle) are filled by one run, which costs a CYCLIC
/// shuffle or key derivation once per run instead of once per step.
pub fn fillSteps(
    length: u64,
    mode: Mode,
    seed: u64,
    step_first: u64,
    rank: u64,
    world: u64,
    batch_size: usize,
    out: []u64,
) void {
    assert(length >= 1);
    assert(batch_size >= 1);
    assert(out.len % batch_size == 0);
    assert(world >= 1);
    assert(rank < world);
    const global: u128 = @as(u128, batch_size) * world;
    assert(mode != .cyclic or global <= length);
    const steps = out.len / batch_size;
    // Steps per cycle, or per run of consecutive positions otherwise.
    const run_steps_max: u64 = if (world > 1) 1 else if (mode == .cyclic)
        batchesPerCycle(length, global)
    else
        std.math.maxInt(u64);
    var done: usize = 0;
    while (done < steps) {
        const step = step_first + done;
        // A run ends with the step before the next cycle's first.
        const in_cycle: u64 = if (mode == .cyclic and world == 1) step % run_steps_max else 0;
        const run: usize = @intCast(@min(steps - done, run_steps_max - in_cycle));
        const first = positionAt(mode, length, global, 0, 0, step) + @as(u128, rank) * batch_size;
        fillFrom(length, mode, seed, first, out[done * batch_size ..][0 .. run * batch_size]);
        done += run;
    }
}

/// CYCLIC: the whole global batches of `global` records one cycle of `length`
/// serves (0 when `global > length`, which callers refuse).
pub fn batchesPerCycle(length: u64, global: u128) u64 {
    assert(global >= 1);
    return @intCast(length / global);
}

/// The global position of the first record of `step`, for a run whose step
/// `base_step` starts at global position `base_position` (a fresh run: step 0 at
/// position 0). SEQUENTIAL and IID: `G` positions per step. CYCLIC: the base's
/// cycle serves as many whole batches as the rest of it holds (from the base's
/// offset), then every cycle `length / G` batches from offset 0. The base may
/// come from a run with another global batch: this is how an elastic resume
/// finishes the cycle it stopped in. Preconditions: `step >= base_step`; CYCLIC
/// needs `global <= length`.
pub fn positionAt(
    mode: Mode,
    length: u64,
    global: u128,
    base_step: u64,
    base_position: Position,
    step: u64,
) Position {
    assert(step >= base_step);
    assert(global >= 1);
    const steps: u64 = step - base_step;
    if (mode != .cyclic) return base_position + @as(Position, steps) * global;
    assert(global <= length);
    const base = split(base_position, length);
    // Whole batches left in the base's cycle: the rest of it, (length - offset) / G.
    const left: u64 = @intCast((length - base.offset) / global);
    const at = if (steps < left) base_position + @as(Position, steps) * global else next_cycles: {
        const per_cycle = batchesPerCycle(length, global);
        const later = steps - left;
        const cycle = base.cycle + 1 + later / per_cycle;
        break :next_cycles cycle * length + @as(Position, later % per_cycle) * global;
    };
    // A CYCLIC step never straddles two cycles.
    assert(split(at, length).offset + global <= length);
    return at;
}

/// Fills `out` with the indices at global positions [position_first,
/// position_first + out.len): the sequence `fill` cuts into batches.
pub fn fillFrom(length: u64, mode: Mode, seed: u64, position_first: Position, out: []u64) void {
    assert(length >= 1);
    switch (mode) {
        .sequential => fillSequential(length, position_first, out),
        .iid => fillIid(length, seed, position_first, out),
        .cyclic => if (cpu.avx2_unit and cpu.hasAvx2()) {
            const words: [3]u64 = @bitCast(position_first);
            loaderx_fill_cyclic_avx2(length, seed, &words, out.ptr, out.len);
        } else cyclic.fillCyclic(length, seed, position_first, out),
    }
    // Every index a sampler writes is a record of the source (the loader
    // gathers them unchecked against the length it was built for).
    for (out) |index| assert(index < length);
}

/// Defined (hidden, never exported) in avx2.zig: the same CYCLIC code
/// compiled for x86-64-v3, where the Feistel lanes run four to a register
/// instead of two.
extern fn loaderx_fill_cyclic_avx2(
    length: u64,
    seed: u64,
    position_first: *const [3]u64,
    out: [*]u64,
    count: usize,
) void;

/// The CYCLIC fill of `fill`, for avx2.zig to compile for its target.
pub fn fillCyclicWords(
    length: u64,
    seed: u64,
    position_first: *const [3]u64,
    out: [*]u64,
    count: usize,
) void {
    cyclic.fillCyclic(length, seed, @bitCast(position_first.*), out[0..count]);
}

// ---------------------------------------------------------------------------
// Position arithmetic.

pub const Split = struct { cycle: Position, offset: u64 };

/// `p / length` and `p % length`. The common case (p < 2^64) is one hardware
/// division; otherwise long division by 64-bit limbs, most significant first.
pub fn split(p: Position, length: u64) Split {
    assert(length >= 1);
    if (p <= std.math.maxInt(u64)) {
        const p64: u64 = @intCast(p);
        return .{ .cycle = p64 / length, .offset = p64 % length };
    }
    var quotient: Position = 0;
    var remainder: u64 = 0;
    inline for (.{ 2, 1, 0 }) |limb| {
        const digit: u64 = @truncate(p >> (64 * limb));
        const dividend: u128 = (@as(u128, remainder) << 64) | digit;
        // remainder < length, so this quotient digit is < 2^64.
        const quotient_digit: u64 = @intCast(dividend / length);
        remainder = @intCast(dividend % length);
        quotient |= @as(Position, quotient_digit) << (64 * limb);
    }
    assert(remainder < length and quotient * length + remainder == p);
    return .{ .cycle = quotient, .offset = remainder };
}

// ---------------------------------------------------------------------------
// Hashing.

/// The odd 64-bit golden-ratio constant (Weyl sequence increment of SplitMix64).
pub const golden_gamma: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finalizer: a bijection on u64 with full avalanche.
pub fn mix64(x: u64) u64 {
    var z = x;
    z = (z ^ (z >> 30)) *% 0xBF58_476D_1CE4_E5B9;
    z = (z ^ (z >> 27)) *% 0x94D0_49BB_1331_11EB;
    return z ^ (z >> 31);
}

/// Folds a domain tag, the seed and a wide counter into one 64-bit key. Chaining
/// full mixes keeps keys for different inputs unrelated.
pub fn deriveKey(domain: u64, seed: u64, wide: Position) u64 {
    var h = mix64(seed ^ domain);
    inline for (.{ 0, 1, 2 }) |limb| {
        h = mix64(h ^ (@as(u64, @truncate(wide >> (64 * limb))) +% golden_gamma));
    }
    return h;
}

// Distinct domain tags keep the keys of the three generators apart.
const domain_iid: u64 = 0x6969_6469_7261_7773;
pub const domain_feistel: u64 = 0x6665_6973_7465_6C00;
pub const domain_shuffle: u64 = 0x7368_7566_666C_6500;

// ---------------------------------------------------------------------------
// Sequential.

fn fillSequential(length: u64, position_first: Position, out: []u64) void {
    var index = split(position_first, length).offset;
    assert(index < length);
    for (out) |*slot| {
        slot.* = index;
        // index < length <= 2^64-1, so the increment cannot overflow.
        index += 1;
        if (index == length) index = 0;
    }
}

// ---------------------------------------------------------------------------
// IID: counter-based words plus Lemire's unbiased multiply-shift.

const IidKeys = struct {
    inner: u64,
    outer: u64,

    /// Keys for the positions whose high 128 bits are `position_high`.
    fn init(seed: u64, position_high: u128) IidKeys {
        const base = deriveKey(domain_iid, seed, position_high);
        return .{ .inner = mix64(base +% golden_gamma), .outer = mix64(base +% 2 *% golden_gamma) };
    }

    /// The random word for (seed, position, attempt). Two keyed mixes: with one,
    /// streams for different seeds would be shifted copies of each other.
    fn word(keys: IidKeys, position_low: u64, attempt: u64) u64 {
        const inner = mix64(position_low +% keys.inner);
        return mix64(inner ^ (keys.outer +% attempt *% golden_gamma));
    }
};

fn fillIid(length: u64, seed: u64, position_first: Position, out: []u64) void {
    // Lemire: the high half of word*length is uniform once the low half is at
    // least 2^64 mod length; rejecting the rest removes the bias.
    const threshold = (0 -% length) % length;
    var position_low: u64 = @truncate(position_first);
    var position_high: u128 = @intCast(position_first >> 64);
    var keys = IidKeys.init(seed, position_high);
    for (out) |*slot| {
        slot.* = draw(keys, position_low, length, threshold);
        position_low +%= 1;
        if (position_low == 0) {
            position_high += 1;
            keys = IidKeys.init(seed, position_high);
        }
    }
}

fn draw(keys: IidKeys, position_low: u64, length: u64, threshold: u64) u64 {
    var attempt: u64 = 0;
    while (true) : (attempt += 1) {
        const product = @as(u128, keys.word(position_low, attempt)) * length;
        // product >> 64 < length: the high half of a 64-bit word times length.
        if (@as(u64, @truncate(product)) >= threshold) {
            assert(product >> 64 < length);
            return @intCast(product >> 64);
        }
    }
}

// ---------------------------------------------------------------------------
// Tests.

const testing = std.testing;

fn expectCyclePermutation(length: u64, seed: u64, cycle: u64) !void {
    const buffer = try testing.allocator.alloc(u64, @intCast(length));
    defer testing.allocator.free(buffer);
    fill(length, .cyclic, seed, cycle, 0, 1, buffer);
    var seen = try std.DynamicBitSetUnmanaged.initEmpty(testing.allocator, @intCast(length));
    defer seen.deinit(testing.allocator);
    for (buffer) |index| {
        try testing.expect(index < length);
        try testing.expect(!seen.isSet(@intCast(index)));
        seen.set(@intCast(index));
    }
    try testing.expectEqual(@as(usize, @intCast(length)), seen.count());
}

test "cyclic covers every index exactly once per cycle" {
    for ([_]u64{ 1, 2, 3, 7, 64, 128, 129, 1000, 1023, 1025, 1_000_003 }) |length| {
        for ([_]u64{ 0, 1, 0xDEAD_BEEF }) |seed| {
            // With batch == length, step s is exactly cycle s.
            for ([_]u64{ 0, 1, 5 }) |cycle| try expectCyclePermutation(length, seed, cycle);
        }
    }
}

/// The global batch of `step` (all ranks' shards, in rank order) into `out`.
fn fillGlobal(length: u64, seed: u64, step: u64, batch_size: usize, world: u64, out: []u64) void {
    for (0..world) |rank| {
        fill(length, .cyclic, seed, step, rank, world, out[rank * batch_size ..][0..batch_size]);
    }
}

test "cyclic: each cycle serves length / G whole batches, a prefix of its permutation" {
    var permutation: [1025]u64 = undefined;
    var batch: [3 * 64]u64 = undefined;
    for ([_]u64{ 1, 2, 3, 7, 10, 100, 128, 129, 1000, 1025 }) |length| {
        for ([_]usize{ 1, 3, 4, 7, 64 }) |batch_size| {
            for ([_]u64{ 1, 2, 3 }) |world| {
                const global: usize = @intCast(batch_size * world);
                if (global > length) continue;
                const per_cycle = batchesPerCycle(length, global);
                for (0..3) |cycle| {
                    // Batch == length: step `cycle` is the whole permutation.
                    fill(length, .cyclic, 42, cycle, 0, 1, permutation[0..@intCast(length)]);
                    for (0..per_cycle) |i| {
                        const step = cycle * per_cycle + i;
                        fillGlobal(length, 42, step, batch_size, world, batch[0..global]);
                        const want = permutation[i * global ..][0..global];
                        try testing.expectEqualSlices(u64, want, batch[0..global]);
                    }
                }
            }
        }
    }
}

test "cyclic: no global batch repeats an index, across cycle ends too" {
    var batch: [3 * 64]u64 = undefined;
    var seen = try std.DynamicBitSetUnmanaged.initEmpty(testing.allocator, 1_000_003);
    defer seen.deinit(testing.allocator);
    for ([_]u64{ 2, 7, 10, 129, 1000, 1023, 1_000_003 }) |length| {
        for ([_]usize{ 1, 3, 64 }) |batch_size| {
            for ([_]u64{ 1, 3 }) |world| {
                const global: usize = @intCast(batch_size * world);
                if (global > length) continue;
                const per_cycle = batchesPerCycle(length, global);
                // Steps around the first two cycle ends, and far away.
                const steps = [_]u64{
                    0, per_cycle - 1, per_cycle, 2 * per_cycle - 1, 2 * per_cycle, 1 << 40,
                };
                for (steps) |step| {
                    fillGlobal(length, 9, step, batch_size, world, batch[0..global]);
                    for (batch[0..global]) |index| {
                        try testing.expect(index < length);
                        try testing.expect(!seen.isSet(@intCast(index)));
                        seen.set(@intCast(index));
                    }
                    for (batch[0..global]) |index| seen.unset(@intCast(index));
                }
            }
        }
    }
}

test "cyclic: the dropped rest differs from cycle to cycle" {
    // 1000 = 3 * 256 + 232: each cycle drops the last 232 entries of its permutation.
    var permutation: [1000]u64 = undefined;
    var rests: [3][1000]bool = undefined;
    for (&rests, 0..) |*rest, cycle| {
        fill(1000, .cyclic, 5, cycle, 0, 1, &permutation);
        @memset(rest, false);
        for (permutation[768..]) |index| rest[@intCast(index)] = true;
    }
    try testing.expect(!std.mem.eql(bool, &rests[0], &rests[1]));
    try testing.expect(!std.mem.eql(bool, &rests[1], &rests[2]));
    try testing.expectEqual(@as(u64, 3), batchesPerCycle(1000, 256));
    try testing.expectEqual(@as(Position, 1000), positionAt(.cyclic, 1000, 256, 0, 0, 3));
    try testing.expectEqual(@as(Position, 1256), positionAt(.cyclic, 1000, 256, 0, 0, 4));
}

test "positionAt: another global batch finishes the cycle from the same offset" {
    const length = 97;
    // A run of G = 5 stopped at step 13: cycle 0, offset 65.
    const base = positionAt(.cyclic, length, 5, 0, 0, 13);
    try testing.expectEqual(@as(Position, 65), base);
    // With G = 9: (97 - 65) / 9 = 3 more batches of cycle 0, then 10 per cycle.
    const at = struct {
        fn f(step: u64) Position {
            return positionAt(.cyclic, length, 9, 13, 65, step);
        }
    }.f;
    try testing.expectEqual(@as(Position, 65), at(13));
    try testing.expectEqual(@as(Position, 83), at(15));
    try testing.expectEqual(@as(Position, length), at(16));
    try testing.expectEqual(@as(Position, length + 81), at(25));
    try testing.expectEqual(@as(Position, 2 * length), at(26));
    // A rest smaller than one batch starts the next cycle at once.
    try testing.expectEqual(@as(Position, length), positionAt(.cyclic, length, 40, 13, 65, 13));
    // The same global batch continues the run it was saved from.
    for (13..60) |step| {
        const fresh = positionAt(.cyclic, length, 5, 0, 0, step);
        try testing.expectEqual(fresh, positionAt(.cyclic, length, 5, 13, 65, step));
    }
    // SEQUENTIAL and IID: G positions per step.
    try testing.expectEqual(@as(Position, 65 + 2 * 9), positionAt(.iid, length, 9, 13, 65, 15));
}

test "fillSteps gives fill's batches one after another" {
    var steps: [40 * 7]u64 = undefined;
    var one: [7]u64 = undefined;
    for ([_]Mode{ .sequential, .iid, .cyclic }) |mode| {
        for ([_]u64{ 50, 100, 1000 }) |length| {
            for ([_][2]u64{ .{ 0, 1 }, .{ 2, 3 } }) |shard| {
                if (7 * shard[1] > length) continue;
                fillSteps(length, mode, 3, 5, shard[0], shard[1], 7, &steps);
                for (0..40) |i| {
                    fill(length, mode, 3, 5 + i, shard[0], shard[1], &one);
                    try testing.expectEqualSlices(u64, &one, steps[i * 7 ..][0..7]);
                }
            }
        }
    }
}

test "different seeds and different cycles give different permutations" {
    const length = 1000;
    var a: [length]u64 = undefined;
    var b: [length]u64 = undefined;
    fill(length, .cyclic, 1, 0, 0, 1, &a);
    fill(length, .cyclic, 2, 0, 0, 1, &b);
    try testing.expect(!std.mem.eql(u64, &a, &b));
    fill(length, .cyclic, 1, 1, 0, 1, &b);
    try testing.expect(!std.mem.eql(u64, &a, &b));
    // Small domains have few permutations, but consecutive cycles should still move.
    var distinct: usize = 0;
    var previous: [7]u64 = undefined;
    fill(7, .cyclic, 9, 0, 0, 1, &previous);
    for (1..50) |cycle| {
        var current: [7]u64 = undefined;
        fill(7, .cyclic, 9, cycle, 0, 1, &current);
        if (!std.mem.eql(u64, &previous, &current)) distinct += 1;
        previous = current;
    }
    try testing.expect(distinct >= 40);
}

test "small shuffles are uniform over all orders" {
    // 3 values, 6 orders, 60000 cycles: chi-square with 5 degrees of freedom
    // has mean 5; P(X > 40) is about 1e-7.
    var counts: [6]u32 = @splat(0);
    var order: [3]u64 = undefined;
    for (0..60_000) |cycle| {
        fill(3, .cyclic, 17, cycle, 0, 1, &order);
        const code = order[0] * 2 + @intFromBool(order[1] > order[2]);
        counts[@intCast(code)] += 1;
    }
    var chi_square: f64 = 0;
    for (counts) |count| {
        const delta = @as(f64, @floatFromInt(count)) - 10_000;
        chi_square += delta * delta / 10_000;
    }
    try testing.expect(chi_square < 40);
}

test "iid counts are close to uniform" {
    const length = 10;
    const draws = 100_000;
    var counts: [length]u64 = @splat(0);
    var buffer: [1000]u64 = undefined;
    for (0..draws / buffer.len) |step| {
        fill(length, .iid, 123, step, 0, 1, &buffer);
        for (buffer) |index| counts[@intCast(index)] += 1;
    }
    // Chi-square with 9 degrees of freedom: mean 9, P(X > 40) is about 1e-5.
    const expected: f64 = @as(f64, draws) / length;
    var chi_square: f64 = 0;
    for (counts) |count| {
        const delta = @as(f64, @floatFromInt(count)) - expected;
        chi_square += delta * delta / expected;
    }
    try testing.expect(chi_square < 40);
}

test "iid depends only on seed and position" {
    // Step 6 with B=32 and world=2: rank 1 owns positions [6*64 + 32, 6*64 + 64) = [416, 448),
    // which is step 13 of an unsharded run with B=32.
    var sharded: [32]u64 = undefined;
    fill(1_000_000, .iid, 8, 6, 1, 2, &sharded);
    var plain: [32]u64 = undefined;
    fill(1_000_000, .iid, 8, 13, 0, 1, &plain);
    try testing.expectEqualSlices(u64, &plain, &sharded);
    fill(1_000_000, .iid, 9, 13, 0, 1, &plain);
    try testing.expect(!std.mem.eql(u64, &plain, &sharded));
}

test "iid rejection keeps large lengths in range" {
    // 2^63 + 1 rejects almost half of all words.
    const length: u64 = (1 << 63) + 1;
    var buffer: [4096]u64 = undefined;
    fill(length, .iid, 1, 0, 0, 1, &buffer);
    var high: usize = 0;
    for (buffer) |index| {
        try testing.expect(index < length);
        if (index >= 1 << 62) high += 1;
    }
    // Half of [0, 2^63 + 1) lies at or above 2^62: 2048 expected, standard deviation 32.
    try testing.expect(high > 1750 and high < 2350);
}

test "sequential wraps circularly" {
    var buffer: [5]u64 = undefined;
    fill(7, .sequential, 0, 3, 0, 1, &buffer); // positions 15..19
    try testing.expectEqualSlices(u64, &.{ 1, 2, 3, 4, 5 }, &buffer);
    fill(7, .sequential, 0, 1, 0, 1, &buffer); // positions 5..9
    try testing.expectEqualSlices(u64, &.{ 5, 6, 0, 1, 2 }, &buffer);
    var ones: [3]u64 = undefined;
    fill(1, .sequential, 0, 99, 0, 1, &ones);
    try testing.expectEqualSlices(u64, &.{ 0, 0, 0 }, &ones);
}

test "sharded ranks together give the unsharded global batch" {
    const world = 3;
    const batch_size = 50;
    for ([_]Mode{ .sequential, .iid, .cyclic }) |mode| {
        for ([_]u64{ 0, 1, 7, 1 << 40 }) |step| {
            var global: [batch_size * world]u64 = undefined;
            fill(1037, mode, 5, step, 0, 1, &global);
            var union_batch: [batch_size * world]u64 = undefined;
            for (0..world) |rank| {
                const slice = union_batch[rank * batch_size ..][0..batch_size];
                fill(1037, mode, 5, step, rank, world, slice);
            }
            try testing.expectEqualSlices(u64, &global, &union_batch);
        }
    }
}

test "huge lengths and steps stay in range" {
    const max = std.math.maxInt(u64);
    var buffer: [300]u64 = undefined;
    for ([_]Mode{ .sequential, .iid, .cyclic }) |mode| {
        for ([_]u64{ 1, 2, 3, 1 << 32, (1 << 32) + 1, 1 << 63, max - 1, max }) |length| {
            for ([_]u64{ 0, 1 << 63, max }) |step| {
                for ([_][2]u64{ .{ 0, 1 }, .{ 5, 7 }, .{ max - 1, max } }) |shard| {
                    // CYCLIC refuses a global batch larger than the length.
                    if (mode == .cyclic and @as(u128, buffer.len) * shard[1] > length) continue;
                    fill(length, mode, max, step, shard[0], shard[1], &buffer);
                    for (buffer) |index| try testing.expect(index < length);
                }
            }
        }
    }
}

test "huge lengths: cyclic has no repeats within a batch" {
    const max = std.math.maxInt(u64);
    var buffer: [2048]u64 = undefined;
    fill(max, .cyclic, 3, 1 << 63, 0, 1, &buffer);
    std.mem.sortUnstable(u64, &buffer, {}, std.sort.asc(u64));
    for (buffer[1..], buffer[0 .. buffer.len - 1]) |b, a| try testing.expect(a < b);
}

test "split divides exact 192-bit positions" {
    const high: Position = 0x1234_5678_9ABC_DEF0;
    const middle: Position = 0x0FED_CBA9_8765_4321;
    const p: Position = (high << 128) | (middle << 64) | 0x1111_2222_3333_4444;
    for ([_]u64{ 1, 2, 3, 1000, 1 << 63, std.math.maxInt(u64) }) |length| {
        const s = split(p, length);
        try testing.expect(s.offset < length);
        try testing.expectEqual(p, s.cycle * length + s.offset);
    }
}

test "the AVX2 build of CYCLIC gives the portable build's indices" {
    if (!cpu.avx2_unit or !cpu.hasAvx2()) return error.SkipZigTest;
    var prng = std.Random.DefaultPrng.init(0x5A3D);
    const random = prng.random();
    var portable: [700]u64 = undefined;
    var vectorized: [700]u64 = undefined;
    for (0..200) |trial| {
        // Small, mid-size and huge lengths; batches that straddle cycle ends.
        const length: u64 = switch (trial % 4) {
            0 => random.intRangeAtMost(u64, 1, 300),
            1 => random.intRangeAtMost(u64, 129, 1 << 20),
            2 => random.intRangeAtMost(u64, 1 << 20, 1 << 40),
            else => random.intRangeAtMost(u64, 1 << 40, std.math.maxInt(u64)),
        };
        const count = random.intRangeAtMost(usize, 1, portable.len);
        const seed = random.int(u64);
        const first: Position = random.int(u128) % (@as(u128, length) * 5 + 1);
        cyclic.fillCyclic(length, seed, first, portable[0..count]);
        const words: [3]u64 = @bitCast(first);
        loaderx_fill_cyclic_avx2(length, seed, &words, &vectorized, count);
        try testing.expectEqualSlices(u64, portable[0..count], vectorized[0..count]);
    }
}

test {
    _ = cyclic;
}
