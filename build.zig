//! Build for libloaderx: the record engine, codecs, sampler, executor and image
//! stage in one shared library, with zstd and libjpeg-turbo's decoder (the path
//! dependencies `zstd` and `libjpeg_turbo` of build.zig.zon, fetched into vendor/ by
//! scripts/fetch_vendor.py) compiled in from source so that every target
//! cross-compiles from one machine.
//!
//!   zig build            host library into loaderx/lib/ (portable target, not the host CPU)
//!   zig build test       the native test suite, Debug and ReleaseSafe (-Dtest-fast: ReleaseFast too)
//!   zig build dist       every release target into zig-out/dist/<wheel platform tag>/
//!   zig build bindings   regenerate loaderx/_abi.py from src/capi.zig, src/capi/ (committed)
//!   zig build bindings-print   the same file into <prefix>/bindings/ (tests compare)
//!   zig build forger-layout    regenerate tests/_lxlayout.py from src/format.zig (committed)
//!   zig build forger-layout-print   the same file into <prefix>/layout/ (tests compare)
const std = @import("std");
const builtin = @import("builtin");

/// The one table of release targets: Zig target triple -> wheel platform tag.
/// scripts/build_wheels.py reads it from this file: one wheel per row, built through
/// setup.py with LOADERX_ZIG_TARGET=<triple> and tagged py3-none-<tag>.
pub const release_targets = [_]struct { triple: []const u8, tag: []const u8 }{
    .{ .triple = "x86_64-linux-gnu.2.17", .tag = "manylinux_2_17_x86_64" },
    .{ .triple = "aarch64-linux-gnu.2.17", .tag = "manylinux_2_17_aarch64" },
    .{ .triple = "x86_64-linux-musl", .tag = "musllinux_1_2_x86_64" },
    .{ .triple = "aarch64-linux-musl", .tag = "musllinux_1_2_aarch64" },
    .{ .triple = "x86_64-macos.11.0", .tag = "macosx_11_0_x86_64" },
    .{ .triple = "aarch64-macos.11.0", .tag = "macosx_11_0_arm64" },
    .{ .triple = "x86_64-windows-gnu", .tag = "win_amd64" },
    .{ .triple = "aarch64-windows-gnu", .tag = "win_arm64" },
};

/// A portable query for the machine running the build: the host's architecture
/// and OS with the baseline CPU and, on glibc Linux, the oldest glibc we support.
fn portableHostQuery() std.Target.Query {
    const triple = switch (builtin.os.tag) {
        .linux => if (builtin.abi.isMusl())
            @tagName(builtin.cpu.arch) ++ "-linux-musl"
        else
            @tagName(builtin.cpu.arch) ++ "-linux-gnu.2.17",
        .macos => @tagName(builtin.cpu.arch) ++ "-macos.11.0",
        .windows => @tagName(builtin.cpu.arch) ++ "-windows-gnu",
        else => @tagName(builtin.cpu.arch) ++ "-" ++ @tagName(builtin.os.tag),
    };
    return std.Target.Query.parse(.{ .arch_os_abi = triple }) catch @panic("bad host triple");
}

/// zstd comes from the `zstd` path dependency of build.zig.zon (vendor/zstd,
/// fetched and verified by scripts/fetch_vendor.py; the package manager serves
/// a path dependency in place, so it never downloads anything itself).
fn addZstd(
    b: *std.Build,
    mod: *std.Build.Module,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
) void {
    const zstd = b.dependency("zstd", .{});
    mod.addIncludePath(zstd.path(""));
    mod.linkLibrary(zstdLib(b, target, optimize));
}

/// zstd as a static library, one per target and mode (Debug: UBSan on zstd;
/// every other mode links the ReleaseFast one). The library, the tests of
/// every mode and the bindings generator link the same few: each is
/// compiled once per build and found in the cache by the next (zstd is the
/// slowest thing the build compiles).
fn zstdLib(
    b: *std.Build,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
) *std.Build.Step.Compile {
    const mode: std.builtin.OptimizeMode = if (optimize == .debug) .debug else .fast;
    const Entry = struct {
        b: *std.Build,
        query: std.Target.Query,
        mode: std.builtin.OptimizeMode,
        lib: *std.Build.Step.Compile,
    };
    const Made = struct {
        var list: [16]Entry = undefined;
        var len: usize = 0;
    };
    for (Made.list[0..Made.len]) |m| {
        if (m.b == b and m.mode == mode and m.query.eql(target.query)) return m.lib;
    }
    const zstd = b.dependency("zstd", .{});
    const mod = b.createModule(.{
        .target = target,
        .optimize = mode,
        .link_libc = true,
        .pic = true,
        .strip = mode != .debug,
    });
    mod.addIncludePath(zstd.path(""));
    mod.addCSourceFile(.{
        .file = zstd.path("zstd.c"),
        // zstd.h forces default visibility; these keep every zstd symbol private
        // so the library exports only lx_* functions.
        // Debug (UBSan on) at -O0: at -O3 with UBSan zstd took 60 s to compile
        // (-O1: 54 s, -O0: 11 s; its tests then run 27 s instead of 14).
        .flags = &.{
            if (mode == .debug) "-O0" else "-O3", "-fvisibility=hidden",
            "-DZSTDLIB_VISIBLE=",                 "-DZSTDERRORLIB_VISIBLE=",
            "-DZDICTLIB_VISIBLE=",
        },
    });
    const lib = b.addLibrary(.{ .name = "zstd", .linkage = .static, .root_module = mod });
    if (Made.len < Made.list.len) {
        Made.list[Made.len] = .{ .b = b, .query = target.query, .mode = mode, .lib = lib };
        Made.len += 1;
    }
    return lib;
}

fn createModule(
    b: *std.Build,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
) *std.Build.Module {
    return createModuleAt(b, "src/capi.zig", target, optimize);
}

fn createModuleAt(
    b: *std.Build,
    root: []const u8,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
) *std.Build.Module {
    const mod = b.createModule(.{
        .root_source_file = b.path(root),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
        .pic = true,
        .strip = optimize != .debug,
    });
    addZstd(b, mod, target, optimize);
    mod.linkLibrary(jpegLib(b, target, optimize));
    if (target.result.cpu.arch == .x86_64) addAvx2Unit(b, mod, target, optimize);
    return mod;
}

/// libjpeg-turbo's decompressor (portable C: its x86 SIMD is NASM, which Zig
/// cannot assemble; src/image/jpeg.zig uses a SIMD build found at run time
/// when there is one, see docs/design.md) and src/image/jpeg_shim.c, the C
/// that catches libjpeg's longjmp errors, as a static library per target and
/// mode. Its configuration headers come from libjpeg-turbo's own templates.
fn jpegLib(
    b: *std.Build,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
) *std.Build.Step.Compile {
    // Always optimized: the Debug tests check our code (zstd keeps its UBSan
    // build), and a Debug libjpeg-turbo cost `zig build test` 21 s of compile.
    _ = optimize;
    const mode: std.builtin.OptimizeMode = .fast;
    const Made = struct {
        var list: [16]struct { b: *std.Build, query: std.Target.Query, mode: std.builtin.OptimizeMode, lib: *std.Build.Step.Compile } = undefined;
        var len: usize = 0;
    };
    for (Made.list[0..Made.len]) |m| {
        if (m.b == b and m.mode == mode and m.query.eql(target.query)) return m.lib;
    }
    const src = b.dependency("libjpeg_turbo", .{});
    const mod = b.createModule(.{
        .target = target,
        .optimize = mode,
        .link_libc = true,
        .pic = true,
        .strip = mode != .debug,
    });
    const windows = target.result.os.tag == .windows;
    mod.addConfigHeader(b.addConfigHeader(.{
        .style = .{ .cmake = src.path("jconfig.h.in") },
        .include_path = "jconfig.h",
    }, .{
        .JPEG_LIB_VERSION = 62,
        .VERSION = "2.1.5",
        .LIBJPEG_TURBO_VERSION_NUMBER = 2001005,
        .C_ARITH_CODING_SUPPORTED = null,
        .D_ARITH_CODING_SUPPORTED = true,
        .MEM_SRCDST_SUPPORTED = true,
        .WITH_SIMD = null,
        .BITS_IN_JSAMPLE = 8,
        .RIGHT_SHIFT_IS_UNSIGNED = null,
    }));
    mod.addConfigHeader(b.addConfigHeader(.{
        .style = .{ .cmake = src.path("jconfigint.h.in") },
        .include_path = "jconfigint.h",
    }, .{
        .BUILD = "loaderx",
        .INLINE = "__inline__ __attribute__((always_inline))",
        .THREAD_LOCAL = "_Thread_local",
        .CMAKE_PROJECT_NAME = "libjpeg-turbo",
        .VERSION = "2.1.5",
        .SIZE_T = target.result.ptrBitWidth() / 8,
        // __builtin_ctzl counts an `unsigned long`: 32 bits on Windows, not size_t.
        .HAVE_BUILTIN_CTZL = if (windows) null else true,
        .HAVE_INTRIN_H = null,
    }));
    mod.addConfigHeader(b.addConfigHeader(.{
        .style = .{ .cmake = src.path("jversion.h.in") },
        .include_path = "jversion.h",
    }, .{ .COPYRIGHT_YEAR = "1991-2022" }));
    mod.addIncludePath(src.path(""));
    const flags: []const []const u8 = &.{ "-O3", "-fvisibility=hidden" };
    mod.addCSourceFiles(.{ .root = src.path(""), .files = &jpeg_sources, .flags = flags });
    mod.addCSourceFile(.{ .file = b.path("src/image/jpeg_shim.c"), .flags = flags });
    const lib = b.addLibrary(.{ .name = "jpeg", .linkage = .static, .root_module = mod });
    if (Made.len < Made.list.len) {
        Made.list[Made.len] = .{ .b = b, .query = target.query, .mode = mode, .lib = lib };
        Made.len += 1;
    }
    return lib;
}

/// The decompressor's part of libjpeg-turbo (its CMakeLists' JPEG_SOURCES
/// without the compressor, plus arithmetic decoding and the SIMD stub).
const jpeg_sources = [_][]const u8{
    "jaricom.c",    "jcomapi.c",  "jdapimin.c", "jdapistd.c", "jdarith.c",
    "jdatasrc.c",   "jdcoefct.c", "jdcolor.c",  "jddctmgr.c", "jdhuff.c",
    "jdicc.c",      "jdinput.c",  "jdmainct.c", "jdmarker.c", "jdmaster.c",
    "jdmerge.c",    "jdphuff.c",  "jdpostct.c", "jdsample.c", "jdtrans.c",
    "jerror.c",     "jidctflt.c", "jidctfst.c", "jidctint.c", "jidctred.c",
    "jmemmgr.c",    "jmemnobs.c", "jquant1.c",  "jquant2.c",  "jutils.c",
    "jsimd_none.c",
};

/// src/avx2.zig compiled for x86-64-v3 and linked into the library; the
/// portable code calls it only on CPUs with AVX2 (see cpu.zig).
fn addAvx2Unit(
    b: *std.Build,
    mod: *std.Build.Module,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
) void {
    var query = target.query;
    query.cpu_model = .{ .explicit = &std.Target.x86.cpu.x86_64_v3 };
    query.cpu_features_add = .empty;
    query.cpu_features_sub = .empty;
    const obj = b.addObject(.{
        .name = "avx2",
        .root_module = b.createModule(.{
            .root_source_file = b.path("src/avx2.zig"),
            .target = b.resolveTargetQuery(query),
            .optimize = optimize,
            .pic = true,
            .strip = optimize != .debug,
        }),
        // LLVM in every mode: the self-hosted x86 backend of Debug builds
        // does not assemble the unit's AVX instructions (vmovntdq).
        .use_llvm = true,
    });
    mod.addObject(obj);
}

fn addLib(
    b: *std.Build,
    target: std.Build.ResolvedTarget,
    optimize: std.builtin.OptimizeMode,
) *std.Build.Step.Compile {
    return b.addLibrary(.{
        .name = "loaderx",
        .linkage = .dynamic,
        .root_module = createModule(b, target, optimize),
    });
}

pub fn build(b: *std.Build) void {
    const target = b.standardTargetOptions(.{ .default_target = portableHostQuery() });
    const optimize = b.option(
        std.builtin.OptimizeMode,
        "optimize",
        "Optimization mode (default ReleaseFast)",
    ) orelse .fast;

    // zig build: the host library, installed next to the Python package.
    const lib = addLib(b, target, optimize);
    const install = b.addInstallArtifact(lib, .{
        .dest_dir = .{ .override = .{ .custom = "../loaderx/lib" } },
        .implib_dir = .disabled,
        .pdb_dir = .disabled,
    });
    b.getInstallStep().dependOn(&install.step);

    // zig build test: the native suite in Debug (safety checks, UBSan on zstd)
    // and ReleaseSafe (every assert and safety check, at the optimizer's
    // speed: the contract holds in optimized code too). -Dtest-fast adds
    // ReleaseFast (the code that ships, which the Python suite runs through
    // the library: a third optimized compile, about 40 s on 2 cores, so CI
    // leaves it to releases). -Dtest-filter=NAME runs only the tests whose
    // names contain NAME.
    const test_step = b.step("test", "Run the native test suite (Debug, ReleaseSafe)");
    const filter = b.option([]const u8, "test-filter", "Run only tests whose names contain this");
    const filters: []const []const u8 = if (filter) |f| b.dupeStrings(&.{f}) else &.{};
    const with_fast = b.option(bool, "test-fast", "zig build test: ReleaseFast too") orelse false;
    const modes = [_]std.builtin.OptimizeMode{ .debug, .safe, .fast };
    for (modes[0..if (with_fast) modes.len else 2]) |mode| {
        const t = b.addTest(.{ .root_module = createModule(b, target, mode), .filters = filters });
        test_step.dependOn(&b.addRunArtifact(t).step);
    }

    // zig build bindings: loaderx/_abi.py, generated from the ABI's own types
    // (built for the target the tests run on: it links their Debug zstd).
    const gen = b.addExecutable(.{
        .name = "gen_bindings",
        .root_module = createModuleAt(b, "src/gen_bindings.zig", target, .debug),
    });
    const abi = b.addRunArtifact(gen).captureStdOut(.{});
    const update = b.addUpdateSourceFiles();
    update.addCopyFileToSource(abi, "loaderx/_abi.py");
    b.step("bindings", "Regenerate loaderx/_abi.py from the C ABI (src/capi*)").dependOn(&update.step);
    const print = b.addInstallFile(abi, "bindings/_abi.py");
    b.step("bindings-print", "Write the generated _abi.py to <prefix>/bindings/").dependOn(&print.step);

    // zig build forger-layout: tests/_lxlayout.py, the test forger's struct
    // formats and constants, generated from src/format.zig.
    const gen_layout = b.addExecutable(.{
        .name = "gen_layout",
        .root_module = b.createModule(.{
            .root_source_file = b.path("src/gen_layout.zig"),
            .target = b.graph.host,
            .optimize = .debug,
        }),
    });
    const layout = b.addRunArtifact(gen_layout).captureStdOut(.{});
    const update_layout = b.addUpdateSourceFiles();
    update_layout.addCopyFileToSource(layout, "tests/_lxlayout.py");
    b.step("forger-layout", "Regenerate tests/_lxlayout.py from src/format.zig")
        .dependOn(&update_layout.step);
    const print_layout = b.addInstallFile(layout, "layout/_lxlayout.py");
    b.step("forger-layout-print", "Write the generated _lxlayout.py to <prefix>/layout/")
        .dependOn(&print_layout.step);

    // zig build dist: every release target, each into its wheel tag's folder.
    const dist_step = b.step("dist", "Cross-compile libloaderx for every release target");
    for (release_targets) |rt| {
        const q = std.Target.Query.parse(.{ .arch_os_abi = rt.triple }) catch @panic("bad triple");
        const l = addLib(b, b.resolveTargetQuery(q), .fast);
        const inst = b.addInstallArtifact(l, .{
            .dest_dir = .{ .override = .{ .custom = b.fmt("dist/{s}", .{rt.tag}) } },
            .implib_dir = .disabled,
            .pdb_dir = .disabled,
        });
        dist_step.dependOn(&inst.step);
    }
}
