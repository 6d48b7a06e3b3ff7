//! [`Swap`]: a value that a reload replaces while every call reads it.

use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use tower::util::Oneshot;
use tower::{Service, ServiceExt as _};

/// A value replaced on each reload and read by each call: a call gets the value in place
/// when it starts, and keeps it to its end however many replacements follow; the next call
/// gets the new one. Clones share one value.
///
/// Over a service, it is a service: each call goes to the service in place when it arrives
/// (a clone of it, made ready for that call alone).
#[derive(Debug)]
pub(crate) struct Swap<T>(Arc<ArcSwap<T>>);

impl<T> Swap<T> {
    /// `value` in place.
    pub(crate) fn new(value: T) -> Self {
        Swap(Arc::new(ArcSwap::from_pointee(value)))
    }

    /// Puts `value` in place for the calls to come.
    pub(crate) fn replace(&self, value: T) {
        self.0.store(Arc::new(value));
    }

    /// A clone of the value in place.
    fn current(&self) -> T
    where
        T: Clone,
    {
        T::clone(&self.0.load())
    }
}

impl<T> Clone for Swap<T> {
    fn clone(&self) -> Self {
        Swap(self.0.clone())
    }
}

impl<T, Request> Service<Request> for Swap<T>
where
    T: Service<Request> + Clone,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = Oneshot<T, Request>;

    /// Always ready: the service in place is made ready by each call.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), T::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.current().oneshot(request)
    }
}

#[cfg(test)]
mod tests {
    use tower::util::BoxCloneSyncService;

    use super::*;

    type Adder = BoxCloneSyncService<u32, u32, ()>;

    fn adding(k: u32) -> Adder {
        BoxCloneSyncService::new(tower::service_fn(move |n: u32| async move { Ok(n + k) }))
    }

    #[tokio::test]
    async fn a_call_keeps_the_service_it_started_on_and_the_next_gets_the_new_one() {
        let swap = Swap::new(adding(1));
        let started = swap.clone().call(1);
        // Any clone replaces it, for them all.
        swap.clone().replace(adding(10));
        assert_eq!(started.await, Ok(2));
        assert_eq!(swap.clone().oneshot(1).await, Ok(11));
        let value = Swap::new("before");
        value.replace("after");
        assert_eq!(value.clone().current(), "after");
    }
}
