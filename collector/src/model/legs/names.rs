//! The interned MSR, contact and conference names of the leg table: one
//! copy of each name, with the number of live legs on it, so a million legs
//! hold 4-byte numbers rather than strings (the cost notes of the parent
//! module). A name whose count falls to zero is forgotten and its number
//! reused, so the table never holds a name without a live leg.

use std::collections::HashMap;

/// Interned names with a live-leg count each; a name whose count falls to
/// zero is forgotten (its number is reused).
#[derive(Debug, Default)]
pub(super) struct Names {
    pub(super) ids: HashMap<Box<str>, u32, foldhash::fast::RandomState>,
    slots: Vec<Option<(Box<str>, u32)>>,
    free: Vec<u32>,
}

impl Names {
    /// The number of `name`, counting one more leg on it.
    pub(super) fn acquire(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            if let Some(Some((_, n))) = self.slots.get_mut(id as usize) {
                *n += 1;
            }
            return id;
        }
        let boxed: Box<str> = name.into();
        let entry = Some((boxed.clone(), 1));
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = entry;
                id
            }
            None => {
                self.slots.push(entry);
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.ids.insert(boxed, id);
        id
    }

    /// One leg fewer on `id`; never below zero.
    pub(super) fn release(&mut self, id: u32) {
        let Some(slot) = self.slots.get_mut(id as usize) else {
            return;
        };
        let gone = match slot {
            Some((_, n)) => {
                *n = n.saturating_sub(1);
                *n == 0
            }
            None => false,
        };
        if gone {
            if let Some((name, _)) = slot.take() {
                self.ids.remove(&name);
                self.free.push(id);
            }
        }
    }

    pub(super) fn name(&self, id: u32) -> &str {
        match self.slots.get(id as usize) {
            Some(Some((name, _))) => name,
            _ => "",
        }
    }

    pub(super) fn count(&self, name: &str) -> u32 {
        self.ids
            .get(name)
            .and_then(|&id| self.slots.get(id as usize))
            .and_then(|s| s.as_ref())
            .map_or(0, |(_, n)| *n)
    }

    pub(super) fn counts(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.slots.iter().flatten().map(|(n, c)| (&**n, *c))
    }
}
