-- utxoflow.lua: the record kernel (stores/utxo/kernel) ported to Aerospike record UDFs.
--
-- Each function here is one rule of the kernel applied to one record, read and written by the
-- server under the record's lock: the Python module named beside each is the specification,
-- and tests/stores/test_lua_parity.py runs the same cases through both so they cannot drift.
-- The functions return codes and data, never message text: the Python side builds the errors
-- (stores/utxo/errors.py) so that every backend words them alike.
--
-- Invariants (as the kernel's, per record):
-- * `utxos` is packed 68-byte slots: UTXO hash (all zero: no slot) then spending data (all
--   zero: unspent; all 0xFF: frozen; else spending txid .. vin LE u32).
-- * `spentUtxos` counts this record's slots holding spending data, and `rev` counts the changes
--   of it. A master's whole-tx count adds `pageSpent` (page -> {rev, spent} as each child page
--   last reported it), so that a page's report is idempotent and an older report never
--   overwrites a newer one (a counter of our own: Aerospike's generation wraps at 65,535).
-- * Flags are integers 0/1 (Lua's 0 is true: always compare with 1); an absent bin is 0/nil.
-- * A function writes only when something changed, and everything it changed in one update.
-- * `liveKeys` (the script index's: stores/utxo/aerospike/scriptindex.py) maps each script key to
--   the number of this record's live (unspent or frozen) slots with that key, the key of slot i
--   being `scriptKeys` bytes 8i..8i+7 (LE signed). A slot that stops or starts being live
--   (spend; unspend, take_back) changes it in the same update (`live_keys`); freezing does not.
-- * `blockSpent` holds, per slot, the token of the last block spend call that spent it or found
--   it spent by its transaction (slot k: bytes 4k..4k+3, LE u32; 0 or past the end: none). A
--   token means the slot is spent (spend sets one only on a spent slot; every call that reverts
--   a slot clears it). A take-back reverts a slot only while it holds no token or the taking
--   call's own: Aerospike has no transaction across the records of one spend, so a refused
--   call's take-back may land after another call (a block's, or a second run of the same
--   block's unit) spent for the same transaction, and must not free an input that call relies
--   on. Not a kernel rule: on SQL a spend and its take-back are one unit.

local SLOT = 68
local HASH = 32
local ZERO32 = string.rep("\0", 32)
local ZERO4 = string.rep("\0", 4)
local UNSPENT = string.rep("\0", 36)
local ITEM_FORMAT = "<I4I4I4Bc32"  -- a spend's item (see `spend`): stores/utxo/aerospike/rules.py packs it
local ITEM = string.packsize(ITEM_FORMAT)
-- a spend's answer (see `spend`): delete-at-height before and after (-1: none), spent, rev,
-- how many items were newly spent
local SPENT_FORMAT = "<i8i8i8i8I4"
local FROZEN = string.rep("\255", 36)

-- the library functions as locals: `string.sub` is two table lookups at every call, and
-- the server's timer hook makes every VM instruction cost about twice what it would
local sub, pack, unpack, rep = string.sub, string.pack, string.unpack, string.rep
local get_string, set_string, bsize = bytes.get_string, bytes.set_string, bytes.size
local list_append, list_size = list.append, list.size

-- a bytes value as a Lua string (nil stays nil)
local function str(b)
    if b == nil then
        return nil
    end
    local n = bsize(b)
    if n == 0 then
        return ""
    end
    return get_string(b, 1, n)
end

-- a Lua string as an Aerospike bytes value
local function bytes_of(s)
    local b = bytes(#s)
    if #s > 0 then
        set_string(b, 1, s)
    end
    return b
end

local function list_len(l)
    if l == nil then
        return 0
    end
    return list_size(l)
end

-- kernel.record.Record.mined: in a block, and not marked off the longest chain
local function mined(rec)
    return rec["unminedSince"] == nil and list_len(rec["blockIDs"]) > 0
end

-- the whole transaction's spent count (see the invariants)
local function spent_total(rec)
    local n = rec["spentUtxos"] or 0
    local pages = rec["pageSpent"]
    if pages ~= nil then
        for _, v in map.pairs(pages) do
            n = n + v[2]
        end
    end
    return n
end

-- kernel.dah.due: the delete-at-height a record carries after a change at `height`
-- (each bin is read only when the answer needs it: a bin read crosses into the server's C)
local function due(rec, height, retention)
    if retention <= 0 or rec["preserveUntil"] ~= nil then
        return rec["deleteAtHeight"]
    end
    local new = height + retention
    if rec["conflicting"] == 1 then
        return rec["deleteAtHeight"] or new
    end
    if spent_total(rec) >= (rec["recordUtxos"] or 0) and mined(rec) then
        local current = rec["deleteAtHeight"]
        if current == nil or current < new then
            return new
        end
        return current
    end
    return nil
end

-- kernel.dah.apply_dah (child pages carry no DAH: their master decides for the whole tx)
local function apply_dah(rec, height, retention)
    if (rec["page"] or 0) ~= 0 then
        return false
    end
    local dah = due(rec, height, retention)
    if dah ~= rec["deleteAtHeight"] then
        rec["deleteAtHeight"] = dah
        return true
    end
    return false
end

-- `liveKeys` after the 0-based `slots` stopped (delta -1) or started (+1) being live: a key's
-- count at 0 leaves the map, an empty map the record (codec.live_keys is the specification; a
-- record without `scriptKeys`, or a slot past its end, counts for no key)
local function live_keys(rec, slots, delta)
    if #slots == 0 then
        return
    end
    local ks = str(rec["scriptKeys"])
    if ks == nil then
        return
    end
    local nk = #ks
    local had = rec["liveKeys"]
    local m = had or map()
    for _, slot in ipairs(slots) do
        local at = slot * 8
        if at + 8 <= nk then
            local k = unpack("<i8", ks, at + 1)
            local n = (m[k] or 0) + delta
            if n > 0 then
                m[k] = n
            else
                map.remove(m, k)
            end
        end
    end
    if map.size(m) > 0 then
        rec["liveKeys"] = m
    elseif had ~= nil then
        rec["liveKeys"] = nil
    end
end

local function err(code)
    local m = map()
    m["code"] = code
    return m
end

-- the slot of output index `slot` in this record: its byte offset (0-based) and its UTXO hash,
-- or nil when the record has no such slot (kernel.record.Record.locate)
local function locate(s, slot)
    local off = slot * SLOT
    if slot < 0 or off + SLOT > #s then
        return nil
    end
    local hash = sub(s, off + 1, off + HASH)
    if hash == ZERO32 then
        return nil
    end
    return off, hash
end

-- kernel.spend.record_error: the record-level rules of a spend at `height`
-- (a flag the call ignores is not read, nor the spending height of what is no coinbase)
local function record_error(rec, height, ign_conflicting, ign_locked)
    if rec["creating"] == 1 then
        return err("TX_CREATING")
    end
    if ign_conflicting ~= 1 and rec["conflicting"] == 1 then
        return err("TX_CONFLICTING")
    end
    if ign_locked ~= 1 and rec["locked"] == 1 then
        return err("TX_LOCKED")
    end
    if rec["coinbase"] == 1 then
        local sh = rec["spendingHeight"] or 0
        if sh > height then
            local e = err("TX_COINBASE_IMMATURE")
            e["spendable_at"] = sh
            return e
        end
    end
    return nil
end

-- the token slot `slot` holds in the `blockSpent` string `b` (0: none)
local function token_of(b, slot)
    local at = slot * 4
    if b == nil or at + 4 > #b then
        return 0
    end
    return (unpack("<I4", b, at + 1))
end

-- `blockSpent` with `token` on each of `slots` (0: cleared), written with the caller's update;
-- trailing empty tokens are dropped, and the bin with the last one
local function mark(rec, slots, token)
    local had = str(rec["blockSpent"])
    if #slots == 0 or (had == nil and token == 0) then
        return
    end
    local s = had or ""
    local v = pack("<I4", token)
    for _, slot in ipairs(slots) do
        local at = slot * 4
        if at + 4 <= #s then
            s = sub(s, 1, at) .. v .. sub(s, at + 5)
        elseif token ~= 0 then
            s = s .. rep("\0", at - #s) .. v
        end
    end
    local n = #s
    while n >= 4 and sub(s, n - 3, n) == ZERO4 do
        n = n - 4
    end
    if n > 0 then
        rec["blockSpent"] = bytes_of(sub(s, 1, n))
    elseif had ~= nil then
        rec["blockSpent"] = nil
    end
end

local function is_deleted_child(rec, txid)
    local dc = str(rec["deletedChildren"])
    if dc == nil then
        return false
    end
    for i = 1, #dc, 32 do
        if sub(dc, i, i + 31) == txid then
            return true
        end
    end
    return false
end

-- the height an output is frozen until, from a record's `spendableIn` map (nil: not frozen)
local function spendable_until(frozen_in, vout)
    if frozen_in == nil then
        return nil
    end
    return frozen_in[vout]
end

-- kernel.spend.spend_tx for the inputs of one transaction that spend this record:
-- items = bytes, ITEM bytes an item: slot, vout, vin (LE u32 each), whether a UTXO hash is
-- expected (a byte, 0/1), that hash (32 bytes, zero when not): packed in one value, because
-- each list element a call reads crosses into the server's C as a value of its own (measured:
-- the list's loop was about a third of a two-input spend). spender = the spending txid.
-- All or nothing: any failing item → {errors = list of {index, error}}, nothing written.
-- Else one bytes value (SPENT_FORMAT, then per item newly spent its index, the others being
-- this spender's already, as LE u32, then the items' UTXO hashes, 32 bytes each in item
-- order; rules.py `spend_result` reads it): a map of the same costs the client about as much
-- again as the call itself. `confirm` ≠ 0: the spend is a block's call, whose token it is,
-- put on every item's slot in `blockSpent` (see the invariants), those this spender held too.
function spend(rec, items, spender_b, height, ign_conflicting, ign_locked, dah_height, retention, confirm)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    local rerr = record_error(rec, height, ign_conflicting, ign_locked)
    if rerr ~= nil then
        return rerr
    end
    local ub = rec["utxos"]
    local s = str(ub) or ""
    local spender = str(spender_b)
    local packed = str(items)
    local frozen_in = rec["spendableIn"]
    local errors = list()
    local fresh = {}
    local hashes = {}
    local writes = {}
    local seen = {}
    local marks = {}
    local token = confirm or 0
    local held = nil
    if token ~= 0 then
        held = str(rec["blockSpent"])
    end
    for i = 1, #packed // ITEM do
        local slot, vout, vin, has, want = unpack(ITEM_FORMAT, packed, (i - 1) * ITEM + 1)
        if has == 0 then
            want = nil
        end
        local mine = spender .. pack("<I4", vin)
        local e = nil
        local off, hash = locate(s, slot)
        local data = nil
        if off == nil then
            e = err("UTXO_NOT_FOUND")
        elseif want ~= nil and hash ~= want then
            e = err("UTXO_HASH_MISMATCH")
            e["stored"] = bytes_of(hash)
        else
            local until_h = spendable_until(frozen_in, vout)
            if until_h ~= nil and until_h >= height then
                e = err("UTXO_FROZEN")
                e["until"] = until_h + 1
            else
                data = sub(s, off + HASH + 1, off + SLOT)
                if data == UNSPENT then
                    e = nil
                elseif data == mine then
                    if is_deleted_child(rec, spender) then
                        e = err("INVALID_SPEND")
                    end
                elseif data == FROZEN then
                    e = err("UTXO_FROZEN")
                else
                    e = err("UTXO_SPENT")
                    e["spending_txid"] = bytes_of(sub(data, 1, 32))
                    e["spending_vin"] = unpack("<I4", data, 33)
                end
            end
        end
        if e == nil then
            local first = seen[slot]
            if first ~= nil then
                e = err("SPENT_TWICE")
                e["first"] = first
            else
                seen[slot] = vin
            end
        end
        if e ~= nil then
            local pair = list()
            list_append(pair, i - 1)
            list_append(pair, e)
            list_append(errors, pair)
        else
            hashes[#hashes + 1] = hash
            if data == UNSPENT then
                writes[#writes + 1] = { off, mine }
                fresh[#fresh + 1] = pack("<I4", i - 1)
            end
            if token ~= 0 and token_of(held, slot) ~= token then
                marks[#marks + 1] = slot
            end
        end
    end
    if list_size(errors) > 0 then
        local out = map()
        out["errors"] = errors
        return out
    end
    local dah_was = rec["deleteAtHeight"]
    local dah, spent, rev = dah_was, nil, nil  -- (for the answer: what this call wrote, not read back)
    if #writes > 0 then
        local gone = {}
        for _, w in ipairs(writes) do
            set_string(ub, w[1] + HASH + 1, w[2])
            gone[#gone + 1] = w[1] // SLOT
        end
        live_keys(rec, gone, -1)
        spent = (rec["spentUtxos"] or 0) + #writes
        rev = (rec["rev"] or 0) + 1
        rec["utxos"] = ub
        rec["spentUtxos"] = spent
        rec["rev"] = rev
        if apply_dah(rec, dah_height, retention) then
            dah = rec["deleteAtHeight"]
        end
    else
        spent = rec["spentUtxos"] or 0
        rev = rec["rev"] or 0
    end
    if #marks > 0 then  -- (tokens alone change nothing the delete height or a report reads)
        mark(rec, marks, token)
    end
    if #writes > 0 or #marks > 0 then
        aerospike:update(rec)
    end
    return bytes_of(
        pack(SPENT_FORMAT, dah_was or -1, dah or -1, spent, rev, #fresh) .. table.concat(fresh) .. table.concat(hashes)
    )
end

-- kernel.outputs.verified_slot: the slot's offset, or the error
local function verified(rec, s, slot, want, creating_ok)
    if not aerospike:exists(rec) then
        return nil, err("TX_NOT_FOUND")
    end
    if rec["creating"] == 1 and not creating_ok then
        return nil, err("TX_CREATING")
    end
    local off, hash = locate(s, slot)
    if off == nil then
        return nil, err("UTXO_NOT_FOUND")
    end
    if hash ~= want then
        return nil, err("UTXO_HASH_MISMATCH")
    end
    return off, nil
end

-- the per-item outcome list of the alert-system and unspend calls: nil (done) or the error
local function outcome(results, e)
    if e == nil then
        list_append(results, 0)
    else
        list_append(results, e)
    end
end

-- kernel.spend.unspend for each item {slot, want}: the spend is taken back whoever made it
function unspend(rec, items, dah_height, retention)
    local results = list()
    local ub = rec["utxos"]
    local s = str(ub) or ""
    local n = 0
    local back = {}
    for i = 1, list_size(items) do
        local slot, want = items[i][1], str(items[i][2])
        local off, e = verified(rec, s, slot, want, true)
        if e == nil then
            local data = sub(s, off + HASH + 1, off + SLOT)
            if data == FROZEN then
                e = err("UTXO_FROZEN")
            elseif data ~= UNSPENT then
                set_string(ub, off + HASH + 1, UNSPENT)
                s = sub(s, 1, off + HASH) .. UNSPENT .. sub(s, off + SLOT + 1)
                n = n + 1
                back[n] = slot
            end
        end
        outcome(results, e)
    end
    if n > 0 then
        live_keys(rec, back, 1)
        mark(rec, back, 0)
        rec["utxos"] = ub
        rec["spentUtxos"] = (rec["spentUtxos"] or 0) - n
        rec["rev"] = (rec["rev"] or 0) + 1
        apply_dah(rec, dah_height, retention)
        aerospike:update(rec)
    end
    local out = map()
    out["results"] = results
    out["spent"] = rec["spentUtxos"] or 0
    out["gen"] = rec["rev"] or 0
    return out
end

-- the undo of `spend`'s fresh items {slot, spending data} when another record refused the same
-- transaction (all or nothing across records): a slot is reverted only while it holds that data;
-- the delete-at-height goes back to `dah_was` while the record is as that spend left it (its
-- `dah`, and its revision `gen`: every change the delete height depends on bumps `rev` — a
-- spend, unspend, take-back, set-mined, state change or page report), and is settled by the
-- rule again (at `dah_height`) otherwise. A slot holding a block call's token (`blockSpent`)
-- stays spent, and counts in `kept`, unless the token is `own`: the take-back is that call's
-- (a transaction of the block refused by another parent), and clears the token with the spend;
-- `own` -1 takes back whatever token the slot holds (a block's exact unspend of a rival). A slot
-- whose spender the record lists among its deleted children is never reverted: that spend was
-- mined and pruned, for good (`kernel.spend.take_back`, which this also ports).
function take_back(rec, items, dah_was, dah, dah_height, retention, gen, own)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    local ub = rec["utxos"]
    local s = str(ub) or ""
    local held = str(rec["blockSpent"])
    local n = 0
    local kept = 0
    local back = {}
    for i = 1, list_size(items) do
        local slot = items[i][1]
        local off = locate(s, slot)
        local data = str(items[i][2])
        if off ~= nil and sub(s, off + HASH + 1, off + SLOT) == data
            and not is_deleted_child(rec, sub(data, 1, 32)) then
            local t = token_of(held, slot)
            if t ~= 0 and t ~= own and own ~= -1 then
                kept = kept + 1
            else
                set_string(ub, off + HASH + 1, UNSPENT)
                n = n + 1
                back[n] = slot
            end
        end
    end
    if n > 0 then
        live_keys(rec, back, 1)
        mark(rec, back, 0)
        local untouched = rec["deleteAtHeight"] == dah and (gen == nil or (rec["rev"] or 0) == gen)
        rec["utxos"] = ub
        rec["spentUtxos"] = (rec["spentUtxos"] or 0) - n
        rec["rev"] = (rec["rev"] or 0) + 1
        if untouched then
            rec["deleteAtHeight"] = dah_was
        else
            apply_dah(rec, dah_height, retention)
        end
        aerospike:update(rec)
    end
    local out = map()
    out["n"] = n
    out["kept"] = kept
    out["spent"] = rec["spentUtxos"] or 0
    out["gen"] = rec["rev"] or 0
    return out
end

-- what a reassign notes besides the slot: spendable from tip + delay + 1, the log entry, and
-- one more UTXO (so the record is never all spent)
local function log_reassign(rec, vout, want_b, new_hash_b, tip, delay)
    local m = rec["spendableIn"] or map()
    m[vout] = tip + delay
    rec["spendableIn"] = m
    local entry = map()
    entry["offset"] = vout
    entry["utxo_hash"] = want_b
    entry["new_utxo_hash"] = new_hash_b
    entry["block_height"] = tip
    local log = rec["reassignments"] or list()
    list_append(log, entry)
    rec["reassignments"] = log
    rec["recordUtxos"] = (rec["recordUtxos"] or 0) + 1
end

-- a master notes a reassign done on one of its child pages (the kernel keeps the log, the
-- spendable heights and the whole transaction's count on the master)
-- (once: a note of the same output's reassignment to the same hash is there already → 1)
function note_reassign(rec, vout, want_b, new_hash_b, tip, delay)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    local log = rec["reassignments"]
    if log ~= nil then
        local new_hash = str(new_hash_b)
        for i = 1, list_size(log) do
            if log[i]["offset"] == vout and str(log[i]["new_utxo_hash"]) == new_hash then
                return 1
            end
        end
    end
    log_reassign(rec, vout, want_b, new_hash_b, tip, delay)
    aerospike:update(rec)
    return 0
end

-- kernel.outputs.freeze / unfreeze / reassign for one output; `op` names which.
-- reassign: `new_hash` replaces the UTXO hash, spendable from tip + delay + 1, logged.
function alert(rec, op, slot, vout, want_b, new_hash_b, tip, delay)
    local ub = rec["utxos"]
    local s = str(ub) or ""
    local want = str(want_b)
    local off, e = verified(rec, s, slot, want, false)
    if e ~= nil then
        return e
    end
    local data = sub(s, off + HASH + 1, off + SLOT)
    if op == "freeze" then
        if data == FROZEN then
            return err("UTXO_ALREADY_FROZEN")
        end
        if data ~= UNSPENT then
            e = err("UTXO_SPENT")
            e["spending_txid"] = bytes_of(sub(data, 1, 32))
            e["spending_vin"] = unpack("<I4", data, 33)
            return e
        end
        set_string(ub, off + HASH + 1, FROZEN)
    else
        if data ~= FROZEN then
            return err("UTXO_NOT_FROZEN")
        end
        set_string(ub, off + HASH + 1, UNSPENT)
        if op == "reassign" then
            set_string(ub, off + 1, str(new_hash_b))
            log_reassign(rec, vout, want_b, new_hash_b, tip, delay)
        end
    end
    rec["utxos"] = ub
    aerospike:update(rec)
    return 0
end

-- kernel.spend.spend_status: what a spend of output `slot` in the next block would meet
function get_spend(rec, slot, vout, want_b, tip)
    local m = map()
    if not aerospike:exists(rec) then
        m["status"] = "NOT_FOUND"
        return m
    end
    if rec["creating"] == 1 then
        m["status"] = "LOCKED"
        return m
    end
    local s = str(rec["utxos"]) or ""
    local off, hash = locate(s, slot)
    if off == nil then
        m["status"] = "NOT_FOUND"
        return m
    end
    if hash ~= str(want_b) then
        m["status"] = "MISMATCH"
        m["stored"] = bytes_of(hash)
        return m
    end
    if rec["locked"] == 1 then
        m["status"] = "LOCKED"
        return m
    end
    if rec["conflicting"] == 1 then
        m["status"] = "CONFLICTING"
        return m
    end
    local data = sub(s, off + HASH + 1, off + SLOT)
    if data == FROZEN then
        m["status"] = "FROZEN"
        return m
    end
    local until_h = spendable_until(rec["spendableIn"], vout)
    if until_h ~= nil and until_h > tip then
        m["status"] = "IMMATURE"
        m["until"] = until_h + 1
        return m
    end
    if data ~= UNSPENT then
        m["status"] = "SPENT"
        m["spending_txid"] = bytes_of(sub(data, 1, 32))
        m["spending_vin"] = unpack("<I4", data, 33)
        return m
    end
    local sh = rec["spendingHeight"] or 0
    if rec["coinbase"] == 1 and sh > tip + 1 then
        m["status"] = "IMMATURE"
        m["until"] = sh
        return m
    end
    m["status"] = "OK"
    return m
end

-- kernel.marks.set_mined / unset_mined: one bytes value, the record's number of child pages
-- (LE u32: their mirrored `locked` is the caller's to clear) then its block ids after the
-- change (LE i64 each; rules.py `mined_result` reads it, for the reason `spend` packs its answer)
-- (`creating_ok` 0: a master still creating is left as it is and answers TX_CREATING, so that
-- its caller finishes the creation first and asks again: block info never lands on a record
-- whose creation may yet be rebuilt)
function set_mined(rec, block_id, block_height, subtree, on_longest, unset, height, retention, creating_ok)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    if creating_ok == 0 and rec["creating"] == 1 then
        return err("TX_CREATING")
    end
    local ids = rec["blockIDs"] or list()
    local hs = rec["blockHeights"] or list()
    local subs = rec["subtreeIdxs"] or list()
    local at = nil
    for i = 1, list_size(ids) do
        if ids[i] == block_id then
            at = i
            break
        end
    end
    if unset == 1 then
        if at ~= nil then
            local ni, nh, ns = list(), list(), list()
            for i = 1, list_size(ids) do
                if i ~= at then
                    list_append(ni, ids[i])
                    list_append(nh, hs[i])
                    list_append(ns, subs[i])
                end
            end
            ids, hs, subs = ni, nh, ns
        end
        if list_size(ids) == 0 then
            rec["unminedSince"] = height
        elseif on_longest == 1 then
            rec["unminedSince"] = nil
        end
    else
        if at == nil then
            list_append(ids, block_id)
            list_append(hs, block_height)
            list_append(subs, subtree)
        end
        if on_longest == 1 then
            rec["unminedSince"] = nil
        end
    end
    rec["blockIDs"] = ids
    rec["blockHeights"] = hs
    rec["subtreeIdxs"] = subs
    if rec["locked"] ~= nil then -- (the child pages' mirrored flag is the caller's to clear: `extra`)
        rec["locked"] = nil
    end
    apply_dah(rec, height, retention)
    rec["rev"] = (rec["rev"] or 0) + 1 -- (what the delete height hangs on changed: see take_back)
    aerospike:update(rec)
    local n = list_size(ids)
    local out = { rec["totalExtraRecs"] or 0 }
    for i = 1, n do
        out[i + 1] = ids[i]
    end
    return bytes_of(pack("<I4" .. rep("i8", n), table.unpack(out)))
end

-- kernel.marks: the one-flag and preservation changes; `what` names which:
-- longest (value 1: on the longest chain, else unmined since `height`), locked, conflicting,
-- preserve (value: the height preserved until), expire (a preservation that ran out)
function set_state(rec, what, value, height, retention)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    if what == "longest" then
        if value == 1 then
            rec["unminedSince"] = nil
            apply_dah(rec, height + 1, retention) -- (kernel.dah.mining_height: the tip's next)
        else
            rec["unminedSince"] = height
        end
    elseif what == "locked" then
        rec["locked"] = value
        if value == 1 then
            rec["deleteAtHeight"] = nil
        else
            apply_dah(rec, height, retention)
        end
    elseif what == "conflicting" then
        rec["conflicting"] = value
        apply_dah(rec, height, retention)
    elseif what == "preserve" then
        rec["preserveUntil"] = value
        rec["deleteAtHeight"] = nil
    elseif what == "expire" then
        rec["preserveUntil"] = nil
        if retention > 0 and (rec["page"] or 0) == 0 then
            rec["deleteAtHeight"] = height + retention
        end
    else
        return err("PROCESSING_ERROR")
    end
    rec["rev"] = (rec["rev"] or 0) + 1 -- (see take_back)
    aerospike:update(rec)
    return 0
end

-- kernel.record.Record.add_child: list `txid` on conflictingCs or deletedChildren once
function add_child(rec, which, txid_b)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    local name = "deletedChildren"
    if which == "conflicting" then
        name = "conflictingCs"
    end
    local have = str(rec[name]) or ""
    local txid = str(txid_b)
    for i = 1, #have, 32 do
        if sub(have, i, i + 31) == txid then
            return 0
        end
    end
    rec[name] = bytes_of(have .. txid)
    aerospike:update(rec)
    return 1
end

-- two-phase creation's commit of one record: `creating` cleared (and a master's creation
-- options dropped); 1 when this call cleared it, 0 when it was clear already
function clear_creating(rec)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    if rec["creating"] ~= 1 then
        return 0
    end
    rec["creating"] = 0
    rec["createOpts"] = nil
    aerospike:update(rec)
    return 1
end

-- a master takes a child page's spent count as the page reported it at revision `gen` (a
-- later revision wins), and settles its DAH for the whole transaction
function page_spent(rec, page, gen, spent, height, retention)
    if not aerospike:exists(rec) then
        return err("TX_NOT_FOUND")
    end
    local m = rec["pageSpent"] or map()
    local had = m[page]
    if had ~= nil and had[1] >= gen then
        return 0
    end
    local v = list()
    list_append(v, gen)
    list_append(v, spent)
    m[page] = v
    rec["pageSpent"] = m
    apply_dah(rec, height, retention)
    rec["rev"] = (rec["rev"] or 0) + 1 -- (see take_back)
    aerospike:update(rec)
    return 1
end
