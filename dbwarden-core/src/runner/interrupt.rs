//! SIGINT/SIGTERM as the runner sees it: a flag set once, checked between statements.

use tokio::sync::watch;

/// Set by SIGINT/SIGTERM: the runner finishes the current statement, records where it stopped,
/// releases and returns [`Error::Interrupted`].
#[derive(Debug, Clone)]
pub struct Interrupt(watch::Receiver<bool>);

impl Interrupt {
    pub fn new() -> (watch::Sender<bool>, Interrupt) {
        let (tx, rx) = watch::channel(false);
        (tx, Interrupt(rx))
    }

    pub fn never() -> Interrupt {
        let (tx, rx) = watch::channel(false);
        std::mem::forget(tx);
        Interrupt(rx)
    }

    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the interrupt is set.
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|set| *set).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
