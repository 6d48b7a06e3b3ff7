//! Benchmarks of envelope parsing and validation.

fn main() {}
