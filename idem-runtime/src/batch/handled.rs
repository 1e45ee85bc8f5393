//! What became of each message of a batch.

use crate::error::Error;

/// What became of one message of a batch, in the batch's order.
#[derive(Debug)]
#[must_use = "a failed message must be retried or dead-lettered, the others acknowledged"]
pub enum Handled<T, E> {
    /// The first run for its key: the handler ran and its transaction
    /// committed, with the dedup record. Its answer.
    Succeeded(T),
    /// A repeat: an earlier run with its key (an earlier delivery, or an
    /// earlier copy in this batch) committed; the handler did not run. The
    /// first run's answer, or `None` if it could not be kept (for a single
    /// call, [`Error::AnswerNotKept`]).
    Repeat(Option<T>),
    /// Nothing of this message was kept: its transaction rolled back, and
    /// running it again runs the handler again.
    Failed(Failure<E>),
}

impl<T, E> Handled<T, E> {
    /// The message took effect, now or before: acknowledge it.
    pub fn is_done(&self) -> bool {
        !matches!(self, Handled::Failed(_))
    }
}

/// Why a message of a batch failed. Its `Display` is what a dead-letter
/// header carries.
#[derive(Debug, thiserror::Error)]
pub enum Failure<E> {
    /// The handler returned this error.
    #[error("{0}")]
    Handler(E),
    /// idem's own error: the guard refused the message or the database
    /// failed (a key missing or reused with another payload, a claim or a
    /// commit that failed).
    // Not `Guard`: a public variant of that name makes rustc print
    // `idem::Guard` in full in every error that names the guard.
    #[error(transparent)]
    Idem(Error),
    /// The handler panicked, with this message.
    #[error("the handler panicked: {0}")]
    Panicked(String),
}

impl<E> Failure<E> {
    /// Whether running the message again can succeed. The handler's errors
    /// and panics count as retryable (idem cannot tell a poison message
    /// from an outage: bound the attempts, then dead-letter); the guard's
    /// as [`Error::is_retryable`] says (a missing key or a key reused with
    /// another payload never are).
    pub fn is_retryable(&self) -> bool {
        match self {
            Failure::Handler(_) | Failure::Panicked(_) => true,
            Failure::Idem(e) => e.is_retryable(),
        }
    }
}
