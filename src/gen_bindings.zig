//! Generates loaderx/_abi.py from the C ABI itself (`zig build bindings`):
//! the cffi declarations of every `lx_*` export of the C ABI (src/capi.zig
//! and its area files under src/capi/, in the order of `capi.areas`), read
//! from their types, and every constant Python shares with the library (result codes
//! with their names, codecs, sampler modes, gather parts, blob ids, fault
//! kinds, loader bounds, the format version, struct sizes). Nothing is kept
//! twice by hand: tests/project/test_abi.py regenerates the file and fails on any
//! difference.
const std = @import("std");
const capi = @import("capi.zig");
const format = @import("format.zig");
const sampler = @import("sampler.zig");
const fsio = @import("fsio.zig");
const Loader = @import("Loader.zig");
const Store = @import("Store.zig");
const outbuf = @import("outbuf.zig");
const image_plan = @import("image/plan.zig");
const image = @import("image/stage.zig");
const Cache = @import("Cache.zig");
const Replica = @import("Replica.zig");
const cache_fetch = @import("cache_fetch.zig");
const layout = @import("cache_format.zig");

/// Zig types that C sees by name.
const named = .{
    .{ Store, "lx_store" },
    .{ Loader, "lx_loader" },
    .{ capi.PoolStats, "lx_pool_stats_t" },
    .{ capi.Info, "lx_info_t" },
    .{ Store.Stats, "lx_stats_t" },
    .{ capi.Move, "lx_move_t" },
    .{ capi.Part, "lx_part_t" },
    .{ capi.LoaderConfig, "lx_loader_config_t" },
    .{ capi.Cursor, "lx_cursor_t" },
    .{ capi.LoaderSource, "lx_source_t" },
    .{ capi.LoaderColumn, "lx_column_t" },
    .{ capi.LoaderPart, "lx_loader_part_t" },
    .{ capi.WindowsSpec, "lx_windows_t" },
    .{ capi.IdentitySpec, "lx_identity_t" },
    .{ capi.ImageOp, "lx_image_op_t" },
    .{ capi.ImageSpec, "lx_image_spec_t" },
    .{ capi.ImageColumn, "lx_image_column_t" },
    .{ Cache, "lx_cache" },
    .{ Replica, "lx_replica" },
    .{ capi.CachePolicy, "lx_cache_policy_t" },
    .{ capi.CacheStats, "lx_cache_stats_t" },
    .{ capi.ReplicaSpec, "lx_replica_spec_t" },
    .{ capi.ReplicaInfo, "lx_replica_info_t" },
    .{ capi.MetaInfo, "lx_meta_t" },
    .{ capi.FetchRequests, "lx_requests_t" },
    .{ capi.Fetch, "lx_fetch_t" },
    .{ capi.LoaderStage, "lx_stage_t" },
};

fn cName(comptime T: type) []const u8 {
    inline for (named) |n| {
        if (n[0] == T) return n[1];
    }
    return switch (T) {
        u8 => "uint8_t",
        u32 => "uint32_t",
        f32 => "float",
        f64 => "double",
        i32 => "int32_t",
        i64 => "int64_t",
        anyopaque => "void",
        u64 => "uint64_t",
        u16 => "uint16_t",
        c_int => "int",
        void => "void",
        else => @compileError("no C spelling for " ++ @typeName(T)),
    };
}

/// The C spelling of a parameter or return type.
fn cType(comptime T: type) []const u8 {
    return switch (@typeInfo(T)) {
        .optional => |o| cType(o.child),
        .pointer => |p| blk: {
            if (p.child == u8 and p.sentinel() != null and p.attrs.@"const") {
                break :blk "const char *";
            }
            const inner = cType(p.child);
            const child_is_pointer = switch (@typeInfo(p.child)) {
                .pointer => true,
                .optional => |o| @typeInfo(o.child) == .pointer,
                else => false,
            };
            const is_const = p.attrs.@"const";
            if (child_is_pointer) break :blk inner ++ (if (is_const) "const *" else "*");
            break :blk (if (is_const) "const " else "") ++ inner ++ " *";
        },
        else => cName(T),
    };
}

fn declaration(comptime area: type, comptime name: []const u8) []const u8 {
    const info = @typeInfo(@TypeOf(@field(area, name))).@"fn";
    const ret = cType(info.return_type.?);
    var params: []const u8 = "";
    inline for (info.param_types, 0..) |t, i| {
        params = params ++ (if (i > 0) ", " else "") ++ cType(t.?);
    }
    if (info.param_types.len == 0) params = "void";
    const space = if (ret[ret.len - 1] == '*') "" else " ";
    return ret ++ space ++ name ++ "(" ++ params ++ ");\n";
}

fn structDef(comptime T: type) []const u8 {
    var text: []const u8 = "typedef struct {\n";
    const info = @typeInfo(T).@"struct";
    inline for (info.field_names, info.field_types) |name, t| {
        // An array field: C's `T name[N]`.
        const elem, const dims = switch (@typeInfo(t)) {
            .array => |a| .{ a.child, std.fmt.comptimePrint("[{d}]", .{a.len}) },
            else => .{ t, "" },
        };
        const c = cType(elem);
        const space = if (c[c.len - 1] == '*') "" else " ";
        text = text ++ "    " ++ c ++ space ++ name ++ dims ++ ";\n";
    }
    return text ++ "} " ++ cName(T) ++ ";\n";
}

const cdef = blk: {
    @setEvalBranchQuota(200_000);
    var text: []const u8 = "typedef struct lx_store lx_store;\n" ++
        "typedef struct lx_loader lx_loader;\n" ++
        "typedef struct lx_cache lx_cache;\n" ++
        "typedef struct lx_replica lx_replica;\n";
    const structs = .{
        capi.Info,         Store.Stats,       capi.Move,
        capi.Part,         capi.LoaderConfig, capi.Cursor,
        capi.LoaderSource, capi.ImageOp,      capi.ImageSpec,
        capi.ImageColumn,  capi.LoaderColumn, capi.LoaderPart,
        capi.WindowsSpec,  capi.PoolStats,    capi.IdentitySpec,
        capi.CachePolicy,  capi.CacheStats,   capi.ReplicaSpec,
        capi.ReplicaInfo,  capi.MetaInfo,     capi.FetchRequests,
        capi.Fetch,        capi.LoaderStage,
    };
    for (structs) |T| text = text ++ structDef(T);
    for (capi.areas) |area| {
        for (@typeInfo(area).@"struct".decl_names) |name| {
            if (std.mem.startsWith(u8, name, "lx_") and
                @typeInfo(@TypeOf(@field(area, name))) == .@"fn")
            {
                text = text ++ declaration(area, name);
            }
        }
    }
    break :blk text;
};

/// `NAME = {"field": value, ...}` for an enum's fields.
fn enumDict(comptime name: []const u8, comptime E: type) []const u8 {
    var text: []const u8 = name ++ " = {";
    const info = @typeInfo(E).@"enum";
    inline for (info.field_names, info.field_values, 0..) |field, value, i| {
        const entry = std.fmt.comptimePrint("\"{s}\": {d}", .{ field, value });
        text = text ++ (if (i > 0) ", " else "") ++ entry;
    }
    return text ++ "}\n";
}

const identity_flag_by_name = format.Identity.Flags.dtype_by_name;

/// The node-local cache's shared constants: the default policy, and the
/// flags and statuses of a fetch (src/Cache.zig, src/cache_fetch.zig).
fn cacheConstants() []const u8 {
    var text: []const u8 = "#: lx_cache_policy_t's defaults (src/Cache.zig, Policy.default).\n" ++
        "CACHE_POLICY = {";
    const p = Cache.Policy.default;
    for (@typeInfo(Cache.Policy).@"struct".field_names, 0..) |name, i| {
        const entry = std.fmt.comptimePrint("\"{s}\": {d}", .{ name, @field(p, name) });
        text = text ++ (if (i > 0) ",\n    " else "") ++ entry;
    }
    return text ++ std.fmt.comptimePrint(
        \\}}
        \\#: lx_replica_begin's flags, lx_fetch_t's statuses and flags (src/cache_fetch.zig).
        \\BEGIN_FLAGS = {{"pin": {d}, "warm_only": {d}, "whole_index": {d}}}
        \\FETCH_STATUS = {{"done": {d}, "ranges": {d}, "miss": {d}}}
        \\FETCH_FLAGS = {{"over_limit": {d}, "disk_nearly_full": {d}, "index_due": {d},
        \\    "bad_record": {d}}}
        \\CACHE_PIN_CALLS = {d}
        \\CACHE_SLOTS = {d}
        \\
    , .{
        cache_fetch.Begin.pin,       cache_fetch.Begin.warm_only, cache_fetch.Begin.whole_index,
        cache_fetch.Status.done,     cache_fetch.Status.ranges,   cache_fetch.Status.miss,
        Cache.Warn.over_limit,       Cache.Warn.disk_nearly_full, cache_fetch.index_due,
        cache_fetch.bad_record_flag, Cache.pin_calls,             layout.slots_max,
    });
}

const python = blk: {
    @setEvalBranchQuota(200_000);
    var text: []const u8 =
        \\# Generated by `zig build bindings` (src/gen_bindings.zig) from src/capi.zig.
        \\# Do not edit: tests/test_abi.py regenerates this file and fails on any difference.
        \\"""The C ABI of libloaderx as data: the cffi declarations and every constant
        \\Python shares with the library. loaderx/_lib.py loads the library with them."""
        \\
        \\CDEF = """
        \\
    ;
    text = text ++ cdef ++ "\"\"\"\n\n";
    text = text ++ "#: lx_result: result code name -> value (0 is success).\n";
    text = text ++ enumDict("RESULTS", capi.Result);
    text = text ++ enumDict("CODECS", format.Codec) ++ enumDict("SAMPLER_MODES", sampler.Mode);
    text = text ++ enumDict("PARTS", Store.Part) ++ enumDict("BLOBS", capi.Blob);
    text = text ++ enumDict("COLUMN_KINDS", capi.ColumnKind);
    text = text ++ "#: format.Kind: what a store holds (its type identity's kind).\n";
    text = text ++ enumDict("STORE_KINDS", format.Kind);
    text = text ++ "#: format.Identity.Encoding: how a store keeps its identity (lx_identity).\n";
    text = text ++ enumDict("IDENTITY_ENCODINGS", format.Identity.Encoding);
    text = text ++ "#: The image stage (src/image/plan.zig, stage.zig): ops, dtypes, layouts,\n";
    text = text ++ "#: on_error policies, input kinds.\n";
    text = text ++ enumDict("IMAGE_OPS", image_plan.OpKind) ++ enumDict(
        "IMAGE_DTYPES",
        image_plan.Dtype,
    );
    text = text ++ enumDict("IMAGE_LAYOUTS", image_plan.Layout);
    text = text ++ enumDict("IMAGE_ON_ERROR", image_plan.OnError);
    text = text ++ enumDict("IMAGE_INPUTS", image.InputKind);
    text = text ++ std.fmt.comptimePrint("IMAGE_OPS_MAX = {d}\nIMAGE_SIDE_MAX = {d}\n", .{
        image_plan.ops_max, image_plan.side_max,
    });
    text = text ++ "#: Kinds of file-system calls, for lx_debug_fault's mask (bit = 1 << value).\n";
    text = text ++ enumDict("FAULT_OPS", fsio.Op);
    text = text ++ cacheConstants();
    text = text ++ storeFiles();
    text = text ++ std.fmt.comptimePrint(
        \\LOADER_COLUMNS_MAX = {d}
        \\LOADER_SOURCES_MAX = {d}
        \\PARTS_MAX = {d}
        \\LOADER_WINDOW_MAX = {d}
        \\LOADER_THREADS_MAX = {d}
        \\AUX_SIZE_MAX = {d}
        \\#: The output pool's defaults and bounds (src/outbuf.zig).
        \\OUTPUT_POOL = {{"min_bytes": {d}, "max_idle_bytes": {d}, "stale_checkouts": {d},
        \\    "idle_count_max": {d}}}
        \\FORMAT_VERSION = {d}
        \\FORMAT_VERSION_MIN = {d}
        \\IDENTITY_NDIM_MAX = {d}
        \\IDENTITY_DESCR_SIZE_MAX = {d}
        \\IDENTITY_NAME_SIZE_MAX = {d}
        \\IDENTITY_FLAG_DTYPE_BY_NAME = {d}
        \\STRUCT_SIZES = {{"lx_info_t": {d}, "lx_stats_t": {d}, "lx_move_t": {d}, "lx_part_t": {d},
        \\    "lx_loader_config_t": {d}, "lx_cursor_t": {d}, "lx_source_t": {d},
        \\    "lx_column_t": {d}, "lx_loader_part_t": {d}, "lx_windows_t": {d},
        \\    "lx_pool_stats_t": {d}, "lx_identity_t": {d}, "lx_image_op_t": {d},
        \\    "lx_image_spec_t": {d}, "lx_image_column_t": {d}}}
        \\
    , .{
        Loader.columns_max,         Loader.sources_max,             Loader.parts_max,
        Loader.window_max,          Loader.threads_max,             Store.aux_size_max,
        outbuf.min_bytes_default,   outbuf.max_idle_bytes_default,  outbuf.stale_checkouts,
        outbuf.idle_count_max,      format.format_version,          format.format_version_min,
        format.Identity.ndim_max,   format.Identity.descr_size_max, format.Identity.name_size_max,
        identity_flag_by_name,      @sizeOf(capi.Info),             @sizeOf(Store.Stats),
        @sizeOf(capi.Move),         @sizeOf(capi.Part),             @sizeOf(capi.LoaderConfig),
        @sizeOf(capi.Cursor),       @sizeOf(capi.LoaderSource),     @sizeOf(capi.LoaderColumn),
        @sizeOf(capi.LoaderPart),   @sizeOf(capi.WindowsSpec),      @sizeOf(capi.PoolStats),
        @sizeOf(capi.IdentitySpec), @sizeOf(capi.ImageOp),          @sizeOf(capi.ImageSpec),
        @sizeOf(capi.ImageColumn),
    });
    break :blk text;
};

pub fn main(init: std.process.Init) !void {
    try std.Io.File.stdout().writeStreamingAll(init.io, python);
}

/// A store directory's own files (format.zig's `file_names`, and the token
/// windows' index beside them), for the writers' overwrite rule.
fn storeFiles() []const u8 {
    const f = format.file_names;
    return std.fmt.comptimePrint(
        \\#: A store directory's own files (src/format.zig).
        \\STORE_FILES = ("{s}", "{s}", "{s}", "{s}", "{s}", "{s}")
        \\STORE_META_FILE = "{s}"
        \\STORE_LOCK_FILE = "{s}"
        \\WINDOWS_INDEX_FILE = "{s}"
        \\
    , .{
        f.meta,
        f.index,
        f.data,
        f.lock,
        f.journal,
        f.meta_tmp,
        f.meta,
        f.lock,
        format.WindowsIndex.file_name,
    });
}
