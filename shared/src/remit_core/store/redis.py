"""Redis backend: plain Redis >= 7, core commands and Lua scripts only.

Every contract operation is **one Lua script** (EVALSHA through redis-py's
``register_script``, which re-loads a script on ``NOSCRIPT`` after a server
restart), so no decision is ever check-then-act across round trips. Timestamps
and lease expiry come from the server clock (``TIME`` inside the script), so
every host agrees on whether a lease has expired. Seconds are stored as strings
with six decimals (microseconds; Lua numbers are doubles).

Write scripts carry a ``#!lua`` shebang, so Redis refuses them *before* they
start when the server is out of memory (no half-applied script); read-only
scripts carry ``#!lua flags=no-writes``. Scripts check everything they need
before their first write, because Redis does not roll back a script that fails
half-way.

Durability: CV and EO need receipts that survive a restart. Opening a store
reads ``CONFIG GET appendonly`` / ``save`` and refuses (:class:`DurabilityError`)
a server that keeps nothing on disk, unless the URL says ``durability=none``.

URL options (removed before the URL reaches redis-py): ``prefix=NAME`` (default
``remit``), ``durability=none``, ``lease=SECONDS``. Every other query parameter
goes to redis-py's ``ConnectionPool.from_url``.

Key layout
==========

``P`` is the prefix. Every other key component is escaped (``%`` -> ``%25``,
``:`` -> ``%3A``, the same in Python and Lua) so that it contains no ``:``;
as each tag has a fixed number of components, two different tuples never
map to the same key. Index members that name a record hold the same escaped
components joined by ``:`` (``e(x)`` below), so a script rebuilds the key by
concatenation. Stores whose prefixes are ``A`` and ``A:tag...`` could overlap:
give independent stores prefixes that are not ``:``-extensions of each other.

========================================  ======  ==========================================
key                                       type    content
========================================  ======  ==========================================
``P:meta``                                hash    ``schema=remit``, ``version=N``
``P:seq``                                 string  store-wide checkpoint seq (``INCR``)
``P:runs``                                zset    run_id scored by updated_at (list_runs)
``P:cks``                                 zset    ``e(run):e(ns):e(id)`` scored by seq (all runs)
``P:known``                               set     every run_id that has any record (usage,
                                                  list_receipts and list_claims over all runs)
``P:run:e(run)``                          hash    created_at, updated_at
``P:rck:e(run)``                          zset    ``e(ns):e(id)`` scored by seq (one run)
``P:nss:e(run)``                          set     the run's namespaces that have checkpoints
``P:nck:e(run):e(ns)``                    zset    checkpoint_id scored by seq: the latest is
                                                  ``ZRANGE -1 -1``, one O(log n) lookup
``P:ck:e(run):e(ns):e(id)``               hash    the checkpoint: run_id, ns, checkpoint_id,
                                                  [parent_id], kind, [execution_id], data,
                                                  metadata, versions (JSON), created_at, seq
``P:kids:e(run):e(ns):e(parent):e(kind)`` set     child checkpoint ids (CO ``exclusive_child``)
``P:ex:e(execution_id)``                  set     ``e(run):e(ns):e(id)`` (delete_executions)
``P:blob:e(run):e(ns):e(ch):e(version)``  string  a channel value, ``SET NX``: stored once
``P:blobs:e(run)``                        set     ``e(ns):e(ch):e(version)`` of the run's blobs
``P:chunk:e(run):hex``                    string  a chunk of large values (``SET NX``), by the
                                                  hex SHA-256 of its bytes
``P:chunks:e(run)``                       set     the hex digests of the run's chunks
``P:w:e(run):e(ns):e(id)``                hash    pending writes of a checkpoint, field
                                                  ``e(task_id):idx``, value a JSON line
                                                  [task_id, idx, channel, task_path], then
                                                  the encoded value
``P:wrs:e(run)``                          set     ``e(ns):e(id)`` of the run's write hashes
``P:rc:e(key)``                           hash    an effect receipt (fields of ReceiptRow)
``P:rcs:e(run)``                          set     receipt keys of the run
``P:cl:e(key)``                           hash    a claim (fields of ClaimRow)
``P:cls:e(run)``                          set     claim keys of the run
``P:clh``                                 zset    key of every held claim (status
                                                  ``claimed``), scored by lease_until
                                                  (list_lapsed_claims)
``P:lc:e(run)``                           hash    a run's lifecycle (fields of RunRow; key is
                                                  the run id)
``P:lci``                                 zset    run_id of every lifecycle, scored by its
                                                  updated_at (list_runs with filters)
``P:lci:MASK:...``                        zset    the same, of the lifecycles whose stored
                                                  fields are the components: MASK (s, f, n,
                                                  sf, sn, fn or sfn) names which of status,
                                                  framework and name follow, in that order
``P:lcl``                                 zset    run_id of every running lifecycle, scored
                                                  by lease_until (running vs abandoned)
========================================  ======  ==========================================

Optional fields (parent_id, execution_id, completed_at, result, digest, value,
consumed_at, owner, waiting, error) are absent from their hash when None. Per-run index
sets let delete_run, copy_run, prune_run, usage and the listings work without KEYS or
SCAN over the keyspace. The lifecycle zsets, kept by the scripts that write a lifecycle,
let a filtered list_runs read the zset of exactly its equality filters (for running or
abandoned: that one or ``P:lcl``, whichever has fewer runs to read), never every run;
copy_run does not copy a lifecycle (it belongs to the run's executions). Scripts touch
keys they derive from stored data (index members, parents, blobs named by ``versions``,
the lifecycle zsets of a record's fields), so they are single-node only (plain Redis is
the target; not Redis Cluster). The directly addressed keys are declared in ``KEYS``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, cast
from urllib.parse import SplitResult, urlencode, urlunsplit

import redis
import redis.asyncio
import redis.exceptions
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from remit_core import aio
from remit_core.errors import DurabilityError, StoreConfigError, StoreUnavailable
from remit_core.records import (
    BlobRow,
    CheckpointRow,
    ClaimOutcome,
    ClaimRow,
    ReceiptOutcome,
    ReceiptRow,
    Recovery,
    RunEnd,
    RunInfo,
    RunQuery,
    RunRow,
    RunStartOutcome,
    WriteRow,
    versions_from_json,
    versions_json,
)
from remit_core.retry import retrying
from remit_core.serde import Serde
from remit_core.store.base import USAGE_KEYS, Found, Layout, LayoutChanged, Store
from remit_core.store.options import Parsed
from remit_core.urls import mask_url, password_hint, scrub, url_secrets

log = logging.getLogger("remit")


# Errors that a retry does not cure although redis-py files some under connection errors
# (ExternalAuthProviderError exists in newer redis-py only).
_AUTH_ERRORS: tuple[type[Exception], ...] = tuple(
    e for e in (AuthenticationError, AuthorizationError,
                getattr(redis.exceptions, "ExternalAuthProviderError", None))
    if isinstance(e, type))

# Append-only: never edit an entry, add a new one. Each entry is a Lua snippet that moves a
# store from the layout before it to its own (it runs inside the open script, atomically,
# with ``P`` and the prelude in scope). The store's version is len(MIGRATIONS).
MIGRATIONS: list[str] = [
    # 1: the key layout of the module docstring; its keys are created lazily.
    "",
    # 2: chunks of large values (remit_core.store.chunks), created lazily.
    "",
    # 3: run lifecycles (P:lc, P:lci..., P:lcl), created lazily: a store that had none
    #    has nothing to index.
    "",
    # 4: P:clh, the held claims by lease expiry, from the claims the store holds now
    r"""
for _, r in ipairs(redis.call('SMEMBERS', P .. ':known')) do
  for _, key in ipairs(redis.call('SMEMBERS', K('cls', r))) do
    local f = redis.call('HMGET', K('cl', key), 'status', 'lease_until')
    if f[1] == 'claimed' then redis.call('ZADD', P .. ':clh', f[2], key) end
  end
end
""",
]

DEFAULT_PREFIX = "remit"
DEFAULT_CONNECT_TIMEOUT = 5.0

# ==================================================================================== Lua

_PRELUDE = r"""
local P = ARGV[1]
local ESC = {['%'] = '%25', [':'] = '%3A'}
local function esc(s) return (string.gsub(s, '[%%:]', ESC)) end
-- the key of a tag and raw components (escaped here)
local function K(tag, ...)
  local parts = {P, tag}
  for _, v in ipairs({...}) do parts[#parts + 1] = esc(v) end
  return table.concat(parts, ':')
end
local function clock()  -- the server clock: every host agrees on lease expiry
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function fmt(x) return string.format('%.6f', x) end
-- the server clock as the records store their times (to the microsecond), so that a
-- decision and a caller that tells abandoned runs by the clock returned compare alike
local function stamp() return tonumber(fmt(clock())) end
local function int(x) return string.format('%d', x) end
local function hmap(flat)
  local m = {}
  for i = 1, #flat, 2 do m[flat[i]] = flat[i + 1] end
  return m
end

-- one checkpoint, the blob of each of its versions and (with_writes) its packed pending
-- writes: {HGETALL, {ch, value, ...}, {packed, ...}} or nil
local function entry(ck, with_writes)
  local h = redis.call('HGETALL', ck)
  if #h == 0 then return nil end
  local f = hmap(h)
  local blobs = {}
  for ch, ver in pairs(cjson.decode(f.versions)) do
    local v = redis.call('GET', K('blob', f.run_id, f.ns, ch, ver))
    if v then
      blobs[#blobs + 1] = ch
      blobs[#blobs + 1] = v
    end
  end
  local writes = {}
  if with_writes then writes = redis.call('HVALS', K('w', f.run_id, f.ns, f.checkpoint_id)) end
  return {h, blobs, writes}
end

-- blob members (e(ns):e(ch):e(ver)) referenced by the run's checkpoints outside `doomed`;
-- read-only, so that a corrupt versions field fails the script before any write
local function referenced(r, doomed)
  local refs = {}
  local base = P .. ':ck:' .. esc(r) .. ':'
  for _, m in ipairs(redis.call('ZRANGE', K('rck', r), 0, -1)) do
    local ck = base .. m
    if not doomed[ck] then
      local f = redis.call('HMGET', ck, 'ns', 'versions')
      if f[1] then
        local ens = esc(f[1]) .. ':'
        for ch, ver in pairs(cjson.decode(f[2])) do refs[ens .. esc(ch) .. ':' .. esc(ver)] = true end
      end
    end
  end
  return refs
end

-- delete one checkpoint with its writes and every index entry that names it
local function drop_ck(ck)
  local f = redis.call('HMGET', ck, 'run_id', 'ns', 'checkpoint_id', 'parent_id', 'kind',
                       'execution_id')
  if not f[1] then return end
  local r, ns, id = f[1], f[2], f[3]
  local m = esc(ns) .. ':' .. esc(id)
  redis.call('DEL', ck, K('w', r, ns, id))
  redis.call('SREM', K('wrs', r), m)
  redis.call('ZREM', K('nck', r, ns), id)
  if redis.call('EXISTS', K('nck', r, ns)) == 0 then redis.call('SREM', K('nss', r), ns) end
  redis.call('ZREM', K('rck', r), m)
  redis.call('ZREM', P .. ':cks', esc(r) .. ':' .. m)
  if f[4] then redis.call('SREM', K('kids', r, ns, f[4], f[5]), id) end
  if f[6] then redis.call('SREM', K('ex', f[6]), esc(r) .. ':' .. m) end
end

local MANIFEST = '\0\1'
local function tohex(s)
  return (string.gsub(s, '.', function(c) return string.format('%02x', string.byte(c)) end))
end
-- the digests (hex) a stored value names when it is a manifest, into `used`
local function note_chunks(v, used)
  if v and string.sub(v, 1, 2) == MANIFEST then
    for i = 3, #v, 32 do used[tohex(string.sub(v, i, i + 31))] = true end
  end
end

-- delete writes of checkpoints that do not exist, blobs that `refs` does not name, and
-- chunks that no remaining blob or write names
local function drop_orphans(r, refs)
  local er = esc(r) .. ':'
  for _, m in ipairs(redis.call('SMEMBERS', K('wrs', r))) do
    if redis.call('EXISTS', P .. ':ck:' .. er .. m) == 0 then
      redis.call('DEL', P .. ':w:' .. er .. m)
      redis.call('SREM', K('wrs', r), m)
    end
  end
  for _, m in ipairs(redis.call('SMEMBERS', K('blobs', r))) do
    if not refs[m] then
      redis.call('DEL', P .. ':blob:' .. er .. m)
      redis.call('SREM', K('blobs', r), m)
    end
  end
  if redis.call('SCARD', K('chunks', r)) == 0 then return end
  local used = {}
  for _, m in ipairs(redis.call('SMEMBERS', K('blobs', r))) do
    local key = P .. ':blob:' .. er .. m
    if redis.call('GETRANGE', key, 0, 1) == MANIFEST then note_chunks(redis.call('GET', key), used) end
  end
  for _, m in ipairs(redis.call('SMEMBERS', K('wrs', r))) do
    for _, packed in ipairs(redis.call('HVALS', P .. ':w:' .. er .. m)) do
      local nl = string.find(packed, '\n', 1, true)
      if nl then note_chunks(string.sub(packed, nl + 1), used) end
    end
  end
  for _, d in ipairs(redis.call('SMEMBERS', K('chunks', r))) do
    if not used[d] then
      redis.call('DEL', P .. ':chunk:' .. er .. d)
      redis.call('SREM', K('chunks', r), d)
    end
  end
end

-- store chunks given as ARGV[first..] (hex digest, bytes)*, n of them, for run r
local function put_chunks(r, first, n)
  for i = first, first + 2 * n - 1, 2 do
    redis.call('SET', K('chunk', r, ARGV[i]), ARGV[i + 1], 'NX')
    redis.call('SADD', K('chunks', r), ARGV[i])
  end
  return first + 2 * n
end

local function runs_of(has_run, r)
  if has_run == '1' then return {r} end
  return redis.call('SMEMBERS', P .. ':known')
end

-- what list_runs tells of run r besides its lifecycle: {created_at, updated_at,
-- checkpoints, latest checkpoint id, its kind}, false where the run has none
local function run_info(r)
  local h = redis.call('HMGET', K('run', r), 'created_at', 'updated_at')
  local rck = K('rck', r)
  local top = redis.call('ZRANGE', rck, -1, -1)
  local latest = {false, false}
  if #top == 1 then
    latest = redis.call('HMGET', P .. ':ck:' .. esc(r) .. ':' .. top[1], 'checkpoint_id', 'kind')
  end
  return {h[1], h[2], redis.call('ZCARD', rck), latest[1], latest[2]}
end

-- a < b bytewise, the order of the SQL backends' keys (Lua's own < follows the server's
-- locale: Redis sets LC_COLLATE from its environment)
local function bytes_lt(a, b)
  local n = math.min(#a, #b)
  local i = 1
  while i <= n and string.byte(a, i) == string.byte(b, i) do i = i + 1 end
  if i > n then return #a < #b end
  return string.byte(a, i) < string.byte(b, i)
end

-- The lifecycle listing index of the runs whose stored status, framework and name are
-- the given ones (false: any): a zset of run ids scored by updated_at, one for each
-- combination of the equality filters, so that a listing reads only matching runs.
local function lc_index(status, framework, name)
  local mask, parts = '', {}
  if status then
    mask = mask .. 's'
    parts[#parts + 1] = status
  end
  if framework then
    mask = mask .. 'f'
    parts[#parts + 1] = framework
  end
  if name then
    mask = mask .. 'n'
    parts[#parts + 1] = name
  end
  if mask == '' then return P .. ':lci' end
  return K('lci', mask, unpack(parts))
end

-- the eight listing indexes a lifecycle record (a field map) is in
local function lc_indexes(h)
  local out = {}
  for m = 0, 7 do
    out[#out + 1] = lc_index(m % 2 == 1 and h.status, m % 4 >= 2 and h.framework,
                             m >= 4 and h.name)
  end
  return out
end

-- move run r's index entries from its lifecycle as it was (`old`, a field map, {} for
-- none) to the lifecycle as it is (`new`, nil when deleted); lcl: the P:lcl key
local function lc_reindex(r, old, new, lcl)
  local keep = {}
  if new then
    for _, k in ipairs(lc_indexes(new)) do
      redis.call('ZADD', k, new.updated_at, r)
      keep[k] = true
    end
  end
  if old.status and old.framework and old.name then
    for _, k in ipairs(lc_indexes(old)) do
      if not keep[k] then redis.call('ZREM', k, r) end
    end
  end
  if new and new.status == 'running' then
    redis.call('ZADD', lcl, new.lease_until, r)
  else
    redis.call('ZREM', lcl, r)
  end
end
"""


#: the keys a layout check looks at, with the type remit keeps in each
_LAYOUT_TYPES = ("hash", "string", "zset", "zset", "set")  # meta, seq, runs, cks, known

# The layout as it is: the type of each key of _LAYOUT_TYPES and the meta fields.
# KEYS: meta, seq, runs, cks, known. ARGV: P.
_READ_LAYOUT = """
local types = {}
for i = 1, 5 do types[i] = redis.call('TYPE', KEYS[i])['ok'] end
local m = {false, false}
if types[1] == 'hash' then m = redis.call('HMGET', KEYS[1], 'schema', 'version') end
return {types, m[1] or false, m[2] or false}
"""

# The head of a migration script (Store._open_layout), whose body the layout session
# appends: nothing is written unless the version is still the one read ('' for none).
# KEYS: meta. ARGV: P, the version read.
_MIGRATE_HEAD = """
if (redis.call('HGET', KEYS[1], 'version') or '') ~= ARGV[2] then return 0 end
"""


class _Migration:
    """A layout session: the version read, and the Lua of the migration to run."""

    def __init__(self) -> None:
        self.read = ""
        self.lua: list[str] = []


# KEYS: 1 seq, 2 ck, 3 nck, 4 rck, 5 cks, 6 runs, 7 run, 8 known, 9 nss, 10 blobs, then per
#       grouped write (group commit: pending writes against the parent): w, wrs
# ARGV: 1 P, 2 run, 3 ns, 4 id, 5 has_parent, 6 parent, 7 kind, 8 has_exec, 9 exec, 10 data,
#       11 metadata, 12 versions, 13 exclusive, 14 n chunks, 15.. (hex digest, bytes)*n,
#       then per grouped write: overwrite, member, field, packed; then (channel, version,
#       value)*
_WRITE_CHECKPOINT = """
local r, ns, id, kind = ARGV[2], ARGV[3], ARGV[4], ARGV[7]
local parent = ARGV[5] == '1' and ARGV[6]
local exec = ARGV[8] == '1' and ARGV[9]
if ARGV[13] == '1' and parent then
  -- CO: one successor of a kind per parent, whoever writes first
  for _, other in ipairs(redis.call('SRANDMEMBER', K('kids', r, ns, parent, kind), 2)) do
    if other ~= id then return {0, other} end
  end
end
local now = fmt(clock())
local ens = esc(ns)
local first = put_chunks(r, 15, tonumber(ARGV[14]))
for i = 11, #KEYS, 2 do  -- the grouped writes, as _WRITE_WRITES stores them
  redis.call(ARGV[first] == '1' and 'HSET' or 'HSETNX', KEYS[i], ARGV[first + 2],
             ARGV[first + 3])
  redis.call('SADD', KEYS[i + 1], ARGV[first + 1])
  first = first + 4
end
for i = first, #ARGV, 3 do
  redis.call('SET', K('blob', r, ns, ARGV[i], ARGV[i + 1]), ARGV[i + 2], 'NX')
  redis.call('SADD', KEYS[10], ens .. ':' .. esc(ARGV[i]) .. ':' .. esc(ARGV[i + 1]))
end
redis.call('HSETNX', KEYS[7], 'created_at', now)
redis.call('HSET', KEYS[7], 'updated_at', now)
redis.call('ZADD', KEYS[6], now, r)
redis.call('SADD', KEYS[8], r)
local member = esc(r) .. ':' .. ens .. ':' .. esc(id)
local old = redis.call('HMGET', KEYS[2], 'seq', 'parent_id', 'kind', 'execution_id', 'created_at')
local seq, created
if old[1] then
  -- a rewrite keeps its seq and created_at
  seq, created = old[1], old[5]
  if old[2] and (old[2] ~= parent or old[3] ~= kind) then
    redis.call('SREM', K('kids', r, ns, old[2], old[3]), id)
  end
  if old[4] and old[4] ~= exec then redis.call('SREM', K('ex', old[4]), member) end
else
  seq, created = int(redis.call('INCR', KEYS[1])), now
  redis.call('ZADD', KEYS[3], seq, id)
  redis.call('ZADD', KEYS[4], seq, ens .. ':' .. esc(id))
  redis.call('ZADD', KEYS[5], seq, member)
  redis.call('SADD', KEYS[9], ns)
end
redis.call('HSET', KEYS[2], 'run_id', r, 'ns', ns, 'checkpoint_id', id, 'kind', kind,
           'data', ARGV[10], 'metadata', ARGV[11], 'versions', ARGV[12],
           'created_at', created, 'seq', seq)
if parent then
  redis.call('HSET', KEYS[2], 'parent_id', parent)
  redis.call('SADD', K('kids', r, ns, parent, kind), id)
else
  redis.call('HDEL', KEYS[2], 'parent_id')
end
if exec then
  redis.call('HSET', KEYS[2], 'execution_id', exec)
  redis.call('SADD', K('ex', exec), member)
else
  redis.call('HDEL', KEYS[2], 'execution_id')
end
return {tonumber(seq)}
"""

# KEYS: 1 nck. ARGV: 1 P, 2 run, 3 ns, 4 has_id, 5 id, 6 with_writes
_READ_CHECKPOINT = """
local id = ARGV[5]
if ARGV[4] ~= '1' then
  local top = redis.call('ZRANGE', KEYS[1], -1, -1)
  if #top == 0 then return false end
  id = top[1]
end
return entry(K('ck', ARGV[2], ARGV[3], id), ARGV[6] == '1') or false
"""

# KEYS: 1 cks, 2 runs. ARGV: 1 P, 2 has_run, 3 run, 4 has_ns, 5 ns, 6 has_before, 7 before,
#       8 limit ('' for none), 9 with_writes, 10 has_execution_ids, 11.. execution ids
_LIST_CHECKPOINTS = """
local with_writes = ARGV[9] == '1'
local run = ARGV[2] == '1' and ARGV[3]
local ns = ARGV[4] == '1' and ARGV[5]
local limit = tonumber(ARGV[8])
if limit and limit < 0 then limit = nil end
if limit == 0 then return {} end
local bseq = nil
if ARGV[6] == '1' then
  -- like the reference backend: the lowest seq of a checkpoint with that id (in the run)
  local runs = run and {run} or redis.call('ZRANGE', KEYS[2], 0, -1)
  for _, r in ipairs(runs) do
    for _, n in ipairs(redis.call('SMEMBERS', K('nss', r))) do
      local s = tonumber(redis.call('ZSCORE', K('nck', r, n), ARGV[7]))
      if s and (not bseq or s < bseq) then bseq = s end
    end
  end
  if not bseq then return {} end
end
local out = {}
if ARGV[10] == '1' then
  local seen, rows = {}, {}
  for i = 11, #ARGV do
    for _, m in ipairs(redis.call('SMEMBERS', K('ex', ARGV[i]))) do
      if not seen[m] then
        seen[m] = true
        local ck = P .. ':ck:' .. m
        local f = redis.call('HMGET', ck, 'run_id', 'ns', 'seq')
        local s = tonumber(f[3])
        if f[1] and (not run or f[1] == run) and (not ns or f[2] == ns)
            and (not bseq or s < bseq) then
          rows[#rows + 1] = {s, ck}
        end
      end
    end
  end
  table.sort(rows, function(a, b) return a[1] > b[1] end)
  for _, row in ipairs(rows) do
    if limit and #out >= limit then break end
    local e = entry(row[2], with_writes)
    if e then out[#out + 1] = e end
  end
  return out
end
local src, base
if run and ns then
  src = K('nck', run, ns)
  base = P .. ':ck:' .. esc(run) .. ':' .. esc(ns) .. ':'
elseif run then
  src, base = K('rck', run), P .. ':ck:' .. esc(run) .. ':'
else
  src, base = KEYS[1], P .. ':ck:'
end
local escape_member = run and ns
local max = bseq and ('(' .. int(bseq)) or '+inf'
while true do
  local batch = redis.call('ZRANGE', src, max, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 256,
                           'WITHSCORES')
  if #batch == 0 then return out end
  for i = 1, #batch, 2 do
    local ck = base .. (escape_member and esc(batch[i]) or batch[i])
    if run or not ns or redis.call('HGET', ck, 'ns') == ns then
      local e = entry(ck, with_writes)
      if e then
        out[#out + 1] = e
        if limit and #out >= limit then return out end
      end
    end
  end
  max = '(' .. batch[#batch]
end
"""

# KEYS: 1 runs. ARGV: 1 P, 2 limit ('' for none). Returns {now, {run, created_at,
# updated_at, checkpoints, latest id, latest kind, lifecycle HGETALL}...}
_LIST_RUNS = """
local now = fmt(stamp())
local limit = tonumber(ARGV[2])
local runs
if limit and limit >= 0 then
  if limit == 0 then return {} end
  local top = redis.call('ZRANGE', KEYS[1], 0, limit - 1, 'REV', 'WITHSCORES')
  if #top < 2 * limit then
    runs = {}
    for i = 1, #top, 2 do runs[#runs + 1] = top[i] end
  else
    -- ties at the cut: return them all; the caller orders by (updated_at desc, run_id)
    runs = redis.call('ZRANGE', KEYS[1], '+inf', top[#top], 'BYSCORE', 'REV')
  end
else
  runs = redis.call('ZRANGE', KEYS[1], 0, -1, 'REV')
end
local out = {}
for _, r in ipairs(runs) do
  local i = run_info(r)
  out[#out + 1] = {r, i[1], i[2], i[3], i[4], i[5], redis.call('HGETALL', K('lc', r))}
end
return {now, out}
"""

# ARGV: 1 P, 2 run
_DELETE_RUN = """
local r = ARGV[2]
local er = esc(r) .. ':'
for _, n in ipairs(redis.call('SMEMBERS', K('nss', r))) do
  for _, id in ipairs(redis.call('ZRANGE', K('nck', r, n), 0, -1)) do drop_ck(K('ck', r, n, id)) end
end
for _, m in ipairs(redis.call('SMEMBERS', K('wrs', r))) do redis.call('DEL', P .. ':w:' .. er .. m) end
for _, m in ipairs(redis.call('SMEMBERS', K('blobs', r))) do
  redis.call('DEL', P .. ':blob:' .. er .. m)
end
for _, d in ipairs(redis.call('SMEMBERS', K('chunks', r))) do
  redis.call('DEL', P .. ':chunk:' .. er .. d)
end
for _, key in ipairs(redis.call('SMEMBERS', K('rcs', r))) do
  if redis.call('HGET', K('rc', key), 'run_id') == r then redis.call('DEL', K('rc', key)) end
end
for _, key in ipairs(redis.call('SMEMBERS', K('cls', r))) do
  if redis.call('HGET', K('cl', key), 'run_id') == r then
    redis.call('DEL', K('cl', key))
    redis.call('ZREM', P .. ':clh', key)
  end
end
lc_reindex(r, hmap(redis.call('HGETALL', K('lc', r))), nil, P .. ':lcl')
redis.call('DEL', K('run', r), K('rck', r), K('nss', r), K('wrs', r), K('blobs', r), K('rcs', r),
           K('cls', r), K('chunks', r), K('lc', r))
redis.call('ZREM', P .. ':runs', r)
redis.call('SREM', P .. ':known', r)
return 1
"""

# KEYS: 1 seq, 2 runs, 3 known, 4 cks. ARGV: 1 P, 2 source, 3 target
_COPY_RUN = """
local src, tgt = ARGV[2], ARGV[3]
if redis.call('EXISTS', K('run', src)) == 0 then return 0 end
local now = fmt(clock())
redis.call('HSETNX', K('run', tgt), 'created_at', now)
redis.call('HSET', K('run', tgt), 'updated_at', now)
redis.call('ZADD', KEYS[2], now, tgt)
redis.call('SADD', KEYS[3], tgt)
if src == tgt then return 1 end
local es, et = esc(src) .. ':', esc(tgt) .. ':'
-- checkpoints in seq order, each with a new seq; an existing target checkpoint is kept
for _, m in ipairs(redis.call('ZRANGE', K('rck', src), 0, -1)) do
  local dst = P .. ':ck:' .. et .. m
  if redis.call('EXISTS', dst) == 0 then
    local h = redis.call('HGETALL', P .. ':ck:' .. es .. m)
    if #h > 0 then
      local f = hmap(h)
      local seq = int(redis.call('INCR', KEYS[1]))
      for i = 1, #h, 2 do
        local v = h[i + 1]
        if h[i] == 'run_id' then v = tgt elseif h[i] == 'seq' then v = seq end
        redis.call('HSET', dst, h[i], v)
      end
      redis.call('ZADD', K('nck', tgt, f.ns), seq, f.checkpoint_id)
      redis.call('ZADD', K('rck', tgt), seq, m)
      redis.call('ZADD', KEYS[4], seq, et .. m)
      redis.call('SADD', K('nss', tgt), f.ns)
      if f.parent_id then
        redis.call('SADD', K('kids', tgt, f.ns, f.parent_id, f.kind), f.checkpoint_id)
      end
      if f.execution_id then redis.call('SADD', K('ex', f.execution_id), et .. m) end
    end
  end
end
for _, m in ipairs(redis.call('SMEMBERS', K('blobs', src))) do
  redis.call('COPY', P .. ':blob:' .. es .. m, P .. ':blob:' .. et .. m)
  redis.call('SADD', K('blobs', tgt), m)
end
for _, d in ipairs(redis.call('SMEMBERS', K('chunks', src))) do
  redis.call('COPY', P .. ':chunk:' .. es .. d, P .. ':chunk:' .. et .. d)
  redis.call('SADD', K('chunks', tgt), d)
end
for _, m in ipairs(redis.call('SMEMBERS', K('wrs', src))) do
  local h = redis.call('HGETALL', P .. ':w:' .. es .. m)
  for i = 1, #h, 2 do redis.call('HSETNX', P .. ':w:' .. et .. m, h[i], h[i + 1]) end
  if #h > 0 then redis.call('SADD', K('wrs', tgt), m) end
end
return 1
"""

# ARGV: 1 P, 2 run, 3 keep_latest
_PRUNE_RUN = """
local r, keep = ARGV[2], math.max(0, tonumber(ARGV[3]))
local doomed = {}
for _, n in ipairs(redis.call('SMEMBERS', K('nss', r))) do
  for _, id in ipairs(redis.call('ZRANGE', K('nck', r, n), 0, -(keep + 1))) do
    doomed[K('ck', r, n, id)] = true
  end
end
local refs = referenced(r, doomed)
for ck in pairs(doomed) do drop_ck(ck) end
drop_orphans(r, refs)
return 1
"""

# ARGV: 1 P, 2.. execution ids
_DELETE_EXECUTIONS = """
local doomed, runs = {}, {}
for i = 2, #ARGV do
  for _, m in ipairs(redis.call('SMEMBERS', K('ex', ARGV[i]))) do
    local ck = P .. ':ck:' .. m
    local r = redis.call('HGET', ck, 'run_id')
    if r then
      doomed[ck] = true
      runs[r] = true
    end
  end
end
local refs = {}
for r in pairs(runs) do refs[r] = referenced(r, doomed) end
for ck in pairs(doomed) do drop_ck(ck) end
for r in pairs(runs) do drop_orphans(r, refs[r]) end
return 1
"""

# ARGV: 1 P, 2 has_run, 3 run
_USAGE = """
local c, b, bb, w, rc, cl, ch, chb = 0, 0, 0, 0, 0, 0, 0, 0
for _, r in ipairs(runs_of(ARGV[2], ARGV[3])) do
  local er = esc(r) .. ':'
  c = c + redis.call('ZCARD', K('rck', r))
  for _, d in ipairs(redis.call('SMEMBERS', K('chunks', r))) do
    ch = ch + 1
    chb = chb + redis.call('STRLEN', P .. ':chunk:' .. er .. d)
  end
  for _, m in ipairs(redis.call('SMEMBERS', K('blobs', r))) do
    b = b + 1
    bb = bb + redis.call('STRLEN', P .. ':blob:' .. er .. m)
  end
  for _, m in ipairs(redis.call('SMEMBERS', K('wrs', r))) do
    w = w + redis.call('HLEN', P .. ':w:' .. er .. m)
  end
  rc = rc + redis.call('SCARD', K('rcs', r))
  cl = cl + redis.call('SCARD', K('cls', r))
end
return {c, b, bb, w, rc, cl, ch, chb}
"""

# KEYS: 1 known, then per row: w, wrs. ARGV: 1 P, 2 overwrite, 3 run (of every row),
#       4 n chunks, 5.. (hex digest, bytes)*n, then per row: member, field, packed
_WRITE_WRITES = """
local cmd = ARGV[2] == '1' and 'HSET' or 'HSETNX'
local first = put_chunks(ARGV[3], 5, tonumber(ARGV[4]))
for i = 0, (#KEYS - 1) / 2 - 1 do
  local a = first + 3 * i
  redis.call(cmd, KEYS[2 + 2 * i], ARGV[a + 1], ARGV[a + 2])
  redis.call('SADD', KEYS[3 + 2 * i], ARGV[a])
end
redis.call('SADD', KEYS[1], ARGV[3])
return 1
"""

# The decision scripts below (_START_RECEIPT ... _RELEASE_CLAIM, _START_RUN ... _RENEW_RUN)
# are the one second copy of remit_core.store.decisions; tests/test_store_model.py checks
# them against it.

# decisions.start_receipt
# KEYS: 1 rc, 2 rcs, 3 known. ARGV: 1 P, 2 key, 3 run, 4 step, 5 name, 6 ordinal, 7 owner,
#       8 lease, 9 may_take_over
_START_RECEIPT = """
local now = clock()
local owner = ARGV[7]
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'key', ARGV[2], 'run_id', ARGV[3], 'step', ARGV[4], 'name', ARGV[5],
             'ordinal', ARGV[6], 'status', 'started', 'owner', owner, 'fence', 1,
             'lease_until', fmt(now + tonumber(ARGV[8])), 'started_at', fmt(now), 'attempt', 1)
  redis.call('SADD', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  return {'run', redis.call('HGETALL', KEYS[1])}
end
local f = redis.call('HMGET', KEYS[1], 'status', 'owner', 'lease_until')
if f[1] == 'completed' then return {'done', redis.call('HGETALL', KEYS[1])} end
-- a retried call of the same owner: it owns the receipt already
if f[2] == owner then return {'run', redis.call('HGETALL', KEYS[1])} end
if tonumber(f[3]) > now then return {'busy', redis.call('HGETALL', KEYS[1])} end
if ARGV[9] ~= '1' then return {'in_doubt', redis.call('HGETALL', KEYS[1])} end
redis.call('HSET', KEYS[1], 'owner', owner, 'lease_until', fmt(now + tonumber(ARGV[8])))
redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HINCRBY', KEYS[1], 'attempt', 1)
return {'taken_over', redis.call('HGETALL', KEYS[1]), f[2] or false}
"""

# decisions.COMPLETE_RECEIPT. KEYS: 1 rc. ARGV: 1 P, 2 owner, 3 fence, 4 result
_COMPLETE_RECEIPT = """
local f = redis.call('HMGET', KEYS[1], 'owner', 'fence')
if f[1] ~= ARGV[2] or tonumber(f[2]) ~= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], 'status', 'completed', 'result', ARGV[4],
           'completed_at', fmt(clock()))
return 1
"""

# decisions.RELEASE_RECEIPT. KEYS: 1 rc. ARGV: 1 P, 2 owner, 3 fence, 4 key
_RELEASE_RECEIPT = """
local f = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status', 'run_id')
if f[1] ~= ARGV[2] or tonumber(f[2]) ~= tonumber(ARGV[3]) or f[3] ~= 'started' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', K('rcs', f[4]), ARGV[4])
return 1
"""

# decisions.RENEW_RECEIPT and RENEW_CLAIM. KEYS: 1 rc or cl[, 2 clh for a claim]. ARGV: 1 P,
# 2 owner, 3 fence, 4 lease, 5 live status, 6 the claim's key (a claim)
_RENEW = """
local f = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status')
if f[1] ~= ARGV[2] or tonumber(f[2]) ~= tonumber(ARGV[3]) or f[3] ~= ARGV[5] then return 0 end
local until_ = fmt(clock() + tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], 'lease_until', until_)
if KEYS[2] then redis.call('ZADD', KEYS[2], until_, ARGV[6]) end
return 1
"""

# ARGV: 1 P, 2 has_run, 3 run, 4 tag of the record (rc or cl), 5 tag of the per-run set
_LIST_RECORDS = """
local out = {}
for _, r in ipairs(runs_of(ARGV[2], ARGV[3])) do
  for _, key in ipairs(redis.call('SMEMBERS', K(ARGV[5], r))) do
    local h = redis.call('HGETALL', K(ARGV[4], key))
    if #h > 0 then out[#out + 1] = h end
  end
end
return out
"""

# decisions.RESOLVE_RECEIPT. KEYS: 1 rc. ARGV: 1 P, 2 result
_RESOLVE_RECEIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'completed', 'result', ARGV[2], 'completed_at', fmt(clock()))
return 1
"""

# KEYS: 1 rc or cl. ARGV: 1 P, 2 key, 3 tag of the per-run set
_RESET = """
local r = redis.call('HGET', KEYS[1], 'run_id')
if not r then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', K(ARGV[3], r), ARGV[2])
if ARGV[3] == 'cls' then redis.call('ZREM', P .. ':clh', ARGV[2]) end
return 1
"""

# decisions.claim
# KEYS: 1 cl, 2 cls, 3 known, 4 clh. ARGV: 1 P, 2 key, 3 run, 4 owner, 5 lease, 6 has_digest,
#       7 digest, 8 has_value, 9 value
_CLAIM = """
local now = clock()
local owner = ARGV[4]
local until_ = fmt(now + tonumber(ARGV[5]))
local function set_payload()
  if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'digest', ARGV[7])
  else redis.call('HDEL', KEYS[1], 'digest') end
  if ARGV[8] == '1' then redis.call('HSET', KEYS[1], 'value', ARGV[9])
  else redis.call('HDEL', KEYS[1], 'value') end
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'key', ARGV[2], 'run_id', ARGV[3], 'status', 'claimed',
             'owner', owner, 'fence', 1, 'lease_until', until_, 'claimed_at', fmt(now))
  set_payload()
  redis.call('SADD', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  redis.call('ZADD', KEYS[4], until_, ARGV[2])
  return {'won', redis.call('HGETALL', KEYS[1])}
end
local f = redis.call('HMGET', KEYS[1], 'status', 'owner', 'lease_until', 'digest')
if f[1] == 'consumed' then return {'consumed', redis.call('HGETALL', KEYS[1])} end
if f[1] == 'released' then
  redis.call('HSET', KEYS[1], 'status', 'claimed', 'owner', owner, 'lease_until', until_,
             'claimed_at', fmt(now))
  redis.call('HINCRBY', KEYS[1], 'fence', 1)
  set_payload()
  redis.call('ZADD', KEYS[4], until_, ARGV[2])
  return {'won', redis.call('HGETALL', KEYS[1])}
end
-- a retried call of the same owner: it holds the claim already
if f[2] == owner then return {'reentered', redis.call('HGETALL', KEYS[1])} end
if tonumber(f[3]) > now then return {'held', redis.call('HGETALL', KEYS[1])} end
if ARGV[6] == '1' and f[4] and f[4] ~= ARGV[7] then
  return {'mismatch', redis.call('HGETALL', KEYS[1])}
end
-- LV: the holder died; take over with the recorded digest and value
redis.call('HSET', KEYS[1], 'owner', owner, 'lease_until', until_)
redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('ZADD', KEYS[4], until_, ARGV[2])
return {'taken_over', redis.call('HGETALL', KEYS[1]), f[2] or false}
"""

# decisions.consume_claim. KEYS: 1 cl, 2 clh. ARGV: 1 P, 2 owner, 3 fence, 4 has_digest,
# 5 digest, 6 key
_CONSUME_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, false} end
local f = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status')
if f[1] ~= ARGV[2] or tonumber(f[2]) ~= tonumber(ARGV[3]) or f[3] == 'released' then
  return {0, redis.call('HGETALL', KEYS[1])}
end
if f[3] == 'claimed' then
  redis.call('HSET', KEYS[1], 'status', 'consumed', 'consumed_at', fmt(clock()))
  if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'digest', ARGV[5]) end
  redis.call('ZREM', KEYS[2], ARGV[6])
end
return {1, redis.call('HGETALL', KEYS[1])}
"""

# decisions.RELEASE_CLAIM. KEYS: 1 cl, 2 clh. ARGV: 1 P, 2 owner, 3 fence, 4 key
_RELEASE_CLAIM = """
local f = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status')
if f[1] ~= ARGV[2] or tonumber(f[2]) ~= tonumber(ARGV[3]) or f[3] ~= 'claimed' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'released')
redis.call('ZREM', KEYS[2], ARGV[4])
return 1
"""

# Store.list_lapsed_claims: P:clh's part up to now (lease_until <= now), oldest first (ties
# by key, bytewise, as the zset orders them), in batches; the claims of runs parked under
# framework (and name). KEYS: 1 clh. ARGV: 1 P, 2 framework, 3 has_name, 4 name, 5 limit,
# 6 has_after, 7 after's lease_until, 8 after's key
_LIST_LAPSED_CLAIMS = """
local now = stamp()
local limit = tonumber(ARGV[5])
local name = ARGV[3] == '1' and ARGV[4]
local after = ARGV[6] == '1' and tonumber(ARGV[7])
local function before(a, b)  -- a < b, bytewise
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local out, skip = {}, 0
while #out < limit do
  local batch = redis.call('ZRANGE', KEYS[1], after and ARGV[7] or '-inf', fmt(now), 'BYSCORE',
                           'LIMIT', skip, 256, 'WITHSCORES')
  for i = 1, #batch, 2 do
    local key = batch[i]
    if not (after and tonumber(batch[i + 1]) == after and not before(ARGV[8], key)) then
      local h = redis.call('HGETALL', K('cl', key))
      local c = hmap(h)
      if c.status == 'claimed' then
        local f = redis.call('HMGET', K('lc', c.run_id), 'status', 'framework', 'name')
        if f[1] == 'parked' and f[2] == ARGV[2] and (not name or f[3] == name) then
          out[#out + 1] = h
          if #out >= limit then break end
        end
      end
    end
  end
  if #batch < 512 then break end
  skip = skip + 256
end
return out
"""

# decisions.start_run, as a function of the scripts that start or take runs: decide for
# the lifecycle at key `lc` (run r) at time `now` and write the verdict. Returns {outcome,
# HGETALL or false, now[, previous owner]}. `rec`: nil when not recovering, else
# {retake = ",failed,needs-attention,", most = max_attempts (0: none), exhausted = the
# error of an abandoned run whose attempts are spent, or false}
_START_RUN_FN = """
local function start_run(lc, lcl, r, framework, name, owner, lease, rec, now)
  local recovering = rec ~= nil
  local until_ = fmt(now + lease)
  local flat = redis.call('HGETALL', lc)
  local old = hmap(flat)
  local function kept(outcome) return {outcome, flat, fmt(now)} end
  local function wrote(outcome, ...)
    local h = redis.call('HGETALL', lc)
    lc_reindex(r, old, hmap(h), lcl)
    return {outcome, h, fmt(now), ...}
  end
  if #flat == 0 then
    if recovering then return {'missing', false, fmt(now)} end
    redis.call('HSET', lc, 'key', r, 'run_id', r, 'framework', framework, 'name', name,
               'status', 'running', 'owner', owner, 'fence', 1, 'lease_until', until_,
               'attempts', 1, 'started_at', fmt(now), 'updated_at', fmt(now))
    return wrote('started')
  end
  -- computed before the first write: a corrupt record fails the script before it writes
  local fence, attempts = int(tonumber(old.fence) + 1), int(tonumber(old.attempts) + 1)
  local spent = recovering and rec.most > 0 and tonumber(old.attempts) >= rec.most
  if old.status == 'running' then
    -- a retried call, or the recoverer's own run entering: it is the executor already
    if old.owner == owner then return kept('reentered') end
    if tonumber(old.lease_until) > now then return kept('busy') end
    if spent then
      redis.call('HSET', lc, 'status', 'failed', 'lease_until', fmt(0), 'updated_at', fmt(now))
      redis.call('HDEL', lc, 'owner', 'waiting', 'error')
      if rec.exhausted then redis.call('HSET', lc, 'error', rec.exhausted) end
      return wrote('exhausted')
    end
    -- LV: the executor died or stalled; the run is taken over where it is (a recovery
    -- keeps the run's framework and name)
    if not recovering then redis.call('HSET', lc, 'framework', framework, 'name', name) end
    redis.call('HSET', lc, 'owner', owner, 'fence', fence, 'lease_until', until_,
               'attempts', attempts, 'updated_at', fmt(now))
    return wrote('taken_over', old.owner or false)
  end
  local outcome = 'started'
  if recovering then
    -- parked for a person, finished, ...: nothing to recover, unless asked to retake it
    if not string.find(rec.retake, ',' .. old.status .. ',', 1, true) then
      return kept('not_abandoned')
    end
    if spent then return kept('exhausted') end
    outcome = 'taken_over'
  else
    redis.call('HSET', lc, 'framework', framework, 'name', name)
  end
  redis.call('HSET', lc, 'status', 'running',
             'owner', owner, 'fence', fence, 'lease_until', until_, 'attempts', attempts,
             'started_at', fmt(now), 'updated_at', fmt(now))
  redis.call('HDEL', lc, 'waiting', 'error')
  return wrote(outcome)
end
"""

# decisions.start_run for one run.
# KEYS: 1 lc, 2 lcl. ARGV: 1 P, 2 run, 3 framework, 4 name, 5 owner, 6 lease, 7 recovering,
# 8 the statuses a recovery retakes (",failed,needs-attention,"), 9 max_attempts (0: none),
# 10 has exhausted, 11 exhausted (the error of an abandoned run whose attempts are spent)
_START_RUN = _START_RUN_FN + """
local rec = nil
if ARGV[7] == '1' then
  rec = {retake = ARGV[8], most = tonumber(ARGV[9]), exhausted = ARGV[10] == '1' and ARGV[11]}
end
return start_run(KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), rec,
                 stamp())
"""

# Store.take_runs: up to `limit` abandoned runs of one framework (and name), oldest
# expired lease first, each taken by start_run as recovering (at one time: the script's
# now). Only P:lcl's expired part is read, in batches, each run's framework and name
# checked on its record. Returns {{outcome, HGETALL, now[, previous owner]}...} of the runs
# taken over or exhausted (a run the caller executes already is passed over, as SQL does).
# KEYS: 1 lcl. ARGV: 1 P, 2 framework, 3 has_name, 4 name, 5 owner, 6 lease, 7 limit,
#       8 max_attempts (0: none), 9 has exhausted, 10 exhausted
_TAKE_RUNS = _START_RUN_FN + """
local now = stamp()
local limit = tonumber(ARGV[7])
local framework, name = ARGV[2], ARGV[3] == '1' and ARGV[4]
local rec = {retake = ',', most = tonumber(ARGV[8]), exhausted = ARGV[9] == '1' and ARGV[10]}
local out, skip = {}, 0
while #out < limit do
  local batch = redis.call('ZRANGE', KEYS[1], '-inf', fmt(now), 'BYSCORE', 'LIMIT', skip, 256)
  for _, r in ipairs(batch) do
    local f = redis.call('HMGET', K('lc', r), 'framework', 'name')
    if f[1] == framework and (not name or f[2] == name) then
      local got = start_run(K('lc', r), KEYS[1], r, '', '', ARGV[5], tonumber(ARGV[6]), rec,
                            now)
      if got[1] == 'taken_over' or got[1] == 'exhausted' then
        -- taken or failed, it left the expired part of P:lcl
        out[#out + 1] = got
        skip = skip - 1
        if #out >= limit then break end
      end
    end
  end
  if #batch < 256 then break end
  skip = skip + #batch
end
return out
"""

# decisions.end_run. KEYS: 1 lc, 2 lcl. ARGV: 1 P, 2 owner, 3 fence, 4 status (parked, done
# or failed), 5 has_detail, 6 detail, 7 run
_END_RUN = """
local old = hmap(redis.call('HGETALL', KEYS[1]))
if old.owner ~= ARGV[2] or tonumber(old.fence) ~= tonumber(ARGV[3]) or old.status ~= 'running' then
  return 0
end
local status = ARGV[4]
redis.call('HSET', KEYS[1], 'status', status, 'lease_until', fmt(0), 'updated_at', fmt(stamp()))
redis.call('HDEL', KEYS[1], 'owner', 'waiting', 'error')
if ARGV[5] == '1' and (status == 'parked' or status == 'needs-attention') then
  redis.call('HSET', KEYS[1], 'waiting', ARGV[6])
elseif ARGV[5] == '1' and status == 'failed' then redis.call('HSET', KEYS[1], 'error', ARGV[6])
end
lc_reindex(ARGV[7], old, hmap(redis.call('HGETALL', KEYS[1])), KEYS[2])
return 1
"""

# decisions.import_run: only where the run has no lifecycle, or over the record it replaces
# while that is still the stored one. KEYS: 1 lc, 2 lcl. ARGV: 1 P, 2 run, 3 framework,
# 4 name, 5 status (abandoned, parked, done, failed, needs-attention), 6 owner,
# 7 has_detail, 8 detail, 9 replaces, 10 its fence, 11 its updated_at
_IMPORT_RUN = """
local old = hmap(redis.call('HGETALL', KEYS[1]))
local fence, attempts = 1, 1
if old.key then
  if ARGV[9] ~= '1' or tonumber(old.fence) ~= tonumber(ARGV[10])
      or tonumber(old.updated_at) ~= tonumber(ARGV[11]) then
    return 0
  end
  fence, attempts = tonumber(old.fence) + 1, tonumber(old.attempts) + 1
  redis.call('HDEL', KEYS[1], 'owner', 'waiting', 'error')
end
local now, status = fmt(stamp()), ARGV[5]
local running = status == 'abandoned'
redis.call('HSET', KEYS[1], 'key', ARGV[2], 'run_id', ARGV[2], 'framework', ARGV[3],
           'name', ARGV[4], 'status', running and 'running' or status, 'fence', int(fence),
           'lease_until', now, 'attempts', int(attempts), 'started_at', now, 'updated_at', now)
if running then redis.call('HSET', KEYS[1], 'owner', ARGV[6]) end
if ARGV[7] == '1' and (status == 'parked' or status == 'needs-attention') then
  redis.call('HSET', KEYS[1], 'waiting', ARGV[8])
elseif ARGV[7] == '1' and status == 'failed' then redis.call('HSET', KEYS[1], 'error', ARGV[8])
end
lc_reindex(ARGV[2], old, hmap(redis.call('HGETALL', KEYS[1])), KEYS[2])
return 1
"""

# decisions.RENEW_RUN: only the lease changes (not updated_at), so only P:lcl moves.
# KEYS: 1 lc, 2 lcl. ARGV: 1 P, 2 owner, 3 fence, 4 lease, 5 run
_RENEW_RUN = """
local f = redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status')
if f[1] ~= ARGV[2] or tonumber(f[2]) ~= tonumber(ARGV[3]) or f[3] ~= 'running' then return 0 end
local until_ = fmt(stamp() + tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], 'lease_until', until_)
redis.call('ZADD', KEYS[2], until_, ARGV[5])
return 1
"""

# The lifecycle and the clock, in one read. KEYS: 1 lc. ARGV: 1 P
_GET_RUN = """
return {redis.call('HGETALL', KEYS[1]), fmt(stamp())}
"""

# The lifecycles that match, newest updated_at first (ties: run id bytewise), each with
# run_info. Returns {now, {HGETALL, created_at, updated_at, checkpoints, latest id,
# latest kind}...}.
# KEYS: 1 lcl. ARGV: 1 P, 2 status ('' for any), 3 has_framework, 4 framework, 5 has_name,
#       6 name, 7 has_before, 8 before, 9 has_cursor, 10 cursor updated_at, 11 cursor run,
#       12 limit ('' for none)
_LIST_LIFECYCLES = """
local now = stamp()
local limit = tonumber(ARGV[12])
if limit and limit < 0 then limit = nil end
if limit == 0 then return {fmt(now), {}} end
local want = ARGV[2] ~= '' and ARGV[2]
-- running and abandoned are both stored running: the lease tells them apart
local lease = (want == 'running' or want == 'abandoned') and want
local status = lease and 'running' or want
local framework = ARGV[3] == '1' and ARGV[4]
local name = ARGV[5] == '1' and ARGV[6]
local before = ARGV[7] == '1' and tonumber(ARGV[8])
local cu, cr = ARGV[9] == '1' and tonumber(ARGV[10]), ARGV[11]
-- the highest updated_at that may be listed: before (excluded) or the cursor's (included,
-- for the runs after the cursor's in id order)
local hi, hi_num = '+inf', nil
if before then hi = '(' .. ARGV[8] end
if cu and (not before or cu < before) then hi, hi_num = ARGV[10], cu end

local rows = {}  -- {updated_at, run}
local function consider(r)
  -- every filter is checked on the record itself (the index only chose the candidates);
  -- the whole record is read for the rows listed only
  local f = redis.call('HMGET', K('lc', r), 'status', 'framework', 'name', 'lease_until',
                       'updated_at')
  if not f[1] or (status and f[1] ~= status) or (framework and f[2] ~= framework)
      or (name and f[3] ~= name) then return end
  if lease and (tonumber(f[4]) > now) ~= (lease == 'running') then return end
  local u = tonumber(f[5])
  if before and not (u < before) then return end
  if cu and not (u < cu or (u == cu and bytes_lt(cr, r))) then return end
  rows[#rows + 1] = {u, r}
end

local src = lc_index(status, framework, name)
local by_lease = false
if lease then
  -- P:lcl has exactly the running runs whose lease has (not) ended, read whole; a scan
  -- of `src` also reads the others, but stops after `limit` matches: take the one that
  -- reads fewer runs
  local lo_, hi_ = '-inf', fmt(now)
  if lease == 'running' then lo_, hi_ = '(' .. fmt(now), '+inf' end
  local n = redis.call('ZCOUNT', KEYS[1], lo_, hi_)
  local scan = redis.call('ZCOUNT', src, '-inf', hi)
  if limit then scan = math.min(scan, limit * scan / math.max(1, math.min(scan, n))) end
  if n <= scan then
    by_lease = true
    for _, r in ipairs(redis.call('ZRANGE', KEYS[1], lo_, hi_, 'BYSCORE')) do consider(r) end
  end
end
if not by_lease then
  -- newest first, in batches; once `limit` rows are found, only the ties of the last one
  -- are read (the sort below orders them by run id)
  local skip, cut = 0, nil
  while true do
    local batch = redis.call('ZRANGE', src, hi, '-inf', 'BYSCORE', 'REV', 'LIMIT', skip, 256,
                             'WITHSCORES')
    local stop = false
    for i = 1, #batch, 2 do
      local score = tonumber(batch[i + 1])
      if cut and score < cut then
        stop = true
        break
      end
      consider(batch[i])
      if limit and not cut and #rows >= limit then cut = score end
    end
    if stop or #batch < 512 then break end
    -- go on from the last score, past its members read already (equal scores keep their
    -- order in a zset, and nothing changes under a script)
    local last = batch[#batch]
    local same = 0
    for i = #batch, 2, -2 do
      if batch[i] ~= last then break end
      same = same + 1
    end
    if hi_num and tonumber(last) == hi_num then skip = skip + same else skip = same end
    hi, hi_num = last, tonumber(last)
  end
end

table.sort(rows, function(a, b)
  if a[1] ~= b[1] then return a[1] > b[1] end
  return bytes_lt(a[2], b[2])
end)
local out = {}
for i = 1, (limit and math.min(limit, #rows) or #rows) do
  local r = rows[i][2]
  local info = run_info(r)
  out[i] = {redis.call('HGETALL', K('lc', r)), info[1], info[2], info[3], info[4], info[5]}
end
return {fmt(now), out}
"""


class _Blocking:
    """A ``redis.asyncio`` client used as the sync one, inside
    :func:`remit_core.aio.run`: each command awaits the async one."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._a = client

    def __getattr__(self, name: str) -> Callable[..., Any]:
        command = getattr(self._a, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return aio.wait(command(*args, **kwargs))
        return call


class _Script:
    """A registered Lua script, run on the operation's client (:attr:`RedisStore._redis`):
    ``EVALSHA``, loading it again on ``NOSCRIPT``."""

    def __init__(self, script: Any, store: RedisStore) -> None:
        self._script = script
        self._store = store

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        return self._script(keys=keys, args=args, client=self._store._redis)


def _script_source(body: str, *, writes: bool) -> str:
    shebang = "#!lua" if writes else "#!lua flags=no-writes"
    return f"{shebang}\n{_PRELUDE}\n{body}"


#: the most lifecycles one listing script reads (a longer listing is read page by page)
LIST_PAGE = 500


# ================================================================================= helpers


def _esc(part: str) -> str:
    """Escape one key component so that it contains no ':' (the Lua ``esc`` twin)."""
    return part.replace("%", "%25").replace(":", "%3A")


def _flag(value: object) -> str:
    return "0" if value is None else "1"


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _hash(flat: Sequence[bytes] | Mapping[bytes, bytes]) -> dict[str, bytes]:
    if isinstance(flat, Mapping):
        return {_str(k): v for k, v in flat.items()}
    it = iter(flat)
    return {_str(k): v for k, v in zip(it, it, strict=True)}


def _opt_str(h: Mapping[str, bytes], name: str) -> str | None:
    v = h.get(name)
    return None if v is None else v.decode()


def _opt_float(h: Mapping[str, bytes], name: str) -> float | None:
    v = h.get(name)
    return None if v is None else float(v)


def _chunk_args(chunks: Mapping[bytes, bytes]) -> list[Any]:
    """``n, (hex digest, bytes)*n``: a script's chunk arguments (``put_chunks``)."""
    out: list[Any] = [len(chunks)]
    for digest, value in chunks.items():
        out += [digest.hex(), value]
    return out


def _pack_write(w: WriteRow) -> bytes:
    """A write as stored: a JSON header line, then the encoded value as it is (JSON escapes
    newlines, so the first newline ends the header)."""
    head = json.dumps([w.task_id, w.idx, w.channel, w.task_path], ensure_ascii=False)
    return head.encode() + b"\n" + w.value


def _write_args(w: WriteRow) -> list[Any]:
    """A write's script arguments: its member of the run's write index (its checkpoint),
    its field in the checkpoint's writes (its task and index), and what is stored."""
    return [f"{_esc(w.ns)}:{_esc(w.checkpoint_id)}", f"{_esc(w.task_id)}:{w.idx}",
            _pack_write(w)]


def _ck_row(h: Mapping[str, bytes]) -> CheckpointRow:
    return CheckpointRow(
        run_id=h["run_id"].decode(), ns=h["ns"].decode(),
        checkpoint_id=h["checkpoint_id"].decode(), parent_id=_opt_str(h, "parent_id"),
        kind=h["kind"].decode(), execution_id=_opt_str(h, "execution_id"),
        data=h["data"], metadata=h["metadata"], versions=versions_from_json(h["versions"]),
        created_at=float(h["created_at"]), seq=int(h["seq"]),
    )


def _rc_row(h: Mapping[str, bytes]) -> ReceiptRow:
    return ReceiptRow(
        key=h["key"].decode(), run_id=h["run_id"].decode(), step=h["step"].decode(),
        name=h["name"].decode(), ordinal=int(h["ordinal"]),
        status=cast(Any, h["status"].decode()), owner=_opt_str(h, "owner"),
        fence=int(h["fence"]), lease_until=float(h["lease_until"]),
        started_at=float(h["started_at"]), completed_at=_opt_float(h, "completed_at"),
        result=h.get("result"), attempt=int(h["attempt"]),
    )


def _cl_row(h: Mapping[str, bytes]) -> ClaimRow:
    return ClaimRow(
        key=h["key"].decode(), run_id=h["run_id"].decode(),
        status=cast(Any, h["status"].decode()), owner=_opt_str(h, "owner"),
        fence=int(h["fence"]), lease_until=float(h["lease_until"]),
        digest=_opt_str(h, "digest"), value=h.get("value"),
        claimed_at=float(h["claimed_at"]), consumed_at=_opt_float(h, "consumed_at"),
    )


def _lc_row(h: Mapping[str, bytes]) -> RunRow:
    return RunRow(
        key=h["key"].decode(), run_id=h["run_id"].decode(), framework=h["framework"].decode(),
        name=h["name"].decode(), status=cast(Any, h["status"].decode()),
        owner=_opt_str(h, "owner"), fence=int(h["fence"]), lease_until=float(h["lease_until"]),
        waiting=h.get("waiting"), error=h.get("error"), attempts=int(h["attempts"]),
        started_at=float(h["started_at"]), updated_at=float(h["updated_at"]),
    )


def _run_info(row: RunRow, created: bytes | None, updated: bytes | None, n: int,
              latest: bytes | None, kind: bytes | None) -> RunInfo:
    """A lifecycle's run as list_runs gives it (a run without checkpoints: its times are
    the lifecycle's)."""
    return RunInfo(row.run_id, row.started_at if created is None else float(created),
                   row.updated_at if updated is None else float(updated), int(n),
                   None if latest is None else _str(latest), None if kind is None else _str(kind))


def _entry(raw: Sequence[Any]) -> Found:
    h, blobs, packed = raw
    row = _ck_row(_hash(h))
    writes = []
    for p in packed:
        head, _, value = p.partition(b"\n")
        task_id, idx, channel, task_path = json.loads(head)
        writes.append(WriteRow(row.run_id, row.ns, row.checkpoint_id, task_id, int(idx),
                               channel, value, task_path))
    writes.sort(key=lambda w: (w.task_id, w.idx))
    return row, _hash(blobs), writes


class _Keys:
    """Key names (see the module docstring); components are escaped here."""

    def __init__(self, prefix: str) -> None:
        self.p = prefix
        self.meta = f"{prefix}:meta"
        self.seq = f"{prefix}:seq"
        self.runs = f"{prefix}:runs"
        self.cks = f"{prefix}:cks"
        self.known = f"{prefix}:known"
        self.lcl = f"{prefix}:lcl"
        self.clh = f"{prefix}:clh"

    def _k(self, tag: str, *parts: str) -> str:
        return ":".join([self.p, tag, *(_esc(p) for p in parts)])

    def run(self, r: str) -> str:
        return self._k("run", r)

    def rck(self, r: str) -> str:
        return self._k("rck", r)

    def nss(self, r: str) -> str:
        return self._k("nss", r)

    def nck(self, r: str, ns: str) -> str:
        return self._k("nck", r, ns)

    def ck(self, r: str, ns: str, cid: str) -> str:
        return self._k("ck", r, ns, cid)

    def blobs(self, r: str) -> str:
        return self._k("blobs", r)

    def chunk(self, r: str, digest: bytes) -> str:
        return self._k("chunk", r, digest.hex())

    def w(self, r: str, ns: str, cid: str) -> str:
        return self._k("w", r, ns, cid)

    def wrs(self, r: str) -> str:
        return self._k("wrs", r)

    def rc(self, key: str) -> str:
        return self._k("rc", key)

    def rcs(self, r: str) -> str:
        return self._k("rcs", r)

    def cl(self, key: str) -> str:
        return self._k("cl", key)

    def cls(self, r: str) -> str:
        return self._k("cls", r)

    def lc(self, r: str) -> str:
        return self._k("lc", r)


# =================================================================================== store


def _loading(exc: BaseException) -> bool:
    """A server loading its AOF: it answers soon."""
    return isinstance(exc, (BusyLoadingError, TryAgainError))


class RedisStore(Store):
    """A store in plain Redis (>= 7), every contract operation one Lua script."""

    backend = "redis"
    migrations = MIGRATIONS
    layout_noun = "key layout"
    native_async = True
    groups_writes = True
    layout_advice = "Use another prefix (?prefix=NAME) or another database"

    def __init__(self, url: str, driver_url: str, *, prefix: str = DEFAULT_PREFIX,
                 durability: bool = True, serde: Serde | None = None, lease: float,
                 options: Mapping[str, Any] | None = None, read_only: bool = False,
                 secrets: Sequence[str] = ()) -> None:
        super().__init__(mask_url(url), serde=serde, lease=lease, read_only=read_only)
        self.prefix = prefix
        self._k = _Keys(prefix)
        self.layout_place = f" (prefix {prefix!r})"
        self.meta_name = self._k.meta
        self._secrets = list(secrets)
        kwargs: dict[str, Any] = {"socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT}
        kwargs.update(options or {})
        kwargs["decode_responses"] = False  # values are bytes; the serde decodes them
        try:
            self._pool = redis.ConnectionPool.from_url(driver_url, **kwargs)
        except (ValueError, TypeError) as exc:
            raise StoreConfigError(
                f"cannot use {self.url!r}: {scrub(str(exc), self._secrets)}.{password_hint(url)}",
                url=self.url) from None
        self._sync_redis = redis.Redis(connection_pool=self._pool)
        self._driver = (driver_url, kwargs)
        #: coroutines' clients: one per event loop (redis.asyncio's connections belong to
        #: the loop that opened them)
        self._aclients: aio.PerLoop[redis.asyncio.Redis] = aio.PerLoop(
            self._new_aclient, lambda client: client.aclose(close_connection_pool=True))

        def r(source: str) -> _Script:
            return _Script(self._sync_redis.register_script(source), self)
        self._s_read_layout = r(_script_source(_READ_LAYOUT, writes=False))
        self._s_write_ck = r(_script_source(_WRITE_CHECKPOINT, writes=True))
        self._s_read_ck = r(_script_source(_READ_CHECKPOINT, writes=False))
        self._s_list_ck = r(_script_source(_LIST_CHECKPOINTS, writes=False))
        self._s_list_runs = r(_script_source(_LIST_RUNS, writes=False))
        self._s_delete_run = r(_script_source(_DELETE_RUN, writes=True))
        self._s_copy_run = r(_script_source(_COPY_RUN, writes=True))
        self._s_prune = r(_script_source(_PRUNE_RUN, writes=True))
        self._s_delete_ex = r(_script_source(_DELETE_EXECUTIONS, writes=True))
        self._s_usage = r(_script_source(_USAGE, writes=False))
        self._s_write_writes = r(_script_source(_WRITE_WRITES, writes=True))
        self._s_start_rc = r(_script_source(_START_RECEIPT, writes=True))
        self._s_complete_rc = r(_script_source(_COMPLETE_RECEIPT, writes=True))
        self._s_release_rc = r(_script_source(_RELEASE_RECEIPT, writes=True))
        self._s_renew = r(_script_source(_RENEW, writes=True))
        self._s_list_records = r(_script_source(_LIST_RECORDS, writes=False))
        self._s_resolve_rc = r(_script_source(_RESOLVE_RECEIPT, writes=True))
        self._s_reset = r(_script_source(_RESET, writes=True))
        self._s_claim = r(_script_source(_CLAIM, writes=True))
        self._s_consume = r(_script_source(_CONSUME_CLAIM, writes=True))
        self._s_release_cl = r(_script_source(_RELEASE_CLAIM, writes=True))
        self._s_list_lapsed = r(_script_source(_LIST_LAPSED_CLAIMS, writes=False))
        self._s_start_run = r(_script_source(_START_RUN, writes=True))
        self._s_take_runs = r(_script_source(_TAKE_RUNS, writes=True))
        self._s_end_run = r(_script_source(_END_RUN, writes=True))
        self._s_import_run = r(_script_source(_IMPORT_RUN, writes=True))
        self._s_renew_run = r(_script_source(_RENEW_RUN, writes=True))
        self._s_get_run = r(_script_source(_GET_RUN, writes=False))
        self._s_list_lc = r(_script_source(_LIST_LIFECYCLES, writes=False))
        try:
            self._open_checks(durability)
        except BaseException:
            self._pool.disconnect()
            raise

    @classmethod
    def _from_url(cls, url: str, parts: SplitResult, parsed: Parsed, *, serde: Serde | None,
                  read_only: bool) -> RedisStore:
        opts = parsed.values
        driver_url = urlunsplit((parts.scheme, parts.netloc, parts.path,
                                 urlencode(parsed.driver_query), parts.fragment))
        return cls(url, driver_url, prefix=opts["prefix"],
                   durability=opts["durability"] == "required", serde=serde,
                   lease=opts["lease"], options=parsed.driver_kwargs, read_only=read_only,
                   secrets=url_secrets(url))

    # ----------------------------------------------------------------------------- lifecycle

    @property
    def _redis(self) -> redis.Redis:
        """The client for this operation: the sync one, or inside
        :func:`remit_core.aio.run` the running loop's async one, awaited call by call."""
        if not aio.bridged():
            return self._sync_redis
        return cast(redis.Redis, _Blocking(self._aclients.get()))

    def _new_aclient(self) -> redis.asyncio.Redis:
        url, kwargs = self._driver
        # past the pool's size (max_connections, 50 by default) a coroutine waits for a
        # connection (up to 20 s) instead of failing at once
        return redis.asyncio.Redis(
            connection_pool=redis.asyncio.BlockingConnectionPool.from_url(url, **kwargs))

    async def _aclose_loop(self) -> None:
        await self._aclients.aclose_current()

    def _close(self) -> None:
        self._pool.disconnect()
        self._aclients.close_all()

    def _is_transient(self, exc: BaseException) -> bool:
        # a wrong password is not cured by a retry, though redis-py files it under connections
        if isinstance(exc, _AUTH_ERRORS):
            return False
        return isinstance(exc, (RedisConnectionError, RedisTimeoutError, BusyLoadingError,
                                TryAgainError))

    def _exhausted(self, exc: Exception) -> BaseException | None:
        if not isinstance(exc, (RedisConnectionError, RedisTimeoutError)) or \
                not self._is_transient(exc):
            return None
        return StoreUnavailable(
            f"{self.url!r} is unreachable after retries ({type(exc).__name__}: "
            f"{self._text(exc)}); check that the Redis server is running",
            url=self.url,
        )

    def _open_checks(self, durability: bool) -> None:
        """Reach the server, check durability, then the key layout (version and foreign keys)."""
        try:
            self._retry_loading(self._redis.ping)
            if durability and not self.read_only:
                self._check_durability()
            self._open_layout()
        except AuthenticationError as exc:
            raise StoreUnavailable(
                f"{self.url!r} refused the credentials: {self._text(exc)}", url=self.url
            ) from exc
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise StoreUnavailable(
                f"cannot reach the Redis server of {self.url!r} ({type(exc).__name__}: "
                f"{self._text(exc)}); check that it is running and the host and port are right",
                url=self.url,
            ) from exc

    # -------------------------------------------------------------------------------- layout

    @contextlib.contextmanager
    def _layout_session(self) -> Iterator[_Migration]:
        """Collects the migration and runs it as one script, which refuses (LayoutChanged)
        when another opener changed the version since it was read."""
        migration = _Migration()
        yield migration
        if migration.lua:
            body = "\n".join([_MIGRATE_HEAD, *migration.lua, "return 1"])
            done = self._retry_loading(self._redis.eval, _script_source(body, writes=True), 1,
                                       self._k.meta, self.prefix, migration.read)
            if not done:
                raise LayoutChanged

    def _read_layout(self, migration: _Migration) -> Layout:
        k = self._k
        names = (k.meta, k.seq, k.runs, k.cks, k.known)
        types, schema, version = self._retry_loading(self._s_read_layout, keys=list(names),
                                                     args=[self.prefix])
        types = [_str(t) for t in types]
        foreign = [(n, f"is a {t}, where remit keeps a {want}")
                   for n, t, want in zip(names, types, _LAYOUT_TYPES, strict=True)
                   if t not in ("none", want)]
        if types[0] == "none":
            return Layout(None, foreign, [n for n, t in zip(names[1:], types[1:], strict=True)
                                          if t != "none"],
                          absent=f"there is no key {k.meta!r} (no store with prefix "
                          f"{self.prefix!r}). Check ?prefix=NAME and the database number; "
                          "remit creates a store only when an application opens it for "
                          "writing.")
        meta = {f: _str(v) for f, v in (("schema", schema), ("version", version)) if v}
        migration.read = meta.get("version", "")
        return Layout(meta, foreign)

    def _create_layout(self, migration: _Migration) -> None:
        migration.lua.append("redis.call('HSET', KEYS[1], 'schema', 'remit', 'version', '0')")

    def _apply_step(self, migration: _Migration, step: str) -> None:
        migration.lua.append(step)

    def _set_version(self, migration: _Migration, version: int) -> None:
        migration.lua.append(
            f"redis.call('HSET', KEYS[1], 'schema', 'remit', 'version', '{version:d}')")

    def _retry_loading(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn``, retried while the server is loading its data (it answers soon)."""
        return retrying(_loading, self.url)(fn, *args, **kwargs)

    def _text(self, exc: BaseException) -> str:
        """A driver error's message, with every secret of the URL masked."""
        return scrub(str(exc), self._secrets)

    def _config(self, name: str) -> str:
        got = cast(Mapping[Any, Any], self._redis.config_get(name))
        return next((_str(v) for k, v in got.items() if _str(k) == name), "")

    def _check_durability(self) -> None:
        """CV/EO need receipts that survive a restart: refuse a Redis that keeps nothing."""
        try:
            appendonly = self._config("appendonly").lower()
            save = self._config("save").strip()
        except ResponseError:
            # a managed Redis may rename or forbid CONFIG; INFO still tells whether AOF is on
            try:
                info = self._redis.info("persistence")
            except ResponseError:
                info = {}
            if str(info.get("aof_enabled", "")) == "1":
                return
            log.warning(
                "remit: cannot verify that %s keeps its data across a restart (CONFIG is not "
                "available and AOF is not reported on); effect receipts and claims may be lost "
                "when the server restarts unless it persists its data", self.url)
            return
        if appendonly == "yes":
            return
        if not save:
            raise DurabilityError(
                f"{self.url!r} keeps nothing on disk (appendonly no, save \"\"): a restart would "
                "lose committed checkpoints, effect receipts and claims, so effects could run "
                "twice. Enable AOF on the server (appendonly yes in redis.conf, or CONFIG SET "
                "appendonly yes), or add ?durability=none to the URL for tests and caches that "
                "may lose everything.",
                url=self.url,
            )
        log.warning(
            "remit: %s persists by RDB snapshots only (save %r): records written since the last "
            "snapshot are lost if the server crashes; enable appendonly yes for exactly-once "
            "effects", self.url, save)

    # --------------------------------------------------------------------------- checkpoints

    def _write_checkpoint(self, row: CheckpointRow, blobs: list[BlobRow],
                          exclusive_child: bool, chunks: Mapping[bytes, bytes],
                          writes: Sequence[tuple[list[WriteRow], bool]] = ()
                          ) -> tuple[int, str | None]:
        k = self._k
        r, ns = row.run_id, row.ns
        keys: list[str] = [k.seq, k.ck(r, ns, row.checkpoint_id), k.nck(r, ns), k.rck(r), k.cks,
                           k.runs, k.run(r), k.known, k.nss(r), k.blobs(r)]
        args: list[Any] = [
            self.prefix, r, ns, row.checkpoint_id, _flag(row.parent_id), row.parent_id or "",
            row.kind, _flag(row.execution_id), row.execution_id or "", row.data, row.metadata,
            versions_json(row.versions),
            "1" if exclusive_child else "0", *_chunk_args(chunks),
        ]
        for rows, overwrite in writes:  # group commit: in the checkpoint's script
            for w in rows:
                keys += [k.w(w.run_id, w.ns, w.checkpoint_id), k.wrs(w.run_id)]
                args += ["1" if overwrite else "0", *_write_args(w)]
        for b in blobs:
            args += [b.channel, b.version, b.value]
        res = self._s_write_ck(keys=keys, args=args)
        if len(res) == 2:
            return 0, _str(res[1])
        return int(res[0]), None

    def _read_checkpoint(self, run_id: str, ns: str, checkpoint_id: str | None,
                         with_writes: bool) -> Found | None:
        res = self._s_read_ck(keys=[self._k.nck(run_id, ns)],
                              args=[self.prefix, run_id, ns, _flag(checkpoint_id),
                                    checkpoint_id or "", "1" if with_writes else "0"])
        return None if res is None else _entry(res)

    def _list_checkpoints(self, run_id: str | None, ns: str | None, before: str | None,
                          limit: int | None, execution_ids: Sequence[str] | None,
                          with_writes: bool) -> list[Found]:
        args: list[Any] = [self.prefix, _flag(run_id), run_id or "", _flag(ns), ns or "",
                           _flag(before), before or "", "" if limit is None else int(limit),
                           "1" if with_writes else "0", _flag(execution_ids),
                           *(execution_ids or ())]
        res = self._s_list_ck(keys=[self._k.cks, self._k.runs], args=args)
        return [_entry(e) for e in res]

    def _write_writes(self, rows: list[WriteRow], overwrite: bool,
                      chunks: Mapping[bytes, bytes]) -> None:
        k = self._k
        keys: list[str] = [k.known]
        args: list[Any] = [self.prefix, "1" if overwrite else "0", rows[0].run_id,
                           *_chunk_args(chunks)]
        for w in rows:
            keys += [k.w(w.run_id, w.ns, w.checkpoint_id), k.wrs(w.run_id)]
            args += _write_args(w)
        self._s_write_writes(keys=keys, args=args)

    def _read_chunks(self, run_id: str, digests: list[bytes]) -> dict[bytes, bytes]:
        values = cast(list[bytes | None],
                      self._redis.mget([self._k.chunk(run_id, d) for d in digests]))
        return {d: v for d, v in zip(digests, values, strict=True) if v is not None}

    def _list_runs(self, limit: int | None) -> list[tuple[RunInfo, RunRow | None, float]]:
        now, res = self._s_list_runs(keys=[self._k.runs],
                                     args=[self.prefix, "" if limit is None else int(limit)])
        runs = [
            (RunInfo(_str(r), float(created), float(updated), int(n),
                     None if latest is None else _str(latest),
                     None if kind is None else _str(kind)),
             _lc_row(_hash(lc)) if lc else None, float(now))
            for r, created, updated, n, latest, kind, lc in res
        ]
        runs.sort(key=lambda x: (-x[0].updated_at, x[0].run_id))
        return runs if limit is None or limit < 0 else runs[:limit]

    def _delete_run(self, run_id: str) -> None:
        self._s_delete_run(keys=[self._k.run(run_id)], args=[self.prefix, run_id])

    def _copy_run(self, source: str, target: str) -> None:
        k = self._k
        self._s_copy_run(keys=[k.seq, k.runs, k.known, k.cks, k.run(source), k.run(target)],
                         args=[self.prefix, source, target])

    def _prune_run(self, run_id: str, keep_latest: int) -> None:
        self._s_prune(keys=[self._k.nss(run_id), self._k.rck(run_id)],
                      args=[self.prefix, run_id, int(keep_latest)])

    def _delete_executions(self, execution_ids: list[str]) -> None:
        self._s_delete_ex(keys=[], args=[self.prefix, *execution_ids])

    def _usage(self, run_id: str | None) -> dict[str, int]:
        res = self._s_usage(keys=[self._k.known], args=[self.prefix, _flag(run_id), run_id or ""])
        return {n: int(v) for n, v in zip(USAGE_KEYS, res, strict=True)}

    # ------------------------------------------------------------------------------ receipts

    def _start_receipt(self, key: str, run_id: str, step: str, name: str, ordinal: int,
                       owner: str, lease: float, may_take_over: bool
                       ) -> tuple[ReceiptOutcome, ReceiptRow]:
        k = self._k
        outcome, h, *previous = self._s_start_rc(
            keys=[k.rc(key), k.rcs(run_id), k.known],
            args=[self.prefix, key, run_id, step, name, int(ordinal), owner, repr(float(lease)),
                  "1" if may_take_over else "0"])
        row = _rc_row(_hash(h))
        if previous and previous[0]:
            row = dataclasses.replace(row, previous_owner=_str(previous[0]))
        return cast(ReceiptOutcome, _str(outcome)), row

    def _complete_receipt(self, key: str, owner: str, fence: int, result: bytes) -> bool:
        return bool(self._s_complete_rc(keys=[self._k.rc(key)],
                                        args=[self.prefix, owner, int(fence), result]))

    def _release_receipt(self, key: str, owner: str, fence: int) -> bool:
        return bool(self._s_release_rc(keys=[self._k.rc(key)],
                                       args=[self.prefix, owner, int(fence), key]))

    def _renew_receipt(self, key: str, owner: str, fence: int, lease: float) -> bool:
        return bool(self._s_renew(keys=[self._k.rc(key)],
                                  args=[self.prefix, owner, int(fence), repr(float(lease)),
                                        "started"]))

    def _get_receipt(self, key: str) -> ReceiptRow | None:
        h = _hash(cast(dict[bytes, bytes], self._redis.hgetall(self._k.rc(key))))
        return _rc_row(h) if h else None

    def _list_receipts(self, run_id: str | None) -> list[ReceiptRow]:
        res = self._s_list_records(keys=[self._k.known],
                                   args=[self.prefix, _flag(run_id), run_id or "", "rc", "rcs"])
        rows = [_rc_row(_hash(h)) for h in res]
        rows.sort(key=lambda r: (r.started_at, r.key))
        return rows

    def _resolve_receipt(self, key: str, result: bytes) -> bool:
        return bool(self._s_resolve_rc(keys=[self._k.rc(key)], args=[self.prefix, result]))

    def _reset_receipt(self, key: str) -> None:
        self._s_reset(keys=[self._k.rc(key)], args=[self.prefix, key, "rcs"])

    # -------------------------------------------------------------------------------- claims

    def _claim(self, key: str, run_id: str, owner: str, lease: float, digest: str | None,
               value: bytes | None) -> tuple[ClaimOutcome, ClaimRow]:
        k = self._k
        outcome, h, *previous = self._s_claim(
            keys=[k.cl(key), k.cls(run_id), k.known, k.clh],
            args=[self.prefix, key, run_id, owner, repr(float(lease)), _flag(digest),
                  digest or "", _flag(value), value or b""])
        row = _cl_row(_hash(h))
        if previous and previous[0]:
            row = dataclasses.replace(row, previous_owner=_str(previous[0]))
        return cast(ClaimOutcome, _str(outcome)), row

    def _consume_claim(self, key: str, owner: str, fence: int, digest: str | None
                       ) -> tuple[bool, ClaimRow | None]:
        ok, h = self._s_consume(keys=[self._k.cl(key), self._k.clh],
                                args=[self.prefix, owner, int(fence), _flag(digest), digest or "",
                                      key])
        return bool(ok), None if h is None else _cl_row(_hash(h))

    def _release_claim(self, key: str, owner: str, fence: int) -> bool:
        return bool(self._s_release_cl(keys=[self._k.cl(key), self._k.clh],
                                       args=[self.prefix, owner, int(fence), key]))

    def _renew_claim(self, key: str, owner: str, fence: int, lease: float) -> bool:
        return bool(self._s_renew(keys=[self._k.cl(key), self._k.clh],
                                  args=[self.prefix, owner, int(fence), repr(float(lease)),
                                        "claimed", key]))

    def _get_claim(self, key: str) -> ClaimRow | None:
        h = _hash(cast(dict[bytes, bytes], self._redis.hgetall(self._k.cl(key))))
        return _cl_row(h) if h else None

    def _list_claims(self, run_id: str | None) -> list[ClaimRow]:
        res = self._s_list_records(keys=[self._k.known],
                                   args=[self.prefix, _flag(run_id), run_id or "", "cl", "cls"])
        rows = [_cl_row(_hash(h)) for h in res]
        rows.sort(key=lambda r: (r.claimed_at, r.key))
        return rows

    def _list_lapsed_claims(self, framework: str, name: str | None, limit: int,
                            after: tuple[float, str] | None) -> list[ClaimRow]:
        res = self._s_list_lapsed(keys=[self._k.clh], args=[
            self.prefix, framework, _flag(name), name or "", int(limit), _flag(after),
            repr(after[0]) if after else "", after[1] if after else ""])
        return [_cl_row(_hash(h)) for h in res]

    # ----------------------------------------------------------------------- run lifecycle

    def _start_run(self, run_id: str, framework: str, name: str, owner: str, lease: float,
                   recovery: Recovery | None, likely_new: bool = False
                   ) -> tuple[RunStartOutcome, RunRow | None, float]:
        # (one script whether the run is new or not: likely_new changes nothing here)
        k = self._k
        retake = "," + ",".join(recovery.retake if recovery else ()) + ","
        exhausted = recovery.exhausted if recovery else None
        outcome, h, now, *previous = self._s_start_run(
            keys=[k.lc(run_id), k.lcl],
            args=[self.prefix, run_id, framework, name, owner, repr(float(lease)),
                  "0" if recovery is None else "1", retake,
                  int(recovery.max_attempts if recovery else 0), _flag(exhausted),
                  exhausted or b""])
        row = None if h is None else _lc_row(_hash(h))
        if row is not None and previous and previous[0]:
            row = dataclasses.replace(row, previous_owner=_str(previous[0]))
        return cast(RunStartOutcome, _str(outcome)), row, float(now)

    def _take_runs(self, framework: str, name: str | None, owner: str, lease: float,
                   recovery: Recovery, limit: int
                   ) -> list[tuple[RunStartOutcome, RunRow, float]]:
        exhausted = recovery.exhausted
        taken = []
        for outcome, h, now, *previous in self._s_take_runs(keys=[self._k.lcl], args=[
                self.prefix, framework, _flag(name), name or "", owner, repr(float(lease)),
                int(limit), int(recovery.max_attempts), _flag(exhausted), exhausted or b""]):
            row = _lc_row(_hash(h))
            if previous and previous[0]:
                row = dataclasses.replace(row, previous_owner=_str(previous[0]))
            taken.append((cast(RunStartOutcome, _str(outcome)), row, float(now)))
        return taken

    def _end_run(self, run_id: str, owner: str, fence: int, status: RunEnd,
                 detail: bytes | None) -> bool:
        k = self._k
        return bool(self._s_end_run(
            keys=[k.lc(run_id), k.lcl],
            args=[self.prefix, owner, int(fence), status, _flag(detail), detail or b"",
                  run_id]))

    def _import_run(self, run_id: str, framework: str, name: str,
                    status: RunEnd | Literal["abandoned"], owner: str,
                    detail: bytes | None, replaces: tuple[int, float] | None = None) -> bool:
        k = self._k
        return bool(self._s_import_run(
            keys=[k.lc(run_id), k.lcl],
            args=[self.prefix, run_id, framework, name, status, owner, _flag(detail),
                  detail or b"", _flag(replaces), replaces[0] if replaces else 0,
                  repr(replaces[1]) if replaces else ""]))

    def _renew_run(self, run_id: str, owner: str, fence: int, lease: float) -> bool:
        k = self._k
        return bool(self._s_renew_run(keys=[k.lc(run_id), k.lcl],
                                      args=[self.prefix, owner, int(fence),
                                            repr(float(lease)), run_id]))

    def _get_run(self, run_id: str) -> tuple[RunRow, float] | None:
        h, now = self._s_get_run(keys=[self._k.lc(run_id)], args=[self.prefix])
        return (_lc_row(_hash(h)), float(now)) if h else None

    def _list_lifecycles(self, query: RunQuery) -> list[tuple[RunInfo, RunRow, float]]:
        # A script blocks the server while it runs: a long listing is read a page at a
        # time, each page continuing after the last run of the one before (a run that
        # changes meanwhile moves ahead of the listing and may be left out of it).
        found: list[tuple[RunInfo, RunRow, float]] = []
        while True:
            want = LIST_PAGE if query.limit is None else min(LIST_PAGE,
                                                            query.limit - len(found))
            page = self._lifecycles_page(dataclasses.replace(query, limit=want))
            found += page
            if len(page) < want or (query.limit is not None and len(found) >= query.limit):
                return found
            last = page[-1][1]
            query = dataclasses.replace(query, cursor=(last.updated_at, last.run_id))

    def _lifecycles_page(self, query: RunQuery) -> list[tuple[RunInfo, RunRow, float]]:
        cursor = query.cursor
        before = query.updated_before
        now, res = self._s_list_lc(keys=[self._k.lcl], args=[
            self.prefix, query.status or "", _flag(query.framework), query.framework or "",
            _flag(query.name), query.name or "", _flag(before),
            "" if before is None else repr(float(before)), _flag(cursor),
            "" if cursor is None else repr(float(cursor[0])),
            "" if cursor is None else cursor[1],
            "" if query.limit is None else int(query.limit)])
        found = []
        for h, created, updated, n, latest, kind in res:
            row = _lc_row(_hash(h))
            found.append((_run_info(row, created, updated, n, latest, kind), row, float(now)))
        return found


__all__ = ["MIGRATIONS", "RedisStore"]
