//! Run with `cargo run --example quickstart`.

fn main() {}
