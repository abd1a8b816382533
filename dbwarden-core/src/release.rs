//! Giving a held primitive back, once: by [`ReleaseOnce::release`], which reports what it
//! found, or -- when the holding is dropped first (an error, a panic, a cancelled task) -- in
//! the background on the current runtime; without one (the process is exiting) the lease runs
//! out by itself. One release semantics for every engine: a primitive that is no longer ours
//! at release (it expired, was taken over or unlocked while we held it) is [`Error::Lost`].

use async_trait::async_trait;

use crate::Error;

/// An engine's compare-and-delete of a primitive it holds.
#[async_trait]
pub trait GiveBack: Send + Sync + 'static {
    /// Free the primitive if it is still this holder's: `true`; `false` when it no longer was.
    async fn give_back(&self) -> Result<bool, Error>;

    /// The primitive, as a message names it ("the Redis lease dbwarden:lock:default").
    fn what(&self) -> String;
}

/// A primitive given back once, at [`ReleaseOnce::release`] or on drop.
pub struct ReleaseOnce<G: GiveBack> {
    give: Option<G>,
}

impl<G: GiveBack> ReleaseOnce<G> {
    pub fn new(give: G) -> Self {
        ReleaseOnce { give: Some(give) }
    }

    /// Give it back now; a second call does nothing.
    pub async fn release(&mut self) -> Result<(), Error> {
        let Some(g) = self.give.take() else {
            return Ok(());
        };
        match g.give_back().await? {
            true => Ok(()),
            false => Err(Error::Lost(format!(
                "{} was no longer ours at release (it expired, was taken over or unlocked while we held it)",
                g.what()
            ))),
        }
    }
}

impl<G: GiveBack> Drop for ReleaseOnce<G> {
    fn drop(&mut self) {
        let Some(g) = self.give.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = g.give_back().await {
                    tracing::warn!(
                        "could not give back {} on drop ({e}); it runs out by itself",
                        g.what()
                    );
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counted {
        calls: Arc<AtomicUsize>,
        ours: bool,
    }

    #[async_trait]
    impl GiveBack for Counted {
        async fn give_back(&self) -> Result<bool, Error> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(self.ours)
        }
        fn what(&self) -> String {
            "the test lock".into()
        }
    }

    fn counted(ours: bool) -> (ReleaseOnce<Counted>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let r = ReleaseOnce::new(Counted {
            calls: calls.clone(),
            ours,
        });
        (r, calls)
    }

    #[tokio::test]
    async fn released_once_however_often_asked_and_not_again_on_drop() {
        let (mut r, calls) = counted(true);
        r.release().await.unwrap();
        r.release().await.unwrap();
        drop(r);
        tokio::task::yield_now().await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_primitive_no_longer_ours_at_release_is_lost() {
        let (mut r, _) = counted(false);
        let e = r.release().await.unwrap_err();
        assert!(e.is_lost(), "{e}");
        assert!(
            e.to_string().contains("the test lock was no longer ours"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn dropped_unreleased_it_is_given_back_in_the_background() {
        let (r, calls) = counted(true);
        drop(r);
        for _ in 0..100 {
            if calls.load(Ordering::SeqCst) == 1 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never given back");
    }
}
