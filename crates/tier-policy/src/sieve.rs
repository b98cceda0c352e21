use std::hash::Hash;

use crate::{Map, Policy};

const NIL: usize = usize::MAX;

#[derive(Debug)]
struct Node<K> {
    key: K,
    visited: bool,
    /// Toward the head (newer).
    newer: usize,
    /// Toward the tail (older).
    older: usize,
}

/// SIEVE: new keys enter at the head of one FIFO; a read sets a key's visited bit; a hand
/// walks from the tail toward the head, clearing visited bits, and evicts the first key whose
/// bit was clear. The hand stays where it stopped.
#[derive(Debug)]
pub struct Sieve<K> {
    nodes: Vec<Node<K>>,
    free: Vec<usize>,
    slots: Map<K, usize>,
    head: usize,
    tail: usize,
    hand: usize,
}

impl<K> Default for Sieve<K> {
    fn default() -> Self {
        Sieve {
            nodes: Vec::new(),
            free: Vec::new(),
            slots: Map::default(),
            head: NIL,
            tail: NIL,
            hand: NIL,
        }
    }
}

impl<K: Clone + Eq + Hash + Send> Sieve<K> {
    fn unlink(&mut self, i: usize) {
        let (newer, older) = (self.nodes[i].newer, self.nodes[i].older);
        if newer == NIL {
            self.head = older;
        } else {
            self.nodes[newer].older = older;
        }
        if older == NIL {
            self.tail = newer;
        } else {
            self.nodes[older].newer = newer;
        }
        if self.hand == i {
            self.hand = newer;
        }
        self.free.push(i);
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for Sieve<K> {
    fn insert(&mut self, key: &K, _weight: u64, _after: Option<&K>) {
        if let Some(&i) = self.slots.get(key) {
            self.nodes[i].visited = true;
            return;
        }
        let node = Node {
            key: key.clone(),
            visited: false,
            newer: NIL,
            older: self.head,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        if self.head != NIL {
            self.nodes[self.head].newer = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
        self.slots.insert(key.clone(), i);
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        if let Some(&i) = self.slots.get(key) {
            self.nodes[i].visited = true;
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(i) = self.slots.remove(key) {
            self.unlink(i);
        }
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        // Two full turns clear every visited bit; a third finds nothing only if all are kept.
        let mut steps = 3 * self.slots.len();
        let mut i = if self.hand == NIL {
            self.tail
        } else {
            self.hand
        };
        while steps > 0 && i != NIL {
            steps -= 1;
            let next = match self.nodes[i].newer {
                NIL => self.tail,
                n => n,
            };
            if self.nodes[i].visited {
                self.nodes[i].visited = false;
            } else if !keep(&self.nodes[i].key) {
                let key = self.nodes[i].key.clone();
                self.hand = next;
                self.slots.remove(&key);
                self.unlink(i);
                if self.hand == i {
                    self.hand = NIL;
                }
                return Some(key);
            }
            i = next;
        }
        None
    }

    fn clear(&mut self) {
        *self = Sieve::default();
    }
}
