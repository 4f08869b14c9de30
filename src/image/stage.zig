//! The image stage: records (encoded JPEG or PNG bytes, or raw pixels) through
//! a pipeline, each straight into its slot of the batch, across lanes.
//!
//! One record is one fused pass: read the header, plan the ops (plan.zig),
//! pick libjpeg's DCT scale so the decoder produces no more pixels than the
//! output needs (a crop of 600 pixels resized to 224 decodes at 3/8), decode
//! only the planned box (columns cropped by libjpeg, rows above skipped and
//! rows below never decoded), and resample each row as it arrives into the
//! slot (resample.zig), mirror and normalisation folded into the write.
//!
//! Memory per lane (`Scratch`), bounded by the image's width and the output:
//! one decoded row (4 bytes a pixel of the box), `taps + 1` rows of the
//! output width (16 bytes a pixel), the filter taps; libjpeg's own state
//! (at most jpeg.memory_max for a progressive file's coefficients); for PNG
//! the 64 KiB inflate window and two scanlines, or the whole image at 3
//! bytes a pixel when it is interlaced (png.interlaced_pixels_max).
//!
//! Errors: a record that is not an image, or a damaged one, fails with a
//! message naming what is wrong; the batch reports its first failing record
//! (the lowest position: the same whatever the lanes did). With
//! `on_error = skip` a failed record is replaced by the next record of the
//! batch that succeeds, augmented with the failed record's own draws.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const plan_mod = @import("plan.zig");
const jpeg = @import("jpeg.zig");
const png = @import("png.zig");
const resample = @import("resample.zig");
const pool = @import("../pool.zig");
const diag = @import("../diag.zig");

pub const Spec = plan_mod.Spec;
pub const Key = plan_mod.Key;
pub const message_size_max: usize = 192;

/// What a record is.
pub const Input = union(enum) {
    encoded: []const u8,
    /// height x width pixels of `channels` bytes (1: grey, 3: RGB, 4: RGBA).
    pixels: struct { data: []const u8, height: u32, width: u32, channels: u32 },
};

pub const Error = error{ BadRecord, OutOfMemory };

/// A lane's buffers, reused image after image.
pub const Scratch = struct {
    decoder: jpeg.Decoder = .{},
    resample: resample.Scratch = .{},
    png: png.Scratch = .{},
    row: std.ArrayList(u8) = .empty,
    message: [message_size_max]u8 = undefined,
    message_len: usize = 0,

    pub fn deinit(s: *Scratch, gpa: Allocator) void {
        s.decoder.end();
        s.resample.deinit(gpa);
        s.png.deinit(gpa);
        s.row.deinit(gpa);
    }

    pub fn messageText(s: *const Scratch) []const u8 {
        return s.message[0..s.message_len];
    }

    fn fail(s: *Scratch, comptime fmt: []const u8, args: anytype) Error {
        const text = std.fmt.bufPrint(&s.message, fmt, args) catch blk: {
            break :blk s.message[0..];
        };
        s.message_len = text.len;
        return error.BadRecord;
    }
};

/// Runs `spec` on one record into `dest` (spec.outBytes() bytes).
pub fn record(
    gpa: Allocator,
    spec: *const Spec,
    input: Input,
    key: plan_mod.Key,
    dest: [*]u8,
    s: *Scratch,
) Error!void {
    s.message_len = 0;
    switch (input) {
        .pixels => |p| return pixels(
            gpa,
            spec,
            p.data,
            p.height,
            p.width,
            p.channels,
            key,
            dest,
            s,
        ),
        .encoded => |data| {
            if (std.mem.startsWith(u8, data, "\xff\xd8\xff")) return decodeJpeg(
                gpa,
                spec,
                data,
                key,
                dest,
                s,
            );
            if (std.mem.startsWith(u8, data, png.signature)) return decodePng(
                gpa,
                spec,
                data,
                key,
                dest,
                s,
            );
            if (data.len == 0) return s.fail("an empty record, not an image", .{});
            const n = @min(data.len, 4);
            return s.fail("not a JPEG or PNG image (its first bytes are {x})", .{data[0..n]});
        },
    }
}

fn planFor(
    spec: *const Spec,
    width: u32,
    height: u32,
    key: plan_mod.Key,
    s: *Scratch,
) Error!plan_mod.Plan {
    const p = plan_mod.plan(spec, width, height, key) catch {
        return s.fail("a {d} x {d} image is too small for the pipeline's crop", .{ width, height });
    };
    if (p.out_width != spec.out_width or p.out_height != spec.out_height) {
        return s.fail("the pipeline makes a {d} x {d} image of this {d} x {d} record, not the " ++
            "{d} x {d} of every other (end it with a crop or a resize to a fixed size)", .{
            p.out_height, p.out_width, height, width, spec.out_height, spec.out_width,
        });
    }
    if (p.sx > resample.scale_max or p.sy > resample.scale_max) {
        return s.fail("the pipeline shrinks this {d} x {d} image more than {d}x", .{
            height, width, @as(u32, @intFromFloat(resample.scale_max)),
        });
    }
    return p;
}

/// The part of a `width` x `height` source the plan reads.
fn boxOf(p: plan_mod.Plan, width: u32, height: u32) resample.Resampler.Box {
    const wf: f64 = @floatFromInt(width);
    const hf: f64 = @floatFromInt(height);
    const x1 = p.x0 + p.sx * @as(f64, @floatFromInt(p.out_width));
    const y1 = p.y0 + p.sy * @as(f64, @floatFromInt(p.out_height));
    const col_lo: u32 = @intFromFloat(std.math.clamp(@floor(p.x0), 0, wf));
    const col_hi: u32 = @intFromFloat(std.math.clamp(@ceil(x1 - 1e-9), 0, wf));
    const row_lo: u32 = @intFromFloat(std.math.clamp(@floor(p.y0), 0, hf));
    const row_hi: u32 = @intFromFloat(std.math.clamp(@ceil(y1 - 1e-9), 0, hf));
    return .{
        .col_lo = col_lo,
        .col_hi = @max(col_lo, col_hi),
        .row_lo = row_lo,
        .row_hi = @max(row_lo, row_hi),
    };
}

/// The smallest DCT scale n/8 at which the box still has at least one
/// decoded pixel per output pixel (so the decoder never throws away detail
/// the output would keep).
fn dctScale(p: plan_mod.Plan) u32 {
    const s = @min(p.sx, p.sy);
    // Only the scales whose inverse DCTs libjpeg-turbo has in SIMD (8x8, 4x4,
    // 2x2; 1x1 is the DC alone): its 3x3..7x7 ones are plain C and cost more
    // than the larger decode they save.
    var n: u32 = 8;
    while (n > 1 and s >= 16.0 / @as(f64, @floatFromInt(n))) n /= 2;
    return n;
}

fn scaledPlan(p: plan_mod.Plan, n: u32) plan_mod.Plan {
    const f = @as(f64, @floatFromInt(n)) / 8.0;
    var q = p;
    q.x0 *= f;
    q.y0 *= f;
    q.sx *= f;
    q.sy *= f;
    return q;
}

fn decodeJpeg(
    gpa: Allocator,
    spec: *const Spec,
    data: []const u8,
    key: plan_mod.Key,
    dest: [*]u8,
    s: *Scratch,
) Error!void {
    const d = &s.decoder;
    d.* = .{};
    defer d.end();
    const h = d.begin(data) catch |e| return jpegFailure(s, e, null);
    const whole = try planFor(spec, h.width, h.height, key, s);
    const n = dctScale(whole);
    const p = scaledPlan(whole, n);
    const box = boxOf(p, jpeg.scaled(h.width, n), jpeg.scaled(h.height, n));
    const writer = resample.Writer.init(spec, dest, p.flip);
    const cols = box.col_hi - box.col_lo;
    if (cols == 0 or box.row_hi == box.row_lo) {
        var r = try resample.Resampler.init(gpa, &s.resample, p, box, cols, 0, writer);
        return r.finish();
    }
    const region = d.start(n, box.col_lo, cols, box.row_lo) catch |e| return jpegFailure(s, e, h);
    const skip = box.col_lo - region.x0;
    if (region.channels == 3 and spec.channels == 3) {
        // RGB rows decode straight into the resampler's ring.
        var r = try resample.Resampler.init(gpa, &s.resample, p, box, region.width, skip, writer);
        for (box.row_lo..box.row_hi) |_| {
            d.read(r.next()) catch |e| return jpegFailure(s, e, h);
            r.commit();
        }
        return r.finish();
    }
    var r = try resample.Resampler.init(gpa, &s.resample, p, box, cols, 0, writer);
    try s.row.resize(gpa, @as(usize, region.width) * region.channels);
    const from = skip * region.channels;
    for (box.row_lo..box.row_hi) |_| {
        d.read(s.row.items) catch |e| return jpegFailure(s, e, h);
        convertRow(s.row.items[from..], region.channels == 4, cols, spec.channels, r.next());
        r.commit();
    }
    r.finish();
}

fn jpegFailure(s: *Scratch, e: jpeg.Error, h: ?jpeg.Header) Error {
    return switch (e) {
        error.Damaged => s.fail("a damaged JPEG: {s}", .{s.decoder.message()}),
        error.Unsupported => if (h) |hh|
            s.fail(
                "a {d} x {d} JPEG, larger than the {d} pixels the stage decodes",
                .{ hh.width, hh.height, jpeg.pixels_max },
            )
        else
            s.fail("a JPEG larger than the {d} pixels the stage decodes", .{jpeg.pixels_max}),
    };
}

/// One decoded row (RGB, or Adobe's inverted CMYK when `cmyk`) of `cols`
/// pixels into `channels` bytes a pixel (RGB, or L as Pillow computes it).
fn convertRow(src: []const u8, cmyk: bool, cols: u32, channels: u32, out: []u8) void {
    const in_c: usize = if (cmyk) 4 else 3;
    for (0..cols) |x| {
        const px = src[x * in_c ..];
        var rgb: [3]u8 = .{ px[0], px[1], px[2] };
        if (cmyk) {
            const k: u16 = px[3];
            for (&rgb, px[0..3]) |*v, c| v.* = @intCast((@as(u16, c) * k + 127) / 255);
        }
        if (channels == 3) {
            out[x * 3 ..][0..3].* = rgb;
        } else {
            out[x] = luma(rgb);
        }
    }
}

/// ITU-R 601-2 luma, in Pillow's fixed point.
fn luma(rgb: [3]u8) u8 {
    const v = @as(u32, rgb[0]) * 19595 + @as(u32, rgb[1]) * 38470 + @as(u32, rgb[2]) * 7471;
    return @intCast((v + 0x8000) >> 16);
}

const PngSink = struct {
    r: *resample.Resampler,
    col_lo: u32,
    cols: u32,
    channels: u32,

    pub fn row(k: *const PngSink, rgb: []const u8) void {
        convertRow(rgb[@as(usize, k.col_lo) * 3 ..], false, k.cols, k.channels, k.r.next());
        k.r.commit();
    }
};

fn decodePng(
    gpa: Allocator,
    spec: *const Spec,
    data: []const u8,
    key: plan_mod.Key,
    dest: [*]u8,
    s: *Scratch,
) Error!void {
    var why: png.Failure = .{};
    var idat: []const u8 = &.{};
    const info = png.begin(
        gpa,
        data,
        &s.png.joined,
        &idat,
        &why,
    ) catch |e| return pngFailure(s, e, why);
    const p = try planFor(spec, info.width, info.height, key, s);
    const box = boxOf(p, info.width, info.height);
    const cols = box.col_hi - box.col_lo;
    const writer = resample.Writer.init(spec, dest, p.flip);
    var r = try resample.Resampler.init(gpa, &s.resample, p, box, cols, 0, writer);
    const sink: PngSink = .{
        .r = &r,
        .col_lo = box.col_lo,
        .cols = cols,
        .channels = spec.channels,
    };
    if (cols > 0) {
        png.rows(gpa, &s.png, &info, idat, box.row_lo, box.row_hi, &sink, &why) catch |e|
            return pngFailure(s, e, why);
    }
    r.finish();
}

fn pngFailure(s: *Scratch, e: png.Error, why: png.Failure) Error {
    return switch (e) {
        error.Damaged => s.fail("a damaged PNG: {s}", .{why.text}),
        error.Unsupported => s.fail("a PNG larger than the stage decodes ({d} pixels, {d} " ++
            "when interlaced)", .{ png.pixels_max, png.interlaced_pixels_max }),
        error.OutOfMemory => error.OutOfMemory,
    };
}

fn pixels(
    gpa: Allocator,
    spec: *const Spec,
    data: []const u8,
    height: u32,
    width: u32,
    channels: u32,
    key: plan_mod.Key,
    dest: [*]u8,
    s: *Scratch,
) Error!void {
    assert(data.len == @as(usize, height) * width * channels);
    assert(channels == 1 or channels == 3 or channels == 4);
    const p = try planFor(spec, width, height, key, s);
    const box = boxOf(p, width, height);
    const cols = box.col_hi - box.col_lo;
    const writer = resample.Writer.init(spec, dest, p.flip);
    var r = try resample.Resampler.init(gpa, &s.resample, p, box, cols, 0, writer);
    const stride = @as(usize, width) * channels;
    for (box.row_lo..box.row_hi) |y| {
        const row = data[y * stride + @as(
            usize,
            box.col_lo,
        ) * channels ..][0 .. @as(usize, cols) * channels];
        if (channels == spec.channels) {
            r.push(row);
            continue;
        }
        const out = r.next();
        for (0..cols) |x| {
            const px = row[x * channels ..];
            const rgb: [3]u8 = if (channels == 1) @splat(px[0]) else .{ px[0], px[1], px[2] };
            if (spec.channels == 3) {
                out[x * 3 ..][0..3].* = rgb;
            } else {
                out[x] = luma(rgb);
            }
        }
        r.commit();
    }
    r.finish();
}

// ---------------------------------------------------------------- a batch

/// The records of a batch, in slot order.
pub const Records = union(enum) {
    /// Record i is bytes[offsets[i] .. offsets[i] + sizes[i]].
    encoded: struct { bytes: []const u8, offsets: []const u64, sizes: []const u64 },
    /// Record i is the i-th height x width x channels block of `data`.
    pixels: struct { data: []const u8, height: u32, width: u32, channels: u32 },

    fn count(r: Records) usize {
        return switch (r) {
            .encoded => |e| e.sizes.len,
            .pixels => |p| p.data.len / (@as(usize, p.height) * p.width * p.channels),
        };
    }

    fn at(r: Records, i: usize) Input {
        return switch (r) {
            .encoded => |e| .{
                .encoded = e.bytes[@intCast(e.offsets[i])..][0..@intCast(e.sizes[i])],
            },
            .pixels => |p| blk: {
                const size = @as(usize, p.height) * p.width * p.channels;
                break :blk .{
                    .pixels = .{
                        .data = p.data[i * size ..][0..size],
                        .height = p.height,
                        .width = p.width,
                        .channels = p.channels,
                    },
                };
            },
        };
    }
};

/// The lanes' scratch, kept by the caller between batches (a loader thread's).
pub const Lanes = struct {
    scratch: [pool.lanes_max]?*Scratch = @splat(null),

    pub fn get(l: *Lanes, gpa: Allocator, lane: usize) Allocator.Error!*Scratch {
        if (l.scratch[lane]) |s| return s;
        const s = try gpa.create(Scratch);
        s.* = .{};
        l.scratch[lane] = s;
        return s;
    }

    pub fn deinit(l: *Lanes, gpa: Allocator) void {
        for (&l.scratch) |*slot| {
            if (slot.*) |s| {
                s.deinit(gpa);
                gpa.destroy(s);
            }
            slot.* = null;
        }
    }
};

/// What a batch came to: how many records were replaced (on_error skip),
/// or, when it failed, which slot and why (`message`).
pub const Outcome = struct {
    skipped: u32 = 0,
    failed_slot: ?usize = null,
    message: [message_size_max]u8 = undefined,
    message_len: usize = 0,
};

const Job = struct {
    gpa: Allocator,
    spec: *const Spec,
    records: Records,
    key: plan_mod.Key,
    dest: [*]u8,
    lanes: *Lanes,
    next: std.atomic.Value(usize) = .init(0),
    /// Per slot: 0 done, 1 failed (a bad record), 2 out of memory.
    status: []u8,

    fn work(job: *Job, lane: usize) void {
        const s = job.lanes.get(job.gpa, lane) catch {
            // Without scratch this lane takes no records; the others (or the
            // caller's pass over unclaimed slots) do them.
            return;
        };
        const n = job.records.count();
        const size = job.spec.outBytes();
        while (true) {
            const i = job.next.fetchAdd(1, .monotonic);
            if (i >= n) return;
            var key = job.key;
            key.position += i;
            const dest = job.dest + @as(usize, @intCast(size)) * i;
            record(job.gpa, job.spec, job.records.at(i), key, dest, s) catch |e| {
                job.status[i] = if (e == error.OutOfMemory) 2 else 1;
            };
        }
    }
};

/// Runs `spec` on every record into `dest` (count * spec.outBytes() bytes),
/// record i keyed at position `key.position + i`, on up to `lane_cap` lanes
/// (0: all).
pub fn batch(
    gpa: Allocator,
    spec: *const Spec,
    records: Records,
    key: plan_mod.Key,
    dest: [*]u8,
    lanes: *Lanes,
    lane_cap: usize,
    out: *Outcome,
) Error!void {
    const n = records.count();
    out.* = .{};
    if (n == 0) return;
    const status = try gpa.alloc(u8, n);
    defer gpa.free(status);
    @memset(status, 0);
    var job: Job = .{
        .gpa = gpa,
        .spec = spec,
        .records = records,
        .key = key,
        .dest = dest,
        .lanes = lanes,
        .status = status,
    };
    const p = pool.plan(n, n > 1, lane_cap, 1);
    pool.run(p.lanes, &job, Job.work);
    // Slots no lane reached (lanes without scratch) run here.
    if (job.next.load(.monotonic) < n) {
        const s = try lanes.get(gpa, 0);
        for (job.next.load(.monotonic)..n) |i| {
            var k = key;
            k.position += i;
            record(
                gpa,
                spec,
                records.at(i),
                k,
                dest + @as(usize, @intCast(spec.outBytes())) * i,
                s,
            ) catch |e| {
                status[i] = if (e == error.OutOfMemory) 2 else 1;
            };
        }
    }
    for (status) |st| if (st == 2) return error.OutOfMemory;
    if (std.mem.indexOfScalar(u8, status, 1) == null) return;
    return settle(gpa, spec, records, key, dest, lanes, status, out);
}

/// After the parallel pass: replaces failed slots (on_error skip) or reports
/// the first, with its message (made again here: the same record fails the
/// same way, whichever lane first ran it).
fn settle(
    gpa: Allocator,
    spec: *const Spec,
    records: Records,
    key: plan_mod.Key,
    dest: [*]u8,
    lanes: *Lanes,
    status: []const u8,
    out: *Outcome,
) Error!void {
    const s = try lanes.get(gpa, 0);
    const size: usize = @intCast(spec.outBytes());
    const n = status.len;
    const skip = spec.on_error == @backingInt(plan_mod.OnError.skip);
    for (status, 0..) |st, i| {
        if (st != 1) continue;
        var k = key;
        k.position += i;
        if (skip) {
            if (replace(gpa, spec, records, k, dest + size * i, s, status, i)) {
                out.skipped += 1;
                continue;
            }
        }
        record(gpa, spec, records.at(i), k, dest + size * i, s) catch {};
        out.failed_slot = i;
        const text = s.messageText();
        const len = @min(text.len, out.message.len);
        @memcpy(out.message[0..len], text[0..len]);
        out.message_len = len;
        return error.BadRecord;
    }
    assert(out.skipped <= n);
}

/// Slot i gets the first record after it (cyclically) that succeeds.
fn replace(
    gpa: Allocator,
    spec: *const Spec,
    records: Records,
    key: plan_mod.Key,
    dest: [*]u8,
    s: *Scratch,
    status: []const u8,
    i: usize,
) bool {
    const n = status.len;
    for (1..n) |d| {
        const j = (i + d) % n;
        if (status[j] != 0) continue;
        record(gpa, spec, records.at(j), key, dest, s) catch continue;
        return true;
    }
    return false;
}

// ---------------------------------------------------------------- a loader's image column

pub const InputKind = enum(u32) { encoded = 0, pixels = 1 };

/// lx_image_column_t: an image column of a loader: its pipeline, what its
/// records are (encoded images; or pixels, height x width x channels bytes
/// each), and the seed its draws are keyed by.
pub const Column = extern struct {
    spec: Spec,
    seed: u64,
    input: u32,
    height: u32,
    width: u32,
    channels: u32,

    comptime {
        assert(@sizeOf(Column) == @sizeOf(Spec) + 24);
    }
};

/// Checks a column from the caller (the message in diag).
pub fn checkColumn(c: *const Column) error{InvalidArgument}!void {
    plan_mod.check(&c.spec) catch
        return diag.fail(error.InvalidArgument, "an invalid image pipeline", .{});
    const kind = std.enums.fromInt(InputKind, c.input) orelse
        return diag.fail(error.InvalidArgument, "unknown image input kind {d}", .{c.input});
    if (kind == .encoded) return;
    const side = plan_mod.side_max;
    if (c.height == 0 or c.width == 0 or c.height > side or c.width > side) {
        return diag.fail(
            error.InvalidArgument,
            "pixel records of {d} x {d}",
            .{ c.height, c.width },
        );
    }
    if (c.channels != 1 and c.channels != 3 and c.channels != 4) {
        return diag.fail(
            error.InvalidArgument,
            "pixel records of {d} channels (1, 3 or 4)",
            .{c.channels},
        );
    }
}

/// A loader step's image column: `batch` into `dest`, a failure reported
/// (in diag) with the failing record's stream index from `indices`.
/// Returns the records replaced (on_error skip).
pub fn batchInto(
    gpa: Allocator,
    col: *const Column,
    records: Records,
    key: Key,
    dest: [*]u8,
    lanes: *Lanes,
    lane_cap: usize,
    indices: []const u64,
) error{ BadImage, OutOfMemory }!u32 {
    var out: Outcome = .{};
    batch(gpa, &col.spec, records, key, dest, lanes, lane_cap, &out) catch |e| switch (e) {
        error.OutOfMemory => return diag.fail(
            error.OutOfMemory,
            "no memory for the image stage's buffers",
            .{},
        ),
        error.BadRecord => {
            const slot = out.failed_slot.?;
            return diag.fail(
                error.BadImage,
                "record {d}: {s}",
                .{ indices[slot], out.message[0..out.message_len] },
            );
        },
    };
    return out.skipped;
}

// ---------------------------------------------------------------- tests

const testing = std.testing;
const test_images = @import("test_images.zig");

fn rrcSpec(dtype: plan_mod.Dtype, layout: plan_mod.Layout, size: u32) Spec {
    var s = std.mem.zeroes(Spec);
    s.op_count = 2;
    s.channels = 3;
    s.dtype = @backingInt(dtype);
    s.layout = @backingInt(layout);
    s.out_height = size;
    s.out_width = size;
    s.mean = .{ 0.485, 0.456, 0.406, 0 };
    s.std = .{ 0.229, 0.224, 0.225, 1 };
    s.ops[0] = .{
        .kind = 3,
        .height = size,
        .width = size,
        .scale_min = 0.08,
        .scale_max = 1,
        .log_ratio_min = @log(3.0 / 4.0),
        .log_ratio_max = @log(4.0 / 3.0),
    };
    s.ops[1] = .{ .kind = 4, .p = 0.5 };
    return s;
}

fn testScratch() Scratch {
    return .{};
}

test "every test image runs through RandomResizedCrop and flip, in every dtype" {
    var s = testScratch();
    defer s.deinit(testing.allocator);
    var out: [24 * 24 * 3 * 4]u8 align(4) = undefined;
    for ([_]plan_mod.Dtype{ .uint8, .float16, .float32 }) |dtype| {
        const spec = rrcSpec(dtype, .chw, 24);
        try plan_mod.check(&spec);
        for (test_images.all) |image| {
            for (0..20) |pos| {
                try record(
                    testing.allocator,
                    &spec,
                    .{ .encoded = image },
                    .{ .seed = 1, .step = 2, .position = pos },
                    &out,
                    &s,
                );
            }
        }
        for (test_images.pngs) |case| {
            try record(
                testing.allocator,
                &spec,
                .{ .encoded = case.png },
                .{ .seed = 1, .step = 2, .position = 0 },
                &out,
                &s,
            );
        }
    }
}

test "a PNG resized 1:1 comes out as its pixels" {
    var s = testScratch();
    defer s.deinit(testing.allocator);
    const case = test_images.pngs[4];
    var spec = std.mem.zeroes(Spec);
    spec.channels = 3;
    spec.out_width = case.width;
    spec.out_height = @intCast(case.rgb.len / 3 / case.width);
    spec.std = @splat(1);
    var out: [4096]u8 = undefined;
    try record(
        testing.allocator,
        &spec,
        .{ .encoded = case.png },
        .{ .seed = 0, .step = 0, .position = 0 },
        &out,
        &s,
    );
    try testing.expectEqualSlices(u8, case.rgb, out[0..case.rgb.len]);
}

test "a DCT-scaled decode is close to a full decode resized" {
    var s = testScratch();
    defer s.deinit(testing.allocator);
    var spec = std.mem.zeroes(Spec);
    spec.channels = 3;
    spec.out_width = 15;
    spec.out_height = 11;
    spec.std = @splat(1);
    spec.op_count = 1;
    spec.ops[0] = .{ .kind = 1, .height = 11, .width = 15 };
    var scaled_out: [15 * 11 * 3]u8 = undefined;
    try record(
        testing.allocator,
        &spec,
        .{ .encoded = test_images.s444 },
        .{ .seed = 0, .step = 0, .position = 0 },
        &scaled_out,
        &s,
    );
    // The same through pixels: decode whole (a 1:1 pipeline), then resize.
    var whole_spec = std.mem.zeroes(Spec);
    whole_spec.channels = 3;
    whole_spec.out_width = 61;
    whole_spec.out_height = 45;
    whole_spec.std = @splat(1);
    var whole: [61 * 45 * 3]u8 = undefined;
    try record(
        testing.allocator,
        &whole_spec,
        .{ .encoded = test_images.s444 },
        .{ .seed = 0, .step = 0, .position = 0 },
        &whole,
        &s,
    );
    var direct: [15 * 11 * 3]u8 = undefined;
    try record(
        testing.allocator,
        &spec,
        .{ .pixels = .{ .data = &whole, .height = 45, .width = 61, .channels = 3 } },
        .{ .seed = 0, .step = 0, .position = 0 },
        &direct,
        &s,
    );
    var diff: u64 = 0;
    for (scaled_out, direct) |a, b| diff += @abs(@as(i32, a) - b);
    try testing.expect(diff / scaled_out.len <= 6);
}

test "damaged and hostile records fail with a message, never a crash" {
    var s = testScratch();
    defer s.deinit(testing.allocator);
    const spec = rrcSpec(.uint8, .hwc, 16);
    var out: [16 * 16 * 3]u8 = undefined;
    var buf: [8192]u8 = undefined;
    const key: plan_mod.Key = .{ .seed = 0, .step = 0, .position = 0 };
    for (
        [_][]const u8{
            test_images.s420,
            test_images.progressive,
            test_images.pngs[0].png,
        },
    ) |good| {
        for (0..good.len) |cut| {
            record(testing.allocator, &spec, .{ .encoded = good[0..cut] }, key, &out, &s) catch {
                try testing.expect(s.message_len > 0);
            };
        }
        var prng = std.Random.DefaultPrng.init(good.len);
        for (0..300) |_| {
            @memcpy(buf[0..good.len], good);
            for (0..3) |_| buf[
                prng.random().uintLessThan(
                    usize,
                    good.len,
                )
            ] ^= @as(u8, 1) << prng.random().int(u3);
            record(
                testing.allocator,
                &spec,
                .{ .encoded = buf[0..good.len] },
                key,
                &out,
                &s,
            ) catch {
                try testing.expect(s.message_len > 0);
            };
        }
    }
    // A baseline header claiming 16,384 x 16,384 with 1 KiB of data after it.
    const good = test_images.s420;
    @memcpy(buf[0..good.len], good);
    const sof = std.mem.indexOf(u8, good, "\xff\xc0").?;
    std.mem.writeInt(u16, buf[sof + 5 ..][0..2], 16384, .big);
    std.mem.writeInt(u16, buf[sof + 7 ..][0..2], 16384, .big);
    try testing.expectError(
        error.BadRecord,
        record(testing.allocator, &spec, .{ .encoded = buf[0..good.len] }, key, &out, &s),
    );
    try testing.expect(std.mem.indexOf(u8, s.messageText(), "damaged JPEG") != null);
    try testing.expectError(
        error.BadRecord,
        record(testing.allocator, &spec, .{ .encoded = "GIF89a" }, key, &out, &s),
    );
    try testing.expect(std.mem.indexOf(u8, s.messageText(), "not a JPEG or PNG") != null);
}

test "a batch fails at its first bad record, or skips it when asked" {
    var lanes: Lanes = .{};
    defer lanes.deinit(testing.allocator);
    var spec = rrcSpec(.uint8, .hwc, 8);
    const a = test_images.s420;
    const b = "not an image";
    var bytes: [8192]u8 = undefined;
    @memcpy(bytes[0..a.len], a);
    @memcpy(bytes[a.len..][0..b.len], b);
    @memcpy(bytes[a.len + b.len ..][0..a.len], a);
    const offsets = [_]u64{ 0, a.len, a.len + b.len };
    const sizes = [_]u64{ a.len, b.len, a.len };
    const records: Records = .{
        .encoded = .{ .bytes = &bytes, .offsets = &offsets, .sizes = &sizes },
    };
    var out: [3 * 8 * 8 * 3]u8 = undefined;
    var outcome: Outcome = .{};
    const key: plan_mod.Key = .{ .seed = 5, .step = 1, .position = 64 };
    try testing.expectError(
        error.BadRecord,
        batch(testing.allocator, &spec, records, key, &out, &lanes, 0, &outcome),
    );
    try testing.expectEqual(@as(?usize, 1), outcome.failed_slot);
    spec.on_error = @backingInt(plan_mod.OnError.skip);
    try batch(testing.allocator, &spec, records, key, &out, &lanes, 0, &outcome);
    try testing.expectEqual(@as(u32, 1), outcome.skipped);
    // Slot 1 holds record 2 with slot 1's draws: what a batch of [a, a] gives at slot 1.
    var again: [2 * 8 * 8 * 3]u8 = undefined;
    const two: Records = .{
        .encoded = .{ .bytes = &bytes, .offsets = &.{ 0, 0 }, .sizes = &.{ a.len, a.len } },
    };
    try batch(testing.allocator, &spec, two, key, &again, &lanes, 0, &outcome);
    try testing.expectEqualSlices(u8, again[192..384], out[192..384]);
}
