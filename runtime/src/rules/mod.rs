//! Rules and their configuration: a limiter's config as Redisson stores it
//! ([`config`]), a rule of a decision ([`rule`]), its numbers checked ([`fit`]) and the checks
//! before its first decision ([`checks`]), a rule as the attribute and the
//! layer describe it ([`spec`]), the process's registry of rule shapes ([`registry`]),
//! rates overridden at run time ([`overrides`]) and the log of config changes
//! ([`config_log`]).

pub(crate) mod checks;
pub(crate) mod config;
pub(crate) mod config_log;
pub(crate) mod fit;
pub(crate) mod overrides;
pub(crate) mod registry;
pub(crate) mod rule;
pub(crate) mod spec;
