//! The C ABI, test hooks: fault injection into the engine's file-system calls
//! (src/fsio.zig) and a recording of those calls. They do nothing unless a
//! test arms them.
const capi = @import("../capi.zig");
const fsio = @import("../fsio.zig");
const diag = @import("../diag.zig");

const Result = capi.Result;

/// Test hook (does nothing unless armed): the `nth` (1-based) file-system call
/// whose kind is in `mask` (bits of fsio.Op: create, write, sync, truncate,
/// rename, unlink, mkdir, sync_dir) fails with an I/O error, and with
/// `sticky` != 0 every later one too. `nth` 0 only counts; mask 0 disarms.
/// Process-wide.
pub export fn lx_debug_fault(mask: u32, nth: u64, sticky: c_int) void {
    fsio.armFault(mask, nth, sticky != 0);
}

/// Test hook: matching file-system calls and injected faults since the last
/// lx_debug_fault.
pub export fn lx_debug_fault_counts(calls: ?*u64, faults: ?*u64) void {
    if (calls) |c| c.* = fsio.callCount();
    if (faults) |f| f.* = fsio.faultCount();
}

/// Test hook: starts (`on` != 0, dropping any earlier log) or stops recording
/// every file-system call the engine makes (see fsio.zig for the format).
pub export fn lx_debug_record(on: c_int) void {
    fsio.setRecording(on != 0);
}

/// Test hook: copies the recording into `out` when it fits in `cap` bytes and
/// writes its size to `*len`. Errors: out_of_memory (recording ran out of
/// memory and is incomplete).
pub export fn lx_debug_recording(out: ?[*]u8, cap: u64, len: ?*u64) c_int {
    const n_out = len orelse return capi.invalid("len is null", .{});
    if (cap > 0 and out == null) return capi.invalid("out is null", .{});
    const n = fsio.takeRecording(if (out) |o| o[0..@intCast(cap)] else null) orelse {
        diag.set("the recording ran out of memory and is incomplete", .{});
        return @backingInt(Result.out_of_memory);
    };
    n_out.* = n;
    return 0;
}
