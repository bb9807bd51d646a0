// A minimal MCP Apps host for the end-to-end tests: the ext-apps SDK's own
// AppBridge renders a view's HTML in a sandboxed frame, hands it a tool's
// input and result, and forwards the view's tools/call to the test
// (window.callTool, which calls the real server over MCP with the host's
// session). Bundled by esbuild at test time.
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

window.hostLog = [];

window.runHost = async (html, toolArgs, toolResult) => {
  const iframe = document.createElement("iframe");
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.style.width = "900px";
  iframe.style.height = "700px";
  document.body.replaceChildren(iframe);
  const bridge = new AppBridge(
    null,
    { name: "mcp-sandbox-test-host", version: "1.0.0" },
    { openLinks: {}, serverTools: {} },
    { hostContext: { theme: "light", displayMode: "inline" } },
  );
  bridge.oncalltool = async (params) => {
    window.hostLog.push(["tools/call", params.name, params.arguments]);
    return await window.callTool(params.name, params.arguments || {});
  };
  bridge.onopenlink = async (params) => {
    window.hostLog.push(["open-link", params.url]);
    return {};
  };
  bridge.onsizechange = (size) => window.hostLog.push(["size", size]);
  const initialized = new Promise((resolve) => (bridge.oninitialized = resolve));
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
  iframe.srcdoc = html;
  await initialized;
  window.hostLog.push(["initialized", bridge.getAppVersion()]);
  await bridge.sendToolInput({ arguments: toolArgs });
  await bridge.sendToolResult(toolResult);
};
