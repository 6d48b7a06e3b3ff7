//! `toolcall-gateway`: the stack of tower-toolcall in front of MCP servers.

#![forbid(unsafe_code)]

mod config;
mod mcp_json;

fn main() {}
