"""Interop driver on the official MCP Python SDK (`mcp`).

Reads one JSON plan on stdin, connects to the server it names with `mcp.Client`, runs the
plan's steps in order and writes one JSON report on stdout. Logs go to stderr. The plan
format and the report are described in ../README.md; client.mjs implements the same
protocol on the official TypeScript SDK.

Exit status: 0 whenever the plan was read (steps may have failed), 2 for an unreadable plan.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from pydantic import ValidationError

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import ElicitResult, Implementation, ToolListChangedNotification

SDK = "python"
HANDSHAKE_VERSION = "2025-11-25"
STATELESS_VERSION = "2026-07-28"
OPS = ("listTools", "call", "reconnect", "sleepMs", "listenToolListChanged", "awaitToolListChanged")
ELICITATION_ANSWERS = ("accept", "decline", "cancel")


class PlanError(Exception):
    """The plan on stdin is not a valid plan."""


def read_plan(text: str) -> dict[str, Any]:
    """Parse and check the plan; raise PlanError naming the first problem."""
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"plan is not JSON: {e}") from e
    if not isinstance(plan, dict):
        raise PlanError("plan must be a JSON object")
    transport = plan.get("transport")
    if not isinstance(transport, dict):
        raise PlanError("plan.transport must be an object")
    kind = transport.get("kind")
    if kind == "stdio":
        if not isinstance(transport.get("command"), str):
            raise PlanError("plan.transport.command must be a string")
        args = transport.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise PlanError("plan.transport.args must be an array of strings")
        env = transport.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise PlanError("plan.transport.env must be an object of strings")
        if "cwd" in transport and not isinstance(transport["cwd"], str):
            raise PlanError("plan.transport.cwd must be a string")
    elif kind == "http":
        if not isinstance(transport.get("url"), str):
            raise PlanError("plan.transport.url must be a string")
        headers = transport.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise PlanError("plan.transport.headers must be an object of strings")
    else:
        raise PlanError('plan.transport.kind must be "stdio" or "http"')
    if not isinstance(plan.get("protocolVersion"), str):
        raise PlanError("plan.protocolVersion must be a string")
    if "clientName" in plan and not isinstance(plan["clientName"], str):
        raise PlanError("plan.clientName must be a string")
    if plan.get("elicitation", "accept") not in ELICITATION_ANSWERS:
        raise PlanError(f"plan.elicitation must be one of {', '.join(ELICITATION_ANSWERS)}")
    steps = plan.get("steps")
    if not isinstance(steps, list):
        raise PlanError("plan.steps must be an array")
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or step.get("op") not in OPS:
            raise PlanError(f"plan.steps[{i}].op must be one of {', '.join(OPS)}")
        op = step["op"]
        if op == "call":
            if not isinstance(step.get("name"), str):
                raise PlanError(f"plan.steps[{i}].name must be a string")
            if "arguments" in step and not isinstance(step["arguments"], dict | None):
                raise PlanError(f"plan.steps[{i}].arguments must be an object")
            if "meta" in step and not isinstance(step["meta"], dict | None):
                raise PlanError(f"plan.steps[{i}].meta must be an object")
            if "progress" in step and not isinstance(step["progress"], bool):
                raise PlanError(f"plan.steps[{i}].progress must be a boolean")
            ms = step.get("cancelAfterMs", 0)
            if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
                raise PlanError(f"plan.steps[{i}].cancelAfterMs must be a non-negative number")
        elif op == "awaitToolListChanged":
            ms = step.get("timeoutMs")
            if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
                raise PlanError(f"plan.steps[{i}].timeoutMs must be a non-negative number")
        elif op == "sleepMs":
            ms = step.get("ms")
            if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
                raise PlanError(f"plan.steps[{i}].ms must be a non-negative number")
    return plan


def sdk_version() -> str:
    return importlib.metadata.version("mcp")


def wire(model: Any) -> Any:
    """A parsed result as wire JSON: camelCase names, only the members the server sent."""
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


def describe(exc: BaseException) -> dict[str, Any]:
    """The report's error object for an exception raised by the SDK."""
    # anyio task groups wrap a single failure in an exception group: report the failure.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        error: dict[str, Any] = {"code": exc.code, "message": exc.message, "kind": type(exc).__name__}
        if exc.data is not None:
            error["data"] = exc.data
        return error
    if isinstance(exc, ValidationError):
        return {"code": None, "message": str(exc), "kind": type(exc).__name__}
    return {"code": None, "message": str(exc) or repr(exc), "kind": type(exc).__name__}


class Driver:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.client: Client | None = None
        self.connect_error: dict[str, Any] | None = None
        self.negotiated: str | None = None
        # notifications/tools/list_changed (2025-11-25) or listen events (2026-07-28) so far.
        self.list_changed = 0
        self.list_changed_event = anyio.Event()
        # The task group of the run, and the scope of an open subscriptions/listen stream.
        self.tasks: anyio.abc.TaskGroup | None = None
        self.listening: anyio.CancelScope | None = None
        # The messages of the elicitation requests the server sent, in order.
        self.elicited: list[str] = []

    async def on_elicit(self, context: Any, params: Any) -> ElicitResult:
        """Answers every elicitation request as plan.elicitation says."""
        self.elicited.append(params.message)
        action = self.plan["elicitation"]
        if action == "accept":
            return ElicitResult(action="accept", content={})
        return ElicitResult(action=action)

    def note_list_changed(self) -> None:
        self.list_changed += 1
        self.list_changed_event.set()

    async def on_message(self, message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            self.note_list_changed()
        await anyio.lowlevel.checkpoint()

    def make_client(self) -> Client:
        transport = self.plan["transport"]
        if transport["kind"] == "stdio":
            server: StdioServerParameters | str = StdioServerParameters(
                command=transport["command"],
                args=transport.get("args", []),
                env=transport.get("env") or None,
                cwd=transport.get("cwd"),
            )
        elif transport.get("headers"):
            # Headers (a bearer token) go on every request of the SDK's own transport.
            server = streamable_http_client(
                transport["url"],
                http_client=create_mcp_http_client(headers=transport["headers"]),
            )
        else:
            server = transport["url"]
        # "legacy" sends initialize offering 2025-11-25; a modern version string adopts that
        # version without any negotiation request (no initialize, no server/discover).
        mode = "legacy" if self.plan["protocolVersion"] == HANDSHAKE_VERSION else STATELESS_VERSION
        return Client(
            server,
            mode=mode,
            client_info=Implementation(name=self.plan.get("clientName", "interop-python"), version=sdk_version()),
            # Every listTools step reaches the server: no client-side response cache.
            cache=None,
            message_handler=self.on_message,
            # With plan.elicitation the client declares the capability and answers so.
            elicitation_callback=self.on_elicit if "elicitation" in self.plan else None,
        )

    async def connect(self) -> dict[str, Any]:
        client = self.make_client()
        try:
            await client.__aenter__()
        except BaseException as e:  # noqa: BLE001 - any connect failure is reported
            if isinstance(e, anyio.get_cancelled_exc_class()):
                raise
            self.connect_error = describe(e)
            logging.warning("connect failed: %s", self.connect_error)
            return {"error": self.connect_error}
        self.client = client
        self.connect_error = None
        self.negotiated = client.protocol_version
        self.list_changed = 0
        self.list_changed_event = anyio.Event()
        return {"ok": {"negotiatedProtocolVersion": self.negotiated}}

    async def disconnect(self) -> None:
        if self.listening is not None:
            self.listening.cancel()
            self.listening = None
        client, self.client = self.client, None
        if client is None:
            return
        try:
            await client.__aexit__(None, None, None)
        except Exception as e:  # noqa: BLE001 - a failed close does not stop the plan
            logging.warning("close failed: %s", describe(e))

    async def lose_connection(self) -> dict[str, Any]:
        """Close a connection whose transport failed; return the failure as an error object.

        A transport failure (e.g. a refused HTTP connection) ends the task group that the
        client's transport runs in, which cancels the step that was waiting on it. Leaving
        the client's context raises the failure itself.
        """
        client, self.client = self.client, None
        error: dict[str, Any] = {"code": None, "message": "the connection was closed", "kind": "ConnectionLost"}
        if client is not None:
            try:
                await client.__aexit__(None, None, None)
            except Exception as e:  # noqa: BLE001 - the failure is the report
                error = describe(e)
        self.connect_error = error
        logging.warning("connection lost: %s", error)
        return error

    async def step(self, step: dict[str, Any]) -> dict[str, Any]:
        op = step["op"]
        if op == "reconnect":
            await self.disconnect()
            return await self.connect()
        cancelled = anyio.get_cancelled_exc_class()
        if op == "sleepMs":
            deadline = anyio.current_time() + step["ms"] / 1000
            if self.client is not None:
                try:
                    await anyio.sleep_until(deadline)
                except cancelled:
                    await self.lose_connection()
            await anyio.sleep_until(deadline)
            return {"ok": {}}
        if self.client is None:
            return {"error": self.connect_error}
        if op == "listenToolListChanged":
            return await self.listen_tool_list_changed()
        if op == "awaitToolListChanged":
            with anyio.move_on_after(step["timeoutMs"] / 1000):
                await self.list_changed_event.wait()
            if self.list_changed == 0:
                message = f"no tools/list_changed within {step['timeoutMs']} ms"
                return {"error": {"code": None, "message": message, "kind": "Timeout"}}
            return {"ok": {"count": self.list_changed}}
        progress: list[dict[str, Any]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append({"progress": value, "total": total, "message": message})

        def report(outcome: dict[str, Any]) -> dict[str, Any]:
            if step.get("progress"):
                outcome["progress"] = progress
            return outcome

        try:
            if op == "listTools":
                return {"ok": wire(await self.client.list_tools())}
            with anyio.move_on_after(step.get("cancelAfterMs", float("inf")) / 1000) as scope:
                result = await self.client.call_tool(
                    step["name"],
                    step.get("arguments"),
                    progress_callback=on_progress if step.get("progress") else None,
                    meta=step.get("meta"),
                )
            if scope.cancelled_caught:
                message = f"the plan cancelled the call after {step['cancelAfterMs']} ms"
                return report({"error": {"code": None, "message": message, "kind": "Cancelled"}})
            return report({"ok": wire(result)})
        except cancelled:
            return report({"error": await self.lose_connection()})
        except Exception as e:  # noqa: BLE001 - every step failure is reported
            return report({"error": describe(e)})

    async def listen_tool_list_changed(self) -> dict[str, Any]:
        """Under 2026-07-28, opens a subscriptions/listen stream for tool list changes and
        returns once the server acknowledged it; under 2025-11-25 the session carries them."""
        if self.negotiated != STATELESS_VERSION:
            return {"ok": {}}
        assert self.client is not None and self.tasks is not None
        client = self.client

        async def listen(*, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
            with anyio.CancelScope() as scope:
                async with client.listen(tools_list_changed=True) as subscription:
                    task_status.started(scope)
                    async for _event in subscription:
                        self.note_list_changed()

        try:
            self.listening = await self.tasks.start(listen)
        except Exception as e:  # noqa: BLE001 - a refused stream is the step's report
            return {"error": describe(e)}
        return {"ok": {}}

    async def run(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        async with anyio.create_task_group() as tasks:
            self.tasks = tasks
            await self.connect()
            try:
                for step in self.plan["steps"]:
                    steps.append(await self.step(step))
            finally:
                await self.disconnect()
        return {
            "sdk": SDK,
            "sdkVersion": sdk_version(),
            "negotiatedProtocolVersion": self.negotiated,
            "steps": steps,
            "elicited": self.elicited,
        }


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="client.py: %(levelname)s %(message)s")
    try:
        plan = read_plan(sys.stdin.read())
    except PlanError as e:
        print(f"client.py: {e}", file=sys.stderr)
        return 2
    version = plan["protocolVersion"]
    if version not in (HANDSHAKE_VERSION, STATELESS_VERSION):
        reason = (
            f"the Python SDK {sdk_version()} offers only {HANDSHAKE_VERSION} in initialize "
            f"and speaks {STATELESS_VERSION} without a handshake; it cannot select {version}"
        )
        report: dict[str, Any] = {"unsupported": reason}
    else:
        report = anyio.run(Driver(plan).run)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
