// A minimal MCP server (stdio, newline-delimited JSON-RPC 2.0) for the Claude Code tier: one
// tool, `record`, whose free-form `payload` takes any JSON however deep, and whose side effect
// is the file named by its `marker` argument. Written for node, whose JSON.parse takes a
// value nested thousands of levels deep: a test sends such an input through Claude Code's
// hook, and a server that could not parse it would hide whether the call was let through.
import { writeFileSync } from "node:fs";
import { createInterface } from "node:readline";

const TOOL = {
  name: "record",
  description: "Record a payload; creates the file named by marker.",
  inputSchema: {
    type: "object",
    properties: { marker: { type: "string" }, payload: {} },
    required: ["marker"],
  },
};

function reply(id, result) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id, result }) + "\n");
}

function fail(id, code, message) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", id, error: { code, message } }) + "\n");
}

createInterface({ input: process.stdin, crlfDelay: Infinity }).on("line", (line) => {
  if (!line.trim()) return;
  const msg = JSON.parse(line);
  if (msg.id === undefined) return; // a notification (notifications/initialized, ...)
  switch (msg.method) {
    case "initialize":
      reply(msg.id, {
        protocolVersion: msg.params?.protocolVersion ?? "2025-06-18",
        capabilities: { tools: {} },
        serverInfo: { name: "marker", version: "1.0.0" },
      });
      break;
    case "ping":
      reply(msg.id, {});
      break;
    case "tools/list":
      reply(msg.id, { tools: [TOOL] });
      break;
    case "tools/call": {
      const args = msg.params?.arguments ?? {};
      writeFileSync(args.marker, String(line.length));
      reply(msg.id, { content: [{ type: "text", text: "recorded" }] });
      break;
    }
    default:
      fail(msg.id, -32601, `method not found: ${msg.method}`);
  }
});
