// The class dashboard (spawner/webapp/classes.py, templates/class.html), after format.js:
// refreshes the page from the service's API every few seconds and sends the actions to
// it. Plain script, no framework and nothing from the network. Names are chosen by
// people, so they are only ever written as text (textContent) or attributes, never as HTML,
// and each is isolated in its line (a <bdi>, or QuotaFormat.isolate in plain text), so its
// bidi controls cannot reorder the words around it.
"use strict";

(function () {
  const root = document.getElementById("class-dashboard");
  if (!root) return;
  const api = root.dataset.api;
  const xsrf = root.dataset.xsrf;
  const group = root.dataset.group;
  const refreshMs = Number(root.dataset.refresh) || 5000;
  const byId = (id) => document.getElementById(id);
  const CONFIRM_MS = 8000; // how long a first press of a stop button waits for the second
  const zone = (Intl.DateTimeFormat().resolvedOptions().timeZone) || "local time";

  // --- the service's API ---------------------------------------------------------------

  async function call(method, path, body) {
    // JupyterHub's HubOAuth checks the XSRF token on every request that is not a page
    // navigation, GETs from fetch() included
    const init = {
      method, credentials: "same-origin",
      headers: { Accept: "application/json", "X-XSRFToken": xsrf },
    };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(api + path, init);
    } catch (e) {
      return { status: 0, data: { message: "The service did not answer; try again." } };
    }
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      data = null;
    }
    if (data === null || typeof data !== "object") {
      // a login page instead of JSON: the login to the service has run out
      data = { message: response.ok || response.redirected
        ? "Your login to this page has expired; reload the page."
        : `The service answered with an error (HTTP ${response.status}).` };
      return { status: response.ok ? 401 : response.status, data };
    }
    return { status: response.status, data };
  }

  // --- how a row reads: as classes.py's *_text functions; sizes, times and "ago" are
  // format.js's, as formatting.py's are the page's ----------------------------------------

  const { size, ago, moment, iso, isolate } = QuotaFormat;

  function cpuText(m) {
    if (m.cpu === null || m.cpu === undefined) return "–";
    return m.cpu.toFixed(2) + (m.cpu_limit ? ` of ${m.cpu_limit} cores` : " cores");
  }

  function memoryText(m) {
    if (m.memory === null || m.memory === undefined) return "–";
    return size(m.memory) + (m.memory_limit ? ` of ${size(m.memory_limit)}` : "");
  }

  // as role_text: each name in a <bdi>
  function roleParts(m) {
    if (!m.role) return ["–"];
    return m.image ? [{ name: m.role }, " · ", { name: m.image }] : [{ name: m.role }];
  }

  function setText(element, text) {
    // only on change: a screen reader hears, and a selection keeps, what did not change
    if (element.textContent !== text) element.textContent = text;
  }

  function make(tag, className, text) {
    const element = document.createElement(tag);
    if (className) element.className = className;
    if (text !== undefined) element.textContent = text;
    return element;
  }

  // parts: text, or {name} for a name someone chose, which goes in a <bdi> of its own
  function named(element, parts) {
    const text = parts.map((p) => (typeof p === "string" ? p : p.name)).join("");
    if (element.textContent === text && element.childNodes.length === parts.length) {
      return element; // unchanged: a screen reader hears, and a selection keeps, the same
    }
    element.replaceChildren(...parts.map((p) => (typeof p === "string" ? p
      : make("bdi", "", String(p.name)))));
    return element;
  }

  // "a, b, c": names, each in a <bdi>
  const nameList = (names) => names.flatMap((n, i) => (i ? [", ", { name: n }] : [{ name: n }]));

  // --- the members' table: rows are kept and updated in place, so focus stays --------

  function makeRow(name) {
    const tr = make("tr");
    tr.dataset.user = name;
    const head = make("th", "text name", name);
    head.scope = "row";
    const state = make("td", "text state");
    state.append(make("span", "badge"));
    const actions = make("td", "text actions");
    const open = make("a", "open", "Open");
    open.target = "_blank";
    open.rel = "noopener";
    open.setAttribute("aria-label", `Open ${name}'s server`);
    const stop = make("button", "stop", "Stop");
    stop.type = "button";
    stop.setAttribute("aria-label", `Stop ${name}'s server`);
    actions.append(open, " ", stop);
    tr.append(head, state, make("td", "text role"), make("td", "activity"), make("td", "cpu"),
              make("td", "memory"), make("td", "gpu"), actions);
    return tr;
  }

  function fillRow(tr, m, now) {
    const cell = (name) => tr.querySelector(`td.${name}`);
    const state = cell("state").firstElementChild;
    state.className = `badge state-${m.state}`;
    setText(state, m.state);
    named(cell("role"), roleParts(m));
    const activity = cell("activity");
    setText(activity, ago(m.last_activity, now));
    activity.title = m.last_activity || "";
    setText(cell("cpu"), cpuText(m));
    setText(cell("memory"), memoryText(m));
    setText(cell("gpu"), size(m.gpu_memory));
    const open = tr.querySelector("a.open");
    if (m.url) {
      open.href = m.url;
      open.hidden = false;
    } else {
      open.removeAttribute("href");
      open.hidden = true;
    }
    const stop = tr.querySelector("button.stop");
    const stopped = m.state === "stopped";
    if (stopped && stop.classList.contains("armed")) disarm(stop);
    if (!stop.classList.contains("busy")) stop.disabled = stopped;
  }

  function renderMembers(members, now) {
    const body = byId("members-body");
    const rows = new Map();
    for (const tr of Array.from(body.rows)) rows.set(tr.dataset.user, tr);
    const seen = new Set();
    let previous = null;
    for (const m of members) {
      const tr = rows.get(m.name) || makeRow(m.name);
      const wanted = previous ? previous.nextElementSibling : body.firstElementChild;
      if (tr !== wanted) body.insertBefore(tr, wanted); // only new or reordered rows move
      fillRow(tr, m, now);
      previous = tr;
      seen.add(m.name);
    }
    for (const [name, tr] of rows) if (!seen.has(name)) tr.remove();
    byId("no-members").hidden = members.length > 0;
  }

  // --- the pre-warm picker ---------------------------------------------------------------

  let shownChoices = null;

  function renderChoices(data) {
    const key = JSON.stringify([data.choices, data.partial_choices]);
    if (key === shownChoices) return;
    shownChoices = key;
    const select = byId("prewarm-choice");
    const kept = select.value;
    const options = data.choices.map((c) => {
      const option = make("option", "", `${isolate(c.role)} with ${isolate(c.image)}`);
      option.value = JSON.stringify([c.role, c.image]);
      return option;
    });
    select.replaceChildren(...options);
    if (options.some((o) => o.value === kept)) select.value = kept;
    select.disabled = options.length === 0;
    byId("prewarm").disabled = options.length === 0;
    byId("no-choices").hidden = options.length > 0;
    const lacking = byId("lacking");
    lacking.replaceChildren(...(data.partial_choices || []).map((c) =>
      named(make("li"), [{ name: c.role }, " with ", { name: c.image }, ": not held by ",
                         ...nameList(c.lacking)])));
    byId("lacking-block").hidden = lacking.children.length === 0;
  }

  // --- the schedules: rebuilt when they change, focus put back on the same button -----

  let shownSchedules = null;

  function renderSchedules(schedules) {
    const key = JSON.stringify(schedules);
    if (key === shownSchedules) return;
    shownSchedules = key;
    const body = byId("schedules-body");
    const focused = document.activeElement;
    const focusedId = focused && body.contains(focused) ? focused.dataset.id : null;
    body.replaceChildren(...schedules.map((s) => {
      const tr = make("tr");
      tr.dataset.id = String(s.id);
      const time = make("time", "", moment(s.at));
      if (iso(s.at)) time.dateTime = iso(s.at);
      const when = make("td", "text");
      when.append(time);
      const actions = make("td", "text");
      if (s.state === "pending") {
        const cancel = make("button", "cancel secondary", "Cancel");
        cancel.type = "button";
        cancel.dataset.id = String(s.id);
        cancel.setAttribute("aria-label", `Cancel the pre-warm at ${moment(s.at)}`);
        actions.append(cancel);
      }
      tr.append(when, named(make("td", "text"), [{ name: s.role }, " · ", { name: s.image }]),
                make("td", "text", s.created_by), make("td", "text schedule-state", s.state),
                make("td", "text result", s.result), actions);
      return tr;
    }));
    byId("no-schedules").hidden = schedules.length > 0;
    if (focusedId !== null) {
      const again = Array.from(body.querySelectorAll("button.cancel"))
        .find((b) => b.dataset.id === focusedId);
      (again || byId("action-status")).focus();
    }
  }

  // --- refreshing --------------------------------------------------------------------------

  let refreshing = false;

  async function refresh() {
    if (refreshing) return;
    refreshing = true;
    try {
      const { status, data } = await call("GET", "");
      if (status === 200) {
        renderMembers(data.members, data.now);
        renderChoices(data);
        renderSchedules(data.schedules);
        setText(byId("refresh-status"), "");
      } else {
        setText(byId("refresh-status"), `It could not be refreshed: ${data.message}`);
      }
    } finally {
      refreshing = false;
    }
  }

  // --- what an action did ----------------------------------------------------------------

  const BAD = new Set(["refused", "failed", "busy"]);

  function report(sentence, results, bad) {
    const status = byId("action-status");
    status.textContent = sentence;
    status.classList.toggle("bad", Boolean(bad));
    byId("action-results").replaceChildren(...(results || []).map((r) => {
      const item = named(make("li", BAD.has(r.outcome) ? "bad" : ""), [{ name: r.user },
        `: ${r.outcome}` + (r.message ? ` (${r.message})` : "")]);
      item.dataset.user = r.user;
      item.dataset.outcome = r.outcome;
      return item;
    }));
  }

  function counted(results) {
    const counts = new Map();
    for (const r of results) counts.set(r.outcome, (counts.get(r.outcome) || 0) + 1);
    return Array.from(counts, ([outcome, n]) => `${n} ${outcome}`).join(", ") || "nothing to do";
  }

  function keepFocus() {
    // a button that an action disabled or hid drops the keyboard's place: keep it nearby
    const active = document.activeElement;
    if (!active || active === document.body || active.disabled || active.hidden) {
      byId("action-status").focus();
    }
  }

  // --- stopping: a second press of the same button confirms -------------------------------

  const timers = new Map();

  function arm(button, confirmText, confirmLabel, sentence) {
    button.dataset.text = button.textContent;
    button.dataset.label = button.getAttribute("aria-label") || "";
    button.textContent = confirmText;
    button.setAttribute("aria-label", confirmLabel);
    button.classList.add("armed");
    report(sentence, []);
    timers.set(button, setTimeout(() => disarm(button), CONFIRM_MS));
  }

  function disarm(button) {
    if (!button.classList.contains("armed")) return;
    clearTimeout(timers.get(button));
    timers.delete(button);
    button.textContent = button.dataset.text;
    if (button.dataset.label) button.setAttribute("aria-label", button.dataset.label);
    else button.removeAttribute("aria-label");
    button.classList.remove("armed");
  }

  async function stop(button, body, what) {
    button.classList.add("busy");
    button.disabled = true;
    report(`Stopping ${what}…`, []);
    try {
      const { status, data } = await call("POST", "/stop", body);
      if (status === 200) {
        report(`Stop ${what}: ${counted(data.results)}.`, data.results,
               data.results.some((r) => BAD.has(r.outcome)));
      } else {
        report(data.message, data.results, true);
      }
    } finally {
      button.classList.remove("busy");
      button.disabled = false;
      await refresh();
      keepFocus();
    }
  }

  byId("members-body").addEventListener("click", (event) => {
    const button = event.target.closest("button.stop");
    if (!button || button.disabled) return;
    const name = button.closest("tr").dataset.user;
    if (!button.classList.contains("armed")) {
      arm(button, "Press again to stop", `Press again to stop ${name}'s server`,
          `Press Stop again to stop ${isolate(name)}'s server, or Escape to keep it.`);
      return;
    }
    disarm(button);
    stop(button, { users: [name] }, `${isolate(name)}'s server`);
  });

  const stopAll = byId("stop-all");
  stopAll.addEventListener("click", () => {
    if (!stopAll.classList.contains("armed")) {
      arm(stopAll, `Press again to stop every server of ${group}`,
          `Press again to stop every server of ${group}`,
          `Press the button again to stop every server of ${isolate(group)}, or Escape to ` +
          "keep them.");
      return;
    }
    disarm(stopAll);
    stop(stopAll, { all: true }, `every server of ${isolate(group)}`);
  });

  // Escape, or leaving the button, keeps the servers
  root.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && event.target.classList &&
        event.target.classList.contains("armed")) {
      disarm(event.target);
      report("Nothing was stopped.", []);
    }
  });
  root.addEventListener("focusout", (event) => {
    if (event.target.classList && event.target.classList.contains("armed")) {
      disarm(event.target);
    }
  });

  // --- pre-warming -------------------------------------------------------------------------

  const at = byId("prewarm-at");
  at.addEventListener("input", () => { byId("when-at").checked = true; });

  byId("prewarm-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const select = byId("prewarm-choice");
    if (!select.value) return;
    const [role, image] = JSON.parse(select.value);
    const body = { role, image };
    if (byId("when-at").checked) {
      const when = at.value ? new Date(at.value).getTime() / 1000 : NaN;
      if (Number.isNaN(when)) {
        report("Pick the date and time to pre-warm at, or choose Now.", [], true);
        at.focus();
        return;
      }
      body.at = when;
    }
    const button = byId("prewarm");
    button.disabled = true;
    report(body.at === undefined
      ? `Starting the servers of ${isolate(group)} with ${isolate(role)}…`
      : "Scheduling the pre-warm…", []);
    try {
      const { status, data } = await call("POST", "/prewarm", body);
      if (status === 201) {
        report(`Scheduled: the servers of ${isolate(group)} start with ${isolate(role)} and ` +
               `${isolate(image)} at ` +
               `${moment(data.at)}.`, []);
      } else if (status === 200) {
        report(`Pre-warm with ${isolate(role)} and ${isolate(image)}: ${counted(data.results)}.`,
               data.results,
               data.results.some((r) => BAD.has(r.outcome)));
      } else {
        report(data.message, data.results, true);
      }
    } finally {
      button.disabled = select.disabled;
      await refresh();
    }
  });

  byId("schedules-body").addEventListener("click", async (event) => {
    const button = event.target.closest("button.cancel");
    if (!button) return;
    button.disabled = true;
    const { status, data } = await call("DELETE", `/schedules/${button.dataset.id}`);
    if (status === 200) {
      report(`Cancelled the pre-warm at ${moment(data.at)}.`, []);
    } else {
      report(data.message, [], true);
    }
    await refresh();
    keepFocus();
  });

  // --- start -----------------------------------------------------------------------------

  byId("tz-note").textContent = zone;
  for (const time of document.querySelectorAll("#schedules-body time[data-epoch]")) {
    time.textContent = moment(Number(time.dataset.epoch));
  }
  setInterval(refresh, refreshMs);
})();
