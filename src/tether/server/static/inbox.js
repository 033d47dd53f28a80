// Tether inbox: expiry countdowns, live updates over server-sent events, and a guard against
// double submits. Same-origin only; nothing here builds HTML from strings.
"use strict";

(() => {
  const body = document.body;

  // -- countdowns: every [data-expires] element (ISO 8601) ------------------------------------

  function span(ms) {
    const s = Math.floor(ms / 1000);
    const d = Math.floor(s / 86400);
    const h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60);
    if (d > 0) return `${d}d ${h}h`;
    if (h > 0) return `${h}h ${m}m`;
    if (m > 0) return `${m}m ${s % 60}s`;
    return `${s % 60}s`;
  }

  function tick() {
    const now = Date.now();
    for (const el of document.querySelectorAll("[data-expires]")) {
      const at = Date.parse(el.dataset.expires);
      if (Number.isNaN(at)) continue;
      const left = at - now;
      el.textContent = left > 0 ? `expires in ${span(left)}` : "expired";
      el.title = new Date(at).toLocaleString();
      el.classList.toggle("is-soon", left > 0 && left < 5 * 60 * 1000);
      el.classList.toggle("is-expired", left <= 0);
    }
  }

  tick();
  setInterval(tick, 1000);

  // -- forms: one submit per page view ----------------------------------------------------------

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form.dataset.sent) {
      event.preventDefault();
      return;
    }
    form.dataset.sent = "1";
    form.setAttribute("aria-busy", "true");
  });
  window.addEventListener("pageshow", () => {
    for (const form of document.querySelectorAll("form[data-sent]")) {
      delete form.dataset.sent;
      form.removeAttribute("aria-busy");
    }
  });

  // -- GET forms: leave empty fields out of the address ------------------------------------------
  // A filter form (form[data-drop-empty]) puts its view in the URL; fields left empty mean
  // "any", and dropping them keeps a shared link short and readable.

  document.addEventListener("formdata", (event) => {
    if (!event.target.matches("form[data-drop-empty]")) return;
    for (const [name, value] of [...event.formData.entries()]) {
      if (value === "") event.formData.delete(name);
    }
  });

  // -- live updates -------------------------------------------------------------------------------
  // <body data-live="/live?..." data-state="digest" data-page="/path">: when the stream reports
  // another digest, fetch the page again and swap each [data-region] element (by id).

  const liveUrl = body.dataset.live;
  const pageUrl = body.dataset.page;
  let current = body.dataset.state;
  if (!liveUrl || !pageUrl || !("EventSource" in window)) return;

  // Keep what the person was typing (and where) across a swap.
  function carry(from, to) {
    for (const field of from.querySelectorAll("textarea[name], input[type=text][name]")) {
      const twin = to.querySelector(`[name="${CSS.escape(field.name)}"]`);
      if (twin && field.value) twin.value = field.value;
    }
    const active = document.activeElement;
    return active && from.contains(active) && active.name ? active.name : null;
  }

  function known(region) {
    return new Set([...region.querySelectorAll("[data-approval-id]")].map(
      (el) => el.dataset.approvalId));
  }

  let busy = false;
  let again = false;

  async function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    try {
      const res = await fetch(pageUrl, { credentials: "same-origin", cache: "no-store" });
      if (res.redirected || res.status === 404 || res.status === 401) {
        window.location.reload();  // signed out, or the page is gone: show why
        return;
      }
      if (!res.ok) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      const regions = document.querySelectorAll("[data-region]");
      if ([...regions].some((r) => !doc.getElementById(r.id))) {
        window.location.reload();
        return;
      }
      for (const old of regions) {
        const fresh = document.adoptNode(doc.getElementById(old.id));
        const before = known(old);
        const focused = carry(old, fresh);
        old.replaceWith(fresh);
        for (const el of fresh.querySelectorAll("[data-approval-id]")) {
          if (!before.has(el.dataset.approvalId)) el.classList.add("flash");
        }
        if (focused) fresh.querySelector(`[name="${CSS.escape(focused)}"]`)?.focus();
      }
      if (doc.body.dataset.state) current = doc.body.dataset.state;
      tick();
      body.dataset.refreshed = String(Number(body.dataset.refreshed || 0) + 1);
    } catch (err) {
      console.warn("tether: live refresh failed", err);
    } finally {
      busy = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  const events = new EventSource(liveUrl);
  events.addEventListener("state", (event) => {
    if (event.data !== current) {
      current = event.data;
      refresh();
    }
  });
  for (const name of ["signed-out", "gone"]) {
    events.addEventListener(name, () => {
      events.close();
      window.location.reload();
    });
  }
  events.addEventListener("open", () => {
    body.dataset.connected = "1";
  });
})();

(() => {
  // -- a run's output: its stream, followed live; chunks by offset, resets drop them -----------

  const HIDDEN =
    /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2065\u2066-\u2069\ufeff]/g;
  const panel = document.getElementById("run-stream");
  if (panel) {
    const text = panel.querySelector(".stream-text");
    const shown = new Map();
    // The run id is percent-encoded in the page (no invisible character survives in it raw).
    const params = new URLSearchParams({
      run: decodeURIComponent(panel.dataset.runId), key: panel.dataset.streamKey,
    });
    const output = new EventSource(`/live/streams?${params}`);
    const render = () => {
      const offsets = [...shown.keys()].sort((a, b) => a - b);
      const parts = offsets.map((k) => {
        const chunk = shown.get(k);
        return typeof chunk === "string" ? chunk : JSON.stringify(chunk);
      });
      // Control, bidi and zero-width characters spelled out, as the server does (tether.text).
      text.textContent = parts.join("").replace(HIDDEN, (c) =>
        `<U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}>`);
      panel.hidden = offsets.length === 0;
    };
    output.addEventListener("chunk", (event) => {
      shown.set(Number(event.lastEventId), JSON.parse(event.data));
      render();
    });
    output.addEventListener("reset", (event) => {
      for (const gone of JSON.parse(event.data).offsets) shown.delete(gone);
      render();
    });
    output.addEventListener("end", () => {
      output.close();
      panel.dataset.ended = "1";
    });
    output.addEventListener("signed-out", () => output.close());  // the live stream reloads
  }
})();
