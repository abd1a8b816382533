//! One connection an engine keeps between uses: from one attempt to acquire to the next (a
//! waiting session), from a release to the next acquire, from one heartbeat to the next
//! (docs/design.md §2, `kept.rs`). deadpool's `Manager { create, recycle }` is the model, for a
//! pool of one: a use takes the kept connection or creates one, and only a use that ended
//! cleanly gives it back, so a connection left mid-protocol by an error or a cancelled future is
//! never reused.

use std::ops::{Deref, DerefMut};

use tokio::sync::{Mutex, MutexGuard};

/// The slot. Shared between a lock and the locks it hands out as `Arc<Kept<C>>`.
pub struct Kept<C>(Mutex<Option<C>>);

impl<C> Default for Kept<C> {
    fn default() -> Self {
        Kept(Mutex::new(None))
    }
}

impl<C: Send> Kept<C> {
    /// A slot keeping `c` from the start.
    pub fn holding(c: C) -> Self {
        Kept(Mutex::new(Some(c)))
    }

    /// The kept connection, if any; the slot is empty after.
    pub async fn take(&self) -> Option<C> {
        self.0.lock().await.take()
    }

    /// Keep `c`; a connection kept before is dropped (closing its socket).
    pub async fn put(&self, c: C) {
        *self.0.lock().await = Some(c);
    }

    /// Keep `c` unless one is kept already: then `c` comes back, for the caller to close
    /// cleanly (a driver's close says goodbye to the server; a drop only cuts the socket).
    pub async fn offer(&self, c: C) -> Option<C> {
        let mut slot = self.0.lock().await;
        match *slot {
            None => {
                *slot = Some(c);
                None
            }
            Some(_) => Some(c),
        }
    }

    pub async fn is_kept(&self) -> bool {
        self.0.lock().await.is_some()
    }

    /// The slot itself, locked, for a use in place (asking the kept session something without
    /// taking it out).
    pub async fn lock(&self) -> MutexGuard<'_, Option<C>> {
        self.0.lock().await
    }

    /// For one use: the kept connection, else the one `create` makes. The slot stays locked
    /// until the use ends (uses take turns); the connection goes back only through
    /// [`InUse::keep`], so one dropped without it -- an error, a cancelled future -- is closed
    /// with the socket and the next use creates a fresh one.
    pub async fn checkout<E>(
        &self,
        create: impl Future<Output = Result<C, E>>,
    ) -> Result<InUse<'_, C>, E> {
        let mut slot = self.0.lock().await;
        let conn = match slot.take() {
            Some(c) => c,
            None => create.await?,
        };
        Ok(InUse {
            slot,
            conn: Some(conn),
        })
    }
}

/// A connection checked out of a [`Kept`] slot.
pub struct InUse<'a, C> {
    slot: MutexGuard<'a, Option<C>>,
    conn: Option<C>,
}

impl<C> InUse<'_, C> {
    /// The use ended cleanly: the connection goes back for the next.
    pub fn keep(mut self) {
        *self.slot = self.conn.take();
    }
}

impl<C> Deref for InUse<'_, C> {
    type Target = C;
    fn deref(&self) -> &C {
        self.conn.as_ref().expect("present until kept")
    }
}

impl<C> DerefMut for InUse<'_, C> {
    fn deref_mut(&mut self) -> &mut C {
        self.conn.as_mut().expect("present until kept")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_a_use_that_ends_cleanly_gives_the_connection_back() {
        let kept: Kept<u32> = Kept::default();
        let made = std::sync::atomic::AtomicU32::new(0);
        let create =
            || async { Ok::<_, ()>(made.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1) };
        let c = kept.checkout(create()).await.unwrap();
        assert_eq!(*c, 1);
        c.keep();
        // Reused.
        let c = kept.checkout(create()).await.unwrap();
        assert_eq!(*c, 1);
        drop(c); // a failed use: not given back
        assert!(!kept.is_kept().await);
        assert_eq!(*kept.checkout(create()).await.unwrap(), 2);

        // A use cancelled half-way does not give it back either.
        kept.put(7).await;
        let cancelled = tokio::time::timeout(std::time::Duration::from_millis(10), async {
            let c = kept.checkout(create()).await.unwrap();
            std::future::pending::<()>().await;
            c.keep();
        })
        .await;
        assert!(cancelled.is_err());
        assert!(!kept.is_kept().await);
    }

    #[tokio::test]
    async fn an_offer_to_a_full_slot_comes_back() {
        let kept: Kept<u32> = Kept::default();
        assert_eq!(kept.offer(1).await, None);
        assert_eq!(kept.offer(2).await, Some(2));
        assert_eq!(kept.take().await, Some(1));
        assert_eq!(kept.take().await, None);
    }
}
