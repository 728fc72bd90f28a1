//! The scoped stream override: "use stream S for everything inside this block".
//!
//! The override is ambient state that follows *tasks*, not threads. A synchronous scope
//! ([`Stream::enter`], [`with_stream`]) sets it on the current thread for the guard's
//! lifetime. An async scope ([`WithStream`], made by [`Stream::scope`]) sets it around
//! every poll of the wrapped future and restores the previous value after each poll, so
//! it holds across `.await` when a multi-threaded executor moves the task between
//! threads, and never leaks onto other tasks that run on the same thread.
//!
//! The thread-local holds only a `Weak` reference: it never owns a stream (the guard
//! does), so no thread-local keeps a backend resource alive past its scope.

use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::runtime::stream::{Stream, StreamInner};
use crate::sync::Weak;

thread_local! {
    static OVERRIDE: RefCell<Option<Weak<StreamInner>>> = const { RefCell::new(None) };
}

/// The stream installed by the innermost active scope on this thread or task, if any.
pub fn current_stream_override() -> Option<Stream> {
    OVERRIDE.try_with(|c| c.borrow().as_ref().and_then(|w| w.upgrade())).ok().flatten().map(Stream::from_inner)
}

fn swap(new: Option<Weak<StreamInner>>) -> Option<Weak<StreamInner>> {
    OVERRIDE.try_with(|c| std::mem::replace(&mut *c.borrow_mut(), new)).unwrap_or(None)
}

/// Restores the previous override when dropped. Not `Send`: drop it on the thread that
/// made it, innermost first.
#[must_use = "the override ends when the guard is dropped"]
pub struct StreamGuard {
    prev: Option<Weak<StreamInner>>,
    _stream: Stream,
    _not_send: PhantomData<*const ()>,
}

impl Stream {
    /// Makes this stream the target of every op built on this thread until the guard is
    /// dropped. For async code use [`Stream::scope`] instead: a guard held across
    /// `.await` would stay on the thread while the task moves.
    pub fn enter(&self) -> StreamGuard {
        let prev = swap(Some(self.downgrade()));
        StreamGuard { prev, _stream: self.clone(), _not_send: PhantomData }
    }
    /// Wraps a future so that every op it builds, across all its `.await`s and whatever
    /// thread polls it, targets this stream.
    pub fn scope<F: Future>(&self, fut: F) -> WithStream<F> {
        WithStream { stream: self.clone(), fut }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        swap(self.prev.take());
    }
}

/// Runs `f` with `stream` as the target of every op it builds on this thread.
pub fn with_stream<R>(stream: &Stream, f: impl FnOnce() -> R) -> R {
    let _g = stream.enter();
    f()
}

pin_project_lite::pin_project! {
    /// A future whose polls all run with a stream override (see [`Stream::scope`]).
    pub struct WithStream<F> {
        stream: Stream,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for WithStream<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _g = this.stream.enter();
        this.fut.poll(cx)
    }
}
