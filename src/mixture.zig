//! Weighted mixtures of sources: how many records of each source a step's
//! global batch holds, which position of that source's own sequence each
//! record is, and in which order the records sit in the batch.
//!
//! Counts. Weights are positive integers (the Python side turns the user's
//! weights into exact ratios of integers). The records of the mixed stream
//! are shared out by a balanced binary tree over the sources: a node holding
//! N records gives its left half floor(N * W_left / W) and its right half the
//! rest. Both shares are nondecreasing in N, so a source's cumulative count
//! C_k(N) never decreases (no step takes records back, which a floor of
//! cumulative targets per source would), and each level's floor is off by
//! less than one record, so |C_k(N) - N * w_k| < ceil(log2 K) for K sources
//! (1 record for two sources, 2 for three or four). C_k is a pure function of
//! the global record position N: O(K) per step, nothing replayed, and no
//! dependence on the batch size, so a run resumed with another global batch
//! continues every source's sequence exactly.
//!
//! Order. The G slots of a step start grouped by source (source 0's records
//! first); a keyed permutation of [0, G) (the CYCLIC sampler's, keyed by the
//! seed and the step's first position) then spreads them, so any slice of the
//! batch (a rank's shard, a gradient-accumulation micro-batch) holds close to
//! the mixture's proportions.
const std = @import("std");
const assert = std.debug.assert;
const sampler = @import("sampler.zig");

pub const sources_max: usize = 256;
/// Largest sum of weights (the numerators of the ratios).
pub const weight_total_max: u64 = 1 << 40;

pub const Mixture = struct {
    /// prefix[k]: the weights of sources below k.
    prefix: [sources_max + 1]u64 = undefined,
    count: usize,

    pub fn init(weights: []const u64) Mixture {
        assert(weights.len >= 1 and weights.len <= sources_max);
        var m: Mixture = .{ .count = weights.len };
        m.prefix[0] = 0;
        for (weights, 0..) |w, k| {
            assert(w >= 1);
            m.prefix[k + 1] = m.prefix[k] + w;
        }
        assert(m.prefix[weights.len] <= weight_total_max);
        return m;
    }

    /// C_k(n) for every source k: its records among the first `n` records of
    /// the mixed stream.
    pub fn cumulative(m: *const Mixture, n: u128, out: []u128) void {
        assert(out.len >= m.count);
        m.share(0, m.count, n, out);
    }

    fn share(m: *const Mixture, lo: usize, hi: usize, n: u128, out: []u128) void {
        if (hi - lo == 1) {
            out[lo] = n;
            return;
        }
        const mid = (lo + hi) / 2;
        const w = m.prefix[hi] - m.prefix[lo];
        const w_left = m.prefix[mid] - m.prefix[lo];
        const left: u128 = @intCast(@as(u256, n) * w_left / w);
        assert(left <= n);
        m.share(lo, mid, left, out);
        m.share(mid, hi, n - left, out);
    }
};

/// Where a record of a mixed batch comes from.
pub const Origin = struct {
    source: u16,
    /// Its position in the source's own sequence.
    position: u128,
};

/// The records of the slice [slot_first, slot_first + out.len) of the step
/// whose global batch of `global` records starts at mixed position `first`.
/// `scratch` holds out.len words.
pub fn compose(
    m: *const Mixture,
    seed: u64,
    first: u128,
    global: u64,
    slot_first: u64,
    scratch: []u64,
    out: []Origin,
) void {
    assert(scratch.len >= out.len);
    assert(slot_first + out.len <= global);
    var before: [sources_max]u128 = undefined;
    var after: [sources_max]u128 = undefined;
    m.cumulative(first, &before);
    m.cumulative(first + global, &after);
    // Slot boundaries of the sources in the unpermuted batch.
    var ends: [sources_max]u64 = undefined;
    var at: u64 = 0;
    for (0..m.count) |k| {
        at += @intCast(after[k] - before[k]);
        ends[k] = at;
    }
    assert(at == global);
    const slots = scratch[0..out.len];
    sampler.fillFrom(global, .cyclic, orderKey(seed, first), slot_first, slots);
    for (slots, out) |slot, *o| {
        var k: usize = 0;
        while (ends[k] <= slot) k += 1;
        const start = if (k == 0) 0 else ends[k - 1];
        o.* = .{ .source = @intCast(k), .position = before[k] + (slot - start) };
    }
}

fn orderKey(seed: u64, first: u128) u64 {
    var h: u64 = seed ^ 0x6C6F_6164_6572_786D; // "loaderxm"
    inline for (.{ @as(u64, @truncate(first)), @as(u64, @truncate(first >> 64)) }) |word| {
        h = (h ^ word) *% 0x9E37_79B9_7F4A_7C15;
        h ^= h >> 29;
    }
    return h;
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

test "cumulative counts are nondecreasing, exact in total, and near the weights" {
    const weights = [_]u64{ 5, 3, 2 };
    const m = Mixture.init(&weights);
    var previous: [3]u128 = @splat(0);
    var counts: [3]u128 = undefined;
    var n: u128 = 0;
    while (n < 200_000) : (n += 37) {
        m.cumulative(n, &counts);
        var total: u128 = 0;
        for (counts, previous, weights) |c, p, w| {
            try testing.expect(c >= p);
            total += c;
            const ideal = @as(f64, @floatFromInt(n)) * @as(f64, @floatFromInt(w)) / 10.0;
            try testing.expect(@abs(@as(f64, @floatFromInt(c)) - ideal) < 2.0);
        }
        try testing.expectEqual(n, total);
        previous = counts;
    }
}

test "a composed batch holds each source's next positions once, in a keyed order" {
    const m = Mixture.init(&.{ 1, 1, 2 });
    var scratch: [64]u64 = undefined;
    var out: [64]Origin = undefined;
    compose(&m, 7, 1000, 64, 0, &scratch, &out);
    var before: [3]u128 = undefined;
    var after: [3]u128 = undefined;
    m.cumulative(1000, &before);
    m.cumulative(1064, &after);
    var seen: [3]u64 = @splat(0);
    for (out) |o| {
        try testing.expect(o.position >= before[o.source] and o.position < after[o.source]);
        seen[o.source] += 1;
    }
    for (seen, before, after) |s, b, a| try testing.expectEqual(a - b, s);
    // Two halves of the batch (two ranks) together are the whole batch.
    var half: [32]Origin = undefined;
    compose(&m, 7, 1000, 64, 32, scratch[0..32], &half);
    for (half, out[32..]) |x, y| try testing.expectEqual(y, x);
}
