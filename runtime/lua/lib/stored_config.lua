-- lib/stored_config.lua: a limiter's stored config checked as the acquire scripts
-- check one, for the scripts that write beside a config without deciding on it.
-- Part of: release, settle, keep_alive
-- Twin in Rust: runtime/src/backend/memory/state.rs (a limiter held in process keeps
--   its config as numbers: nothing to check)

-- Rule i's config as read (rate, interval, type, keepAliveTime), each field present
-- checked before anything is written: a decimal integer, rate and interval from 1,
-- keepAliveTime from 0, each up to 2^53, type 0 or 1.
local function check_config(i, config)
  for j, field in ipairs({ 'rate', 'interval', 'type', 'keepAliveTime' }) do
    local text = config[j]
    if text then
      -- (up to 2^53 read as text, before a double rounds 2^53 + 1 to 2^53)
      local n = string.find(text, '^%d+$') and #text <= 16 and (#text < 16 or text <= '9007199254740992')
        and tonumber(text)
      if not (n and n >= (j <= 2 and 1 or 0) and (j ~= 3 or text == '0' or text == '1')) then
        error('redlimit:bad_config:' .. i .. ' ' .. field .. '=' .. quoted(text), 0)
      end
    end
  end
end
