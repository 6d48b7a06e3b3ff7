//! Pieces every middleware service of the crate shares.

/// The `get_ref`, `get_mut` and `into_inner` of a middleware service whose inner service `S`
/// is its `inner` field.
macro_rules! inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// The inner service, by value.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}

pub(crate) use inner_service_accessors;
