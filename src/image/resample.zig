//! Resampling a box of a source image straight into one output slot of a
//! batch: the separable triangle filter torchvision and Pillow use for
//! bilinear resizing with antialiasing (its support widens with the
//! downscale factor), computed in f32 with one 4-lane vector per pixel.
//!
//! Rows stream in from the decoder in order. Each is resized horizontally
//! into a small ring of rows as it arrives, and an output row is finished as
//! soon as the last source row under its vertical filter is in, so the
//! stage never holds the decoded image: its memory is one source row plus
//! `ring_rows` output-wide rows. The mirror and the conversion to the output
//! dtype, layout and normalisation are folded into the final write.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const plan_mod = @import("plan.zig");

pub const V = @Vector(4, f32);

/// Where output pixel i reads along one axis: source pixels start[i] ..
/// start[i] + count[i] with weights[i * taps_max ..]; count 0: a zero pixel
/// (outside the source).
pub const Taps = struct {
    start: []u32 = &.{},
    count: []u32 = &.{},
    weights: []f32 = &.{},
    taps_max: u32 = 0,
};

/// The largest downscale factor resampled (the decoder's DCT scaling takes
/// JPEGs most of the way first; the stage refuses more, see stage.planFor).
pub const scale_max: f64 = 1024;
/// The bilinear filter's support grows with the downscale: at most this many
/// taps a pixel.
pub const taps_limit: u32 = 2 * @as(u32, @intFromFloat(scale_max)) + 1;

/// Computes `t` for `out` pixels from source coordinate `x0` at `scale`
/// source pixels per output pixel, reading only source pixels in [lo, hi).
pub fn computeTaps(
    gpa: Allocator,
    t: *Taps,
    out: u32,
    x0: f64,
    scale: f64,
    lo: u32,
    hi: u32,
) Allocator.Error!void {
    assert(scale > 0 and scale <= scale_max);
    assert(lo <= hi);
    const filter_scale = @max(scale, 1.0);
    const support = filter_scale;
    const taps_max: u32 = @intFromFloat(@ceil(support) * 2 + 1);
    assert(taps_max <= taps_limit);
    try ensure(u32, gpa, &t.start, out);
    try ensure(u32, gpa, &t.count, out);
    try ensure(f32, gpa, &t.weights, @as(usize, out) * taps_max);
    t.taps_max = taps_max;
    const inv = 1.0 / filter_scale;
    for (0..out) |i| {
        const centre = x0 + (@as(f64, @floatFromInt(i)) + 0.5) * scale;
        const lo_f: f64 = @floatFromInt(lo);
        const hi_f: f64 = @floatFromInt(hi);
        if (centre < lo_f or centre >= hi_f) {
            t.start[i] = lo;
            t.count[i] = 0;
            continue;
        }
        const first: u32 = @intFromFloat(@max(lo_f, @floor(centre - support + 0.5)));
        const end: u32 = @intFromFloat(@min(hi_f, @floor(centre + support + 0.5)));
        assert(end > first and end - first <= taps_max);
        const w = t.weights[i * taps_max ..][0..taps_max];
        var total: f64 = 0;
        for (first..end, 0..) |s, k| {
            const d = (@as(f64, @floatFromInt(s)) + 0.5 - centre) * inv;
            const v = @max(0.0, 1.0 - @abs(d));
            w[k] = @floatCast(v);
            total += v;
        }
        var n = end - first;
        if (total > 0) {
            for (w[0..n]) |*x| x.* = @floatCast(x.* / total);
        } else {
            @memset(w[0..n], 0);
            w[0] = 1;
        }
        // Taps of weight 0 at either end (a pixel exactly a support away).
        var lead: u32 = 0;
        while (n > 1 and w[lead] == 0) : (n -= 1) lead += 1;
        while (n > 1 and w[lead + n - 1] == 0) n -= 1;
        if (lead > 0) std.mem.copyForwards(f32, w[0..n], w[lead..][0..n]);
        t.start[i] = first + lead;
        t.count[i] = n;
    }
}

fn ensure(comptime T: type, gpa: Allocator, buf: *[]T, len: usize) Allocator.Error!void {
    if (buf.len >= len) return;
    gpa.free(buf.*);
    buf.* = &.{};
    buf.* = try gpa.alloc(T, len);
}

/// The output slot and how values are written into it.
pub const Writer = struct {
    base: [*]u8,
    width: u32,
    height: u32,
    channels: u32,
    dtype: plan_mod.Dtype,
    layout: plan_mod.Layout,
    flip: bool,
    /// Float outputs: value * scale + bias (per channel).
    scale: V = @splat(1),
    bias: V = @splat(0),

    pub fn init(spec: *const plan_mod.Spec, base: [*]u8, flip: bool) Writer {
        var w: Writer = .{
            .base = base,
            .width = spec.out_width,
            .height = spec.out_height,
            .channels = spec.channels,
            .dtype = spec.dtypeOf(),
            .layout = spec.layoutOf(),
            .flip = flip,
        };
        var scale: [4]f32 = @splat(1);
        var bias: [4]f32 = @splat(0);
        for (0..spec.channels) |c| {
            scale[c] = 1.0 / (255.0 * spec.std[c]);
            bias[c] = -spec.mean[c] / spec.std[c];
        }
        w.scale = scale;
        w.bias = bias;
        return w;
    }

    pub fn row(w: *const Writer, y: u32, values: []const V) void {
        assert(values.len == w.width);
        assert(y < w.height);
        switch (w.dtype) {
            .uint8 => w.rowOf(u8, y, values),
            .float16 => w.rowOf(f16, y, values),
            .float32 => w.rowOf(f32, y, values),
        }
    }

    fn rowOf(w: *const Writer, comptime T: type, y: u32, values: []const V) void {
        const hwc = w.layout == .hwc;
        switch (w.channels) {
            1 => if (hwc) w.rowIn(T, true, 1, y, values) else w.rowIn(T, false, 1, y, values),
            3 => if (hwc) w.rowIn(T, true, 3, y, values) else w.rowIn(T, false, 3, y, values),
            else => unreachable, // Spec.channels is checked to be 1 or 3
        }
    }

    /// One output row, specialised by dtype, layout and channels; output
    /// pixel x goes to column x, or width - 1 - x when mirrored.
    fn rowIn(
        w: *const Writer,
        comptime T: type,
        comptime hwc: bool,
        comptime C: usize,
        y: u32,
        values: []const V,
    ) void {
        const out: [*]T = @ptrCast(@alignCast(w.base));
        const W: usize = w.width;
        const plane: usize = W * w.height;
        const first: usize = @as(usize, y) * W;
        for (values, 0..) |v, x| {
            const xo = first + (if (w.flip) W - 1 - x else x);
            const px: [4]T = convert(T, w, v);
            inline for (0..C) |c| {
                if (hwc) out[xo * C + c] = px[c] else out[c * plane + xo] = px[c];
            }
        }
    }

    inline fn convert(comptime T: type, w: *const Writer, v: V) [4]T {
        if (T == u8) {
            // Clamped to [0, 255] first, so truncating v + 0.5 rounds (half up):
            // SSE2's cvttps2dq, where a vector @round needs SSE4.1.
            const c = @min(@as(V, @splat(255)), @max(@as(V, @splat(0)), v)) + @as(V, @splat(0.5));
            return @as(@Vector(4, u8), @intFromFloat(c));
        }
        const f = v * w.scale + w.bias;
        return @as(@Vector(4, T), @floatCast(f));
    }

    /// Zero pixels (outside the source): value 0 converted like any other.
    pub fn zeros(w: *const Writer, y: u32, tmp: []V) void {
        @memset(tmp, @splat(0));
        w.row(y, tmp);
    }
};

/// Per-thread buffers, grown as needed and kept between images.
pub const Scratch = struct {
    xt: Taps = .{},
    yt: Taps = .{},
    /// The last `ring_rows` source rows, as decoded (u8).
    ring: []u8 = &.{},
    /// One output row's vertical sums over the box's columns (f32, C a pixel).
    vline: []f32 = &.{},
    /// One output row, a V a pixel.
    line: []V = &.{},

    pub fn deinit(s: *Scratch, gpa: Allocator) void {
        inline for (.{ &s.xt, &s.yt }) |t| {
            gpa.free(t.start);
            gpa.free(t.count);
            gpa.free(t.weights);
        }
        gpa.free(s.ring);
        gpa.free(s.vline);
        gpa.free(s.line);
        s.* = .{};
    }
};

/// One image's resampling. Source rows [row_lo, row_hi) arrive in order,
/// each written into `next()` (so a decoder writes straight into the ring)
/// and handed over by `commit()`: `row_pixels` pixels of `channels` bytes,
/// of which the box's columns [col_lo, col_hi) start at pixel `row_skip`.
/// An output row is made once its last source row is in: first the
/// vertical filter over the box's columns (contiguous, in vectors), then
/// the horizontal one (only out_height rows of it, not every source row).
pub const Resampler = struct {
    s: *Scratch,
    writer: Writer,
    channels: u32,
    col_lo: u32,
    cols: u32,
    row_lo: u32,
    ring_rows: u32,
    row_bytes: usize,
    row_skip: usize,
    /// Source rows committed so far (the next one is row_lo + pushed).
    pushed: u32 = 0,
    next_out: u32 = 0,

    pub const Box = struct {
        /// Source columns [col_lo, col_hi) and rows [row_lo, row_hi) that
        /// will be pushed (the part of the source the plan reads).
        col_lo: u32,
        col_hi: u32,
        row_lo: u32,
        row_hi: u32,
    };

    pub fn init(
        gpa: Allocator,
        s: *Scratch,
        p: plan_mod.Plan,
        box: Box,
        row_pixels: u32,
        row_skip: u32,
        writer: Writer,
    ) Allocator.Error!Resampler {
        assert(p.out_width == writer.width and p.out_height == writer.height);
        assert(box.col_lo <= box.col_hi and box.row_lo <= box.row_hi);
        assert(row_skip + (box.col_hi - box.col_lo) <= row_pixels);
        try computeTaps(gpa, &s.xt, p.out_width, p.x0, p.sx, box.col_lo, box.col_hi);
        try computeTaps(gpa, &s.yt, p.out_height, p.y0, p.sy, box.row_lo, box.row_hi);
        const ring_rows = s.yt.taps_max + 1;
        const C: usize = writer.channels;
        const row_bytes = @as(usize, row_pixels) * C;
        try ensure(u8, gpa, &s.ring, ring_rows * @max(1, row_bytes));
        // One float more than the box: a pixel is read as 4 floats.
        try ensure(f32, gpa, &s.vline, (box.col_hi - box.col_lo) * C + 1);
        try ensure(V, gpa, &s.line, p.out_width);
        return .{
            .s = s,
            .writer = writer,
            .channels = writer.channels,
            .col_lo = box.col_lo,
            .cols = box.col_hi - box.col_lo,
            .row_lo = box.row_lo,
            .ring_rows = ring_rows,
            .row_bytes = row_bytes,
            .row_skip = row_skip,
        };
    }

    /// Where the next source row goes (row_pixels * channels bytes).
    pub fn next(r: *Resampler) []u8 {
        return r.s.ring[(r.pushed % r.ring_rows) * r.row_bytes ..][0..r.row_bytes];
    }

    /// The row written into `next()` is complete.
    pub fn commit(r: *Resampler) void {
        r.pushed += 1;
        r.emitReady();
    }

    /// A source row copied in (`row_pixels` pixels).
    pub fn push(r: *Resampler, src: []const u8) void {
        @memcpy(r.next(), src);
        r.commit();
    }

    /// Writes the rows still due; every source row must have been pushed.
    pub fn finish(r: *Resampler) void {
        r.emitReady();
        // Each output row reads pushed rows only, so all are written now.
        assert(r.next_out == r.writer.height);
    }

    fn emitReady(r: *Resampler) void {
        const yt = &r.s.yt;
        const have = r.row_lo + r.pushed;
        while (r.next_out < r.writer.height) : (r.next_out += 1) {
            const j = r.next_out;
            const n = yt.count[j];
            if (n == 0) {
                // A row outside the source needs no rows: zeros, in order.
                r.writer.zeros(j, r.s.line[0..r.writer.width]);
                continue;
            }
            if (yt.start[j] + n > have) return;
            // Rows in the ring: the filter's rows arrived within ring_rows.
            assert(have - yt.start[j] <= r.ring_rows);
            r.row(j);
        }
    }

    fn row(r: *Resampler, j: u32) void {
        const yt = &r.s.yt;
        const C: usize = r.channels;
        const width = @as(usize, r.cols) * C;
        const w = yt.weights[@as(usize, j) * yt.taps_max ..][0..yt.count[j]];
        const vline = r.s.vline[0..width];
        for (w, 0..) |weight, k| {
            const src_row = yt.start[j] + @as(u32, @intCast(k)) - r.row_lo;
            const ring = r.s.ring[(src_row % r.ring_rows) * r.row_bytes ..];
            const src = ring[r.row_skip * C ..][0..width];
            if (k == 0) scaleRow(vline, src, weight) else addRow(vline, src, weight);
        }
        r.s.vline[width] = 0;
        const line = r.s.line[0..r.writer.width];
        switch (r.channels) {
            1 => horizontal(1, &r.s.xt, r.col_lo, r.s.vline, line),
            3 => horizontal(3, &r.s.xt, r.col_lo, r.s.vline, line),
            else => unreachable, // Spec.channels is checked to be 1 or 3
        }
        r.writer.row(j, line);
    }
};

const lanes = 16;
const Bytes = @Vector(lanes, u8);
const Floats = @Vector(lanes, f32);

/// acc = w * src, element by element.
fn scaleRow(acc: []f32, src: []const u8, w: f32) void {
    assert(acc.len == src.len);
    const wv: Floats = @splat(w);
    var i: usize = 0;
    while (i + lanes <= acc.len) : (i += lanes) {
        const b: Bytes = src[i..][0..lanes].*;
        acc[i..][0..lanes].* = @as(Floats, @floatFromInt(b)) * wv;
    }
    while (i < acc.len) : (i += 1) acc[i] = @as(f32, @floatFromInt(src[i])) * w;
}

/// acc += w * src, element by element.
fn addRow(acc: []f32, src: []const u8, w: f32) void {
    assert(acc.len == src.len);
    const wv: Floats = @splat(w);
    var i: usize = 0;
    while (i + lanes <= acc.len) : (i += lanes) {
        const b: Bytes = src[i..][0..lanes].*;
        const a: Floats = acc[i..][0..lanes].*;
        acc[i..][0..lanes].* = a + @as(Floats, @floatFromInt(b)) * wv;
    }
    while (i < acc.len) : (i += 1) acc[i] += @as(f32, @floatFromInt(src[i])) * w;
}

/// One row of vertical sums (C floats a pixel, one float of padding after
/// the last) through the horizontal filter into `dst`, a V a pixel. Two
/// accumulators: a pixel's taps are a dependent chain of adds otherwise.
fn horizontal(comptime C: usize, t: *const Taps, col_lo: u32, vline: []const f32, dst: []V) void {
    for (dst, 0..) |*out, i| {
        const n = t.count[i];
        const w = t.weights[i * t.taps_max ..][0..n];
        const first = (t.start[i] - col_lo) * C;
        var even: V = @splat(0);
        var odd: V = @splat(0);
        var k: usize = 0;
        while (k + 1 < n) : (k += 2) {
            even += pixelAt(C, vline, first + k * C) * @as(V, @splat(w[k]));
            odd += pixelAt(C, vline, first + (k + 1) * C) * @as(V, @splat(w[k + 1]));
        }
        if (k < n) even += pixelAt(C, vline, first + k * C) * @as(V, @splat(w[k]));
        out.* = even + odd;
    }
}

inline fn pixelAt(comptime C: usize, vline: []const f32, at: usize) V {
    if (C == 1) return .{ vline[at], 0, 0, 0 };
    // Lane 3 is the next pixel's red (or the padding): the writer uses C lanes.
    return vline[at..][0..4].*;
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

test "taps are a normalised triangle, widened on downscale" {
    var t: Taps = .{};
    defer {
        testing.allocator.free(t.start);
        testing.allocator.free(t.count);
        testing.allocator.free(t.weights);
    }
    try computeTaps(testing.allocator, &t, 4, 0, 2.0, 0, 8);
    // Output 0 centres at 1.0: support 2 covers pixels 0..2 (centres 0.5, 1.5, 2.5).
    try testing.expectEqual(@as(u32, 0), t.start[0]);
    try testing.expectEqual(@as(u32, 3), t.count[0]);
    var sum: f32 = 0;
    for (t.weights[0..3]) |w| sum += w;
    try testing.expectApproxEqAbs(@as(f32, 1), sum, 1e-6);
    try testing.expectApproxEqAbs(t.weights[0], t.weights[1], 1e-6);
    // Identity scale: one tap of weight 1 on the pixel itself.
    try computeTaps(testing.allocator, &t, 4, 0, 1.0, 0, 4);
    for (0..4) |i| {
        try testing.expectEqual(@as(u32, @intCast(i)), t.start[i]);
        try testing.expectApproxEqAbs(@as(f32, 1), t.weights[i * t.taps_max], 1e-6);
    }
}

test "an identity plan copies the pixels, mirrored when asked" {
    var spec: plan_mod.Spec = std.mem.zeroes(plan_mod.Spec);
    spec.channels = 3;
    spec.out_width = 3;
    spec.out_height = 2;
    spec.std = @splat(1);
    const src = [_]u8{ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18 };
    var out: [18]u8 = undefined;
    var s: Scratch = .{};
    defer s.deinit(testing.allocator);
    for ([_]bool{ false, true }) |flip| {
        const p: plan_mod.Plan = .{
            .x0 = 0,
            .y0 = 0,
            .sx = 1,
            .sy = 1,
            .out_width = 3,
            .out_height = 2,
            .flip = flip,
        };
        var r = try Resampler.init(
            testing.allocator,
            &s,
            p,
            .{ .col_lo = 0, .col_hi = 3, .row_lo = 0, .row_hi = 2 },
            3,
            0,
            Writer.init(&spec, &out, flip),
        );
        r.push(src[0..9]);
        r.push(src[9..18]);
        r.finish();
        if (!flip) try testing.expectEqualSlices(u8, &src, &out);
        if (flip) try testing.expectEqualSlices(u8, &.{ 7, 8, 9, 4, 5, 6, 1, 2, 3 }, out[0..9]);
    }
}
