//! CYCLIC's permutations (see "Modes" in sampler.zig): an exact
//! Fisher-Yates shuffle for lengths up to `shuffle_length_max`, and a keyed,
//! mixed-radix Feistel network, restricted to `[0, length)` by cycle walking,
//! for every longer one. Pure functions of (length, seed, cycle), like the
//! rest of the sampler.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const sampler = @import("sampler.zig");
const Position = sampler.Position;
const split = sampler.split;
const mix64 = sampler.mix64;
const deriveKey = sampler.deriveKey;
const golden_gamma = sampler.golden_gamma;
const domain_feistel = sampler.domain_feistel;
const domain_shuffle = sampler.domain_shuffle;

pub fn fillCyclic(length: u64, seed: u64, position_first: Position, out: []u64) void {
    const first = split(position_first, length);
    var cycle = first.cycle;
    var offset = first.offset;
    var done: usize = 0;
    while (true) {
        assert(offset < length);
        const run_size: usize = @intCast(@min(out.len - done, length - offset));
        assert(run_size >= 1 or out.len == 0);
        const run = out[done..][0..run_size];
        if (length <= shuffle_length_max) {
            const shuffle = SmallShuffle.init(length, seed, cycle);
            for (run, @as(usize, @intCast(offset))..) |*slot, x| slot.* = shuffle.table[x];
        } else {
            const feistel = Feistel.init(length, seed, cycle);
            permuteRun(&feistel, length, offset, run);
        }
        done += run_size;
        if (done == out.len) break;
        // The run ended the cycle; the next one starts a fresh permutation.
        offset = 0;
        cycle += 1;
    }
}

/// Lengths up to this are shuffled exactly. A Feistel network over a handful of
/// values reaches only a small, uneven family of permutations, and rebuilding a
/// table of at most this many entries for every call stays cheap.
const shuffle_length_max = 128;

/// The Fisher-Yates shuffle of `[0, length)` for one (seed, cycle): every
/// permutation equally likely, up to the quality of the word stream.
const SmallShuffle = struct {
    table: [shuffle_length_max]u8,

    comptime {
        assert(shuffle_length_max - 1 <= std.math.maxInt(u8));
    }

    fn init(length: u64, seed: u64, cycle: Position) SmallShuffle {
        assert(length >= 1);
        assert(length <= shuffle_length_max);
        const count: usize = @intCast(length);
        var shuffle: SmallShuffle = undefined;
        for (shuffle.table[0..count], 0..) |*slot, i| slot.* = @intCast(i);
        var stream: WordStream = .{ .key = deriveKey(domain_shuffle, seed, cycle) };
        var remaining = count;
        while (remaining > 1) : (remaining -= 1) {
            const chosen: usize = @intCast(stream.below(remaining));
            std.mem.swap(u8, &shuffle.table[remaining - 1], &shuffle.table[chosen]);
        }
        return shuffle;
    }
};

/// SplitMix64 started at `key`: word `i` is `mix64(key + i*gamma)`.
const WordStream = struct {
    key: u64,
    counter: u64 = 0,

    fn next(stream: *WordStream) u64 {
        stream.counter += 1;
        return mix64(stream.key +% stream.counter *% golden_gamma);
    }

    /// Uniform on `[0, range)`: Lemire's multiply-shift, computing the rejection
    /// threshold (a division) only in the rare case that it might matter.
    fn below(stream: *WordStream, range: u64) u64 {
        assert(range >= 1);
        var product = @as(u128, stream.next()) * range;
        if (@as(u64, @truncate(product)) < range) {
            const threshold = (0 -% range) % range;
            while (@as(u64, @truncate(product)) < threshold) {
                product = @as(u128, stream.next()) * range;
            }
        }
        return @intCast(product >> 64);
    }
};

/// The number of Feistel rounds. For two positions that differ in one half,
/// the network passes their difference through unchanged only if every update
/// of the other half collides, a chance of about `width^-(rounds/2 - 1)`: with
/// 8 rounds that is below `length^-1.5`, negligible next to the `1/length`
/// chance of any given pair in a random permutation. Six rounds measurably
/// doubled that chance (for adjacent positions landing on adjacent indices),
/// and four showed correlations in the low bits of neighbouring indices.
const feistel_rounds = 8;

/// Inputs per vector step of `permuteRun`. The rounds form one long chain of
/// dependent multiplies; 16 lanes (eight SSE2 registers) give the core enough
/// independent chains to hide that latency, and measured faster than 8 or 4.
/// Every length that reaches the Feistel network (> `shuffle_length_max`) has
/// `2^low_bits >= 16`, so all of them are vectorized.
const lanes = 16;
const Lanes = @Vector(lanes, u64);

/// A keyed bijection on `[0, width_high * 2^low_bits)`, built for one length and
/// one (seed, cycle). A value `x` is the pair `high = x >> low_bits` (in
/// `[0, width_high)`) and `low = x mod 2^low_bits`. Even rounds add a keyed hash
/// of `high` to `low` modulo `2^low_bits`; odd rounds add a keyed hash of `low`
/// to `high` modulo `width_high`. Each round is invertible whatever the hash is
/// (subtract it back), so the network is a bijection: an unbalanced,
/// mixed-radix Feistel network as in format-preserving encryption.
///
/// For a length of `k` bits, `low_bits = ceil(k/2)` and `width_high =
/// ceil(length / 2^low_bits) <= 2^floor(k/2)`: the halves are balanced within a
/// factor of two and the domain exceeds `length` by less than `2^low_bits <=
/// 2*sqrt(length)`, so cycle walking is rare, where a binary network over `2^k`
/// values walks for up to half of the indices. The low width is a power of two
/// so that splitting and joining a value are a shift and a mask, and round 0
/// hashes the high half, which consecutive inputs share: `permuteLanes` does
/// that hash once per vector.
pub const Feistel = struct {
    width_high: u64,
    /// `width_high` for `permuteLanes`, where `vectorizable` holds. Splatting
    /// a u32 (rather than masking a u64) lets the compiler see a 32-bit factor
    /// inside the loop and emit one lane multiply.
    width_high_u32: u32,
    low_bits: u6,
    low_mask: u64,
    keys_xor: [feistel_rounds]u32,
    keys_multiply: [feistel_rounds]u32,

    comptime {
        assert(feistel_rounds % 2 == 0);
        assert(feistel_rounds >= 4);
    }

    pub fn init(length: u64, seed: u64, cycle: Position) Feistel {
        assert(length >= 1);
        const bits: u7 = 64 - @as(u7, @clz(length - 1)); // The smallest k with 2^k >= length.
        const low_bits: u6 = @intCast(bits - bits / 2);
        var feistel: Feistel = .{
            .width_high = ((length - 1) >> low_bits) + 1,
            .width_high_u32 = undefined,
            .low_bits = low_bits,
            .low_mask = (@as(u64, 1) << low_bits) - 1,
            .keys_xor = undefined,
            .keys_multiply = undefined,
        };
        assert(feistel.width_high <= @as(u64, 1) << @as(u6, @intCast(bits / 2)));
        assert(feistel.domainSize() >= length);
        feistel.width_high_u32 = std.math.cast(u32, feistel.width_high) orelse 0;
        var stream: WordStream = .{ .key = deriveKey(domain_feistel, seed, cycle) };
        for (&feistel.keys_xor, &feistel.keys_multiply) |*key_xor, *key_multiply| {
            const word = stream.next();
            key_xor.* = @truncate(word);
            // An odd multiplier keeps the product a bijection of the hashed half.
            key_multiply.* = @as(u32, @truncate(word >> 32)) | 1;
        }
        return feistel;
    }

    pub fn domainSize(feistel: *const Feistel) u128 {
        return @as(u128, feistel.width_high) << feistel.low_bits;
    }

    /// The round hash of a half (both halves fit in 32 bits): one keyed
    /// 32x32->64 multiply folded to 32 bits, the "mulhilo" step of Philox.
    inline fn roundHash(feistel: *const Feistel, comptime r: usize, half: u32) u32 {
        const product = @as(u64, half ^ feistel.keys_xor[r]) * feistel.keys_multiply[r];
        return @truncate(product ^ (product >> 32));
    }

    /// The permutation of `x < domainSize()`.
    pub fn permute(feistel: *const Feistel, x: u64) u64 {
        assert(x < feistel.domainSize());
        var high = x >> feistel.low_bits;
        var low = x & feistel.low_mask;
        inline for (0..feistel_rounds) |r| {
            if (r % 2 == 0) {
                low = (low + feistel.roundHash(r, @intCast(high))) & feistel.low_mask;
            } else {
                // Scale the hash into [0, width_high) by a multiply-shift, not a division.
                const hash: u64 = feistel.roundHash(r, @intCast(low));
                const sum = high + ((hash * feistel.width_high) >> 32);
                high = if (sum >= feistel.width_high) sum - feistel.width_high else sum;
            }
        }
        return (high << feistel.low_bits) | low;
    }

    /// Whether `permuteLanes` applies: it needs `lanes <= 2^low_bits` (true
    /// from 129 values up) and both widths at most 2^31 (lengths up to 2^62).
    fn vectorizable(feistel: *const Feistel) bool {
        return feistel.low_bits >= std.math.log2_int(u64, lanes) and
            feistel.low_bits <= 31 and feistel.width_high <= 1 << 31;
    }

    /// `permute(x_first + lane)` for every lane, with `x_first` a multiple of
    /// `lanes`, so that all lanes share one high half (`2^low_bits` is a
    /// multiple of `lanes`). The same arithmetic as `permute`, written for
    /// baseline SIMD: u32 lanes, `low32` masks and splats of u32 values let the
    /// compiler prove, inside the loop, that both factors of each multiply fit
    /// in 32 bits (one `pmuludq` on x86-64), and the modular add subtracts the
    /// width and adds it back under the sign mask, as SSE2 has no unsigned
    /// 64-bit lane compare.
    fn permuteLanes(feistel: *const Feistel, x_first: u64) Lanes {
        assert(feistel.vectorizable());
        assert(x_first % lanes == 0);
        assert(x_first + lanes <= feistel.domainSize());
        const low32: Lanes = @splat(std.math.maxInt(u32));
        const width_high: Lanes = @splat(feistel.width_high);
        const low_mask: Lanes = @splat(feistel.low_mask);
        const high_first = x_first >> feistel.low_bits;
        const low_first = x_first & feistel.low_mask;
        const low_shifted = low_first + feistel.roundHash(0, @intCast(high_first));
        var high: Lanes = @splat(high_first);
        var low = (@as(Lanes, @splat(low_shifted)) + std.simd.iota(u64, lanes)) & low_mask;
        inline for (1..feistel_rounds) |r| {
            const half = if (r % 2 == 0) high else low;
            // Truncating to u32 lanes here, not masking, keeps the compiler from
            // merging the mask into the loop-invariant `low_mask` and losing
            // sight of the 32-bit factor.
            const half32: @Vector(lanes, u32) = @truncate(half);
            const keyed: Lanes = half32 ^ @as(@Vector(lanes, u32), @splat(feistel.keys_xor[r]));
            const multiplier: @Vector(lanes, u32) = @splat(feistel.keys_multiply[r]);
            const product = keyed * @as(Lanes, multiplier);
            const hash = (product ^ (product >> @splat(32))) & low32;
            if (r % 2 == 0) {
                low = (low + hash) & low_mask;
            } else {
                const width_high32: @Vector(lanes, u32) = @splat(feistel.width_high_u32);
                const scaled = (hash * @as(Lanes, width_high32)) >> @splat(32);
                const difference = high + scaled -% width_high;
                high = difference +% (width_high & signMask(difference));
            }
        }
        const low_width: @Vector(lanes, u32) = @splat(@intCast(feistel.low_mask + 1));
        return (high & low32) * @as(Lanes, low_width) + low;
    }
};

/// The sign mask of lanes whose values lie in `(-2^32, 2^32)` as two's
/// complement: the upper 32-bit word of such a lane is already 0 or all ones,
/// so copying it over the lower word is the mask (one `pshufd`), where a 64-bit
/// arithmetic shift would take three SSE2 instructions.
inline fn signMask(values: Lanes) Lanes {
    const Words = @Vector(2 * lanes, u32);
    const upper_words = comptime upper: {
        const upper: i32 = if (builtin.cpu.arch.endian() == .little) 1 else 0;
        var indices: [2 * lanes]i32 = undefined;
        for (0..lanes) |lane| {
            indices[2 * lane] = 2 * lane + upper;
            indices[2 * lane + 1] = 2 * lane + upper;
        }
        break :upper indices;
    };
    return @bitCast(@shuffle(u32, @as(Words, @bitCast(values)), undefined, upper_words));
}

/// `out[i] = perm(offset + i)` within one cycle, where `perm` is the Feistel
/// network restricted to `[0, length)` by cycle walking: a value outside is
/// permuted again until it lands inside. The walk from an in-range value must
/// come back into range (the network is a bijection on a finite set), so the
/// result is a bijection on `[0, length)`.
fn permuteRun(feistel: *const Feistel, length: u64, offset: u64, out: []u64) void {
    assert(out.len <= length - offset);
    if (!feistel.vectorizable()) {
        for (out, 0..) |*slot, i| slot.* = walk(feistel, length, feistel.permute(offset + i));
        return;
    }
    // Lanes hold values below 2^62 and `length <= 2^62`, so bit 63 of
    // `value -% length` is set exactly when `value < length`.
    const limit: Lanes = @splat(length);
    var done: usize = 0;
    while (done < out.len) {
        // Whole aligned vectors; at the ends of the run, the lanes it covers.
        // An aligned vector never leaves the domain, a multiple of `lanes`.
        const x = offset + done;
        const skip: usize = @intCast(x % lanes);
        const take = @min(lanes - skip, out.len - done);
        const values = feistel.permuteLanes(x - skip);
        if (take == lanes) {
            out[done..][0..lanes].* = values;
            // Walking is rare: the domain exceeds length by < 2*sqrt(length).
            if (@reduce(.And, values -% limit) >> 63 == 0) {
                for (out[done..][0..lanes]) |*slot| slot.* = walk(feistel, length, slot.*);
            }
        } else {
            const array: [lanes]u64 = values;
            for (out[done..][0..take], array[skip..][0..take]) |*slot, value| {
                slot.* = walk(feistel, length, value);
            }
        }
        done += take;
    }
}

fn walk(feistel: *const Feistel, length: u64, first: u64) u64 {
    var value = first;
    while (value >= length) value = feistel.permute(value);
    assert(value < length);
    return value;
}

// ---------------------------------------------------------------------------
// Tests.

const testing = std.testing;

test "feistel is a bijection on its full domain" {
    const lengths = [_]u64{ 1, 2, 3, 4, 5, 7, 64, 100, 1000, 1025, 65536, 100_000, 1 << 20 };
    for (lengths, 0..) |length, cycle| {
        const feistel = Feistel.init(length, 77, cycle);
        const size: usize = @intCast(feistel.domainSize());
        var seen = try std.DynamicBitSetUnmanaged.initEmpty(testing.allocator, size);
        defer seen.deinit(testing.allocator);
        for (0..size) |x| {
            const y = feistel.permute(x);
            try testing.expect(y < size);
            try testing.expect(!seen.isSet(@intCast(y)));
            seen.set(@intCast(y));
        }
    }
}

test "feistel domain covers the length with little slack" {
    const max = std.math.maxInt(u64);
    const lengths = [_]u64{
        1,       2,             3,       4,             5,               7,       1000, 1025,
        1 << 32, (1 << 32) + 1, 1 << 63, (1 << 63) + 1, max - (1 << 32), max - 1, max,
    };
    for (lengths) |length| {
        const feistel = Feistel.init(length, 0, 0);
        try testing.expect(feistel.domainSize() >= length);
        try testing.expect(feistel.domainSize() - length < @as(u64, 1) << feistel.low_bits);
        try testing.expect(feistel.width_high <= @as(u64, 1) << feistel.low_bits);
    }
}

test "feistel lanes agree with the scalar permutation" {
    const lengths = [_]u64{
        65, 129, 1000, 1025, 1 << 20, 1 << 32, (1 << 40) + 3, (1 << 62) - 5, 1 << 62,
    };
    for (lengths, 0..) |length, cycle| {
        const feistel = Feistel.init(length, 3, cycle);
        try testing.expect(feistel.vectorizable());
        const vector_count: u64 = @intCast(feistel.domainSize() / lanes);
        var state: u64 = length;
        for (0..200) |_| {
            state = mix64(state);
            const x_first = (state % vector_count) * lanes;
            const output = feistel.permuteLanes(x_first);
            inline for (0..lanes) |lane| {
                try testing.expectEqual(feistel.permute(x_first + lane), output[lane]);
            }
        }
    }
    for ([_]u64{ 1, 2, 8, 9, 16, 64, (1 << 62) + 1, std.math.maxInt(u64) }) |length| {
        try testing.expect(!Feistel.init(length, 0, 0).vectorizable());
    }
}

test "cyclic runs match the scalar network at every alignment" {
    var buffer: [200]u64 = undefined;
    for ([_]u64{ 129, 1000, 1025, 100_003, (1 << 40) + 5 }, 0..) |length, cycle| {
        const feistel = Feistel.init(length, 99, cycle);
        try testing.expect(feistel.vectorizable());
        var state: u64 = length;
        for (0..50) |_| {
            state = mix64(state);
            const size: usize = @intCast(1 + state % @min(buffer.len, length));
            const offset = (state >> 32) % (length - size + 1);
            permuteRun(&feistel, length, offset, buffer[0..size]);
            for (buffer[0..size], 0..) |index, i| {
                try testing.expectEqual(walk(&feistel, length, feistel.permute(offset + i)), index);
            }
        }
    }
}

test "feistel is not the identity on wide domains" {
    const feistel = Feistel.init(std.math.maxInt(u64), 5, 0);
    var fixed: usize = 0;
    for (0..1000) |x| {
        if (feistel.permute(x) == x) fixed += 1;
    }
    try testing.expect(fixed <= 1);
}
