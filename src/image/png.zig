//! A PNG decoder for the image stage, written for it: every colour type and
//! bit depth of the standard, Adam7 interlacing, chunk CRCs checked, rows
//! out as 8-bit RGB (alpha dropped, 16-bit samples to their high byte, grey
//! and palette expanded), through zlib from the standard library.
//!
//! Rows stream: a plain PNG is unfiltered one scanline at a time and
//! decoding stops after the last row the caller wants, so its memory is
//! two scanlines and the inflate window. An interlaced one is assembled
//! whole first (its rows arrive in seven passes), so it is limited to
//! `interlaced_pixels_max`.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const flate = std.compress.flate;

/// The largest image decoded (as for JPEG).
pub const pixels_max: u64 = 1 << 28;
/// The largest interlaced image (assembled whole: 3 bytes a pixel).
pub const interlaced_pixels_max: u64 = 1 << 24;

pub const signature = "\x89PNG\r\n\x1a\n";

pub const Color = enum(u8) { gray = 0, rgb = 2, palette = 3, gray_alpha = 4, rgba = 6 };

pub const Info = struct {
    width: u32,
    height: u32,
    color: Color,
    depth: u8,
    interlaced: bool,
    palette: [256][3]u8 = undefined,
    palette_len: u16 = 0,

    fn samples(i: *const Info) u32 {
        return switch (i.color) {
            .gray, .palette => 1,
            .gray_alpha => 2,
            .rgb => 3,
            .rgba => 4,
        };
    }

    /// Bytes of one scanline of `width` pixels, without its filter byte.
    fn rowBytes(i: *const Info, width: u32) usize {
        return (@as(usize, width) * i.samples() * i.depth + 7) / 8;
    }

    /// The filter's byte distance: bytes per pixel, at least 1.
    fn filterStride(i: *const Info) usize {
        return @max(1, i.samples() * i.depth / 8);
    }
};

pub const Error = error{ Damaged, Unsupported, OutOfMemory };

/// Why the last decode failed, for the record's error message.
pub const Failure = struct {
    text: []const u8 = "",
};

fn be32(b: []const u8) u32 {
    return std.mem.readInt(u32, b[0..4], .big);
}

/// Chunks of `data` after the signature: type, payload, and whether the CRC holds.
const Chunks = struct {
    data: []const u8,
    at: usize = signature.len,

    const Chunk = struct { kind: [4]u8, body: []const u8 };

    fn next(c: *Chunks, why: *Failure) Error!?Chunk {
        if (c.at == c.data.len) return null;
        if (c.data.len - c.at < 12) return fail(why, "the file ends inside a chunk header");
        const len = be32(c.data[c.at..]);
        if (len > c.data.len - c.at - 12) return fail(why, "a chunk runs past the end of the file");
        const kind = c.data[c.at + 4 ..][0..4].*;
        const body = c.data[c.at + 8 ..][0..len];
        const crc = be32(c.data[c.at + 8 + len ..]);
        var h = std.hash.Crc32.init();
        h.update(&kind);
        h.update(body);
        if (h.final() != crc) return fail(why, "a chunk's CRC does not match its bytes");
        c.at += 12 + len;
        return .{ .kind = kind, .body = body };
    }
};

fn fail(why: *Failure, text: []const u8) Error {
    why.text = text;
    return error.Damaged;
}

/// Reads the header, palette and where the image data is. `idat` receives
/// the image data: the one IDAT chunk's bytes in place, or all of them
/// copied back to back into `joined`.
pub fn begin(
    gpa: Allocator,
    data: []const u8,
    joined: *std.ArrayList(u8),
    idat: *[]const u8,
    why: *Failure,
) Error!Info {
    if (!std.mem.startsWith(u8, data, signature)) return fail(why, "not a PNG file");
    var chunks: Chunks = .{ .data = data };
    const first = try chunks.next(why) orelse return fail(why, "no IHDR chunk");
    if (!std.mem.eql(u8, &first.kind, "IHDR") or first.body.len != 13) {
        return fail(why, "the first chunk is not a valid IHDR");
    }
    var info = try header(first.body, why);
    var count: usize = 0;
    var single: []const u8 = &.{};
    joined.clearRetainingCapacity();
    while (try chunks.next(why)) |c| {
        if (std.mem.eql(u8, &c.kind, "IEND")) break;
        if (std.mem.eql(u8, &c.kind, "PLTE")) {
            if (c.body.len % 3 != 0 or c.body.len > 768) return fail(why, "a malformed PLTE chunk");
            info.palette_len = @intCast(c.body.len / 3);
            for (0..info.palette_len) |k| info.palette[k] = c.body[k * 3 ..][0..3].*;
        } else if (std.mem.eql(u8, &c.kind, "IDAT")) {
            if (count == 1) try joined.appendSlice(gpa, single);
            if (count >= 1) try joined.appendSlice(gpa, c.body);
            single = c.body;
            count += 1;
        }
    }
    if (count == 0) return fail(why, "no image data (IDAT)");
    if (info.color == .palette and info.palette_len == 0) return fail(
        why,
        "a palette image without PLTE",
    );
    idat.* = if (count == 1) single else joined.items;
    return info;
}

fn header(b: []const u8, why: *Failure) Error!Info {
    const width = be32(b[0..]);
    const height = be32(b[4..]);
    const depth = b[8];
    const color = std.enums.fromInt(Color, b[9]) orelse return fail(
        why,
        "an unknown PNG colour type",
    );
    if (b[10] != 0 or b[11] != 0) return fail(why, "an unknown PNG compression or filter method");
    if (b[12] > 1) return fail(why, "an unknown PNG interlace method");
    if (width == 0 or height == 0 or width > 1 << 31 or height > 1 << 31) {
        return fail(why, "a PNG of zero or impossible size");
    }
    const ok = switch (color) {
        .gray => depth == 1 or depth == 2 or depth == 4 or depth == 8 or depth == 16,
        .palette => depth == 1 or depth == 2 or depth == 4 or depth == 8,
        .rgb, .gray_alpha, .rgba => depth == 8 or depth == 16,
    };
    if (!ok) return fail(why, "a bit depth the colour type does not allow");
    const info: Info = .{
        .width = width,
        .height = height,
        .color = color,
        .depth = depth,
        .interlaced = b[12] == 1,
    };
    const pixels = @as(u64, width) * height;
    if (pixels > pixels_max) return error.Unsupported;
    if (info.interlaced and pixels > interlaced_pixels_max) return error.Unsupported;
    return info;
}

/// Per-thread buffers, grown as needed and kept between images.
pub const Scratch = struct {
    window: []u8 = &.{},
    prev: std.ArrayList(u8) = .empty,
    cur: std.ArrayList(u8) = .empty,
    rgb: std.ArrayList(u8) = .empty,
    joined: std.ArrayList(u8) = .empty,
    whole: std.ArrayList(u8) = .empty,

    pub fn deinit(s: *Scratch, gpa: Allocator) void {
        gpa.free(s.window);
        s.prev.deinit(gpa);
        s.cur.deinit(gpa);
        s.rgb.deinit(gpa);
        s.joined.deinit(gpa);
        s.whole.deinit(gpa);
        s.* = .{};
    }
};

/// Decodes rows [row_lo, row_hi) of the image, calling `sink.row(rgb)` with
/// each (width * 3 bytes) in order.
pub fn rows(
    gpa: Allocator,
    s: *Scratch,
    info: *const Info,
    idat: []const u8,
    row_lo: u32,
    row_hi: u32,
    sink: anytype,
    why: *Failure,
) Error!void {
    assert(row_lo <= row_hi and row_hi <= info.height);
    if (s.window.len < flate.max_window_len) {
        gpa.free(s.window);
        s.window = &.{};
        s.window = try gpa.alloc(u8, flate.max_window_len);
    }
    var in: std.Io.Reader = .fixed(idat);
    var z: flate.Decompress = .init(&in, .zlib, s.window);
    try s.rgb.resize(gpa, @as(usize, info.width) * 3);
    if (!info.interlaced) {
        try begin_pass(gpa, s, info, info.width);
        for (0..row_hi) |y| {
            try scanline(&z.reader, s, info, why);
            if (y < row_lo) continue;
            toRgb(info, s.cur.items, info.width, s.rgb.items);
            sink.row(s.rgb.items);
        }
        return;
    }
    try interlaced(gpa, s, info, &z.reader, why);
    const stride = @as(usize, info.width) * 3;
    for (row_lo..row_hi) |y| sink.row(s.whole.items[y * stride ..][0..stride]);
}

fn begin_pass(gpa: Allocator, s: *Scratch, info: *const Info, width: u32) Error!void {
    const n = info.rowBytes(width);
    try s.prev.resize(gpa, n);
    try s.cur.resize(gpa, n);
    // `scanline` swaps first: the row before the first is all zeros.
    @memset(s.prev.items, 0);
    @memset(s.cur.items, 0);
}

/// Inflates and unfilters the next scanline into s.cur (s.prev: the last).
fn scanline(z: *std.Io.Reader, s: *Scratch, info: *const Info, why: *Failure) Error!void {
    std.mem.swap(std.ArrayList(u8), &s.prev, &s.cur);
    var filter: [1]u8 = undefined;
    z.readSliceAll(&filter) catch return fail(why, "the image data ends early or is damaged");
    z.readSliceAll(s.cur.items) catch return fail(why, "the image data ends early or is damaged");
    const cur = s.cur.items;
    const prev = s.prev.items;
    const bpp = info.filterStride();
    switch (filter[0]) {
        0 => {},
        1 => for (bpp..cur.len) |i| {
            cur[i] +%= cur[i - bpp];
        },
        2 => for (cur, prev) |*c, p| {
            c.* +%= p;
        },
        3 => for (cur, 0..) |*c, i| {
            const left: u16 = if (i >= bpp) cur[i - bpp] else 0;
            c.* +%= @intCast((left + prev[i]) / 2);
        },
        4 => for (cur, 0..) |*c, i| {
            const a: i16 = if (i >= bpp) cur[i - bpp] else 0;
            const b: i16 = prev[i];
            const cc: i16 = if (i >= bpp) prev[i - bpp] else 0;
            c.* +%= paeth(a, b, cc);
        },
        else => return fail(why, "an unknown PNG row filter"),
    }
}

fn paeth(a: i16, b: i16, c: i16) u8 {
    const p = a + b - c;
    const pa = @abs(p - a);
    const pb = @abs(p - b);
    const pc = @abs(p - c);
    if (pa <= pb and pa <= pc) return @intCast(a);
    if (pb <= pc) return @intCast(b);
    return @intCast(c);
}

/// One unfiltered scanline of `width` pixels as 8-bit RGB.
fn toRgb(info: *const Info, raw: []const u8, width: u32, rgb: []u8) void {
    const n: usize = width;
    assert(rgb.len >= n * 3);
    if (info.depth < 8) return packedToRgb(info, raw, n, rgb);
    const step: usize = info.depth / 8;
    const spp = info.samples();
    for (0..n) |x| {
        const px = raw[x * spp * step ..];
        const out = rgb[x * 3 ..][0..3];
        switch (info.color) {
            .gray, .gray_alpha => @memset(out, px[0]),
            .rgb, .rgba => out.* = .{ px[0], px[step], px[2 * step] },
            .palette => out.* = paletteColour(info, px[0]),
        }
    }
}

fn packedToRgb(info: *const Info, raw: []const u8, n: usize, rgb: []u8) void {
    const bits: u3 = @intCast(info.depth);
    const per_byte = 8 / @as(usize, bits);
    const mask: u8 = (@as(u8, 1) << bits) - 1;
    const scale: u8 = 255 / mask;
    for (0..n) |x| {
        const byte = raw[x / per_byte];
        const shift: u3 = @intCast(8 - @as(usize, bits) * (x % per_byte + 1));
        const v = (byte >> shift) & mask;
        const out = rgb[x * 3 ..][0..3];
        if (info.color == .palette) out.* = paletteColour(info, v) else @memset(out, v * scale);
    }
}

/// A palette index past the palette is black (as most decoders make it).
fn paletteColour(info: *const Info, index: u8) [3]u8 {
    return if (index < info.palette_len) info.palette[index] else .{ 0, 0, 0 };
}

const passes = [7][4]u32{
    .{ 0, 0, 8, 8 }, .{ 4, 0, 8, 8 }, .{ 0, 4, 4, 8 }, .{ 2, 0, 4, 4 },
    .{ 0, 2, 2, 4 }, .{ 1, 0, 2, 2 }, .{ 0, 1, 1, 2 },
};

fn interlaced(
    gpa: Allocator,
    s: *Scratch,
    info: *const Info,
    z: *std.Io.Reader,
    why: *Failure,
) Error!void {
    const W: usize = info.width;
    try s.whole.resize(gpa, W * info.height * 3);
    for (passes) |p| {
        if (p[0] >= info.width or p[1] >= info.height) continue;
        const pw: u32 = (info.width - p[0] + p[2] - 1) / p[2];
        const ph: u32 = (info.height - p[1] + p[3] - 1) / p[3];
        try begin_pass(gpa, s, info, pw);
        for (0..ph) |r| {
            try scanline(z, s, info, why);
            toRgb(info, s.cur.items, pw, s.rgb.items);
            const y = p[1] + r * p[3];
            for (0..pw) |c| {
                const x = p[0] + c * p[2];
                @memcpy(s.whole.items[(y * W + x) * 3 ..][0..3], s.rgb.items[c * 3 ..][0..3]);
            }
        }
    }
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

const Collect = struct {
    out: std.ArrayList(u8) = .empty,
    fn row(c: *Collect, rgb: []const u8) void {
        c.out.appendSlice(
            testing.allocator,
            rgb,
        ) catch unreachable; // test-only: the allocator has room
    }
};

fn decodeAll(data: []const u8, c: *Collect) !Info {
    var s: Scratch = .{};
    defer s.deinit(testing.allocator);
    var why: Failure = .{};
    var idat: []const u8 = &.{};
    const info = try begin(testing.allocator, data, &s.joined, &idat, &why);
    try rows(testing.allocator, &s, &info, idat, 0, info.height, c, &why);
    return info;
}

test "every colour type and depth decodes to the expected RGB" {
    const t = @import("test_images.zig");
    for (t.pngs) |case| {
        var c: Collect = .{};
        defer c.out.deinit(testing.allocator);
        const info = try decodeAll(case.png, &c);
        try testing.expectEqual(case.width, info.width);
        try testing.expectEqualSlices(u8, case.rgb, c.out.items);
    }
}

test "damage is an error, never a crash" {
    const t = @import("test_images.zig");
    const good = t.pngs[0].png;
    var buf: [4096]u8 = undefined;
    for (0..good.len) |cut| {
        var c: Collect = .{};
        defer c.out.deinit(testing.allocator);
        _ = decodeAll(good[0..cut], &c) catch continue;
    }
    var prng = std.Random.DefaultPrng.init(1);
    for (0..500) |_| {
        @memcpy(buf[0..good.len], good);
        buf[prng.random().uintLessThan(usize, good.len)] ^= @as(u8, 1) << prng.random().int(u3);
        var c: Collect = .{};
        defer c.out.deinit(testing.allocator);
        _ = decodeAll(buf[0..good.len], &c) catch continue;
    }
}
