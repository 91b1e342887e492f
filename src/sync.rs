//! Lock helpers shared by the server and the client.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data even if a thread panicked while holding it.
///
/// For data whose writers leave it whole at every point a panic could strike: a poisoned lock
/// then still holds usable data, and refusing it would turn one panic into a failure of every
/// later call.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
