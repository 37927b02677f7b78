//! Deltas between samples: the last value of each counter, keyed by its
//! name and a slot (a CPU for per-CPU tables, a field for per-device ones),
//! with the number of keys bounded and resets counted.

use std::collections::HashMap;

/// The last values of one table's counters.
#[derive(Debug)]
pub struct Tracker {
    index: HashMap<String, usize>,
    last: Vec<Vec<Option<u64>>>,
    max_keys: usize,
    max_slots: usize,
    /// Counters that went backwards (a reset or a wrap): their delta is 0.
    pub resets: u64,
    /// Values not recorded because the table already had `max_keys` keys
    /// or the slot was past `max_slots`.
    pub over_limit: u64,
}

impl Tracker {
    pub fn new(max_keys: usize, max_slots: usize) -> Self {
        Self {
            index: HashMap::new(),
            last: Vec::new(),
            max_keys,
            max_slots,
            resets: 0,
            over_limit: 0,
        }
    }

    /// The increase of `key`'s value in `slot` since its previous sample:
    /// 0 the first time, and 0 when it went backwards (counted in
    /// `resets` for a `counter`; a gauge going down is no reset). `None`
    /// past the limits: the value is not recorded.
    pub fn delta(&mut self, key: &str, slot: usize, value: u64, counter: bool) -> Option<u64> {
        if slot >= self.max_slots {
            self.over_limit += 1;
            return None;
        }
        let i = match self.index.get(key) {
            Some(&i) => i,
            None if self.last.len() >= self.max_keys => {
                self.over_limit += 1;
                return None;
            }
            None => {
                self.index.insert(key.to_owned(), self.last.len());
                self.last.push(Vec::new());
                self.last.len() - 1
            }
        };
        let slots = &mut self.last[i];
        if slots.len() <= slot {
            slots.resize(slot + 1, None);
        }
        let previous = slots[slot].replace(value);
        Some(match previous {
            None => 0,
            Some(p) if value >= p => value - p,
            Some(_) => {
                if counter {
                    self.resets += 1;
                }
                0
            }
        })
    }

    /// Keys seen so far.
    pub fn keys(&self) -> usize {
        self.last.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_is_zero_then_increases_and_resets_are_counted() {
        let mut t = Tracker::new(2, 4);
        assert_eq!(t.delta("a", 0, 10, true), Some(0));
        assert_eq!(t.delta("a", 1, 50, true), Some(0), "each slot starts at 0");
        assert_eq!(t.delta("a", 0, 15, true), Some(5));
        assert_eq!(t.delta("a", 0, 15, true), Some(0));
        assert_eq!(t.delta("a", 0, 3, true), Some(0), "reset");
        assert_eq!(t.resets, 1);
        assert_eq!(
            t.delta("a", 0, 4, true),
            Some(1),
            "counts on from the reset"
        );
        assert_eq!(t.delta("g", 0, 100, false), Some(0));
        assert_eq!(t.delta("g", 0, 90, false), Some(0), "a gauge going down");
        assert_eq!(t.resets, 1, "is no reset");
        assert_eq!(t.delta("third", 0, 1, true), None, "past two keys");
        assert_eq!(t.delta("a", 4, 1, true), None, "past four slots");
        assert_eq!(t.over_limit, 2);
        assert_eq!(t.keys(), 2);
    }
}
