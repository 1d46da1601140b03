//! guildhall's integration tests: one binary, one module per behaviour.

// Tests assert by unwrapping; a panic is the failure report.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

/// A real PostgreSQL server for the tests that need one, started on first use.
#[cfg(feature = "postgres")]
mod pg;
/// Test tools and polling helpers shared by the modules below.
mod support;

/// A2A at the edge: the board and mail behind it, isolation, auth, governance, streams.
#[cfg(feature = "a2a")]
mod a2a;
/// `guildhall bench` from the outside: its figures are present and consistent.
mod bench;
/// What one call may cost, held under a lowered address space for the server.
mod bounds;
/// The circuit breaker as seen through runtime calls.
mod breaker;
/// Deadlines, cancellation and tools that ignore it.
mod cancellation;
/// Many concurrent calls with random failures: exactly one reply each.
mod chaos;
/// Several servers sharing one PostgreSQL database.
#[cfg(feature = "postgres")]
mod cluster;
/// Command tools from a manifest: argv not shell, process groups, reload, governance.
mod commands;
/// Tools composed of tools: the laws, fan-out, deadlines, pipelines over MCP.
mod compose;
/// Concurrent tools and isolation between tools.
mod concurrency;
/// Session contexts: strategies, batches, concurrency, history, persistence, export.
mod context;
/// JSON argument validation and schemas derived from the tool contract.
mod contract;
/// Crashes: a panicking tool is restarted with fresh state and the next call succeeds.
mod crash;
/// Durable sends killed with SIGKILL at random points lose no acknowledged message.
mod durability;
/// `web_fetch` against a local server: Markdown, limits, redirects, no private addresses.
mod fetch;
/// The file tools: confinement, read-before-write, concurrent editors, edits, paging.
mod files;
/// The first hour: `guildhall mcp` clients in any order, told who they are, clear errors.
mod first_hour;
/// Call governance: rules, trust, approvals, hooks, loop guard, truncation, cache, audit, events.
mod governance;
/// `guildhall hook`: Claude Code's hooks told of new mail once, stops held a bounded number
/// of times, failing open.
mod hooks;
/// Random and hostile arguments into every tool: no crash, no circuit opened for others.
mod hostile;
/// Humans in the loop: ask_human and confirm, by elicitation or by the humans' inboxes.
mod humans;
/// Agents the runtime launches: identity, restarts, exits mailed, stops, limits.
mod launch;
/// The crate's modules depend on each other in one direction.
mod layers;
/// Agents and mailboxes: addressing, ordering, waiting, passivation, crashes, limits.
mod mailbox;
/// The MCP server on the wire: both eras over a duplex and over HTTP.
mod mcp;
/// Long calls as MCP tasks: created, read after a reconnect, cancelled, crashed.
mod mcp_tasks;
/// MCP resources (inbox, agents, context) and their subscriptions, prompts, completions.
mod resources;
/// Registration, lookup, snapshots and shutdown of the runtime.
mod runtime;
/// The sandbox every started process runs in, tried as a hostile agent.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod sandbox;
/// Tool schemas are standard JSON Schema that clients' validators accept, results included.
mod schemas;
/// Other MCP servers proxied as supervised tools: crashes, hangs, failed starts, the CLI.
mod servers;
/// The bash tool: process groups, limits, environment, deny patterns.
mod shell;
/// Skill folders served as the `skill` tool: listing, loading, roles, asks, reloads.
mod skills;
/// The durable store: restarts, group commit, and stores that must not be opened.
mod store;
/// The PostgreSQL store: paging, migrations, the database going away and coming back.
#[cfg(feature = "postgres")]
mod store_postgres;
/// Subsystems: an embedder's own installed, started and stopped in order with the tree.
mod subsystems;
/// Supervision strategies, restart types, intensity and escalation (supervision crate).
mod supervision;
/// The public surface: cancel safety documented, error types non-exhaustive.
mod surface;
/// The task board: concurrent claims, leases, dependencies, notices, history, the CLI.
mod tasks;
/// Tool calls as OpenTelemetry spans, received by an OTLP/HTTP collector in the test.
mod telemetry;
