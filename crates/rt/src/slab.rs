//! A slab of slots addressed by index, with a generation per slot so that a
//! stale handle (a waker of a finished task, a completion for a reused
//! operation slot) is recognised instead of reaching the wrong occupant.

pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

struct Slot<T> {
    gen: u32,
    value: Option<T>,
}

/// Index and generation of an occupied slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub idx: u32,
    pub gen: u32,
}

impl Key {
    pub(crate) fn to_u64(self) -> u64 {
        (self.gen as u64) << 32 | self.idx as u64
    }
    pub(crate) fn from_u64(v: u64) -> Key {
        Key { idx: v as u32, gen: (v >> 32) as u32 }
    }
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Slab<T> {
        Slab { slots: Vec::new(), free: Vec::new(), len: 0 }
    }

    pub(crate) fn insert(&mut self, value: T) -> Key {
        self.len += 1;
        match self.free.pop() {
            Some(idx) => {
                let s = &mut self.slots[idx as usize];
                s.gen = s.gen.wrapping_add(1);
                s.value = Some(value);
                Key { idx, gen: s.gen }
            }
            None => {
                let idx = u32::try_from(self.slots.len()).expect("more than 2^32 slots");
                self.slots.push(Slot { gen: 0, value: Some(value) });
                Key { idx, gen: 0 }
            }
        }
    }

    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        match self.slots.get_mut(key.idx as usize) {
            Some(s) if s.gen == key.gen => s.value.as_mut(),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, key: Key) -> Option<T> {
        match self.slots.get_mut(key.idx as usize) {
            Some(s) if s.gen == key.gen && s.value.is_some() => {
                self.len -= 1;
                self.free.push(key.idx);
                s.value.take()
            }
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Keys of every occupant.
    pub(crate) fn keys(&self) -> Vec<Key> {
        let mut out = Vec::with_capacity(self.len);
        for (i, s) in self.slots.iter().enumerate() {
            if s.value.is_some() {
                out.push(Key { idx: i as u32, gen: s.gen });
            }
        }
        out
    }

    /// Remove and return every occupant.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.len);
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Some(v) = s.value.take() {
                out.push(v);
                self.free.push(i as u32);
            }
        }
        self.len = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_miss() {
        let mut s = Slab::new();
        let a = s.insert(1);
        assert_eq!(s.remove(a), Some(1));
        let b = s.insert(2);
        assert_eq!(a.idx, b.idx);
        assert_eq!(s.get_mut(a), None);
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get_mut(b), Some(&mut 2));
        assert_eq!(Key::from_u64(b.to_u64()), b);
        assert_eq!(s.len(), 1);
        assert_eq!(s.drain(), vec![2]);
        assert_eq!(s.len(), 0);
    }
}
