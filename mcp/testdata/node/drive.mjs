// drive.mjs URL TOKEN PROJECT: a real MCP client (the TypeScript SDK's)
// drives tine mcp over streamable HTTP through fork -> test -> promote and
// prints what it saw as one JSON object.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, project] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "tine-node-test", version: "1.0.0" });
await client.connect(transport);

async function call(name, args, opts) {
  const res = await client.callTool({ name, arguments: args }, undefined, opts);
  if (res.isError) {
    throw new Error(`${name}: ${JSON.stringify(res.content)}`);
  }
  return res.structuredContent;
}

const tools = (await client.listTools()).tools.map((t) => t.name);
const base = (await call("create", { from: project })).sandbox.name;
const progress = [];
await call("exec", { sandbox: base, command: "echo setup-done" }, {
  onprogress: (p) => progress.push(p.message ?? ""),
});
const forks = (await call("fork", { sandbox: base, n: 2 })).sandboxes.map((s) => s.name);
const results = {};
for (const [i, f] of forks.entries()) {
  const value = i === 1 ? "pass" : "fail";
  const r = await call("exec", { sandbox: f, command: `echo ${value} > result.txt && grep -qx pass result.txt` });
  results[f] = r.exit_code;
}
const winner = forks.find((f) => results[f] === 0);
const plan = await call("promote", { sandbox: winner, dry_run: true });
const done = await call("promote", { sandbox: winner });
const listed = (await call("list", {})).sandboxes.map((s) => s.name);
await client.close();
console.log(JSON.stringify({ tools, base, forks, results, winner, plan, applied: done.applied, progress, listed }));
