// A Tasks client nobody at approvald wrote: the TypeScript SDK v2 (@modelcontextprotocol/client)
// with @modelcontextprotocol/ext-tasks, against approvald's MCP gateway.
// Run by tests/integration/test_mcp_tasks_client.py:
//   node tasks-client.mjs URL BEARER
// Each step prints one JSON line on stdout; the test reads them, approves the call in between
// (it waits for the line {"step":"created"}), and checks what each says. Exit code 0 when every
// step ran; the test judges the results.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import {
  createTaskSessionFromClient,
  resultFromTaskOutcome,
} from "@modelcontextprotocol/ext-tasks/client";

const [url, bearer] = process.argv.slice(2);
const VERSION = "2026-07-28";
const EXTENSION = "io.modelcontextprotocol/tasks";
const clientInfo = { name: "ext-tasks-check", version: "1.0.0" };
let nextId = 1;

function say(step, fields = {}) {
  process.stdout.write(JSON.stringify({ step, ...fields }) + "\n");
}

// One JSON-RPC request POSTed to the gateway (a stateless 2026-07-28 server), its response
// read from a JSON body or an SSE stream. ext-tasks frames what it sends (its `_meta`);
// `frame` is for the requests this script frames itself.
async function post(request, headers = {}) {
  const body = { jsonrpc: "2.0", id: request.id ?? `ts-${nextId++}`, ...request };
  const name = body.params?.name ?? body.params?.taskId;
  const response = await fetch(url, {
    method: "POST",
    headers: {
      Authorization: `Bearer ${bearer}`,
      "Content-Type": "application/json",
      Accept: "application/json, text/event-stream",
      "MCP-Protocol-Version": VERSION,
      "Mcp-Method": body.method,
      ...(typeof name === "string" ? { "Mcp-Name": name } : {}),
      ...headers,
    },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  let messages;
  if ((response.headers.get("content-type") ?? "").includes("text/event-stream")) {
    messages = text
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).trim())
      .filter((line) => line.length > 0)
      .map((line) => JSON.parse(line));
  } else {
    messages = [JSON.parse(text)];
  }
  const reply = messages.find((m) => m.id === body.id && ("result" in m || "error" in m));
  if (reply === undefined) throw new Error(`no reply to ${body.method}: HTTP ${response.status} ${text.slice(0, 300)}`);
  return reply;
}

async function rawDispatch(request, options = {}) {
  const reply = await post(request, options.context?.headers ?? {});
  return "error" in reply ? { kind: "error", error: reply.error } : { kind: "result", result: reply.result };
}

function framed(method, params, capabilities) {
  return {
    method,
    params: {
      ...params,
      _meta: {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": clientInfo,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
      },
    },
  };
}

const client = new Client(clientInfo, {
  capabilities: { extensions: { [EXTENSION]: {} } },
  versionNegotiation: { mode: { pin: VERSION } },
});
await client.connect(new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
}));
say("connected", { era: client.getProtocolEra() });
const session = createTaskSessionFromClient(client, {
  endpointId: "approvald-gateway",
  rawDispatch,
  v2RequestFraming: { protocolVersion: VERSION, clientInfo, clientCapabilities: {} },
});
say("session", { capabilities: session.capabilities });

try {
  // create: the gated call is a task at once
  const execution = await session.callTool("transfer_money", { to: "ACME", cents: 10 });
  say("created", { kind: execution.kind, taskId: execution.handle?.taskId });
  // poll: working until the test approves; complete: the server's result
  const seen = [];
  const { outcome } = await execution.settle({
    onEvent: (event) => {
      if (event.type === "task") seen.push(event.task.status);
    },
  });
  const result = resultFromTaskOutcome(outcome);
  say("completed", { status: outcome.status, seen, result });

  // cancel: a task still waiting for its decision
  const other = await session.callTool("transfer_money", { to: "ACME", cents: 11 });
  await other.cancel();
  const cancelled = await session.task(other.handle.taskId).snapshot();
  say("cancelled", { taskId: other.handle.taskId, status: cancelled.status });

  // a client that did not declare the extension: -32021 on tasks/get and tasks/cancel
  const third = await session.callTool("transfer_money", { to: "ACME", cents: 12 });
  const taskId = third.handle.taskId;
  const refusals = [];
  for (const method of ["tasks/get", "tasks/cancel"]) {
    const reply = await post(framed(method, { taskId }, {}));
    refusals.push({ method, code: reply.error?.code ?? null, message: reply.error?.message ?? null });
  }
  const after = await session.task(taskId).snapshot();
  say("refused", { refusals, statusAfter: after.status });
  await third.detach();
} finally {
  await session.close();
  await client.close();
}
say("done");
