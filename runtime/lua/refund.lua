-- refund.lua: give back the permits of grants whose caller never learned of them (the
-- call timed out after it was sent), keeping value + permits in the log = rate.
-- Recipe: lib/member.lua, refund.lua
-- Twin in Rust: runtime/src/backend/redis/layout.rs (its KEYS and ARGV: Redis only, as
--   in process a call never times out once sent)
--
-- KEYS, per rule: rule i's key j is KEYS[4*(i-1)+j]:
--   1 value: {NAME}:value
--   2 client_value: {NAME}:value:ID
--   3 permits: {NAME}:permits
--   4 client_permits: {NAME}:permits:ID
-- ARGV, per rule: rule i's argument j is ARGV[1*(i-1)+j]:
--   1 member: the log member the timed-out call sent for that rule
-- Returns the number of grants refunded; members not in a log (the call never ran, or
-- its grant already left the window) are skipped.

local refunded = 0
for i = 1, #ARGV do
  local k = 4 * (i - 1)
  local member = ARGV[i]
  local permits = decode_member(member, 'permits')
  for mode = 0, 1 do
    local vkey, pkey = KEYS[k + 1 + mode], KEYS[k + 3 + mode]
    if redis.call('type', pkey).ok == 'zset' and redis.call('zrem', pkey, member) == 1 then
      if redis.call('type', vkey).ok == 'string' then
        redis.call('incrby', vkey, permits)
      end
      refunded = refunded + 1
    end
  end
end
return refunded
