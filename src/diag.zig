//! Error detail for the C ABI: every failing engine call leaves a human-readable
//! message in a thread-local buffer (what went wrong, with the offending value),
//! which `lx_last_error` hands to Python. Thread-local, so concurrent calls on
//! other threads never overwrite it.
const std = @import("std");

threadlocal var buffer: [1024]u8 = undefined;
threadlocal var length: usize = 0;

/// Formats the message; too long a message is truncated, never an error.
/// `args` may hold this thread's message itself (a caller that prefixes the
/// message it got, `get()`): it is formatted apart, then copied in.
pub fn set(comptime fmt: []const u8, args: anytype) void {
    var scratch: [buffer.len]u8 = undefined;
    const out = std.fmt.bufPrint(scratch[0 .. scratch.len - 1], fmt, args) catch blk: {
        break :blk scratch[0 .. scratch.len - 1];
    };
    @memcpy(buffer[0..out.len], out);
    length = out.len;
    buffer[length] = 0;
}

pub fn clear() void {
    length = 0;
    buffer[0] = 0;
}

pub fn get() [*:0]const u8 {
    if (length == 0) return "";
    return @ptrCast(&buffer);
}

/// Returns `err` after recording the message: `return diag.fail(error.X, "...", .{..})`.
pub fn fail(err: anytype, comptime fmt: []const u8, args: anytype) @TypeOf(err) {
    set(fmt, args);
    return err;
}

test "a message prefixed with the message before it reads whole" {
    set("its pipeline is invalid: std {d}", .{0});
    set("column {d}: {s}", .{ 3, get() });
    const want = "column 3: its pipeline is invalid: std 0";
    try std.testing.expectEqualStrings(want, std.mem.span(get()));
    clear();
}

test "messages are formatted and truncated safely" {
    set("index {d} out of range", .{7});
    try std.testing.expectEqualStrings("index 7 out of range", std.mem.span(get()));
    const long: [2000]u8 = @splat('x');
    set("{s}", .{&long});
    try std.testing.expectEqual(@as(usize, 1023), std.mem.span(get()).len);
    clear();
    try std.testing.expectEqualStrings("", std.mem.span(get()));
}
