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
//!   `Feistel`), restricted to `[0, length)` by cycle walking: O(1) memory for
//!   every length up to 2^64-1, and a few nanoseconds per index.
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
        .cyclic => if (avx2_unit and cpu.hasAvx2()) {
            const words: [3]u64 = @bitCast(position_first);
            loaderx_fill_cyclic_avx2(length, seed, &words, out.ptr, out.len);
        } else fillCyclic(length, seed, position_first, out),
    }
    // Every index a sampler writes is a record of the source (the loader
    // gathers them unchecked against the length it was built for).
    for (out) |index| assert(index < length);
}

/// Whether this build links `sampler_avx2.zig`: the same CYCLIC code compiled
/// for x86-64-v3, where the Feistel lanes run four to a register instead of
/// two (the portable build targets baseline x86-64, SSE2 only). A build whose
/// target already has AVX2 has no need of it.
const avx2_unit = builtin.cpu.arch == .x86_64 and
    !std.Target.x86.featureSetHas(builtin.cpu.features, .avx2);

/// Defined (hidden, never exported) in sampler_avx2.zig.
extern fn loaderx_fill_cyclic_avx2(
    length: u64,
    seed: u64,
    position_first: *const [3]u64,
    out: [*]u64,
    count: usize,
) void;

/// The CYCLIC fill of `fill`, for sampler_avx2.zig to compile for its target.
pub fn fillCyclicWords(
    length: u64,
    seed: u64,
    position_first: *const [3]u64,
    out: [*]u64,
    count: usize,
) void {
    fillCyclic(length, seed, @bitCast(position_first.*), out[0..count]);
}

// ---------------------------------------------------------------------------
// Position arithmetic.

const Split = struct { cycle: Position, offset: u64 };

/// `p / length` and `p % length`. The common case (p < 2^64) is one hardware
/// division; otherwise long division by 64-bit limbs, most significant first.
fn split(p: Position, length: u64) Split {
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
const golden_gamma: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finalizer: a bijection on u64 with full avalanche.
fn mix64(x: u64) u64 {
    var z = x;
    z = (z ^ (z >> 30)) *% 0xBF58_476D_1CE4_E5B9;
    z = (z ^ (z >> 27)) *% 0x94D0_49BB_1331_11EB;
    return z ^ (z >> 31);
}

/// Folds a domain tag, the seed and a wide counter into one 64-bit key. Chaining
/// full mixes keeps keys for different inputs unrelated.
fn deriveKey(domain: u64, seed: u64, wide: Position) u64 {
    var h = mix64(seed ^ domain);
    inline for (.{ 0, 1, 2 }) |limb| {
        h = mix64(h ^ (@as(u64, @truncate(wide >> (64 * limb))) +% golden_gamma));
    }
    return h;
}

// Distinct domain tags keep the keys of the three generators apart.
const domain_iid: u64 = 0x6969_6469_7261_7773;
const domain_feistel: u64 = 0x6665_6973_7465_6C00;
const domain_shuffle: u64 = 0x7368_7566_666C_6500;

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
// Cyclic: an exact shuffle for small lengths, a keyed Feistel network otherwise.

fn fillCyclic(length: u64, seed: u64, position_first: Position, out: []u64) void {
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

test "feistel is not the identity on wide domains" {
    const feistel = Feistel.init(std.math.maxInt(u64), 5, 0);
    var fixed: usize = 0;
    for (0..1000) |x| {
        if (feistel.permute(x) == x) fixed += 1;
    }
    try testing.expect(fixed <= 1);
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
    if (!avx2_unit or !cpu.hasAvx2()) return error.SkipZigTest;
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
        fillCyclic(length, seed, first, portable[0..count]);
        const words: [3]u64 = @bitCast(first);
        loaderx_fill_cyclic_avx2(length, seed, &words, &vectorized, count);
        try testing.expectEqualSlices(u64, portable[0..count], vectorized[0..count]);
    }
}
