// The admins' live host map (spawner/webapp/gpus.py, templates/gpus.html), after
// format.js.
//
// Every few seconds: GET api/gpus (with the XSRF token, which JupyterHub's HubOAuth asks
// of every request that is not a navigation), build the live part of the page again
// from the JSON, the same elements as the template draws, and patch the page in place:
// elements are kept where they match (by their data-key, else by tag and position), so
// keyboard focus and scrolling stay put. Every text from the data is set with
// textContent or as an attribute value, never parsed as HTML.
"use strict";

(function () {
  const root = document.getElementById("gpu-map");
  if (!root) return;
  const api = root.dataset.api;
  const xsrf = root.dataset.xsrf;
  const userPage = root.dataset.userPage;
  const interval = Math.max(500, Number(root.dataset.interval) || 2000);
  const live = document.getElementById("live");
  const status = document.getElementById("live-status");
  const updated = document.getElementById("updated");
  const pause = document.getElementById("pause");
  let paused = false;
  let timer = null;
  let failing = false;
  let busy = false; // a request is under way: a resume or a shown tab starts no second one

  // --- words and numbers, as gpus.py writes them; sizes, durations and shares are
  // format.js's, as formatting.py's are the page's ---------------------------------------

  const { isNumber, size, duration, percent, isolate } = QuotaFormat;
  const plural = (n, word) => (n === 1 ? `${n} ${word}` : `${n} ${word}s`);

  function modeText(mode, cap) {
    if (typeof mode === "string" && mode.startsWith("shared:")) {
      const text = `shared by up to ${mode.slice("shared:".length)}`;
      return text + (isNumber(cap) ? `, cap ${size(cap)}` : "");
    }
    return String(mode || "exclusive");
  }

  // CPUs to two decimals at most, half up, as gpus.py's cpus_text
  function cpusText(value) {
    if (!isNumber(value)) return "–";
    return (Math.floor(value * 100 + 0.5) / 100).toFixed(2).replace(/\.?0+$/, "");
  }

  const amountText = (key, value) => (key === "cpus" ? cpusText(value) : size(value));

  function hostText(host, waiting) {
    if (host.state === "off") {
      return "Host admission is off: the hub starts servers without counting the host's " +
        "CPUs and memory, so nothing is reserved; what the servers use is the watchdog's.";
    }
    if (host.state !== "on") {
      return "No host figures from the hub yet: it writes them with its pool once it " +
        "counts the host's CPUs and memory.";
    }
    const n = host.servers.length;
    return `${plural(n, "server")} ${n === 1 ? "holds" : "hold"} room on the host; ` +
      `${plural(waiting, "start")} waiting for room.`;
  }

  function roomText(cpus, memory) {
    if (!isNumber(cpus)) return "–";
    return `${cpusText(cpus)} CPU${cpus === 1 ? "" : "s"}, ${size(memory)}`;
  }

  // as gpus.py's queue_text
  function queueText(doc) {
    const strategy = doc.queue_strategy;
    if (!strategy) return "";
    const fair = doc.queue_fair === true;
    const order = fair
      ? "by priority, then a user's first server before anyone's second, then arrival"
      : "by priority, then arrival";
    const rule = strategy === "StrictFIFO"
      ? "nobody behind takes room on the host while a start ahead waits for room, nor " +
        "a GPU a start ahead could use"
      : "a start that fits is not held up by an older one that does not";
    return `Queue: ${strategy}${fair ? ", fair between users" : ""}. Served ${order}; ${rule}.`;
  }

  function waitingForText(ticket) {
    if (ticket.waiting_for) return `room on the host (${ticket.waiting_for})`;
    return isNumber(ticket.gpus) && ticket.gpus > 0 ? plural(ticket.gpus, "GPU") : "–";
  }

  function gpusText(ticket) {
    if (!isNumber(ticket.gpus) || ticket.gpus <= 0) return "none";
    return `${plural(ticket.gpus, "GPU")}, ${modeText(ticket.mode, null)}`;
  }

  function preemptionText(ticket, users, indexes) {
    if (!ticket.preempting) return "–";
    let text = "under way";
    if (ticket.victims.length) {
      text += ": stopping " + ticket.victims.map((v) => isolate(users[v] || v)).join(", ");
    }
    if (ticket.reserved.length) {
      text += "; " + ticket.reserved.map((u) => `GPU ${indexes[u] || u}`).join(", ") +
        " kept for it";
    }
    return text;
  }

  // --- building elements ---------------------------------------------------------------

  // h("td", {class: "text"}, child, "text", …): text children become text nodes
  function h(tag, attributes, ...children) {
    const element = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value !== null && value !== undefined && value !== false) {
        element.setAttribute(name, String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      element.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return element;
  }

  function userLink(user, owner) {
    // dir="auto" isolates a name: its bidi controls cannot reorder the line around it
    return user ? h("a", {href: userPage + encodeURIComponent(user), dir: "auto"}, user)
      : h("span", {dir: "auto"}, owner);
  }

  function summaryText(doc, noState) {
    const s = doc.summary;
    if (!doc.state_dir) return noState;
    if (s.total === 0 && s.other === 0) return "No GPU to show.";
    let text = `${plural(s.total, "GPU")} in the hub's pool: ${s.exclusive} exclusive, ` +
      `${s.shared} shared, ${s.free} free; ${s.idle} idle; ` +
      `${plural(s.waiting_for_gpu, "start")} waiting for a GPU.`;
    if (s.other) text += ` ${plural(s.other, "other GPU")} on the host, outside the pool.`;
    return text;
  }

  // as gpus.py's nodes_text
  function nodesText(nodes) {
    if (!nodes || nodes.length < 2) return "";
    const parts = nodes.map(n => `${n.node || "a watchdog"} (${n.state}` +
      (n.state === "stale" && isNumber(n.age) ? `, ${duration(n.age)} old)` : ")"));
    return ` Readings from ${nodes.length} watchdogs: ${parts.join(", ")}.`;
  }

  function freshnessText(w, usageFile) {
    return watchdogText(w, usageFile) + nodesText(w.nodes);
  }

  function watchdogText(w, usageFile) {
    if (w.state === "fresh") {
      return `The watchdog's figures are ${duration(w.age)} old (it measures every ` +
        `${duration(w.interval)}).`;
    }
    if (w.state === "stale") {
      return `The watchdog's figures are ${duration(w.age)} old, too old to trust (more ` +
        `than ${duration(w.stale_after)}): the CPUs and memory used, utilisation, GPU ` +
        "memory and idle marks are left out until it measures again. Is the watchdog running?";
    }
    return `No figures from the watchdog (${usageFile}: missing or ` +
      "unreadable): the CPUs and memory used, utilisation, GPU memory and idle marks are " +
      "left out.";
  }

  function poolText(doc, gpusFile) {
    if (doc.pool.state === "ok") {
      const age = isNumber(doc.pool.time) ? duration(doc.generated_at - doc.pool.time) : "–";
      return `Reservations, holders and queue: the hub's pool as it last changed, ${age} ago.`;
    }
    return `No pool from the hub yet (${gpusFile}): the hub writes it ` +
      "once it has read its GPUs and whenever a reservation, a holder or the queue changes.";
  }

  function hostRow(host, key, label) {
    const reserved = host.reserved ? host.reserved[key] : null;
    const share = host.share ? host.share[key] : null;
    const ratio = key === "cpus" ? host.cpu_ratio : host.memory_ratio;
    const has = host.state === "on" ? host[key] : (host.engine ? host.engine[key] : null);
    const reservedCell = isNumber(reserved) && share
      ? [h("meter", {min: "0", max: String(share), value: String(reserved)}),
        h("span", {}, `${amountText(key, reserved)} of ${amountText(key, share)}`)]
      : h("span", {}, "–");
    return h("tr", {"data-key": key},
      h("th", {scope: "row", class: "text"}, label),
      h("td", {class: "reserved"}, reservedCell),
      h("td", {class: "used"}, host.used ? amountText(key, host.used[key]) : "–"),
      h("td", {class: "share"},
        isNumber(share) ? `${amountText(key, share)} (${cpusText(ratio)}x)` : "–"),
      h("td", {class: "capacity"}, amountText(key, has)),
      h("td", {class: "kept"}, amountText(key, host[`kept_${key}`])));
  }

  function serverRow(r) {
    let cpus = `${cpusText(r.cpus)} reserved`;
    if (isNumber(r.cpu_used)) cpus += ` · ${cpusText(r.cpu_used)} used`;
    let memory = `${size(r.memory)} reserved`;
    if (isNumber(r.memory_used)) memory += ` · ${size(r.memory_used)} used`;
    return h("tr", {"data-key": r.owner},
      h("td", {class: "text"}, userLink(r.user, r.owner)),
      h("td", {class: "text"}, r.role || "?"),
      h("td", {class: "text"}, cpus),
      h("td", {class: "text"}, memory));
  }

  function hostSection(doc) {
    const host = doc.host;
    const parts = [
      h("h2", {id: "host-label", tabindex: "-1"}, "Host"),
      h("p", {id: "host-summary"}, hostText(host, doc.summary.waiting_for_room)),
      h("div", {class: "wide"}, h("table", {id: "host"},
        h("thead", {}, h("tr", {},
          h("th", {class: "text"}, "Resource"), h("th", {}, "Reserved"), h("th", {}, "Used"),
          h("th", {}, "Notebooks may reserve"), h("th", {}, "The host has"),
          h("th", {}, "Kept back"))),
        h("tbody", {}, hostRow(host, "cpus", "CPUs"), hostRow(host, "memory", "Memory")))),
    ];
    if (host.state === "on") {
      parts.push(h("h3", {id: "host-servers-label"}, "Room held by each server"));
      parts.push(host.servers.length
        ? h("div", {class: "wide"}, h("table", {id: "host-servers",
          "aria-labelledby": "host-servers-label"},
        h("thead", {}, h("tr", {},
          h("th", {class: "text"}, "Who"), h("th", {class: "text"}, "Role"),
          h("th", {class: "text"}, "CPUs"), h("th", {class: "text"}, "Memory"))),
        h("tbody", {}, host.servers.map(serverRow))))
        : h("p", {id: "host-servers-empty"}, "No server holds room on the host."));
    }
    return h("section", {"aria-labelledby": "host-label"}, parts);
  }

  function stateCell(g, now, users) {
    const parts = [];
    if (!g.in_pool) {
      parts.push(h("span", {class: "state-label"}, "Not in the hub's pool"));
    } else if (g.state === "exclusive") {
      parts.push(h("span", {class: "state-label"}, "Exclusive"));
    } else if (g.state === "shared") {
      const taken = g.holders.length;
      parts.push(h("span", {class: "state-label"}, "Shared"),
        h("span", {class: "places"}, ` · ${taken} of ${taken + (g.free_slots || 0)} places taken`));
    } else {
      parts.push(h("span", {class: "state-label"}, "Free"));
    }
    if (g.idle) {
      const since = isNumber(g.idle_since) ? duration(now - g.idle_since) : "a while";
      parts.push(h("div", {class: "flag idle"}, h("strong", {}, "Idle"),
        h("span", {}, `held, no utilisation for ${since}`)));
    }
    if (g.lost) {
      parts.push(h("div", {class: "flag lost"}, h("strong", {}, "Lost"), h("span", {}, g.lost)));
    }
    if (g.reserved_for) {
      parts.push(h("div", {class: "flag kept"}, h("strong", {}, "Kept"),
        h("span", {}, "for ", h("bdi", {}, users[g.reserved_for] || g.reserved_for),
          ": a preemption is under way")));
    }
    return h("td", {class: "text state"}, parts);
  }

  function holderItem(holder, uuid, now, users) {
    let details = ` · ${modeText(holder.mode, holder.memory_cap)}`;
    if (holder.gpu_memory !== null && holder.gpu_memory !== undefined) {
      details += ` · ${size(holder.gpu_memory)} on this GPU`;
    }
    if (isNumber(holder.since)) details += ` · for ${duration(now - holder.since)}`;
    return h("li", {"data-key": holder.owner},
      userLink(holder.user, holder.owner),
      h("span", {class: "note"}, " · ", h("bdi", {}, holder.role || "?"), details),
      holder.idle ? h("strong", {class: "badge idle"}, "idle") : null,
      holder.evicting_for ? h("div", {class: "flag evict"}, h("strong", {}, "Stopping"),
        h("span", {}, "for ", h("bdi", {}, users[holder.evicting_for] || holder.evicting_for)))
        : null);
  }

  function gpuRow(g, now, users) {
    const classes = ["gpu", g.state];
    if (g.idle) classes.push("idle");
    if (g.lost) classes.push("lost");
    const index = g.index === null || g.index === undefined ? "?" : g.index;
    const util = isNumber(g.utilization)
      ? h("meter", {min: "0", max: "1", value: String(g.utilization)}) : null;
    const memory = g.memory_used !== null && g.memory_used !== undefined
      ? `${size(g.memory_used)} of ${size(g.memory_total)}` : `– of ${size(g.memory)}`;
    const holders = g.holders.length
      ? h("ul", {class: "holders"}, g.holders.map((x) => holderItem(x, g.uuid, now, users)))
      : h("span", {class: "note"}, "nobody");
    return h("tr", {"data-key": g.uuid, class: classes.join(" ")},
      h("th", {scope: "row", class: "text"},
        h("span", {class: "gpu-label"}, `GPU ${index}`),
        h("span", {class: "note gpu-model"}, ` ${g.name || ""}`),
        h("code", {class: "uuid"}, g.uuid)),
      stateCell(g, now, users),
      h("td", {class: "util"}, util, h("span", {}, percent(g.utilization))),
      h("td", {class: "memory"}, memory),
      h("td", {class: "text"}, holders));
  }

  function queueSection(doc, users, indexes) {
    const now = doc.generated_at;
    const body = doc.queue.length
      ? h("div", {class: "wide"}, h("table", {id: "queue"},
        h("thead", {}, h("tr", {},
          h("th", {}, "#"), h("th", {class: "text"}, "Who"), h("th", {class: "text"}, "Role"),
          h("th", {class: "text"}, "GPUs"), h("th", {class: "text"}, "Host room"),
          h("th", {}, "Priority"), h("th", {}, "Waiting"),
          h("th", {class: "text"}, "Waiting for"), h("th", {class: "text"}, "Preemption"))),
        h("tbody", {}, doc.queue.map((t) => h("tr", {"data-key": t.owner},
          h("td", {}, String(t.position)),
          h("td", {class: "text"}, userLink(t.user, t.owner)),
          h("td", {class: "text"}, t.role || "?"),
          h("td", {class: "text"}, gpusText(t)),
          h("td", {class: "text"}, roomText(t.cpus, t.memory)),
          h("td", {}, t.priority === null || t.priority === undefined ? "–" : String(t.priority)),
          h("td", {}, isNumber(t.since) ? duration(now - t.since) : "–"),
          h("td", {class: "text"}, waitingForText(t)),
          h("td", {class: "text"}, preemptionText(t, users, indexes)))))))
      : h("p", {id: "queue-empty"}, "Nobody is waiting for a GPU or for room on the host.");
    const policy = queueText(doc);
    return h("section", {"aria-labelledby": "queue-label"},
      h("h2", {id: "queue-label"}, "Wait queue"),
      policy ? h("p", {id: "queue-policy"}, policy) : null, body);
  }

  function render(doc) {
    const now = doc.generated_at;
    const users = {};
    for (const t of doc.queue) if (t.owner && t.user) users[t.owner] = t.user;
    const indexes = {};
    for (const g of doc.gpus) {
      if (g.index !== null && g.index !== undefined) indexes[g.uuid] = String(g.index);
      for (const x of g.holders) if (x.owner && x.user) users[x.owner] = x.user;
    }
    const w = doc.watchdog;
    return h("div", {id: "live"},
      h("p", {id: "freshness", class: `freshness ${w.state}`},
        freshnessText(w, root.dataset.usageFile || "")),
      h("p", {id: "pool-note", class: "note"}, poolText(doc, root.dataset.gpusFile || "")),
      hostSection(doc),
      h("section", {"aria-labelledby": "gpus-label"},
        h("h2", {id: "gpus-label", tabindex: "-1"}, "GPUs of the host"),
        h("p", {id: "summary"}, summaryText(doc, root.dataset.noState || "")),
        h("div", {class: "wide"}, h("table", {id: "gpus"},
          h("thead", {}, h("tr", {},
            h("th", {class: "text"}, "GPU"), h("th", {class: "text"}, "State"),
            h("th", {}, "Utilisation"), h("th", {}, "Memory"),
            h("th", {class: "text"}, "Held by"))),
          h("tbody", {}, doc.gpus.map((g) => gpuRow(g, now, users)))))),
      queueSection(doc, users, indexes));
  }

  // --- patching the page in place ------------------------------------------------------

  const keyOf = (node) => (node.nodeType === 1 ? node.getAttribute("data-key") : null);
  const sameKind = (a, b) => a.nodeType === b.nodeType && a.nodeName === b.nodeName &&
    keyOf(a) === keyOf(b);

  function update(old, wanted) {
    if (old.nodeType !== 1) {
      if (old.nodeValue !== wanted.nodeValue) old.nodeValue = wanted.nodeValue;
      return;
    }
    for (const {name} of Array.from(old.attributes)) {
      if (!wanted.hasAttribute(name)) old.removeAttribute(name);
    }
    for (const {name, value} of Array.from(wanted.attributes)) {
      if (old.getAttribute(name) !== value) old.setAttribute(name, value);
    }
    if (old.nodeName === "METER" && wanted.hasAttribute("value")) {
      old.value = Number(wanted.getAttribute("value"));
    }
    patchChildren(old, wanted);
  }

  function patchChildren(parent, wanted) {
    const keyed = new Map();
    for (const child of parent.childNodes) {
      const key = keyOf(child);
      if (key !== null) keyed.set(child.nodeName + "\u0000" + key, child);
    }
    let cursor = parent.firstChild;
    for (const want of Array.from(wanted.childNodes)) {
      const key = keyOf(want);
      let match = null;
      if (key !== null) {
        match = keyed.get(want.nodeName + "\u0000" + key) || null;
        keyed.delete(want.nodeName + "\u0000" + key);
      } else {
        // the next unkeyed node of the same kind; those skipped have no counterpart
        for (let node = cursor; node && keyOf(node) === null; node = node.nextSibling) {
          if (sameKind(node, want)) { match = node; break; }
        }
        while (match && cursor !== match) {
          const next = cursor.nextSibling;
          parent.removeChild(cursor);
          cursor = next;
        }
      }
      if (match) {
        if (match === cursor) cursor = cursor.nextSibling;
        else parent.insertBefore(match, cursor);
        update(match, want);
      } else {
        parent.insertBefore(want, cursor);
      }
    }
    while (cursor) {
      const next = cursor.nextSibling;
      parent.removeChild(cursor);
      cursor = next;
    }
  }

  function patch(doc) {
    const focused = document.activeElement;
    const wasInside = focused && live.contains(focused) && focused !== live;
    // the heading of the section it was in: where focus goes if its line goes
    const section = wasInside ? focused.closest("section") : null;
    const heading = (section && section.querySelector("h2[tabindex]")) ||
      document.getElementById("gpus-label");
    update(live, render(doc));
    if (wasInside && document.activeElement !== focused) {
      // moved (a reorder) or gone (its holder left): back to it, else to the heading
      const target = focused.isConnected ? focused : heading;
      if (target) target.focus({preventScroll: true});
    }
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
      const response = await fetch(api, {
        headers: {"X-XSRFToken": xsrf, Accept: "application/json"},
        credentials: "same-origin", cache: "no-store",
      });
      let body = null;
      try { body = await response.json(); } catch (e) { body = null; }
      if (!response.ok || !body || !Array.isArray(body.gpus)) {
        const why = body && body.message ? body.message : `the service answered ${response.status}`;
        throw new Error(why);
      }
      if (!paused) { // paused while it was asked: the map stays as it is
        patch(body);
        updated.textContent = `Live: updated every ${duration(interval / 1000)}; last at ` +
          `${new Date(body.generated_at * 1000).toLocaleTimeString()}.`;
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
