//! Maintenance of a store: delete (journaled), compact (in place, in rounds
//! that are each safe against a power loss), and what an open does to finish
//! a writer's interrupted work: replay a delete journal, check the records
//! appended after the last sync.
//!
//! Durability of these operations: delete and compact first sync what was
//! appended, and are durable when they return. A crash or power loss during a
//! delete leaves the store as before it or as after it (the next writable
//! open replays the journal); during a compact, a consistent store holding the
//! same records, which a second compact finishes.
const std = @import("std");
const assert = std.debug.assert;
const Allocator = std.mem.Allocator;
const format = @import("format.zig");
const pool = @import("pool.zig");
const diag = @import("diag.zig");
const fsio = @import("fsio.zig");
const Store = @import("Store.zig");
const Error = Store.Error;
const RecordLoc = format.RecordLoc;
const Commit = format.Commit;
const JournalHeader = format.JournalHeader;
const JournalEntry = format.JournalEntry;

/// Claims the handle for delete/compact: a writer, nothing staged, no other
/// handle and no gather. Caller holds write_mutex; release with releaseExclusive.
fn beginExclusive(s: *Store) Error!void {
    try s.beginMutation();
    if (s.staged != null) {
        return diag.fail(error.Busy, "a staged append is not yet published on this handle", .{});
    }
    try s.acquireExclusive();
}

fn durable(c: Commit) bool {
    return c.durable_count == c.record_count and c.durable_data_size == c.data_size;
}

// ---------------------------------------------------------------- delete

/// A record that changes position: the survivor at `from` moves to `to`.
pub const Move = extern struct {
    from: u64,
    to: u64,
};

/// The moves of deleting `unique` (sorted ascending, no duplicates) from
/// `count` records by the original rule: in descending index order, each
/// deleted index receives the current last record, then the length drops by
/// one. Returns the net moves (a survivor moved twice appears once, with its
/// first and last position), ascending by `to`, written to `out`.
fn planMoves(unique: []const u64, count: u64, content: []u64, out: []Move) []Move {
    assert(content.len == unique.len);
    assert(out.len >= unique.len);
    assert(unique.len <= count);
    if (unique.len > 0) {
        assert(unique[unique.len - 1] < count);
        for (unique[1..], unique[0 .. unique.len - 1]) |b, a| assert(a < b); // sorted, unique
    }
    const new_count = count - unique.len;
    const none = std.math.maxInt(u64);
    var len = count;
    var j = unique.len;
    while (j > 0) {
        j -= 1;
        const last = len - 1;
        content[j] = none;
        if (unique[j] != last) {
            // The record now at `last` is the one a deleted index there received, or its own.
            const k = std.sort.binarySearch(u64, unique, last, orderU64);
            content[j] = if (k) |at| content[at] else last;
            assert(content[j] != none);
        }
        len -= 1;
    }
    assert(len == new_count);
    var n: usize = 0;
    for (unique, content) |to, from| {
        if (to >= new_count or from == none) continue;
        assert(from >= new_count);
        assert(from < count);
        out[n] = .{ .from = from, .to = to };
        n += 1;
    }
    // Every hole below the new length is filled exactly once (moves stay
    // ascending by `to`).
    if (n > 0) for (out[1..n], out[0 .. n - 1]) |b, a| assert(a.to < b.to);
    return out[0..n];
}

fn orderU64(key: u64, item: u64) std.math.Order {
    return std.math.order(key, item);
}

fn dedupe(sorted: []u64) []u64 {
    if (sorted.len == 0) return sorted;
    var n: usize = 1;
    for (sorted[1..]) |v| {
        assert(v >= sorted[n - 1]);
        if (v != sorted[n - 1]) {
            sorted[n] = v;
            n += 1;
        }
    }
    assert(n <= sorted.len);
    return sorted[0..n];
}

/// Deletes records `indices` (any order, duplicates allowed) by the rule of
/// `planMoves`. Writes the moves to `moves_out` (room for `indices.len`) and
/// returns their count. Journaled: the moves are made durable before the first
/// one is applied, and a journal left by a crash is replayed by the next open.
pub fn delete(s: *Store, indices: []const u64, moves_out: []Move) Error!usize {
    assert(moves_out.len >= indices.len);
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    try beginExclusive(s);
    defer s.releaseExclusive();

    const count = s.commit.record_count;
    for (indices) |index| {
        if (index >= count) {
            return diag.fail(
                error.OutOfRange,
                "index {d} is out of range for {d} records",
                .{ index, count },
            );
        }
    }
    const work = s.gpa.alloc(u64, 2 * indices.len) catch return error.OutOfMemory;
    defer s.gpa.free(work);
    @memcpy(work[0..indices.len], indices);
    std.mem.sortUnstable(u64, work[0..indices.len], {}, std.sort.asc(u64));
    const unique = dedupe(work[0..indices.len]);
    if (unique.len == 0) return 0;
    const moves = planMoves(unique, count, work[indices.len..][0..unique.len], moves_out);
    assert(moves.len <= unique.len);

    // A journal is only ever written over a durable store (it may copy bytes
    // that must survive a power loss).
    if (!durable(s.commit)) try s.syncLocked();
    const entries = s.gpa.alloc(JournalEntry, moves.len) catch return error.OutOfMemory;
    defer s.gpa.free(entries);
    const locs = try s.table(count);
    const data = try s.dataMap(s.commit.data_size);
    var freed: u64 = 0;
    for (unique) |index| {
        // A damaged entry must not reach the journal or the byte counts.
        try Store.checkLoc(locs.get(index), index, data, s.commit.data_size, true);
        freed += locs.get(index).storedTotal();
    }
    for (moves) |m| try Store.checkLoc(locs.get(m.from), m.from, data, s.commit.data_size, true);
    if (freed > s.commit.live_bytes) {
        return diag.fail(error.Corrupt, "live byte count is smaller than the deleted records", .{});
    }
    for (moves, entries) |m, *e| {
        e.* = .{ .index = m.to, .loc = locs.withChecksum(m.from) };
        // The record's checksum is bound to its index: re-bind it to the new one.
        e.loc.checksum ^= format.indexTweak(m.from) ^ format.indexTweak(m.to);
    }

    var c = s.commit;
    c.record_count = count - unique.len;
    c.live_bytes -= freed;
    // Fixed width: survivors' bytes move into the holes, so the data stays
    // exactly record_count * fixed_size (nothing for compact to reclaim).
    if (s.header.fixed_size != 0) c.data_size = c.record_count * s.header.fixed_size;
    c.durable_count = c.record_count;
    c.durable_data_size = c.data_size;
    c.durable_live_bytes = c.live_bytes;
    c.generation = s.commit.generation + 1;
    assert(c.consistent());
    assert(s.header.fixed_size == 0 or c.live_bytes == c.data_size);
    // Records are about to change in place: no reader through this handle may
    // keep a window index of them, and none may be found on disk.
    _ = s.delete_epoch.fetchAdd(1, .acq_rel);
    try removeWindowsIndex(s);
    try writeJournal(s, entries, c);
    try applyJournal(s, entries, c);
    return moves.len;
}

/// Removes the store's token window index (windows.idx, its temporary files
/// and those of earlier loaderx versions) and makes that durable, before a
/// delete changes any record: an index on disk then always describes records
/// the store still holds (format.zig). No other handle is open (the caller
/// holds exclusive access), so no reader is writing one meanwhile.
pub fn removeWindowsIndex(s: *Store) Error!void {
    const io = pool.io();
    const d = s.dir.openDir(io, ".", .{ .iterate = true }) catch |e|
        return Store.ioFail(e, "listing the store directory");
    defer d.close(io);
    var removed = false;
    var it = d.iterate();
    while (it.next(io) catch |e| return Store.ioFail(e, "listing the store directory")) |entry| {
        if (!isWindowsIndexName(entry.name)) continue;
        fsio.unlink(s.dir, entry.name) catch |e| switch (e) {
            error.FileNotFound => continue,
            else => return Store.ioFail(e, "removing the token window index"),
        };
        removed = true;
    }
    if (removed) {
        fsio.syncDir(s.dir, ".") catch |e| return s.failWith(e, "syncing the store directory");
    }
}

/// windows.idx, a temporary one (windows.idx.<random>.tmp), or one an earlier
/// loaderx wrote (windows-<itemsize>[-<separator>].idx).
pub fn isWindowsIndexName(name: []const u8) bool {
    const current = format.WindowsIndex.file_name;
    if (std.mem.startsWith(u8, name, current)) {
        return name.len == current.len or std.mem.endsWith(u8, name, ".tmp");
    }
    return std.mem.startsWith(u8, name, "windows-") and std.mem.endsWith(u8, name, ".idx");
}

fn writeJournal(s: *Store, entries: []const JournalEntry, c: Commit) Error!void {
    writeJournalFile(s, entries, c) catch |e| {
        // The delete has not begun: take the journal back so no open replays it.
        fsio.unlink(s.dir, "journal") catch |ue| switch (ue) {
            error.FileNotFound => {},
            else => return s.failWith(ue, "removing a delete journal that could not be written"),
        };
        return e;
    };
}

fn writeJournalFile(s: *Store, entries: []const JournalEntry, c: Commit) Error!void {
    const io = pool.io();
    var h: JournalHeader = .{
        .magic = JournalHeader.magic_value,
        .entry_count = entries.len,
        .commit = c,
        .entries_checksum = JournalHeader.entriesChecksum(entries),
        .checksum = 0,
    };
    h.commit.checksum = h.commit.computeChecksum();
    h.checksum = h.computeChecksum();
    // The journal continues the published history (what checkJournal
    // demands of it when an open replays it).
    assert(c.generation == s.commit.generation + 1);
    assert(c.record_count < s.commit.record_count);
    assert(c.durable_count == c.record_count);
    for (entries) |e| assert(e.index < c.record_count);
    const f = fsio.create(s.dir, "journal", true) catch |e|
        return Store.ioFail(e, "creating the delete journal");
    defer f.close(io);
    fsio.write(f, "journal", std.mem.sliceAsBytes(entries), @sizeOf(JournalHeader)) catch |e|
        return Store.ioFail(e, "writing the delete journal");
    // The header last: a journal without a valid header is ignored.
    fsio.write(f, "journal", std.mem.asBytes(&h), 0) catch |e|
        return Store.ioFail(e, "writing the delete journal");
    fsio.sync(f, "journal") catch |e| return s.failWith(e, "syncing the delete journal");
    fsio.syncDir(s.dir, ".") catch |e| return s.failWith(e, "syncing the store directory");
}

/// Applies a durable journal: the table (and, fixed width, data) writes,
/// then the commit, then removes the journal. Any failure leaves the handle
/// failed and the journal in place for the next open to replay.
fn applyJournal(s: *Store, entries: []const JournalEntry, c: Commit) Error!void {
    const fixed = s.header.fixed_size;
    // Built by delete or checked by checkJournal: every write lands below
    // the new length, every source lies inside the published data.
    assert(c.generation == s.commit.generation + 1);
    for (entries) |e| {
        assert(e.index < c.record_count);
        assert(e.loc.end() <= s.commit.data_size);
        if (fixed != 0) assert(e.loc.offset >= c.record_count * fixed);
        if (fixed == 0) {
            const loc_bytes = std.mem.asBytes(&e.loc);
            fsio.write(s.index, "index", loc_bytes, e.index * @sizeOf(RecordLoc)) catch |err|
                return s.failWith(err, "applying a delete to the record table");
            continue;
        }
        // The survivor sits at or above the new length, which nothing writes
        // until this delete is published: replaying the copy is idempotent.
        try copyData(s, e.loc.offset, e.index * fixed, fixed);
        const sum_bytes = std.mem.asBytes(&e.loc.checksum);
        fsio.write(s.index, "index", sum_bytes, e.index * @sizeOf(u32)) catch |err|
            return s.failWith(err, "applying a delete to the record table");
    }
    if (fixed != 0) try s.syncFile(.data);
    try s.syncFile(.index);
    try s.writeCommit(c);
    assert(s.commit.generation == c.generation);
    try s.syncFile(.meta);
    fsio.unlink(s.dir, "journal") catch |e| return s.failWith(e, "removing the delete journal");
    fsio.syncDir(s.dir, ".") catch |e| return s.failWith(e, "syncing the store directory");
}

/// Copies `len` bytes of the data file from `from` to `to` (ranges disjoint).
fn copyData(s: *Store, from: u64, to: u64, len: u64) Error!void {
    assert(len >= 1);
    assert(to + len <= from or from + len <= to);
    const base = try s.dataMap(from + len);
    fsio.write(s.data, "data", base[@intCast(from)..][0..@intCast(len)], to) catch |e|
        return s.failWith(e, "moving record bytes");
}

const Journal = struct {
    header: JournalHeader,
    entries: []JournalEntry,
};

/// Finishes a delete interrupted by a crash. Called at open: a journal that
/// is partial (the delete never began) or stale (already applied: its commit
/// is not newer than the published one) is ignored; a live one is replayed
/// under exclusive access and a short-lived writer lock, both given back.
pub fn finishJournal(s: *Store) Error!void {
    const io = pool.io();
    const f = fsio.open(s.dir, "journal", .read_only) catch |e| switch (e) {
        error.FileNotFound => return,
        else => return Store.ioFail(e, "opening the delete journal"),
    };
    defer f.close(io);
    const disk = try s.readCommit();
    const journal = try readJournal(s, f, disk) orelse return;
    defer s.gpa.free(journal.entries);
    if (!s.writable) {
        return diag.fail(
            error.ReadOnly,
            "store has an unfinished delete; open it once with write permission to finish it",
            .{},
        );
    }
    if (!try s.upgradeMetaLock()) {
        return diag.fail(
            error.Busy,
            "store has an unfinished delete and another handle has it open " ++
                "(a delete failed in it): close that handle, then open again",
            .{},
        );
    }
    defer s.releaseExclusive();
    const lock = try s.takeWriterLock();
    defer lock.close(io);
    s.commit = disk;
    try applyJournal(s, journal.entries, journal.header.commit);
}

/// The journal in `f` if it is complete and follows commit `disk`; null when
/// it is partial or stale. Its entries are checked against `disk`.
fn readJournal(s: *Store, f: std.Io.File, disk: Commit) Error!?Journal {
    const io = pool.io();
    var h: JournalHeader = undefined;
    const n = f.readPositionalAll(io, std.mem.asBytes(&h), 0) catch |e|
        return Store.ioFail(e, "reading the delete journal");
    if (n != @sizeOf(JournalHeader) or h.magic != JournalHeader.magic_value or
        h.checksum != h.computeChecksum())
    {
        return null;
    }
    if (h.commit.generation <= disk.generation) return null; // applied; its removal was lost
    const len = f.length(io) catch |e| return Store.ioFail(e, "reading the delete journal");
    const entries_len = std.math.mul(u64, h.entry_count, @sizeOf(JournalEntry)) catch return null;
    if (len != @sizeOf(JournalHeader) + entries_len) return null;
    const entries = s.gpa.alloc(JournalEntry, @intCast(h.entry_count)) catch
        return error.OutOfMemory;
    errdefer s.gpa.free(entries);
    try Store.readExact(f, std.mem.sliceAsBytes(entries), @sizeOf(JournalHeader), "delete journal");
    // Entries not all on disk: the delete never began (it applies only a synced journal).
    if (JournalHeader.entriesChecksum(entries) != h.entries_checksum) {
        s.gpa.free(entries);
        return null;
    }
    try checkJournal(s, h, entries, disk);
    return .{ .header = h, .entries = entries };
}

/// A journal is trusted only if it continues the published history and
/// every entry points inside what that commit covers.
fn checkJournal(
    s: *Store,
    h: JournalHeader,
    entries: []const JournalEntry,
    disk: Commit,
) Error!void {
    const c = h.commit;
    const fixed = s.header.fixed_size;
    // A delete changes the count and the live bytes, and (fixed width) the
    // data size with the count; everything it publishes is durable.
    const data_size = if (fixed != 0) c.record_count * fixed else disk.data_size;
    // (Fixed width: the data holds exactly the live records, as readCommit requires.)
    const live_ok = c.live_bytes <= disk.live_bytes and (fixed == 0 or c.live_bytes == data_size);
    if (c.generation != disk.generation + 1 or c.record_count >= disk.record_count or
        !c.consistent() or c.checksum != c.computeChecksum() or
        c.data_size != data_size or !live_ok or
        c.durable_count != c.record_count or c.durable_data_size != c.data_size)
    {
        const why = "delete journal does not follow the store's last commit";
        return diag.fail(error.Corrupt, why, .{});
    }
    for (entries) |e| {
        var bad = e.index >= c.record_count or e.loc.codec > @backingInt(format.Codec.zstd_dict);
        const end = e.loc.checkedEnd() orelse std.math.maxInt(u64);
        bad = bad or end > disk.data_size;
        if (fixed != 0) {
            bad = bad or e.loc.offset % fixed != 0 or e.loc.offset < c.record_count * fixed;
        }
        if (bad) {
            return diag.fail(
                error.Corrupt,
                "delete journal entry for record {d} is out of bounds",
                .{e.index},
            );
        }
    }
}

/// Removes a journal a writer finds: it can only be partial or stale (a live
/// one is replayed at open, and no handle opens beside a failed delete).
pub fn dropDeadJournal(s: *Store) Error!void {
    if (s.dir.access(pool.io(), "journal", .{})) |_| {} else |_| return;
    fsio.unlink(s.dir, "journal") catch |e| switch (e) {
        error.FileNotFound => {},
        else => return Store.ioFail(e, "removing a leftover delete journal"),
    };
}

// ---------------------------------------------------------------- compact

const ByOffset = struct {
    offset: u64,
    index: u64,
    size: u64,

    fn less(_: void, a: ByOffset, b: ByOffset) bool {
        return a.offset < b.offset;
    }
};

/// Bytes one compact round aims to move; parking creates a gap this large.
const round_bytes: u64 = 64 << 20;

/// Reclaims the bytes of deleted records in place. Records move toward lower
/// addresses in rounds: a round copies records into free space only, makes
/// the copies durable, then re-points their table entries and makes that
/// durable, so every entry always points at a complete, durable copy. When
/// the free space ahead is small, a batch of records is first parked past the
/// end of the data (at most ~64 MiB of extra disk), which opens a large gap.
pub fn compact(s: *Store) Error!void {
    const io = pool.io();
    s.write_mutex.lockUncancelable(io);
    defer s.write_mutex.unlock(io);
    try beginExclusive(s);
    defer s.releaseExclusive();
    if (!durable(s.commit)) try s.syncLocked();
    if (s.header.fixed_size != 0) return trimData(s); // deletes keep fixed-width data dense
    const count = s.commit.record_count;
    const locs = (try s.table(count)).locs;
    var order: std.ArrayList(ByOffset) = .empty;
    defer order.deinit(s.gpa);
    const live = try liveOrder(s, locs, count, &order);
    const cursor = try compactRounds(s, order.items);
    // The live records now lie back to back from 0: the data shrinks to them.
    assert(cursor == live);
    assert(cursor <= s.commit.data_size);
    // Empty records must lie inside the shrunken data too.
    var empty_moved = false;
    for (0..@intCast(count)) |i| {
        var loc = locs[i];
        if (loc.storedTotal() != 0 or loc.offset <= cursor) continue;
        loc.offset = 0;
        try writeLoc(s, i, loc);
        empty_moved = true;
    }
    if (empty_moved) try s.syncFile(.index);
    var c = s.commit;
    c.data_size = cursor;
    c.live_bytes = cursor;
    c.durable_data_size = cursor;
    c.durable_live_bytes = cursor;
    try s.writeCommit(c);
    try s.syncFile(.meta);
    try trimData(s);
}

/// The records of a compact, sorted by offset, in `order`; returns their
/// bytes. Compact moves bytes by the entries: a damaged one (outside the
/// data, or overlapping another, which moving would garble) stops it before
/// anything moves.
fn liveOrder(
    s: *Store,
    locs: [*]const RecordLoc,
    count: u64,
    order: *std.ArrayList(ByOffset),
) Error!u64 {
    order.ensureTotalCapacity(s.gpa, @intCast(count)) catch return error.OutOfMemory;
    const data = try s.dataMap(s.commit.data_size);
    for (0..@intCast(count)) |i| {
        try Store.checkLoc(locs[i], i, data, s.commit.data_size, true);
        const size = locs[i].storedTotal();
        if (size != 0) {
            order.appendAssumeCapacity(.{ .offset = locs[i].offset, .index = i, .size = size });
        }
    }
    std.mem.sortUnstable(ByOffset, order.items, {}, ByOffset.less);
    var live: u64 = 0;
    var end: u64 = 0;
    for (order.items) |o| {
        if (o.offset < end) {
            return diag.fail(
                error.Corrupt,
                "record {d} overlaps another record's bytes; compact refused (nothing moved)",
                .{o.index},
            );
        }
        end = o.offset + o.size;
        live += o.size;
    }
    assert(live <= s.commit.data_size);
    return live;
}

/// Moves every record of `order` (sorted by offset) down to the front of the
/// data; returns the end of the moved data.
fn compactRounds(s: *Store, order: []ByOffset) Error!u64 {
    var cursor: u64 = 0;
    var i: usize = 0;
    var remaining: u64 = 0;
    for (order) |o| remaining += o.size;
    while (i < order.len) {
        if (order[i].offset == cursor) { // already in place
            cursor += order[i].size;
            remaining -= order[i].size;
            i += 1;
            continue;
        }
        assert(order[i].offset > cursor);
        const gap = order[i].offset - cursor;
        if (gap < @min(round_bytes, remaining)) {
            try park(s, order[i..], @min(round_bytes, remaining) - gap);
            continue;
        }
        var j = i;
        var moved: u64 = 0;
        while (j < order.len and moved + order[j].size <= gap) : (j += 1) moved += order[j].size;
        assert(j > i);
        try moveRound(s, order[i..j], cursor);
        cursor += moved;
        remaining -= moved;
        i = j;
    }
    assert(remaining == 0);
    return cursor;
}

/// Copies records `round` (sorted, their destinations all inside free space)
/// to consecutive places from `to`, then re-points them; each half durable.
fn moveRound(s: *Store, round: []ByOffset, to: u64) Error!void {
    assert(round.len >= 1);
    // Copies land in free space only: below the first record that moves,
    // so every entry still points at an intact copy until repointed.
    const free_end = round[0].offset;
    var at = to;
    var k: usize = 0;
    while (k < round.len) {
        // Records adjacent in the file move as one write.
        var end = k + 1;
        var len = round[k].size;
        while (end < round.len and round[end].offset == round[k].offset + len) : (end += 1) {
            len += round[end].size;
        }
        try copyData(s, round[k].offset, at, len);
        for (round[k..end]) |*o| {
            o.offset = at;
            at += o.size;
        }
        k = end;
    }
    assert(at <= free_end);
    try s.syncFile(.data);
    try repoint(s, round);
}

/// Copies records from the front of `rest` past the end of the data until
/// at least `want` bytes are parked, commits the longer data (so entries may
/// point there), then re-points them. Parked records move to the back of
/// `rest`, which stays sorted by offset.
fn park(s: *Store, rest: []ByOffset, want: u64) Error!void {
    var n: usize = 0;
    var total: u64 = 0;
    while (n < rest.len and (n == 0 or total < want)) : (n += 1) total += rest[n].size;
    assert(n >= 1);
    const tail = s.commit.data_size;
    var at = tail;
    for (rest[0..n]) |*o| {
        assert(o.offset + o.size <= tail); // parked copies go past every record
        try copyData(s, o.offset, at, o.size);
        o.offset = at;
        at += o.size;
    }
    try s.syncFile(.data);
    var c = s.commit;
    c.data_size = at;
    c.durable_data_size = at;
    try s.writeCommit(c);
    try s.syncFile(.meta);
    try repoint(s, rest[0..n]);
    std.mem.rotate(ByOffset, rest, n);
}

fn repoint(s: *Store, moved: []const ByOffset) Error!void {
    const locs = (try s.table(s.commit.record_count)).locs;
    for (moved) |o| {
        assert(o.index < s.commit.record_count);
        assert(o.offset + o.size <= s.commit.data_size); // inside the committed data
        var loc = locs[o.index];
        assert(loc.storedTotal() == o.size);
        loc.offset = o.offset;
        try writeLoc(s, o.index, loc);
    }
    try s.syncFile(.index);
}

fn writeLoc(s: *Store, index: u64, loc: RecordLoc) Error!void {
    assert(index < s.commit.record_count);
    assert(s.header.fixed_size == 0); // the fixed layout has no entries to rewrite
    assert(loc.end() <= s.commit.data_size);
    fsio.write(s.index, "index", std.mem.asBytes(&loc), index * @sizeOf(RecordLoc)) catch |e|
        return s.failWith(e, "writing the record table");
}

/// Gives back data file bytes past the committed data (deleted or parked).
fn trimData(s: *Store) Error!void {
    const len = s.data.length(pool.io()) catch |e| return Store.ioFail(e, "data");
    if (len <= s.commit.data_size) return;
    fsio.truncate(s.data, "data", s.commit.data_size) catch |e|
        return Store.ioFail(e, "shrinking data");
    try s.syncFile(.data);
}

// ---------------------------------------------------------------- open after a crash

/// The commit an open starts from. What the last sync made durable must be
/// on disk in full (else Corrupt). Records appended after it are trusted
/// while a live writer holds the store (they are in the page cache); with no
/// writer alive, they are checked (entry and checksum) once, and the store is
/// cut back to the longest intact prefix and made durable. O(records since
/// the last sync), and only after a writer died without syncing.
pub fn checkTail(s: *Store) Error!Commit {
    const io = pool.io();
    const c = try s.readCommit();
    const index_len = s.index.length(io) catch |e| return Store.ioFail(e, "index");
    const data_len = s.data.length(io) catch |e| return Store.ioFail(e, "data");
    const entries = index_len / s.entrySize();
    if (entries < c.durable_count or data_len < c.durable_data_size) {
        return diag.fail(
            error.Corrupt,
            "store is truncated: synced records are missing " ++
                "({d} of {d} table entries, {d} of {d} data bytes)",
            .{ entries, c.durable_count, data_len, c.durable_data_size },
        );
    }
    const complete = entries >= c.record_count and data_len >= c.data_size;
    if (c.durable_count == c.record_count and complete) return c;
    const lock = try lockIfNoWriter(s) orelse {
        if (!complete) {
            return diag.fail(error.Corrupt, "store is truncated while a writer has it open", .{});
        }
        return c;
    };
    defer lock.close(io);
    const good = try intactPrefix(s, c, entries, data_len);
    if (!s.writable) {
        if (good.record_count == c.record_count) return c;
        return diag.fail(
            error.Corrupt,
            "store was not closed cleanly and records from {d} on are damaged; " ++
                "open it once with write permission to drop them",
            .{good.record_count},
        );
    }
    s.commit = c;
    // The intact prefix keeps every durable record and drops only the tail.
    assert(good.record_count >= c.durable_count);
    assert(good.record_count <= c.record_count);
    assert(good.data_size <= c.data_size);
    try s.syncFile(.data);
    try s.syncFile(.index);
    try s.writeCommit(good);
    try s.syncFile(.meta);
    return s.commit;
}

/// The writer lock, taken for a moment, when no live writer holds it; null
/// when one does. A read-only handle takes it through a read-only descriptor.
fn lockIfNoWriter(s: *Store) Error!?std.Io.File {
    if (s.writable) {
        return s.takeWriterLock() catch |e| switch (e) {
            error.Locked => null,
            else => e,
        };
    }
    const lock = fsio.open(s.dir, "lock", .read_only) catch |e|
        return Store.ioFail(e, "opening lock");
    const got = lock.tryLock(pool.io(), .exclusive) catch |e| {
        lock.close(pool.io());
        return Store.ioFail(e, "checking the writer lock");
    };
    if (got) return lock;
    lock.close(pool.io());
    return null;
}

/// The commit of the longest prefix whose records appended after the last
/// sync are intact: placed one after another from the durable data, inside
/// the files, and matching their checksums.
fn intactPrefix(s: *Store, c: Commit, entries: u64, data_len: u64) Error!Commit {
    var good = c;
    good.record_count = c.durable_count;
    good.data_size = c.durable_data_size;
    good.live_bytes = c.durable_live_bytes;
    const limit = @min(c.record_count, entries);
    const data_limit = @min(c.data_size, data_len);
    if (limit > good.record_count) {
        const t = try s.table(limit);
        const data = try s.dataMap(data_limit);
        while (good.record_count < limit) : (good.record_count += 1) {
            const loc = t.withChecksum(good.record_count);
            if (!intact(loc, good.record_count, good.data_size, data, data_limit)) break;
            good.data_size += loc.storedTotal();
            good.live_bytes += loc.storedTotal();
        }
    }
    good.durable_count = good.record_count;
    good.durable_data_size = good.data_size;
    good.durable_live_bytes = good.live_bytes;
    assert(good.data_size <= data_limit or good.record_count == c.durable_count);
    assert(good.consistent());
    return good;
}

/// A record appended after the last sync is intact when it lies where the
/// previous one ended, inside the files, and matches its checksum. Anything
/// else is what a power loss leaves (a lost entry write shows the stale entry
/// an earlier delete left behind, intact but elsewhere), and the open keeps
/// the records before it.
fn intact(
    loc: RecordLoc,
    index: u64,
    expected_offset: u64,
    data: [*]const u8,
    data_limit: u64,
) bool {
    if (loc.offset != expected_offset or loc.codec > @backingInt(format.Codec.zstd_dict)) {
        return false;
    }
    const end = loc.checkedEnd() orelse return false;
    if (end > data_limit) return false;
    const aux = data[@intCast(loc.offset)..][0..loc.aux_size];
    const stored = (data + loc.offset + loc.aux_size)[0..@intCast(loc.stored_size)];
    return format.storedChecksum(aux, stored, index) == loc.checksum;
}

test "moves follow the original swap-last rule" {
    var content: [4]u64 = undefined;
    var out: [4]Move = undefined;
    // {2, 3} from ten records: [0,1,8,9,4,5,6,7].
    const a = planMoves(&.{ 2, 3 }, 10, content[0..2], &out);
    const expected = [_]Move{ .{ .from = 8, .to = 2 }, .{ .from = 9, .to = 3 } };
    try std.testing.expectEqualSlices(Move, &expected, a);
    // {5, 8} from ten: 9 moves to 8, then (from 8) to 5: one net move.
    const b = planMoves(&.{ 5, 8 }, 10, content[0..2], &out);
    try std.testing.expectEqualSlices(Move, &.{.{ .from = 9, .to = 5 }}, b);
    // The last records: nothing moves.
    const c = planMoves(&.{ 8, 9 }, 10, content[0..2], &out);
    try std.testing.expectEqual(@as(usize, 0), c.len);
}
