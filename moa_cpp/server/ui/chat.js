// The chat page of `moa-cpp serve` (GET /): a chat over /v1/chat/completions that shows which
// tokens a drafter guessed and the target accepted. Plain browser JavaScript, no build step,
// nothing fetched from elsewhere. Model text is only ever set through textContent, never parsed
// as HTML (a model that writes <script> shows it as text).
//
// Stream extension read here (moa_cpp/server/app.py; OpenAI clients ignore unknown fields):
//   chunk.moa_pieces = [[text, from, index], ...]  the chunk's content split by token: `from` is
//       "target" (the verification's own token) or the proposer whose accepted draft it was
//       ("moa", "ngram", "draft", "moa+ngram"); `index` the token's position in the answer;
//   the last chunk's `moa` = the answer's statistics (tau, tokens_per_s, target_calls, decision,
//       emitted_from: tokens shown by who chose them).
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "moa-cpp-api-key";          // sessionStorage: gone with the tab
  const SETTINGS_STORE = "moa-cpp-settings";    // localStorage: no secrets in it
  const history = [];                            // [{role, content}] of this conversation
  let controller = null;                         // AbortController of the answer streaming now
  let keyWaiter = null;

  // ------------------------------------------------------------------ settings

  const fields = { temperature: "temperature", max_tokens: "max-tokens", system: "system-prompt",
                   draft: "draft", draft_custom: "draft-custom" };

  function loadSettings() {
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem(SETTINGS_STORE) || "{}"); } catch (e) { saved = {}; }
    for (const [k, id] of Object.entries(fields)) if (k in saved) $(id).value = saved[k];
  }

  function saveSettings() {
    const s = {};
    for (const [k, id] of Object.entries(fields)) s[k] = $(id).value;
    localStorage.setItem(SETTINGS_STORE, JSON.stringify(s));
  }

  function requestBody() {
    const messages = [];
    const system = $("system-prompt").value.trim();
    if (system) messages.push({ role: "system", content: system });
    const body = { messages: messages.concat(history), stream: true,
                   temperature: Number($("temperature").value) || 0 };
    const maxTokens = parseInt($("max-tokens").value, 10);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    const draft = $("draft-custom").value.trim() || $("draft").value;
    if (draft) body.moa = { draft: draft };
    return body;
  }

  // ------------------------------------------------------------------ API key

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  function askKey() {
    if (!keyWaiter) {
      keyWaiter = new Promise((resolve) => {
        const dialog = $("key-dialog");
        $("key-form").addEventListener("submit", () => {
          sessionStorage.setItem(KEY_STORE, $("api-key").value);
          $("api-key").value = "";
          keyWaiter = null;
          resolve();
        }, { once: true });
        dialog.showModal();
      });
    }
    return keyWaiter;
  }

  async function api(path, init) {
    for (;;) {
      const resp = await fetch(path, Object.assign({}, init, { headers: headers() }));
      if (resp.status !== 401) return resp;
      sessionStorage.removeItem(KEY_STORE);
      await askKey();
    }
  }

  async function loadInfo() {
    try {
      const resp = await api("/props", { method: "GET" });
      const p = await resp.json();
      $("server-info").textContent = p.model + " · draft " + p.draft;
      $("proposer").textContent = p.proposer || "none (plain decoding)";
    } catch (e) {
      $("server-info").textContent = "server unreachable: " + e;
    }
  }

  // ------------------------------------------------------------------ messages

  function addMessage(role, text) {
    const box = document.createElement("div");
    box.className = "msg " + role;
    const label = document.createElement("div");
    label.className = "role";
    label.textContent = role;
    const content = document.createElement("div");
    content.className = "content";
    if (text) content.textContent = text;
    box.append(label, content);
    $("chat").append(box);
    box.scrollIntoView({ block: "end" });
    return box;
  }

  function appendPieces(box, content, pieces) {
    const out = box.querySelector(".content");
    if (!pieces) {                       // a server without the extension: plain text
      out.append(document.createTextNode(content));
      return;
    }
    for (const [text, from, index] of pieces) {
      const span = document.createElement("span");
      const drafted = from !== "target";
      span.className = "tok " + (drafted ? "from-draft" : "from-target");
      span.dataset.from = from;
      span.dataset.tok = String(index);
      span.title = drafted ? "drafted by " + from + ", accepted by the target" : "the target's own token";
      span.textContent = text;
      out.append(span);
    }
  }

  function notice(box, text) {
    const p = document.createElement("div");
    p.className = "notice";
    p.textContent = text;
    box.append(p);
  }

  function statsLine(box, moa) {
    const p = document.createElement("div");
    p.className = "stats";
    const from = moa.emitted_from || {};
    const drafted = Object.entries(from).filter(([k]) => k !== "target").reduce((a, [, v]) => a + v, 0);
    box.dataset.drafted = String(drafted);
    box.dataset.tau = String(moa.tau);
    p.textContent = "tau " + Number(moa.tau).toFixed(2) + " · " + Number(moa.tokens_per_s).toFixed(1) +
      " tok/s · " + moa.target_calls + " target calls · " + drafted + " drafted tokens accepted · " +
      "draft " + moa.draft + (moa.decision ? " · " + moa.decision : "");
    box.append(p);
  }

  // ------------------------------------------------------------------ one answer

  async function readEvents(resp, onData) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith("data: ")) onData(line.slice(6));
        }
      }
    }
  }

  async function send(prompt) {
    history.push({ role: "user", content: prompt });
    addMessage("user", prompt);
    const box = addMessage("assistant", "");
    box.dataset.state = "streaming";
    controller = new AbortController();
    setBusy(true);
    let text = "", finish = null, ended = false;
    try {
      const resp = await api("/v1/chat/completions",
                             { method: "POST", body: JSON.stringify(requestBody()), signal: controller.signal });
      if (!resp.ok) {
        let msg = resp.status + " " + resp.statusText;
        try { msg = (await resp.json()).error.message; } catch (e) { /* not JSON */ }
        notice(box, "The server refused the request: " + msg);
        history.pop();
        return;
      }
      await readEvents(resp, (data) => {
        if (data === "[DONE]") { ended = true; return; }
        const chunk = JSON.parse(data);
        if (chunk.error) { notice(box, "Error: " + chunk.error.message); finish = "error"; return; }
        const choice = (chunk.choices || [])[0];
        if (choice) {
          const piece = choice.delta && choice.delta.content;
          if (piece) { text += piece; appendPieces(box, piece, chunk.moa_pieces); }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        if (chunk.moa) statsLine(box, chunk.moa);
        box.scrollIntoView({ block: "end" });
      });
      if (finish === "abort") notice(box, "The server stopped this answer (finish_reason: abort).");
      else if (finish && !["stop", "length", "tool_calls", "error"].includes(finish))
        notice(box, "The answer ended with finish_reason: " + finish + ".");
      else if (finish === "length") box.dataset.note = "length";
      else if (!finish && !ended) notice(box, "The connection closed before the answer finished.");
    } catch (e) {
      if (e.name === "AbortError") { notice(box, "Stopped by you."); finish = "stopped"; }
      else notice(box, "Error: " + e.message);
    } finally {
      history.push({ role: "assistant", content: text });
      box.dataset.state = "done";
      box.dataset.finish = finish || "";
      controller = null;
      setBusy(false);
    }
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  // ------------------------------------------------------------------ wiring

  document.addEventListener("DOMContentLoaded", () => {
    loadSettings();
    for (const id of Object.values(fields)) $(id).addEventListener("change", saveSettings);
    $("toggle-settings").addEventListener("click", () => {
      const s = $("settings");
      s.hidden = !s.hidden;
      $("toggle-settings").setAttribute("aria-expanded", String(!s.hidden));
    });
    $("composer").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const prompt = $("prompt").value.trim();
      if (!prompt || controller) return;
      $("prompt").value = "";
      send(prompt);
    });
    $("prompt").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
    });
    $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
    $("new-chat").addEventListener("click", () => {
      if (controller) controller.abort();
      history.length = 0;
      $("chat").replaceChildren();
    });
    loadInfo();
  });
})();
