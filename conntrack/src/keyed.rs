//! A map of small copyable keys (a service's VIP, protocol and port; an
//! owned address) to values, on the flow index's one-line buckets
//! ([`crate::index`]), so that a batch can hash its keys and fetch their
//! buckets first ([`Keyed::hash`], [`Keyed::prefetch`]), then probe them
//! once the lines arrived ([`Keyed::candidate`]: the bucket only), fetch
//! the entries they point at ([`Keyed::prefetch_at`]) and check them a
//! stage later ([`Keyed::confirm`]), so no stage waits on a line it asked
//! for in the same pass.
//!
//! Entries live in a dense vector, each at a position that stays its own
//! while it lives (a replaced value keeps it; a removed entry's position
//! is reused by a later insert): a batch can carry the position from one
//! stage to the next instead of probing again. Each entry starts on a
//! line, its key first: a probe's key check reads the line that also
//! holds the value's first bytes, and an entry of up to 128 bytes takes
//! exactly two lines, never three.
//!
//! Hand-written for the reason the flow index is: hashbrown has no way to
//! ask where a hash's group lies, so a batch cannot prefetch it, and its
//! control bytes and values are two misses.
//!
//! Invariants: the index holds exactly the positions of the occupied
//! entries, each under its key's hash; `free` holds exactly the vacant
//! positions; the index is sized for `keys` values and rebuilt twice as
//! large before it would hold more.

use std::hash::{BuildHasher, Hash};

use crate::index::Index;

/// Keys the smallest index is sized for.
const MIN_KEYS: usize = 16;

/// A position's key and value (the key stays, unread, once the value
/// is removed).
#[repr(C, align(64))]
struct Entry<K, V> {
    key: K,
    value: Option<V>,
}

impl<K, V> Entry<K, V> {
    #[inline(always)]
    fn get(&self) -> Option<(&K, &V)> {
        self.value.as_ref().map(|v| (&self.key, v))
    }
}

/// The map (see the module docs).
pub struct Keyed<K, V> {
    index: Index,
    entries: Vec<Entry<K, V>>,
    free: Vec<u32>,
    keys: usize,
    hasher: foldhash::fast::RandomState,
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for Keyed<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.entries.iter().filter_map(Entry::get))
            .finish()
    }
}

impl<K: Hash + Eq + Copy, V> Default for Keyed<K, V> {
    fn default() -> Self {
        Keyed {
            index: Index::with_capacity(MIN_KEYS),
            entries: Vec::new(),
            free: Vec::new(),
            keys: MIN_KEYS,
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<K: Hash + Eq + Copy, V> Keyed<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bytes an entry takes: whole lines.
    pub const ENTRY_BYTES: usize = size_of::<Entry<K, V>>();

    /// The hash of `key` (for [`Keyed::prefetch`] and
    /// [`Keyed::find_hashed`]).
    #[inline(always)]
    pub fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Starts fetching the bucket of `hash` (never dereferenced here).
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        self.index.prefetch(hash);
    }

    /// The position of `key`, whose hash is `hash`.
    #[inline(always)]
    pub fn find_hashed(&self, hash: u64, key: &K) -> Option<u32> {
        self.index.find(
            hash,
            |v| matches!(self.entries[v as usize].get(), Some((k, _)) if k == key),
        )
    }

    /// A batch's probe that reads only the bucket: the position `key`
    /// (whose hash is `hash`) most likely has, to fetch
    /// ([`Keyed::prefetch_at`]) and then check with [`Keyed::confirm`].
    #[inline(always)]
    pub fn candidate(&self, hash: u64) -> Option<u32> {
        self.index.first(hash)
    }

    /// The position of `key` (whose hash is `hash`), given the
    /// [`Keyed::candidate`] found for it: the candidate if it holds the
    /// key, else a whole lookup.
    #[inline(always)]
    pub fn confirm(&self, hash: u64, key: &K, candidate: Option<u32>) -> Option<u32> {
        match candidate {
            Some(p) if matches!(self.at(p), Some((k, _)) if k == key) => Some(p),
            _ => self.find_hashed(hash, key),
        }
    }

    /// The position of `key`.
    #[inline]
    pub fn position(&self, key: &K) -> Option<u32> {
        self.find_hashed(self.hash(key), key)
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.at(self.position(key)?).map(|(_, v)| v)
    }

    /// Whether `key` is there.
    #[inline]
    pub fn contains(&self, key: &K) -> bool {
        self.position(key).is_some()
    }

    /// The entry at `pos`, if one lives there.
    #[inline(always)]
    pub fn at(&self, pos: u32) -> Option<(&K, &V)> {
        self.entries.get(pos as usize)?.get()
    }

    /// Starts fetching every line of the entry at `pos`.
    #[inline(always)]
    pub fn prefetch_at(&self, pos: u32) {
        if let Some(e) = self.entries.get(pos as usize) {
            crate::prefetch_lines(e as *const Entry<K, V>);
        }
    }

    /// Adds `key` with `value`, or replaces its value (the position stays):
    /// the value replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let hash = self.hash(&key);
        if let Some(pos) = self.find_hashed(hash, &key) {
            return self.entries[pos as usize].value.replace(value);
        }
        if self.index.len() >= self.keys {
            self.grow();
        }
        let pos = match self.free.pop() {
            Some(p) => {
                self.entries[p as usize] = Entry {
                    key,
                    value: Some(value),
                };
                p
            }
            None => {
                self.entries.push(Entry {
                    key,
                    value: Some(value),
                });
                (self.entries.len() - 1) as u32
            }
        };
        let added = self.index.insert(hash, pos);
        debug_assert!(added, "the index is sized ahead");
        None
    }

    /// Removes `key`: its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let hash = self.hash(key);
        let pos = self.find_hashed(hash, key)?;
        self.index.remove(hash, pos);
        self.free.push(pos);
        self.entries[pos as usize].value.take()
    }

    /// Rebuilds the index for twice as many keys.
    fn grow(&mut self) {
        self.keys *= 2;
        let mut index = Index::with_capacity(self.keys);
        for (pos, e) in self.entries.iter().enumerate() {
            if e.value.is_some() {
                index.insert(self.hash(&e.key), pos as u32);
            }
        }
        self.index = index;
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().filter_map(Entry::get)
    }

    /// Every value.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

impl<K: Hash + Eq + Copy> Keyed<K, ()> {
    /// Adds `key` to a set: whether it was new.
    pub fn add(&mut self, key: K) -> bool {
        self.insert(key, ()).is_none()
    }
}

impl<K: Hash + Eq + Copy> Extend<K> for Keyed<K, ()> {
    fn extend<I: IntoIterator<Item = K>>(&mut self, iter: I) {
        for k in iter {
            self.add(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u16..300, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0u16..300).prop_map(Op::Remove),
        ]
    }

    /// Every entry starts on a line, its key at the start: a key and up
    /// to 56 bytes of value (one with a niche, as a pointer has) make one
    /// line, up to 120 bytes two.
    #[test]
    fn an_entry_starts_on_a_line_with_its_key() {
        use std::num::NonZeroU64;
        type Big = (NonZeroU64, [u64; 13]);
        let mut m: Keyed<u64, Big> = Keyed::new();
        for k in 0..100u64 {
            m.insert(k, (NonZeroU64::MIN, [k; 13]));
        }
        for k in 0..100u64 {
            let pos = m.position(&k).unwrap();
            let (key, value) = m.at(pos).unwrap();
            let at = key as *const u64 as usize;
            assert_eq!(at % 64, 0, "key {k}");
            assert_eq!(value as *const Big as usize - at, 8);
        }
        assert_eq!(Keyed::<u64, Big>::ENTRY_BYTES, 128);
        assert_eq!(Keyed::<u64, (NonZeroU64, [u64; 6])>::ENTRY_BYTES, 64);
    }

    proptest! {
        /// Any sequence of inserts and removes, through several growths,
        /// answers as a map does, and a live key keeps its position.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec(op(), 0..2000)) {
            let mut m = Keyed::new();
            let mut model = HashMap::new();
            let mut pos = HashMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => {
                        prop_assert_eq!(m.insert(k, v), model.insert(k, v));
                        let p = m.position(&k).unwrap();
                        prop_assert_eq!(*pos.entry(k).or_insert(p), p);
                    }
                    Op::Remove(k) => {
                        prop_assert_eq!(m.remove(&k), model.remove(&k));
                        pos.remove(&k);
                    }
                }
                prop_assert_eq!(m.len(), model.len());
            }
            for k in 0..300u16 {
                prop_assert_eq!(m.get(&k), model.get(&k));
                let h = m.hash(&k);
                prop_assert_eq!(m.find_hashed(h, &k), m.position(&k));
                prop_assert_eq!(m.confirm(h, &k, m.candidate(h)), m.position(&k));
                prop_assert_eq!(m.confirm(h, &k, Some(0)), m.position(&k));
                if let Some(p) = m.position(&k) {
                    prop_assert_eq!(m.at(p), Some((&k, &model[&k])));
                }
            }
            let mut all: Vec<_> = m.iter().map(|(k, v)| (*k, *v)).collect();
            let mut want: Vec<_> = model.into_iter().collect();
            all.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(all, want);
        }
    }

    #[test]
    fn a_removed_position_is_reused_and_grows_past_its_first_size() {
        let mut m = Keyed::new();
        for k in 0..1000u32 {
            m.add(k);
        }
        assert_eq!(m.len(), 1000);
        let p = m.position(&7).unwrap();
        m.remove(&7);
        assert!(!m.contains(&7));
        assert!(m.at(p).is_none());
        m.add(5000);
        assert_eq!(m.position(&5000), Some(p));
        assert!((0..1000).filter(|&k| k != 7).all(|k| m.contains(&k)));
    }
}
