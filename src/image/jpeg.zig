//! JPEG decoding for the image stage: libjpeg-turbo through the C shim
//! (jpeg_shim.c, which turns libjpeg's longjmp errors into return codes).
//!
//! Two decoders speak the same libjpeg 6b ABI: the libjpeg-turbo 2.1.5
//! compiled into this library (portable C, every platform) and, when one is
//! found at run time, a libjpeg-turbo with SIMD (the one Pillow's wheel
//! ships, or the system's), loaded by `useLibrary`. A library is taken only
//! after it decoded the test images exactly as the built-in one does, so the
//! choice never changes a pixel; it is made once per process, before any
//! decode (see docs/design.md for the measurements behind it).
//!
//! Bounds: an image of more than `pixels_max` pixels is refused before any
//! decoding, and libjpeg may allocate at most `memory_max` bytes for whole-
//! image buffers (a progressive file's coefficients), so a hostile header
//! costs an error, never a huge allocation.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;

/// The largest image decoded (2^28 pixels: 16,384 x 16,384).
pub const pixels_max: u64 = 1 << 28;
/// The most libjpeg may allocate for whole-image buffers of one decode.
pub const memory_max: c_long = 256 << 20;

/// lxj_api: libjpeg's entry points (only the shim calls them).
pub const Api = extern struct {
    std_error: ?*const anyopaque = null,
    create_decompress: ?*const anyopaque = null,
    destroy_decompress: ?*const anyopaque = null,
    mem_src: ?*const anyopaque = null,
    read_header: ?*const anyopaque = null,
    start_decompress: ?*const anyopaque = null,
    crop_scanline: ?*const anyopaque = null,
    skip_scanlines: ?*const anyopaque = null,
    read_scanlines: ?*const anyopaque = null,

    /// The symbol each field is looked up by in a loaded library.
    const symbols = [_][:0]const u8{
        "jpeg_std_error",     "jpeg_CreateDecompress", "jpeg_destroy_decompress",
        "jpeg_mem_src",       "jpeg_read_header",      "jpeg_start_decompress",
        "jpeg_crop_scanline", "jpeg_skip_scanlines",   "jpeg_read_scanlines",
    };

    comptime {
        assert(@sizeOf(Api) == symbols.len * @sizeOf(usize));
    }
};

/// lxj_header.
pub const Header = extern struct {
    width: u32 = 0,
    height: u32 = 0,
    components: u32 = 0,
    progressive: u32 = 0,
};

/// lxj_region.
pub const Region = extern struct {
    x0: u32 = 0,
    width: u32 = 0,
    height: u32 = 0,
    channels: u32 = 0,
};

extern fn lxj_state_size() usize;
extern fn lxj_begin(
    s: *anyopaque,
    api: *const Api,
    data: [*]const u8,
    len: usize,
    memory: c_long,
    out: *Header,
) c_int;
extern fn lxj_start(s: *anyopaque, scale_num: u32, x: u32, w: u32, y: u32, out: *Region) c_int;
extern fn lxj_read(s: *anyopaque, row: [*]u8) c_int;
extern fn lxj_end(s: *anyopaque) void;
extern fn lxj_message(s: *const anyopaque) [*:0]const u8;
extern fn lxj_builtin_api(out: *Api) void;

/// Bytes reserved for the shim's state (a jpeg_decompress_struct, its error
/// manager and a jmp_buf); checked against the shim's own size at run time.
const state_size_max: usize = 2048;

pub const Error = error{ Damaged, Unsupported };

/// One image's decompressor. It points into itself once begun: it must not
/// move between `begin` and `end`.
pub const Decoder = struct {
    state: [state_size_max]u8 align(16) = undefined,
    begun: bool = false,

    /// Reads the header of `data` (which must outlive the decode).
    pub fn begin(d: *Decoder, data: []const u8) Error!Header {
        return d.beginWith(current(), data);
    }

    fn beginWith(d: *Decoder, api: *const Api, data: []const u8) Error!Header {
        assert(!d.begun);
        assert(lxj_state_size() <= state_size_max);
        var h: Header = .{};
        d.begun = true;
        if (lxj_begin(&d.state, api, data.ptr, data.len, memory_max, &h) != 0) {
            return error.Damaged;
        }
        if (h.width == 0 or h.height == 0) return error.Damaged;
        if (@as(u64, h.width) * h.height > pixels_max) return error.Unsupported;
        return h;
    }

    /// Starts decoding at `scale_num`/8, at rows from `y` and (at least) the
    /// columns [x, x + w) of the scaled image.
    pub fn start(d: *Decoder, scale_num: u32, x: u32, w: u32, y: u32) Error!Region {
        assert(d.begun);
        assert(scale_num >= 1 and scale_num <= 8);
        assert(w >= 1);
        var r: Region = .{};
        if (lxj_start(&d.state, scale_num, x, w, y, &r) != 0) return error.Damaged;
        assert(r.x0 <= x and r.x0 + r.width >= x + w);
        assert(r.channels == 3 or r.channels == 4);
        return r;
    }

    /// The next row, `region.width * region.channels` bytes.
    pub fn read(d: *Decoder, row: []u8) Error!void {
        assert(d.begun);
        if (lxj_read(&d.state, row.ptr) != 0) return error.Damaged;
    }

    pub fn end(d: *Decoder) void {
        if (!d.begun) return;
        lxj_end(&d.state);
        d.begun = false;
    }

    /// libjpeg's message for the last error.
    pub fn message(d: *const Decoder) []const u8 {
        return std.mem.span(lxj_message(&d.state));
    }
};

/// The scaled size libjpeg gives a dimension at `scale_num`/8 (rounded up).
pub fn scaled(size: u32, scale_num: u32) u32 {
    assert(scale_num >= 1 and scale_num <= 8);
    return @intCast((@as(u64, size) * scale_num + 7) / 8);
}

// ---------------------------------------------------------------- which decoder

var builtin_api: Api = .{};
var loaded_api: Api = .{};
/// The table decodes use: the built-in one until `useLibrary` succeeds.
var active: std.atomic.Value(?*const Api) = .init(null);
var chosen_path: [512]u8 = undefined;
var chosen_len: usize = 0;
var choose_lock: std.atomic.Mutex = .unlocked;

fn current() *const Api {
    if (active.load(.acquire)) |api| return api;
    lockChoice();
    defer choose_lock.unlock();
    if (active.load(.acquire)) |api| return api;
    lxj_builtin_api(&builtin_api);
    active.store(&builtin_api, .release);
    return &builtin_api;
}

fn lockChoice() void {
    while (!choose_lock.tryLock()) std.atomic.spinLoopHint();
}

pub const LoadError = error{ NotFound, MissingSymbol, Mismatch, Unsupported, AlreadyChosen };

/// Uses the libjpeg at `path` for every later decode, once it decoded the
/// test images exactly as the built-in decoder does. Must be called before
/// the first decode (the choice is once per process): error.AlreadyChosen
/// after it. The library stays loaded for the life of the process.
pub fn useLibrary(path: [:0]const u8) LoadError!void {
    if (builtin.os.tag == .windows) return error.Unsupported;
    lockChoice();
    defer choose_lock.unlock();
    if (active.load(.acquire) != null) return error.AlreadyChosen;
    if (path.len > chosen_path.len) return error.NotFound;
    var lib = std.DynLib.openZ(path.ptr) catch return error.NotFound;
    var api: Api = .{};
    const fields = @as(*[Api.symbols.len]?*const anyopaque, @ptrCast(&api));
    for (Api.symbols, fields) |name, *field| {
        field.* = lib.lookup(*const anyopaque, name) orelse {
            lib.close();
            return error.MissingSymbol;
        };
    }
    lxj_builtin_api(&builtin_api);
    if (!sameDecodes(&api, &builtin_api)) {
        lib.close();
        return error.Mismatch;
    }
    loaded_api = api;
    @memcpy(chosen_path[0..path.len], path);
    chosen_len = path.len;
    active.store(&loaded_api, .release);
}

/// The path of the library in use, or "" for the built-in decoder.
pub fn libraryPath() []const u8 {
    _ = current();
    return if (active.load(.acquire) == &loaded_api) chosen_path[0..chosen_len] else "";
}

/// Whether two decoders give the same pixels for every test image, whole
/// and cropped at each scale (and the same errors for a damaged one).
fn sameDecodes(a: *const Api, b: *const Api) bool {
    var row_a: [4 * test_images.width_max]u8 = undefined;
    var row_b: [4 * test_images.width_max]u8 = undefined;
    for (test_images.all) |image| {
        for ([_]u32{ 8, 4, 3, 1 }) |scale| {
            if (!sameImage(a, b, image, scale, &row_a, &row_b)) return false;
        }
    }
    return true;
}

fn sameImage(
    a: *const Api,
    b: *const Api,
    image: []const u8,
    scale: u32,
    row_a: []u8,
    row_b: []u8,
) bool {
    var da: Decoder = .{};
    var db: Decoder = .{};
    defer da.end();
    defer db.end();
    const ha = da.beginWith(a, image) catch return false;
    const hb = db.beginWith(b, image) catch return false;
    if (!std.meta.eql(ha, hb)) return false;
    const w = scaled(ha.width, scale);
    const x = w / 3;
    const ra = da.start(scale, x, w - x, 1) catch return false;
    const rb = db.start(scale, x, w - x, 1) catch return false;
    if (!std.meta.eql(ra, rb)) return false;
    const n = ra.width * ra.channels;
    for (1..ra.height) |_| {
        da.read(row_a[0..n]) catch return false;
        db.read(row_b[0..n]) catch return false;
        if (!std.mem.eql(u8, row_a[0..n], row_b[0..n])) return false;
    }
    return true;
}

const test_images = @import("test_images.zig");
