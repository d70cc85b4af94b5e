//! Places counted per key, so many at most per key (and, if asked, in
//! all): how much of something shared one client or one address may hold
//! at once (a WireGuard client's DNS-over-TCP connections, a client's name
//! lookups). A place is given back when its guard is dropped.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The places held now, by key (a key holding none has no entry).
#[derive(Debug)]
pub struct KeyedPlaces<K: Eq + Hash + Clone> {
    held: Arc<Mutex<HashMap<K, usize>>>,
    per_key: usize,
}

impl<K: Eq + Hash + Clone> Clone for KeyedPlaces<K> {
    fn clone(&self) -> Self {
        Self {
            held: self.held.clone(),
            per_key: self.per_key,
        }
    }
}

/// One place of a key, given back when dropped.
#[derive(Debug)]
pub struct KeyedPlace<K: Eq + Hash + Clone> {
    held: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: Eq + Hash + Clone> Drop for KeyedPlace<K> {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

fn lock<K>(held: &Mutex<HashMap<K, usize>>) -> MutexGuard<'_, HashMap<K, usize>> {
    held.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Eq + Hash + Clone> KeyedPlaces<K> {
    /// At most `per_key` places per key.
    pub fn new(per_key: usize) -> Self {
        Self {
            held: Arc::default(),
            per_key,
        }
    }

    /// A place for `key`, if it holds fewer than its share and all keys
    /// together fewer than `in_all`.
    pub fn take(&self, key: &K, in_all: usize) -> Option<KeyedPlace<K>> {
        let mut held = lock(&self.held);
        let total: usize = held.values().sum();
        let of_key = held.get(key).copied().unwrap_or(0);
        if total >= in_all || of_key >= self.per_key {
            return None;
        }
        held.insert(key.clone(), of_key + 1);
        Some(KeyedPlace {
            held: self.held.clone(),
            key: key.clone(),
        })
    }

    /// Whether no key holds a place.
    pub fn is_empty(&self) -> bool {
        lock(&self.held).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_per_key_and_in_all_and_given_back() {
        let places = KeyedPlaces::new(2);
        let a1 = places.take(&"a", 3).expect("a's first");
        let a2 = places.take(&"a", 3).expect("a's second");
        assert!(places.take(&"a", 3).is_none(), "a's share is 2");
        let b1 = places.take(&"b", 3).expect("b's first");
        assert!(places.take(&"b", 3).is_none(), "3 in all");
        drop(a1);
        let b2 = places.take(&"b", 3).expect("a gave one back");
        drop((a2, b1, b2));
        assert!(places.is_empty());
    }
}
