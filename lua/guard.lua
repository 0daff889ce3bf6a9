-- guard.lua (after limiter.lua): put in front of expire.lua and keep_alive.lua, which
-- set TTLs and fields on KEYS[1]: they run only when it is missing or a limiter's
-- config.
limiter_config(KEYS[1])
