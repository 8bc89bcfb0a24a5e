// A live page of the web app (the host map, a class's dashboard) is drawn by the service
// only (spawner/webapp/base.py): its script asks the page's API for the page again, as
// HTML, and patches what changed into the page in place, so the page reads the same as it
// was drawn and the keyboard's focus, a selection and the scroll position stay put.
// The service's HTML is parsed as an inert document (DOMParser: nothing in it runs) and
// its nodes are moved in; nothing is written as markup here. Loaded before the page's own
// script, as QuotaLive.
"use strict";

(function (root) {
  // read(url, xsrf): the API's answer, {ok, status, redirected, page, message}: ``page`` the
  // parsed drawing when it answered HTML, ``message`` its sentence when it answered JSON
  // (a refusal). A network failure throws.
  async function read(url, xsrf) {
    // JupyterHub's HubOAuth checks the XSRF token on every request that is not a page
    // navigation, GETs from fetch() included
    const response = await fetch(url, {
      headers: { Accept: "text/html", "X-XSRFToken": xsrf },
      credentials: "same-origin", cache: "no-store",
    });
    const text = await response.text();
    const answer = { ok: response.ok, status: response.status,
                     redirected: response.redirected, page: null, message: null };
    if ((response.headers.get("Content-Type") || "").startsWith("application/json")) {
      try { answer.message = JSON.parse(text).message || null; } catch (e) { /* none */ }
    } else {
      answer.page = new DOMParser().parseFromString(text, "text/html");
    }
    return answer;
  }

  // the attributes the pages key their rows by: kept rows are the same elements
  const keyOf = (node) => (node.nodeType !== 1 ? null : node.getAttribute("data-key") ??
    node.getAttribute("data-user") ?? node.getAttribute("data-id"));
  const sameKind = (a, b) => a.nodeType === b.nodeType && a.nodeName === b.nodeName &&
    keyOf(a) === keyOf(b);

  // ``old`` made like ``wanted``; an element ``held(element)`` says the script holds
  // (a button pressed once, an action under way) is left as it is
  function update(old, wanted, held) {
    if (old.nodeType !== 1) {
      if (old.nodeValue !== wanted.nodeValue) old.nodeValue = wanted.nodeValue;
      return;
    }
    if (held(old)) return;
    for (const { name } of Array.from(old.attributes)) {
      if (!wanted.hasAttribute(name)) old.removeAttribute(name);
    }
    for (const { name, value } of Array.from(wanted.attributes)) {
      if (old.getAttribute(name) !== value) old.setAttribute(name, value);
    }
    if (old.nodeName === "METER" && wanted.hasAttribute("value")) {
      old.value = Number(wanted.getAttribute("value"));
    }
    patchChildren(old, wanted, held);
  }

  function patchChildren(parent, wanted, held) {
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
        update(match, want, held);
      } else {
        parent.insertBefore(document.adoptNode(want), cursor);
      }
    }
    while (cursor) {
      const next = cursor.nextSibling;
      parent.removeChild(cursor);
      cursor = next;
    }
  }

  // patch(old, wanted, {held, fallback}): ``old`` made like ``wanted``, in place. Focus
  // inside ``old`` that an update moved goes back to its element, or, when that is gone,
  // to ``fallback(focused)`` (asked before the update, while the element is there).
  function patch(old, wanted, options) {
    const held = (options && options.held) || (() => false);
    const focused = document.activeElement;
    const inside = focused && focused !== old && old.contains(focused);
    const fallback = inside && options && options.fallback ? options.fallback(focused) : null;
    update(old, wanted, held);
    if (inside && document.activeElement !== focused) {
      const target = focused.isConnected ? focused : fallback;
      if (target) target.focus({ preventScroll: true });
    }
  }

  root.QuotaLive = Object.freeze({ read, patch });
})(globalThis);
