// Interop driver on the official MCP TypeScript SDK (@modelcontextprotocol/sdk).
//
// Reads one JSON plan on stdin, connects to the server it names with the SDK's `Client`, runs
// the plan's steps in order and writes one JSON report on stdout. Logs go to stderr. The plan
// format and the report are described in ../README.md; client.py implements the same protocol
// on the official Python SDK.
//
// Exit status: 0 whenever the plan was read (steps may have failed), 2 for an unreadable plan.

import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
    ElicitRequestSchema,
    LATEST_PROTOCOL_VERSION,
    McpError,
    ToolListChangedNotificationSchema
} from '@modelcontextprotocol/sdk/types.js';

const SDK = 'typescript';
const HANDSHAKE_VERSION = '2025-11-25';
const STATELESS_VERSION = '2026-07-28';
const OPS = ['listTools', 'call', 'reconnect', 'sleepMs', 'listenToolListChanged', 'awaitToolListChanged'];
const ELICITATION_ANSWERS = ['accept', 'decline', 'cancel'];

// Node resolves the SDK imported above from ../node_modules, where setup.sh installs it.
const SDK_VERSION = JSON.parse(
    readFileSync(new URL('../node_modules/@modelcontextprotocol/sdk/package.json', import.meta.url), 'utf8')
).version;

class PlanError extends Error {}

const isObject = v => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Parses and checks the plan; throws PlanError naming the first problem. */
function readPlan(text) {
    let plan;
    try {
        plan = JSON.parse(text);
    } catch (e) {
        throw new PlanError(`plan is not JSON: ${e.message}`);
    }
    if (!isObject(plan)) throw new PlanError('plan must be a JSON object');
    const t = plan.transport;
    if (!isObject(t)) throw new PlanError('plan.transport must be an object');
    if (t.kind === 'stdio') {
        if (typeof t.command !== 'string') throw new PlanError('plan.transport.command must be a string');
        if (t.args !== undefined && !(Array.isArray(t.args) && t.args.every(a => typeof a === 'string'))) {
            throw new PlanError('plan.transport.args must be an array of strings');
        }
        if (t.env !== undefined && !(isObject(t.env) && Object.values(t.env).every(v => typeof v === 'string'))) {
            throw new PlanError('plan.transport.env must be an object of strings');
        }
        if (t.cwd !== undefined && typeof t.cwd !== 'string') throw new PlanError('plan.transport.cwd must be a string');
    } else if (t.kind === 'http') {
        if (typeof t.url !== 'string') throw new PlanError('plan.transport.url must be a string');
        if (t.headers !== undefined && !(isObject(t.headers) && Object.values(t.headers).every(v => typeof v === 'string'))) {
            throw new PlanError('plan.transport.headers must be an object of strings');
        }
    } else {
        throw new PlanError('plan.transport.kind must be "stdio" or "http"');
    }
    if (typeof plan.protocolVersion !== 'string') throw new PlanError('plan.protocolVersion must be a string');
    if (plan.clientName !== undefined && typeof plan.clientName !== 'string') {
        throw new PlanError('plan.clientName must be a string');
    }
    if (plan.elicitation !== undefined && !ELICITATION_ANSWERS.includes(plan.elicitation)) {
        throw new PlanError(`plan.elicitation must be one of ${ELICITATION_ANSWERS.join(', ')}`);
    }
    if (!Array.isArray(plan.steps)) throw new PlanError('plan.steps must be an array');
    plan.steps.forEach((step, i) => {
        if (!isObject(step) || !OPS.includes(step.op)) {
            throw new PlanError(`plan.steps[${i}].op must be one of ${OPS.join(', ')}`);
        }
        if (step.op === 'call') {
            if (typeof step.name !== 'string') throw new PlanError(`plan.steps[${i}].name must be a string`);
            if (step.arguments != null && !isObject(step.arguments)) {
                throw new PlanError(`plan.steps[${i}].arguments must be an object`);
            }
            if (step.meta != null && !isObject(step.meta)) throw new PlanError(`plan.steps[${i}].meta must be an object`);
            if (step.progress !== undefined && typeof step.progress !== 'boolean') {
                throw new PlanError(`plan.steps[${i}].progress must be a boolean`);
            }
            if (step.cancelAfterMs !== undefined && !(typeof step.cancelAfterMs === 'number' && step.cancelAfterMs >= 0)) {
                throw new PlanError(`plan.steps[${i}].cancelAfterMs must be a non-negative number`);
            }
        } else if (step.op === 'awaitToolListChanged') {
            if (typeof step.timeoutMs !== 'number' || !(step.timeoutMs >= 0)) {
                throw new PlanError(`plan.steps[${i}].timeoutMs must be a non-negative number`);
            }
        } else if (step.op === 'sleepMs') {
            if (typeof step.ms !== 'number' || !(step.ms >= 0)) {
                throw new PlanError(`plan.steps[${i}].ms must be a non-negative number`);
            }
        }
    });
    return plan;
}

/** The report's error object for an error thrown by the SDK. */
function describe(e) {
    if (e instanceof McpError) {
        // McpError prefixes its message with "MCP error <code>: "; report the JSON-RPC message.
        const prefix = `MCP error ${e.code}: `;
        const message = e.message.startsWith(prefix) ? e.message.slice(prefix.length) : e.message;
        const error = { code: e.code, message, kind: e.constructor.name };
        if (e.data !== undefined) error.data = e.data;
        return error;
    }
    if (e instanceof Error) {
        // StreamableHTTPError carries the HTTP status as `code`: it is not a JSON-RPC code.
        return { code: null, message: e.message, kind: e.constructor.name };
    }
    return { code: null, message: String(e), kind: typeof e };
}

class Driver {
    constructor(plan) {
        this.plan = plan;
        this.client = null;
        this.transport = null;
        this.connectError = null;
        this.negotiated = null;
        // notifications/tools/list_changed received on this connection, and who waits for one.
        this.listChanged = 0;
        this.listChangedWaiters = [];
        // The messages of the elicitation requests the server sent, in order.
        this.elicited = [];
    }

    makeTransport() {
        const t = this.plan.transport;
        if (t.kind === 'stdio') {
            // The SDK merges `env` over its default inherited environment; the child's stderr
            // is inherited, so server logs land on this process's stderr.
            return new StdioClientTransport({ command: t.command, args: t.args ?? [], env: t.env, cwd: t.cwd, stderr: 'inherit' });
        }
        // Headers (a bearer token) go on every request the SDK's transport sends.
        const requestInit = t.headers ? { headers: t.headers } : undefined;
        return new StreamableHTTPClientTransport(new URL(t.url), { requestInit });
    }

    async connect() {
        const transport = this.makeTransport();
        // The SDK calls setProtocolVersion with the version the server's initialize result
        // names (the HTTP transport uses it for the mcp-protocol-version header). Record it.
        let seen = null;
        const own = transport.setProtocolVersion?.bind(transport);
        transport.setProtocolVersion = version => {
            seen = version;
            own?.(version);
        };
        // With plan.elicitation the client declares the capability and answers so.
        const elicitation = this.plan.elicitation;
        const client = new Client(
            { name: this.plan.clientName ?? 'interop-typescript', version: SDK_VERSION },
            { capabilities: elicitation ? { elicitation: { form: {} } } : {} }
        );
        if (elicitation) {
            client.setRequestHandler(ElicitRequestSchema, request => {
                this.elicited.push(request.params.message);
                return elicitation === 'accept' ? { action: 'accept', content: {} } : { action: elicitation };
            });
        }
        client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
            this.listChanged += 1;
            for (const wake of this.listChangedWaiters.splice(0)) wake();
        });
        this.listChanged = 0;
        try {
            await client.connect(transport);
        } catch (e) {
            await client.close().catch(() => {});
            this.connectError = describe(e);
            console.error(`client.mjs: connect failed: ${JSON.stringify(this.connectError)}`);
            return { error: this.connectError };
        }
        // The SDK validates structuredContent only for tools whose outputSchema it has seen in
        // a tools/list result of this connection: list once after connecting. A failure here
        // only costs that validation; the steps report their own errors.
        try {
            await client.listTools();
        } catch (e) {
            console.error(`client.mjs: tools/list after connecting failed: ${JSON.stringify(describe(e))}`);
        }
        this.client = client;
        this.transport = transport;
        this.connectError = null;
        this.negotiated = seen;
        return { ok: { negotiatedProtocolVersion: seen } };
    }

    async disconnect() {
        const { client, transport } = this;
        this.client = null;
        this.transport = null;
        if (!client) return;
        try {
            // Ends the HTTP session as the Python SDK does on close (DELETE with the session id).
            if (transport instanceof StreamableHTTPClientTransport && transport.sessionId) {
                await transport.terminateSession();
            }
        } catch (e) {
            console.error(`client.mjs: session termination failed: ${JSON.stringify(describe(e))}`);
        }
        try {
            await client.close();
        } catch (e) {
            console.error(`client.mjs: close failed: ${JSON.stringify(describe(e))}`);
        }
    }

    async step(step) {
        switch (step.op) {
            case 'sleepMs':
                await sleep(step.ms);
                return { ok: {} };
            case 'reconnect':
                await this.disconnect();
                return await this.connect();
        }
        if (!this.client) return { error: this.connectError };
        if (step.op === 'listenToolListChanged') {
            // Under 2025-11-25 the session itself carries the notifications.
            return { ok: {} };
        }
        if (step.op === 'awaitToolListChanged') return await this.awaitToolListChanged(step.timeoutMs);
        const progress = [];
        try {
            if (step.op === 'listTools') return { ok: await this.client.listTools() };
            const params = { name: step.name };
            if (step.arguments != null) params.arguments = step.arguments;
            if (step.meta != null) params._meta = step.meta;
            const options = {};
            if (step.progress) {
                // The SDK puts a progressToken in _meta and calls back on each notification.
                options.onprogress = p => progress.push(p);
            }
            if (step.cancelAfterMs !== undefined) {
                // Aborting sends notifications/cancelled for the request.
                const abort = new AbortController();
                setTimeout(() => abort.abort('the plan cancels the call'), step.cancelAfterMs);
                options.signal = abort.signal;
            }
            const result = await this.client.callTool(params, undefined, options);
            return step.progress ? { ok: result, progress } : { ok: result };
        } catch (e) {
            return step.progress ? { error: describe(e), progress } : { error: describe(e) };
        }
    }

    /** Waits until a notifications/tools/list_changed has arrived on this connection. */
    async awaitToolListChanged(timeoutMs) {
        if (this.listChanged === 0) {
            let wake;
            const changed = new Promise(resolve => {
                wake = resolve;
                this.listChangedWaiters.push(resolve);
            });
            const timedOut = await Promise.race([changed.then(() => false), sleep(timeoutMs).then(() => true)]);
            this.listChangedWaiters = this.listChangedWaiters.filter(w => w !== wake);
            if (timedOut) {
                return { error: { code: null, message: `no tools/list_changed within ${timeoutMs} ms`, kind: 'Timeout' } };
            }
        }
        return { ok: { count: this.listChanged } };
    }

    async run() {
        const steps = [];
        await this.connect();
        try {
            for (const step of this.plan.steps) steps.push(await this.step(step));
        } finally {
            await this.disconnect();
        }
        return { sdk: SDK, sdkVersion: SDK_VERSION, negotiatedProtocolVersion: this.negotiated, steps, elicited: this.elicited };
    }
}

async function main() {
    let plan;
    try {
        plan = readPlan(readFileSync(0, 'utf8'));
    } catch (e) {
        if (!(e instanceof PlanError)) throw e;
        console.error(`client.mjs: ${e.message}`);
        return 2;
    }
    let report;
    if (plan.protocolVersion === STATELESS_VERSION) {
        report = {
            unsupported:
                `the TypeScript SDK ${SDK_VERSION} has no stateless ${STATELESS_VERSION} mode: ` +
                `it always connects with the initialize handshake, offering ${LATEST_PROTOCOL_VERSION}`
        };
    } else if (plan.protocolVersion !== HANDSHAKE_VERSION) {
        report = {
            unsupported: `the TypeScript SDK ${SDK_VERSION} offers only ${LATEST_PROTOCOL_VERSION} in initialize; it cannot select ${plan.protocolVersion}`
        };
    } else {
        report = await new Driver(plan).run();
    }
    process.stdout.write(JSON.stringify(report) + '\n');
    return 0;
}

process.exitCode = await main();
