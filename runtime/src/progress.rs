//! How long steps (weight upload and conversion, compilation, writing artifacts) report how far they
//! have come. The CLI draws progress bars on a terminal; libraries and tests pass `&Silent`.

pub trait Progress: Sync {
    /// Starts a step of `total` units named `what`.
    fn begin(&self, what: &str, total: u64, unit: Unit);
    /// `done` more units are finished.
    fn advance(&self, done: u64);
    fn end(&self);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Countable things: entry points, tensors.
    Items,
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {
    fn begin(&self, _: &str, _: u64, _: Unit) {}
    fn advance(&self, _: u64) {}
    fn end(&self) {}
}
