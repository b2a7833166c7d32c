// Live refresh of the fleet page: the server renders the table, this swaps it in.
// Everything else in the console works without script.
(function () {
  "use strict";
  const box = document.querySelector("[data-refresh-src]");
  if (!box) return;
  const src = box.getAttribute("data-refresh-src");
  const every = parseInt(box.getAttribute("data-refresh-ms"), 10) || 3000;
  const state = document.getElementById("refresh-state");
  let busy = false;

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const resp = await fetch(src, { headers: { Accept: "text/html" }, cache: "no-store" });
      if (!resp.ok) throw new Error("the console answered " + resp.status);
      const html = await resp.text();
      // Keep open "per topic" sections open across refreshes.
      const open = new Set([...box.querySelectorAll("details[open][data-key]")].map((d) => d.dataset.key));
      box.innerHTML = html;
      box.querySelectorAll("details[data-key]").forEach((d) => { if (open.has(d.dataset.key)) d.open = true; });
      if (state) state.textContent = "";
    } catch (err) {
      if (state) state.textContent = "Live refresh failed: " + err.message + " — retrying.";
    } finally {
      busy = false;
    }
  }
  setInterval(refresh, every);
})();
