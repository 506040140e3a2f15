//! [`Window`]: futures run together on one task, their outputs taken in
//! the order they were started, with a bound on how many run at once and
//! on their total weight (the bytes they will hold).
//!
//! A server answers a multi-key read in key order but should not read one
//! key at a time: with each read a device IO, a window of them in flight
//! costs about one device latency instead of one per key. The window polls
//! every running future whenever the task wakes and hands out the oldest
//! output once it is ready; outputs of later futures that finish first
//! are kept until their turn.
//!
//! Invariants: at most `width` futures are held (running or finished and
//! not yet taken), and their weights add up to at most `budget`, except
//! that one future is always admitted to an empty window, whatever its
//! weight, so a single heavy item still runs (alone).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// A future in the window, or its output once it finished.
enum Slot<'a, T> {
    Running(Pin<Box<dyn Future<Output = T> + 'a>>, u64),
    Done(T, u64),
}

/// Futures started in order, run together, finished in order (see the
/// module's doc).
pub struct Window<'a, T> {
    slots: VecDeque<Slot<'a, T>>,
    width: usize,
    budget: u64,
    /// The weights of the futures held.
    held: u64,
    /// The most futures held at once so far.
    high_water: usize,
}

impl<'a, T> Window<'a, T> {
    /// A window of at most `width` futures (at least 1) whose weights add
    /// up to at most `budget`.
    pub fn new(width: usize, budget: u64) -> Window<'a, T> {
        Window { slots: VecDeque::new(), width: width.max(1), budget, held: 0, high_water: 0 }
    }

    /// Whether a future of `weight` may be started now: the window is
    /// empty, or holds fewer than its width and the weights with this one
    /// stay within the budget.
    pub fn has_room(&self, weight: u64) -> bool {
        self.slots.is_empty() || (self.slots.len() < self.width && self.held.saturating_add(weight) <= self.budget)
    }

    /// Start `fut`, of `weight`: it is first polled by the next
    /// [`Window::next`]. The caller checks [`Window::has_room`] first
    /// (pushing past it is allowed, and breaks the bound).
    pub fn push(&mut self, fut: impl Future<Output = T> + 'a, weight: u64) {
        self.held = self.held.saturating_add(weight);
        self.slots.push_back(Slot::Running(Box::pin(fut), weight));
        self.high_water = self.high_water.max(self.slots.len());
    }

    /// Futures held (running, or finished and not taken).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The most futures held at once since the window was made.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// The output of the oldest future held, once it is ready, polling
    /// every running one meanwhile; None if the window is empty.
    pub async fn next(&mut self) -> Option<T> {
        if self.slots.is_empty() {
            return None;
        }
        std::future::poll_fn(|cx| {
            for slot in self.slots.iter_mut() {
                let ready = match slot {
                    Slot::Running(f, w) => match f.as_mut().poll(cx) {
                        Poll::Ready(v) => Some((v, *w)),
                        Poll::Pending => None,
                    },
                    Slot::Done(..) => None,
                };
                if let Some((v, w)) = ready {
                    *slot = Slot::Done(v, w);
                }
            }
            match self.slots.front() {
                Some(Slot::Done(..)) => Poll::Ready(()),
                _ => Poll::Pending,
            }
        })
        .await;
        match self.slots.pop_front() {
            Some(Slot::Done(v, w)) => {
                self.held -= w;
                Some(v)
            }
            _ => unreachable!("the front slot was done"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::pin::pin;
    use std::rc::Rc;
    use std::task::Context;

    /// A future that is ready with `v` once its gate opens, counting its
    /// polls (a stand-in for a device read).
    fn gated(v: u32, open: Rc<Cell<bool>>, polls: Rc<Cell<u32>>) -> impl Future<Output = u32> {
        std::future::poll_fn(move |_| {
            polls.set(polls.get() + 1);
            if open.get() {
                Poll::Ready(v)
            } else {
                Poll::Pending
            }
        })
    }

    #[test]
    fn outputs_come_in_push_order_and_every_future_runs_meanwhile() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let gates: Vec<_> = (0..4).map(|_| (Rc::new(Cell::new(false)), Rc::new(Cell::new(0)))).collect();
        let mut w = Window::new(8, u64::MAX);
        for (i, (open, polls)) in gates.iter().enumerate() {
            w.push(gated(i as u32, open.clone(), polls.clone()), 1);
        }
        {
            let mut next = pin!(w.next());
            assert!(next.as_mut().poll(&mut cx).is_pending());
            assert!(gates.iter().all(|(_, p)| p.get() == 1), "every future was started by the first poll");
            // The last three finish first: the oldest is still awaited.
            gates[1..].iter().for_each(|(o, _)| o.set(true));
            assert!(next.as_mut().poll(&mut cx).is_pending());
            gates[0].0.set(true);
            assert_eq!(next.as_mut().poll(&mut cx), Poll::Ready(Some(0)));
        }
        let polls_before: Vec<u32> = gates.iter().map(|(_, p)| p.get()).collect();
        for want in 1..4 {
            assert_eq!(pin!(w.next()).poll(&mut cx), Poll::Ready(Some(want)));
        }
        // A finished future is not polled again.
        assert_eq!(gates.iter().map(|(_, p)| p.get()).collect::<Vec<_>>(), polls_before);
        assert_eq!(pin!(w.next()).poll(&mut cx), Poll::Ready(None));
        assert_eq!(w.high_water(), 4);
    }

    #[test]
    fn room_is_bounded_by_width_and_weight_but_an_empty_window_takes_anything() {
        let mut w: Window<'_, ()> = Window::new(3, 100);
        assert!(w.has_room(1_000), "an empty window takes a future heavier than its budget");
        w.push(async {}, 60);
        assert!(w.has_room(40));
        assert!(!w.has_room(41), "60 + 41 is over the budget");
        w.push(async {}, 40);
        assert!(!w.has_room(1), "the budget is spent");
        assert!(w.has_room(0));
        w.push(async {}, 0);
        assert!(!w.has_room(0), "three futures: the width");
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert_eq!(pin!(w.next()).poll(&mut cx), Poll::Ready(Some(())));
        assert!(w.has_room(60), "the first one's weight is given back");
        assert!(!w.has_room(61));
        assert_eq!(w.len(), 2);
        let mut one: Window<'_, ()> = Window::new(0, 0);
        one.push(async {}, 5);
        assert!(!one.has_room(0), "a width of 0 is 1");
    }
}
