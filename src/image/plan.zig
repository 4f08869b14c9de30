//! An image pipeline as the library runs it: its ops (plain data that
//! Python's `loaderx.image.Pipeline` lowers to `Spec`), and what they make of
//! one record (`Plan`): the box of the source image that becomes the output,
//! the output's size, and whether it is mirrored.
//!
//! Every op here is an axis-aligned crop, a scale or a mirror, so a chain of
//! them composes into one affine map from output pixels to source pixels
//! (per axis: src = a + b * x, with b < 0 once mirrored). The stage then
//! resamples the source once through that map, which is what running the
//! ops one after another computes, without the intermediate images. Each
//! op keeps torchvision's integer canvas sizes and rounding (v2
//! `Resize`, `CenterCrop`, `RandomResizedCrop`), so the boxes are theirs.
//!
//! Randomness is counter-based: draw `d` of op `i` for the record at global
//! position `position` of step `step` is a pure function of (seed, step,
//! position, i, d). So an augmentation does not depend on the thread that
//! ran it, the ranks sharing the step, the prefetch depth or a restart.
const std = @import("std");
const assert = std.debug.assert;

pub const ops_max: usize = 16;
/// The largest output side (and crop or resize target).
pub const side_max: u32 = 1 << 14;

pub const OpKind = enum(u32) {
    /// Scale the canvas: the shorter side to `height` (width == 0), or to
    /// exactly (height, width).
    resize = 1,
    /// The (height, width) middle of the canvas, padded with zeros where the
    /// canvas is smaller.
    center_crop = 2,
    /// torchvision's RandomResizedCrop: a random box of area fraction in
    /// [scale_min, scale_max] and log aspect in [log_ratio_min,
    /// log_ratio_max], scaled to (height, width).
    random_resized_crop = 3,
    /// Mirror left to right with probability `p`.
    horizontal_flip = 4,
};

/// lx_image_op_t.
pub const Op = extern struct {
    kind: u32,
    _reserved: u32 = 0,
    height: u32 = 0,
    width: u32 = 0,
    p: f64 = 0,
    scale_min: f64 = 0,
    scale_max: f64 = 0,
    log_ratio_min: f64 = 0,
    log_ratio_max: f64 = 0,

    comptime {
        assert(@sizeOf(Op) == 56);
        assert(@offsetOf(Op, "p") == 16);
    }
};

pub const Dtype = enum(u32) { uint8 = 0, float16 = 1, float32 = 2 };
pub const Layout = enum(u32) { hwc = 0, chw = 1 };
pub const OnError = enum(u32) { raise = 0, skip = 1 };

/// lx_image_spec_t: a whole pipeline. Output pixel value v in [0, 255]
/// becomes (v / 255 - mean[c]) / std[c] for float dtypes, v for uint8.
pub const Spec = extern struct {
    op_count: u32,
    /// 3: RGB; 1: greyscale (L = (299 R + 587 G + 114 B) / 1000).
    channels: u32,
    dtype: u32,
    layout: u32,
    /// The size every record's output has (checked against each plan).
    out_height: u32,
    out_width: u32,
    on_error: u32,
    _reserved: u32 = 0,
    mean: [4]f32,
    std: [4]f32,
    ops: [ops_max]Op,

    comptime {
        assert(@sizeOf(Spec) == 64 + ops_max * @sizeOf(Op));
    }

    pub fn outBytes(s: *const Spec) u64 {
        const size: u64 = switch (s.dtypeOf()) {
            .uint8 => 1,
            .float16 => 2,
            .float32 => 4,
        };
        return @as(u64, s.out_height) * s.out_width * s.channels * size;
    }

    pub fn dtypeOf(s: *const Spec) Dtype {
        return std.enums.fromInt(Dtype, s.dtype).?;
    }

    pub fn layoutOf(s: *const Spec) Layout {
        return std.enums.fromInt(Layout, s.layout).?;
    }
};

pub const SpecError = error{InvalidSpec};

/// Checks a spec from the caller (every field the stage trusts later).
pub fn check(s: *const Spec) SpecError!void {
    if (s.op_count > ops_max) return error.InvalidSpec;
    if (s.channels != 1 and s.channels != 3) return error.InvalidSpec;
    if (std.enums.fromInt(Dtype, s.dtype) == null) return error.InvalidSpec;
    if (std.enums.fromInt(Layout, s.layout) == null) return error.InvalidSpec;
    if (std.enums.fromInt(OnError, s.on_error) == null) return error.InvalidSpec;
    if (s.out_height == 0 or s.out_width == 0) return error.InvalidSpec;
    if (s.out_height > side_max or s.out_width > side_max) return error.InvalidSpec;
    for (s.std[0..s.channels], s.mean[0..s.channels]) |sd, m| {
        if (!(sd > 0) or !std.math.isFinite(sd) or !std.math.isFinite(m)) return error.InvalidSpec;
    }
    for (s.ops[0..s.op_count]) |op| try checkOp(op);
}

fn checkOp(op: Op) SpecError!void {
    const kind = std.enums.fromInt(OpKind, op.kind) orelse return error.InvalidSpec;
    switch (kind) {
        .resize => {
            if (op.height == 0 or op.height > side_max or op.width > side_max) {
                return error.InvalidSpec;
            }
        },
        .center_crop, .random_resized_crop => {
            if (op.height == 0 or op.width == 0) return error.InvalidSpec;
            if (op.height > side_max or op.width > side_max) return error.InvalidSpec;
            if (kind == .random_resized_crop) {
                if (!(op.scale_min > 0 and op.scale_min <= op.scale_max and op.scale_max <= 1)) {
                    return error.InvalidSpec;
                }
                if (!(op.log_ratio_min <= op.log_ratio_max)) return error.InvalidSpec;
                if (!std.math.isFinite(op.log_ratio_min) or !std.math.isFinite(op.log_ratio_max)) {
                    return error.InvalidSpec;
                }
            }
        },
        .horizontal_flip => if (!(op.p >= 0 and op.p <= 1)) return error.InvalidSpec,
    }
}

/// Who a record is, for its random draws.
pub const Key = struct {
    seed: u64,
    step: u64,
    position: u64,
};

/// Draw `draw` of op `op` for `key`: a uniform double in [0, 1). SplitMix64's
/// finaliser over the key's words, each folded in with its own odd constant,
/// so neighbouring steps and positions give unrelated draws.
pub fn uniform(key: Key, op: usize, draw: u32) f64 {
    var h = mix(key.seed ^ 0x9E3779B97F4A7C15);
    h = mix(h ^ (key.step *% 0xD1B54A32D192ED03));
    h = mix(h ^ (key.position *% 0x8CB92BA72F3D8DD7));
    h = mix(h ^ ((@as(u64, op) << 32 | draw) *% 0xA0761D6478BD642F));
    return @as(f64, @floatFromInt(h >> 11)) * (1.0 / 9007199254740992.0);
}

fn mix(x: u64) u64 {
    var z = x +% 0x9E3779B97F4A7C15;
    z = (z ^ (z >> 30)) *% 0xBF58476D1CE4E5B9;
    z = (z ^ (z >> 27)) *% 0x94D049BB133111EB;
    return z ^ (z >> 31);
}

/// What the ops make of one record: output pixel (x, y) (its centre at
/// x + 0.5) samples source point (x0 + (x + 0.5) * sx, y0 + (y + 0.5) * sy),
/// mirrored when `flip` (output x reads source column of out_width - 1 - x).
/// The box [x0, x0 + out_width * sx) x [y0, ...) may reach outside the
/// source (a centre crop larger than the image): those pixels are zero.
pub const Plan = struct {
    x0: f64,
    y0: f64,
    sx: f64,
    sy: f64,
    out_width: u32,
    out_height: u32,
    flip: bool,
};

/// One axis of the map from the canvas to the source: src = a + b * c.
const Axis = struct {
    a: f64 = 0,
    b: f64 = 1,
    size: u32,

    fn crop(axis: *Axis, start: i64, size: u32) void {
        axis.a += axis.b * @as(f64, @floatFromInt(start));
        axis.size = size;
    }

    fn scaleTo(axis: *Axis, size: u32) void {
        assert(size >= 1);
        axis.b *= @as(f64, @floatFromInt(axis.size)) / @as(f64, @floatFromInt(size));
        axis.size = size;
    }
};

pub const PlanError = error{ImageTooSmall};

/// The plan of `spec` for a source of `width` x `height` pixels.
pub fn plan(spec: *const Spec, width: u32, height: u32, key: Key) PlanError!Plan {
    assert(width >= 1 and height >= 1);
    var x: Axis = .{ .size = width };
    var y: Axis = .{ .size = height };
    for (spec.ops[0..spec.op_count], 0..) |op, i| {
        const kind = std.enums.fromInt(OpKind, op.kind).?;
        switch (kind) {
            .resize => resize(&x, &y, op),
            .center_crop => {
                x.crop(centreStart(x.size, op.width), op.width);
                y.crop(centreStart(y.size, op.height), op.height);
            },
            .random_resized_crop => try randomResizedCrop(&x, &y, op, key, i),
            .horizontal_flip => if (uniform(key, i, 0) < op.p) {
                // Canvas column c becomes size - c: src = (a + b * size) - b * c.
                x.a += x.b * @as(f64, @floatFromInt(x.size));
                x.b = -x.b;
            },
        }
    }
    const flip = x.b < 0;
    const x0 = if (flip) x.a + x.b * @as(f64, @floatFromInt(x.size)) else x.a;
    return .{
        .x0 = x0,
        .y0 = y.a,
        .sx = @abs(x.b),
        .sy = y.b,
        .out_width = x.size,
        .out_height = y.size,
        .flip = flip,
    };
}

/// torchvision v2's Resize: the shorter side to `height`, the longer scaled
/// and truncated (or both sides as given).
fn resize(x: *Axis, y: *Axis, op: Op) void {
    if (op.width != 0) {
        x.scaleTo(op.width);
        y.scaleTo(op.height);
        return;
    }
    const w = x.size;
    const h = y.size;
    const short = @min(w, h);
    const long = @max(w, h);
    const new_long: u32 = @intFromFloat(@max(1, @floor(
        @as(f64, @floatFromInt(op.height)) * @as(f64, @floatFromInt(long)) /
            @as(f64, @floatFromInt(short)),
    )));
    if (w <= h) {
        x.scaleTo(op.height);
        y.scaleTo(new_long);
    } else {
        x.scaleTo(new_long);
        y.scaleTo(op.height);
    }
}

/// torchvision's centre: round((size - crop) / 2), Python's round (half to
/// even); negative when the crop is larger (zero padding on both sides).
fn centreStart(size: u32, crop: u32) i64 {
    const diff = @as(i64, size) - @as(i64, crop);
    if (diff < 0) return -@divFloor(-diff, 2);
    return roundHalfEven(@as(f64, @floatFromInt(diff)) / 2.0);
}

fn roundHalfEven(v: f64) i64 {
    const r = @round(v);
    if (@abs(v - @trunc(v)) == 0.5) {
        const t: i64 = @intFromFloat(@trunc(v));
        return if (@mod(t, 2) == 0) t else t + @as(i64, if (v > 0) 1 else -1);
    }
    return @intFromFloat(r);
}

/// torchvision's RandomResizedCrop.get_params with this stage's draws: ten
/// tries at a box of random area and aspect that fits, then the centre crop
/// of the clamped aspect.
fn randomResizedCrop(x: *Axis, y: *Axis, op: Op, key: Key, i: usize) PlanError!void {
    const w: f64 = @floatFromInt(x.size);
    const h: f64 = @floatFromInt(y.size);
    const area = w * h;
    var draw: u32 = 0;
    for (0..10) |_| {
        const scale = op.scale_min + (op.scale_max - op.scale_min) * uniform(key, i, draw);
        const log_r = op.log_ratio_min + (op.log_ratio_max - op.log_ratio_min) *
            uniform(key, i, draw + 1);
        draw += 2;
        const aspect = @exp(log_r);
        const cw = roundHalfEven(@sqrt(area * scale * aspect));
        const ch = roundHalfEven(@sqrt(area * scale / aspect));
        if (cw > 0 and cw <= x.size and ch > 0 and ch <= y.size) {
            const top = randomStart(y.size, ch, uniform(key, i, draw));
            const left = randomStart(x.size, cw, uniform(key, i, draw + 1));
            x.crop(left, @intCast(cw));
            y.crop(top, @intCast(ch));
            x.scaleTo(op.width);
            y.scaleTo(op.height);
            return;
        }
    }
    try fallbackCrop(x, y, op);
}

/// A uniform integer in [0, size - crop].
fn randomStart(size: u32, crop: i64, u: f64) i64 {
    const span: f64 = @floatFromInt(@as(i64, size) - crop + 1);
    return @min(@as(i64, @intFromFloat(@floor(u * span))), @as(i64, size) - crop);
}

fn fallbackCrop(x: *Axis, y: *Axis, op: Op) PlanError!void {
    const w: f64 = @floatFromInt(x.size);
    const h: f64 = @floatFromInt(y.size);
    const ratio_min = @exp(op.log_ratio_min);
    const ratio_max = @exp(op.log_ratio_max);
    const in_ratio = w / h;
    var cw: i64 = x.size;
    var ch: i64 = y.size;
    if (in_ratio < ratio_min) {
        ch = roundHalfEven(w / ratio_min);
    } else if (in_ratio > ratio_max) {
        cw = roundHalfEven(h * ratio_max);
    }
    if (cw < 1 or ch < 1) return error.ImageTooSmall;
    x.crop(@divFloor(@as(i64, x.size) - cw, 2), @intCast(cw));
    y.crop(@divFloor(@as(i64, y.size) - ch, 2), @intCast(ch));
    x.scaleTo(op.width);
    y.scaleTo(op.height);
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

fn testSpec(ops: []const Op) Spec {
    var s: Spec = .{
        .op_count = @intCast(ops.len),
        .channels = 3,
        .dtype = 0,
        .layout = 0,
        .out_height = 224,
        .out_width = 224,
        .on_error = 0,
        .mean = @splat(0),
        .std = @splat(1),
        .ops = undefined,
    };
    @memcpy(s.ops[0..ops.len], ops);
    return s;
}

test "resize and centre crop are torchvision's boxes" {
    const s = testSpec(&.{
        .{ .kind = 1, .height = 256 },
        .{ .kind = 2, .height = 224, .width = 224 },
    });
    try check(&s);
    const p = try plan(&s, 500, 375, .{ .seed = 0, .step = 0, .position = 0 });
    // 375 -> 256, 500 -> int(256 * 500 / 375) = 341; crop at (16, 58).
    try testing.expectEqual(@as(u32, 224), p.out_width);
    try testing.expectEqual(@as(u32, 224), p.out_height);
    try testing.expectApproxEqAbs(375.0 / 256.0, p.sy, 1e-12);
    try testing.expectApproxEqAbs(500.0 / 341.0, p.sx, 1e-12);
    try testing.expectApproxEqAbs(16.0 * 375.0 / 256.0, p.y0, 1e-9);
    try testing.expectApproxEqAbs(58.0 * 500.0 / 341.0, p.x0, 1e-9);
    try testing.expect(!p.flip);
}

test "a random resized crop stays inside the image and depends only on its key" {
    const s = testSpec(&.{
        .{
            .kind = 3,
            .height = 224,
            .width = 224,
            .scale_min = 0.08,
            .scale_max = 1,
            .log_ratio_min = @log(3.0 / 4.0),
            .log_ratio_max = @log(4.0 / 3.0),
        },
        .{ .kind = 4, .p = 0.5 },
    });
    try check(&s);
    var flips: u32 = 0;
    for (0..2000) |pos| {
        const key: Key = .{ .seed = 3, .step = 11, .position = pos };
        const p = try plan(&s, 500, 375, key);
        try testing.expect(p.x0 >= 0 and p.y0 >= 0);
        try testing.expect(p.x0 + p.sx * 224 <= 500 + 1e-9);
        try testing.expect(p.y0 + p.sy * 224 <= 375 + 1e-9);
        const area = p.sx * 224 * p.sy * 224;
        try testing.expect(area >= 0.07 * 500 * 375 and area <= 500 * 375 + 1e-6);
        try testing.expectEqual(p, try plan(&s, 500, 375, key));
        if (p.flip) flips += 1;
    }
    try testing.expect(flips > 900 and flips < 1100);
    const a = try plan(&s, 500, 375, .{ .seed = 3, .step = 11, .position = 0 });
    const b = try plan(&s, 500, 375, .{ .seed = 3, .step = 12, .position = 0 });
    try testing.expect(a.x0 != b.x0 or a.y0 != b.y0 or a.sx != b.sx);
}

test "a flip before a crop mirrors the crop's place" {
    const s = testSpec(&.{
        .{ .kind = 4, .p = 1 },
        .{ .kind = 2, .height = 10, .width = 10 },
    });
    const p = try plan(&s, 40, 10, .{ .seed = 0, .step = 0, .position = 0 });
    try testing.expect(p.flip);
    try testing.expectApproxEqAbs(15.0, p.x0, 1e-12);
    const q = testSpec(&.{
        .{ .kind = 2, .height = 10, .width = 20 },
        .{ .kind = 4, .p = 1 },
        .{ .kind = 2, .height = 10, .width = 10 },
    });
    // Crop [10, 30), mirror, then the middle half: source [15, 25).
    const r = try plan(&q, 40, 10, .{ .seed = 0, .step = 0, .position = 0 });
    try testing.expectApproxEqAbs(15.0, r.x0, 1e-12);
}

test "a centre crop larger than the image pads on both sides" {
    const s = testSpec(&.{.{ .kind = 2, .height = 8, .width = 8 }});
    const p = try plan(&s, 5, 8, .{ .seed = 0, .step = 0, .position = 0 });
    try testing.expectApproxEqAbs(-1.0, p.x0, 1e-12);
    try testing.expectEqual(@as(u32, 8), p.out_width);
}

test "python's round: half to even" {
    try testing.expectEqual(@as(i64, 0), roundHalfEven(0.5));
    try testing.expectEqual(@as(i64, 2), roundHalfEven(1.5));
    try testing.expectEqual(@as(i64, 2), roundHalfEven(2.5));
    try testing.expectEqual(@as(i64, 3), roundHalfEven(2.6));
}

test "check refuses what the stage could not run" {
    var s = testSpec(&.{.{ .kind = 9 }});
    try testing.expectError(error.InvalidSpec, check(&s));
    s = testSpec(&.{.{ .kind = 3, .height = 4, .width = 4, .scale_min = 0.5, .scale_max = 0.2 }});
    try testing.expectError(error.InvalidSpec, check(&s));
    s = testSpec(&.{});
    s.std[1] = 0;
    try testing.expectError(error.InvalidSpec, check(&s));
}
