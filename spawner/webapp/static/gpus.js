// The admins' live host map (spawner/webapp/gpus.py, templates/gpus.html), after live.js.
//
// Every few seconds: asks api/gpus for the map as the service draws it (HTML, with the
// XSRF token, which JupyterHub's HubOAuth asks of every request that is not a navigation)
// and patches #live with it in place (QuotaLive.patch): elements are kept where they
// match, so keyboard focus and scrolling stay put. The map's words are the service's only.
"use strict";

(function () {
  const root = document.getElementById("gpu-map");
  if (!root) return;
  const api = root.dataset.api;
  const xsrf = root.dataset.xsrf;
  const interval = Math.max(500, Number(root.dataset.interval) || 2000);
  const live = document.getElementById("live");
  const status = document.getElementById("live-status");
  const updated = document.getElementById("updated");
  const pause = document.getElementById("pause");
  let paused = false;
  let timer = null;
  let failing = false;
  let busy = false; // a request is under way: a resume or a shown tab starts no second one

  function patch(wanted) {
    QuotaLive.patch(live, wanted, {
      // a focused line that goes (its holder left): focus to its section's heading
      fallback: (focused) => {
        const section = focused.closest("section");
        return (section && section.querySelector("h2[tabindex]")) ||
          document.getElementById("gpus-label");
      },
    });
  }

  // --- polling -------------------------------------------------------------------------

  function say(text) {
    if (status.textContent !== text) status.textContent = text;
  }

  async function poll() {
    timer = null;
    // a hidden tab asks nothing; it catches up when shown again (visibilitychange)
    if (paused || busy || document.hidden) return;
    busy = true;
    try {
      const answer = await QuotaLive.read(api, xsrf);
      const wanted = answer.ok && answer.page ? answer.page.getElementById("live") : null;
      if (!wanted) throw new Error(answer.message || `the service answered ${answer.status}`);
      if (!paused) { // paused while it was asked: the map stays as it is
        const drawn = new Date(Number(wanted.dataset.generatedAt) * 1000);
        patch(wanted);
        updated.textContent = `Live: updated every ${root.dataset.every}; last at ` +
          `${drawn.toLocaleTimeString()}.`;
      }
      if (failing) say("The map is live again.");
      failing = false;
    } catch (error) {
      failing = true;
      say(`The map could not be updated (${error.message}); it shows the last figures ` +
        "read, and tries again.");
    } finally {
      busy = false;
    }
    if (!paused && !timer) timer = setTimeout(poll, interval);
  }

  pause.addEventListener("click", () => {
    paused = !paused;
    pause.setAttribute("aria-pressed", String(paused));
    pause.textContent = paused ? "Resume live updates" : "Pause live updates";
    if (paused) {
      if (timer) clearTimeout(timer);
      timer = null;
      updated.textContent = "Paused: the map stays as it is until you resume.";
    } else if (!timer && !busy) {
      poll();
    }
  });

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && !paused && !timer && !busy) poll();
  });

  poll();
})();
