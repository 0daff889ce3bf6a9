-- lib/guard.lua (after lib/limiter.lua): the scripts it is part of set TTLs and
-- fields on KEYS[1], and run only when it is missing or a limiter's config.
-- Part of: expire, keep_alive
-- Twin in Rust: runtime/src/backend/memory/state.rs (a limiter held in process is
--   always one: nothing to guard)
limiter_config(KEYS[1])
