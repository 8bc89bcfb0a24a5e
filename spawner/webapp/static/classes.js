// The class dashboard (spawner/webapp/classes.py, templates/class.html), after format.js
// and live.js: every few seconds asks the service's API for the dashboard as the service
// draws it and patches its live parts into the page in place (QuotaLive), and sends the
// actions to the API. Plain script, no framework and nothing from the network. What it
// writes itself (the sentences about an action, and the times in the browser's zone) is
// text only (textContent), never HTML, each name isolated in its line (a <bdi>, or
// QuotaFormat.isolate in plain text), so its bidi controls cannot reorder the words around
// it.
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

  const { moment, isolate } = QuotaFormat;

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
    element.replaceChildren(...parts.map((p) => (typeof p === "string" ? p
      : make("bdi", "", String(p.name)))));
    return element;
  }

  // --- refreshing: the service's drawing, patched in ---------------------------------------

  // what a refresh patches; the rest of the page (the action's status, the form's inputs)
  // is the visitor's
  const LIVE = ["members-body", "no-members", "prewarm-choice", "prewarm", "no-choices",
                "lacking-block", "schedules-body", "no-schedules"];
  // buttons the script holds, which a refresh leaves as they are: pressed once (armed), or
  // their action under way
  const held = new Set();

  // the schedules' times in the browser's zone, as the pre-warm form takes them
  function localise(scope) {
    for (const time of scope.querySelectorAll("#schedules-body time[data-epoch]")) {
      const shown = moment(Number(time.dataset.epoch));
      time.textContent = shown;
      const cancel = time.closest("tr").querySelector("button.cancel");
      if (cancel) cancel.setAttribute("aria-label", `Cancel the pre-warm at ${shown}`);
    }
  }

  let refreshing = false;

  async function refresh() {
    if (refreshing) return;
    refreshing = true;
    try {
      let answer = null;
      try {
        answer = await QuotaLive.read(api, xsrf);
      } catch (e) {
        setText(byId("refresh-status"), "It could not be refreshed: The service did not " +
          "answer; try again.");
        return;
      }
      const page = answer.ok ? answer.page : null;
      const parts = LIVE.map((id) => [byId(id), page && page.getElementById(id)]);
      if (!parts.every(([, wanted]) => wanted)) {
        const why = answer.message || (answer.ok || answer.redirected
          ? "Your login to this page has expired; reload the page."
          : `The service answered with an error (HTTP ${answer.status}).`);
        setText(byId("refresh-status"), `It could not be refreshed: ${why}`);
        return;
      }
      localise(page);
      const select = byId("prewarm-choice");
      const kept = select.value;
      for (const [old, wanted] of parts) {
        QuotaLive.patch(old, wanted,
                        { held: (e) => held.has(e), fallback: () => byId("action-status") });
      }
      if (Array.from(select.options).some((o) => o.value === kept)) select.value = kept;
      // a server that stopped while its button waited for the second press: nothing to stop
      for (const button of byId("members-body").querySelectorAll("button.stop.armed")) {
        if (button.closest("tr").querySelector(".state-stopped")) {
          disarm(button);
          button.disabled = true;
        }
      }
      setText(byId("refresh-status"), "");
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
    held.add(button);
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
    held.delete(button);
  }

  async function stop(button, body, what) {
    held.add(button);
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
      held.delete(button);
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
    held.add(button);
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
      held.delete(button);
      button.disabled = select.disabled;
      await refresh();
    }
  });

  byId("schedules-body").addEventListener("click", async (event) => {
    const button = event.target.closest("button.cancel");
    if (!button) return;
    held.add(button);
    button.disabled = true;
    const { status, data } = await call("DELETE", `/schedules/${button.dataset.id}`);
    held.delete(button);
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
  localise(document);
  setInterval(refresh, refreshMs);
})();
