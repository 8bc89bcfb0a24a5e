// Requests for a bigger role: the page's actions (spawner/usage/requests_page.py).
// The page is rendered by the service and reads without this script; the script asks,
// withdraws and decides through the JSON API (spawner/usage/requests_api.py), then
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

  // --- the ask form: datetime-local inputs are in the browser's time zone -----------------

  const pad = (n) => String(n).padStart(2, "0");
  function localValue(date) {
    return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}` +
      `T${pad(date.getHours())}:${pad(date.getMinutes())}`;
  }
  function seconds(value) {
    // "YYYY-MM-DDTHH:MM" without an offset is read as local time
    const t = new Date(value).getTime();
    return Number.isNaN(t) ? null : t / 1000;
  }

  const form = byId("ask-form");
  if (form) {
    const starts = byId("ask-starts");
    const ends = byId("ask-ends");
    const result = byId("ask-result");
    const now = new Date();
    now.setSeconds(0, 0);
    starts.min = localValue(now);
    if (!starts.value) starts.value = localValue(now);
    const limitEnd = () => {
      const from = new Date(starts.value);
      if (Number.isNaN(from.getTime())) return;
      ends.min = localValue(from);
      if (maxDays > 0) ends.max = localValue(new Date(from.getTime() + maxDays * DAY_MS));
    };
    if (!ends.value) {
      const days = maxDays > 0 ? Math.min(1, maxDays) : 1;
      ends.value = localValue(new Date(now.getTime() + days * DAY_MS));
    }
    limitEnd();
    starts.addEventListener("change", limitEnd);

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {
        role: byId("ask-role").value,
        starts: seconds(starts.value),
        ends: seconds(ends.value),
        reason: byId("ask-reason").value.trim(),
      };
      if (body.starts === null || body.ends === null) {
        say(result, "Give the start and the end of the window as dates and times.", true);
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
