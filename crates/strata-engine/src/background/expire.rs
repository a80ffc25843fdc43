//! The expiry sweep: keys whose time has come, found in order through the expiry family.

use strata_format::{keys, Key};
use strata_warm::{Bounds, Family};

use crate::core::Core;
use crate::write::expire_if_due;
use crate::Result;

/// Deletes up to `expire_sweep_count_max` keys that are due.
pub(crate) async fn sweep(core: &Core) -> Result<()> {
    let now = core.now_ms();
    let mut due = Vec::new();
    {
        let mut c = core.warm.cursor(Family::Expiry, Bounds::all(), None);
        c.seek_to_first();
        while c.valid() && due.len() < core.settings.warm.expire_sweep_count_max {
            match keys::decode_expiry_key(c.key()) {
                Ok((at, _)) if at > now => break,
                Ok((at, stored)) => {
                    if let Ok(key) = Key::from_stored(stored) {
                        due.push((at, key));
                    }
                }
                Err(_) => {}
            }
            c.next();
        }
        c.status()?;
    }
    for (at, key) in due {
        expire_if_due(core, &key, at).await?;
    }
    Ok(())
}
