//! The client's API for rates changed at run time: set, remove and list overrides
//! (the table and its format: `rules::overrides`).

use crate::rules::overrides::{OverrideOf, RateOverride};
use crate::{Client, Error};

impl Client {
    /// Sets an override for every process using this Redis and prefix (and at once
    /// for this client): rules of the attribute and the layer decide with `rate` per
    /// `interval` instead of their own.
    ///
    /// The override is checked first against every rule of this process it reaches,
    /// with the rule's own checks (a rate below the permits the rule takes per call, a
    /// token bucket whose counts would not fit): an override a rule cannot take is
    /// refused with the reason, and nothing is written.
    pub async fn set_override(&self, override_: &RateOverride) -> Result<(), Error> {
        override_.check()?;
        if let OverrideOf::Rule(rule) = &override_.of {
            // this process's rules, and those every process using this Redis published
            let published = self.backend().published_rules().await?;
            crate::rules::registry::check_override(
                &override_.of.field(),
                rule,
                override_.rate,
                override_.interval,
                &published,
            )?;
        }
        self.backend()
            .write_override(&override_.of.field(), Some(&override_.value()))
            .await?;
        self.overrides().edit(|list| {
            list.retain(|o| o.of != override_.of);
            list.push(override_.clone());
        });
        Ok(())
    }

    /// Removes an override; the rule's own rate applies again. False when there was
    /// none.
    pub async fn remove_override(&self, of: &OverrideOf) -> Result<bool, Error> {
        let written = self.backend().write_override(&of.field(), None).await?;
        let had = self.overrides().edit(|list| {
            let had = list.iter().any(|o| &o.of == of);
            list.retain(|o| &o.of != of);
            had
        });
        // In process the overrides are this client's only: the table says.
        Ok(written.unwrap_or(had))
    }

    /// Every override set, rules first, by name. Entries of the hash that do not
    /// parse are left out.
    pub async fn list_overrides(&self) -> Result<Vec<RateOverride>, Error> {
        let mut list = self.backend().read_overrides(self.overrides()).await?;
        list.sort_by(|a, b| a.of.cmp(&b.of));
        Ok(list)
    }
}
