//! Codecs: the zstd bindings (hand-written externs; zstd is compiled into the
//! library from the fetched amalgamation), pooled per-thread contexts, and the
//! encode/decode of one record payload.
//!
//! Contexts are expensive to create (~100-200 KiB each) and not thread-safe, so
//! they live in a small global pool: a worker claims one slot with an atomic
//! bit mask, reuses it for a whole block of records, and returns it. Slots are
//! created on first use and kept for the life of the process. Dictionaries are
//! digested once per store into a CDict/DDict, which zstd documents as
//! read-only and shareable by any number of threads.
const std = @import("std");
const builtin = @import("builtin");
const assert = std.debug.assert;
const format = @import("format.zig");
const cpu = @import("cpu.zig");

pub const ZSTD_CCtx = opaque {};
pub const ZSTD_DCtx = opaque {};
pub const ZSTD_CDict = opaque {};
pub const ZSTD_DDict = opaque {};

extern fn ZSTD_versionNumber() c_uint;
extern fn ZSTD_compressBound(src_size: usize) usize;
extern fn ZSTD_isError(code: usize) c_uint;
extern fn ZSTD_getErrorName(code: usize) [*:0]const u8;
extern fn ZSTD_createCCtx() ?*ZSTD_CCtx;
extern fn ZSTD_freeCCtx(cctx: ?*ZSTD_CCtx) usize;
extern fn ZSTD_createDCtx() ?*ZSTD_DCtx;
extern fn ZSTD_freeDCtx(dctx: ?*ZSTD_DCtx) usize;
extern fn ZSTD_compressCCtx(
    cctx: *ZSTD_CCtx,
    dst: [*]u8,
    cap: usize,
    src: [*]const u8,
    size: usize,
    level: c_int,
) usize;
extern fn ZSTD_decompressDCtx(
    dctx: *ZSTD_DCtx,
    dst: [*]u8,
    cap: usize,
    src: [*]const u8,
    size: usize,
) usize;
extern fn ZSTD_createCDict(dict: [*]const u8, size: usize, level: c_int) ?*ZSTD_CDict;
extern fn ZSTD_freeCDict(cdict: ?*ZSTD_CDict) usize;
extern fn ZSTD_createDDict(dict: [*]const u8, size: usize) ?*ZSTD_DDict;
extern fn ZSTD_freeDDict(ddict: ?*ZSTD_DDict) usize;
extern fn ZSTD_compress_usingCDict(
    cctx: *ZSTD_CCtx,
    dst: [*]u8,
    cap: usize,
    src: [*]const u8,
    size: usize,
    cdict: *const ZSTD_CDict,
) usize;
extern fn ZSTD_decompress_usingDDict(
    dctx: *ZSTD_DCtx,
    dst: [*]u8,
    cap: usize,
    src: [*]const u8,
    size: usize,
    ddict: *const ZSTD_DDict,
) usize;
extern fn ZSTD_CCtx_reset(cctx: *ZSTD_CCtx, reset: c_int) usize;
extern fn ZSTD_CCtx_setParameter(cctx: *ZSTD_CCtx, param: c_int, value: c_int) usize;
extern fn ZSTD_CCtx_refCDict(cctx: *ZSTD_CCtx, cdict: ?*const ZSTD_CDict) usize;
extern fn ZSTD_compress2(
    cctx: *ZSTD_CCtx,
    dst: [*]u8,
    cap: usize,
    src: [*]const u8,
    size: usize,
) usize;
extern fn ZSTD_getFrameContentSize(src: [*]const u8, size: usize) c_ulonglong;
extern fn ZSTD_findFrameCompressedSize(src: [*]const u8, size: usize) usize;
extern fn ZSTD_getDictID_fromDict(dict: [*]const u8, size: usize) c_uint;
extern fn ZSTD_minCLevel() c_int;
extern fn ZSTD_maxCLevel() c_int;
extern fn ZDICT_trainFromBuffer(
    dict: [*]u8,
    cap: usize,
    samples: [*]const u8,
    sizes: [*]const usize,
    count: c_uint,
) usize;
extern fn ZDICT_isError(code: usize) c_uint;
extern fn ZDICT_getErrorName(code: usize) [*:0]const u8;

pub const Error = error{ Corrupt, OutOfMemory, BadDictionary, BadLevel };

pub const level_default: i32 = 3;
/// zstd_dict's default level (the original package's): a dictionary store holds
/// small similar records written once and read many times, where the slower
/// level buys the best ratio for a one-time cost at write.
pub const level_default_dict: i32 = 19;
/// Fewest sample bytes trainDict passes to zstd's trainer.
pub const train_samples_min: usize = 32;

pub fn versionNumber() u32 {
    return ZSTD_versionNumber();
}

pub fn levelValid(level: i32) bool {
    return level >= ZSTD_minCLevel() and level <= ZSTD_maxCLevel() and level != 0;
}

pub fn compressBound(size: usize) usize {
    return ZSTD_compressBound(size);
}

/// A fixed pool of contexts of one kind, claimed with an atomic bit mask.
fn Pool(
    comptime Ctx: type,
    comptime create: fn () callconv(.c) ?*Ctx,
    comptime free: fn (?*Ctx) callconv(.c) usize,
) type {
    return struct {
        const slot_count = 64;
        var slots: [slot_count]std.atomic.Value(?*Ctx) = @splat(.init(null));
        var busy: std.atomic.Value(u64) = .init(0);

        pub const Lease = struct {
            ctx: *Ctx,
            /// slot_count means "not pooled": freed on release.
            slot: usize,
        };

        pub fn acquire() error{OutOfMemory}!Lease {
            var mask = busy.load(.monotonic);
            while (mask != std.math.maxInt(u64)) {
                const slot: usize = @ctz(~mask);
                const bit = @as(u64, 1) << @intCast(slot);
                if (busy.cmpxchgWeak(mask, mask | bit, .acquire, .monotonic)) |current| {
                    mask = current;
                    continue;
                }
                assert(slot < slot_count);
                if (slots[slot].load(.acquire)) |ctx| return .{ .ctx = ctx, .slot = slot };
                const ctx = create() orelse {
                    _ = busy.fetchAnd(~bit, .release);
                    return error.OutOfMemory;
                };
                slots[slot].store(ctx, .release);
                return .{ .ctx = ctx, .slot = slot };
            }
            // Every slot is busy (more than 64 concurrent workers): a private one.
            return .{ .ctx = create() orelse return error.OutOfMemory, .slot = slot_count };
        }

        pub fn release(lease: Lease) void {
            if (lease.slot == slot_count) {
                _ = free(lease.ctx);
                return;
            }
            assert(lease.slot < slot_count);
            assert(slots[lease.slot].load(.monotonic) == lease.ctx); // its own slot's context
            const bit = @as(u64, 1) << @intCast(lease.slot);
            const before = busy.fetchAnd(~bit, .release);
            assert(before & bit != 0);
        }
    };
}

pub const CPool = Pool(ZSTD_CCtx, ZSTD_createCCtx, ZSTD_freeCCtx);
pub const DPool = Pool(ZSTD_DCtx, ZSTD_createDCtx, ZSTD_freeDCtx);

/// A store's digested dictionary; null members when the store has none.
pub const Dict = struct {
    cdict: ?*ZSTD_CDict = null,
    ddict: ?*ZSTD_DDict = null,

    /// zstd's dictionary magic number (little-endian) at the start of a trained dictionary.
    pub const magic: u32 = 0xEC30A437;

    /// Digests `bytes`, which must be a trained zstd dictionary (train_dict).
    pub fn init(bytes: []const u8, level: i32) Error!Dict {
        if (bytes.len < 8) return error.BadDictionary;
        if (std.mem.readInt(u32, bytes[0..4], .little) != magic) return error.BadDictionary;
        if (ZSTD_getDictID_fromDict(bytes.ptr, bytes.len) == 0) return error.BadDictionary;
        const ddict = ZSTD_createDDict(bytes.ptr, bytes.len) orelse return error.BadDictionary;
        errdefer _ = ZSTD_freeDDict(ddict);
        const cdict = ZSTD_createCDict(bytes.ptr, bytes.len, level) orelse
            return error.BadDictionary;
        return .{ .cdict = cdict, .ddict = ddict };
    }

    pub fn deinit(d: *Dict) void {
        _ = ZSTD_freeCDict(d.cdict);
        _ = ZSTD_freeDDict(d.ddict);
        d.* = .{};
    }
};

/// Sets a compression context up for a store's codec: its level or
/// dictionary, and zstd's content checksum in every frame (so a damaged record
/// fails to decode instead of decoding to wrong bytes). The parameters stick
/// to the context, so a worker configures once per block of records.
pub fn configure(cctx: *ZSTD_CCtx, codec: format.Codec, level: i32, dict: *const Dict) void {
    assert(codec != .raw);
    const reset_session_and_parameters = 3;
    const c_compression_level = 100;
    const c_checksum_flag = 201;
    _ = ZSTD_CCtx_reset(cctx, reset_session_and_parameters);
    _ = ZSTD_CCtx_setParameter(cctx, c_checksum_flag, 1);
    switch (codec) {
        .raw => unreachable, // asserted above: raw records are never compressed
        .zstd => _ = ZSTD_CCtx_setParameter(cctx, c_compression_level, level),
        .zstd_dict => _ = ZSTD_CCtx_refCDict(cctx, dict.cdict.?),
    }
}

/// Compresses `src` into `dst` (capacity compressBound(src.len)) with a context
/// set up by `configure`. Returns the frame size, or null when the frame would
/// not be smaller than `src` (the record is then stored raw, so compression
/// never costs space).
pub fn encode(cctx: *ZSTD_CCtx, src: []const u8, dst: []u8) ?usize {
    assert(dst.len >= compressBound(src.len));
    const n = ZSTD_compress2(cctx, dst.ptr, dst.len, src.ptr, src.len);
    // With a dst of compressBound() zstd cannot fail short of a bug; fall back to raw anyway.
    if (ZSTD_isError(n) != 0) return null;
    assert(n <= dst.len);
    if (n >= src.len) return null;
    // One frame whose last bytes happen to read as a seek table would be
    // taken for a seekable record (astronomically rare): store it raw.
    if (format.SeekTable.parse(dst[0..n]) != null) return null;
    return n;
}

/// Frames a record of `size` bytes is cut into with frames of `frame_size`
/// (0: one frame).
pub fn frameCount(size: usize, frame_size: u64) usize {
    if (frame_size == 0 or size <= frame_size) return 1;
    const n: usize = @intCast((size - 1) / frame_size + 1);
    // n frames of frame_size hold the record, and n - 1 do not.
    assert(n * frame_size >= size);
    assert((n - 1) * frame_size < size);
    return n;
}

/// The room `encodeSeekable` needs for a record of `size` bytes.
pub fn seekableBound(size: usize, frame_size: u64) usize {
    const n = frameCount(size, frame_size);
    return n * compressBound(@intCast(@min(size, frame_size))) + format.SeekTable.sizeFor(n);
}

/// Compresses `src` in the seekable format (format.zig): frames of
/// `frame_size` raw bytes, then the seek table. `dst` has seekableBound()
/// bytes. Null when the whole would not be smaller than `src` (stored raw).
pub fn encodeSeekable(cctx: *ZSTD_CCtx, src: []const u8, dst: []u8, frame_size: u64) ?usize {
    const n = frameCount(src.len, frame_size);
    assert(n > 1);
    assert(n <= std.math.maxInt(u32)); // the seek table counts frames in 32 bits
    assert(dst.len >= seekableBound(src.len, frame_size));
    const frame: usize = @intCast(frame_size);
    // The table is built in the last bytes of `dst`, which the frames never
    // reach (the bound holds both), then moved to just after the frames.
    const table_len = format.SeekTable.sizeFor(n);
    const table = dst[dst.len - table_len ..];
    format.SeekTable.writeFrame(table, n);
    var at: usize = 0;
    for (0..n) |k| {
        assert(k * frame < src.len);
        const piece = src[k * frame ..][0..@min(frame, src.len - k * frame)];
        const room = dst[at .. dst.len - table_len];
        const size = ZSTD_compress2(cctx, room.ptr, room.len, piece.ptr, piece.len);
        if (ZSTD_isError(size) != 0) return null;
        assert(size <= room.len);
        format.SeekTable.putEntry(table, k, @intCast(size), @intCast(piece.len));
        at += size;
    }
    if (at + table_len >= src.len) return null; // no gain: stored raw
    assert(at <= dst.len - table_len); // the frames stayed out of the table's room
    std.mem.copyForwards(u8, dst[at..][0..table_len], table);
    // What a reader will parse: the frames, then this table.
    assert(format.SeekTable.parse(dst[0 .. at + table_len]) != null);
    return at + table_len;
}

/// True when a stored payload of `codec` can decode to `raw_size` bytes: the
/// sizes agree for raw records, and the zstd frame header names `raw_size`.
/// Cheap (reads a few header bytes); lets callers refuse a damaged table entry
/// before they size anything by it.
pub fn plausible(codec: format.Codec, stored: []const u8, raw_size: u64) bool {
    return switch (codec) {
        .raw => stored.len == raw_size,
        .zstd, .zstd_dict => blk: {
            if (format.SeekTable.parse(stored)) |t| break :blk t.check(raw_size);
            // Frames always name their size (we write them so); zstd's
            // "unknown" and "error" values are never a record's size.
            if (raw_size >= content_size_unknown - 1) break :blk false;
            if (raw_size > decodedSizeMax(stored.len)) break :blk false;
            break :blk ZSTD_getFrameContentSize(stored.ptr, stored.len) == raw_size;
        },
    };
}

const content_size_unknown: u64 = std.math.maxInt(u64);

/// The full check of a seekable payload (verify): its table adds up to the
/// record, and each entry names exactly the zstd frame at its place (its
/// compressed and decoded sizes), so a window that decodes one frame by the
/// table reads what decoding the whole record would. O(frames); true for a
/// payload without a seek table.
pub fn seekTableMatches(stored: []const u8, raw_size: u64) bool {
    const t = format.SeekTable.parse(stored) orelse return true;
    if (!t.check(raw_size)) return false;
    var at: usize = 0;
    for (0..t.count()) |k| {
        const frame = stored[at..@intCast(t.frames_size)];
        const size = ZSTD_findFrameCompressedSize(frame.ptr, frame.len);
        if (ZSTD_isError(size) != 0 or size != t.compressed(k)) return false;
        if (ZSTD_getFrameContentSize(frame.ptr, size) != t.decompressed(k)) return false;
        at += size;
    }
    return true;
}

/// The most a zstd frame of `stored` bytes can decode to: every block holds at
/// most 128 KiB and takes at least 4 bytes (a 3-byte header and one RLE byte).
fn decodedSizeMax(stored: usize) u64 {
    const blocks = stored / 4 + 1;
    return std.math.mul(u64, blocks, 128 << 10) catch std.math.maxInt(u64);
}

/// Decodes one stored payload into exactly `dst` (the record's raw size).
pub fn decode(
    dctx: ?*ZSTD_DCtx,
    codec: format.Codec,
    dict: *const Dict,
    src: []const u8,
    dst: []u8,
) Error!void {
    assert(codec == .raw or dctx != null); // zstd frames need a context
    switch (codec) {
        .raw => {
            if (src.len != dst.len) return error.Corrupt;
            copy(dst, src);
        },
        .zstd, .zstd_dict => {
            const n = if (codec == .zstd)
                ZSTD_decompressDCtx(dctx.?, dst.ptr, dst.len, src.ptr, src.len)
            else blk: {
                const ddict = dict.ddict orelse return error.Corrupt;
                break :blk ZSTD_decompress_usingDDict(
                    dctx.?,
                    dst.ptr,
                    dst.len,
                    src.ptr,
                    src.len,
                    ddict,
                );
            };
            if (ZSTD_isError(n) != 0) return error.Corrupt;
            if (n != dst.len) return error.Corrupt;
        },
    }
}

/// Copies a record. Large copies to a cache-line-aligned destination on
/// x86-64 CPUs with fast `rep movsb` (ERMS) use it: it moves whole lines
/// without first reading the destination, which is most of a random-row
/// gather's cost (measured 1.4x over the vector loop of the bundled memcpy
/// on random 12 KiB rows, one thread). Not to a destination off a line: on
/// the AMD EPYC (family 25) `rep movsb` to one 16 bytes past a line ran at
/// a fifth of the vector loop (gathers of 12 KiB rows into a numpy `out=`
/// array, 4.3 against 20.6 GiB/s), and the batches of `out=` and of the
/// caller's recycled loader buffers start wherever numpy put them.
pub fn copy(dst: []u8, src: []const u8) void {
    assert(dst.len == src.len);
    if (dst.len >= 16 and dst.len <= small_copy_max) return smallCopy(dst, src);
    const aligned = @intFromPtr(dst.ptr) % 64 == 0;
    if (builtin.cpu.arch == .x86_64 and dst.len >= rep_movsb_min and aligned and cpu.hasErms()) {
        var d = dst.ptr;
        var s = src.ptr;
        var n = dst.len;
        asm volatile ("rep movsb"
            : [d] "+{rdi}" (d),
              [s] "+{rsi}" (s),
              [n] "+{rcx}" (n),
            :
            : .{ .memory = true });
        return;
    }
    @memcpy(dst, src);
}

const rep_movsb_min = 2048;

/// Copies `src` to `dst` like `copy`, for a destination written now and read
/// only much later (a loader's step buffer, which waits its turn in the
/// ring): records of at least `stream_min` bytes go to memory with AVX2
/// non-temporal stores, which do not read the destination's lines first and
/// leave the cache to the records still to be copied. The caller runs
/// `streamFence` before another thread may read `dst`.
///
/// Why: a ring's step buffers take turns (8 of 3 MiB with the default
/// prefetch), so the next step's lines are no longer cached. One thread
/// gathering 256 random 12 KiB rows (AMD EPYC, 2 vCPU): `rep movsb` took
/// 223-239 us a batch into 2 buffers in turn and 278-319 us into 8; 32-byte
/// streaming stores 209-212 and 219-248 us (16-byte ones 250-277 us).
pub fn copyStream(dst: []u8, src: []const u8) void {
    assert(dst.len == src.len);
    if (!(cpu.avx2_unit and cpu.hasAvx2()) or dst.len < stream_min) return copy(dst, src);
    const head = (32 - @intFromPtr(dst.ptr) % 32) % 32;
    const body = (dst.len - head) / 64 * 64;
    @memcpy(dst[0..head], src[0..head]);
    loaderx_stream_copy_avx2(dst.ptr + head, src.ptr + head, body);
    @memcpy(dst[head + body ..], src[head + body ..]);
}

/// Orders this thread's streaming stores (`copyStream`) before its later
/// stores, such as the release of a step to the consumer.
pub fn streamFence() void {
    if (cpu.avx2_unit) asm volatile ("sfence" ::: .{ .memory = true });
}

/// Records below this size are copied by `copyStream` as by `copy`.
pub const stream_min = 4096;

/// Defined (hidden, never exported) in avx2.zig: `len` (a multiple of 64)
/// bytes to a 32-byte-aligned `dst` with non-temporal stores.
extern fn loaderx_stream_copy_avx2(dst: [*]u8, src: [*]const u8, len: usize) void;

/// Records up to this size are copied inline in 16-byte moves (the last one
/// overlapping), with no call into memcpy and its size dispatch: 256 random
/// 200 B rows gathered 3-5 % faster (2-vCPU Xeon, interleaved runs).
const small_copy_max = 256;

fn smallCopy(dst: []u8, src: []const u8) void {
    const V = @Vector(16, u8);
    const n = dst.len;
    assert(n >= 16 and src.len == n);
    var at: usize = 0;
    while (at + 16 < n) : (at += 16) {
        const v: V = @as(*align(1) const V, @ptrCast(src.ptr + at)).*;
        @as(*align(1) V, @ptrCast(dst.ptr + at)).* = v;
    }
    const last: V = @as(*align(1) const V, @ptrCast(src.ptr + n - 16)).*;
    @as(*align(1) V, @ptrCast(dst.ptr + n - 16)).* = last;
}

/// Trains a zstd dictionary of at most `out.len` bytes from samples laid end to
/// end in `samples` with sizes `sizes`. Returns the dictionary size; on failure
/// `why` names zstd's reason.
pub fn trainDict(
    samples: []const u8,
    sizes: []const usize,
    out: []u8,
    why: *[*:0]const u8,
) error{TrainingFailed}!usize {
    var total: u64 = 0;
    for (sizes) |n| total += n;
    assert(total == samples.len); // the samples lie end to end (lx_train_dict sums them)
    if (sizes.len == 0 or sizes.len > std.math.maxInt(c_uint)) {
        why.* = "no samples";
        return error.TrainingFailed;
    }
    // zstd's trainer reads out of bounds on a few bytes of samples (8 one-byte
    // samples crash it); refuse such inputs before they reach it.
    if (samples.len < train_samples_min) {
        why.* = "samples too small (at least 32 bytes in all are needed)";
        return error.TrainingFailed;
    }
    const n = ZDICT_trainFromBuffer(out.ptr, out.len, samples.ptr, sizes.ptr, @intCast(sizes.len));
    if (ZDICT_isError(n) != 0) {
        why.* = ZDICT_getErrorName(n);
        return error.TrainingFailed;
    }
    assert(n <= out.len);
    return n;
}

/// Decodes records another writer stored (the original package's stores, for
/// `loaderx convert`): record i is the `src_sizes[i]` bytes at `src_offsets[i]`
/// of `src`, stored with `codecs[i]` (0 raw, 1 zstd, 2 zstd with `dict`, a
/// trained or raw-content zstd dictionary, empty for none), and must decode to
/// exactly `dst_sizes[i]` bytes; the records are laid end to end in `dst`. On a
/// record that does not, `bad.*` is its index and `why` says why.
pub fn decodeFrames(
    src: []const u8,
    src_offsets: []const u64,
    src_sizes: []const u64,
    codecs: []const u8,
    dst: []u8,
    dst_sizes: []const u64,
    dict: []const u8,
    bad: *u64,
    why: *[*:0]const u8,
) Error!void {
    assert(src_offsets.len == src_sizes.len);
    assert(codecs.len == src_sizes.len);
    assert(dst_sizes.len == src_sizes.len);
    const ddict: ?*ZSTD_DDict = if (dict.len == 0)
        null
    else
        ZSTD_createDDict(dict.ptr, dict.len) orelse return error.BadDictionary;
    defer _ = ZSTD_freeDDict(ddict);
    const lease = try DPool.acquire();
    defer DPool.release(lease);
    var at: usize = 0;
    for (src_offsets, src_sizes, codecs, dst_sizes, 0..) |off, size, c, ds, i| {
        bad.* = i;
        if (off > src.len or size > src.len - off) {
            why.* = "its stored bytes lie past the end of the data";
            return error.Corrupt;
        }
        const in = src[@intCast(off)..][0..@intCast(size)];
        assert(at + ds <= dst.len); // the caller sized dst as the sum of dst_sizes
        const out = dst[at..][0..@intCast(ds)];
        at += out.len;
        const n = switch (c) {
            0 => {
                if (in.len != out.len) {
                    why.* = "it is stored raw but its stored and record sizes differ";
                    return error.Corrupt;
                }
                copy(out, in);
                continue;
            },
            1 => ZSTD_decompressDCtx(lease.ctx, out.ptr, out.len, in.ptr, in.len),
            2 => blk: {
                const d = ddict orelse {
                    why.* = "it needs the dictionary, and there is none";
                    return error.Corrupt;
                };
                break :blk ZSTD_decompress_usingDDict(
                    lease.ctx,
                    out.ptr,
                    out.len,
                    in.ptr,
                    in.len,
                    d,
                );
            },
            else => {
                why.* = "its codec is unknown";
                return error.Corrupt;
            },
        };
        if (ZSTD_isError(n) != 0 or n != out.len) {
            why.* = if (ZSTD_isError(n) != 0)
                ZSTD_getErrorName(n)
            else
                "the frame is shorter than the record";
            return error.Corrupt;
        }
    }
}

test "encode falls back to raw for incompressible input and round-trips compressible input" {
    const gpa = std.testing.allocator;
    const lease = try CPool.acquire();
    defer CPool.release(lease);
    const dlease = try DPool.acquire();
    defer DPool.release(dlease);
    const no_dict: Dict = .{};

    var noise: [4096]u8 = undefined;
    var prng = std.Random.DefaultPrng.init(1);
    prng.random().bytes(&noise);
    const dst = try gpa.alloc(u8, compressBound(noise.len));
    defer gpa.free(dst);
    configure(lease.ctx, .zstd, 3, &no_dict);
    try std.testing.expect(encode(lease.ctx, &noise, dst) == null);

    const text: [2400]u8 = @bitCast(@as([200][12]u8, @splat("abcabcabcabc".*)));
    const n = encode(lease.ctx, &text, dst).?;
    try std.testing.expect(n < text.len);
    var back: [text.len]u8 = undefined;
    try decode(dlease.ctx, .zstd, &no_dict, dst[0..n], &back);
    try std.testing.expectEqualStrings(&text, &back);
    // A damaged frame is an error, never a crash.
    dst[n / 2] ^= 0xFF;
    var out2: [text.len]u8 = undefined;
    const damaged = decode(dlease.ctx, .zstd, &no_dict, dst[0..n], &out2);
    if (damaged) |_| {} else |e| try std.testing.expectEqual(error.Corrupt, e);
    // Wrong raw size is an error.
    try std.testing.expectError(
        error.Corrupt,
        decode(dlease.ctx, .zstd, &no_dict, dst[0..1], back[0..5]),
    );
}

test "training on a few bytes is refused, not passed to zstd" {
    var sample_bytes: [8]u8 = .{ 1, 2, 3, 4, 5, 6, 7, 8 };
    const sizes: [8]usize = @splat(1);
    var out: [4096]u8 = undefined;
    var why: [*:0]const u8 = "";
    try std.testing.expectError(error.TrainingFailed, trainDict(&sample_bytes, &sizes, &out, &why));
    try std.testing.expect(std.mem.span(why).len > 0);
}

test "a dictionary that is not one is refused" {
    try std.testing.expectError(error.BadDictionary, Dict.init("not a dictionary at all", 3));
}

test "pool hands out distinct contexts" {
    const a = try DPool.acquire();
    const b = try DPool.acquire();
    try std.testing.expect(a.ctx != b.ctx);
    DPool.release(a);
    DPool.release(b);
}

test "copy matches the source at every size and alignment around both cut-overs" {
    const gpa = std.testing.allocator;
    const src = try gpa.alloc(u8, 3 * rep_movsb_min + 64);
    defer gpa.free(src);
    const dst = try gpa.alloc(u8, src.len);
    defer gpa.free(dst);
    for (src, 0..) |*b, i| b.* = @truncate(i *% 131 +% 7);
    const sizes = [_]usize{
        0,                  1,                 15,                 16,                17,
        31,                 32,                33,                 63,                200,
        small_copy_max - 1, small_copy_max,    small_copy_max + 1, rep_movsb_min - 1, rep_movsb_min,
        rep_movsb_min + 1,  3 * rep_movsb_min,
    };
    for (sizes) |n| {
        for ([_]usize{ 0, 1, 7, 33 }) |skew| {
            @memset(dst, 0xAA);
            copy(dst[skew..][0..n], src[33 - skew ..][0..n]);
            try std.testing.expectEqualSlices(u8, src[33 - skew ..][0..n], dst[skew..][0..n]);
            // Nothing outside the destination range is touched.
            for (dst[0..skew]) |b| try std.testing.expectEqual(@as(u8, 0xAA), b);
            for (dst[skew + n ..]) |b| try std.testing.expectEqual(@as(u8, 0xAA), b);
        }
    }
}

test "copyStream matches the source at every size and alignment around its cut-overs" {
    const gpa = std.testing.allocator;
    const src = try gpa.alloc(u8, 3 * stream_min + 128);
    defer gpa.free(src);
    const dst = try gpa.alloc(u8, src.len);
    defer gpa.free(dst);
    for (src, 0..) |*b, i| b.* = @truncate(i *% 131 +% 7);
    const sizes = [_]usize{
        0,               200,             stream_min - 1,  stream_min,         stream_min + 1,
        stream_min + 31, stream_min + 63, stream_min + 64, 3 * stream_min + 5, 3 * stream_min,
    };
    for (sizes) |n| {
        for ([_]usize{ 0, 1, 7, 31, 32, 33, 63 }) |skew| {
            @memset(dst, 0xAA);
            copyStream(dst[skew..][0..n], src[63 - skew ..][0..n]);
            streamFence();
            try std.testing.expectEqualSlices(u8, src[63 - skew ..][0..n], dst[skew..][0..n]);
            // Nothing outside the destination range is touched.
            for (dst[0..skew]) |b| try std.testing.expectEqual(@as(u8, 0xAA), b);
            for (dst[skew + n ..]) |b| try std.testing.expectEqual(@as(u8, 0xAA), b);
        }
    }
}

test "decodeFrames decodes stored records end to end and names the first bad one" {
    const lease = try CPool.acquire();
    defer CPool.release(lease);
    const no_dict: Dict = .{};
    configure(lease.ctx, .zstd, 3, &no_dict);
    const a: [300]u8 = @splat('a');
    const b: [500]u8 = @splat('b');
    var src: [2 * 64 + 800 + 5]u8 = undefined;
    @memcpy(src[0..5], "raw!!");
    const na = encode(lease.ctx, &a, src[5..][0..compressBound(a.len)]).?;
    const nb = encode(lease.ctx, &b, src[5 + na ..][0..compressBound(b.len)]).?;
    var out: [805]u8 = undefined;
    var bad: u64 = 99;
    var why: [*:0]const u8 = "";
    // Out of stored order, raw and zstd mixed.
    const offsets = [_]u64{ 5 + na, 0, 5 };
    const sizes = [_]u64{ nb, 5, na };
    const codecs = [_]u8{ 1, 0, 1 };
    try decodeFrames(&src, &offsets, &sizes, &codecs, &out, &.{ 500, 5, 300 }, "", &bad, &why);
    try std.testing.expectEqualSlices(u8, &b, out[0..500]);
    try std.testing.expectEqualSlices(u8, "raw!!", out[500..505]);
    try std.testing.expectEqualSlices(u8, &a, out[505..]);
    // A frame that decodes to more bytes than its record says, a stored range
    // past the end, a dictionary record with no dictionary, a damaged frame.
    const Corrupt = error.Corrupt;
    const expectError = std.testing.expectError;
    const end = src.len - 2;
    const o10 = out[0..10];
    try expectError(Corrupt, decodeFrames(&src, &offsets, &sizes, &codecs, &out, &.{
        499, 5, 300,
    }, "", &bad, &why));
    try std.testing.expectEqual(@as(u64, 0), bad);
    try expectError(Corrupt, decodeFrames(&src, &.{ 0, end }, &.{ 5, 5 }, &.{ 0, 0 }, o10, &.{
        5, 5,
    }, "", &bad, &why));
    try std.testing.expectEqual(@as(u64, 1), bad);
    try expectError(Corrupt, decodeFrames(&src, &.{5}, &.{na}, &.{2}, out[0..300], &.{
        300,
    }, "", &bad, &why));
    src[5 + na + 2] ^= 0xFF;
    try expectError(Corrupt, decodeFrames(&src, &offsets, &sizes, &codecs, &out, &.{
        500, 5, 300,
    }, "", &bad, &why));
    try std.testing.expectEqual(@as(u64, 0), bad);
    try std.testing.expect(std.mem.span(why).len > 0);
}
