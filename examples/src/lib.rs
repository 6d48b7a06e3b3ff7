//! Runnable examples of tower-toolcall, one binary each under `src/bin/`, each starting with
//! the command that runs it:
//!
//! | binary | what it shows |
//! |---|---|
//! | `quickstart` | the stack without HTTP: retried, cached, refused and looping calls |
//! | `turn` | an agent turn run by `tower-toolcall-executor` |
//! | `loop_detect` | a model that repeats a call, stopped |
//! | `grpc` (feature `grpc`) | a tool service over tonic, compiled from `proto/` by this package's build script |
//! | `mcp-example-server` (feature `mcp`) | an MCP notes server over stdio with `tower-toolcall-mcp` |
//!
//! The code blocks of the repository's README compile and run as this package's doctests.

#![forbid(unsafe_code)]

/// The examples of the README, compiled and run as doctests: `cargo test --workspace
/// --all-features` runs them (its gRPC section needs the feature `grpc`, its fleet section
/// the feature `redis`).
#[cfg(all(doctest, feature = "grpc", feature = "redis"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
