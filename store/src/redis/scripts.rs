//! The Lua scripts of the Redis store: each runs atomically on one slot (all its keys
//! share a hash tag). `redis::Script` sends them by SHA (`EVALSHA`) and loads them
//! again when Redis does not know them (after a restart).

use std::sync::LazyLock;

use deadpool_redis::redis::Script;

/// Creates a client: its record if the name is free (`SET NX`) and its zeroed usage.
/// KEYS: record, usage. ARGV: the record's JSON. Returns 1 if created, 2 if that very
/// record is there already (an earlier attempt of this add landed), 0 if the name is
/// taken (by a key of another type too: a hand's, which GET would fail on).
pub(super) static ADD_CLIENT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
    return 0
  end
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    return 2
  end
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'up', 0, 'down', 0, 'conns', 0)
return 1
",
    )
});

/// Adds a usage delta if the client exists and this batch was not added before,
/// saturating each counter at `i64::MAX`: `HINCRBY` refuses to overflow, so its error
/// is caught and the maximum set instead.
/// KEYS: record, usage, the writer's last batch. ARGV: up, down, conns (decimal,
/// 0..=i64::MAX), the batch number, how long to remember it (seconds).
/// Returns 1 if added, 2 if that batch was added already (its key is written again, so
/// that a `WAIT` after the call covers the earlier add), 0 if there is no such client.
pub(super) static ADD_USAGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('GET', KEYS[3]) == ARGV[4] then
  -- Written again, so that a WAIT after this confirms what it found.
  redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[5])
  return 2
end
local fields = {'up', 'down', 'conns'}
for i = 1, 3 do
  if ARGV[i] ~= '0' then
    local reply = redis.pcall('HINCRBY', KEYS[2], fields[i], ARGV[i])
    if type(reply) == 'table' and reply.err then
      if string.find(reply.err, 'overflow', 1, true) then
        redis.call('HSET', KEYS[2], fields[i], '9223372036854775807')
      else
        return reply
      end
    end
  end
end
redis.call('SET', KEYS[3], ARGV[4], 'EX', ARGV[5])
return 1
",
    )
});

/// Updates the client index and appends to the change feed: takes the next seq
/// (`INCR`) and adds the entry `<seq>-0`, so seqs are strictly increasing.
/// KEYS: index, seq, feed. ARGV: name, kind (`upsert` or `remove`), and for a remove
/// `1` to append even when the name was not in the index (the caller removed a record).
/// An upsert adds the name to the index and always appends; a remove takes it out and
/// appends if it was there (or if forced). Returns the seq appended, or 0.
///
/// An entry someone else put in the feed above the counter (a hand's `XADD *`, a
/// counter deleted) would make `XADD` refuse every later seq: the seq then jumps
/// past the highest ID the feed ever had (`last-generated-id`, which deleting the
/// entry does not lower), and the counter with it. The index changes only
/// once the entry is in (a script is not rolled back when a command fails).
pub(super) static FEED_APPEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local upsert = ARGV[2] == 'upsert'
if not upsert and redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 and ARGV[3] ~= '1' then
  return 0
end
local seq = redis.call('INCR', KEYS[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[3])
  for i = 1, #info - 1, 2 do
    if info[i] == 'last-generated-id' then
      local top = tonumber(string.match(info[i + 1], '^(%d+)-'))
      if top and top >= seq then
        seq = top + 1
        redis.call('SET', KEYS[2], string.format('%d', seq))
      end
    end
  end
end
redis.call('XADD', KEYS[3], string.format('%d-0', seq), 'name', ARGV[1], 'kind', ARGV[2])
if upsert then
  redis.call('SADD', KEYS[1], ARGV[1])
else
  redis.call('SREM', KEYS[1], ARGV[1])
end
return seq
",
    )
});

/// Takes a client's egress identity on one node (only one taker gets it),
/// so that repeating the call gets the same answer: the identity taken is
/// kept under the call's receipt key for a while, and a call that finds
/// its receipt answers with it. (The Cluster client re-sends a call whose
/// connection broke or timed out, and a `GETDEL` repeated after it applied
/// would find nothing: the client's sticky source would be lost.)
/// KEYS: the identity key, the call's receipt (same slot). ARGV: how long
/// to keep the receipt (ms). Returns the identity's JSON, or nil.
pub(super) static TAKE_IDENTITY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kept = redis.call('GET', KEYS[2])
if kept then
  return kept
end
local taken = redis.call('GETDEL', KEYS[1])
if taken then
  redis.call('SET', KEYS[2], taken, 'PX', ARGV[1])
end
return taken
",
    )
});

/// Claims a WireGuard address for a client (`SET NX` of the address key to the name),
/// so that repeating the call gets the same answer: a claim made now is noted
/// under the call's receipt key for a while, and a call that finds its
/// receipt answers with it (a repeat would otherwise find the name's own
/// claim and call it an earlier one, and the add would not free it if it
/// then lost its name to another).
/// KEYS: the address key, the call's receipt. ARGV: the client's name, how
/// long to keep the receipt (ms).
/// Returns 1 if claimed now, 2 if that name held it already (an earlier or concurrent
/// add of the same name), 0 if another client holds it.
pub(super) static CLAIM_ADDRESS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('SET', KEYS[2], 1, 'PX', ARGV[2])
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 2
end
return 0
",
    )
});

/// Frees a WireGuard address if the client holds it (compare and delete).
/// KEYS: the address key. ARGV: the client's name. Returns 1 if freed, else 0.
pub(super) static RELEASE_ADDRESS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
",
    )
});

/// Replaces a client's record if it is still the one read (compare and set).
/// KEYS: record. ARGV: the record's JSON as read, the new JSON.
/// Returns 1 if replaced, 0 if the record changed meanwhile, -1 if it is gone.
pub(super) static REPLACE_CLIENT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local stored = redis.call('GET', KEYS[1])
if not stored then
  return -1
end
if stored ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
",
    )
});

/// Adds bytes to a client's quota count in one window, starting the count at
/// zero when the one kept is another window's (but not the next window of
/// the same period: that one takes the bytes), saturating at `i64::MAX`,
/// so that repeating the call counts once: the count an add of bytes
/// returned is kept under the call's receipt key for a while, and a call
/// that finds its receipt answers with it (the Cluster client re-sends a
/// call whose connection broke or timed out, after it may have applied).
/// KEYS: record, quota count, the call's receipt. ARGV: the window's key,
/// the bytes (decimal, 0..=i64::MAX), how long to keep the receipt (ms).
/// Returns the count, or -1 if there is no such client.
pub(super) static ADD_QUOTA_USAGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kept = redis.call('GET', KEYS[3])
if kept then
  return kept
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
local kept_window = redis.call('HGET', KEYS[2], 'window')
if kept_window ~= ARGV[1] then
  -- The next window of the same period kept (the adding node's clock lags)
  -- takes the bytes; anything else is replaced (quota_window::is_next:
  -- indexes of 1 to 15 digits, exact in a double).
  local next_one = false
  if kept_window then
    local kept_period, kept_index = string.match(kept_window, '^(.*):(%-?%d+)$')
    local period, index = string.match(ARGV[1], '^(.*):(%-?%d+)$')
    if kept_period ~= nil and period ~= nil and kept_period == period
      and #string.gsub(kept_index, '%-', '') <= 15
      and #string.gsub(index, '%-', '') <= 15 then
      next_one = tonumber(kept_index) == tonumber(index) + 1
    end
  end
  if not next_one then
    redis.call('HSET', KEYS[2], 'window', ARGV[1], 'bytes', 0)
  end
end
local count = redis.pcall('HINCRBY', KEYS[2], 'bytes', ARGV[2])
if type(count) == 'table' and count.err then
  if not string.find(count.err, 'overflow', 1, true) then
    return count
  end
  redis.call('HSET', KEYS[2], 'bytes', '9223372036854775807')
  -- As text: a Lua number cannot hold it exactly.
  count = '9223372036854775807'
else
  -- As Redis holds it: a Lua number would be stored as 1e+17 from there on.
  count = redis.call('HGET', KEYS[2], 'bytes')
end
if ARGV[2] ~= '0' then
  redis.call('SET', KEYS[3], count, 'PX', ARGV[3])
end
return count
",
    )
});

/// Records one node's open tunnels of a client and keeps the hash alive as
/// long as its longest-lived entry (raising its expiry, never lowering it;
/// Redis 6 has no `PEXPIRE GT`), and drops the entries that expired
/// before a time the writer gives (a plane that died without clearing its
/// own, under a name no process uses again, would stay while any other
/// kept the hash alive). KEYS: the client's live hash. ARGV: the node's
/// field, `<count>:<expires unix ms>`, the ttl in ms, the cut-off in unix
/// ms (entries that expired before it go).
pub(super) static PUT_LIVE_TUNNELS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local before = tonumber(ARGV[4])
if before then
  local entries = redis.call('HGETALL', KEYS[1])
  for i = 1, #entries, 2 do
    local expires = tonumber(string.match(entries[i + 1], ':(%d+)$'))
    if expires and expires < before and entries[i] ~= ARGV[1] then
      redis.call('HDEL', KEYS[1], entries[i])
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
",
    )
});

/// Every script, for loading them all when the store opens.
pub(super) fn all() -> [&'static Script; 9] {
    [
        &ADD_CLIENT,
        &ADD_USAGE,
        &FEED_APPEND,
        &TAKE_IDENTITY,
        &CLAIM_ADDRESS,
        &RELEASE_ADDRESS,
        &REPLACE_CLIENT,
        &ADD_QUOTA_USAGE,
        &PUT_LIVE_TUNNELS,
    ]
}
