// Refreshes an admin page's live part in place: the element with data-awa-refresh="SECONDS"
// is replaced, every SECONDS, by what the page's own URL returns with ?fragment=1. Nothing is
// fetched while the tab is hidden or while the last fetch is still under way; a failed fetch
// keeps what is shown and tries again later. An answer that is not the fragment (the session
// expired, and the admin sent its login page) reloads the whole page, which then shows why.
(function () {
  "use strict";
  const box = document.querySelector("[data-awa-refresh]");
  if (!box) {
    return;
  }
  const seconds = Math.max(Number(box.dataset.awaRefresh) || 15, 2);
  let busy = false;
  async function refresh() {
    if (document.hidden || busy) {
      return;
    }
    busy = true;
    const url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    try {
      const response = await fetch(url, { credentials: "same-origin" });
      if (response.redirected) {
        window.location.reload();
        return;
      }
      if (response.ok) {
        box.innerHTML = await response.text();
        box.dataset.awaRefreshed = new Date().toISOString();
      }
    } catch (error) {
      // Offline or the server restarting: the charts shown stay; the next turn tries again.
    } finally {
      busy = false;
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
