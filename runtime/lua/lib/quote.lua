-- lib/quote.lua: a stored text as an error quotes it.
-- Part of: acquire, tokens, release, settle, keep_alive
-- Twin in Rust: runtime/src/backend/redis/replies.rs (the error's detail cut again
--   where the reply is read, whoever answered it)

-- `text` (a stored value another program or a hand wrote: any bytes, any length) as
-- an error's detail quotes it: its first 64 bytes, each outside visible ASCII as `?`,
-- and its length when longer. Quoted whole, a text not UTF-8 made an error reply the
-- client cannot read, and a long one an error as long as the text.
local function quoted(text)
  local shown = string.gsub(string.sub(text, 1, 64), '[^ -~]', '?')
  if #text > 64 then
    return shown .. '... (' .. #text .. ' bytes)'
  end
  return shown
end
