-- lib/guard.lua (after lib/limiter.lua): the scripts it is part of set TTLs and
-- fields on KEYS[1], and run only when it is missing or a limiter's config.
-- Part of: expire, keep_alive
limiter_config(KEYS[1])
