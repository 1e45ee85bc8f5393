-- Straight-line code: Redis runs this chunk on every call, and each closure
-- it makes costs about a thousand instructions, so the helpers of the rare
-- paths are made only when one of those paths is taken. Commands go
-- through redis.pcall, so an item whose command fails (a key of another
-- type, say) replies X<message> and the others go on. A failed command's
-- reply is a table with `err`; `v.err` tells it from a string (whose `err`
-- is nil) without a call of `type`.
local n, j, out, fresh, held, ours = #KEYS, 1
if n > 1 then out = {} end
local r
for i = 1, n do
  local k, a = KEYS[i], ARGV[j]
  local op, v, mine, ttl = string.byte(a)
  r = nil
  if op == 46 then
    -- Claim: a the record but for its head (`.<TTL>:...`).
    j = j + 1
    v = redis.pcall('GET', k)
    if not v then
      if not fresh then
        local t = redis.call('TIME')
        fresh = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
      end
      r = redis.pcall('SET', k, 'P' .. fresh .. a, 'PX', string.sub(a, 2, string.find(a, ':', 2, true) - 1))
      r = r.err and 'X' .. r.err or fresh
    elseif v.err then
      r = 'X' .. v.err
    elseif string.byte(v) == 68 then
      -- Done: the record whole; the client checks its fingerprint.
      r = v
    end
  elseif op == 68 then
    -- Complete: a the done record, then the holder's record. Written first,
    -- checked after: SET ... XX GET KEEPTTL swaps the record in and hands
    -- back what it replaced, in one command, the key's TTL untouched (the
    -- held record's TTL is its lease left plus the retention).
    mine = ARGV[j + 1]
    j = j + 2
    v = redis.pcall('SET', k, a, 'XX', 'GET', 'KEEPTTL')
    if not v then
      r = 0
    elseif v.err then
      r = 'X' .. v.err
    elseif v == mine or v == a then
      r = 1
    end
  elseif op == 114 or op == 101 then
    -- Release (`r`) or extend (`e`): the holder's record; to extend, its TTL.
    mine = ARGV[j + 1]
    if op == 114 then
      j = j + 2
    else
      ttl = ARGV[j + 2]
      j = j + 3
    end
    v = redis.pcall('GET', k)
    if not v then
      r = 0
    elseif v.err then
      r = 'X' .. v.err
    elseif v == mine then
      r = op == 114 and redis.pcall('DEL', k) or redis.pcall('PEXPIRE', k, ttl)
      if type(r) == 'table' then r = 'X' .. r.err end
    end
  else
    r = 'Xunknown operation ' .. a
    j = j + 1
  end
  if r == nil then
    -- The rare paths: a claim finding a held record; a completion, release
    -- or extension finding another record than the holder's as the client
    -- rebuilt it.
    if not held then
      -- A held record's fence, lease, tail (the retention: the TTL less the
      -- lease), fingerprint and owner; nil for anything else.
      held = function(v)
        local f, o, lease, tail, fp = string.match(v, '^P(%d+)%.%d+:([^|]*)|(%d+):(%d+):(.*)$')
        if f then return f, lease, tail, fp, o end
      end
      -- Whether `v` is the record of the holder whose
      -- record (as the client rebuilt it) is `mine`: the same fence and
      -- owner.
      ours = function(v, mine)
        local f, _, tail, _, o = held(v)
        local mf, _, _, _, mo = held(mine)
        return tail ~= nil and f == mf and o == mo
      end
    end
    if op == 46 then
      local f, lease, tail, fp, o = held(v)
      if not f then
        r = 'Xnot an idem lease record'
      else
        local co, cfp = string.match(a, '^%.%d+:([^|]*)|%d+:%d+:(.*)$')
        if not cfp then
          r = 'Xmalformed claim'
        elseif string.byte(cfp) ~= 46 and string.byte(fp) ~= 46 and fp ~= cfp then
          r = 'M'
        elseif o == co then
          r = 'A' .. f
        else
          local left = redis.pcall('PTTL', k)
          if type(left) == 'number' then left = left - tonumber(tail) end
          if type(left) == 'table' then
            r = 'X' .. left.err
          elseif left > 0 then
            r = 'B' .. string.format('%d', left)
          else
            local fence = string.format('%d', tonumber(f) + 1)
            r = redis.pcall('SET', k, 'P' .. fence .. a, 'PX', string.match(a, '^%.(%d+)'))
            r = r.err and 'X' .. r.err or 'R' .. fence
          end
        end
      end
    elseif op == 68 then
      if ours(v, mine) then
        -- A holder built by hand: the fingerprint stays the claim's.
        r = 1
        local fp = string.sub(v, -64)
        if fp ~= string.sub(a, 2, 65) then
          r = redis.pcall('SET', k, 'D' .. fp .. string.sub(a, 66), 'XX', 'KEEPTTL')
          r = r.err and 'X' .. r.err or 1
        end
      else
        -- Not this holder's record: it goes back exactly as it was, TTL
        -- and all: another holder's (this one's lease was taken over), or a
        -- done record (this holder's own, if the completion was repeated
        -- with another answer).
        r = redis.pcall('SET', k, v, 'XX', 'KEEPTTL')
        if r.err then
          r = 'X' .. r.err
        else
          local bar = string.find(a, '|', 66, true)
          r = (bar and string.byte(v) == 68 and string.sub(v, 66, bar) == string.sub(a, 66, bar)) and 1 or 0
        end
      end
    elseif not ours(v, mine) then
      r = 0
    else
      if op == 114 then
        r = redis.pcall('DEL', k)
      else
        -- Extended by a holder built by hand: its lease plus the record's
        -- tail.
        local _, lease = held(mine)
        local _, _, tail = held(v)
        r = redis.pcall('PEXPIRE', k, string.format('%d', tonumber(lease) + tonumber(tail)))
      end
      if type(r) == 'table' then r = 'X' .. r.err end
    end
  end
  if out then out[i] = r end
end
-- One item: its reply bare (a one-item table costs more to send).
return out or r
