//! A thread-local cell set for the length of a scope, as a connection's poll sets the
//! state its callees read ([`crate::clock`], [`crate::wake`]).

use std::cell::Cell;
use std::thread::LocalKey;

/// Holds what a thread-local cell held before [`Scoped::set`], and puts it back when
/// dropped, unwinding included: nothing set for one poll outlives it, and a poll nested
/// in another leaves the outer one's value as it was.
pub(crate) struct Scoped<T: Copy + 'static> {
    key: &'static LocalKey<Cell<T>>,
    outer: T,
}

impl<T: Copy + 'static> Scoped<T> {
    /// Sets `key` to `value` until the returned guard drops.
    pub(crate) fn set(key: &'static LocalKey<Cell<T>>, value: T) -> Self {
        let outer = key.with(|cell| cell.replace(value));
        Self { key, outer }
    }
}

impl<T: Copy + 'static> Drop for Scoped<T> {
    fn drop(&mut self) {
        self.key.with(|cell| cell.set(self.outer));
    }
}
