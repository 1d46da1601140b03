//! An ordered map for keys that mostly arrive in order: message ids and log versions grow.

use std::collections::VecDeque;

/// Entries kept sorted by key in one ring buffer.
///
/// Where keys mostly grow, this beats a `BTreeMap`: an insert compares with the last key and
/// pushes at the back, and a removal of the oldest pops the front, so a write touches a
/// cache line or two instead of walking nodes, and nothing is allocated once the buffer has
/// grown. A key out of order is found by binary search and costs a shift of the entries
/// between it and the nearer end; that is the price of the layout, fine for keys that are at
/// most a little out of order, and the reason not to use this for random keys.
#[derive(Debug, Clone)]
pub(crate) struct SortedDeque<K, V> {
    entries: VecDeque<(K, V)>,
}

impl<K, V> Default for SortedDeque<K, V> {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
        }
    }
}

impl<K: Ord, V> SortedDeque<K, V> {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn search(&self, key: &K) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// Inserts or replaces; returns the value replaced.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.entries.back() {
            Some((last, _)) if *last >= key => match self.search(&key) {
                Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
                Err(i) => {
                    self.entries.insert(i, (key, value));
                    None
                }
            },
            _ => {
                self.entries.push_back((key, value));
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let at = match self.entries.front() {
            Some((first, _)) if first == key => 0,
            _ => self.search(key).ok()?,
        };
        self.entries.remove(at).map(|(_, value)| value)
    }

    /// Removes the entries with keys below `end`, the first `most` of them at most;
    /// returns them, in key order.
    pub(crate) fn pop_front_before(&mut self, end: &K, most: usize) -> Vec<(K, V)> {
        let below = self.entries.partition_point(|(k, _)| k < end).min(most);
        self.entries.drain(..below).collect()
    }

    /// Gives memory back once at most an eighth of it is used, keeping at least `keep`
    /// slots: a buffer that empties and fills again (a mailbox read as it is written) then
    /// does not regrow each time, and one left large by a burst shrinks.
    pub(crate) fn shrink_sparse(&mut self, keep: usize) {
        let capacity = self.entries.capacity();
        if capacity > keep && self.entries.len() < capacity / 8 {
            self.entries.shrink_to(keep.max(self.entries.len() * 2));
        }
    }

    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.search(key).ok().map(|i| &self.entries[i].1)
    }

    /// Entries in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// Entries from the first key at least `start`, in key order.
    pub(crate) fn iter_from<'a>(
        &'a self,
        start: &K,
    ) -> impl Iterator<Item = (&'a K, &'a V)> + use<'a, K, V> {
        let from = self.entries.partition_point(|(k, _)| k < start);
        self.entries.range(from..).map(|(k, v)| (k, v))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::SortedDeque;

    proptest! {
        /// Whatever the order of keys, it behaves as a `BTreeMap`: keys that mostly grow (the
        /// fast paths) and keys at random (the searches) alike.
        #[test]
        fn behaves_as_an_ordered_map(
            ops in prop::collection::vec((any::<bool>(), 0u16..400, any::<bool>()), 1..300),
            probe in 0u16..400,
        ) {
            let (mut sorted, mut model) = (SortedDeque::default(), BTreeMap::new());
            for (i, (growing, key, put)) in ops.into_iter().enumerate() {
                // A growing key is near the largest so far; others anywhere.
                let key = if growing { (i as u16).saturating_add(key % 4) } else { key };
                if put {
                    prop_assert_eq!(sorted.insert(key, i), model.insert(key, i));
                } else {
                    prop_assert_eq!(sorted.remove(&key), model.remove(&key));
                    sorted.shrink_sparse(4);
                }
                prop_assert_eq!(sorted.len(), model.len());
            }
            prop_assert!(sorted.iter().eq(model.iter()));
            prop_assert!(sorted.iter_from(&probe).eq(model.range(probe..)));
            prop_assert_eq!(sorted.get(&probe), model.get(&probe));
            prop_assert_eq!(sorted.is_empty(), model.is_empty());
            let most = usize::from(probe % 7);
            let popped = sorted.pop_front_before(&probe, most);
            let below: Vec<(u16, usize)> =
                model.range(..probe).take(most).map(|(k, v)| (*k, *v)).collect();
            for (k, _) in &below {
                model.remove(k);
            }
            prop_assert_eq!(popped, below);
            prop_assert!(sorted.iter().eq(model.iter()));
        }
    }
}
