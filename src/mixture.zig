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
//!
//! CYCLIC sources. In SEQUENTIAL and IID mode source k's records of a step
//! are its own sampler's positions [C_k(N), C_k(N + G)). In CYCLIC mode no
//! step may repeat a record of a source, so a step must take all of its
//! records of source k from one cycle (one permutation) of that source, and
//! its count varies from step to step (by up to ~2 ceil(log2 K) records around
//! G * w_k). The greedy rule -- start the next cycle when a step's count does
//! not fit the rest of the current one -- makes each cycle's end depend on all
//! the steps before it, so seeking to step s would replay every cycle since
//! the start. Instead each source runs on a fixed schedule of steps:
//!
//! - `windowMax(k, n)` bounds source k's records among any n consecutive
//!   records of the mixed stream (walking the tree: a node whose window holds
//!   at most h records gives a child at most ceil(h * w_child / w_node)).
//! - A cycle of source k lasts T_k steps, the most steps whose records can
//!   never exceed its length L_k: the largest T with windowMax(k, T*G) <= L_k
//!   (`stepsPerCycle`, a binary search done once at open). The cycle serves
//!   the next records of its permutation from offset 0, each step's from where
//!   the step before stopped, and drops the rest: at most about one step's
//!   count plus ceil(log2 K) records per cycle, close to the greedy rule's
//!   rest (the original's rule for one source: less than one batch).
//! - A source's place at a step is a `Cursor`: its cycle, the offset of its
//!   next record in that cycle, and the steps the cycle still lasts. From the
//!   cursor at a base step, the cursor at any later step is O(log K) work
//!   (`cursorAt`): the base's cycle lasts its `steps_left`, every later one
//!   T_k steps, and an offset is a difference of two cumulative counts. So
//!   seeking stays O(1) in the step, exact, and nothing is replayed.
//! - A cursor with `steps_left = 0` is one whose global batch is not known:
//!   a fresh start (cycle 0, offset 0) or a state saved under another global
//!   batch (an elastic resume). `normalize` gives it as many steps as the rest
//!   of its cycle holds for the actual counts from that position (exact, a
//!   binary search); when not even one step fits, the source starts its next
//!   cycle. A resume with the same global batch keeps the saved `steps_left`,
//!   so it continues exactly as the run it was saved from.
//! - A source whose count in one step can exceed its length (windowMax(k, G)
//!   > L_k, T_k = 0) cannot avoid a repeat: the loader refuses it.
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
        assert(weights.len >= 1);
        assert(weights.len <= sources_max);
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
        assert(lo < hi and hi <= m.count);
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

    /// C_k(n) for source `k` alone: one path down the tree, O(log K).
    pub fn countOf(m: *const Mixture, k: usize, n: u128) u128 {
        assert(k < m.count);
        var lo: usize = 0;
        var hi: usize = m.count;
        var records = n;
        while (hi - lo > 1) {
            const mid = (lo + hi) / 2;
            const w = m.prefix[hi] - m.prefix[lo];
            const w_left = m.prefix[mid] - m.prefix[lo];
            const left: u128 = @intCast(@as(u256, records) * w_left / w);
            if (k < mid) {
                records = left;
                hi = mid;
            } else {
                records -= left;
                lo = mid;
            }
        }
        assert(records <= n);
        return records;
    }

    /// The most records of source `k` that any `n` consecutive records of the
    /// mixed stream hold. A node whose window holds `h` records gives its left
    /// child floor((b + h)*r) - floor(b*r) <= ceil(h*r) of them (r = w_left/w)
    /// and its right child the rest, at most h - floor(h*r) = ceil(h*(1-r)).
    /// Both bounds grow with h, so bounding the parent's window bounds the
    /// child's, down to the leaf.
    pub fn windowMax(m: *const Mixture, k: usize, n: u128) u128 {
        assert(k < m.count);
        var lo: usize = 0;
        var hi: usize = m.count;
        var records = n;
        while (hi - lo > 1) {
            const mid = (lo + hi) / 2;
            const w = m.prefix[hi] - m.prefix[lo];
            const w_child = if (k < mid)
                m.prefix[mid] - m.prefix[lo]
            else
                m.prefix[hi] - m.prefix[mid];
            // ceil(records * w_child / w) <= records: w_child <= w, and w >= 1.
            records = @intCast((@as(u256, records) * w_child + w - 1) / w);
            if (k < mid) hi = mid else lo = mid;
        }
        assert(records <= n);
        return records;
    }

    /// T_k: the most steps of `global` records whose records of source `k`
    /// never exceed `length`, the steps of each of its cycles after the first
    /// (see the file comment); 0 when a single step may exceed it. Capped at
    /// 2^64 - 1 (a cycle longer than any run).
    pub fn stepsPerCycle(m: *const Mixture, k: usize, length: u64, global: u64) u64 {
        assert(global >= 1);
        if (m.windowMax(k, global) > length) return 0;
        // windowMax(k, n) >= n * w_k / W, so T*global*w_k/W <= length bounds T.
        const w_k = m.prefix[k + 1] - m.prefix[k];
        const total = m.prefix[m.count];
        var low: u128 = 1; // fits
        var high: u128 = @as(u128, length) * total / (@as(u128, global) * w_k) + 2; // does not fit
        while (high - low > 1) {
            const middle = low + (high - low) / 2;
            if (m.windowMax(k, middle * global) <= length) low = middle else high = middle;
        }
        assert(m.windowMax(k, low * global) <= length);
        return @intCast(@min(low, std.math.maxInt(u64)));
    }

    /// The most steps of `global` records from mixed position `first` whose
    /// records of source `k` fit in `room`: the actual counts, not a bound
    /// (exponential, then binary search; O(log(steps) * log K)).
    pub fn stepsFitting(m: *const Mixture, k: usize, room: u64, first: u128, global: u64) u128 {
        assert(global >= 1);
        const before = m.countOf(k, first);
        var low: u128 = 0; // fits
        var high: u128 = 1; // does not fit, once the doubling stops
        while (m.fits(k, first, before, high, global, room)) {
            low = high;
            high *= 2;
        }
        while (high - low > 1) {
            const middle = low + (high - low) / 2;
            if (m.fits(k, first, before, middle, global, room)) low = middle else high = middle;
        }
        assert(low == 0 or m.fits(k, first, before, low, global, room));
        return low;
    }

    /// Whether source `k`'s records in `steps` steps of `global` records from
    /// mixed position `first` (with `before` records of it before) fit in `room`.
    fn fits(
        m: *const Mixture,
        k: usize,
        first: u128,
        before: u128,
        steps: u128,
        global: u64,
        room: u64,
    ) bool {
        // Past 2^128 records, source k holds far more than any room (w_k / W >= 2^-40).
        const span = std.math.mul(u128, steps, global) catch return false;
        const end = std.math.add(u128, first, span) catch return false;
        return m.countOf(k, end) - before <= room;
    }

    /// Source `k`'s cursor at mixed position `first` with its `steps_left`
    /// known: unchanged when known, else as many steps as the rest of its
    /// cycle holds, or, when not one step fits, the next cycle from offset 0.
    /// Needs `stepsPerCycle(k, length, global) >= 1`.
    pub fn normalize(
        m: *const Mixture,
        k: usize,
        length: u64,
        global: u64,
        first: u128,
        cursor: Cursor,
    ) Cursor {
        if (cursor.steps_left != 0) return cursor;
        const u64_max = std.math.maxInt(u64);
        const rest = m.stepsFitting(k, length -| cursor.offset, first, global);
        if (rest > 0) {
            const steps_left: u64 = @intCast(@min(rest, u64_max));
            return .{ .cycle = cursor.cycle, .offset = cursor.offset, .steps_left = steps_left };
        }
        const whole = m.stepsFitting(k, length, first, global);
        assert(whole >= 1);
        const steps_left: u64 = @intCast(@min(whole, u64_max));
        return .{ .cycle = cursor.cycle +| 1, .offset = 0, .steps_left = steps_left };
    }

    /// Whether the known `steps_left` of `cursor` at mixed position `first`
    /// fit the rest of its cycle (a state from elsewhere may not).
    pub fn cursorFits(
        m: *const Mixture,
        k: usize,
        length: u64,
        global: u64,
        first: u128,
        cursor: Cursor,
    ) bool {
        if (cursor.offset > length) return false;
        if (cursor.steps_left == 0) return true;
        return m.stepsFitting(k, length - cursor.offset, first, global) >= cursor.steps_left;
    }

    /// Source `k`'s place at `step`, for a run whose step `base.step` starts at
    /// mixed position `base.position` with source k at `base_cursor`
    /// (normalized: `steps_left >= 1`), cycles of `steps_per_cycle` steps after
    /// the base's, and `global` records per step. O(log K).
    pub fn cursorAt(
        m: *const Mixture,
        k: usize,
        global: u64,
        steps_per_cycle: u64,
        base: Base,
        base_cursor: Cursor,
        step: u64,
    ) Place {
        assert(step >= base.step);
        assert(base_cursor.steps_left >= 1);
        assert(steps_per_cycle >= 1);
        const steps = step - base.step;
        const first = base.position + @as(u128, steps) * global;
        if (steps < base_cursor.steps_left) {
            const taken = m.countOf(k, first) - m.countOf(k, base.position);
            assert(base_cursor.steps_left - steps >= 1);
            return .{
                .cycle = base_cursor.cycle,
                .offset = @as(u128, base_cursor.offset) + taken,
                .steps_left = base_cursor.steps_left - steps,
            };
        }
        const later = steps - base_cursor.steps_left;
        const cycles = later / steps_per_cycle;
        const whole_cycles: u128 = @as(u128, cycles) * steps_per_cycle;
        const steps_before = base_cursor.steps_left + whole_cycles;
        const cycle_start = base.position + steps_before * global;
        assert(cycle_start <= first);
        return .{
            .cycle = @as(u128, base_cursor.cycle) + 1 + cycles,
            .offset = m.countOf(k, first) - m.countOf(k, cycle_start),
            .steps_left = steps_per_cycle - later % steps_per_cycle,
        };
    }
};

/// lx_cursor_t: where one source of a CYCLIC mixture takes its next records
/// (see the file comment).
pub const Cursor = extern struct {
    /// The cycle (the permutation of the source) its next records come from.
    cycle: u64 = 0,
    /// Records of that cycle already served: the next one is at this offset.
    offset: u64 = 0,
    /// Steps, this one included, that still take their records from `cycle`;
    /// 0: not known yet (a fresh start, or a state saved under another global
    /// batch): as many as the rest of the cycle holds.
    steps_left: u64 = 0,

    comptime {
        assert(@sizeOf(Cursor) == 24);
    }
};

/// A run's base: its first step and that step's mixed position.
pub const Base = struct {
    step: u64,
    position: u128,
};

/// A source's place at a step, with a wide cycle and offset (a cursor's
/// fields cannot overflow however far the step).
pub const Place = struct {
    cycle: u128,
    offset: u128,
    steps_left: u64,

    /// The position of the place's next record in the source's own CYCLIC
    /// sequence (cycle * length + offset; see sampler.zig).
    pub fn position(place: Place, length: u64) sampler.Position {
        return @as(sampler.Position, place.cycle) * length + place.offset;
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
        assert(slot < global); // a permutation of the step's slots
        var k: usize = 0;
        while (ends[k] <= slot) k += 1;
        assert(k < m.count);
        const start = if (k == 0) 0 else ends[k - 1];
        o.* = .{ .source = @intCast(k), .position = before[k] + (slot - start) };
        // Each source's records of the step are its next ones, in order.
        assert(o.position < after[k]);
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

test "windowMax bounds every window and is reached" {
    const weight_sets = [_][]const u64{
        &.{ 5, 3, 2 }, &.{ 1, 1 }, &.{ 7, 1, 1, 1, 3 }, &.{ 1, 999 },
    };
    for (weight_sets) |weights| {
        const m = Mixture.init(weights);
        for ([_]u128{ 1, 7, 16, 100 }) |window| {
            for (0..m.count) |k| {
                const bound = m.windowMax(k, window);
                var most: u128 = 0;
                var n: u128 = 0;
                while (n < 3000) : (n += 1) {
                    most = @max(most, m.countOf(k, n + window) - m.countOf(k, n));
                }
                try testing.expect(most <= bound);
                // Off by at most a record per tree level.
                try testing.expect(bound - most <= 3);
            }
        }
    }
}

test "countOf agrees with cumulative" {
    const m = Mixture.init(&.{ 4, 1, 3, 2, 9 });
    var counts: [5]u128 = undefined;
    var n: u128 = 0;
    while (n < 5000) : (n += 13) {
        m.cumulative(n, &counts);
        for (counts, 0..) |c, k| try testing.expectEqual(c, m.countOf(k, n));
    }
}

test "stepsPerCycle is the most steps whose records always fit" {
    const m = Mixture.init(&.{ 5, 3, 2 });
    for ([_]u64{ 16, 24, 100 }) |global| {
        for (0..3) |k| {
            for ([_]u64{ 40, 53, 1000, 1 << 40 }) |length| {
                const steps = m.stepsPerCycle(k, length, global);
                if (steps == 0) {
                    try testing.expect(m.windowMax(k, global) > length);
                    continue;
                }
                try testing.expect(m.windowMax(k, @as(u128, steps) * global) <= length);
                try testing.expect(m.windowMax(k, @as(u128, steps + 1) * global) > length);
            }
        }
    }
}

/// Source k's cursor stepped one step at a time from `base_cursor` (the
/// definition `cursorAt` computes in closed form), checking that no step's
/// records run past the cycle.
fn replayCursor(
    m: *const Mixture,
    k: usize,
    length: u64,
    global: u64,
    steps_per_cycle: u64,
    base: Base,
    base_cursor: Cursor,
    steps: u64,
) !Place {
    var place: Place = .{
        .cycle = base_cursor.cycle,
        .offset = base_cursor.offset,
        .steps_left = base_cursor.steps_left,
    };
    for (0..steps) |i| {
        const first = base.position + @as(u128, i) * global;
        const count = m.countOf(k, first + global) - m.countOf(k, first);
        try testing.expect(place.offset + count <= length);
        place.offset += count;
        place.steps_left -= 1;
        if (place.steps_left == 0) {
            place = .{ .cycle = place.cycle + 1, .offset = 0, .steps_left = steps_per_cycle };
        }
    }
    return place;
}

test "cursorAt is the step-by-step schedule in closed form, and never overflows a cycle" {
    const m = Mixture.init(&.{ 5, 3, 2 });
    const lengths = [_]u64{ 53, 37, 23 };
    const global = 16;
    for (0..3) |k| {
        const steps_per_cycle = m.stepsPerCycle(k, lengths[k], global);
        try testing.expect(steps_per_cycle >= 1);
        // A fresh run, and a base mid-run with an unknown (0) steps_left.
        const bases = [_]Base{
            .{ .step = 0, .position = 0 },
            .{ .step = 40, .position = 40 * global + 3 },
        };
        const starts = [_]Cursor{ .{}, .{ .cycle = 6, .offset = 11 } };
        for (bases, starts) |base, start| {
            const base_cursor = m.normalize(k, lengths[k], global, base.position, start);
            try testing.expect(base_cursor.steps_left >= 1);
            for (0..300) |i| {
                const length = lengths[k];
                const per_cycle = steps_per_cycle;
                const want =
                    try replayCursor(&m, k, length, global, per_cycle, base, base_cursor, i);
                const got = m.cursorAt(k, global, per_cycle, base, base_cursor, base.step + i);
                try testing.expectEqual(want, got);
            }
        }
    }
}

test "normalize fits as many steps as the rest of the cycle holds, else starts the next" {
    const m = Mixture.init(&.{ 1, 1 });
    // 8 records of each source per step of 16.
    const fitted = m.normalize(0, 100, 16, 0, .{ .cycle = 2, .offset = 70 });
    try testing.expectEqual(Cursor{ .cycle = 2, .offset = 70, .steps_left = 3 }, fitted);
    const next = m.normalize(0, 100, 16, 0, .{ .cycle = 2, .offset = 95 });
    try testing.expectEqual(Cursor{ .cycle = 3, .offset = 0, .steps_left = 12 }, next);
    const known: Cursor = .{ .cycle = 2, .offset = 70, .steps_left = 1 };
    try testing.expectEqual(known, m.normalize(0, 100, 16, 0, known));
    try testing.expect(m.cursorFits(0, 100, 16, 0, known));
    const too_long: Cursor = .{ .cycle = 2, .offset = 70, .steps_left = 4 };
    try testing.expect(!m.cursorFits(0, 100, 16, 0, too_long));
    try testing.expect(!m.cursorFits(0, 100, 16, 0, .{ .offset = 101 }));
}
