// The chat page: start a run, follow its "tokens" stream, and after a reload resume from the
// next offset (what was shown is kept in sessionStorage). Resets drop retracted offsets.
"use strict";

(() => {
  const answer = document.getElementById("answer");
  const status = document.getElementById("status");
  const saved = () => JSON.parse(sessionStorage.getItem("chat") || "null");
  const save = (state) => sessionStorage.setItem("chat", JSON.stringify(state));

  function render(state) {
    const offsets = Object.keys(state.shown).map(Number).sort((a, b) => a - b);
    answer.textContent = offsets.map((k) => state.shown[k]).join("");
  }

  function follow(state) {
    render(state);
    const next = state.last === null ? 0 : state.last + 1;
    const events = new EventSource(`/runs/${encodeURIComponent(state.run)}/tokens?offset=${next}`);
    status.textContent = next ? `resumed at offset ${next}` : "streaming";
    events.addEventListener("chunk", (event) => {
      const offset = Number(event.lastEventId);
      state.shown[offset] = JSON.parse(event.data);
      state.last = offset;
      save(state);
      render(state);
    });
    events.addEventListener("reset", (event) => {
      for (const gone of JSON.parse(event.data).offsets) delete state.shown[gone];
      state.last = Number(event.lastEventId);
      save(state);
      render(state);
    });
    events.addEventListener("end", () => {
      events.close();
      state.ended = true;
      save(state);
      status.textContent = "done";
    });
  }

  document.getElementById("ask").addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = document.getElementById("text").value;
    const res = await fetch("/messages", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text }),
    });
    const { run_id: run } = await res.json();
    const state = { run, shown: {}, last: null, ended: false };
    save(state);
    follow(state);
  });

  const state = saved();
  if (state) {
    if (state.ended) {
      render(state);
      status.textContent = "done";
    } else {
      follow(state);
    }
  }
})();
