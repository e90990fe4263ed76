// Refreshes an admin page's live part in place: the element with data-awa-refresh="SECONDS"
// is replaced, every SECONDS, by what the page's own URL returns with ?fragment=1. Nothing is
// fetched while the tab is hidden; a failed fetch keeps what is shown and tries again later.
(function () {
  "use strict";
  const box = document.querySelector("[data-awa-refresh]");
  if (!box) {
    return;
  }
  const seconds = Math.max(Number(box.dataset.awaRefresh) || 15, 2);
  async function refresh() {
    if (document.hidden) {
      return;
    }
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    try {
      const response = await fetch(url, { credentials: "same-origin" });
      if (response.ok) {
        box.innerHTML = await response.text();
        box.dataset.awaRefreshed = new Date().toISOString();
      }
    } catch (error) {
      // Offline or the server restarting: the charts shown stay; the next turn tries again.
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
