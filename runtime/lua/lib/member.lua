-- lib/member.lua: reading a grant log's members.
-- Part of: acquire, configure, release, refund, give_back
-- Twin in Rust: runtime/src/keys/member.rs

-- The permits a log member holds (Redisson's struct.pack('Bc0I', len, id, permits)),
-- and its id length. A member that does not decode raises bad_member for rule `rule`
-- (1 when not given), naming the log by `role` ("permits", "client_permits").
local function decode_member(member, role, rule)
  local len = string.byte(member, 1)
  if len == nil or #member ~= len + 5 then
    error('redlimit:bad_member:' .. (rule or 1) .. ' ' .. role .. ' member of ' .. #member
      .. ' bytes does not decode', 0)
  end
  local a, b, c, d = string.byte(member, len + 2, len + 5)
  return a + b * 256 + c * 65536 + d * 16777216, len
end
