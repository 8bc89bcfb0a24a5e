// Requests for a bigger role: the page's actions (spawner/webapp/requests.py).
// The page is rendered by the service and reads without this script; the script asks,
// withdraws and decides through the JSON API (the same module), then
// reloads the page so the service renders the new state. Names, reasons and comments are
// chosen by users: they are only ever set as textContent, never parsed as HTML.
(function () {
  "use strict";

  const root = document.getElementById("requests-page");
  if (!root) return;
  const api = root.dataset.api;
  const xsrf = root.dataset.xsrf;
  const maxDays = Number(root.dataset.maxDays) || 0;
  const DAY_MS = 86400 * 1000;
  const MESSAGE_KEY = "quota-spawner-requests-message";
  const byId = (id) => document.getElementById(id);

  // HubOAuth checks XSRF on every request that is not a navigation, GETs included.
  async function call(method, path, body) {
    const options = {
      method,
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-XSRFToken": xsrf },
    };
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(api + path, options);
    } catch (e) {
      return { ok: false, message: "The service did not answer; try again in a moment." };
    }
    let data = {};
    try {
      data = await response.json();
    } catch (e) {
      data = { message: `The service answered ${response.status}.` };
    }
    return { ok: response.ok, message: data.message || `The service answered ${response.status}.` };
  }

  // After a change the page is read again; its sentence is shown there, and focused, so
  // a keyboard or screen reader user hears what happened.
  function doneThenReload(message) {
    try {
      sessionStorage.setItem(MESSAGE_KEY, message);
    } catch (e) {
      // no storage: the reloaded page shows the new state without the sentence
    }
    window.location.reload();
  }

  function showStoredMessage() {
    let message = null;
    try {
      message = sessionStorage.getItem(MESSAGE_KEY);
      sessionStorage.removeItem(MESSAGE_KEY);
    } catch (e) {
      return;
    }
    if (!message) return;
    const box = byId("page-message");
    box.textContent = message;
    box.hidden = false;
    box.focus();
  }

  function say(element, message, refusal) {
    element.textContent = message;
    element.classList.toggle("refusal", Boolean(refusal));
  }

  // --- the ask form: "YYYY-MM-DD HH:MM", 24-hour, in the service's time zone ------------
  // (the page's data-tz, an IANA name such as "UTC" or "Europe/Berlin"), as every time
  // the page shows; the browser's own zone and clock format play no part.

  const zone = root.dataset.tz || "UTC";
  const pad = (n) => String(n).padStart(2, "0");
  const parts = new Intl.DateTimeFormat("en-GB", {
    timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit",
  });
  // The wall clock in the zone at epoch milliseconds ``ms``, as milliseconds of a UTC date.
  function wallClock(ms) {
    const p = {};
    for (const part of parts.formatToParts(new Date(ms))) p[part.type] = part.value;
    return Date.UTC(Number(p.year), Number(p.month) - 1, Number(p.day), Number(p.hour),
                    Number(p.minute));
  }
  function zoneValue(ms) {
    const d = new Date(wallClock(ms));
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
      `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`;
  }
  function seconds(value) {
    const m = /^\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})\s*$/.exec(value);
    if (!m) return null;
    const [year, month, day, hour, minute] = m.slice(1).map(Number);
    if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59) return null;
    const wanted = Date.UTC(year, month - 1, day, hour, minute);
    if (new Date(wanted).getUTCDate() !== day) return null; // 2026-02-30
    // the zone's offset at that moment, found twice for the hours a clock change moves
    let guess = wanted - (wallClock(wanted) - wanted);
    guess = wanted - (wallClock(guess) - guess);
    return wallClock(guess) === wanted ? guess / 1000 : null;
  }

  const form = byId("ask-form");
  if (form) {
    const starts = byId("ask-starts");
    const ends = byId("ask-ends");
    const result = byId("ask-result");
    const now = Math.floor(Date.now() / 60000) * 60000;
    if (!starts.value) starts.value = zoneValue(now);
    if (!ends.value) {
      const days = maxDays > 0 ? Math.min(1, maxDays) : 1;
      ends.value = zoneValue(now + days * DAY_MS);
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {
        role: byId("ask-role").value,
        starts: seconds(starts.value),
        ends: seconds(ends.value),
        reason: byId("ask-reason").value.trim(),
      };
      if (body.starts === null || body.ends === null) {
        say(result, `Give the start and the end of the window as a date and a 24-hour time ` +
            `in ${zone}, such as 2026-12-20 14:00.`, true);
        return;
      }
      if (!body.reason) {
        say(result, "Please say why you need this role; admins decide on the reason.", true);
        byId("ask-reason").focus();
        return;
      }
      const submit = byId("ask-submit");
      submit.disabled = true;
      say(result, "Sending your request…", false);
      const answer = await call("POST", "", body);
      if (answer.ok) {
        doneThenReload(answer.message);
        return;
      }
      submit.disabled = false;
      say(result, answer.message, true);
    });
    byId("ask-submit").disabled = false;
  }

  // --- withdraw a request, give up a grant ------------------------------------------------

  for (const button of document.querySelectorAll("button.withdraw")) {
    button.addEventListener("click", async () => {
      const result = byId("mine-result");
      button.disabled = true;
      const answer = await call("POST", `/${button.dataset.id}/withdraw`, {});
      if (answer.ok) {
        doneThenReload(answer.message);
        return;
      }
      button.disabled = false;
      say(result, answer.message, true);
    });
    button.disabled = false;
  }

  // --- decide: approve or refuse, with a comment ------------------------------------------

  for (const decide of document.querySelectorAll("form.decide")) {
    const result = decide.parentElement.querySelector(".decide-result");
    const buttons = decide.querySelectorAll("button[data-decision]");
    // Enter in the comment chooses nothing: approving or refusing takes its button
    decide.addEventListener("submit", (event) => {
      event.preventDefault();
      say(result, "Choose Approve or Refuse.", false);
    });
    for (const button of buttons) {
      button.addEventListener("click", async () => {
        if (button.dataset.decision === "delete") {
          buttons.forEach((b) => { b.disabled = true; });
          say(result, "Deleting…", false);
          const answer = await call("DELETE", `/${decide.dataset.id}`);
          if (answer.ok) {
            doneThenReload(answer.message);
            return;
          }
          buttons.forEach((b) => { b.disabled = false; });
          say(result, answer.message, true);
          return;
        }
        const approve = button.dataset.decision === "approve";
        const comment = decide.elements.comment.value.trim();
        if (!approve && !comment) {
          say(result, "Please say why you refuse: the user is told.", true);
          decide.elements.comment.focus();
          return;
        }
        buttons.forEach((b) => { b.disabled = true; });
        say(result, approve ? "Approving…" : "Refusing…", false);
        const answer = await call("POST", `/${decide.dataset.id}/decide`, { approve, comment });
        if (answer.ok) {
          doneThenReload(answer.message);
          return;
        }
        buttons.forEach((b) => { b.disabled = false; });
        say(result, answer.message, true);
      });
      button.disabled = false;
    }
  }

  showStoredMessage();
})();
