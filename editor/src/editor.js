// The quota table editor page (spawner/webapp/templates/table.html): CodeMirror 6 with the
// table's JSON Schema completion, the server's FILE:LINE problems as diagnostics (against
// the hub's GPUs and host too: a role that can never start there is one), the preview, the
// save with its conflict answer, and the audit trail. Everything a user or an admin named
// is put on the page with textContent, never as markup, and in a <bdi> of its own
// (``named``), so its bidi controls cannot reorder the words around it.
import { EditorView, basicSetup } from "codemirror";
import { hoverTooltip } from "@codemirror/view";
import { yaml, yamlLanguage } from "@codemirror/lang-yaml";
import { setDiagnostics, lintGutter } from "@codemirror/lint";
import { yamlCompletion, yamlSchemaHover } from "codemirror-json-schema/yaml";
import { stateExtensions } from "codemirror-json-schema";

const DEBOUNCE_MS = 400;
const page = document.getElementById("table-editor");
const api = page.dataset.api; // {prefix}api/table
const xsrf = page.dataset.xsrf;
let version = page.dataset.version;
const schema = JSON.parse(page.dataset.schema);
const $ = (id) => document.getElementById(id);

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// ``node`` holding parts: text, or {name} for what someone named or typed, in a <bdi>
function named(node, ...parts) {
  for (const part of parts) {
    node.appendChild(typeof part === "string" ? document.createTextNode(part)
      : el("bdi", part.name));
  }
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

async function call(method, path, body) {
  // JupyterHub's HubOAuth checks the XSRF token on every request that is not a page
  // navigation, GETs from fetch() included
  const init = { method, credentials: "same-origin",
                 headers: { Accept: "application/json", "X-XSRFToken": xsrf } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(api + path, init);
  } catch {
    return { status: 0, data: { message: "The service did not answer; try again in a moment." } };
  }
  let data = {};
  try { data = await response.json(); } catch { data = { message: `The service answered ${response.status}.` }; }
  return { status: response.status, data };
}

// --- the editor -----------------------------------------------------------------------------

const source = $("table-text");
const view = new EditorView({
  doc: source.value,
  parent: $("editor"),
  extensions: [
    basicSetup,
    yaml(),
    yamlLanguage.data.of({ autocomplete: yamlCompletion() }),
    hoverTooltip(yamlSchemaHover()),
    stateExtensions(schema),
    lintGutter(),
    EditorView.contentAttributes.of({ "aria-labelledby": "editor-label", "aria-describedby": "editor-help" }),
    EditorView.updateListener.of((update) => { if (update.docChanged) scheduleCheck(); }),
  ],
});
source.hidden = true;
$("editor").hidden = false;

const text = () => view.state.doc.toString();

function setText(value) {
  view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: value } });
}

function goToLine(number) {
  const line = view.state.doc.line(Math.min(Math.max(number, 1), view.state.doc.lines));
  view.dispatch({ selection: { anchor: line.from }, scrollIntoView: true });
  view.focus();
}

// --- the check, as the admin types ----------------------------------------------------------

let timer = null;
let asked = 0;

function scheduleCheck() {
  clearTimeout(timer);
  $("check-status").textContent = "Checking…";
  timer = setTimeout(runCheck, DEBOUNCE_MS);
}

function showProblems(problems) {
  const doc = view.state.doc;
  view.dispatch(setDiagnostics(view.state, problems.map((p) => {
    const line = doc.line(Math.min(Math.max(p.line || 1, 1), doc.lines));
    return { from: line.from, to: line.to, severity: "error", message: p.message };
  })));
  const list = $("problems");
  clear(list);
  for (const p of problems) {
    const item = el("li");
    const where = p.line ? `Line ${p.line}` : "The table";
    const button = el("button", `${where}: ${p.message}`, { type: "button", class: "link" });
    button.addEventListener("click", () => goToLine(p.line || 1));
    item.appendChild(button);
    list.appendChild(item);
  }
  $("check-status").textContent = problems.length === 0
    ? "The table has no problems."
    : problems.length === 1
      ? "The table has one problem; it cannot be saved until it is fixed."
      : `The table has ${problems.length} problems; it cannot be saved until they are fixed.`;
}

async function runCheck() {
  const mine = ++asked;
  const { status, data } = await call("POST", "/check", { text: text() });
  if (mine !== asked) return; // a later check is on its way
  if (status === 200) {
    showProblems(data.problems || []);
    if (data.against) $("checked-against").textContent = data.against;
  } else $("check-status").textContent = data.message || "The check failed.";
}

// Once a good table is saved or restored, it is the newest version and the hub runs it:
// the line saying that the hub runs an older one is no longer true.
function savedGood() {
  const runs = $("table-runs");
  if (runs) runs.hidden = true;
}

// --- preview --------------------------------------------------------------------------------

// A preview compares an edit with the table it was made on: once saved or restored, that
// table is gone, and the preview would tell of changes already made.
function clearPreview() {
  clear($("preview-result"));
}

$("preview").addEventListener("click", async () => {
  const out = $("preview-result");
  clear(out);
  out.appendChild(el("p", "Working out what changes…"));
  const { status, data } = await call("POST", "/preview", { text: text() });
  clear(out);
  if (status === 200) {
    const list = el("ul");
    for (const s of data.sentences || []) list.appendChild(el("li", s));
    if (!list.firstChild) list.appendChild(el("li", "Nothing changes for anyone."));
    out.appendChild(list);
  } else {
    out.appendChild(el("p", data.message || "The preview failed."));
    if (data.problems) showProblems(data.problems);
  }
});

// --- save -----------------------------------------------------------------------------------

function diffBlock(title, diff) {
  const box = el("div");
  box.appendChild(el("h3", title));
  box.appendChild(el("pre", diff || "(no lines changed)", { class: "diff", tabindex: "0" }));
  return box;
}

$("save-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const comment = $("comment").value.trim();
  const out = $("save-result");
  const conflict = $("conflict");
  clear(out);
  conflict.hidden = true;
  if (!comment) {
    out.appendChild(el("p", "Say why you make this change: the comment is required."));
    $("comment").focus();
    return;
  }
  const { status, data } = await call("POST", "", { text: text(), version, comment });
  out.appendChild(el("p", data.message || `The service answered ${status}.`));
  if (status === 200) {
    version = data.version;
    $("comment").value = "";
    clearPreview();
    savedGood();
    if (data.diff) out.appendChild(diffBlock("What changed", data.diff));
    loadVersions();
  } else if (status === 409) {
    const diff = $("conflict-diff");
    clear(diff);
    diff.appendChild(diffBlock("What changed since you started", data.diff));
    diff.appendChild(diffBlock("What your edit would change in the current table", data.yours));
    conflict.hidden = false;
    const load = $("load-current");
    load.onclick = () => {
      setText(data.current_text ?? "");
      version = data.version;
      conflict.hidden = true;
      clear(out);
      out.appendChild(el("p", "The current table is loaded; your edit was set aside. Make it again and save."));
      view.focus();
    };
    $("keep-mine").onclick = () => {
      version = data.version;
      conflict.hidden = true;
      clear(out);
      out.appendChild(el("p", "Your edit is kept, and saving now replaces the other change. Check the diff above first."));
      $("comment").focus();
    };
    load.focus();
  } else if (data.problems) {
    showProblems(data.problems);
  }
});

// --- history --------------------------------------------------------------------------------

function when(seconds) {
  const d = new Date(seconds * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

async function loadVersions() {
  const body = $("versions-body");
  const { status, data } = await call("GET", "/versions");
  clear(body);
  if (status !== 200) {
    const row = el("tr");
    row.appendChild(el("td", data.message || "The history could not be read.", { colspan: "4" }));
    body.appendChild(row);
    return;
  }
  const versions = data.versions || [];
  if (versions.length === 0) {
    const row = el("tr");
    row.appendChild(el("td", "No change has been saved from this page yet.", { colspan: "4" }));
    body.appendChild(row);
  }
  for (const v of versions) {
    const row = el("tr");
    row.appendChild(el("td", when(v.at)));
    row.appendChild(named(el("td", null, { class: "text" }), { name: v.who }));
    row.appendChild(named(el("td", null, { class: "text" }), { name: v.comment },
      v.restored_from ? ` (restores version ${v.restored_from})` : ""));
    const cell = el("td");
    const button = el("button", `View version ${v.id}`, { type: "button" });
    button.addEventListener("click", () => showVersion(v.id));
    cell.appendChild(button);
    row.appendChild(cell);
    body.appendChild(row);
  }
}

let shown = null;

async function showVersion(id) {
  const box = $("version-view");
  const content = $("version-content");
  clear(content);
  $("restore-result").textContent = "";
  const { status, data } = await call("GET", `/versions/${id}`);
  box.hidden = false;
  if (status !== 200) {
    content.appendChild(el("p", data.message || "This version could not be read."));
    $("restore-form").hidden = true;
    return;
  }
  shown = data.id;
  const title = $("version-title");
  title.textContent = "";
  named(title, `Version ${data.id}, saved by `, { name: data.who }, ` on ${when(data.at)}`);
  content.appendChild(named(el("p"), "Why: ", { name: data.comment }));
  content.appendChild(diffBlock("Its change from the version before", data.diff));
  content.appendChild(diffBlock("The table as it was then", data.text));
  $("restore-form").hidden = false;
  $("version-title").focus();
}

$("restore-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const comment = $("restore-comment").value.trim();
  const out = $("restore-result");
  if (!comment) {
    out.textContent = "Say why you restore this version: the comment is required.";
    $("restore-comment").focus();
    return;
  }
  const { status, data } = await call("POST", `/versions/${shown}/restore`, { comment, version });
  out.textContent = data.message || `The service answered ${status}.`;
  if (status === 200) {
    version = data.version;
    $("restore-comment").value = "";
    clearPreview();
    savedGood();
    const current = await call("GET", "");
    if (current.status === 200) { setText(current.data.text); version = current.data.version; }
    loadVersions();
  } else if (status === 409) {
    out.textContent += " Load the current table (reload the page) and restore again.";
  }
});

$("close-version").addEventListener("click", () => { $("version-view").hidden = true; });

showProblems(JSON.parse(page.dataset.problems || "[]"));
loadVersions();
