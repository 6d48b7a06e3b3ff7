//! The MCP adapter against the official SDKs: the example server (the whole stack behind
//! `McpServer`) driven by the Python and TypeScript SDK clients over stdio and streamable
//! HTTP in both protocol versions, and `McpClient` behind the whole stack in front of
//! `mcp-server-time` (Python) and `server-everything` (TypeScript); and a tool that streams
//! its answer, whose chunks the SDKs' clients get as progress.
//!
//! The SDKs are installed at pinned versions by `examples/tests/interop/setup.sh` (which
//! `.ci/run` calls); a test that finds them missing fails with that command.

mod kit;
mod sdk_clients;
mod streamed;
mod upstreams;
