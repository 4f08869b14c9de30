//! The C ABI, which records a step reads: the sampler's indices, a weighted
//! mixture's bounds and cursors (pure functions, any thread), and the lanes
//! (threads) every call may use.
const std = @import("std");
const assert = std.debug.assert;
const capi = @import("../capi.zig");
const sampler = @import("../sampler.zig");
const mixture = @import("../mixture.zig");
const pool = @import("../pool.zig");

const Cursor = capi.Cursor;
const LoaderSource = capi.LoaderSource;
const invalid = capi.invalid;

/// Fills `out[0..steps * batch_size]` with the sampler's indices for the
/// `steps` steps from `step`, one batch after another (mode 0 sequential,
/// 1 iid, 2 cyclic; rank < world; see src/sampler.zig). Pure; any thread.
/// Errors: invalid (length 0, batch_size or steps 0, world 0, rank >= world,
/// bad mode, a step past 2^64 - 1, more than 2^64 - 1 indices, or CYCLIC with
/// batch_size * world > length: a batch would have to repeat an index).
pub export fn lx_sampler_fill(
    length: u64,
    batch_size: u64,
    steps: u64,
    mode: c_int,
    seed: u64,
    step: u64,
    rank: u64,
    world: u64,
    out: ?[*]u64,
) c_int {
    const o = out orelse return invalid("out is null", .{});
    const m = std.enums.fromInt(sampler.Mode, mode) orelse
        return invalid("unknown sampler mode {d}", .{mode});
    if (length == 0) return invalid("length must be >= 1", .{});
    if (batch_size == 0) return invalid("batch_size must be >= 1", .{});
    if (steps == 0) return invalid("steps must be >= 1", .{});
    if (world == 0 or rank >= world) return invalid("bad shard ({d}, {d})", .{ rank, world });
    _ = std.math.add(u64, step, steps - 1) catch
        return invalid("steps {d} from step {d} pass step 2^64 - 1", .{ steps, step });
    const count = std.math.mul(u64, batch_size, steps) catch
        return invalid("steps * batch_size overflows", .{});
    if (m == .cyclic and @as(u128, batch_size) * world > length) {
        return invalid(
            "CYCLIC needs batch_size * world <= length, got {d} * {d} > {d}",
            .{ batch_size, world, length },
        );
    }
    const indices = o[0..@intCast(count)];
    sampler.fillSteps(length, m, seed, step, rank, world, @intCast(batch_size), indices);
    return 0;
}

/// For a weighted mixture of `source_count` sources (their `length` and
/// `weight`; `seed` is not read) with `global` records per step: `out[k]` is
/// the most records of source k one step can hold (mixture.windowMax). A
/// CYCLIC loader refuses a source whose length is below it. Pure; any thread.
/// Errors: invalid (no or too many sources, a zero weight, weights adding up
/// past the bound, global 0).
pub export fn lx_mixture_step_max(
    sources: ?[*]const LoaderSource,
    source_count: u32,
    global: u64,
    out: ?[*]u64,
) c_int {
    var mix: mixture.Mixture = undefined;
    const rc = mixtureOf(sources, source_count, &mix);
    if (rc != 0) return rc;
    const o = out orelse return invalid("out is null", .{});
    if (global == 0) return invalid("global must be >= 1", .{});
    assert(source_count >= 1 and source_count <= mixture.sources_max); // mixtureOf's bounds
    for (0..source_count) |k| o[k] = @intCast(mix.windowMax(k, global));
    return 0;
}

/// The cursors at `step` of a CYCLIC mixture's sources (see
/// src/mixture.zig), for a run of `global` records per step whose step
/// `base_step` starts at mixed position `base_position` with source k at
/// `sources[k].cursor` (`steps_left` 0: as many steps as the rest of its
/// cycle holds from there, as for a fresh run or another global batch).
/// `out[k]` receives source k's cursor at `step` (`steps_left >= 1`). Pure;
/// any thread. Errors: invalid (what lx_mixture_step_max refuses; a source
/// that one step can hold more of than it has; a cursor with an offset past
/// its length or more steps left than the rest of its cycle holds; step
/// before base_step; a cycle past 2^64 - 1).
pub export fn lx_mixture_cursors(
    sources: ?[*]const LoaderSource,
    source_count: u32,
    global: u64,
    base_step: u64,
    base_position: u64,
    step: u64,
    out: ?[*]Cursor,
) c_int {
    var mix: mixture.Mixture = undefined;
    const rc = mixtureOf(sources, source_count, &mix);
    if (rc != 0) return rc;
    const o = out orelse return invalid("out is null", .{});
    if (global == 0) return invalid("global must be >= 1", .{});
    if (step < base_step) {
        return invalid("step {d} is before the base step {d}", .{ step, base_step });
    }
    const s = sources.?[0..source_count];
    for (s, 0..) |source, k| {
        const steps_per_cycle = mix.stepsPerCycle(k, source.length, global);
        if (steps_per_cycle == 0) {
            return invalid(
                "source {d} has {d} records, but one step of {d} can take up to {d} of them",
                .{ k, source.length, global, mix.windowMax(k, global) },
            );
        }
        if (!mix.cursorFits(k, source.length, global, base_position, source.cursor)) {
            return invalid(
                "source {d}: cursor (cycle {d}, offset {d}, steps_left {d}) " ++
                    "does not fit its {d} records",
                .{
                    k,                        source.cursor.cycle, source.cursor.offset,
                    source.cursor.steps_left, source.length,
                },
            );
        }
        const base_cursor = mix.normalize(k, source.length, global, base_position, source.cursor);
        const base: mixture.Base = .{ .step = base_step, .position = base_position };
        const place = mix.cursorAt(k, global, steps_per_cycle, base, base_cursor, step);
        o[k] = .{
            .cycle = std.math.cast(u64, place.cycle) orelse
                return invalid("source {d}: cycle {d} past 2^64 - 1", .{ k, place.cycle }),
            .offset = @intCast(place.offset),
            .steps_left = place.steps_left,
        };
    }
    return 0;
}

/// The mixture of `sources`' weights into `out`, or an error code.
fn mixtureOf(sources: ?[*]const LoaderSource, source_count: u32, out: *mixture.Mixture) c_int {
    const s = sources orelse return invalid("sources is null", .{});
    if (source_count == 0 or source_count > mixture.sources_max) {
        return invalid(
            "a mixture takes 1 to {d} sources, got {d}",
            .{ mixture.sources_max, source_count },
        );
    }
    var weights: [mixture.sources_max]u64 = undefined;
    var total: u64 = 0;
    for (s[0..source_count], 0..) |source, k| {
        if (source.weight == 0) return invalid("source {d} has weight 0", .{k});
        if (source.length == 0) return invalid("source {d} is empty", .{k});
        total = std.math.add(u64, total, source.weight) catch
            return invalid("weights overflow", .{});
        weights[k] = source.weight;
    }
    if (total > mixture.weight_total_max) {
        return invalid("weights add up to more than {d}", .{mixture.weight_total_max});
    }
    out.* = mixture.Mixture.init(weights[0..source_count]);
    return 0;
}

/// Lanes (threads, the caller included) one call may use: the cores this
/// process may run on (sched_getaffinity where the platform has it, counted
/// when the library starts and again in a forked child; at most 64), capped
/// by lx_set_lanes. The one core count of the package: Python's default
/// loader and converter worker counts come from it.
pub export fn lx_lanes() u32 {
    return @intCast(pool.lanes());
}

/// Caps the lanes of every later call (0 removes the cap).
pub export fn lx_set_lanes(n: u32) void {
    pool.setLaneLimit(n);
}
