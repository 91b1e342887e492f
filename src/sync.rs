//! Lock helpers shared by the server and the client.

use std::sync::{Mutex, MutexGuard};
#[cfg(feature = "server")]
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, taking the data even if a thread panicked while holding it.
///
/// For data whose writers leave it whole at every point a panic could strike: a poisoned lock
/// then still holds usable data, and refusing it would turn one panic into a failure of every
/// later call.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes `l` for reading, even if a thread panicked while writing it (see [`lock`]).
#[cfg(feature = "server")]
#[inline]
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Takes `l` for writing, even if a thread panicked while writing it (see [`lock`]).
#[cfg(feature = "server")]
#[inline]
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
