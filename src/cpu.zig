//! Run-time x86-64 feature checks for the few hot loops that pick a faster
//! instruction sequence than the portable (baseline) build may assume.
//! Each answer is probed once and cached; on other architectures every check
//! is false at compile time.
const std = @import("std");
const builtin = @import("builtin");

const is_x86_64 = builtin.cpu.arch == .x86_64;

/// Whether this build links avx2.zig, the routines compiled a second time for
/// x86-64-v3 (called only when `hasAvx2`). A build whose target already has
/// AVX2 has no need of it.
pub const avx2_unit = is_x86_64 and !std.Target.x86.featureSetHas(builtin.cpu.features, .avx2);

const Features = packed struct(u8) {
    probed: bool = false,
    erms: bool = false,
    avx2: bool = false,
    amd: bool = false,
    _: u4 = 0,
};

var cached: std.atomic.Value(u8) = .init(0);

/// Fast `rep movsb` (ERMS): large copies move whole lines without reading the
/// destination first.
pub fn hasErms() bool {
    return is_x86_64 and features().erms;
}

/// AVX2 usable: the CPU has it and the OS saves the YMM registers.
pub fn hasAvx2() bool {
    return is_x86_64 and features().avx2;
}

/// Whether streaming (non-temporal) stores beat plain ones into a buffer that
/// is not cached: AVX2 on an AMD (or Hygon) CPU. Their `rep movsb` and plain
/// stores read each destination line before writing it; Intel's fast strings
/// write whole lines of a large copy without reading them, and streaming only
/// costs there. `scripts/bench_ab.py`'s DataLoader, streaming its steps
/// built ahead against the tree without: 1.14x on an AMD EPYC (family 25,
/// model 1; 5 rounds), 0.94x on an Intel Xeon (model 167; 7 rounds).
pub fn streamingPays() bool {
    return is_x86_64 and features().avx2 and features().amd;
}

fn features() Features {
    const known: Features = @bitCast(cached.load(.monotonic));
    if (known.probed) return known;
    var found: Features = .{ .probed = true };
    const leaf0 = cpuid(0, 0);
    const max_leaf = leaf0.eax;
    // The vendor string is EBX, EDX, ECX: "AuthenticAMD", "HygonGenuine".
    const vendor_ebx = leaf0.ebx;
    found.amd = vendor_ebx == std.mem.readInt(u32, "Auth", .little) or
        vendor_ebx == std.mem.readInt(u32, "Hygo", .little);
    if (max_leaf >= 7) {
        const leaf1 = cpuid(1, 0);
        const leaf7 = cpuid(7, 0);
        found.erms = (leaf7.ebx >> 9) & 1 == 1;
        const osxsave = (leaf1.ecx >> 27) & 1 == 1;
        const avx = (leaf1.ecx >> 28) & 1 == 1;
        // XCR0 bits 1 and 2: the OS saves SSE and AVX state on a context switch.
        const os_saves_ymm = osxsave and xcr0() & 0b110 == 0b110;
        found.avx2 = avx and os_saves_ymm and (leaf7.ebx >> 5) & 1 == 1;
    }
    cached.store(@bitCast(found), .monotonic);
    return found;
}

const Registers = struct { eax: u32, ebx: u32, ecx: u32, edx: u32 };

fn cpuid(leaf: u32, subleaf: u32) Registers {
    if (!is_x86_64) unreachable; // features() runs only behind an is_x86_64 check
    var eax: u32 = undefined;
    var ebx: u32 = undefined;
    var ecx: u32 = undefined;
    var edx: u32 = undefined;
    asm volatile ("cpuid"
        : [a] "={eax}" (eax),
          [b] "={ebx}" (ebx),
          [c] "={ecx}" (ecx),
          [d] "={edx}" (edx),
        : [leaf] "{eax}" (leaf),
          [sub] "{ecx}" (subleaf),
    );
    return .{ .eax = eax, .ebx = ebx, .ecx = ecx, .edx = edx };
}

fn xcr0() u32 {
    if (!is_x86_64) unreachable; // features() runs only behind an is_x86_64 check
    return asm volatile ("xgetbv"
        : [lo] "={eax}" (-> u32),
        : [reg] "{ecx}" (@as(u32, 0)),
        : .{ .edx = true });
}

test "probed features agree with the kernel's /proc/cpuinfo flags" {
    if (!is_x86_64) {
        try std.testing.expect(!hasAvx2() and !hasErms() and !streamingPays());
        return;
    }
    if (builtin.os.tag != .linux) return error.SkipZigTest;
    // /proc files report size 0: read until the end rather than by size.
    const io = std.testing.io;
    const file = std.Io.Dir.cwd().openFile(io, "/proc/cpuinfo", .{}) catch return error.SkipZigTest;
    defer file.close(io);
    var buffer: [64 << 10]u8 = undefined;
    var len: usize = 0;
    while (len < buffer.len) {
        const n = file.readStreaming(io, &.{buffer[len..]}) catch |e| switch (e) {
            error.EndOfStream => break,
            else => return e,
        };
        if (n == 0) break;
        len += n;
    }
    const info = buffer[0..len];
    // The first "flags" line: space-separated names, e.g. "... erms ... avx2 ...".
    const start = std.mem.indexOf(u8, info, "\nflags") orelse return error.SkipZigTest;
    const line_end = std.mem.indexOfScalarPos(u8, info, start + 1, '\n') orelse info.len;
    const flags = info[start..line_end];
    var it = std.mem.tokenizeAny(u8, flags, " \t:");
    var erms = false;
    var avx2 = false;
    while (it.next()) |flag| {
        if (std.mem.eql(u8, flag, "erms")) erms = true;
        if (std.mem.eql(u8, flag, "avx2")) avx2 = true;
    }
    try std.testing.expectEqual(erms, hasErms());
    try std.testing.expectEqual(avx2, hasAvx2());
    const amd = std.mem.indexOf(u8, info, "AuthenticAMD") != null or
        std.mem.indexOf(u8, info, "HygonGenuine") != null;
    try std.testing.expectEqual(amd and avx2, streamingPays());
    // The second call answers from the cache, the same.
    try std.testing.expectEqual(erms, hasErms());
}
